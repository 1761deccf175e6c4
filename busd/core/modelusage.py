"""Usage per model, summed: how a session that used several models adds up.

Claude Code runs more than one model (sub-agents on another model, small
side calls for titles) and reports one running total per model
(``result.modelUsage``). For such per-model running totals, a session's
total is the **sum over models** of each model's highest report
(field-wise), and a run's is the sum of what each model gained while the
run was active; :class:`ModelTotals` keeps both, with the breakdown.

``stream.usage`` ``tokens`` is a *session* total (its ``model`` only says
which model made the latest call), so feeding those totals here would count
a session twice when it switches models: this is for sources that report per
model, such as the entries of ``stream.usage`` ``models`` (see
docs/accounting.md).
"""

from __future__ import annotations

from collections.abc import Mapping

from .events import TokenUsage
from .usagefields import _money

__all__ = ["UNNAMED", "ModelTotals"]

UNNAMED = ""
"""The key of reports that name no model in :meth:`ModelTotals.by_model`."""

_FIELDS = (
    "input_tokens",
    "output_tokens",
    "reasoning_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
)


def _gain(before: TokenUsage | None, after: TokenUsage) -> TokenUsage | None:
    """What ``after`` adds to ``before`` (field-wise, never negative); ``None``: nothing."""
    if before is None:
        return after if after != TokenUsage() else None
    counts = {f: max(0, getattr(after, f) - getattr(before, f)) for f in _FIELDS}
    cost: float | None = None
    new = _money(after.cost_usd)
    if new is not None:
        old = _money(before.cost_usd)
        if old is None:
            cost = new
        elif new > old:
            cost = new - old
    if not any(counts.values()) and cost is None:
        return None
    return TokenUsage(**counts, cost_usd=cost)


def _plus(a: TokenUsage, b: TokenUsage) -> TokenUsage:
    """Two parts of one total: counts add, and known costs add (unknown only if both are)."""
    cost = a.cost_usd if b.cost_usd is None else b.cost_usd + (a.cost_usd or 0.0)
    return TokenUsage(**{f: getattr(a, f) + getattr(b, f) for f in _FIELDS}, cost_usd=cost)


class ModelTotals:
    """Running totals per model of one session (``record``) or one run (``add``).

    Bounded: past ``max_models`` models, the reports of a new one are folded
    into the unnamed model's, so the total stays right.
    """

    __slots__ = ("_max", "_models")

    def __init__(self, *, max_models: int = 64) -> None:
        if max_models < 1:
            raise ValueError("max_models must be at least 1")
        self._max = max_models
        self._models: dict[str, TokenUsage] = {}

    def _key(self, model: str | None) -> str:
        key = model or UNNAMED
        if key not in self._models and len(self._models) >= self._max:
            return UNNAMED
        return key

    def record(self, model: str | None, cumulative: TokenUsage) -> TokenUsage | None:
        """Take one model's running total; return what it adds (``None``: nothing new).

        Field-wise max with the model's previous report, so a repeated or
        late report adds nothing.
        """
        key = self._key(model)
        before = self._models.get(key)
        gain = _gain(before, cumulative)
        if gain is not None:
            self._models[key] = gain if before is None else _plus(before, gain)
        return gain

    def add(self, model: str | None, gain: TokenUsage) -> None:
        """Add what a model gained (a run's share of its session's reports)."""
        key = self._key(model)
        before = self._models.get(key)
        self._models[key] = gain if before is None else _plus(before, gain)

    def total(self) -> TokenUsage:
        """The sum over models (empty when nothing was recorded)."""
        total = TokenUsage()
        for usage in self._models.values():
            total = _plus(total, usage)
        return total

    def by_model(self) -> Mapping[str, TokenUsage]:
        """Each model's figures, in the order models first reported (a copy)."""
        return dict(self._models)
