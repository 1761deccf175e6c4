"""The ACP adapter against the shared fixture and hand-made JSON-RPC exchanges.

``acp.jsonl`` is copied from the project's shared/fixtures/sdk (Agent Client
Protocol JSON-RPC in both directions: spec shapes plus public frames, ordering
composed; see tests/fixtures/sdk/README.md for provenance).
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import Any

import busd_acp
import pytest
from busd_acp import AcpAdapter, AcpTranslator

from busd import (
    Emitted,
    PermissionOption,
    PermissionRequested,
    PermissionResolved,
    PluginManager,
    SessionContext,
    SessionError,
    SessionIdle,
    SessionInfo,
    SessionStart,
    SessionTitleChanged,
    TextComplete,
    TextDelta,
    ThinkingComplete,
    ThinkingDelta,
    TokenUsage,
    ToolComplete,
    ToolPartialResult,
    ToolStart,
    TurnEnd,
    TurnStart,
    Usage,
    event_type,
)
from busd.core.permissions import PermissionRule
from busd.frontends.headless import ToolRules
from tests.daemon_helpers import load_module

HERE = Path(__file__).resolve().parent
messages = load_module(HERE / "acp_messages.py", "acp_adapter_messages")
SESSION, WRITE_CALL, RM_CALL = messages.SESSION, messages.WRITE_CALL, messages.RM_CALL
fixture, run, of, index = messages.fixture, messages.run, messages.of, messages.index
prompt, update, chunk = messages.prompt, messages.update, messages.chunk
permission, answer, selected = messages.permission, messages.answer, messages.selected


# -- the fixture: what every correct adapter derives ----------------------------


def test_first_prompt_ends_end_turn_after_permission_allowed_once() -> None:
    out = run(fixture())
    assert of(out, TurnStart) == [
        TurnStart(turn_id="acp-prompt-2"),
        TurnStart(turn_id="acp-prompt-3"),
    ]
    assert of(out, TurnEnd)[0] == TurnEnd(turn_id="acp-prompt-2", finish_reason="end_turn")
    requested = of(out, PermissionRequested)[0]
    assert requested == PermissionRequested(
        request_id="acp-0",
        tool="write",
        input={"content": "okra", "filePath": "/tmp/p4/p4-check.txt"},
        tool_call_id=WRITE_CALL,
        category="edit",
        options=[
            PermissionOption(id="once", label="Allow once", kind="allow_once"),
            PermissionOption(id="always", label="Always allow", kind="allow_always"),
            PermissionOption(id="reject", label="Reject", kind="reject_once"),
        ],
    )
    assert of(out, PermissionResolved)[0] == PermissionResolved(
        request_id="acp-0", outcome="allowed", option_id="once"
    )
    assert of(out, SessionIdle)[0] == SessionIdle(aborted=False)


def test_write_tool_starts_once_its_input_is_known_and_completes_ok() -> None:
    out = run(fixture())
    starts = [s for s in of(out, ToolStart) if s.tool_call_id == WRITE_CALL]
    assert starts == [
        ToolStart(
            tool_call_id=WRITE_CALL,
            name="write",
            input={"content": "okra", "filePath": "/tmp/p4/p4-check.txt"},
        )
    ]
    # The first tool_call (line 6) had rawInput {}: the start waits for the update (line 7).
    assert (
        index(out, lambda e: isinstance(e, ToolStart))
        == index(out, lambda e: isinstance(e, TextComplete)) + 1
    )
    (done,) = [c for c in of(out, ToolComplete) if c.tool_call_id == WRITE_CALL]
    assert (done.name, done.status, done.output, done.error) == (
        "write",
        "ok",
        "Wrote file successfully.",
        None,
    )
    assert done.duration_s == pytest.approx(0.1)  # in_progress (line 10) to completed (line 11)


def test_thinking_then_two_text_messages() -> None:
    out = run(fixture())
    assert of(out, ThinkingDelta) == [
        ThinkingDelta(message_id="msg_2", text="The user wants me"),
        ThinkingDelta(message_id="msg_2", text=" to write a file."),
    ]
    (thinking,) = of(out, ThinkingComplete)
    assert (thinking.message_id, thinking.text, thinking.stopped) == (
        "msg_2",
        "The user wants me to write a file.",
        False,
    )
    assert thinking.duration_s == pytest.approx(0.3)  # first thought (line 1) to first text (4)
    assert [d.message_id for d in of(out, TextDelta)] == ["msg_1", "msg_1", "msg_3"]
    assert of(out, TextComplete) == [
        TextComplete(message_id="msg_1", text="I'll create the file now."),
        TextComplete(message_id="msg_3", text="Created /tmp/p4/p4-check.txt."),
    ]


def test_second_prompt_is_cancelled_with_its_permission_and_tool() -> None:
    out = run(fixture())
    rm_start = [s for s in of(out, ToolStart) if s.tool_call_id == RM_CALL]
    assert rm_start == [
        ToolStart(
            tool_call_id=RM_CALL,
            name="rm /tmp/p4/p4-check.txt",
            input={"command": "rm /tmp/p4/p4-check.txt"},
        )
    ]
    # The permission's toolCall names only the call id: tool and input come from tool_call.
    second = of(out, PermissionRequested)[1]
    assert (second.request_id, second.tool, second.input, second.tool_call_id) == (
        "acp-1",
        "rm /tmp/p4/p4-check.txt",
        {"command": "rm /tmp/p4/p4-check.txt"},
        RM_CALL,
    )
    assert [o.id for o in second.options] == ["once", "reject"]
    assert of(out, PermissionResolved)[1] == PermissionResolved(
        request_id="acp-1", outcome="cancelled"
    )
    (failed,) = [c for c in of(out, ToolComplete) if c.tool_call_id == RM_CALL]
    assert (failed.status, failed.output, failed.error, failed.duration_s) == (
        "error",
        None,
        None,
        None,
    )
    assert of(out, TurnEnd)[1] == TurnEnd(turn_id="acp-prompt-3", finish_reason="cancelled")
    assert out[-1].event == SessionIdle(aborted=True)


def test_usage_update_is_context_window_state_not_token_usage() -> None:
    out = run(fixture())
    assert of(out, SessionContext) == [SessionContext(used=11524, window=200000)]
    assert of(out, Usage) == []  # ACP reports no token counts, only context and cost


def test_plan_becomes_a_readable_session_info_checklist() -> None:
    out = run(fixture())
    assert [i.message for i in of(out, SessionInfo)] == [
        "Plan (0/2 done)\n[>] Write the file\n[ ] Confirm the write",
        "Plan (2/2 done)\n[x] Write the file\n[x] Confirm the write",
    ]


def test_fixture_ordering_invariants() -> None:
    out = run(fixture())
    kinds = [event_type(e.event) for e in out]
    assert kinds.count("stream.session.start") == 1
    assert kinds[0] == "stream.session.start"
    assert kinds[-1] == "stream.session.idle"
    assert all(e.session_id == SESSION for e in out)
    first_seen: dict[tuple[str, str], int] = {}
    for i, e in enumerate(out):
        ev = e.event
        if isinstance(ev, TextDelta | ThinkingDelta):
            part = event_type(ev).rsplit(".", 1)[0]  # stream.text or stream.thinking
            assert (f"{part}.complete", ev.message_id) not in first_seen, "delta after complete"
            first_seen.setdefault((part, ev.message_id), i)
        elif isinstance(ev, TextComplete | ThinkingComplete):
            part = event_type(ev).rsplit(".", 1)[0]
            assert first_seen[(part, ev.message_id)] < i
            first_seen[(event_type(ev), ev.message_id)] = i
        elif isinstance(ev, ToolStart):
            first_seen[("tool", ev.tool_call_id)] = i
        elif isinstance(ev, ToolComplete):
            assert first_seen[("tool", ev.tool_call_id)] < i
        elif isinstance(ev, PermissionRequested):
            first_seen[("permission", ev.request_id)] = i
        elif isinstance(ev, PermissionResolved):
            assert first_seen[("permission", ev.request_id)] < i
        elif isinstance(ev, TurnStart | TurnEnd):
            first_seen[(event_type(ev), str(ev.turn_id))] = i
    # Each turn's content lies between its start and its end, and idle follows the end.
    for turn_id in ("acp-prompt-2", "acp-prompt-3"):
        start = first_seen[("stream.turn.start", turn_id)]
        end = first_seen[("stream.turn.end", turn_id)]
        assert kinds[end + 1] == "stream.session.idle"
        assert "stream.tool.complete" in kinds[start:end]
        assert "stream.permission.resolved" in kinds[start:end]
    # Completes happen once per part and per tool.
    completes = [e.event.message_id for e in out if isinstance(e.event, TextComplete)]
    assert len(completes) == len(set(completes))
    tools = [e.event.tool_call_id for e in out if isinstance(e.event, ToolComplete)]
    assert tools == [WRITE_CALL, RM_CALL]


def test_fixture_translates_without_unknown_or_malformed_events() -> None:
    t = AcpTranslator()
    out = run(fixture(), t)
    stats = t.statistics()
    assert (stats.raw_events, stats.emitted, stats.unknown, stats.malformed) == (23, 26, {}, {})
    assert stats.duplicates == 0
    assert len(out) == 26


def test_feeding_the_same_stream_twice_gives_equal_output() -> None:
    assert run(fixture()) == run(fixture())


def test_sdk_objects_translate_like_wire_dicts() -> None:
    schema = pytest.importorskip("acp.schema")

    def sdk(m: dict[str, Any]) -> Any:
        if "method" in m:
            agent = m["method"] in ("session/update", "session/request_permission")
            if "id" in m:
                return (schema.AgentRequest if agent else schema.ClientRequest).model_validate(m)
            kind = schema.AgentNotification if agent else schema.ClientNotification
            return kind.model_validate(m)
        agent_answer = "stopReason" in m["result"]
        return (schema.AgentResponse if agent_answer else schema.ClientResponse).model_validate(m)

    messages = fixture()
    assert run([sdk(m) for m in messages]) == run(messages)
    # A bare SessionNotification, and a bare update object (the session is then the last seen).
    t = AcpTranslator()
    note = schema.SessionNotification.model_validate(messages[1]["params"])
    first = t.feed(note, 0.0)
    assert [event_type(e.event) for e in first] == ["stream.session.start", "stream.thinking.delta"]
    (again,) = t.feed(note.update, 0.1)
    assert again == Emitted(ThinkingDelta(message_id="msg_2", text="The user wants me"), SESSION)


# -- JSON-RPC bookkeeping ------------------------------------------------------------


def test_responses_match_requests_of_the_other_side_even_when_ids_collide() -> None:
    # The client's prompt and the agent's permission request both use id 0.
    out = run(
        [
            prompt(0),
            update("tool_call", toolCallId="c1", title="bash", rawInput={"command": "ls"}),
            permission(0, "c1"),
            selected(0, "yes"),
            update("tool_call_update", toolCallId="c1", status="completed", rawOutput="a\n"),
            answer(0, stopReason="end_turn"),
        ]
    )
    assert of(out, PermissionResolved) == [
        PermissionResolved(request_id="acp-0", outcome="allowed", option_id="yes")
    ]
    assert of(out, TurnEnd) == [TurnEnd(turn_id="acp-prompt-0", finish_reason="end_turn")]
    assert of(out, ToolComplete)[0].output == "a\n"


def test_an_error_answer_with_a_colliding_id_goes_to_the_latest_request() -> None:
    error = {"jsonrpc": "2.0", "id": 0, "error": {"code": -32603, "message": "no UI"}}
    out = run(
        [prompt(0), permission(0, "c1", title="bash"), error, answer(0, stopReason="end_turn")]
    )
    assert of(out, PermissionResolved) == [
        PermissionResolved(request_id="acp-0", outcome="cancelled", reason="no UI")
    ]
    assert of(out, TurnEnd) == [TurnEnd(turn_id="acp-prompt-0", finish_reason="end_turn")]
    assert of(out, SessionError) == []  # a refused permission is routine, not a session error


def test_repeated_requests_and_answers_are_dropped_as_duplicates() -> None:
    t = AcpTranslator()
    out = run(
        [prompt(1), prompt(1), answer(1, stopReason="end_turn"), answer(1, stopReason="end_turn")],
        t,
    )
    assert len(of(out, TurnStart)) == 1
    assert len(of(out, TurnEnd)) == 1
    assert len(of(out, SessionIdle)) == 1
    assert t.statistics().duplicates == 2


def test_an_answer_to_a_prompt_sent_before_we_listened_still_ends_the_turn() -> None:
    out = run([chunk("late", "m1"), answer(9, stopReason="max_turn_requests")])
    assert of(out, TextComplete) == [TextComplete(message_id="m1", text="late")]
    assert of(out, TurnEnd) == [TurnEnd(turn_id=None, finish_reason="max_turn_requests")]
    assert of(out, SessionIdle) == [SessionIdle()]


def test_a_failed_prompt_ends_the_turn_with_an_error_then_idle() -> None:
    error = {"jsonrpc": "2.0", "id": 4, "error": {"code": -32603, "message": "model overloaded"}}
    out = run([prompt(4), chunk("Let me", "m1"), error])
    assert [event_type(e.event) for e in out][-5:] == [
        "stream.text.delta",
        "stream.text.complete",
        "stream.turn.end",
        "stream.session.error",
        "stream.session.idle",
    ]
    assert of(out, TextComplete) == [TextComplete(message_id="m1", text="Let me", stopped=True)]
    assert of(out, TurnEnd) == [TurnEnd(turn_id="acp-prompt-4", finish_reason="error")]
    assert of(out, SessionError) == [SessionError(message="model overloaded", code="-32603")]
    assert of(out, SessionIdle) == [SessionIdle(aborted=False)]


def test_session_new_answer_starts_the_session_with_cwd_and_model() -> None:
    new = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "session/new",
        "params": {"cwd": "/src", "mcpServers": []},
    }
    created = answer(1, sessionId="s9", models={"currentModelId": "sonnet", "availableModels": []})
    out = run([new, created])
    assert out == [
        Emitted(SessionStart(model="sonnet", cwd="/src"), "s9"),
        Emitted(SessionIdle(), "s9"),  # the stream ended with the session waiting for input
    ]


def test_each_session_on_one_connection_keeps_its_own_turn() -> None:
    out = run(
        [
            prompt(1, "a"),
            prompt(2, "b"),
            update(
                "agent_message_chunk", "a", messageId="m", content={"type": "text", "text": "A"}
            ),
            update(
                "agent_message_chunk", "b", messageId="m", content={"type": "text", "text": "B"}
            ),
            answer(2, stopReason="end_turn"),
            answer(1, stopReason="cancelled"),
        ]
    )
    texts = [(e.session_id, e.event) for e in out if isinstance(e.event, TextComplete)]
    assert texts == [
        ("b", TextComplete(message_id="m", text="B")),
        ("a", TextComplete(message_id="m", text="A", stopped=True)),
    ]
    idles = [(e.session_id, e.event) for e in out if isinstance(e.event, SessionIdle)]
    assert idles == [("b", SessionIdle()), ("a", SessionIdle(aborted=True))]


# -- permissions ---------------------------------------------------------------------


def test_choosing_a_reject_option_resolves_denied() -> None:
    out = run(
        [prompt(1), permission(5, "c1", title="rm", rawInput={"path": "x"}), selected(5, "no")]
    )
    assert of(out, PermissionResolved) == [
        PermissionResolved(request_id="acp-5", outcome="denied", option_id="no")
    ]
    # The permission carried the tool's input: the tool starts with it.
    assert of(out, ToolStart) == [ToolStart(tool_call_id="c1", name="rm", input={"path": "x"})]


def test_a_tool_is_named_by_its_raw_name_when_the_agent_gives_one() -> None:
    """claude-agent-acp titles tools ``Write hello.txt`` (issue 17, bug 8).

    Its raw name (``name``, and ``_meta.claudeCode.toolName``) names the
    tool, so rules and ``--allow Write`` match it and tool metrics add up per
    tool; the title stays the request's title, and the ACP kind its
    category. An agent without a raw name keeps the title as the name.
    """
    meta = {"claudeCode": {"toolName": "Write"}}
    diff = [{"type": "diff", "path": "/p/hello.txt", "oldText": None, "newText": "hello\n"}]
    raw_input = {"file_path": "/p/hello.txt", "content": "hello\n"}
    out = run(
        [
            prompt(1),
            update(
                "tool_call",
                toolCallId="c1",
                name="Write",
                title="Preparing file…",
                kind="edit",
                rawInput={},
                status="pending",
                _meta=meta,
            ),
            update(
                "tool_call_update",
                toolCallId="c1",
                title="Write hello.txt",
                rawInput=raw_input,
                content=diff,
                _meta=meta,
            ),
            permission(
                0, "c1", name="Write", title="Write hello.txt", kind="edit", rawInput=raw_input
            ),
            selected(0, "yes"),
            update(
                "tool_call_update",
                toolCallId="c1",
                status="completed",
                rawOutput="done",
                _meta=meta,
            ),
            prompt(2),
            permission(3, "c2", title="write", kind="edit", rawInput={"path": "x"}),
            selected(3, "no"),
        ]
    )
    first, second = of(out, PermissionRequested)
    assert (first.tool, first.title, first.category) == ("Write", "Write hello.txt", "edit")
    assert (second.tool, second.title, second.category) == ("write", None, "edit")
    assert [(t.tool_call_id, t.name) for t in of(out, ToolStart)] == [
        ("c1", "Write"),
        ("c2", "write"),
    ]
    assert of(out, ToolComplete)[0].name == "Write"
    assert PermissionRule(action="allow", tool="Write").matches(first)
    assert PermissionRule(action="deny", category="edit").matches(first)
    assert ToolRules(allow=("Write",)).decide(first.tool).allowed


def test_a_permission_asks_with_the_input_it_will_run_not_the_earlier_call_s() -> None:
    """opencode acp: its ``tool_call`` says only the cwd, its request the command."""
    started = update(
        "tool_call", toolCallId="c1", title="bash", kind="execute", rawInput={"cwd": "/p"}
    )
    asked = permission(2, "c1", title="echo hello", kind="execute", rawInput={"command": "echo"})
    out = run([prompt(1), started, asked])
    [tool] = of(out, ToolStart)
    [request] = of(out, PermissionRequested)
    assert (tool.name, tool.input) == ("bash", {"cwd": "/p"})
    assert (request.tool, request.input, request.category) == (
        "bash",
        {"command": "echo"},
        "execute",
    )


def test_a_permission_unanswered_when_its_turn_ends_is_cancelled_and_its_late_answer_ignored() -> (
    None
):
    t = AcpTranslator()
    out = run(
        [
            prompt(1),
            permission(7, "c1", title="rm"),
            answer(1, stopReason="end_turn"),
            selected(7, "yes"),
        ],
        t,
    )
    assert of(out, PermissionResolved) == [
        PermissionResolved(request_id="acp-7", outcome="cancelled", reason="the turn ended")
    ]
    resolved = index(out, lambda e: isinstance(e, PermissionResolved))
    assert resolved < index(out, lambda e: isinstance(e, TurnEnd))
    assert t.statistics().unknown == {}


# -- text and thinking parts -----------------------------------------------------------


def test_chunks_without_message_ids_are_split_at_tool_calls_and_kind_changes() -> None:
    out = run(
        [
            prompt(1),
            chunk("hm", kind="agent_thought_chunk"),
            chunk("one "),
            chunk("two"),
            update("tool_call", toolCallId="c1", title="ls", status="in_progress"),
            chunk("three"),
            answer(1, stopReason="end_turn"),
        ]
    )
    assert [(c.message_id, c.text) for c in of(out, ThinkingComplete)] == [
        ("acp-prompt-1:thinking:1", "hm")
    ]
    assert of(out, TextComplete) == [
        TextComplete(message_id="acp-prompt-1:text:2", text="one two"),
        TextComplete(message_id="acp-prompt-1:text:3", text="three"),
    ]


def test_a_message_id_that_resumes_after_its_part_ended_gets_a_new_part_id() -> None:
    out = run(
        [
            prompt(1),
            chunk("a", "m1"),
            chunk("think", "m1", kind="agent_thought_chunk"),
            chunk("b", "m1"),
            answer(1, stopReason="end_turn"),
        ]
    )
    assert of(out, TextComplete) == [
        TextComplete(message_id="m1", text="a"),
        TextComplete(message_id="m1:1", text="b"),
    ]
    assert [c.message_id for c in of(out, ThinkingComplete)] == ["m1"]


def test_end_of_stream_mid_turn_stops_the_open_part_and_says_no_idle() -> None:
    out = run([prompt(1), chunk("half", "m1")])
    assert out[-1] == Emitted(TextComplete(message_id="m1", text="half", stopped=True), "s1")
    assert of(out, SessionIdle) == []


def test_non_text_content_is_skipped_silently() -> None:
    t = AcpTranslator()
    image = {"type": "image", "mimeType": "image/png", "data": "AA=="}
    out = run([prompt(1), update("agent_message_chunk", messageId="m", content=image)], t)
    assert of(out, TextDelta) == []
    assert (t.statistics().unknown, t.statistics().malformed) == ({}, {})


# -- tools -------------------------------------------------------------------------------


def test_tool_progress_becomes_partial_results_then_the_final_output() -> None:
    def text(s: str) -> list[dict[str, Any]]:
        return [{"type": "content", "content": {"type": "text", "text": s}}]

    out = run(
        [
            prompt(1),
            update("tool_call", toolCallId="c1", title="make", kind="execute", status="pending"),
            update("tool_call_update", toolCallId="c1", status="in_progress", content=text("a")),
            update("tool_call_update", toolCallId="c1", content=text("a")),  # unchanged: no event
            update("tool_call_update", toolCallId="c1", content=text("a\nb")),
            update(
                "tool_call_update", toolCallId="c1", status="completed", content=text("a\nb\nok")
            ),
            update("tool_call_update", toolCallId="c1", status="completed"),  # repeated end
            answer(1, stopReason="end_turn"),
        ]
    )
    assert of(out, ToolStart) == [ToolStart(tool_call_id="c1", name="make")]
    assert of(out, ToolPartialResult) == [
        ToolPartialResult(tool_call_id="c1", output="a"),
        ToolPartialResult(tool_call_id="c1", output="a\nb"),
    ]
    (done,) = of(out, ToolComplete)
    assert (done.status, done.output) == ("ok", "a\nb\nok")
    assert done.duration_s == pytest.approx(0.3)


def test_a_diff_only_result_is_summarized_by_path() -> None:
    diff = [{"type": "diff", "path": "/a.py", "oldText": "x", "newText": "y"}]
    out = run(
        [
            prompt(1),
            update("tool_call", toolCallId="c1", title="edit", rawInput={"path": "/a.py"}),
            update("tool_call_update", toolCallId="c1", status="completed", content=diff),
        ]
    )
    assert of(out, ToolComplete)[0].output == "Edited /a.py"


def test_a_tool_still_open_when_the_turn_ends_is_cancelled() -> None:
    out = run(
        [
            prompt(1),
            update("tool_call", toolCallId="c1", title="sleep", status="in_progress"),
            update("tool_call", toolCallId="c2", title="never", status="pending"),
            answer(1, stopReason="cancelled"),
        ]
    )
    assert of(out, ToolStart) == [ToolStart(tool_call_id="c1", name="sleep")]
    assert [(c.tool_call_id, c.status) for c in of(out, ToolComplete)] == [("c1", "cancelled")]


# -- usage ---------------------------------------------------------------------------------


def test_prompt_response_usage_adds_up_per_turn_and_carries_the_session_cost() -> None:
    turn1 = {"inputTokens": 100, "outputTokens": 20, "thoughtTokens": 5, "totalTokens": 120}
    turn2 = {"inputTokens": 50, "outputTokens": 7, "cachedReadTokens": 900, "totalTokens": 957}
    cost = {"used": 1200, "size": 200000, "cost": {"amount": 0.5, "currency": "USD"}}
    out = run(
        [
            prompt(1),
            answer(1, stopReason="end_turn", usage=turn1),
            prompt(2),
            update("usage_update", **cost),
            answer(2, stopReason="end_turn", usage=turn2),
        ]
    )
    assert of(out, Usage) == [
        Usage(tokens=TokenUsage(input_tokens=100, output_tokens=20, reasoning_tokens=5)),
        Usage(  # the cost arrived: the totals are reported again with it
            tokens=TokenUsage(input_tokens=100, output_tokens=20, reasoning_tokens=5, cost_usd=0.5)
        ),
        Usage(
            tokens=TokenUsage(
                input_tokens=150,
                output_tokens=27,
                reasoning_tokens=5,
                cache_read_tokens=900,
                cost_usd=0.5,
            )
        ),
    ]


def test_a_cost_in_another_currency_stays_unknown() -> None:
    eur = {"used": 10, "size": 100, "cost": {"amount": 1.0, "currency": "EUR"}}
    usage = {"inputTokens": 1, "outputTokens": 1, "totalTokens": 2}
    out = run(
        [prompt(1), update("usage_update", **eur), answer(1, stopReason="end_turn", usage=usage)]
    )
    assert [u.tokens.cost_usd for u in of(out, Usage)] == [None]


# -- other updates ---------------------------------------------------------------------------


def test_mode_title_and_command_updates() -> None:
    t = AcpTranslator()
    out = run(
        [
            update("current_mode_update", currentModeId="architect"),
            update("session_info_update", title="Fix the build"),
            update("available_commands_update", availableCommands=[]),
            update("plan_update", plan={"type": "markdown", "planId": "p", "content": "# Do it"}),
            update("plan_removed", planId="p"),
        ],
        t,
    )
    assert [e.event for e in out] == [
        SessionStart(),
        SessionInfo(message="Mode: architect"),
        SessionTitleChanged(title="Fix the build"),
        SessionInfo(message="# Do it"),
        SessionInfo(message="Plan removed"),
        SessionIdle(),
    ]
    assert t.statistics().unknown == {}


# -- registration ------------------------------------------------------------------------------


def test_the_adapter_is_registered_as_acp() -> None:
    (entry,) = importlib.metadata.entry_points(group="busd", name="acp")
    assert entry.load() is busd_acp
    manager = PluginManager(environ={"BUSD_DISABLE_PLUGIN_AUTOLOAD": "1"})
    manager.register(busd_acp, "acp")
    adapter = manager.adapters()["acp"]
    assert isinstance(adapter, AcpAdapter)
    translator = adapter.translator(session_id="fallback")
    assert isinstance(translator, AcpTranslator)
    (start,) = translator.feed(update("plan", "", entries=[]), 0.0)[:1]
    assert start == Emitted(SessionStart(), "fallback")
