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
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from busd_acp import AcpAdapter

from busd import Emitted, ToolComplete, ToolStart, Usage

CAPTURE = (
    Path(__file__).resolve().parents[3]
    / "tests"
    / "fixtures"
    / "sdk"
    / "acp-claude-agent-acp-two-models.jsonl"
)
SONNET = "claude-sonnet-4-5-20250929"
HAIKU = "claude-haiku-5-5"


def feed() -> tuple[list[Emitted], Any]:
    raws = [json.loads(line) for line in CAPTURE.read_text().splitlines() if line.strip()]
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
