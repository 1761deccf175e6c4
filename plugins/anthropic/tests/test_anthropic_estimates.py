"""A live estimate gives way to the provider's count at the end of every call (issue 16).

The accountant adds an estimate of text, thinking and tool input streamed
after the last ``stream.usage`` and drops it at the next report, also one
that is equal to the last or zero. So every call that ends on the provider's
terms must end with a report, even when its count did not change since the
call started. The streams:

- ``final-at-start.partial.jsonl`` (``plugins/claude_code/tests/fixtures``,
  see its README): the real Claude Code CLI's ``stream_event`` lines, whose
  ``event`` is the Messages API stream as the CLI received it from a
  stand-in that puts each call's final output in ``message_start`` (21, then
  22) and repeats it in ``message_delta``: the "143 vs 156" stream of the
  issue. Exact figures after each call: 21, then 21 + 22 = 43.
- The programmatic tool calling capture (``fixtures/README.md``): calls 2 to
  14 are a bare ``message_start`` (usage 0 / 0, a ``tool_use`` inside) and
  ``message_stop``: output after call 1 is 725, unchanged through call 14,
  then 725 + 197 = 922.
- A call that fails after ``message_start`` said output 0: the recorded text
  reply of ``tests/fixtures/sdk/anthropic-text.recorded.jsonl`` up to its
  last text delta, its ``message_start`` output set to 0, then the API's
  documented ``error`` event (``overloaded_error``); constructed here. The
  count the call ends with is 0.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from busd_anthropic import AnthropicTranslator

from busd import Emitted, Envelope, SessionError, StreamingStats, TextDelta, TurnEnd, Usage
from busd.core.stats import StatsRegistry

HERE = Path(__file__).resolve().parent
PTC = HERE / "fixtures" / "anthropic-programmatic-tool-calling.1.chunks.txt"
FINAL_AT_START = (
    HERE.parent.parent / "claude_code" / "tests" / "fixtures" / "final-at-start.partial.jsonl"
)
TEXT = HERE.parent.parent.parent / "tests" / "fixtures" / "sdk" / "anthropic-text.recorded.jsonl"
SESSION = "s1"


def payloads_of_final_at_start() -> list[dict[str, Any]]:
    """The Messages API events inside the capture's ``stream_event`` lines, in order."""
    lines = [json.loads(line) for line in FINAL_AT_START.read_text().splitlines()]
    return [line["event"] for line in lines if line["type"] == "stream_event"]


class Accounted:
    """The adapter's events through the accountant's stats, read after every call."""

    def __init__(self) -> None:
        self.stats = StatsRegistry()
        self.translator = AnthropicTranslator(session_id=SESSION)
        self.emitted: list[Emitted] = []
        self.after_calls: list[StreamingStats] = []
        self._seq = 0

    def feed(self, payloads: Iterable[dict[str, Any]]) -> None:
        for payload in payloads:
            self._observe(self.translator.feed(payload, self._seq * 0.01))

    def finish(self) -> None:
        self._observe(self.translator.finish(self._seq * 0.01))

    def now(self) -> StreamingStats:
        stats = self.stats.session_stats(SESSION, self._seq * 0.01)
        assert stats is not None
        return stats

    def _observe(self, emitted: list[Emitted]) -> None:
        for item in emitted:
            self._seq += 1
            self.emitted.append(item)
            envelope = Envelope(seq=self._seq, ts=0.0, event=item.event, session_id=SESSION)
            self.stats.observe(envelope, self._seq * 0.01)
            if type(item.event) is TurnEnd:
                self.after_calls.append(self.now())

    def of(self, cls: type[Any]) -> list[Any]:
        return [e.event for e in self.emitted if type(e.event) is cls]


def test_a_call_whose_message_start_had_its_final_count_ends_exact() -> None:
    run = Accounted()
    run.feed(payloads_of_final_at_start())
    assert [(s.output_tokens, s.output_estimated) for s in run.after_calls] == [
        (21, False),
        (43, False),
    ]
    # The last report is the total of both calls; nothing was left to estimate.
    assert run.of(Usage)[-1].tokens.output_tokens == 43
    run.finish()
    assert (run.now().output_tokens, run.now().output_estimated) == (43, False)


def test_the_end_of_a_call_repeats_an_unchanged_count_once_and_only_after_new_output() -> None:
    run = Accounted()
    run.feed(payloads_of_final_at_start())
    kinds = [
        type(e.event).__name__ for e in run.emitted if type(e.event) in (Usage, TurnEnd, TextDelta)
    ]
    # Each call: its message_start's count, its text, the same count again at its end.
    assert kinds == ["Usage", "TextDelta", "Usage", "TurnEnd"] * 2
    assert [u.tokens.output_tokens for u in run.of(Usage)] == [21, 21, 43, 43]


def test_calls_inside_message_start_with_a_zero_count_end_exact() -> None:
    run = Accounted()
    run.feed(json.loads(line) for line in PTC.read_text().splitlines() if line.strip())
    figures = [(s.output_tokens, s.output_estimated) for s in run.after_calls]
    assert figures == [(725, False)] * 14 + [(922, False)]


def test_a_call_that_fails_after_a_zero_count_ends_at_zero_not_at_its_estimate() -> None:
    recorded = [json.loads(line) for line in TEXT.read_text().splitlines()]
    start = recorded[0]
    start["message"]["usage"]["output_tokens"] = 0
    deltas = [p for p in recorded if p["type"] == "content_block_delta"]
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    run = Accounted()
    run.feed([start, recorded[1], *deltas[:3]])
    live = run.now()
    assert live.output_estimated
    assert live.output_tokens > 0
    run.feed([error])
    assert [(s.output_tokens, s.output_estimated) for s in run.after_calls] == [(0, False)]
    assert [u.tokens.output_tokens for u in run.of(Usage)] == [0, 0]  # at its start, its end
    assert run.of(SessionError)[0].code == "overloaded_error"
    assert [e.finish_reason for e in run.of(TurnEnd)] == ["error"]


def test_a_call_cut_short_keeps_its_estimate() -> None:
    """Nothing ended the call on the provider's terms: its last count is not its final one."""
    recorded = [json.loads(line) for line in TEXT.read_text().splitlines()]
    run = Accounted()
    run.feed(recorded[:5])  # message_start (output 1), the block, a ping, two deltas
    run.finish()
    stats = run.now()
    assert stats.output_estimated
    assert stats.output_tokens > 1
    assert [e.finish_reason for e in run.of(TurnEnd)] == ["cancelled"]
    assert [u.tokens.output_tokens for u in run.of(Usage)] == [1]  # message_start's only
