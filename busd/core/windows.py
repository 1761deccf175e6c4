"""Context windows and output reserves by model id: a maintained table, overridable.

Every session should show how full its context is, but few SDKs say how
large the window is. So busd keeps the published figures of the model
families agents use (Claude, GPT and o-series, Gemini), looked up by the
longest matching prefix of a normalized model id, and lets the config or a
run override them (an exact id or a prefix).

The *output reserve* is the most the model may write in one call (its
maximum output tokens): the next call needs that much room too, so
``free`` is ``window - used - reserve``.

Figures as each vendor publishes them: Anthropic "Models overview" (context
window, max output), OpenAI's model pages (context window, max output
tokens), Google's "Gemini models" (input and output token limits). They were
entered from those pages as known when written, not fetched by busd; update
the table when a family changes (docs/accounting.md lists it), and override
it in the meantime.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, TypeVar

__all__ = ["MODEL_WINDOWS", "ModelWindow", "ModelWindows", "normalize_model_id"]


@dataclass(frozen=True, slots=True)
class ModelWindow:
    """A model's context window and the room kept for its output, in tokens."""

    window: int
    reserve: int = 0

    def __post_init__(self) -> None:
        if self.window <= 0:
            raise ValueError(f"a context window must be positive, not {self.window}")
        if not 0 <= self.reserve < self.window:
            raise ValueError(f"an output reserve must be in [0, window), not {self.reserve}")


_K: Final = 1_000

# Prefix of a normalized model id -> window. Longest prefix wins, so a
# specific version goes before its family fallback.
MODEL_WINDOWS: Final[Mapping[str, ModelWindow]] = {
    # Anthropic: 200k context for every current model (1M for Sonnet 4/4.5
    # only with the beta header, marked "[1m]" by Claude Code: see below).
    "claude-opus-4-5": ModelWindow(200 * _K, 64 * _K),
    "claude-opus-4-1": ModelWindow(200 * _K, 32 * _K),
    "claude-opus-4": ModelWindow(200 * _K, 32 * _K),
    "claude-sonnet-4": ModelWindow(200 * _K, 64 * _K),
    "claude-haiku-4": ModelWindow(200 * _K, 64 * _K),
    "claude-3-7-sonnet": ModelWindow(200 * _K, 64 * _K),
    "claude-3-5-sonnet": ModelWindow(200 * _K, 8_192),
    "claude-3-5-haiku": ModelWindow(200 * _K, 8_192),
    "claude-3-opus": ModelWindow(200 * _K, 4_096),
    "claude-3-haiku": ModelWindow(200 * _K, 4_096),
    "claude": ModelWindow(200 * _K, 32 * _K),
    # Claude Code's model aliases
    "opus": ModelWindow(200 * _K, 32 * _K),
    "sonnet": ModelWindow(200 * _K, 64 * _K),
    "haiku": ModelWindow(200 * _K, 64 * _K),
    # OpenAI
    "gpt-5": ModelWindow(400 * _K, 128 * _K),
    "gpt-4.1": ModelWindow(1_047_576, 32_768),
    "gpt-4o": ModelWindow(128 * _K, 16_384),
    "gpt-4-turbo": ModelWindow(128 * _K, 4_096),
    "gpt-4": ModelWindow(8_192, 4_096),
    "gpt-3.5-turbo": ModelWindow(16_385, 4_096),
    "o1-mini": ModelWindow(128 * _K, 65_536),
    "o1": ModelWindow(200 * _K, 100 * _K),
    "o3": ModelWindow(200 * _K, 100 * _K),
    "o4-mini": ModelWindow(200 * _K, 100 * _K),
    "codex-mini": ModelWindow(200 * _K, 100 * _K),
    # Google
    "gemini-3": ModelWindow(1_048_576, 65_536),
    "gemini-2.5": ModelWindow(1_048_576, 65_536),
    "gemini-2.0": ModelWindow(1_048_576, 8_192),
    "gemini-1.5-pro": ModelWindow(2_097_152, 8_192),
    "gemini-1.5-flash": ModelWindow(1_048_576, 8_192),
}

_ONE_MILLION: Final = ModelWindow(1_000_000, 64 * _K)

# Region and vendor prefixes of Bedrock ids ("us.anthropic.claude-..."), a
# version suffix ("-v1:0"), Vertex's "@20250514" and a date ("-20250929").
_BEDROCK = re.compile(r"^(?:[a-z]{2,6}\.)?(?:anthropic|meta|amazon|google|openai)\.")
_SUFFIX = re.compile(r"(?:-v\d+(?::\d+)?|@[\w.-]+)$")


def normalize_model_id(model: str) -> str:
    """The table's spelling of ``model``: lower case, no router, region or version decoration."""
    name = model.strip().lower()
    name = name.rsplit("/", 1)[-1]  # "anthropic/claude-...", "models/gemini-..."
    name = _BEDROCK.sub("", name)
    return _SUFFIX.sub("", name)


class ModelWindows:
    """The table, with overrides on top; ``lookup`` answers ``None`` for an unknown model.

    :param overrides: model id or prefix -> window (an int: the reserve is
        then the table's for that model, if it is smaller, else 0) or a
        :class:`ModelWindow`. Matched like the table, before it.
    :param table: the table to use (default :data:`MODEL_WINDOWS`).
    """

    __slots__ = ("_cache", "_overrides", "_table")

    def __init__(
        self,
        overrides: Mapping[str, int | ModelWindow] | None = None,
        *,
        table: Mapping[str, ModelWindow] = MODEL_WINDOWS,
    ) -> None:
        self._table = {normalize_model_id(k): v for k, v in table.items()}
        self._overrides = {
            normalize_model_id(k): v for k, v in (overrides or {}).items() if k.strip()
        }
        for value in self._overrides.values():
            if isinstance(value, int) and value <= 0:
                raise ValueError(f"a context window must be positive, not {value}")
        self._cache: dict[str, ModelWindow | None] = {}

    def lookup(self, model: str) -> ModelWindow | None:
        """The window of ``model``; cached, as model ids repeat on every usage report."""
        cache = self._cache
        if model in cache:
            return cache[model]
        found = self._lookup(model)
        if len(cache) >= 1024:
            cache.clear()
        cache[model] = found
        return found

    def window_for(self, model: str) -> int | None:
        found = self.lookup(model)
        return None if found is None else found.window

    def _lookup(self, model: str) -> ModelWindow | None:
        name = normalize_model_id(model)
        known = _longest(self._table, name)
        if name.endswith("[1m]"):  # Claude Code's 1M-context variant of a model
            known = ModelWindow(_ONE_MILLION.window, known.reserve if known else 0)
        override = _longest(self._overrides, name)
        if override is None:
            return known
        if isinstance(override, ModelWindow):
            return override
        reserve = known.reserve if known is not None and known.reserve < override else 0
        return ModelWindow(override, reserve)


V = TypeVar("V")


def _longest(table: Mapping[str, V], name: str) -> V | None:
    best: str | None = None
    for prefix in table:
        if name.startswith(prefix) and (best is None or len(prefix) > len(best)):
            best = prefix
    return None if best is None else table[best]
