"""A session continued with ``session/load`` counts its cost once (issue 17, a continued session).

The recordings (fixtures/README.md): claude-agent-acp 0.101.0, one run on
a new session, then a new agent process that loads it and answers one more
prompt. The second run's ``usage_update`` cost (0.106866) is Claude Code's
restored session total: the first run's 0.024048 again, plus this run's
calls. Its ``model_usage`` counts this run's calls only (the stand-in's
calls 7 and 8; the title call 6 is in neither). Added up by the daemon, the
agent's cost would count run 1 twice, so a loaded session's cost is busd's
price of the run's own counts.

``opencode acp`` 1.18.33 (``opencode-acp-load-*.jsonl``) gives no counts per
model, and its prompt response's usage is its last message's: after a load
its cost (0.055572: run 1's 0.01995 plus this run's calls 4 and 5) cannot be
split, so busd gives the run no cost and says so.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from busd_acp import AcpAdapter

from busd import SessionWarning, TokenUsage, Usage, cost_usd

FIXTURES = Path(__file__).resolve().parent / "fixtures"
MODEL = "claude-sonnet-4-5-20250929"


def events(name: str) -> list[Any]:
    lines = [json.loads(line) for line in (FIXTURES / name).read_text().splitlines() if line]
    translator = AcpAdapter().translator(session_id="s1")
    out: list[Any] = []
    for i, line in enumerate(lines):
        out += [e.event for e in translator.feed(line, float(i))]
    return out


def last_usage(name: str) -> Usage:
    return [e for e in events(name) if isinstance(e, Usage)][-1]


def counts(tokens: TokenUsage) -> tuple[int, int, int, int]:
    return (
        tokens.input_tokens,
        tokens.output_tokens,
        tokens.cache_read_tokens,
        tokens.cache_write_tokens,
    )


def test_a_new_session_takes_the_agents_cost() -> None:
    usage = last_usage("claude-agent-acp-load-1.jsonl")
    assert counts(usage.tokens) == (36, 66, 1500, 6000)  # the stand-in's calls 1 to 3
    assert usage.tokens.cost_usd == 0.024048  # Claude Code's price, as it said it


def test_a_loaded_session_prices_its_own_counts_not_the_restored_total() -> None:
    usage = last_usage("claude-agent-acp-load-2.jsonl")
    assert counts(usage.tokens) == (35, 55, 6500, 15000)  # calls 7 and 8
    priced = cost_usd(MODEL, usage.tokens)
    assert priced == pytest.approx(0.027606 + 0.031524, rel=1e-9)
    assert usage.tokens.cost_usd == pytest.approx(priced, rel=1e-9)
    assert usage.models == {MODEL: usage.models[MODEL]}


def test_opencode_acp_on_a_new_session_takes_its_cost_for_every_call() -> None:
    usage = last_usage("opencode-acp-load-1.jsonl")
    assert counts(usage.tokens) == (13, 23, 1000, 3000)  # its last message: call 3
    assert usage.tokens.cost_usd == 0.019950000000000002  # calls 2 and 3, as OpenCode said


def test_opencode_acp_after_a_load_gives_no_cost_of_earlier_runs_and_says_why() -> None:
    out = events("opencode-acp-load-2.jsonl")
    [usage] = [e for e in out if isinstance(e, Usage)]
    assert counts(usage.tokens) == (15, 25, 2000, 5000)  # its last message: call 5
    assert usage.tokens.cost_usd is None  # not 0.055572, which holds run 1's 0.01995 again
    [warning] = [e for e in out if isinstance(e, SessionWarning)]
    assert warning.message.startswith("This run's cost is unknown: after session/load")
