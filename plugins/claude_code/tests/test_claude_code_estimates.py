"""Claude Code: a live estimate gives way to the CLI's counts when a call or a turn ends (issue 16).

The accountant estimates output streamed after the last ``stream.usage``
and drops that estimate at the next report, whatever its figure. The
captures are the real CLI's stdout (``fixtures/README.md``):

- ``final-at-start.partial.jsonl``: with partial messages, from a stand-in
  whose ``message_start`` already holds each call's final output (21, then
  22) and whose ``message_delta`` repeats it; the ``result`` says 43, the sum,
  so no figure grows at the end of the second call nor at the result. Exact
  figures: 21 after the first call, 43 after the second and at the end.
- ``subagent-haiku.snapshots.jsonl``: no partial messages, so the only usage
  is each ``result``'s: at each turn's end the figure is exact. Its two
  ``result`` lines sum ``modelUsage`` over both models: 120 + 3 + 146 = 269
  output after the first turn's calls (the sub-agent ran in the background),
  then 269 + 7 (the second turn's call) = 276... read below from the lines
  themselves rather than restated.
- ``interrupted-mid-answer.jsonl``: the answer was cut by an interrupt after
  ``message_start`` said 1 and five deltas ("Counting slowly: one, two,
  three", 32 characters). The CLI's interrupted ``result`` still counts it:
  ``modelUsage`` says 29 output for the model, the side call's 21 plus 8 for
  the cut answer (32 characters / 4: the CLI's own figure, no final count
  ever came from the API). busd takes that count; until then the words
  were busd's estimate.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from busd_claude_code import ClaudeCodeTranslator

from busd import Envelope, SessionIdle, StreamingStats, TurnEnd, Usage
from busd.core.stats import StatsRegistry

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SESSION = "s1"


def lines(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (FIXTURES / name).read_text().splitlines() if line]


class Accounted:
    """The adapter's events (all in one busd session) through the accountant's stats."""

    def __init__(self, name: str) -> None:
        self.stats = StatsRegistry()
        self.translator = ClaudeCodeTranslator(session_id=SESSION)
        self.usage: list[Usage] = []
        self.after_calls: list[StreamingStats] = []
        self.at_idle: list[StreamingStats] = []
        self.seq = 0
        for line in lines(name):
            self._observe(self.translator.feed(line, self.seq * 0.01))
        self._observe(self.translator.finish(self.seq * 0.01))

    def now(self) -> StreamingStats:
        stats = self.stats.session_stats(SESSION, self.seq * 0.01)
        assert stats is not None
        return stats

    def _observe(self, emitted: list[Any]) -> None:
        for item in emitted:
            self.seq += 1
            event = item.event
            envelope = Envelope(
                seq=self.seq,
                ts=0.0,
                event=event,
                session_id=SESSION,
                agent_id=item.parent_tool_call_id,
            )
            self.stats.observe(envelope, self.seq * 0.01)
            if type(event) is Usage and item.parent_tool_call_id is None:
                self.usage.append(event)
            elif type(event) is TurnEnd and item.parent_tool_call_id is None:
                self.after_calls.append(self.now())
            elif type(event) is SessionIdle:
                self.at_idle.append(self.now())


def test_calls_whose_message_start_had_the_final_count_end_exact() -> None:
    run = Accounted("final-at-start.partial.jsonl")
    assert [(s.output_tokens, s.output_estimated) for s in run.after_calls] == [
        (21, False),
        (43, False),
    ]
    assert [(s.output_tokens, s.output_estimated) for s in run.at_idle] == [(43, False)]
    # message_start's count, the same at the call's end, twice; the result adds its cost.
    assert [u.tokens.output_tokens for u in run.usage] == [21, 21, 43, 43, 43]
    assert [u.tokens.cost_usd for u in run.usage][-2:] == [None, 0.012114]


def test_each_turn_of_a_snapshot_only_stream_ends_at_its_result_exactly() -> None:
    run = Accounted("subagent-haiku.snapshots.jsonl")
    results = [line for line in lines("subagent-haiku.snapshots.jsonl") if line["type"] == "result"]
    every_model = [
        sum(model["outputTokens"] for model in result["modelUsage"].values()) for result in results
    ]
    assert [(s.output_tokens, s.output_estimated) for s in run.at_idle] == [
        (output, False) for output in every_model
    ]


def test_an_interrupted_turn_ends_at_the_count_of_its_result() -> None:
    run = Accounted("interrupted-mid-answer.jsonl")
    [result] = [line for line in lines("interrupted-mid-answer.jsonl") if line["type"] == "result"]
    assert result["subtype"] == "error_during_execution"
    [model] = result["modelUsage"].values()
    assert model["outputTokens"] == 29  # 21 (the side call) + 8 (the cut answer)
    # Cut: message_start's 1 and the words, estimated; then the result's count, exact.
    [cut] = run.after_calls
    assert cut.output_estimated
    assert cut.output_tokens > 1
    assert [(s.output_tokens, s.output_estimated) for s in run.at_idle] == [(29, False)]
