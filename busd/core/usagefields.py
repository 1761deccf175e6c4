"""Reading usage payloads nobody vouches for: field access, counts, costs, known shapes.

Split from :mod:`busd.core.usage` (which maps each provider's fields): these
helpers never raise on what a payload holds, and a payload with none of the
fields any mapping reads is reported (counted and logged once per shape),
because reading it as zeros would hide a provider busd does not know.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping

from .events import TokenUsage

__all__ = ["unrecognized_usage"]

logger = logging.getLogger("busd.core.usage")

_MAX_COUNT = 2**63 - 1
"""Counts above this are garbage, and would not fit a signed 64-bit wire integer."""


def _get(obj: object, key: str) -> object:
    """``obj[key]`` for mappings, ``obj.key`` for anything else; ``None`` when absent.

    SDKs hand over dicts, pydantic models, dataclasses and generated classes;
    all of them are read the same way, and nothing they do can raise here.
    """
    if obj is None or isinstance(obj, str | bytes | int | float | list | tuple):
        return None
    try:
        if isinstance(obj, Mapping):
            return obj.get(key)
        return getattr(obj, key, None)
    except Exception:
        return None


def _count(value: object) -> int:
    """A token count, or 0 when ``value`` is not one (bool, negative, fractional, huge)."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return int(value) if 0 <= value <= _MAX_COUNT else 0
    if isinstance(value, float) and value.is_integer() and 0 <= value <= _MAX_COUNT:
        return int(value)
    return 0


def _pick(obj: object, *keys: str) -> int:
    """The largest count among alternative spellings of one field."""
    best = 0
    for key in keys:
        n = _count(_get(obj, key))
        if n > best:
            best = n
    return best


def _money(value: object) -> float | None:
    """A cost in USD, or ``None`` when ``value`` is not a finite non-negative number.

    Also reads ``{"amount": x, "currency": "USD"}`` (the Agent Client Protocol's shape);
    any other currency is not USD and so stays unknown.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        cost = float(value)
        return cost if math.isfinite(cost) and cost >= 0 else None
    if isinstance(value, Mapping):
        currency = _get(value, "currency")
        if isinstance(currency, str) and currency.upper() == "USD":
            return _money(_get(value, "amount"))
    return None


_USD_KEYS = ("cost_usd", "total_cost_usd", "costUSD")
_PRIMARY_KEYS = (
    "input_tokens",
    "output_tokens",
    "prompt_tokens",
    "completion_tokens",
    "inputTokens",
    "outputTokens",
    "tokens",
)


def _cost(obj: object, *, plain: bool) -> float | None:
    """The first valid USD figure on ``obj``; ``plain`` admits a bare ``cost`` field."""
    for key in _USD_KEYS:
        cost = _money(_get(obj, key))
        if cost is not None:
            return cost
    return _money(_get(obj, "cost")) if plain else None


def _has(obj: object, *keys: str) -> bool:
    return any(_get(obj, key) is not None for key in keys)


def _inclusive(prompt: int, read: int, write: int) -> int:
    """Uncached input from a prompt count that already contains the cached tokens."""
    rest = prompt - read - write
    return rest if rest > 0 else 0


_GEMINI_KEYS = (
    "promptTokenCount",
    "candidatesTokenCount",
    "thoughtsTokenCount",
    "cachedContentTokenCount",
    "totalTokenCount",
    "prompt_token_count",
    "candidates_token_count",
    "thoughts_token_count",
    "cached_content_token_count",
    "total_token_count",
)

_KNOWN_KEYS: tuple[str, ...] = (
    *_PRIMARY_KEYS,
    *_GEMINI_KEYS,
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "cache_read_tokens",
    "cache_creation_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
    "cacheReadInputTokens",
    "cacheReadInputTokenCount",
    "cacheWriteInputTokens",
    "cacheWriteInputTokenCount",
    "cacheCreationInputTokens",
    "cacheReadTokens",
    "cacheWriteTokens",
    "total_tokens",
    "totalTokens",
)
"""Every count field some mapping reads: a payload with none of them is not usage busd knows."""


_unrecognized = 0
_logged_shapes: set[tuple[str, ...]] = set()
_MAX_LOGGED_SHAPES = 32


def unrecognized_usage() -> int:
    """How many usage payloads had a shape busd does not read (since start)."""
    return _unrecognized


def _unknown_shape(payload: object) -> bool:
    """A non-empty payload with none of the count fields any mapping reads."""
    if payload is None or isinstance(payload, TokenUsage) or _get(payload, "tokens") is not None:
        return False
    if isinstance(payload, Mapping) and not payload:
        return False  # {}: no usage at all, not a shape
    return not _has(payload, *_KNOWN_KEYS)


def _shape(payload: object) -> tuple[str, ...]:
    if isinstance(payload, Mapping):
        return tuple(sorted(str(key) for key in payload))[:16]
    return (type(payload).__name__,)


def _report_unrecognized(payload: object) -> None:
    """Count it, and log each new shape once (bounded): zeros would pass silently."""
    global _unrecognized
    _unrecognized += 1
    shape = _shape(payload)
    if shape not in _logged_shapes and len(_logged_shapes) < _MAX_LOGGED_SHAPES:
        _logged_shapes.add(shape)
        logger.warning(
            "usage payload of an unrecognised shape (keys %s): its counts are unknown, "
            "not zero; see docs/usage.md",
            ", ".join(shape) or "none",
        )
