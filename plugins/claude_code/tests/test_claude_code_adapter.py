"""The ``claude-code`` adapter against a recorded ``stream-json`` session."""

from __future__ import annotations

import copy
import importlib.metadata
import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from busd_claude_code import ClaudeCodeTranslator, busd_adapters, control_response
from hypothesis import given, settings
from hypothesis import strategies as st

from busd import (
    Adapter,
    AgentComplete,
    AgentStart,
    Emitted,
    Event,
    PermissionOption,
    PermissionRequested,
    PermissionResolved,
    SessionError,
    SessionIdle,
    SessionStart,
    TextComplete,
    TextDelta,
    ThinkingComplete,
    ThinkingDelta,
    ToolComplete,
    ToolStart,
    Translator,
    TurnEnd,
    TurnStart,
    Usage,
)

FIXTURES = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "sdk"
SESSION = "febcaa44-9f0f-4ae7-ad70-748009748653"
WRITE = "toolu_01XBi6iRqmAPhVzA57VVYt2U"
REQUEST = "db52ed9a-0c32-46db-8ed8-d0a8531c7460"


def fixture() -> list[dict[str, Any]]:
    with (FIXTURES / "claude_code.jsonl").open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def run(raw: list[Any], translator: Translator | None = None) -> list[Emitted]:
    """Feed ``raw`` at now = index * 0.1, then finish."""
    t = translator or ClaudeCodeTranslator()
    out: list[Emitted] = []
    for i, item in enumerate(raw):
        out += t.feed(item, i * 0.1)
    out += t.finish(len(raw) * 0.1)
    return out


def events(out: list[Emitted]) -> list[Event]:
    return [e.event for e in out]


def of(out: list[Emitted], cls: type[Any]) -> list[Any]:
    return [e.event for e in out if type(e.event) is cls]


def index(out: list[Emitted], event: Event) -> int:
    return events(out).index(event)


def assert_invariants(out: list[Emitted]) -> None:
    """Ordering every UI relies on."""
    evs = events(out)
    assert len(of(out, SessionStart)) == 1
    assert type(evs[0]) is SessionStart
    assert type(evs[-1]) is SessionIdle
    parts: dict[str, list[tuple[int, Event]]] = {}
    for i, e in enumerate(evs):
        if isinstance(e, TextDelta | TextComplete | ThinkingDelta | ThinkingComplete):
            parts.setdefault(e.message_id, []).append((i, e))
    for seq in parts.values():
        completes = [i for i, e in seq if isinstance(e, TextComplete | ThinkingComplete)]
        assert len(completes) == 1
        assert completes[0] == seq[-1][0]
    for i, e in enumerate(evs):
        if type(e) is TurnEnd:
            assert evs.index(TurnStart(turn_id=e.turn_id)) < i
            inside = [
                j for pid, seq in parts.items() if pid.startswith(f"{e.turn_id}:") for j, _ in seq
            ]
            assert all(j < i for j in inside)
    starts = {x.tool_call_id: j for j, x in enumerate(evs) if isinstance(x, ToolStart)}
    for i, e in enumerate(evs):
        if isinstance(e, ToolComplete) and e.tool_call_id in starts:
            assert starts[e.tool_call_id] < i
    for lane in {(x.session_id, x.parent_tool_call_id) for x in out}:
        totals = [
            x.event.tokens
            for x in out
            if isinstance(x.event, Usage) and lane == (x.session_id, x.parent_tool_call_id)
        ]
        for a, b in itertools.pairwise(totals):
            assert b.output_tokens >= a.output_tokens
            assert a != b


# -- the recorded session -------------------------------------------------------


def test_run_totals_are_the_result_lines() -> None:
    out = run(fixture())
    assert_invariants(out)
    final = of(out, Usage)[-1]
    assert final.model == "claude-haiku-4-5-20251001"
    tokens = final.tokens
    assert tokens.output_tokens == 231  # 143 + 88: cumulative within each call
    assert tokens.reasoning_tokens == 59
    assert tokens.input_tokens == 18
    assert tokens.cache_read_tokens == 69266
    assert tokens.cache_write_tokens == 41926
    assert tokens.cost_usd == pytest.approx(0.120235)


def test_usage_while_streaming_comes_from_message_events_never_from_snapshots() -> None:
    t = ClaudeCodeTranslator()
    per_line = [t.feed(line, i * 0.1) for i, line in enumerate(fixture())]
    for line, out in zip(fixture(), per_line, strict=True):
        if line["type"] == "assistant":
            assert of(out, Usage) == []  # the stale snapshot (output 4, 3) never counts
    streamed = [u.tokens for out in per_line[:-1] for u in of(out, Usage)]
    # message_start (4), message_delta (143), next message_start (+3), message_delta (+88)
    assert [u.output_tokens for u in streamed] == [4, 143, 146, 231]
    assert all(u.cost_usd is None for u in streamed)
    assert of(per_line[-1], Usage)[0].tokens.cost_usd == pytest.approx(0.120235)


def test_session_start_comes_from_init_and_every_event_carries_the_sdk_session() -> None:
    out = run(fixture(), ClaudeCodeTranslator(session_id="ours"))
    assert of(out, SessionStart) == [
        SessionStart(model="claude-haiku-4-5-20251001", cwd="/home/u/proj")
    ]
    assert {e.session_id for e in out} == {SESSION}
    assert {e.parent_tool_call_id for e in out} == {None}


def test_two_model_calls_with_thinking_a_tool_and_text() -> None:
    out = run(fixture())
    assert of(out, TurnEnd) == [
        TurnEnd(turn_id="msg_011CedhYCFjGqQnSudUgUaty", finish_reason="tool_use"),
        TurnEnd(turn_id="msg_011CedhYdQ2vLk3pFzR8Hn4T", finish_reason="end_turn"),
    ]
    (thinking,) = of(out, ThinkingComplete)
    assert thinking.text == "The user wants hello-allow.txt containing hello."
    assert thinking.signature == "Eu4DCrIBCBEYAipA/ruBijzz…"
    assert thinking.duration_s == pytest.approx(0.4)  # block start line 3, stop line 7
    (text,) = of(out, TextComplete)
    assert text == TextComplete(
        message_id="msg_011CedhYdQ2vLk3pFzR8Hn4T:0", text="Created hello-allow.txt."
    )
    (start,) = of(out, ToolStart)
    assert start == ToolStart(
        tool_call_id=WRITE,
        name="Write",
        input={"file_path": "/home/u/proj/tmp/hello-allow.txt", "content": "hello"},
    )
    (done,) = of(out, ToolComplete)
    assert (done.tool_call_id, done.name, done.status) == (WRITE, "Write", "ok")
    assert done.output == "File created successfully at: /home/u/proj/tmp/hello-allow.txt"
    assert done.duration_s == pytest.approx(0.4)  # stop line 12, result line 16
    assert events(out)[-1] == SessionIdle(aborted=False)


def test_can_use_tool_becomes_a_permission_request() -> None:
    out = run(fixture())
    (asked,) = of(out, PermissionRequested)
    assert asked.request_id == REQUEST
    assert asked.tool == "Write"
    assert asked.tool_call_id == WRITE
    assert asked.input == {"file_path": "/home/u/proj/tmp/hello-allow.txt", "content": "hello"}
    assert asked.title == "tmp/hello-allow.txt"
    assert asked.category == "edit"
    assert asked.annotations["permission_suggestions"] == [
        {"type": "setMode", "mode": "acceptEdits", "destination": "session"}
    ]
    assert asked.options == [
        PermissionOption(id="allow", label="Allow", kind="allow_once"),
        PermissionOption(id="allow_always", label="Always allow", kind="allow_always"),
        PermissionOption(id="deny", label="Deny", kind="reject_once"),
    ]
    # The tool ran, so the request was allowed, before the tool completed.
    (resolved,) = of(out, PermissionResolved)
    assert resolved == PermissionResolved(request_id=REQUEST, outcome="allowed")
    assert index(out, resolved) < index(out, of(out, ToolComplete)[0])


def test_control_response_resolves_the_request() -> None:
    raw = fixture()
    at = next(i for i, line in enumerate(raw) if line["type"] == "control_request")
    request = raw[at]["request"]
    answer = control_response(
        REQUEST,
        "allow_always",
        input=request["input"],
        suggestions=request["permission_suggestions"],
    )
    assert answer["response"]["response"]["updatedPermissions"] == request["permission_suggestions"]
    out = run([*raw[: at + 1], answer, *raw[at + 1 :]])
    assert of(out, PermissionResolved) == [
        PermissionResolved(request_id=REQUEST, outcome="allowed", option_id="allow_always")
    ]


def test_a_denied_request_is_resolved_denied() -> None:
    raw = fixture()
    at = next(i for i, line in enumerate(raw) if line["type"] == "control_request")
    answer = control_response(REQUEST, "deny", input={}, message="not there")
    assert answer["response"]["response"] == {"behavior": "deny", "message": "not there"}
    out = run([*raw[: at + 1], answer])
    assert of(out, PermissionResolved) == [
        PermissionResolved(
            request_id=REQUEST, outcome="denied", option_id="deny", reason="not there"
        )
    ]


def test_a_denial_listed_by_the_result_resolves_the_request() -> None:
    raw = fixture()
    result = copy.deepcopy(raw[-1])
    result["permission_denials"] = [{"tool_name": "Write", "tool_use_id": WRITE}]
    user = next(i for i, line in enumerate(raw) if line["type"] == "user")
    raw[user]["message"]["content"][0]["is_error"] = True
    out = run([*raw[:-1], result])
    assert of(out, PermissionResolved)[0].outcome == "denied"
    assert of(out, ToolComplete)[0].status == "error"


def test_feeding_twice_gives_the_same_events() -> None:
    assert run(fixture()) == run(fixture())


def test_repeated_lines_are_dropped_as_duplicates() -> None:
    raw = fixture()
    t = ClaudeCodeTranslator()
    out: list[Emitted] = []
    for i, line in enumerate(raw):
        out += t.feed(line, i * 0.1)
        out += t.feed(line, i * 0.1)
    out += t.finish(len(raw) * 0.1)
    assert out == run(raw)
    assert t.statistics().duplicates == len(raw)


def test_adapter_is_found_through_the_busd_entry_point_group() -> None:
    points = importlib.metadata.entry_points(group="busd")
    (point,) = [p for p in points if p.name == "claude-code"]
    adapter, transcripts = point.load().busd_adapters()
    assert isinstance(adapter, Adapter)
    assert adapter.name == "claude-code"
    assert isinstance(adapter.translator(), ClaudeCodeTranslator)
    assert isinstance(transcripts, Adapter)
    assert transcripts.name == "claude-code-transcript"  # Claude Code's own transcripts
    assert [a.name for a in busd_adapters()] == ["claude-code", "claude-code-transcript"]


# -- hand-made lines -----------------------------------------------------------------


def init() -> dict[str, Any]:
    return {"type": "system", "subtype": "init", "session_id": "s1", "model": "m", "cwd": "/w"}


def assistant(
    blocks: list[dict[str, Any]], parent: str | None = None, mid: str = "m1"
) -> dict[str, Any]:
    return {
        "type": "assistant",
        "session_id": "s1",
        "parent_tool_use_id": parent,
        "message": {"id": mid, "content": blocks, "usage": {"output_tokens": 4}},
    }


def result_of(
    call: str, text: str, parent: str | None = None, error: bool = False
) -> dict[str, Any]:
    block: dict[str, Any] = {
        "type": "tool_result",
        "tool_use_id": call,
        "content": [{"type": "text", "text": text}],
    }
    if error:
        block["is_error"] = True
    return {
        "type": "user",
        "session_id": "s1",
        "parent_tool_use_id": parent,
        "message": {"role": "user", "content": [block]},
    }


def result(subtype: str = "success", **extra: Any) -> dict[str, Any]:
    return {
        "type": "result",
        "subtype": subtype,
        "session_id": "s1",
        "is_error": subtype != "success",
        "usage": {"input_tokens": 1, "output_tokens": 2},
        "total_cost_usd": 0.5,
        **extra,
    }


TASK = {
    "type": "tool_use",
    "id": "toolu_task",
    "name": "Task",
    "input": {"subagent_type": "Explore", "description": "Find it", "prompt": "find"},
}


def test_sub_agent_events_carry_the_task_call_that_spawned_them() -> None:
    raw = [
        init(),
        assistant([TASK]),
        assistant(
            [{"type": "tool_use", "id": "toolu_sub", "name": "Grep", "input": {"q": "x"}}],
            parent="toolu_task",
            mid="m_sub",
        ),
        result_of("toolu_sub", "found", parent="toolu_task"),
        result_of("toolu_task", "It is in a.py"),
        result(),
    ]
    out = run(raw)
    assert_invariants(out)
    (spawn,) = of(out, AgentStart)
    assert spawn == AgentStart(
        agent_id="toolu_task", name="Explore", description="Find it", tool_call_id="toolu_task"
    )
    assert index(out, of(out, ToolStart)[0]) < index(out, spawn)
    sub = [e for e in out if e.parent_tool_call_id == "toolu_task"]
    assert [type(e.event) for e in sub] == [TurnStart, ToolStart, TurnEnd, ToolComplete]
    assert sub[1].event == ToolStart(
        tool_call_id="toolu_sub", name="Grep", input={"q": "x"}, parent_tool_call_id="toolu_task"
    )
    (done,) = of(out, AgentComplete)
    assert done == AgentComplete(agent_id="toolu_task", status="ok", result="It is in a.py")
    assert index(out, done) > index(out, sub[-1].event)
    assert [e.tool_call_id for e in of(out, ToolComplete)] == ["toolu_sub", "toolu_task"]


def test_snapshots_alone_give_text_and_end_the_turn_at_the_tool_result() -> None:
    raw = [
        init(),
        assistant([{"type": "text", "text": "Let me look."}]),
        assistant([{"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}}]),
        result_of("t1", "a.py", error=True),
        result(),
    ]
    out = run(raw)
    assert_invariants(out)
    assert of(out, TextComplete) == [TextComplete(message_id="m1:0", text="Let me look.")]
    assert of(out, TurnEnd) == [TurnEnd(turn_id="m1", finish_reason="tool_use")]
    assert index(out, of(out, TurnEnd)[0]) < index(out, of(out, ToolComplete)[0])
    assert of(out, ToolComplete)[0].error == "a.py"
    assert [u.tokens.output_tokens for u in of(out, Usage)] == [2]  # the result's, not 4


def test_an_interrupted_turn_is_idle_aborted_with_its_work_cancelled() -> None:
    raw = fixture()
    at = next(i for i, line in enumerate(raw) if line["type"] == "control_request")
    interrupted = copy.deepcopy(raw[-1])
    interrupted.update(subtype="error_during_execution", is_error=True, terminal_reason="aborted")
    out = run([*raw[: at + 1], interrupted])
    (cancelled,) = of(out, ToolComplete)
    assert (cancelled.tool_call_id, cancelled.status, cancelled.output) == (
        WRITE,
        "cancelled",
        None,
    )
    assert cancelled.duration_s == pytest.approx(0.4)  # tool start line 12, result line 16
    assert of(out, PermissionResolved)[0].outcome == "cancelled"
    assert of(out, SessionError) == []  # an interrupt is not an error
    assert events(out)[-1] == SessionIdle(aborted=True)
    # cut mid-block: the thinking completes stopped and the call ends cancelled
    cut = run([*raw[:5], interrupted])
    assert of(cut, ThinkingComplete)[0].stopped
    assert of(cut, TurnEnd)[0].finish_reason == "cancelled"
    assert of(cut, SessionIdle) == [SessionIdle(aborted=True)]


def test_the_real_cli_interrupted_mid_answer_leaves_the_text_stopped_and_the_turn_cancelled() -> (
    None
):
    """The CLI's own lines on an interrupt mid-answer (issue 17, bug 4; fixtures/README.md).

    After the partial snapshot it writes ``[Request interrupted by user]``,
    then closes the streamed block and message itself (``stop_reason``
    null): the text is cut, not complete, and the turn was cancelled.
    """
    with (Path(__file__).parent / "fixtures" / "interrupted-mid-answer.jsonl").open() as f:
        raw = [json.loads(line) for line in f]
    t = ClaudeCodeTranslator()
    out = run(raw, t)
    assert of(out, TextComplete) == [
        TextComplete(
            message_id="msg_standin_2:0", text="Counting slowly: one, two, three", stopped=True
        )
    ]
    assert of(out, TurnEnd) == [TurnEnd(turn_id="msg_standin_2", finish_reason="cancelled")]
    assert of(out, SessionError) == []
    assert events(out)[-1] == SessionIdle(aborted=True)
    stats = t.statistics()
    assert (stats.malformed, stats.unknown) == ({}, {})  # the CLI's closing lines are expected
    assert of(out, Usage)[-1].tokens.output_tokens == 29  # the result's modelUsage


@pytest.mark.parametrize(
    "errors",
    [  # what the CLI lists on an interrupt (shapes seen in public clients' tests)
        ["[ede_diagnostic] result_type=user", "Error: Request was aborted."],
        ["[ede_diagnostic] result_type=user last_content_type=n/a stop_reason=tool_use"],
    ],
)
def test_the_cli_s_interrupt_diagnostics_are_no_error(errors: list[str]) -> None:
    """A cancel is not shown as an error (issue 17): the diagnostics alone are no failure."""
    raw = fixture()
    at = next(i for i, line in enumerate(raw) if line["type"] == "control_request")
    interrupted = copy.deepcopy(raw[-1])
    interrupted.update(subtype="error_during_execution", is_error=True, errors=errors)
    out = run([*raw[: at + 1], interrupted])
    assert of(out, SessionError) == []
    assert events(out)[-1] == SessionIdle(aborted=True)
    real = [*errors, "API Error: 529 overloaded"]  # a real failure among them still is one
    interrupted.update(errors=real)
    (error,) = of(run([*raw[: at + 1], interrupted]), SessionError)
    assert error.message == "API Error: 529 overloaded"


def test_an_error_result_reports_the_error_then_goes_idle() -> None:
    out = run([init(), assistant([{"type": "text", "text": "x"}]), result("error_max_turns")])
    assert of(out, SessionError) == [
        SessionError(message="error_max_turns", code="error_max_turns")
    ]
    assert events(out)[-2:] == [of(out, SessionError)[0], SessionIdle(aborted=False)]


def test_a_stream_without_result_ends_idle_aborted() -> None:
    raw = fixture()
    at = next(i for i, line in enumerate(raw) if line["type"] == "control_request")
    out = run(raw[: at + 1])
    assert of(out, ToolComplete)[0].status == "cancelled"
    assert of(out, PermissionResolved)[0].outcome == "cancelled"
    assert events(out)[-1] == SessionIdle(aborted=True)


def test_broken_lines_are_counted_not_raised() -> None:
    t = ClaudeCodeTranslator()
    raw: list[Any] = [
        42,
        {"type": "what_is_this"},
        {"type": "stream_event", "event": "nope"},
        {"type": "assistant"},
        {"type": "system", "subtype": "a_future_subtype"},
        {"type": "control_request", "request_id": "r", "request": {"subtype": "interrupt"}},
        {"type": "control_request", "request_id": "r2", "request": {"subtype": "can_use_tool"}},
        {"type": "user", "message": {"content": [{"type": "tool_result"}]}},
        {"type": "keep_alive"},
        init(),
        result(),
    ]
    out = run(raw, t)
    stats = t.statistics()
    assert stats.unknown == {
        "what_is_this": 1,
        "system.a_future_subtype": 1,
        "control_request.interrupt": 1,
    }
    assert stats.malformed == {
        "int": 1,
        "stream_event": 1,
        "assistant": 1,
        "control_request": 1,
        "tool_result": 1,
    }
    assert events(out)[-1] == SessionIdle()


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=4),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children, max_size=3)
    ),
    max_leaves=4,
)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(
                [
                    "stream_event",
                    "assistant",
                    "user",
                    "system",
                    "result",
                    "control_request",
                    "control_response",
                    "control_cancel_request",
                ]
            ),
            st.dictionaries(
                st.sampled_from(
                    [
                        "type",
                        "event",
                        "message",
                        "subtype",
                        "request",
                        "response",
                        "request_id",
                        "parent_tool_use_id",
                        "session_id",
                        "usage",
                        "errors",
                        "uuid",
                    ]
                ),
                _json,
            ),
        ),
        max_size=10,
    )
)
def test_arbitrary_line_shapes_never_escape_translate(items: list[tuple[str, Any]]) -> None:
    t = ClaudeCodeTranslator()
    for i, (kind, fields) in enumerate(items):
        t.translate({**fields, "type": kind}, i * 0.1)
        t.translate(fields, i * 0.1)  # whatever "type" the dictionary drew, if any
    t.close(1.0)
