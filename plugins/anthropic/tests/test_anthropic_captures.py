"""The ``anthropic`` adapter on real recorded API streams (see fixtures/README.md).

Every expected number is worked out by hand from the capture and the API's
documented semantics, with the arithmetic written next to it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from busd_anthropic import AnthropicTranslator

from busd import (
    ContextWindow,
    Emitted,
    Envelope,
    SessionCompaction,
    SessionContext,
    SessionIdle,
    TextComplete,
    TokenUsage,
    ToolComplete,
    ToolStart,
    TurnEnd,
    Usage,
)

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def feed(name: str) -> tuple[list[Emitted], AnthropicTranslator]:
    """Feed a capture, one SSE ``data:`` payload a line, then finish."""
    translator = AnthropicTranslator()
    text = (FIXTURES / name).read_text(encoding="utf-8")
    payloads = [json.loads(line) for line in text.splitlines() if line.strip()]
    out: list[Emitted] = []
    for i, payload in enumerate(payloads):
        out += translator.feed(payload, i * 0.1)
    out += translator.finish(len(payloads) * 0.1)
    return out, translator


def of(out: list[Emitted], cls: type[Any]) -> list[Any]:
    return [e.event for e in out if type(e.event) is cls]


PTC = "anthropic-programmatic-tool-calling.1.chunks.txt"
COMPACTION = "anthropic-compaction.1.chunks.txt"
CODE_TOOL = "srvtoolu_01MzSrFWsmzBdcoQkGWLyRjK"


def test_tool_calls_inside_message_start_are_tool_calls() -> None:
    """Programmatic tool calling: 13 of the 15 tool calls come whole in ``message_start``.

    The capture is 15 model calls. Call 1 streams a text block, the
    ``code_execution`` server tool (id ``srvtoolu_01Mz…``) and the first
    ``rollDie``; calls 2 to 14 are each a bare ``message_start`` whose
    ``content`` holds one ``rollDie`` ``tool_use`` and whose ``stop_reason`` is
    ``tool_use``, then ``message_stop`` (no ``message_delta``); call 15 streams
    the code's result and the answer. The script rolled 7 rounds, two dice a
    round: 14 ``rollDie`` calls, players alternating from player1.
    """
    out, translator = feed(PTC)
    starts: list[ToolStart] = of(out, ToolStart)
    assert len(starts) == 15  # 1 code_execution + 1 streamed rollDie + 13 in message_start
    assert starts[0].name == "code_execution"
    assert starts[0].tool_call_id == CODE_TOOL
    assert starts[0].input["code"].startswith("\nimport asyncio\n\nasync def main():")
    rolls = starts[1:]
    assert [s.name for s in rolls] == ["rollDie"] * 14
    assert [s.input for s in rolls] == [{"player": f"player{1 + i % 2}"} for i in range(14)]
    assert rolls[1].tool_call_id == "toolu_015dGLMbwBKv1ZRQr6KdJzeH"  # first one in message_start

    ends: list[TurnEnd] = of(out, TurnEnd)
    assert [e.finish_reason for e in ends] == ["tool_use"] * 14 + ["end_turn"]
    assert ends[1].turn_id == "msg_01KSVw3xmXbMNJPNMt46BC5W"

    result: list[ToolComplete] = of(out, ToolComplete)
    assert len(result) == 1
    assert result[0].tool_call_id == CODE_TOOL
    assert result[0].status == "ok"
    assert "GAME OVER: Player 2 wins the game! (3-2)" in (result[0].output or "")

    # Usage: call 1 message_delta 3369 in / 725 out; calls 2-14 report 0 / 0;
    # call 15 message_delta 4551 in / 197 out. 3369 + 4551 = 7920; 725 + 197 = 922.
    usage: list[Usage] = of(out, Usage)
    assert usage[-1].tokens == TokenUsage(input_tokens=7920, output_tokens=922)
    assert of(out, TextComplete)[-1].text.endswith("against Player 1's 2.")
    assert out[-1].event == SessionIdle()
    stats = translator.statistics()
    assert stats.unknown == {}
    assert stats.malformed == {}


def test_a_stop_reason_in_message_start_stands_unless_message_delta_overrides_it() -> None:
    """Hand-built (not a capture): the same call with a ``message_delta`` after it."""
    translator = AnthropicTranslator()
    start = {
        "type": "message_start",
        "message": {
            "id": "msg_a",
            "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"x": 1}}],
            "stop_reason": "tool_use",
            "usage": {"input_tokens": 0, "output_tokens": 0},
        },
    }
    override = {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {}}
    out = translator.feed(start, 0.0) + translator.feed(override, 0.1)
    out += translator.feed({"type": "message_stop"}, 0.2)
    assert [e.finish_reason for e in of(out, TurnEnd)] == ["end_turn"]
    assert [(s.tool_call_id, s.input) for s in of(out, ToolStart)] == [("t1", {"x": 1})]


def test_server_side_compaction_bills_every_iteration_and_restarts_the_context() -> None:
    """One call that compacted: ``usage.iterations`` lists both model iterations.

    ``message_start`` says input 60,385 (the compaction iteration's input);
    ``message_delta``'s top level says 612 / 2,819, the last iteration only.
    Iterations: compaction 60,385 in / 522 out, message 612 in / 2,819 out.
    Billed: 60,385 + 612 = 60,997 input, 522 + 2,819 = 3,341 output.
    Context after the call: the last iteration's input + output = 612 + 2,819 = 3,431
    (no cache reads or writes anywhere in this call).
    """
    out, translator = feed(COMPACTION)
    evs = [e.event for e in out]
    usage: list[Usage] = of(out, Usage)
    assert usage[-1].tokens == TokenUsage(input_tokens=60_997, output_tokens=3_341)
    assert max(u.tokens.input_tokens for u in usage) == 60_997

    compactions: list[SessionCompaction] = of(out, SessionCompaction)
    assert compactions == [SessionCompaction(tokens_before=60_385)]
    first_text = next(i for i, e in enumerate(evs) if type(e) is TextComplete)
    assert evs.index(compactions[0]) < first_text  # shown where it happened

    contexts: list[SessionContext] = of(out, SessionContext)
    assert contexts == [SessionContext(used=3_431)]
    assert evs.index(contexts[0]) > evs.index(usage[-1])  # the last word on the window

    text = of(out, TextComplete)
    assert len(text) == 1
    assert text[0].text.startswith("Based on the conversation history, you asked me")
    assert [e.finish_reason for e in of(out, TurnEnd)] == ["end_turn"]
    stats = translator.statistics()
    assert stats.unknown == {}
    assert stats.malformed == {}


def test_the_context_window_ends_at_the_last_iteration_after_a_compaction() -> None:
    """The window after the compacted call is 612 + 2,819 = 3,431, not 60,997 + 3,341.

    Only the adapter's events drive the window here; what the window does with
    ``stream.session.compaction`` and ``stream.session.context`` is the core's
    (docs/accounting.md).
    """
    out, _ = feed(COMPACTION)
    window = ContextWindow()
    for seq, item in enumerate(out, 1):
        window.observe(Envelope(seq, 0.0, item.event, item.session_id))
    assert window.used == 3_431


def test_after_a_compaction_the_billed_sum_is_never_shown_as_the_context() -> None:
    """Between the compaction and the provider's figure, the window never reads 64,338.

    The call's ``stream.usage`` is the billed sum over its iterations
    (60,997 + 3,341); it is no context figure, and the call is not graded as
    an estimate: the context after it is the last iteration's, 612 + 2,819.
    """
    out, _ = feed(COMPACTION)
    window = ContextWindow()
    shown: list[int] = []
    for seq, item in enumerate(out, 1):
        window.observe(Envelope(seq, 0.0, item.event, item.session_id))
        shown.append(window.used)
    assert 60_997 + 3_341 not in shown
    compacted = next(i for i, e in enumerate(out) if type(e.event) is SessionCompaction)
    assert max(shown[compacted:]) <= 60_385  # never above what was there before it
    assert shown[-1] == 612 + 2_819
    stats = window.statistics()
    assert (stats.calls, stats.samples) == (1, 0)  # counted once (message_start), never graded
