"""The ``claude-code`` adapter on real Claude Code 2.1.332 recordings (see fixtures/README.md).

Each run uses two models: the main model (``claude-sonnet-4-5-20250929``)
starts an ``Agent`` sub-agent on ``haiku`` (``claude-haiku-5-5``). The stand-in
server's usage per call (fixtures/record_stand_in.py) is:

====================  =====  ===========  ==========  ======
call                  input  cache write  cache read  output
====================  =====  ===========  ==========  ======
main 1 (Agent call)       3        5,000           0     120
sub-agent (haiku)         2       15,000           0       3
main 2 (answer)           1          300       5,000     146
main 3 (after the         1          300       5,000     146
task notification)
====================  =====  ===========  ==========  ======

Claude Code's documented semantics, which the recordings follow: ``usage``
on a ``result`` is that turn's main-model calls; ``modelUsage`` and
``total_cost_usd`` are running totals over every model of the process.
Each expected figure below is that arithmetic, not busd's output.
"""

from __future__ import annotations

import itertools
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from busd_claude_code import ClaudeCodeTranslator

from busd import (
    AgentComplete,
    AgentStart,
    AgentUpdate,
    Emitted,
    SessionContext,
    SessionIdle,
    SessionInfo,
    SessionWarning,
    TextComplete,
    TokenUsage,
    ToolComplete,
    Usage,
)
from tests.test_ingest_e2e import run_fixture

HERE = Path(__file__).resolve().parent / "fixtures"
SNAPSHOTS = HERE / "subagent-haiku.snapshots.jsonl"
PARTIAL = HERE / "subagent-haiku.partial-hooks.jsonl"
OAUTH = HERE / "subagent-haiku.oauth-rate-limit.jsonl"
MAIN = "claude-sonnet-4-5-20250929"
AGENT = "toolu_agent_1"

# After the first result: main calls 1 and 2, and the sub-agent.
FIRST = TokenUsage(
    input_tokens=3 + 1 + 2,  # 6
    output_tokens=120 + 146 + 3,  # 269
    cache_read_tokens=0 + 5_000 + 0,  # 5,000
    cache_write_tokens=5_000 + 300 + 15_000,  # 20,300
    cost_usd=0.025377 + 0.0018767,  # modelUsage costUSD: 0.0272537 = total_cost_usd
)
# After the second: main call 3 as well.
SECOND = TokenUsage(
    input_tokens=6 + 1,  # 7
    output_tokens=269 + 146,  # 415
    cache_read_tokens=5_000 + 5_000,  # 10,000
    cache_write_tokens=20_300 + 300,  # 20,600
    cost_usd=0.030195 + 0.0018767,  # 0.0320717 = total_cost_usd
)
# The window after the last main call: its prompt (1 + 300 + 5,000) and its output 146.
LAST_CALL = 1 + 300 + 5_000 + 146  # 5,447


def lines(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def run(raw: list[dict[str, Any]]) -> tuple[list[Emitted], ClaudeCodeTranslator]:
    t = ClaudeCodeTranslator()
    out: list[Emitted] = []
    for i, item in enumerate(raw):
        out += t.feed(item, i * 0.1)
    out += t.finish(len(raw) * 0.1)
    return out, t


def main_usage(out: list[Emitted]) -> list[Usage]:
    return [e.event for e in out if type(e.event) is Usage and e.parent_tool_call_id is None]


def at_results(out: list[Emitted], cls: type[Any]) -> list[Any]:
    """The last ``cls`` event before each main-agent idle (each ``result``)."""
    found: list[Any] = []
    last = None
    for e in out:
        if type(e.event) is cls and e.parent_tool_call_id is None:
            last = e.event
        elif type(e.event) is SessionIdle:
            found.append(last)
    return found


def same(a: TokenUsage, b: TokenUsage) -> None:
    assert a.cost_usd == pytest.approx(b.cost_usd)
    assert (a.input_tokens, a.output_tokens, a.cache_read_tokens, a.cache_write_tokens) == (
        b.input_tokens,
        b.output_tokens,
        b.cache_read_tokens,
        b.cache_write_tokens,
    )


@pytest.mark.parametrize(
    ("path", "at_first"),
    [(SNAPSHOTS, FIRST), (PARTIAL, SECOND), (OAUTH, SECOND)],
    ids=["snapshots", "partial", "oauth"],
)
def test_run_totals_cover_every_model(path: Path, at_first: TokenUsage) -> None:
    """``result.usage`` is the main model's; ``modelUsage`` adds the haiku sub-agent.

    In the partial and OAuth recordings both results were written after main
    call 3, so the first one's running totals already include it.
    """
    out, _ = run(lines(path))
    first, second = at_results(out, Usage)
    same(first.tokens, at_first)
    same(second.tokens, SECOND)
    assert {u.model for u in main_usage(out)} == {MAIN}  # the total is the main agent's
    # Running totals never go down (consumers keep the max of each field).
    usages = [u.tokens for u in main_usage(out)]
    for before, after in itertools.pairwise(usages):
        assert after.output_tokens >= before.output_tokens
        assert after.cache_write_tokens >= before.cache_write_tokens


HAIKU = "claude-haiku-5-5"
# Per model after the second result (each ``modelUsage`` entry, from the call table):
SONNET_TOTAL = TokenUsage(
    input_tokens=3 + 1 + 1,  # 5
    output_tokens=120 + 146 + 146,  # 412
    cache_read_tokens=0 + 5_000 + 5_000,  # 10,000
    cache_write_tokens=5_000 + 300 + 300,  # 5,600
    cost_usd=0.030195,  # its costUSD
)
HAIKU_TOTAL = TokenUsage(
    input_tokens=2, output_tokens=3, cache_write_tokens=15_000, cost_usd=0.0018767
)


@pytest.mark.parametrize("path", [SNAPSHOTS, PARTIAL, OAUTH], ids=["snapshots", "partial", "oauth"])
def test_usage_breaks_down_by_model(path: Path) -> None:
    """``stream.usage`` ``models``: one running total per ``modelUsage`` entry.

    Sonnet 412 + haiku 3 = 415 output, $0.030195 + $0.0018767 = $0.0320717:
    the breakdown adds up to the all-model total (``SECOND``).
    """
    out, _ = run(lines(path))
    last = main_usage(out)[-1]
    assert list(last.models) == [MAIN, HAIKU]
    same(last.models[MAIN], SONNET_TOTAL)
    same(last.models[HAIKU], HAIKU_TOTAL)
    assert last.models[MAIN].output_tokens + last.models[HAIKU].output_tokens == 412 + 3 == 415
    assert last.tokens.output_tokens == 415
    assert last.tokens.cost_usd == pytest.approx(0.030195 + 0.0018767)  # 0.0320717
    # Once known, every main-agent report carries the whole breakdown (the latest
    # stream.usage of a session supersedes the earlier ones when coalesced).
    usages = main_usage(out)
    first = next(i for i, u in enumerate(usages) if u.models)
    assert all(set(u.models) == {MAIN, HAIKU} for u in usages[first:])
    # Sub-agent lanes report their own totals, without a breakdown.
    assert all(not e.event.models for e in out if type(e.event) is Usage and e.parent_tool_call_id)


def test_the_first_result_breaks_down_too() -> None:
    """Snapshot-only run, first result: sonnet's main calls 1 and 2 (input 3 + 1 = 4,
    output 120 + 146 = 266, cache write 5,000 + 300, read 5,000, costUSD 0.025377)
    beside the haiku sub-agent."""
    out, _ = run(lines(SNAPSHOTS))
    first, _second = at_results(out, Usage)
    same(
        first.models[MAIN],
        TokenUsage(
            input_tokens=4,
            output_tokens=266,
            cache_read_tokens=5_000,
            cache_write_tokens=5_300,
            cost_usd=0.025377,
        ),
    )
    same(first.models[HAIKU], HAIKU_TOTAL)


def test_without_partial_messages_the_context_is_the_last_call_not_the_run() -> None:
    """The snapshot-only run: the only usage is each ``result``'s.

    First result: the turn had two main calls, so the last one's output is
    only the stale snapshot figure (1): 1 + 300 + 5,000 + 1 = 5,302, not the
    turn's 4 + 5,300 + 5,000 + 266 = 10,570. Second result: one call, whose
    output the result states (146): 5,447.
    """
    out, _ = run(lines(SNAPSHOTS))
    first, second = at_results(out, SessionContext)
    assert (first.used, first.window) == (1 + 300 + 5_000 + 1, 200_000)
    assert (second.used, second.window) == (LAST_CALL, 200_000)


def test_with_partial_messages_the_context_is_the_streamed_last_call() -> None:
    out, _ = run(lines(PARTIAL))
    first, second = at_results(out, SessionContext)
    assert (first.used, first.window) == (LAST_CALL, 200_000)
    assert (second.used, second.window) == (LAST_CALL, 200_000)


@pytest.mark.parametrize("path", [SNAPSHOTS, PARTIAL, OAUTH], ids=lambda p: p.stem)
def test_a_background_sub_agent_ends_at_its_task_notification(path: Path) -> None:
    """The ``Agent`` tool result only says the agent was launched; the task says when it ended."""
    out, _ = run(lines(path))
    evs = [e.event for e in out]
    start = next(e for e in evs if type(e) is AgentStart)
    assert (start.agent_id, start.name, start.description) == (
        AGENT,
        "general-purpose",
        "Compute the answer",
    )
    running = [e for e in evs if type(e) is AgentUpdate]
    assert [(u.agent_id, u.status, u.message) for u in running] == [
        (AGENT, "running", "Compute the answer")
    ]
    tool = next(e for e in evs if type(e) is ToolComplete and e.tool_call_id == AGENT)
    (done,) = [e for e in evs if type(e) is AgentComplete]
    assert (done.agent_id, done.status, done.result) == (AGENT, "ok", "It is 42.")
    answer = next(
        e for e in out if type(e.event) is TextComplete and e.parent_tool_call_id == AGENT
    )
    assert evs.index(tool) < evs.index(answer.event) < evs.index(done)


def test_hook_runs_are_info_and_known_lines_are_not_unknown() -> None:
    out, t = run(lines(PARTIAL))
    (info,) = [e.event for e in out if type(e.event) is SessionInfo]
    assert info.message == "hook PreToolUse:Agent: success"
    stats = t.statistics()
    assert stats.unknown == {}
    assert stats.malformed == {}


def test_a_rate_limit_warning_says_when_it_resets() -> None:
    """``allowed_warning`` at 92% of the five-hour window.

    Reset 1798700400 s = 20,818 days + 25,200 s after the epoch: 2026-12-31 07:00 UTC.
    """
    out, t = run(lines(OAUTH))
    (warning,) = [e.event for e in out if type(e.event) is SessionWarning]
    assert warning.message == (
        "rate limit: 92% of the five-hour limit used; resets 2026-12-31 07:00 UTC"
    )
    assert t.statistics().unknown == {}


def test_a_rejected_rate_limit_without_a_reset_time() -> None:
    """Constructed by hand (not a capture), in the shape of claude_agent_sdk.types.RateLimitInfo."""
    line = {
        "type": "rate_limit_event",
        "rate_limit_info": {"status": "rejected", "rateLimitType": "seven_day"},
        "uuid": "u-1",
        "session_id": "s",
    }
    out, _ = run([line])
    (warning,) = [e.event for e in out if type(e.event) is SessionWarning]
    assert warning.message == "rate limit reached: the seven-day limit"
    allowed = {**line, "uuid": "u-2", "rate_limit_info": {"status": "allowed"}}
    out, _ = run([allowed])
    assert not [e for e in out if type(e.event) is SessionWarning]


# -- hand-constructed lines (not captures): shapes from claude_agent_sdk.types --------------


def agent_call(call: str, *, background: bool) -> list[dict[str, Any]]:
    """An ``Agent`` call and its ``task_started``, as in the recordings, ids changed."""
    use = {
        "type": "tool_use",
        "id": call,
        "name": "Agent",
        "input": {"description": "Look around", "prompt": "p", "subagent_type": "Explore"},
    }
    return [
        {"type": "system", "subtype": "init", "session_id": "s", "model": MAIN},
        {
            "type": "assistant",
            "message": {"id": f"msg-{call}", "model": MAIN, "content": [use]},
            "session_id": "s",
        },
        {
            "type": "system",
            "subtype": "task_started",
            "task_id": f"task-{call}",
            "tool_use_id": call,
            "description": "Look around",
            "is_backgrounded": background,
            "session_id": "s",
        },
    ]


def tool_result(call: str, text: str) -> dict[str, Any]:
    block = {"type": "tool_result", "tool_use_id": call, "content": text}
    return {"type": "user", "message": {"role": "user", "content": [block]}, "session_id": "s"}


def test_a_foreground_sub_agent_still_ends_at_its_tool_result() -> None:
    raw = [
        *agent_call("toolu_fg", background=False),
        {
            "type": "system",
            "subtype": "task_progress",
            "task_id": "task-toolu_fg",
            "description": "Look around",
            "last_tool_name": "Grep",
            "usage": {"total_tokens": 10, "tool_uses": 1, "duration_ms": 5},
            "session_id": "s",
        },
        {
            "type": "system",
            "subtype": "task_updated",
            "task_id": "task-toolu_fg",
            "patch": {"status": "completed"},
        },
        tool_result("toolu_fg", "found it"),
    ]
    out, _ = run(raw)
    updates = [(e.event.status, e.event.message) for e in out if type(e.event) is AgentUpdate]
    assert updates == [("running", "Look around"), ("running", "Look around: Grep")]
    (done,) = [e.event for e in out if type(e.event) is AgentComplete]
    assert (done.status, done.result) == ("ok", "found it")


def test_a_background_sub_agent_killed_without_a_notification_is_cancelled() -> None:
    raw = [
        *agent_call("toolu_bg", background=True),
        tool_result("toolu_bg", "Async agent launched successfully."),
        {
            "type": "system",
            "subtype": "task_updated",
            "task_id": "task-toolu_bg",
            "patch": {"status": "killed"},
        },
    ]
    out, _ = run(raw)
    (done,) = [e.event for e in out if type(e.event) is AgentComplete]
    assert (done.agent_id, done.status) == ("toolu_bg", "cancelled")
    assert type(out[-1].event) is SessionIdle


def test_a_background_sub_agent_still_running_when_the_stream_ends_is_cancelled() -> None:
    raw = [
        *agent_call("toolu_bg", background=True),
        tool_result("toolu_bg", "Async agent launched successfully."),
    ]
    out, _ = run(raw)
    assert not [e for e in out[:-2] if type(e.event) is AgentComplete]
    (done,) = [e.event for e in out if type(e.event) is AgentComplete]
    assert done.status == "cancelled"


def test_a_rejected_turn_leaves_the_context_alone() -> None:
    """Claude Code answers a rejected call with a ``<synthetic>`` message and zero usage."""
    synthetic = {
        "type": "assistant",
        "message": {
            "id": "synthetic-1",
            "model": "<synthetic>",
            "role": "assistant",
            "content": [{"type": "text", "text": "You've hit your session limit"}],
            "usage": {"input_tokens": 0, "output_tokens": 0},
        },
        "session_id": "s",
        "error": "rate_limit",
    }
    result = {
        "type": "result",
        "subtype": "success",
        "is_error": True,
        "result": "You've hit your session limit",
        "session_id": "s",
        "usage": {"input_tokens": 0, "output_tokens": 0},
    }
    out, _ = run([{"type": "system", "subtype": "init", "session_id": "s"}, synthetic, result])
    assert not [e for e in out if type(e.event) is SessionContext]


def test_a_failed_hook_is_a_warning() -> None:
    line = {
        "type": "system",
        "subtype": "hook_response",
        "hook_name": "PreToolUse:Bash",
        "hook_event": "PreToolUse",
        "stderr": "blocked: rm -rf\nmore",
        "exit_code": 2,
        "outcome": "error",
        "session_id": "s",
    }
    out, _ = run([line])
    (warning,) = [e.event for e in out if type(e.event) is SessionWarning]
    assert warning.message == "hook PreToolUse:Bash: error (exit 2): blocked: rm -rf"


# -- through a real daemon ---------------------------------------------------------------------


@pytest.fixture
def sock_path() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="busd-", dir="/tmp"))
    yield directory / "run" / "bus.sock"
    shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.parametrize("path", [SNAPSHOTS, PARTIAL], ids=["snapshots", "partial"])
async def test_busd_ingest_shows_every_model_and_the_last_call(sock_path: Path, path: Path) -> None:
    """``busd serve`` + ``busd ingest`` + two ``busd tail``: what a UI ends up showing."""
    shown, _ = await run_fixture(sock_path, "claude-code", str(path))
    same(TokenUsage(**shown.usage), SECOND)
    last = shown.contexts[-1]
    assert (last["used"], last["window"]) == (LAST_CALL, 200_000)
