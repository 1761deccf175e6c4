"""``opencode run --format json --thinking`` on a real recording with a reasoning line.

OpenCode 1.18.33 against ``tests/fixtures/sdk/thinking_stand_in.py`` (README
in tests/fixtures/sdk/): the answer's call streams a thinking block, then
"42". OpenCode prints a ``reasoning`` line only with ``--thinking``, once the
part has ended (``time.end``).
"""

from __future__ import annotations

import json
from pathlib import Path

from busd_opencode import OpenCodeAdapter

from busd import Emitted, TextComplete, ThinkingComplete, ThinkingDelta, TurnEnd, Usage

CAPTURE = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "sdk"
CAPTURE = CAPTURE / "opencode-run-thinking.jsonl"


def test_a_reasoning_line_is_the_turns_thinking_with_its_duration() -> None:
    raws = [json.loads(line) for line in CAPTURE.read_text().splitlines() if line.strip()]
    assert [r["type"] for r in raws] == ["step_start", "reasoning", "text", "step_finish"]
    t = OpenCodeAdapter().translator()
    out: list[Emitted] = []
    for n, raw in enumerate(raws):
        out += t.feed(raw, n * 0.1)
    out += t.finish(len(raws) * 0.1)
    events = [e.event for e in out]
    thought = "Six times seven: six sevens are forty-two. I will answer with the number only."
    assert [e.text for e in events if type(e) is ThinkingDelta] == [thought]
    (done,) = [e for e in events if type(e) is ThinkingComplete]
    # time.start 1795692284540, time.end 1795692284558 (ms); the signature is the model's.
    assert (done.text, done.duration_s, done.signature) == (thought, 0.018, "sig-msg_turn_2")
    assert [e.text for e in events if type(e) is TextComplete] == ["42"]
    assert events.index(done) < events.index(next(e for e in events if type(e) is TextComplete))
    assert [e.finish_reason for e in events if type(e) is TurnEnd] == ["end_turn"]
    # The stand-in's usage for the call: 14 in, 3,000 written, 95 out (thinking inside:
    # Anthropic does not count it apart, so OpenCode's reasoning is 0). Cost at
    # claude-sonnet-4-5's $3 / $3.75 / $15 per million: 0.000042 + 0.01125 + 0.001425.
    (usage,) = [e for e in events if type(e) is Usage]
    tokens = usage.tokens
    assert (tokens.input_tokens, tokens.cache_write_tokens, tokens.output_tokens) == (14, 3000, 95)
    assert tokens.reasoning_tokens == 0
    assert tokens.cost_usd is not None
    assert abs(tokens.cost_usd - 0.012717) < 1e-9
    stats = t.statistics()
    assert (stats.unknown, stats.malformed) == ({}, {})
