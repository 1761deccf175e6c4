"""The ``claude-code`` adapter on a real recording of a sub-agent that runs a tool.

Claude Code 2.1.332 against ``fixtures/record_stand_in_tasks.py`` (see
fixtures/README.md): the main model thinks, starts a background ``Agent`` on
haiku, and the sub-agent runs ``Bash``. That is what makes the CLI write
``task_progress`` (one per sub-agent tool call) and ``thinking_tokens`` (its
running estimate of streamed thinking, every 40 characters here). The stand-in's
usage per call:

=================  =====  ===========  ==========  ======
call               input  cache write  cache read  output
=================  =====  ===========  ==========  ======
main 1 (Agent)         4        6,000           0     210
main 2                 1          400       6,000      30
sub 1 (Bash)           3        9,000           0      40
sub 2 (answer)         5           60       9,000       9
main 3                 1          400       6,000      30
=================  =====  ===========  ==========  ======

``modelUsage`` on the last ``result`` (documented as the process's running
total over every model): sonnet 6 / 270 / 12,000 read / 6,800 written
(``costUSD`` 0.033168), haiku 8 / 49 / 9,000 / 9,060 (0.0012478);
``total_cost_usd`` 0.0344158. Each expected figure is that arithmetic.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from busd_claude_code import ClaudeCodeTranslator

from busd import (
    AgentComplete,
    AgentUpdate,
    Emitted,
    ThinkingDelta,
    ToolComplete,
    Usage,
)

CAPTURE = Path(__file__).resolve().parent / "fixtures" / "subagent-bash.partial.jsonl"
AGENT = "toolu_agent_1"


def run() -> tuple[list[Emitted], ClaudeCodeTranslator, list[dict[str, Any]]]:
    raw = [json.loads(line) for line in CAPTURE.read_text().splitlines() if line.strip()]
    t = ClaudeCodeTranslator()
    out: list[Emitted] = []
    for i, item in enumerate(raw):
        out += t.feed(item, i * 0.1)
    out += t.finish(len(raw) * 0.1)
    return out, t, raw


def test_task_progress_is_the_sub_agents_current_step() -> None:
    """``description`` (the CLI's words for the step) and ``last_tool_name``."""
    out, t, raw = run()
    assert sum(1 for line in raw if line.get("subtype") == "task_progress") == 1
    updates = [e.event for e in out if type(e.event) is AgentUpdate]
    assert [(u.agent_id, u.status, u.message) for u in updates] == [
        (AGENT, "running", "Compute with the shell"),  # task_started
        (AGENT, "running", "Running Print the answer: Bash"),  # task_progress
    ]
    (bash,) = [
        e.event for e in out if isinstance(e.event, ToolComplete) and e.parent_tool_call_id == AGENT
    ]
    assert (bash.name, bash.output) == ("Bash", "42")
    (done,) = [e.event for e in out if type(e.event) is AgentComplete]
    assert (done.agent_id, done.status, done.result) == (AGENT, "ok", "The shell says 42.")
    assert t.statistics().unknown == {}


def test_thinking_tokens_lines_are_passed_over_for_the_deltas_they_estimate() -> None:
    """15 ``thinking_tokens`` lines (10, 20, ... 140, then 147) beside 15 thinking deltas.

    The estimate is the CLI's (about 4 characters a token); busd estimates the
    same deltas itself, so publishing both would count the thinking twice.
    """
    out, t, raw = run()
    estimates = [line for line in raw if line.get("subtype") == "thinking_tokens"]
    # 14 deltas of 40 characters, the last of 28 (588 in all: the CLI's ~4 a token).
    assert [line["estimated_tokens"] for line in estimates] == [*range(10, 141, 10), 147]
    deltas = [e.event for e in out if type(e.event) is ThinkingDelta]
    assert len(deltas) == len(estimates) == 15
    assert t.statistics().unknown == {}
    assert t.statistics().malformed == {}


def test_the_last_usage_is_every_models_total() -> None:
    out, _, _ = run()
    last = [e.event for e in out if type(e.event) is Usage][-1]
    got = last.tokens
    assert (
        got.input_tokens,
        got.output_tokens,
        got.cache_read_tokens,
        got.cache_write_tokens,
    ) == (6 + 8, 270 + 49, 12_000 + 9_000, 6_800 + 9_060)
    assert got.cost_usd == pytest.approx(0.033168 + 0.0012478)
    assert set(last.models) == {"claude-sonnet-4-5-20250929", "claude-haiku-5-5"}
    assert last.models["claude-haiku-5-5"].output_tokens == 40 + 9


LIFECYCLE = CAPTURE.with_name("subagent-bash.stdin-lifecycle.jsonl")


def test_command_lifecycle_lines_are_the_queue_of_our_own_input_and_pass_over() -> None:
    """Prompts sent on stdin with a ``uuid`` get ``queued``, ``started``, ``completed``.

    Recorded with two prompts written at once (fixtures/README.md): the state
    of busd's own input, nothing the agent did, so nothing is published for
    them and nothing is reported unknown.
    """
    raw = [json.loads(line) for line in LIFECYCLE.read_text().splitlines() if line.strip()]
    states = [
        (line["command_uuid"][:2], line["state"])
        for line in raw
        if line.get("type") == "command_lifecycle"
    ]
    assert sorted(states) == sorted(
        (who, state) for who in ("11", "22") for state in ("queued", "started", "completed")
    )
    t = ClaudeCodeTranslator()
    out: list[Emitted] = []
    for i, item in enumerate(raw):
        if item.get("type") == "command_lifecycle":
            assert t.feed(item, i * 0.1) == []
        else:
            out += t.feed(item, i * 0.1)
    assert t.statistics().unknown == {}
    assert sum(1 for line in raw if line.get("type") == "result") == 2
