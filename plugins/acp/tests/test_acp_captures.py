"""The ACP adapter on real agents' connections, recorded against a stand-in model.

tests/fixtures/sdk/acp-claude-agent-acp.jsonl is claude-agent-acp 0.101.0
and acp-opencode-acp.jsonl is ``opencode acp`` (OpenCode 1.18.33), each
given one prompt that makes one ``Bash``/``bash`` call (``echo hello``)
before answering (provenance in the README there). The stand-in numbers
its calls and gives the n-th: input 10 + n, cache write 1000 * n, cache
read 500 * (n - 1), output 20 + n.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

from busd_acp import AcpAdapter

from busd import (
    ContextWindow,
    Emitted,
    Envelope,
    Event,
    SessionContext,
    ToolComplete,
    TurnEnd,
    Usage,
)

E = TypeVar("E", bound=Event)
SDK = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "sdk"


def of(out: list[Emitted], cls: type[E]) -> list[E]:
    return [e.event for e in out if isinstance(e.event, cls)]


def feed(name: str) -> tuple[list[Emitted], Any]:
    raws = [json.loads(line) for line in (SDK / name).read_text().splitlines() if line.strip()]
    t = AcpAdapter().translator()
    out: list[Emitted] = []
    for n, raw in enumerate(raws):
        out += t.feed(raw, n * 0.1)
    out += t.finish(len(raws) * 0.1)
    return out, t.statistics()


def context_after(out: list[Emitted]) -> int:
    """What the core's context window shows once it has seen the adapter's events."""
    window = ContextWindow()
    for seq, item in enumerate(out, 1):
        window.observe(Envelope(seq, 0.0, item.event, item.session_id))
    return window.used


def test_claude_agent_acp_usage_comes_from_the_prompt_response_meta() -> None:
    """``_meta.quota.model_usage`` counts every call the turn made; ``usage`` the main loop.

    The turn made calls 1 (a side call before the main loop), 2 (the tool call)
    and 3 (the answer); ``model_usage`` covers all three, ``usage`` only 2 and 3:
    input 11 + 12 + 13 = 36 (main loop 12 + 13 = 25), output 21 + 22 + 23 = 66,
    cache writes 1000 + 2000 + 3000 = 6000, cache reads 0 + 500 + 1000 = 1500.
    The cost is the last ``usage_update``'s, the session's: 0.031764 USD.
    """
    out, stats = feed("acp-claude-agent-acp.jsonl")
    assert (stats.unknown, stats.malformed, stats.duplicates) == ({}, {}, 0)
    assert [e.finish_reason for e in of(out, TurnEnd)] == ["end_turn"]
    (tool,) = of(out, ToolComplete)
    assert tool.status == "ok"
    (usage,) = of(out, Usage)
    assert usage.tokens.input_tokens == 36
    assert usage.tokens.output_tokens == 66
    assert usage.tokens.cache_write_tokens == 6000
    assert usage.tokens.cache_read_tokens == 1500
    assert usage.tokens.cost_usd == 0.031764


def test_claude_agent_acp_usage_breaks_down_by_model() -> None:
    """Each ``model_usage`` row names its model: here one, ``claude-opus-5-5``,
    with calls 1 + 2 + 3 (input 11 + 12 + 13 = 36, output 21 + 22 + 23 = 66,
    cache writes 1000 + 2000 + 3000 = 6000, reads 0 + 500 + 1000 = 1500). The
    rows carry no cost (only the session's ``usage_update`` does), so the
    model's cost is unknown, not 0."""
    out, _ = feed("acp-claude-agent-acp.jsonl")
    (usage,) = of(out, Usage)
    assert list(usage.models) == ["claude-opus-5-5"]
    opus = usage.models["claude-opus-5-5"]
    assert (opus.input_tokens, opus.output_tokens) == (11 + 12 + 13, 21 + 22 + 23)
    assert (opus.cache_write_tokens, opus.cache_read_tokens) == (6000, 0 + 500 + 1000)
    assert opus.cost_usd is None
    assert opus.output_tokens == usage.tokens.output_tokens  # one model: all of it


def test_model_usage_rows_add_up_per_model_across_turns() -> None:
    """Constructed from the capture's row shape: turn 1 used two models, turn 2
    one of them; turn 1 reported twice (the repeat adds nothing). Sonnet:
    output 40 + 5 = 45; haiku: 3; all models: 48."""
    from busd_acp.usage import ModelBreakdown, turn_models

    def result(*rows: tuple[str, int]) -> dict[str, Any]:
        usage = [
            {"model": m, "token_count": {"inputTokens": 1, "outputTokens": n, "totalTokens": 1 + n}}
            for m, n in rows
        ]
        return {"stopReason": "end_turn", "_meta": {"quota": {"model_usage": usage}}}

    breakdown = ModelBreakdown()
    breakdown.record("t1", turn_models(result(("sonnet", 40), ("haiku", 3))))
    breakdown.record("t1", turn_models(result(("sonnet", 40), ("haiku", 3))))
    breakdown.record("t2", turn_models(result(("sonnet", 5))))
    totals = breakdown.totals()
    assert {m: u.output_tokens for m, u in totals.items()} == {"sonnet": 40 + 5, "haiku": 3}
    assert {m: u.input_tokens for m, u in totals.items()} == {"sonnet": 1 + 1, "haiku": 1}
    assert sum(u.output_tokens for u in totals.values()) == 48
    # A row that names no model counts in the total but not in the breakdown.
    assert turn_models(result(("", 7))) == {}


def test_claude_agent_acp_context_is_the_agents_figure_not_the_summed_turn() -> None:
    """The last ``usage_update`` says used 4,036 of 1,000,000: call 3's input
    13 + 3000 + 1000 plus its output 23. The turn's summed usage would put the
    window at 36 + 1500 + 6000 + 66 = 7,602; the agent's figure wins."""
    out, _ = feed("acp-claude-agent-acp.jsonl")
    reported = of(out, SessionContext)
    assert [c.used for c in reported] == [2513, 2534, 4014, 4036, 4036, 4036]
    assert {c.window for c in reported} == {1_000_000}
    last_usage = max(i for i, e in enumerate(out) if isinstance(e.event, Usage))
    assert isinstance(out[last_usage + 1].event, SessionContext)
    assert context_after(out) == 4036


def test_opencode_acp_usage_and_context() -> None:
    """OpenCode's prompt response ``usage`` is its last message's (one model call:
    call 3, input 13, output 23, cache read 1000, write 3000), and its
    ``usage_update`` says used 4,013 = 13 + 3000 + 1000 (input only) of 1,000,000,
    cost 0.01995 (0.008016 + 0.011934, both calls)."""
    out, stats = feed("acp-opencode-acp.jsonl")
    assert (stats.unknown, stats.malformed, stats.duplicates) == ({}, {}, 0)
    (usage,) = of(out, Usage)
    assert usage.tokens.input_tokens == 13
    assert usage.tokens.output_tokens == 23
    assert usage.tokens.cache_read_tokens == 1000
    assert usage.tokens.cache_write_tokens == 3000
    assert usage.tokens.cost_usd == 0.019950000000000002
    assert [c.used for c in of(out, SessionContext)] == [4013, 4013]
    assert context_after(out) == 4013


def test_a_codex_shaped_token_count_counts_cached_input_inside_the_input() -> None:
    """Constructed by hand (no codex-acp capture): codex's ``token_count`` has
    ``totalTokens`` = input + output, cached input inside the input, so
    19,146 input with 9,984 cached is 9,162 uncached; reasoning 7 is its own."""
    from busd_acp.usage import turn_usage

    count = {
        "totalTokens": 19151,
        "inputTokens": 19146,
        "cachedInputTokens": 9984,
        "outputTokens": 5,
        "reasoningOutputTokens": 7,
    }
    tokens = turn_usage({"stopReason": "end_turn", "_meta": {"quota": {"token_count": count}}})
    assert tokens is not None
    assert (tokens.input_tokens, tokens.cache_read_tokens) == (19146 - 9984, 9984)
    assert (tokens.output_tokens, tokens.reasoning_tokens) == (5, 7)


def test_the_meta_of_an_sdk_prompt_response_is_read_too() -> None:
    """The ``agent-client-protocol`` package dumps ``_meta`` as ``field_meta``."""
    from acp.schema import PromptResponse
    from busd_acp.usage import turn_usage

    from busd import as_mapping

    raw = json.loads((SDK / "acp-claude-agent-acp.jsonl").read_text().splitlines()[-1])
    response = as_mapping(PromptResponse.model_validate(raw["result"]))
    assert "field_meta" in response
    tokens = turn_usage(response)
    assert tokens is not None
    assert (tokens.input_tokens, tokens.output_tokens) == (36, 66)
