"""What an ACP prompt response says a turn used, in whichever shape the agent chose.

Three places, read in this order (the first one that holds counts wins):

- ``_meta.quota.model_usage``: one ``token_count`` per model, including the
  calls outside the main loop (sub-agents, titles, suggestions). It is what
  was billed, so it is the turn's usage when the agent sends it
  (claude-agent-acp).
- ``_meta.quota.token_count``: the codex-acp shape (``inputTokens``,
  ``cachedInputTokens``, ``outputTokens``, ``reasoningOutputTokens``,
  ``totalTokens``), which claude-agent-acp copies for its main loop.
- ``usage``: ACP's unstable ``PromptResponse.usage`` (``inputTokens``,
  ``outputTokens``, ``thoughtTokens``, ``cachedReadTokens``,
  ``cachedWriteTokens``), cache reads and writes beside the input.

``token_count`` means two things: codex counts cached input inside
``inputTokens`` (``totalTokens`` = input + output), claude-agent-acp beside
it (``totalTokens`` = input + cache reads + cache writes + output). The total
tells them apart; busd's input is always the uncached part.

Each ``model_usage`` row names its ``model``: :func:`turn_models` reads the
rows per model and :class:`ModelBreakdown` adds the turns up into the
session's running total per model (``stream.usage`` ``models``).

None of these is a context figure: the turn's calls are summed. The
context window is ``usage_update`` (``used``/``size``), which the
translator lets win.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from busd import TokenUsage, add_usage, as_mapping, merge_cumulative

__all__ = [
    "ModelBreakdown",
    "as_map",
    "turn_models",
    "turn_usage",
    "update_cost",
]

MAX_MODELS = 64
"""Models kept per session in a breakdown; the rows of more are left out of it."""


def as_map(obj: object) -> Mapping[str, Any] | None:
    """A nested value as a mapping (dicts as they are, SDK objects dumped), else ``None``."""
    if isinstance(obj, Mapping):
        return obj
    if obj is None or isinstance(obj, str | bytes | int | float | list | tuple):
        return None
    try:
        return as_mapping(obj)
    except TypeError:
        return None


def _n(m: Mapping[str, Any], camel: str, snake: str) -> int:
    value = m.get(camel)
    if value is None:
        value = m.get(snake)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        return 0
    return int(value)


def _token_count(m: Mapping[str, Any]) -> TokenUsage:
    """A codex-shaped ``token_count`` (either convention, see the module docstring)."""
    inp = _n(m, "inputTokens", "input_tokens")
    read = _n(m, "cachedInputTokens", "cached_input_tokens")
    write = _n(m, "cachedWriteTokens", "cached_write_tokens")
    out = _n(m, "outputTokens", "output_tokens")
    total = _n(m, "totalTokens", "total_tokens")
    if read and total == inp + out and inp >= read:  # codex: cached input is inside input
        inp -= read
    return TokenUsage(
        input_tokens=inp,
        output_tokens=out,
        reasoning_tokens=_n(m, "reasoningOutputTokens", "reasoning_output_tokens"),
        cache_read_tokens=read,
        cache_write_tokens=write,
    )


def _acp_usage(m: Mapping[str, Any]) -> TokenUsage:
    return TokenUsage(
        input_tokens=_n(m, "inputTokens", "input_tokens"),
        output_tokens=_n(m, "outputTokens", "output_tokens"),
        reasoning_tokens=_n(m, "thoughtTokens", "thought_tokens"),
        cache_read_tokens=_n(m, "cachedReadTokens", "cached_read_tokens"),
        cache_write_tokens=_n(m, "cachedWriteTokens", "cached_write_tokens"),
    )


def _sum(parts: list[TokenUsage]) -> TokenUsage:
    return TokenUsage(
        input_tokens=sum(p.input_tokens for p in parts),
        output_tokens=sum(p.output_tokens for p in parts),
        reasoning_tokens=sum(p.reasoning_tokens for p in parts),
        cache_read_tokens=sum(p.cache_read_tokens for p in parts),
        cache_write_tokens=sum(p.cache_write_tokens for p in parts),
    )


def _quota(result: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = as_map(result.get("_meta", result.get("field_meta"))) or {}  # SDK dumps: field_meta
    return as_map(meta.get("quota")) or {}


def _rows(quota: Mapping[str, Any]) -> list[tuple[object, TokenUsage]]:
    """``model_usage``: each row's ``model`` and its ``token_count``."""
    rows = quota.get("model_usage", quota.get("modelUsage"))
    found: list[tuple[object, TokenUsage]] = []
    for row in rows if isinstance(rows, list) else ():
        entry = as_map(row)
        tally = as_map(entry.get("token_count", entry.get("tokenCount"))) if entry else None
        if entry and tally is not None:
            found.append((entry.get("model"), _token_count(tally)))
    return found


def turn_models(result: Mapping[str, Any]) -> dict[str, TokenUsage]:
    """The turn's counts per model (``model_usage`` rows naming one); empty without."""
    models: dict[str, TokenUsage] = {}
    for model, tokens in _rows(_quota(result)):
        if isinstance(model, str) and model:
            models[model] = add_usage(models.get(model, TokenUsage()), tokens)
    return models


class ModelBreakdown:
    """One session's running totals per model: the sum of its turns' ``turn_models``.

    A turn's rows are its own total (a repeated report of the turn replaces,
    field-wise max, never adds); a new turn id starts a new turn.
    """

    __slots__ = ("_done", "_turn", "_turn_id")

    def __init__(self) -> None:
        self._done: dict[str, TokenUsage] = {}
        self._turn: dict[str, TokenUsage] = {}
        self._turn_id: str | None = None

    def record(self, turn_id: str, models: Mapping[str, TokenUsage]) -> None:
        if turn_id != self._turn_id:
            self._done, self._turn, self._turn_id = self.totals(), {}, turn_id
        for model, tokens in models.items():
            before = self._turn.get(model)
            known = self._done.keys() | self._turn.keys()
            if model not in known and len(known) >= MAX_MODELS:
                continue
            self._turn[model] = tokens if before is None else merge_cumulative(before, tokens)

    def totals(self) -> dict[str, TokenUsage]:
        """Each model's total so far (a new dict)."""
        totals = dict(self._done)
        for model, tokens in self._turn.items():
            totals[model] = add_usage(totals.get(model, TokenUsage()), tokens)
        return totals


def turn_usage(result: Mapping[str, Any]) -> TokenUsage | None:
    """The turn's token counts from a ``session/prompt`` result; ``None`` if it has none."""
    quota = _quota(result)
    found = [tokens for _, tokens in _rows(quota)]
    if found:
        return _sum(found)
    count = as_map(quota.get("token_count", quota.get("tokenCount")))
    if count is not None:
        return _token_count(count)
    usage = as_map(result.get("usage"))
    return None if usage is None else _acp_usage(usage)


def update_cost(update: Mapping[str, Any]) -> float | None:
    """A ``usage_update``'s ``cost`` (``{"amount", "currency"}``) in USD, else ``None``."""
    cost = as_map(update.get("cost"))
    if cost is None or cost.get("currency") != "USD":
        return None
    amount = cost.get("amount")
    if isinstance(amount, bool) or not isinstance(amount, int | float) or amount < 0:
        return None
    return float(amount)
