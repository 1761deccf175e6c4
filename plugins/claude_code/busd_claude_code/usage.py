"""What a Claude Code ``result`` line says about usage: every model's total, and the context.

``result.usage`` counts the main model's calls of that turn only.
``result.modelUsage`` has one entry per model the process used (sub-agents
on another model, small-model side calls), each a running total with its
``costUSD``; ``total_cost_usd`` is their sum. So the run's totals are the sum
over ``modelUsage``, and the context window is what the *last* main-model
call held, never a total.

:class:`ByModel` keeps the per-model breakdown of a session
(``stream.usage`` ``models``): each model's ``modelUsage`` entry, merged
with the field-wise max like every running total, stamped on every
main-agent ``stream.usage`` so the latest report always carries all of it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import msgspec

from busd import Event, TokenUsage, Usage, add_usage, merge_cumulative, normalize_usage

__all__ = [
    "ByModel",
    "by_model",
    "context_used",
    "context_window",
    "every_model",
    "held",
    "last_iteration",
]

MAX_MODELS = 64
"""Models kept per session in a breakdown; the reports of more are left out of it."""


def every_model(line: Mapping[str, Any]) -> TokenUsage | None:
    """The sum of ``modelUsage`` over every model (``None`` without it), at ``total_cost_usd``.

    Entries are camelCase (``inputTokens``, ``cacheCreationInputTokens``,
    ``costUSD``): read with the Bedrock mapping, which has those names.
    """
    models = line.get("modelUsage")
    if not isinstance(models, Mapping) or not models:
        return None
    total = TokenUsage()
    for entry in models.values():
        if isinstance(entry, Mapping):
            total = add_usage(total, normalize_usage(entry, provider="bedrock"))
    cost = line.get("total_cost_usd")
    if isinstance(cost, int | float) and not isinstance(cost, bool) and 0 <= cost < math.inf:
        total = msgspec.structs.replace(total, cost_usd=float(cost))
    return total


def by_model(line: Mapping[str, Any]) -> dict[str, TokenUsage]:
    """Each ``modelUsage`` entry normalized, its cost its ``costUSD`` (empty without any)."""
    models = line.get("modelUsage")
    if not isinstance(models, Mapping):
        return {}
    return {
        name: normalize_usage(entry, provider="bedrock")
        for name, entry in models.items()
        if isinstance(name, str) and name and isinstance(entry, Mapping)
    }


class ByModel:
    """The per-model running totals of each session, from its ``result`` lines."""

    __slots__ = ("_sessions",)

    def __init__(self) -> None:
        self._sessions: dict[str | None, dict[str, TokenUsage]] = {}

    def record(self, sid: str | None, line: Mapping[str, Any]) -> bool:
        """Merge a ``result``'s ``modelUsage`` into ``sid``'s; whether anything grew."""
        found = by_model(line)
        if not found:
            return False
        known = self._sessions.setdefault(sid, {})
        grew = False
        for name, usage in found.items():
            before = known.get(name)
            if before is None and len(known) >= MAX_MODELS:
                continue
            after = usage if before is None else merge_cumulative(before, usage)
            if after != before:
                known[name] = after
                grew = True
        return grew

    def of(self, sid: str | None) -> dict[str, TokenUsage]:
        """``sid``'s breakdown so far (a copy; empty when its source never said)."""
        return dict(self._sessions.get(sid, {}))

    def stamp(self, sid: str | None, events: list[Event]) -> list[Event]:
        """``events`` with ``sid``'s breakdown on each ``stream.usage``."""
        known = self._sessions.get(sid)
        if not known or not any(type(e) is Usage for e in events):
            return events
        return [
            msgspec.structs.replace(e, models=dict(known)) if type(e) is Usage else e
            for e in events
        ]


def context_window(line: Mapping[str, Any], model: str | None) -> int | None:
    """``modelUsage[model].contextWindow``: the main model's window, as Claude Code sizes it."""
    models = line.get("modelUsage")
    entry = models.get(model) if isinstance(models, Mapping) and model is not None else None
    window = entry.get("contextWindow") if isinstance(entry, Mapping) else None
    if isinstance(window, int) and not isinstance(window, bool) and window > 0:
        return window
    return None


def held(tokens: TokenUsage) -> int:
    """What one call leaves in the window: its whole prompt and its output."""
    return (
        tokens.input_tokens
        + tokens.cache_read_tokens
        + tokens.cache_write_tokens
        + tokens.output_tokens
    )


def last_iteration(line: Mapping[str, Any]) -> TokenUsage | None:
    """The last entry of ``result.usage.iterations`` (the turn's last model iteration), if any."""
    usage = line.get("usage")
    iterations = usage.get("iterations") if isinstance(usage, Mapping) else None
    if isinstance(iterations, list) and iterations and isinstance(iterations[-1], Mapping):
        return normalize_usage(iterations[-1], provider="anthropic")
    return None


LastCall = tuple[TokenUsage, Mapping[str, Any] | None, bool]
"""The turn's last main-model call: its streamed figures, its snapshot's usage, its only one?"""


def context_used(line: Mapping[str, Any], last_call: LastCall | None) -> int | None:
    """What the window held after the turn's last main-model call, never the turn's total.

    In order: the last of the result's ``usage.iterations``; the last call's
    streamed figures; its snapshot's prompt, with the output the ``result``
    states when the turn made one call (a snapshot's own output figure is
    stale).
    """
    last = last_iteration(line)
    if last is not None:
        return held(last)
    if last_call is None:
        return None
    streamed, snapshot, only = last_call
    if held(streamed):
        return held(streamed)
    if only:
        return held(normalize_usage(line, provider="anthropic"))
    return None if snapshot is None else held(normalize_usage(snapshot, provider="anthropic"))
