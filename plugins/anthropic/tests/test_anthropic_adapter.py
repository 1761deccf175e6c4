"""The ``anthropic`` adapter against recorded Messages API streams."""

from __future__ import annotations

import importlib.metadata
import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from busd_anthropic import AnthropicAdapter, AnthropicTranslator, busd_adapters
from hypothesis import given, settings
from hypothesis import strategies as st

from busd import (
    Adapter,
    Emitted,
    Event,
    SessionError,
    SessionIdle,
    SessionStart,
    TextComplete,
    TextDelta,
    ThinkingComplete,
    ThinkingDelta,
    TokenUsage,
    ToolStart,
    Translator,
    TurnEnd,
    TurnStart,
    Usage,
)

FIXTURES = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "sdk"

TEXT = (
    "Hello! I'm doing well, thank you for asking. How are you doing today?"
    " Is there anything I can help you with?"
)


def lines(name: str) -> list[dict[str, Any]]:
    with (FIXTURES / name).open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def run(raw: list[Any], translator: Translator | None = None) -> list[Emitted]:
    """Feed ``raw`` at now = index * 0.1, then finish."""
    t = translator or AnthropicTranslator()
    out: list[Emitted] = []
    for i, item in enumerate(raw):
        out += t.feed(item, i * 0.1)
    out += t.finish(len(raw) * 0.1)
    return out


def events(out: list[Emitted]) -> list[Event]:
    return [e.event for e in out]


def of(out: list[Emitted], cls: type[Any]) -> list[Any]:
    return [e.event for e in out if type(e.event) is cls]


def final_usage(out: list[Emitted]) -> TokenUsage:
    usage: list[Usage] = of(out, Usage)
    return usage[-1].tokens


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
        assert len(completes) == 1  # exactly one completion per part...
        assert completes[0] == seq[-1][0]  # ...after its deltas
    for i, e in enumerate(evs):
        if type(e) is TurnEnd:
            assert evs.index(TurnStart(turn_id=e.turn_id)) < i
            inside = [
                j for pid, seq in parts.items() if pid.startswith(f"{e.turn_id}:") for j, _ in seq
            ]
            assert all(j < i for j in inside)
    totals = [u.tokens for u in of(out, Usage)]
    for a, b in itertools.pairwise(totals):
        assert b.output_tokens >= a.output_tokens
        assert b.input_tokens >= a.input_tokens
        assert a != b  # emitted only when a total changed


# -- the recorded streams ----------------------------------------------------


def test_text_stream_gives_the_text_and_cumulative_usage() -> None:
    out = run(lines("anthropic-text.recorded.jsonl"))
    assert_invariants(out)
    (complete,) = of(out, TextComplete)
    assert complete.text == TEXT
    assert complete.message_id == "msg_01QC4g3HwBThD4BaNtBckFDJ:0"
    assert not complete.stopped
    assert "".join(d.text for d in of(out, TextDelta)) == TEXT
    usage = final_usage(out)
    assert usage.input_tokens == 12
    assert usage.output_tokens == 30  # message_delta is cumulative: not 1 + 30
    (end,) = of(out, TurnEnd)
    assert end == TurnEnd(turn_id="msg_01QC4g3HwBThD4BaNtBckFDJ", finish_reason="end_turn")
    assert of(out, SessionStart) == [SessionStart(model="claude-sonnet-4-5-20250929")]
    assert of(out, SessionIdle) == [SessionIdle(aborted=False)]


def test_tool_stream_assembles_the_input_json() -> None:
    out = run(lines("anthropic-tool.recorded.jsonl"))
    assert_invariants(out)
    (tool,) = of(out, ToolStart)
    assert tool.name == "json"
    assert tool.tool_call_id == "toolu_01KFbKqPYSuAKujiL6mTfzYA"
    assert tool.input == {
        "elements": [{"location": "San Francisco", "temperature": 58, "condition": "sunny"}]
    }
    assert of(out, TurnEnd)[0].finish_reason == "tool_use"
    assert final_usage(out).output_tokens == 47
    assert final_usage(out).input_tokens == 849


def test_thinking_text_and_tool_stream() -> None:
    raw = lines("anthropic.jsonl")
    out = run(raw)
    assert_invariants(out)
    (thinking,) = of(out, ThinkingComplete)
    assert thinking.text == (
        "The user wants the weather in San Francisco, so I should call get_weather."
    )
    assert thinking.signature == raw[6]["delta"]["signature"]
    # block start at line 1, block stop at line 7: by the fake clock, 0.6 s
    assert thinking.duration_s == pytest.approx(0.6)
    (text,) = of(out, TextComplete)
    assert text.text == "I'll check the weather for you."
    assert text.message_id == "msg_01Y6V41gqPaKWEw7iPouH7iW:1"
    (tool,) = of(out, ToolStart)
    assert (tool.name, tool.input) == ("get_weather", {"location": "San Francisco, CA"})
    usage = final_usage(out)
    assert (usage.input_tokens, usage.output_tokens) == (69, 112)
    assert usage.cost_usd is None
    assert of(out, TurnEnd)[0].finish_reason == "tool_use"


def test_sdk_event_objects_translate_like_dicts() -> None:
    pydantic = pytest.importorskip("pydantic")
    types = pytest.importorskip("anthropic.types")
    adapter = pydantic.TypeAdapter(types.RawMessageStreamEvent)
    raw = [line for line in lines("anthropic.jsonl") if line["type"] != "ping"]
    objects = [adapter.validate_python(line) for line in raw]
    assert not isinstance(objects[0], dict)
    assert run(objects) == run(raw)


def test_consecutive_message_streams_add_up() -> None:
    raw = lines("anthropic-text.recorded.jsonl") + lines("anthropic-tool.recorded.jsonl")
    out = run(raw)
    assert_invariants(out)
    assert [e.turn_id for e in of(out, TurnStart)] == [
        "msg_01QC4g3HwBThD4BaNtBckFDJ",
        "msg_01K2JbSUMYhez5RHoK9ZCj9U",
    ]
    assert [e.finish_reason for e in of(out, TurnEnd)] == ["end_turn", "tool_use"]
    usage = final_usage(out)
    assert (usage.input_tokens, usage.output_tokens) == (12 + 849, 30 + 47)
    assert of(out, Usage)[-1].model == "claude-haiku-4-5-20251001"


def test_translating_twice_gives_the_same_events() -> None:
    raw = lines("anthropic.jsonl")
    assert run(raw) == run(raw)


def test_adapter_is_found_through_the_busd_entry_point_group() -> None:
    points = importlib.metadata.entry_points(group="busd")
    (point,) = [p for p in points if p.name == "anthropic"]
    module = point.load()
    (adapter,) = module.busd_adapters()
    assert isinstance(adapter, Adapter)
    assert adapter.name == "anthropic"
    assert isinstance(adapter.translator(session_id="s"), AnthropicTranslator)
    assert [a.name for a in busd_adapters()] == ["anthropic"]


def test_session_id_of_the_translator_is_on_every_event() -> None:
    translator = AnthropicAdapter().translator(session_id="s")
    out = run(lines("anthropic-text.recorded.jsonl"), translator)
    assert {e.session_id for e in out} == {"s"}


# -- hand-made streams ---------------------------------------------------------


def start(message_id: str = "msg_1", **usage: int) -> dict[str, Any]:
    return {
        "type": "message_start",
        "message": {"id": message_id, "model": "m", "usage": usage or {"input_tokens": 5}},
    }


def block(index: int, content: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": content}


def delta(index: int, content: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": content}


def stop(index: int) -> dict[str, Any]:
    return {"type": "content_block_stop", "index": index}


def message_delta(reason: str | None = "end_turn", **usage: Any) -> dict[str, Any]:
    return {"type": "message_delta", "delta": {"stop_reason": reason}, "usage": usage}


MESSAGE_STOP = {"type": "message_stop"}


def test_a_tool_without_input_gets_an_empty_object() -> None:
    raw = [
        start(),
        block(0, {"type": "tool_use", "id": "t1", "name": "now", "input": {}}),
        delta(0, {"type": "input_json_delta", "partial_json": ""}),
        stop(0),
        message_delta("tool_use", output_tokens=3),
        MESSAGE_STOP,
    ]
    (tool,) = of(run(raw), ToolStart)
    assert tool == ToolStart(tool_call_id="t1", name="now", input={})


def test_thinking_tokens_are_the_reasoning_share_of_the_output() -> None:
    raw = [
        start(input_tokens=10, output_tokens=1),
        message_delta(output_tokens=143, output_tokens_details={"thinking_tokens": 59}),
        MESSAGE_STOP,
    ]
    usage = final_usage(run(raw))
    assert (usage.output_tokens, usage.reasoning_tokens) == (143, 59)


def test_input_and_cache_counts_on_message_delta_take_over_when_present() -> None:
    raw = [
        start(input_tokens=10, cache_read_input_tokens=100, output_tokens=1),
        message_delta(input_tokens=25, cache_read_input_tokens=None, output_tokens=7),
        MESSAGE_STOP,
    ]
    usage = final_usage(run(raw))
    assert (usage.input_tokens, usage.cache_read_tokens, usage.output_tokens) == (25, 100, 7)


def test_an_error_event_ends_the_call_and_leaves_the_session_in_error() -> None:
    raw = [
        start(),
        block(0, {"type": "text", "text": ""}),
        delta(0, {"type": "text_delta", "text": "Hel"}),
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
    ]
    out = run(raw)
    assert of(out, TextComplete) == [TextComplete(message_id="msg_1:0", text="Hel", stopped=True)]
    assert of(out, TurnEnd)[0].finish_reason == "error"
    assert of(out, SessionError) == [
        SessionError(message="Overloaded", code="overloaded_error", retryable=True)
    ]
    assert of(out, SessionIdle) == []  # idle would clear the error


def test_a_stream_cut_short_completes_its_parts_stopped() -> None:
    raw = [
        start(),
        block(0, {"type": "thinking", "thinking": "", "signature": ""}),
        delta(0, {"type": "thinking_delta", "thinking": "hmm"}),
        block(1, {"type": "tool_use", "id": "t1", "name": "x", "input": {}}),
        delta(1, {"type": "input_json_delta", "partial_json": '{"a": '}),
    ]
    out = run(raw)
    (thinking,) = of(out, ThinkingComplete)
    assert (thinking.text, thinking.stopped, thinking.signature) == ("hmm", True, None)
    assert thinking.duration_s == pytest.approx(0.4)  # finish at 0.5, block start at 0.1
    assert of(out, ToolStart) == []  # an input cut short was never a call
    assert of(out, TurnEnd) == [TurnEnd(turn_id="msg_1", finish_reason="cancelled")]
    assert events(out)[-1] == SessionIdle(aborted=True)


def test_a_replayed_message_stream_is_dropped_whole() -> None:
    once = lines("anthropic-text.recorded.jsonl")
    t = AnthropicTranslator()
    out = run(once + once, t)
    assert len(of(out, TextComplete)) == 1
    assert final_usage(out).output_tokens == 30
    assert t.statistics().duplicates == len(once)  # the whole second stream
    assert t.statistics().malformed == {}


def test_a_whole_message_response_is_one_turn() -> None:
    message = {
        "type": "message",
        "id": "msg_9",
        "model": "m",
        "content": [
            {"type": "text", "text": "Hi"},
            {"type": "tool_use", "id": "t9", "name": "ls", "input": {"path": "."}},
        ],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 4, "output_tokens": 9},
    }
    out = run([message])
    assert_invariants(out)
    assert of(out, TextComplete) == [TextComplete(message_id="msg_9:0", text="Hi")]
    assert of(out, ToolStart)[0].input == {"path": "."}
    assert of(out, TurnEnd) == [TurnEnd(turn_id="msg_9", finish_reason="tool_use")]
    assert final_usage(out) == TokenUsage(input_tokens=4, output_tokens=9)


def test_broken_events_are_counted_not_raised() -> None:
    t = AnthropicTranslator()
    raw: list[Any] = [
        "not an event",
        {"no": "type"},
        {"type": "brand_new_event"},
        {"type": "message_start"},
        delta(0, {"type": "text_delta", "text": "x"}),
        start(),
        block(0, {"type": "text", "text": ""}),
        delta(0, {"type": "future_delta"}),
        delta(0, {"type": "input_json_delta", "partial_json": "{"}),
        block(1, {"type": "tool_use", "id": "t", "name": "n", "input": {}}),
        delta(1, {"type": "input_json_delta", "partial_json": "{not json"}),
        stop(1),
        {"type": "content_block_stop", "index": "zero"},
        MESSAGE_STOP,
    ]
    out = run(raw, t)
    stats = t.statistics()
    assert stats.unknown == {"<no type>": 1, "brand_new_event": 1, "delta.future_delta": 1}
    assert stats.malformed == {
        "str": 1,
        "message_start": 1,
        "content_block_delta": 2,
        "input_json_delta": 1,
        "content_block_stop": 1,
    }
    assert of(out, ToolStart)[0].input == {}
    assert events(out)[-1] == SessionIdle()


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=4,
)
_kinds = st.sampled_from(
    [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
        "error",
        "message",
        "ping",
    ]
)
_fields = st.dictionaries(
    st.sampled_from(
        ["message", "index", "content_block", "delta", "usage", "error", "id", "content"]
    ),
    _json
    | st.integers(0, 2)
    | st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "thinking", "tool_use", "text_delta", "x"]) | _json},
        optional={"text": _json, "id": _json, "input": _json, "partial_json": _json},
    ),
)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(_kinds, _fields), max_size=12))
def test_arbitrary_event_shapes_never_escape_translate(items: list[tuple[str, Any]]) -> None:
    t = AnthropicTranslator()
    for i, (kind, fields) in enumerate(items):
        t.translate({**fields, "type": kind}, i * 0.1)  # translate itself, not feed
    t.close(len(items) * 0.1)
