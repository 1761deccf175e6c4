"""The copilot adapter against the shared Copilot SDK fixture, and against what breaks it."""

from __future__ import annotations

import copy
import dataclasses
import enum
import importlib.metadata
import json
import re
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any
from uuid import UUID

import msgspec
import pytest
from busd_copilot import CopilotAdapter, CopilotTranslator, busd_adapters
from hypothesis import HealthCheck, given, settings
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
    SessionContext,
    SessionError,
    SessionIdle,
    SessionStart,
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

FIXTURE = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "sdk" / "copilot.jsonl"
SESSION = "4db6a695-04ee-466f-b26b-74dae52ad74c"


def lines() -> list[dict[str, Any]]:
    with FIXTURE.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def run(raws: Iterable[object], *, finish_at: float | None = None) -> list[Emitted]:
    """Feed ``raws`` at now = index * 0.1, then finish."""
    translator = CopilotTranslator(session_id="given")
    out: list[Emitted] = []
    n = 0
    for n, raw in enumerate(raws):
        out += translator.feed(raw, n * 0.1)
    out += translator.finish((n + 1) * 0.1 if finish_at is None else finish_at)
    return out


def events(out: Sequence[Emitted]) -> list[Event]:
    return [e.event for e in out]


def of(out: Sequence[Emitted], cls: type[Any]) -> list[Any]:
    return [e.event for e in out if type(e.event) is cls]


def ev(kind: str, data: dict[str, Any] | None = None, **top: Any) -> dict[str, Any]:
    return {"type": kind, "data": data or {}, **top}


def assert_well_ordered(out: Sequence[Emitted]) -> None:
    """The ordering every UI relies on."""
    evs = events(out)
    starts = [i for i, e in enumerate(evs) if type(e) is SessionStart]
    assert starts == [0]
    last_delta: dict[tuple[type[Event], str], int] = {}
    completes: dict[tuple[type[Event], str], int] = {}
    tool_starts: dict[str, int] = {}
    open_turn: str | None = None
    for i, e in enumerate(evs):
        if isinstance(e, TextDelta | ThinkingDelta):
            key: tuple[type[Event], str] = (type(e), e.message_id)
            assert key not in completes, f"delta after its complete: {e}"
            last_delta[key] = i
        elif isinstance(e, TextComplete | ThinkingComplete):
            delta_type = TextDelta if isinstance(e, TextComplete) else ThinkingDelta
            key = (delta_type, e.message_id)
            assert key not in completes, f"completed twice: {e}"
            completes[key] = i
        elif isinstance(e, ToolStart):
            assert e.tool_call_id not in tool_starts
            tool_starts[e.tool_call_id] = i
        elif isinstance(e, ToolComplete):
            assert e.tool_call_id in tool_starts
        elif isinstance(e, TurnStart):
            assert open_turn is None
            open_turn = e.turn_id
        elif isinstance(e, TurnEnd):
            assert e.turn_id == open_turn
            open_turn = None
        if isinstance(e, TextDelta | ThinkingDelta | TextComplete | ThinkingComplete):
            assert open_turn is not None, f"content outside a model call: {e}"
    assert set(last_delta) <= set(completes), "a part that streamed never completed"
    assert open_turn is None
    assert type(evs[-1]) is SessionIdle


# -- the shared fixture ------------------------------------------------------------


def test_fixture_translates_to_the_expected_event_sequence() -> None:
    assert [event_type(e) for e in events(run(lines()))] == [
        "stream.session.start",
        "stream.turn.start",
        "stream.session.context",
        "stream.thinking.delta",
        "stream.thinking.delta",
        "stream.text.delta",
        "stream.text.delta",
        "stream.thinking.complete",
        "stream.text.complete",
        "stream.tool.start",
        "stream.usage",
        "stream.turn.end",
        "stream.permission.requested",
        "stream.permission.resolved",
        "stream.tool.partial_result",
        "stream.tool.complete",
        "stream.turn.start",
        "stream.text.delta",
        "stream.text.complete",
        "stream.usage",
        "stream.turn.end",
        "stream.session.idle",
    ]


def test_fixture_is_well_ordered_and_all_in_the_sdk_session() -> None:
    out = run(lines())
    assert_well_ordered(out)
    assert {e.session_id for e in out} == {SESSION}
    assert {(e.agent_id, e.parent_tool_call_id) for e in out} == {(None, None)}


def test_fixture_session_start_has_model_and_cwd() -> None:
    (start,) = of(run(lines()), SessionStart)
    assert start == SessionStart(model="claude-sonnet-4.5", cwd="/home/u/proj")


def test_usage_is_added_per_model_call_and_cost_stays_unknown() -> None:
    usages = of(run(lines()), Usage)
    assert [u.tokens.output_tokens for u in usages] == [98, 110]
    assert usages[-1] == Usage(
        tokens=TokenUsage(
            input_tokens=(24939 - 21263) + (25120 - 24901),
            output_tokens=110,
            reasoning_tokens=31,
            cache_read_tokens=21263 + 24901,
            cache_write_tokens=0,
            cost_usd=None,
        ),
        model="claude-sonnet-4.5",
    )


def test_usage_info_is_context_window_state_not_usage() -> None:
    out = run(lines())
    assert of(out, SessionContext) == [SessionContext(used=18234, window=200000)]
    assert all(u.tokens.input_tokens != 18234 for u in of(out, Usage))


def test_each_model_call_is_a_turn_with_its_finish_reason() -> None:
    out = run(lines())
    assert of(out, TurnStart) == [TurnStart(turn_id="0"), TurnStart(turn_id="0.1")]
    assert of(out, TurnEnd) == [
        TurnEnd(turn_id="0", finish_reason="tool_use"),
        TurnEnd(turn_id="0.1", finish_reason="end_turn"),
    ]


def test_thinking_is_timed_by_the_sdk_timestamps() -> None:
    out = run(lines())
    deltas = of(out, ThinkingDelta)
    (complete,) = of(out, ThinkingComplete)
    assert "".join(d.text for d in deltas) == complete.text == "I should grep for login in src/."
    # first reasoning delta 17:00:03.100, assistant.reasoning 17:00:03.900
    assert complete == ThinkingComplete(message_id="rs_01", text=complete.text, duration_s=0.8)


def test_thinking_is_timed_by_the_feed_clock_without_timestamps() -> None:
    raws = lines()
    for raw in raws:
        del raw["timestamp"]
    (complete,) = of(run(raws), ThinkingComplete)
    # first delta on line 4 (now 0.4), assistant.reasoning on line 9 (now 0.9)
    assert complete.duration_s == pytest.approx(0.5)


def test_text_parts_complete_once_with_their_deltas() -> None:
    out = run(lines())
    assert of(out, TextComplete) == [
        TextComplete(message_id="m1", text="Searching the source tree."),
        TextComplete(message_id="m2", text="Login is in src/auth.ts:42."),
    ]
    for complete in of(out, TextComplete):
        deltas = [d.text for d in of(out, TextDelta) if d.message_id == complete.message_id]
        assert "".join(deltas) == complete.text


def test_tool_starts_with_parsed_input_and_completes_ok() -> None:
    out = run(lines())
    command = {"command": "grep -rn login src/", "description": "Find login code"}
    assert of(out, ToolStart) == [ToolStart(tool_call_id="toolu_1", name="bash", input=command)]
    assert of(out, ToolPartialResult) == [
        ToolPartialResult(
            tool_call_id="toolu_1", output="src/auth.ts:42: export function login() {\n"
        )
    ]
    assert of(out, ToolComplete) == [
        ToolComplete(
            tool_call_id="toolu_1",
            name="bash",
            status="ok",
            output="src/auth.ts:42: export function login() {\n<exited with exit code 0>",
            duration_s=0.23,  # execution_start 05.220 to execution_complete 05.450
        )
    ]


def test_permission_is_requested_for_the_tool_and_resolved_allowed() -> None:
    out = run(lines())
    (requested,) = of(out, PermissionRequested)
    assert requested.request_id == "perm-7f3a"
    assert requested.tool == "bash"
    assert requested.tool_call_id == "toolu_1"
    assert requested.input == {"command": "grep -rn login src/", "description": "Find login code"}
    assert requested.title == "Find login code"
    assert requested.category == "shell"
    assert requested.annotations["commands"] == [{"identifier": "grep", "readOnly": True}]
    assert requested.options == [
        PermissionOption(id="approve-once", label="Allow once", kind="allow_once"),
        PermissionOption(
            id="approve-for-session", label="Allow for this session", kind="allow_always"
        ),
        PermissionOption(id="reject", label="Deny", kind="reject_once"),
    ]
    assert of(out, PermissionResolved) == [
        PermissionResolved(request_id="perm-7f3a", outcome="allowed", option_id="approve-once")
    ]


def test_final_idle_is_last_and_finish_adds_nothing() -> None:
    translator = CopilotTranslator()
    out: list[Emitted] = []
    for n, raw in enumerate(lines()):
        out += translator.feed(raw, n * 0.1)
    assert out[-1].event == SessionIdle(aborted=False)
    assert translator.finish(9.0) == []
    stats = translator.statistics()
    assert (stats.raw_events, stats.emitted, stats.duplicates) == (22, 22, 0)
    assert stats.unknown == {}
    assert stats.malformed == {}


def test_events_seen_twice_are_dropped() -> None:
    doubled = [copy.deepcopy(raw) for raw in lines() for _ in range(2)]
    translator = CopilotTranslator()
    out: list[Emitted] = []
    for n, raw in enumerate(doubled):
        out += translator.feed(raw, (n // 2) * 0.1)
    out += translator.finish(9.0)
    assert out == run(lines())
    assert translator.statistics().duplicates == 22


def test_translation_is_deterministic() -> None:
    assert run(lines()) == run(lines())


def test_repeated_usage_report_of_one_api_call_counts_once() -> None:
    raws = lines()
    again = copy.deepcopy(raws[11])  # the first assistant.usage, apiCallId msg_01AbCdEf
    again["id"] = "another-event-id"
    raws.insert(12, again)
    assert of(run(raws), Usage)[-1].tokens.output_tokens == 110


# -- SDK objects and field spellings -----------------------------------------------

_UPPER = re.compile(r"(?<!^)(?=[A-Z])")


def _snake_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {_UPPER.sub("_", k).lower(): _snake_keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_snake_keys(v) for v in value]
    return value


class _Kind(enum.Enum):
    pass


@dataclasses.dataclass
class _SdkLikeEvent:
    """Shaped like the Python SDK's dataclasses: snake_case, enum type, UUID id, datetime."""

    data: dict[str, Any]
    id: UUID
    timestamp: datetime
    type: enum.Enum
    agent_id: str | None = None
    ephemeral: bool | None = None


def test_sdk_shaped_objects_read_like_wire_json() -> None:
    raws = lines()
    kinds = enum.Enum("Kinds", {f"K{i}": raw["type"] for i, raw in enumerate(raws)})  # type: ignore[misc]
    objects = [
        _SdkLikeEvent(
            data=_snake_keys(raw["data"]),
            id=UUID(raw["id"]),
            timestamp=datetime.fromisoformat(raw["timestamp"]),
            type=kinds(raw["type"]),
        )
        for raw in raws
    ]
    wire = run(lines())
    sdk = run(objects)
    requested = of(sdk, PermissionRequested)[0]
    assert requested.annotations["full_command_text"] == "grep -rn login src/"
    # Same translation; only the annotations keep the SDK's own key spelling.
    strip = [e for e in wire if type(e.event) is not PermissionRequested]
    assert [e for e in sdk if type(e.event) is not PermissionRequested] == strip


def test_real_sdk_session_events_translate_like_wire_json() -> None:
    session_events = pytest.importorskip("copilot.generated.session_events")
    objects = [session_events.SessionEvent.from_dict(raw) for raw in lines()]
    assert run(objects) == run(lines())


# -- what the stream implies ---------------------------------------------------------


def test_stream_cut_mid_message_completes_parts_stopped_and_goes_idle() -> None:
    out = run(lines()[:9], finish_at=5.0)  # up to the second text delta of m1
    tail = events(out)[-4:]
    assert tail == [
        ThinkingComplete(
            message_id="rs_01",
            text="I should grep for login in src/.",
            duration_s=5.0 - 0.4,
            stopped=True,
        ),
        TextComplete(message_id="m1", text="Searching the source tree.", stopped=True),
        TurnEnd(turn_id="0", finish_reason="cancelled"),
        SessionIdle(aborted=False),
    ]
    assert_well_ordered(out)


def test_stream_ending_without_idle_gets_one() -> None:
    out = run(lines()[:-1])
    assert events(out)[-1] == SessionIdle(aborted=False)
    assert len(of(out, SessionIdle)) == 1


def test_tool_and_permission_open_at_the_end_are_cancelled() -> None:
    out = run(lines()[:13])  # permission asked, never answered, tool never ran
    assert of(out, PermissionResolved) == [
        PermissionResolved(request_id="perm-7f3a", outcome="cancelled")
    ]
    assert of(out, ToolComplete) == [
        ToolComplete(tool_call_id="toolu_1", name="bash", status="cancelled")
    ]
    assert_well_ordered(out)


def test_abort_stops_the_open_message_and_cancels_the_call() -> None:
    raws = [
        *lines()[:3],
        ev("assistant.message_delta", {"messageId": "m9", "deltaContent": "Let me"}, id="x1"),
        ev("abort", {"reason": "user_initiated"}, id="x2"),
        ev("session.idle", {"aborted": True}, id="x3"),
    ]
    out = run(raws)
    assert events(out)[-3:] == [
        TextComplete(message_id="m9", text="Let me", stopped=True),
        TurnEnd(turn_id="0", finish_reason="cancelled"),
        SessionIdle(aborted=True),
    ]
    assert_well_ordered(out)


def test_tool_failing_after_abort_is_cancelled() -> None:
    raws = [
        *lines()[:11],
        ev("abort", {"reason": "user_initiated"}),
        ev("tool.execution_complete", {"toolCallId": "toolu_1", "success": False}),
        ev("session.idle"),
    ]
    out = run(raws)
    assert of(out, ToolComplete)[0].status == "cancelled"
    assert events(out)[-1] == SessionIdle(aborted=True)


def test_error_ending_the_stream_gets_no_made_up_idle() -> None:
    raws = [
        *lines()[:9],
        ev("session.error", {"errorType": "rate_limit", "message": "slow down", "statusCode": 429}),
    ]
    out = run(raws)
    assert events(out)[-4:] == [
        ThinkingComplete(
            message_id="rs_01",
            text="I should grep for login in src/.",
            duration_s=0.5,
            stopped=True,
        ),
        TextComplete(message_id="m1", text="Searching the source tree.", stopped=True),
        TurnEnd(turn_id="0", finish_reason="error"),
        SessionError(message="slow down", code="rate_limit", retryable=True),
    ]
    assert of(out, SessionIdle) == []


@pytest.mark.parametrize(
    ("said", "finish"),
    [
        ("stop", "end_turn"),
        ("tool_calls", "tool_use"),
        ("length", "max_tokens"),
        ("content_filter", "refusal"),
        ("something_new", "something_new"),
    ],
)
def test_finish_reasons_are_normalized(said: str, finish: str) -> None:
    raws = [
        ev("assistant.turn_start", {"turnId": "7"}),
        ev("assistant.message_delta", {"messageId": "m", "deltaContent": "hi"}),
        ev("assistant.usage", {"model": "gpt-5", "outputTokens": 3, "finishReason": said}),
    ]
    assert of(run(raws), TurnEnd) == [TurnEnd(turn_id="7", finish_reason=finish)]


# -- permissions --------------------------------------------------------------------

_ASK = ev(
    "permission.requested",
    {
        "requestId": "p1",
        "permissionRequest": {
            "kind": "mcp",
            "serverName": "github",
            "toolName": "create_issue",
            "toolTitle": "Create issue",
            "args": {"title": "bug"},
            "readOnly": False,
        },
    },
)


@pytest.mark.parametrize(
    ("result", "outcome", "option", "reason"),
    [
        ({"kind": "approved-for-session", "approval": {}}, "allowed", "approve-for-session", None),
        ({"kind": "approve-once"}, "allowed", "approve-once", None),
        ({"kind": "denied-interactively-by-user", "feedback": "no"}, "denied", "reject", "no"),
        ({"kind": "reject"}, "denied", "reject", None),
        ({"kind": "denied-by-rules", "rules": []}, "denied", None, "denied-by-rules"),
        ({"kind": "cancelled", "reason": "aborted"}, "cancelled", None, "aborted"),
    ],
)
def test_permission_results_map_to_outcomes(
    result: dict[str, Any], outcome: str, option: str | None, reason: str | None
) -> None:
    done = ev("permission.completed", {"requestId": "p1", "result": result})
    assert of(run([_ASK, done]), PermissionResolved) == [
        PermissionResolved(request_id="p1", outcome=outcome, option_id=option, reason=reason)  # type: ignore[arg-type]
    ]


def test_permission_for_an_unseen_tool_names_it_from_the_request() -> None:
    (requested,) = of(run([_ASK]), PermissionRequested)
    assert (requested.tool, requested.input, requested.title, requested.category) == (
        "create_issue",
        {"title": "bug"},
        "Create issue",
        "mcp",
    )


# -- tools and sub-agents -----------------------------------------------------------


def test_failed_tool_reports_its_error_and_string_arguments_are_parsed() -> None:
    raws = [
        ev(
            "tool.execution_start",
            {"toolCallId": "t1", "toolName": "view", "arguments": '{"path": "/nope"}'},
        ),
        ev(
            "tool.execution_complete",
            {"toolCallId": "t1", "success": False, "error": {"message": "no such file"}},
        ),
    ]
    out = run(raws)
    assert of(out, ToolStart) == [
        ToolStart(tool_call_id="t1", name="view", input={"path": "/nope"})
    ]
    (complete,) = of(out, ToolComplete)
    assert (complete.status, complete.error, complete.name) == ("error", "no such file", "view")


def test_shell_output_chunks_accumulate_into_output_so_far() -> None:
    raws = [
        ev("tool.execution_start", {"toolCallId": "t1", "toolName": "bash"}),
        ev("tool.execution_progress", {"toolCallId": "t1", "progressMessage": "running"}),
        ev("tool.shell_output", {"toolCallId": "t1", "text": "a\n", "sequence": 0}),
        ev("tool.shell_output", {"toolCallId": "t1", "text": "b\n", "sequence": 1}),
        ev("tool.execution_progress", {"toolCallId": "t1", "progressMessage": "still running"}),
    ]
    assert [p.output for p in of(run(raws), ToolPartialResult)] == ["running", "a\n", "a\nb\n"]


def test_sub_agent_events_carry_their_agent_and_own_usage() -> None:
    raws = [
        *lines()[:3],
        ev(
            "assistant.message",
            {
                "messageId": "m1",
                "content": "",
                "toolRequests": [{"toolCallId": "task1", "name": "task", "arguments": {}}],
            },
        ),
        ev("tool.execution_start", {"toolCallId": "task1", "toolName": "task"}),
        ev(
            "subagent.started",
            {
                "toolCallId": "task1",
                "agentName": "explore",
                "agentDisplayName": "Explore",
                "agentDescription": "Looks around",
            },
        ),
        ev(
            "assistant.message_delta", {"messageId": "s1", "deltaContent": "found"}, agentId="task1"
        ),
        ev("assistant.message", {"messageId": "s1", "content": "found"}, agentId="task1"),
        ev("assistant.usage", {"model": "m", "outputTokens": 5}, agentId="task1"),
        ev("subagent.completed", {"toolCallId": "task1", "agentName": "explore"}),
        ev("tool.execution_complete", {"toolCallId": "task1", "success": True}),
        ev("session.idle"),
    ]
    out = run(raws)
    by_type = {type(e.event): e for e in out}
    assert by_type[AgentStart].event == AgentStart(
        agent_id="task1", name="explore", description="Looks around", tool_call_id="task1"
    )
    assert by_type[AgentStart].agent_id is None
    assert by_type[AgentComplete].event == AgentComplete(agent_id="task1", status="ok")
    sub = [e for e in out if e.agent_id == "task1"]
    assert [type(e.event) for e in sub] == [TurnStart, TextDelta, TextComplete, Usage, TurnEnd]
    assert sub[3].event == Usage(tokens=TokenUsage(output_tokens=5), model="m")
    assert of(out, ToolStart)[0].input == {}


# -- robustness -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "table", "kind"),
    [
        ({"data": {}}, "malformed", "<no type>"),
        ({"type": 7}, "malformed", "<no type>"),
        ({"type": "assistant.message_delta", "data": "oops"}, "malformed", None),
        (ev("assistant.message_delta", {"messageId": 1}), "malformed", None),
        (ev("session.usage_info", {"currentTokens": -1}), "malformed", None),
        (ev("permission.completed", {"requestId": "p", "result": {}}), "malformed", None),
        (
            ev("tool.execution_progress", {"toolCallId": "t", "progressMessage": "x"}),
            "malformed",
            None,
        ),
        (ev("assistant.fancy_new_thing"), "unknown", None),
        ("not an event", "malformed", "str"),
    ],
)
def test_broken_events_are_counted_not_raised(raw: object, table: str, kind: str | None) -> None:
    translator = CopilotTranslator()
    if isinstance(raw, dict):
        assert translator.translate(raw, 0.0) == []  # handled in place, not by feed's guard
    else:
        assert translator.feed(raw, 0.0) == []
    expected = kind or raw["type"]  # type: ignore[index]
    assert getattr(translator.statistics(), table) == {expected: 1}


def test_known_kinds_without_catalog_meaning_are_not_unknown() -> None:
    translator = CopilotTranslator()
    for kind in ("assistant.intent", "session.shutdown", "hook.start", "assistant.idle"):
        assert translator.feed(ev(kind, {"x": 1}), 0.0) == []
    assert translator.statistics().unknown == {}


_FIELDS = [
    "sessionId", "selectedModel", "context", "cwd", "turnId", "reasoningId", "messageId",
    "deltaContent", "content", "toolRequests", "toolCallId", "name", "arguments", "toolName",
    "model", "inputTokens", "outputTokens", "reasoningTokens", "cacheReadTokens", "apiCallId",
    "finishReason", "tokenLimit", "currentTokens", "requestId", "permissionRequest", "kind",
    "result", "success", "error", "message", "partialOutput", "text", "progressMessage",
    "aborted", "statusCode", "title", "reasoningText", "args", "canOfferSessionApproval",
]  # fmt: skip

_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(_FIELDS), inner, max_size=4)
    ),
    max_leaves=12,
)
_raw_events = st.fixed_dictionaries(
    {
        "type": st.sampled_from(
            [
                *sorted({raw["type"] for raw in lines()}),
                "abort",
                "session.error",
                "subagent.started",
                "tool.shell_output",
                "assistant.turn_retry",
            ]
        ),
        "data": st.dictionaries(st.sampled_from(_FIELDS), _json, max_size=6) | _json,
    },
    optional={
        "id": st.sampled_from(["a", "b", "c"]),
        "timestamp": st.sampled_from(
            ["2026-08-27T17:00:03.100Z", "garbage", "2026-08-27T17:00:04"]
        ),
        "agentId": st.sampled_from(["task1", "task2"]),
    },
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_raw_events, max_size=25))
def test_arbitrary_payloads_never_raise_and_always_encode(raws: list[dict[str, Any]]) -> None:
    translator = CopilotTranslator()
    out: list[Emitted] = []
    for n, raw in enumerate(raws):
        out += translator.translate(raw, n * 0.1)  # not feed: no guard to lean on
    out += translator.close(len(raws) * 0.1)
    for emitted in out:
        msgspec.msgpack.encode(emitted)


# -- the plugin --------------------------------------------------------------------------


def test_plugin_provides_the_copilot_adapter_by_entry_point() -> None:
    (entry,) = [e for e in importlib.metadata.entry_points(group="busd") if e.name == "copilot"]
    assert entry.load().busd_adapters is busd_adapters
    (adapter,) = busd_adapters()
    assert isinstance(adapter, Adapter)
    assert adapter.name == "copilot" == CopilotAdapter.name
    translator = adapter.translator(session_id="s")
    assert isinstance(translator, CopilotTranslator)
    assert translator.feed(ev("session.resume", {"selectedModel": "gpt-5"}), 0.0)[0] == Emitted(
        SessionStart(model="gpt-5"), session_id="s"
    )
