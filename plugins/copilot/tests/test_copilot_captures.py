"""The copilot adapter on what the real Copilot CLI 1.0.102 sends, recorded verbatim.

fixtures/cli-1.0.102-allowed.jsonl and -denied.jsonl (provenance in
fixtures/README.md) are the live test's conversation: one prompt, a model
call that thinks, says "Let me run it." and asks for ``bash``
(``echo hello``), the shell permission (approved, or rejected with
``not now``), and a call that thinks and answers. The stand-in served
(input, cache write, cache read, output) = (11, 1000, 0, 21) and then
(12, 2000, 500, 22). -not-streaming.jsonl is the approved one from a
session with streaming off: no deltas, each call's text and thinking come
whole.

Unlike the hand-made tests/fixtures/sdk/copilot.jsonl, the CLI sends each
call's ``assistant.usage`` *before* that call's ``assistant.message`` (tied
to it by ``apiCallId``), and the ``assistant.reasoning`` that completes the
thinking after the message.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from busd_copilot import CopilotAdapter

from busd import (
    Emitted,
    Envelope,
    Event,
    PermissionRequested,
    PermissionResolved,
    SessionIdle,
    StreamingStatsTracker,
    TextComplete,
    ThinkingComplete,
    ToolComplete,
    ToolStart,
    TurnEnd,
    TurnStart,
    Usage,
)

E = TypeVar("E", bound=Event)
FIXTURES = Path(__file__).resolve().parent / "fixtures"
THOUGHT = "The user wants the shell; bash it is."
SAID = "Let me run it."
ANSWER = "The command printed hello."


def recording(name: str) -> list[dict[str, Any]]:
    text = (FIXTURES / f"cli-1.0.102-{name}.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


def served(name: str) -> list[dict[str, int]]:
    calls = json.loads((FIXTURES / f"cli-1.0.102-{name}.served.json").read_text())
    return [call["usage"] for call in calls]


def as_wire(raw: dict[str, Any]) -> object:
    return raw


def as_sdk(raw: dict[str, Any]) -> object:
    """What the driver feeds: the SDK's own ``SessionEvent`` for the wire JSON."""
    events = pytest.importorskip("copilot.generated.session_events")
    return events.session_event_from_dict(raw)


def feed(raws: list[dict[str, Any]], shape: Callable[[dict[str, Any]], object]) -> Any:
    t = CopilotAdapter().translator()
    out: list[Emitted] = []
    for n, raw in enumerate(raws):
        out += t.feed(shape(raw), n * 0.1)
    out += t.finish(len(raws) * 0.1)
    return out, t.statistics()


def of(out: list[Emitted], cls: type[E]) -> list[E]:
    return [e.event for e in out if isinstance(e.event, cls)]


def calls(out: list[Emitted]) -> list[list[Event]]:
    """The events of each model call, from its ``stream.turn.start`` to its end."""
    found: list[list[Event]] = []
    inside = False
    for item in out:
        match item.event:
            case TurnStart():
                assert not inside, "a call opened inside another"
                inside = True
                found.append([])
            case TurnEnd():
                assert inside, "a call ended that was not open"
                inside = False
        if inside or isinstance(item.event, TurnEnd):
            found[-1].append(item.event)
    assert not inside
    return found


def in_order(raws: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The recording with each call's usage moved after its message (the fixture's order),
    as if sent then."""
    usages = {r["data"]["apiCallId"]: r for r in raws if r["type"] == "assistant.usage"}
    moved: list[dict[str, Any]] = []
    for raw in raws:
        if raw["type"] == "assistant.usage":
            continue
        moved.append(raw)
        if raw["type"] == "assistant.message":
            usage = usages.pop(raw["data"]["apiCallId"])
            moved.append({**usage, "timestamp": raw["timestamp"]})
    assert not usages
    return moved


SHAPES = pytest.mark.parametrize("shape", [as_wire, as_sdk], ids=["wire", "sdk"])
RUNS = pytest.mark.parametrize("name", ["allowed", "denied", "not-streaming"])


@RUNS
def test_the_recording_has_each_calls_usage_before_its_message(name: str) -> None:
    """What the translator has to deal with: the order the CLI really sends."""
    raws = recording(name)
    kinds = [r["type"] for r in raws]
    assert raws[0]["data"]["copilotVersion"] == "1.0.102"
    for usage in (r for r in raws if r["type"] == "assistant.usage"):
        call = usage["data"]["apiCallId"]
        [message] = [
            i
            for i, r in enumerate(raws)
            if r["type"] == "assistant.message" and r["data"].get("apiCallId") == call
        ]
        assert raws.index(usage) < message
        assert kinds[message + 1] == "assistant.reasoning"
    assert kinds.count("assistant.usage") == 2


@RUNS
@SHAPES
def test_one_turn_per_model_call_each_with_its_usage_thinking_text_and_tools(
    name: str, shape: Callable[[dict[str, Any]], object]
) -> None:
    raws = recording(name)
    out, stats = feed(raws, shape)
    assert (stats.unknown, stats.malformed, stats.duplicates) == ({}, {}, 0)
    if any(r["type"] == "assistant.reasoning_delta" for r in raws):
        reasonings = [r["data"]["reasoningId"] for r in raws if r["type"] == "assistant.reasoning"]
    else:  # told whole by the call's message (and again by assistant.reasoning, ignored)
        messages = [r["data"]["messageId"] for r in raws if r["type"] == "assistant.message"]
        reasonings = [f"{message}:reasoning" for message in messages]
    tool_call, answer = calls(out)
    assert [(e.turn_id, e.finish_reason) for e in of(out, TurnEnd)] == [
        ("0", "tool_use"),
        ("1", "end_turn"),
    ]
    # Each call: its one thinking block (once), its text, its tool, then its usage.
    told = (ThinkingComplete, TextComplete, ToolStart, Usage)
    for call, reasoning, text in zip((tool_call, answer), reasonings, (SAID, ANSWER), strict=True):
        [thinking] = [e for e in call if isinstance(e, ThinkingComplete)]
        assert (thinking.message_id, thinking.text) == (reasoning, THOUGHT)
        assert [e.text for e in call if isinstance(e, TextComplete)] == [text]
        tools = [ToolStart] if call is tool_call else []
        assert [type(e) for e in call if isinstance(e, told)] == [
            ThinkingComplete,
            TextComplete,
            *tools,
            Usage,
        ]
        assert isinstance(call[-1], TurnEnd)
    assert len(of(out, ThinkingComplete)) == 2
    [tool] = [e for e in tool_call if isinstance(e, ToolStart)]
    assert (tool.tool_call_id, tool.name, tool.input) == (
        "toolu_standin_1",
        "bash",
        {"command": "echo hello", "description": "Print hello"},
    )
    assert of(out, ToolStart) == [tool]
    # The permission and the tool's run come between the calls.
    [asked] = of(out, PermissionRequested)
    [resolved] = of(out, PermissionResolved)
    [done] = of(out, ToolComplete)
    assert asked.tool_call_id == done.tool_call_id == tool.tool_call_id
    if name != "denied":
        assert (resolved.outcome, done.status) == ("allowed", "ok")
        assert (done.output or "").startswith("hello\n")
    else:
        assert (resolved.outcome, done.status) == ("denied", "error")
        assert "not now" in (done.error or "")
    assert of(out, SessionIdle) == [SessionIdle()]


@RUNS
@SHAPES
def test_the_output_is_what_the_stand_in_served_all_of_it_reported(
    name: str, shape: Callable[[dict[str, Any]], object]
) -> None:
    """No event of a call comes after its usage, so the core estimates nothing on top."""
    out, _ = feed(recording(name), shape)
    tracker = StreamingStatsTracker()
    after_calls: list[tuple[int, bool]] = []
    for seq, item in enumerate(out, 1):
        tracker.observe(Envelope(seq, 0.0, item.event, item.session_id), seq * 0.01)
        if isinstance(item.event, TurnEnd):
            after_calls.append((tracker.output_tokens, tracker.output_estimated))
    first, second = served(name)
    assert after_calls == [
        (first["output_tokens"], False),
        (first["output_tokens"] + second["output_tokens"], False),
    ]
    total = tracker.authoritative_output_tokens
    assert (tracker.output_tokens, tracker.output_estimated) == (total, False)
    assert total == 21 + 22
    final = of(out, Usage)[-1].tokens
    # Copilot counts input with the cache; busd separates it again.
    assert (
        final.input_tokens,
        final.output_tokens,
        final.cache_read_tokens,
        final.cache_write_tokens,
    ) == (
        first["input_tokens"] + second["input_tokens"],
        total,
        first["cache_read_input_tokens"] + second["cache_read_input_tokens"],
        first["cache_creation_input_tokens"] + second["cache_creation_input_tokens"],
    )


@RUNS
def test_usage_after_its_message_translates_the_same(name: str) -> None:
    """The fixture's order (usage after the message) is one the adapter keeps handling."""
    raws = recording(name)
    moved = in_order(raws)
    assert moved != raws
    assert [e.event for e in feed(moved, as_wire)[0]] == [e.event for e in feed(raws, as_wire)[0]]


def test_a_call_whose_message_never_comes_ends_with_its_usage_at_the_turns_end() -> None:
    """Made from the recording: without its message, a call that reported its usage
    ends when its turn does, as its report said, with that usage last."""
    raws = [
        r
        for r in recording("allowed")
        if r["type"] not in ("assistant.message", "assistant.reasoning")
    ]
    out, stats = feed(raws, as_wire)
    assert (stats.malformed, stats.duplicates) == ({}, 0)
    tool_call, answer = calls(out)
    assert [(e.turn_id, e.finish_reason) for e in of(out, TurnEnd)] == [
        ("0", "tool_use"),
        ("1", "end_turn"),
    ]
    for call, text in ((tool_call, SAID), (answer, ANSWER)):
        assert [type(e) for e in call][-2:] == [Usage, TurnEnd]
        assert [e.text for e in call if isinstance(e, ThinkingComplete)] == [THOUGHT]
        assert [e.text for e in call if isinstance(e, TextComplete)] == [text]


def test_a_message_of_another_call_ends_the_one_waiting_for_its_message() -> None:
    """Made from the recording: the first message names another ``apiCallId``, so the
    call that reported its usage ends first and the message opens a call of its own."""
    raws = recording("allowed")
    first = next(i for i, r in enumerate(raws) if r["type"] == "assistant.message")
    other = {**raws[first]["data"], "apiCallId": "msg_other"}
    out, _ = feed([*raws[:first], {**raws[first], "data": other}, *raws[first + 1 :]], as_wire)
    reported, late, _ = calls(out)
    assert [type(e) for e in reported][-2:] == [Usage, TurnEnd]
    assert [e.turn_id for e in of(out, TurnStart)] == ["0", "0.1", "1"]
    assert [e.tool_call_id for e in late if isinstance(e, ToolStart)] == ["toolu_standin_1"]
    assert not any(isinstance(e, Usage) for e in late)
