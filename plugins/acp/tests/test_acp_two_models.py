"""claude-agent-acp with a sub-agent on another model, recorded for real.

tests/fixtures/sdk/acp-claude-agent-acp-two-models.jsonl: claude-agent-acp
0.101.0 against plugins/claude_code/tests/fixtures/record_stand_in_tasks.py
(README in tests/fixtures/sdk/): the main model (sonnet) thinks and starts a
background ``Agent`` on haiku, whose first call runs ``Bash``; the prompt
response comes after the main model's second call. The stand-in's usage for
the calls of the turn:

==================  =====  ===========  ==========  ======
call                input  cache write  cache read  output
==================  =====  ===========  ==========  ======
side call (sonnet)     50            0           0       7
main 1 (Agent)          4        6,000           0     210
sub 1 (haiku, Bash)     3        9,000           0      40
main 2                  1          400       6,000      30
==================  =====  ===========  ==========  ======

The sub-agent's ``Bash`` carries ``_meta.claudeCode.parentToolUseId``: it is
published under the ``Agent`` call, which starts a sub-agent. The launch
result says only that the agent went to the background
(``toolResponse.status: async_launched``); claude-agent-acp holds the prompt
response until a background sub-agent the turn started settles (for a client
that does not declare ``backgroundSubagents``), so the turn's end ends it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from busd_acp import AcpAdapter

from busd import (
    AgentComplete,
    AgentStart,
    AgentUpdate,
    Emitted,
    PermissionRequested,
    ToolComplete,
    ToolStart,
    TurnEnd,
    Usage,
)

CAPTURE = (
    Path(__file__).resolve().parents[3]
    / "tests"
    / "fixtures"
    / "sdk"
    / "acp-claude-agent-acp-two-models.jsonl"
)
SONNET = "claude-sonnet-4-5-20250929"
HAIKU = "claude-haiku-5-5"


def recording() -> list[dict[str, Any]]:
    return [json.loads(line) for line in CAPTURE.read_text().splitlines() if line.strip()]


def feed(raws: list[dict[str, Any]] | None = None) -> tuple[list[Emitted], Any]:
    raws = recording() if raws is None else raws
    t = AcpAdapter().translator()
    out: list[Emitted] = []
    for n, raw in enumerate(raws):
        out += t.feed(raw, n * 0.1)
    out += t.finish(len(raws) * 0.1)
    return out, t.statistics()


def test_the_turns_usage_is_each_models_calls_summed() -> None:
    """sonnet: 50 + 4 + 1 = 55 in, 7 + 210 + 30 = 247 out, 6,000 read, 6,000 + 400 written;
    haiku: 3 in, 40 out, 9,000 written. The cost is the agent's (its last ``usage_update``)."""
    out, stats = feed()
    assert (stats.unknown, stats.malformed, stats.duplicates) == ({}, {}, 0)
    (usage,) = [e.event for e in out if type(e.event) is Usage]
    by_model = {
        model: (t.input_tokens, t.output_tokens, t.cache_read_tokens, t.cache_write_tokens)
        for model, t in usage.models.items()
    }
    assert by_model == {SONNET: (55, 247, 6_000, 6_400), HAIKU: (3, 40, 0, 9_000)}
    total = usage.tokens
    assert (
        total.input_tokens,
        total.output_tokens,
        total.cache_read_tokens,
        total.cache_write_tokens,
    ) == (55 + 3, 247 + 40, 6_000, 6_400 + 9_000)
    assert total.cost_usd == 0.038423799999999994


def test_both_tools_ran() -> None:
    out, _ = feed()
    starts = [e.event for e in out if type(e.event) is ToolStart]
    assert [s.name for s in starts] == ["Agent", "Bash"]
    done = {e.event.tool_call_id: e.event for e in out if type(e.event) is ToolComplete}
    assert done["toolu_bash_3"].status == "ok"


# -- the sub-agent ---------------------------------------------------------------

AGENT = "toolu_agent_1"


def index(out: list[Emitted], predicate: Any) -> int:
    return next(i for i, e in enumerate(out) if predicate(e.event))


def agent_events(out: list[Emitted]) -> list[Emitted]:
    return [e for e in out if isinstance(e.event, AgentStart | AgentUpdate | AgentComplete)]


def test_the_sub_agents_tools_are_published_under_the_agent_call() -> None:
    out, _ = feed()
    parents = {
        (type(e.event).__name__, e.event.tool_call_id): e.parent_tool_call_id
        for e in out
        if isinstance(e.event, ToolStart | ToolComplete)
    }
    assert parents == {
        ("ToolStart", AGENT): None,
        ("ToolComplete", AGENT): None,
        ("ToolStart", "toolu_bash_3"): AGENT,
        ("ToolComplete", "toolu_bash_3"): AGENT,
    }


def test_the_agent_call_starts_a_sub_agent_that_outlives_its_background_launch() -> None:
    out, stats = feed()
    assert (stats.unknown, stats.malformed, stats.duplicates) == ({}, {}, 0)
    start, running, done = agent_events(out)
    assert start.event == AgentStart(
        agent_id=AGENT,
        name="general-purpose",
        description="Compute with the shell",
        parent_agent_id=None,
        tool_call_id=AGENT,
    )
    assert (start.session_id, start.parent_tool_call_id) == (out[0].session_id, None)
    assert running.event == AgentUpdate(agent_id=AGENT, status="running", message="background")
    assert done.event == AgentComplete(agent_id=AGENT, status="ok", result=None)
    # In order: the call starts it; the launch result leaves it running; its Bash
    # runs inside it; the end of the turn (held for it) ends it.
    at = {id(e): i for i, e in enumerate(out)}
    agent_tool = index(out, lambda e: type(e) is ToolStart and e.tool_call_id == AGENT)
    launched = index(out, lambda e: type(e) is ToolComplete and e.tool_call_id == AGENT)
    bash_done = index(out, lambda e: type(e) is ToolComplete and e.tool_call_id == "toolu_bash_3")
    turn_end = index(out, lambda e: type(e) is TurnEnd)
    assert agent_tool < at[id(start)] < launched < at[id(running)] < bash_done
    assert bash_done < at[id(done)] < turn_end


def is_launch_response(raw: dict[str, Any]) -> bool:
    """The hook's update saying the ``Agent`` call only launched its sub-agent."""
    meta = raw.get("params", {}).get("update", {}).get("_meta", {}).get("claudeCode", {})
    return "toolResponse" in meta and bool(meta["toolResponse"].get("isAsync"))


def is_agent_completed(raw: dict[str, Any]) -> bool:
    update = raw.get("params", {}).get("update", {})
    return bool(update.get("toolCallId") == AGENT and update.get("status") == "completed")


FOREGROUND_RESULT = "The sub-agent ran echo: 42."


def without_background_launch(raws: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The recording as a foreground agent would have it: no ``async_launched`` response,
    and the call's result the sub-agent's answer, not the launch notice."""
    kept = []
    for raw in raws:
        if is_launch_response(raw):
            continue
        if is_agent_completed(raw):
            update = {**raw["params"]["update"]}
            update["rawOutput"] = [{"type": "text", "text": FOREGROUND_RESULT}]
            text = {"type": "text", "text": FOREGROUND_RESULT}
            update["content"] = [{"type": "content", "content": text}]
            raw = {**raw, "params": {**raw["params"], "update": update}}
        kept.append(raw)
    return kept


def test_a_foreground_agent_ends_with_its_call_and_its_result() -> None:
    out, _ = feed(without_background_launch(recording()))
    start, done = agent_events(out)
    assert type(start.event) is AgentStart
    assert done.event == AgentComplete(agent_id=AGENT, status="ok", result=FOREGROUND_RESULT)
    launched = index(out, lambda e: type(e) is ToolComplete and e.tool_call_id == AGENT)
    assert out.index(done) == launched + 1


def hook_after_completion(raws: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The recording with the launch response after the call's ``completed`` update: the
    hook that sends it can fire late (it did in a CI run of the live test)."""
    (response,) = [raw for raw in raws if is_launch_response(raw)]
    rest = [raw for raw in raws if raw is not response]
    at = next(n for n, raw in enumerate(rest) if is_agent_completed(raw)) + 1
    return [*rest[:at], response, *rest[at:]]


def test_a_background_launch_is_told_by_its_result_when_the_hook_comes_late() -> None:
    out, stats = feed(hook_after_completion(recording()))
    assert stats.duplicates == 1  # the late response, for a call already ended
    start, running, done = agent_events(out)
    assert type(start.event) is AgentStart
    assert running.event == AgentUpdate(agent_id=AGENT, status="running", message="background")
    assert done.event == AgentComplete(agent_id=AGENT, status="ok", result=None)
    bash_done = index(out, lambda e: type(e) is ToolComplete and e.tool_call_id == "toolu_bash_3")
    turn_end = index(out, lambda e: type(e) is TurnEnd)
    assert out.index(running) < bash_done < out.index(done) < turn_end


def cancelled_turn(raws: list[dict[str, Any]]) -> list[dict[str, Any]]:
    last = raws[-1]
    assert last["result"]["stopReason"] == "end_turn"
    return [*raws[:-1], {**last, "result": {**last["result"], "stopReason": "cancelled"}}]


def test_a_background_agent_is_cancelled_with_its_turn() -> None:
    out, _ = feed(cancelled_turn(recording()))
    *_, done = agent_events(out)
    assert done.event == AgentComplete(agent_id=AGENT, status="cancelled")


def test_a_stream_that_stops_mid_turn_cancels_the_agent_and_its_running_tool() -> None:
    """Cut right after the sub-agent's ``Bash`` started: nothing else will end either."""
    raws = recording()
    cut = next(
        n
        for n, raw in enumerate(raws)
        if raw.get("params", {}).get("update", {}).get("toolCallId") == "toolu_bash_3"
    )
    out, _ = feed(raws[: cut + 1])
    bash = [
        (n, e.event.status, e.parent_tool_call_id)
        for n, e in enumerate(out)
        if isinstance(e.event, ToolComplete) and e.event.tool_call_id != AGENT
    ]
    assert [b[1:] for b in bash] == [("cancelled", AGENT)]
    *_, done = agent_events(out)
    assert done.event == AgentComplete(agent_id=AGENT, status="cancelled")
    assert bash[0][0] < out.index(done)


def test_a_sub_agents_permission_request_names_its_agent_call() -> None:
    raws = recording()
    bash_call = next(
        n
        for n, raw in enumerate(raws)
        if raw.get("params", {}).get("update", {}).get("toolCallId") == "toolu_bash_3"
    )
    session = raws[bash_call]["params"]["sessionId"]
    ask = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "session/request_permission",
        "params": {
            "sessionId": session,
            "toolCall": {
                "toolCallId": "toolu_bash_3",
                "_meta": {"claudeCode": {"toolName": "Bash", "parentToolUseId": AGENT}},
            },
            "options": [{"optionId": "allow", "name": "Allow", "kind": "allow_once"}],
        },
    }
    out, _ = feed([*raws[: bash_call + 1], ask])
    [asked] = [e for e in out if isinstance(e.event, PermissionRequested)]
    assert isinstance(asked.event, PermissionRequested)
    assert (asked.event.tool, asked.parent_tool_call_id) == ("Bash", AGENT)
