"""Usage summed over models, with a per-model breakdown (issue 16).

The figures are the running totals per model that the real Claude Code CLI
wrote in each ``result`` line's ``modelUsage`` (``tests/fixtures/claude_code/``,
see its README): the main model ``claude-sonnet-4-5-20250929`` and the
sub-agent's ``claude-haiku-5-5``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from busd.core.events import TokenUsage
from busd.core.modelusage import UNNAMED, ModelTotals
from busd.core.usage import normalize_usage

CAPTURE = (
    Path(__file__).resolve().parent / "fixtures" / "claude_code" / "subagent-haiku.snapshots.jsonl"
)
SONNET = "claude-sonnet-4-5-20250929"
HAIKU = "claude-haiku-5-5"


def _results() -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in CAPTURE.read_text().splitlines()]
    return [line for line in lines if line.get("type") == "result"]


def _reports(result: dict[str, Any]) -> list[tuple[str, TokenUsage]]:
    """``modelUsage`` entries are camelCase: Bedrock's mapping reads them."""
    return [
        (model, normalize_usage(entry, provider="bedrock"))
        for model, entry in result["modelUsage"].items()
    ]


def test_a_session_total_is_the_sum_over_its_models() -> None:
    """After the second ``result``:

    sonnet: input 5, output 412, cache read 10,000, cache write 5,600, $0.030195
    haiku:  input 2, output 3,   cache read 0,      cache write 15,000, $0.0018767
    sum:    input 7, output 415, cache read 10,000, cache write 20,600,
            $0.030195 + $0.0018767 = $0.0320717 (the line's ``total_cost_usd``).
    """
    session = ModelTotals()
    for result in _results():
        for model, usage in _reports(result):
            session.record(model, usage)
    total = session.total()
    assert (
        total.input_tokens,
        total.output_tokens,
        total.cache_read_tokens,
        total.cache_write_tokens,
    ) == (5 + 2, 412 + 3, 10_000 + 0, 5_600 + 15_000)
    assert total.cost_usd == pytest.approx(0.030195 + 0.0018767)
    assert total.cost_usd == pytest.approx(_results()[-1]["total_cost_usd"])
    by_model = session.by_model()
    assert list(by_model) == [SONNET, HAIKU]
    assert by_model[HAIKU].cache_write_tokens == 15_000


def test_a_run_gets_what_each_model_gained_while_it_ran() -> None:
    """Run r1 is the first ``result``, run r2 the second, in one session.

    r2's share is the second result minus the first, per model:
    sonnet: input 5 - 4 = 1, output 412 - 266 = 146, cache read 10,000 - 5,000
    = 5,000, cache write 5,600 - 5,300 = 300 (the second line's own ``usage``),
    $0.030195 - $0.025377 = $0.004818; haiku: nothing new.
    """
    session, r1, r2 = ModelTotals(), ModelTotals(), ModelTotals()
    first, second = _results()
    for run, result in ((r1, first), (r2, second)):
        for model, usage in _reports(result):
            gain = session.record(model, usage)
            if gain is not None:
                run.add(model, gain)

    assert list(r2.by_model()) == [SONNET]
    share = r2.by_model()[SONNET]
    assert (
        share.input_tokens,
        share.output_tokens,
        share.cache_read_tokens,
        share.cache_write_tokens,
    ) == (1, 146, 5_000, 300)
    assert share.cost_usd == pytest.approx(0.030195 - 0.025377)
    assert r1.total().output_tokens == 266 + 3
    assert r1.total().output_tokens + r2.total().output_tokens == session.total().output_tokens


def test_repeated_and_late_reports_of_a_model_add_nothing() -> None:
    totals = ModelTotals()
    assert totals.record("a", TokenUsage(output_tokens=10)) == TokenUsage(output_tokens=10)
    assert totals.record("a", TokenUsage(output_tokens=10)) is None
    assert totals.record("a", TokenUsage(output_tokens=4)) is None
    assert totals.record(None, TokenUsage(output_tokens=7)) == TokenUsage(output_tokens=7)
    assert totals.total().output_tokens == 17
    assert set(totals.by_model()) == {"a", UNNAMED}


def test_models_past_the_bound_fold_into_the_unnamed_one() -> None:
    totals = ModelTotals(max_models=1)
    totals.record("a", TokenUsage(output_tokens=10))
    totals.record("b", TokenUsage(output_tokens=3))
    assert totals.total().output_tokens == 13
    assert set(totals.by_model()) == {"a", UNNAMED}
