"""Usage in Claude Code's transcripts, counted the way ccusage counts it.

A transcript line carries usage when it matches ccusage 17.2.1's
``usageDataSchema`` (read in ``dist/data-loader-*.js``): an ISO ``timestamp``
(``YYYY-MM-DDTHH:MM:SS[.mmm]Z``), ``message.usage`` with numeric
``input_tokens`` and ``output_tokens``, and, when present (``null`` is not
absent), numeric cache counts, non-empty ``message.model``, ``message.id``,
``requestId`` and ``sessionId``, a ``version`` that starts ``N.N.N``, a
string ``cwd``, a list of objects with string ``text`` as ``message.content``,
a numeric ``costUSD`` and a boolean ``isApiErrorMessage``. Any other line
counts nothing, whatever it holds.

Claude Code writes one API response as several ``assistant`` lines (one per
content block) that repeat its usage, so a response counts once: the first
line with a given ``message.id`` and ``requestId`` (both present) counts, and
later ones are duplicates, in any file. A line without both always counts.
Its cost is its ``costUSD`` when it has one, else the tokens priced by
:func:`busd.core.prices.cost_usd` per response (the 200k tiers apply per
call); a line without a model costs nothing known and is filed under
``unknown``. ``<synthetic>`` responses (Claude Code's own error texts) count in
the total but are left out of the breakdown per model, as ccusage does.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final, TypeGuard

import msgspec

from busd import TokenUsage, add_usage
from busd.core.prices import cost_usd

__all__ = ["SYNTHETIC", "UNKNOWN_MODEL", "Entry", "Tally", "entry"]

SYNTHETIC: Final = "<synthetic>"
"""The model of the responses Claude Code makes up itself (API errors, interruptions)."""
UNKNOWN_MODEL: Final = "unknown"
"""Where a response with no model is filed (ccusage's name for it)."""

_TIMESTAMP: Final = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d{3})?Z")
_VERSION: Final = re.compile(r"\d+\.\d+\.\d+")
_ABSENT: Final = object()


class Entry(msgspec.Struct, frozen=True):
    """One line's usage: its dedup key (``message.id:requestId``), model and tokens, with cost."""

    key: str | None
    model: str
    tokens: TokenUsage


def _number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and not math.isnan(value)


def _optional(line: Mapping[str, Any], name: str, check: Any) -> bool:
    value = line.get(name, _ABSENT)
    return value is _ABSENT or bool(check(value))


def _text(value: object) -> bool:
    return isinstance(value, str) and bool(value)


def _block(value: object) -> bool:
    """A ``message.content`` item: an object (a JS array is one too) whose ``text`` is a string."""
    if isinstance(value, list):
        return True
    return isinstance(value, Mapping) and _optional(value, "text", lambda t: isinstance(t, str))


def _content(value: object) -> bool:
    return isinstance(value, list) and all(_block(block) for block in value)


def entry(line: Mapping[str, Any]) -> Entry | None:
    """The usage ``line`` counts for, or ``None`` when ccusage would not count it."""
    message = line.get("message")
    usage = message.get("usage") if isinstance(message, Mapping) else None
    if not isinstance(usage, Mapping) or not isinstance(message, Mapping):
        return None
    stamp = line.get("timestamp")
    if not isinstance(stamp, str) or _TIMESTAMP.fullmatch(stamp) is None:
        return None
    if not (_number(usage.get("input_tokens")) and _number(usage.get("output_tokens"))):
        return None
    checks = (
        _optional(usage, "cache_creation_input_tokens", _number),
        _optional(usage, "cache_read_input_tokens", _number),
        _optional(line, "cwd", lambda v: isinstance(v, str)),
        _optional(line, "sessionId", _text),
        _optional(line, "version", lambda v: isinstance(v, str) and _VERSION.match(v)),
        _optional(line, "costUSD", _number),
        _optional(line, "requestId", _text),
        _optional(line, "isApiErrorMessage", lambda v: isinstance(v, bool)),
        _optional(message, "model", _text),
        _optional(message, "id", _text),
        _optional(message, "content", _content),
    )
    if not all(checks):
        return None
    details = usage.get("output_tokens_details")
    thinking = details.get("thinking_tokens") if isinstance(details, Mapping) else None
    tokens = TokenUsage(
        input_tokens=int(usage["input_tokens"]),
        output_tokens=int(usage["output_tokens"]),
        reasoning_tokens=int(thinking) if _number(thinking) else 0,
        cache_read_tokens=int(usage.get("cache_read_input_tokens", 0)),
        cache_write_tokens=int(usage.get("cache_creation_input_tokens", 0)),
    )
    model = message.get("model")
    cost = line.get("costUSD")
    if _number(cost):
        price: float | None = float(cost)
    elif isinstance(model, str):
        price = cost_usd(model, tokens)
    else:
        price = None
    message_id, request_id = message.get("id"), line.get("requestId")
    key = (
        f"{message_id}:{request_id}" if message_id is not None and request_id is not None else None
    )
    tokens = msgspec.structs.replace(tokens, cost_usd=price)
    return Entry(key, model if isinstance(model, str) else UNKNOWN_MODEL, tokens)


class Tally:
    """One session's counted responses: the running total per model, and their keys.

    Pure bookkeeping, shared by the transcript translator (in the daemon)
    and the attacher (which keeps it in its resume points), so both count
    the same responses the same way.
    """

    __slots__ = ("_keys", "_models")

    def __init__(self) -> None:
        self._models: dict[str, TokenUsage] = {}
        self._keys: set[str] = set()

    def count(self, found: Entry) -> bool:
        """Add ``found`` unless its key was counted before; whether it was added."""
        if found.key is not None:
            if found.key in self._keys:
                return False
            self._keys.add(found.key)
        before = self._models.get(found.model)
        self._models[found.model] = found.tokens if before is None else _add(before, found.tokens)
        return True

    def counted(self, key: str) -> bool:
        """Whether a response with ``key`` was counted (or said to be counted elsewhere)."""
        return key in self._keys

    def mark(self, keys: Iterable[str]) -> None:
        """Responses counted elsewhere (another session, before a restart): never count them."""
        self._keys.update(keys)

    def restore(self, models: Mapping[str, TokenUsage]) -> None:
        """Start from totals counted before (a resume point), adding to what is here."""
        for model, tokens in models.items():
            before = self._models.get(model)
            self._models[model] = tokens if before is None else _add(before, tokens)

    def models(self) -> dict[str, TokenUsage]:
        """Each model's total so far, ``<synthetic>`` included (a copy)."""
        return dict(self._models)

    def keys(self) -> set[str]:
        """The keys counted so far (a copy)."""
        return set(self._keys)

    def breakdown(self) -> dict[str, TokenUsage]:
        """Each model's total so far, as ``stream.usage`` ``models`` carries it."""
        return {name: tokens for name, tokens in self._models.items() if name != SYNTHETIC}

    def total(self) -> TokenUsage:
        """Every response's usage together; the cost is the sum of the known ones."""
        total = TokenUsage()
        cost: float | None = None
        for tokens in self._models.values():
            total = add_usage(total, msgspec.structs.replace(tokens, cost_usd=None))
            if tokens.cost_usd is not None:
                cost = tokens.cost_usd if cost is None else cost + tokens.cost_usd
        return msgspec.structs.replace(total, cost_usd=cost)


def _add(a: TokenUsage, b: TokenUsage) -> TokenUsage:
    """Two responses of one model: counts add, a cost known for either is kept.

    Unlike :func:`busd.add_usage`, a response of unknown price does not make
    the model's known cost unknown: ccusage prices it at 0 and so does the
    total here, while a model with no price at all stays ``None``.
    """
    if a.cost_usd is None or b.cost_usd is None:
        cost = a.cost_usd if b.cost_usd is None else b.cost_usd
    else:
        cost = a.cost_usd + b.cost_usd
    counts = add_usage(
        msgspec.structs.replace(a, cost_usd=None), msgspec.structs.replace(b, cost_usd=None)
    )
    return msgspec.structs.replace(counts, cost_usd=cost)
