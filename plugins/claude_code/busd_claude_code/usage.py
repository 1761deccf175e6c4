"""What a Claude Code ``result`` line says about usage: every model's total, and the context.

``result.usage`` counts the main model's calls of that turn only.
``result.modelUsage`` has one entry per model the process used (sub-agents
on another model, small-model side calls), each a running total with its
``costUSD``; ``total_cost_usd`` is their sum. So the run's totals are the sum
over ``modelUsage``, and the context window is what the *last* main-model
call held, never a total.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import msgspec

from busd import TokenUsage, add_usage, normalize_usage

__all__ = ["context_window", "every_model", "held", "last_iteration"]


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
