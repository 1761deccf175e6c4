from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from busd.core.errors import BusdError
from busd.core.events import RunFinished, TokenUsage, Usage
from busd.core.usage import (
    PROVIDERS,
    UnknownProvider,
    UsageLedger,
    add_usage,
    cache_hit_percent,
    merge_cumulative,
    normalize_usage,
    read_usage,
    unrecognized_usage,
)

# Usage payloads below are copied from /work/shared/fixtures/sdk (raw SDK streams:
# verbatim public recordings for Anthropic, schema-checked captures for Claude Code,
# Copilot and OpenCode; see that directory's README for provenance).
ANTHROPIC_START = {
    "input_tokens": 12,
    "cache_creation_input_tokens": 0,
    "cache_read_input_tokens": 0,
    "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0},
    "output_tokens": 1,
    "service_tier": "standard",
}
ANTHROPIC_DELTA = {
    "input_tokens": 12,
    "cache_creation_input_tokens": 0,
    "cache_read_input_tokens": 0,
    "output_tokens": 30,
}
CLAUDE_CODE_CALL_1 = [
    {
        "input_tokens": 10,
        "cache_creation_input_tokens": 39452,
        "cache_read_input_tokens": 14926,
        "output_tokens": 4,
    },
    {
        "input_tokens": 10,
        "cache_creation_input_tokens": 39452,
        "cache_read_input_tokens": 14926,
        "output_tokens": 143,
        "output_tokens_details": {"thinking_tokens": 59},
    },
]
CLAUDE_CODE_CALL_2 = [
    {
        "input_tokens": 8,
        "cache_creation_input_tokens": 2474,
        "cache_read_input_tokens": 54340,
        "output_tokens": 3,
    },
    {
        "input_tokens": 8,
        "cache_creation_input_tokens": 2474,
        "cache_read_input_tokens": 54340,
        "output_tokens": 88,
        "output_tokens_details": {"thinking_tokens": 0},
    },
]
CLAUDE_CODE_RESULT = {
    "type": "result",
    "subtype": "success",
    "num_turns": 2,
    "total_cost_usd": 0.12023500000000001,
    "usage": {
        "input_tokens": 18,
        "cache_creation_input_tokens": 41926,
        "cache_read_input_tokens": 69266,
        "output_tokens": 231,
        "output_tokens_details": {"thinking_tokens": 59},
        "server_tool_use": {"web_search_requests": 0, "web_fetch_requests": 0},
    },
}
CLAUDE_CODE_MODEL_USAGE = {  # the result line's "modelUsage"
    "claude-haiku-4-5-20251001": {
        "inputTokens": 18,
        "outputTokens": 231,
        "cacheReadInputTokens": 69266,
        "cacheCreationInputTokens": 41926,
        "costUSD": 0.12023500000000001,
        "thinkingTokens": 59,
    }
}
COPILOT_CALL_1 = {
    "model": "claude-sonnet-4.5",
    "inputTokens": 24939,
    "outputTokens": 98,
    "cacheReadTokens": 21263,
    "cacheWriteTokens": 0,
    "reasoningTokens": 31,
    "cost": 1,
    "duration": 1890,
    "copilotUsage": {"totalNanoAiu": 500000000},
}
COPILOT_CALL_2 = {
    "model": "claude-sonnet-4.5",
    "inputTokens": 25120,
    "outputTokens": 12,
    "cacheReadTokens": 24901,
    "cacheWriteTokens": 0,
    "cost": 1,
    "duration": 1210,
}


def opencode_message(cost: float, tokens: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "msg",
        "role": "assistant",
        "modelID": "claude-sonnet-4-5",
        "cost": cost,
        "tokens": tokens,
    }


OPENCODE_MSG_1_START = opencode_message(
    0, {"input": 0, "output": 0, "reasoning": 0, "cache": {"read": 0, "write": 0}}
)
OPENCODE_MSG_1 = opencode_message(
    0.0071325,
    {
        "total": 21625,
        "input": 20923,
        "output": 154,
        "reasoning": 81,
        "cache": {"read": 467, "write": 0},
    },
)
OPENCODE_MSG_2_START = OPENCODE_MSG_1_START
OPENCODE_MSG_2 = opencode_message(
    0.0009846,
    {
        "total": 21721,
        "input": 38,
        "output": 7,
        "reasoning": 0,
        "cache": {"read": 21676, "write": 0},
    },
)


def as_object(value: Any) -> Any:
    """The same payload as an SDK would hand it over: attributes, not keys."""
    if isinstance(value, dict):
        return SimpleNamespace(**{k: as_object(v) for k, v in value.items()})
    return value


def tokens(
    i: int = 0, o: int = 0, r: int = 0, cr: int = 0, cw: int = 0, cost: float | None = None
) -> TokenUsage:
    return TokenUsage(
        input_tokens=i,
        output_tokens=o,
        reasoning_tokens=r,
        cache_read_tokens=cr,
        cache_write_tokens=cw,
        cost_usd=cost,
    )


both_forms = pytest.mark.parametrize("form", [dict, as_object], ids=["dict", "object"])


# -- normalize_usage: one case per provider, as dicts and as objects ----------

PROVIDER_CASES: list[tuple[str, dict[str, Any], TokenUsage]] = [
    (
        "anthropic",
        {
            "input_tokens": 10,
            "output_tokens": 143,
            "cache_read_input_tokens": 14926,
            "cache_creation_input_tokens": 39452,
            "output_tokens_details": {"thinking_tokens": 59},
        },
        tokens(i=10, o=143, r=59, cr=14926, cw=39452),
    ),
    (
        "openai",
        {
            "prompt_tokens": 1200,
            "completion_tokens": 300,
            "total_tokens": 1500,
            "prompt_tokens_details": {"cached_tokens": 1000, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 200},
        },
        tokens(i=200, o=300, r=200, cr=1000),
    ),
    (
        "openai_responses",
        {
            "input_tokens": 1200,
            "output_tokens": 300,
            "total_tokens": 1500,
            "input_tokens_details": {"cached_tokens": 1000},
            "output_tokens_details": {"reasoning_tokens": 200},
        },
        tokens(i=200, o=300, r=200, cr=1000),
    ),
    (
        "bedrock",
        {
            "inputTokens": 4,
            "outputTokens": 50,
            "totalTokens": 2141,
            "cacheReadInputTokens": 200,
            "cacheWriteInputTokens": 1887,
        },
        tokens(i=4, o=50, cr=200, cw=1887),
    ),
    (
        "bedrock",
        {
            "inputTokens": 4,
            "outputTokens": 50,
            "cacheReadInputTokenCount": 200,
            "cacheWriteInputTokenCount": 1887,
        },
        tokens(i=4, o=50, cr=200, cw=1887),
    ),
    (
        "litellm",
        {
            "prompt_tokens": 41944,
            "completion_tokens": 143,
            "cache_read_input_tokens": 14926,
            "cache_creation_input_tokens": 27008,
            "prompt_tokens_details": {"cached_tokens": 14926},
            "completion_tokens_details": {"reasoning_tokens": 59},
        },
        tokens(i=10, o=143, r=59, cr=14926, cw=27008),
    ),
    (
        "litellm",
        {"prompt_tokens": 50, "completion_tokens": 20, "reasoning_tokens": 5},
        tokens(i=50, o=20, r=5),
    ),
    ("copilot", COPILOT_CALL_1, tokens(i=3676, o=98, r=31, cr=21263)),
    (
        "copilot",
        {
            "input_tokens": 300.0,
            "output_tokens": 12.0,
            "cache_read_tokens": 200.0,
            "cache_write_tokens": 50.0,
            "cost": 1.0,
        },
        tokens(i=50, o=12, cr=200, cw=50),
    ),
    ("opencode", OPENCODE_MSG_2, tokens(i=38, o=7, cr=21676, cost=0.0009846)),
]


@both_forms
@pytest.mark.parametrize(("provider", "payload", "expected"), PROVIDER_CASES)
def test_each_provider_maps_onto_token_usage(
    form: Any, provider: str, payload: dict[str, Any], expected: TokenUsage
) -> None:
    assert normalize_usage(form(payload), provider=provider) == expected


@both_forms
@pytest.mark.parametrize(("provider", "payload", "expected"), PROVIDER_CASES)
def test_provider_is_detected_from_the_keys_present(
    form: Any, provider: str, payload: dict[str, Any], expected: TokenUsage
) -> None:
    assert normalize_usage(form(payload)) == expected


@both_forms
def test_opencode_output_is_the_providers_figure_with_reasoning_beside_it(form: Any) -> None:
    # OpenCode's `total` adds reasoning on top of `output`; busd keeps both as reported.
    usage = normalize_usage(form(OPENCODE_MSG_1))
    assert usage == tokens(i=20923, o=154, r=81, cr=467, cost=0.0071325)
    total = usage.input_tokens + usage.output_tokens + usage.reasoning_tokens
    assert total + usage.cache_read_tokens == 21625


def test_opencode_reasoning_is_not_capped_at_output() -> None:
    payload = {"tokens": {"input": 10, "output": 5, "reasoning": 40, "cache": {}}}
    assert normalize_usage(payload) == tokens(i=10, o=5, r=40)


@dataclass
class AnthropicSdkUsage:
    """Shaped like anthropic.types.Usage: cache fields always present, maybe None."""

    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None
    server_tool_use: object | None = None
    service_tier: str | None = None


def test_sdk_model_with_none_fields_reads_as_anthropic() -> None:
    usage = normalize_usage(AnthropicSdkUsage(input_tokens=12, output_tokens=30))
    assert usage == tokens(i=12, o=30)


def test_anthropic_input_excludes_cache_and_openai_input_is_made_to() -> None:
    # The same call as each side reports it normalizes to the same TokenUsage.
    anthropic = {"input_tokens": 200, "output_tokens": 9, "cache_read_input_tokens": 1000}
    openai = {
        "prompt_tokens": 1200,
        "completion_tokens": 9,
        "prompt_tokens_details": {"cached_tokens": 1000},
    }
    assert normalize_usage(anthropic) == normalize_usage(openai) == tokens(i=200, o=9, cr=1000)


def test_claude_code_result_is_unwrapped_and_priced() -> None:
    assert normalize_usage(CLAUDE_CODE_RESULT) == tokens(
        i=18, o=231, r=59, cr=69266, cw=41926, cost=0.12023500000000001
    )


def test_claude_code_model_usage_entry_reads_as_camel_case() -> None:
    entry = CLAUDE_CODE_MODEL_USAGE["claude-haiku-4-5-20251001"]
    assert normalize_usage(entry) == tokens(
        i=18, o=231, r=59, cr=69266, cw=41926, cost=0.12023500000000001
    )


def test_wrapper_object_with_usage_attribute_is_unwrapped() -> None:
    completion = as_object(
        {"id": "chatcmpl-1", "usage": {"prompt_tokens": 10, "completion_tokens": 2}}
    )
    assert normalize_usage(completion, provider="openai") == tokens(i=10, o=2)


def test_busd_token_usage_and_usage_events_pass_through() -> None:
    usage = tokens(i=1, o=2, r=1, cr=3, cw=4, cost=0.5)
    assert normalize_usage(usage) == usage
    assert normalize_usage(Usage(tokens=usage)) == usage
    assert normalize_usage(RunFinished(status="ok", duration_s=1.0, usage=usage)) == usage
    assert normalize_usage(msgspec.to_builtins(usage), provider="busd") == usage


def test_provider_names_are_forgiving_about_case_and_dashes() -> None:
    payload = {
        "input_tokens": 100,
        "output_tokens": 1,
        "input_tokens_details": {"cached_tokens": 60},
    }
    assert normalize_usage(payload, provider="OpenAI-Responses") == tokens(i=40, o=1, cr=60)
    assert normalize_usage(payload, provider="responses") == tokens(i=40, o=1, cr=60)


def test_explicit_provider_wins_over_detection() -> None:
    # Read as Anthropic, input_tokens is already uncached: the details are not subtracted.
    payload = {
        "input_tokens": 100,
        "output_tokens": 1,
        "input_tokens_details": {"cached_tokens": 60},
    }
    assert normalize_usage(payload, provider="anthropic") == tokens(i=100, o=1)


def test_unknown_provider_name_is_a_clear_error() -> None:
    with pytest.raises(UnknownProvider, match="mistral") as info:
        normalize_usage({}, provider="mistral")
    assert isinstance(info.value, BusdError)
    assert isinstance(info.value, ValueError)
    assert "opencode" in str(info.value)
    assert "opencode" in PROVIDERS


# -- normalize_usage: malformed fields and cost -------------------------------


@pytest.mark.parametrize(
    "bad", [None, -1, -5.0, 1.5, True, False, "12", math.nan, math.inf, 2**64, [3], {"n": 3}]
)
def test_malformed_count_is_zero(bad: object) -> None:
    usage = normalize_usage({"input_tokens": bad, "output_tokens": 7})
    assert usage == tokens(o=7)


def test_float_with_integral_value_is_a_count() -> None:
    assert normalize_usage({"inputTokens": 24939.0, "outputTokens": 98.0}) == tokens(i=24939, o=98)


def test_cache_larger_than_prompt_leaves_no_negative_input() -> None:
    usage = normalize_usage({"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 50}})
    assert usage == tokens(i=0, cr=50)


def test_reasoning_never_exceeds_output() -> None:
    usage = normalize_usage({"prompt_tokens": 1, "completion_tokens": 5, "reasoning_tokens": 9})
    assert usage.reasoning_tokens == 5


@pytest.mark.parametrize(
    "payload",
    [
        {"input_tokens": 1, "output_tokens": 1},
        {"input_tokens": 1, "output_tokens": 1, "cost": None},
        {"input_tokens": 1, "output_tokens": 1, "cost": "0.10"},
        {"input_tokens": 1, "output_tokens": 1, "cost": -0.1},
        {"input_tokens": 1, "output_tokens": 1, "cost": math.nan},
        {"input_tokens": 1, "output_tokens": 1, "cost": True},
        {"input_tokens": 1, "output_tokens": 1, "cost": {"amount": 0.1, "currency": "EUR"}},
        COPILOT_CALL_1,
    ],
)
def test_cost_that_is_not_usd_stays_unknown(payload: dict[str, Any]) -> None:
    assert normalize_usage(payload).cost_usd is None


@pytest.mark.parametrize(
    ("payload", "cost"),
    [
        ({"input_tokens": 1, "cost_usd": 0.25}, 0.25),
        ({"input_tokens": 1, "total_cost_usd": 1}, 1.0),
        ({"input_tokens": 1, "cost": 0}, 0.0),
        ({"input_tokens": 1, "cost": {"amount": 0.0123, "currency": "USD"}}, 0.0123),
        ({**COPILOT_CALL_1, "cost_usd": 0.02}, 0.02),
    ],
)
def test_explicit_usd_cost_is_taken(payload: dict[str, Any], cost: float) -> None:
    assert normalize_usage(payload).cost_usd == cost


@pytest.mark.parametrize(
    "payload",
    [
        {"inputTokens": 10, "outputTokens": 2, "cost": 1},
        {"input_tokens": 10.0, "output_tokens": 2.0, "cost": 1.0, "api_call_id": "msg_1"},
    ],
)
def test_copilot_cost_multiplier_is_not_money(payload: dict[str, Any]) -> None:
    assert normalize_usage(payload) == tokens(i=10, o=2)
    assert normalize_usage(as_object(payload)) == tokens(i=10, o=2)
    assert normalize_usage(payload, provider="copilot") == tokens(i=10, o=2)


json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5)
usage_keys = st.sampled_from(
    [
        "input_tokens",
        "output_tokens",
        "prompt_tokens",
        "completion_tokens",
        "inputTokens",
        "outputTokens",
        "cacheReadTokens",
        "cacheReadInputTokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
        "prompt_tokens_details",
        "input_tokens_details",
        "output_tokens_details",
        "completion_tokens_details",
        "cached_tokens",
        "reasoning_tokens",
        "thinking_tokens",
        "tokens",
        "input",
        "output",
        "reasoning",
        "cache",
        "read",
        "write",
        "total",
        "usage",
        "cost",
        "cost_usd",
        "total_cost_usd",
        "amount",
        "currency",
    ]
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(usage_keys | st.text(max_size=3), children, max_size=6)
    ),
    max_leaves=25,
)


@given(json_values, st.sampled_from([None, *PROVIDERS]), st.booleans())
def test_any_json_value_gives_a_valid_token_usage(
    payload: Any, provider: str | None, as_attributes: bool
) -> None:
    if as_attributes:
        payload = as_object(payload)
    usage = normalize_usage(payload, provider=provider)
    counts = msgspec.structs.astuple(usage)[:5]
    assert all(type(n) is int and 0 <= n < 2**63 for n in counts)
    assert usage.reasoning_tokens <= usage.output_tokens
    assert usage.cost_usd is None or (math.isfinite(usage.cost_usd) and usage.cost_usd >= 0)
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(usage), type=TokenUsage) == usage


def test_objects_that_raise_on_attribute_access_give_zeros() -> None:
    class Hostile:
        def __getattr__(self, name: str) -> Any:
            raise RuntimeError(name)

    assert normalize_usage(Hostile()) == TokenUsage()


# -- merge_cumulative and add_usage -------------------------------------------

counts = st.integers(min_value=0, max_value=10**9)
costs = st.none() | st.floats(min_value=0, max_value=100, allow_nan=False)
usages = st.builds(tokens, counts, counts, counts, counts, counts, costs)


def test_merge_takes_the_field_wise_max() -> None:
    a = tokens(i=12, o=1, cr=5, cost=None)
    b = tokens(i=0, o=30, cw=2, cost=0.1)
    assert merge_cumulative(a, b) == tokens(i=12, o=30, cr=5, cw=2, cost=0.1)
    assert merge_cumulative(tokens(cost=0.3), tokens(cost=0.2)).cost_usd == 0.3
    assert merge_cumulative(tokens(o=1), tokens(o=2)).cost_usd is None


@given(usages, usages, usages)
def test_merge_is_a_semilattice(a: TokenUsage, b: TokenUsage, c: TokenUsage) -> None:
    assert merge_cumulative(a, b) == merge_cumulative(b, a)
    ab, bc = merge_cumulative(a, b), merge_cumulative(b, c)
    assert merge_cumulative(ab, c) == merge_cumulative(a, bc)
    assert merge_cumulative(a, a) == a
    assert merge_cumulative(a, TokenUsage()) == a


def test_add_sums_fields_and_unknown_cost_wins() -> None:
    a = tokens(i=1, o=98, r=31, cr=10, cw=1, cost=0.5)
    b = tokens(i=2, o=12, cr=20, cost=0.25)
    assert add_usage(a, b) == tokens(i=3, o=110, r=31, cr=30, cw=1, cost=0.75)
    assert add_usage(a, tokens(o=1)).cost_usd is None
    assert add_usage(tokens(o=1), a).cost_usd is None


def test_empty_usage_is_the_identity_of_add() -> None:
    a = tokens(o=5, cost=0.5)
    assert add_usage(TokenUsage(), a) == a
    assert add_usage(a, TokenUsage()) == a


@given(usages, usages, usages)
def test_add_is_commutative_and_associative(a: TokenUsage, b: TokenUsage, c: TokenUsage) -> None:
    ab_c = add_usage(add_usage(a, b), c)
    a_bc = add_usage(a, add_usage(b, c))
    assert add_usage(a, b) == add_usage(b, a)
    assert msgspec.structs.astuple(ab_c)[:5] == msgspec.structs.astuple(a_bc)[:5]
    assert (ab_c.cost_usd is None) == (a_bc.cost_usd is None)
    if ab_c.cost_usd is not None and a_bc.cost_usd is not None:
        assert ab_c.cost_usd == pytest.approx(a_bc.cost_usd)


# -- UsageLedger ----------------------------------------------------------------


def record(ledger: UsageLedger, turn: str, usage: TokenUsage, *, cumulative: bool) -> bool:
    return ledger.record(
        session_id="s", run_id="r", turn_id=turn, usage=usage, cumulative=cumulative
    )


def test_anthropic_message_delta_is_cumulative_not_added() -> None:
    ledger = UsageLedger()
    record(ledger, "msg_1", normalize_usage(ANTHROPIC_START), cumulative=True)
    record(ledger, "msg_1", normalize_usage(ANTHROPIC_DELTA), cumulative=True)
    assert ledger.turn("s", "msg_1") == tokens(i=12, o=30)
    assert ledger.session_total("s") == tokens(i=12, o=30)
    assert ledger.run_total("r") == tokens(i=12, o=30)


def test_delta_without_input_keeps_the_input_from_message_start() -> None:
    ledger = UsageLedger()
    record(ledger, "m", tokens(i=12, o=1), cumulative=True)
    record(ledger, "m", tokens(o=30), cumulative=True)
    assert ledger.turn("s", "m") == tokens(i=12, o=30)


def test_claude_code_two_model_calls_sum_their_final_counts() -> None:
    ledger = UsageLedger()
    for turn, snapshots in (("call_1", CLAUDE_CODE_CALL_1), ("call_2", CLAUDE_CODE_CALL_2)):
        for snapshot in snapshots:
            record(ledger, turn, normalize_usage(snapshot), cumulative=True)
    # A stale per-block snapshot (output 4) arriving late changes nothing.
    assert not record(ledger, "call_1", normalize_usage(CLAUDE_CODE_CALL_1[0]), cumulative=True)
    result = normalize_usage(CLAUDE_CODE_RESULT)
    total = ledger.session_total("s")
    assert total.output_tokens == 231 == result.output_tokens
    assert total.reasoning_tokens == 59
    assert total.input_tokens == 18
    assert total.cache_read_tokens == 69266
    assert total.cache_write_tokens == 41926
    assert total.cost_usd is None


def test_opencode_tokens_restart_at_the_next_message() -> None:
    ledger = UsageLedger()
    for turn, info in (
        ("msg_1", OPENCODE_MSG_1_START),
        ("msg_1", OPENCODE_MSG_1),
        ("msg_1", OPENCODE_MSG_1),
        ("msg_2", OPENCODE_MSG_2_START),
        ("msg_2", OPENCODE_MSG_2),
    ):
        record(ledger, turn, normalize_usage(info), cumulative=True)
    total = ledger.session_total("s")
    assert total.output_tokens == 154 + 7
    assert total.reasoning_tokens == 81
    assert total.cost_usd == pytest.approx(0.0081171)


def test_plain_cumulative_counts_of_two_messages_add_up() -> None:
    ledger = UsageLedger()
    for n in (0, 100, 154, 154):
        record(ledger, "msg_1", tokens(o=n), cumulative=True)
    for n in (0, 7):
        record(ledger, "msg_2", tokens(o=n), cumulative=True)
    assert ledger.session_total("s").output_tokens == 161
    assert ledger.turn("s", "msg_2").output_tokens == 7


def test_copilot_usage_per_call_is_added() -> None:
    ledger = UsageLedger()
    record(ledger, "turn_1", normalize_usage(COPILOT_CALL_1), cumulative=False)
    record(ledger, "turn_1", normalize_usage(COPILOT_CALL_2), cumulative=False)
    total = ledger.session_total("s")
    assert total.output_tokens == 98 + 12 == 110
    assert total.reasoning_tokens == 31
    assert total.input_tokens == (24939 - 21263) + (25120 - 24901)
    assert total.cost_usd is None
    assert ledger.turn("s", "turn_1") == total


def test_repeated_snapshot_reports_no_change_and_is_counted() -> None:
    ledger = UsageLedger()
    assert record(ledger, "t", tokens(o=5), cumulative=True)
    assert not record(ledger, "t", tokens(o=5), cumulative=True)
    assert not record(ledger, "t", tokens(o=3), cumulative=True)
    stats = ledger.statistics()
    assert (stats.records, stats.unchanged) == (3, 2)


def test_cost_becoming_known_is_a_change_even_at_zero() -> None:
    ledger = UsageLedger()
    record(ledger, "t", tokens(o=5), cumulative=True)
    assert record(ledger, "t", tokens(o=5, cost=0.0), cumulative=True)
    assert ledger.session_total("s").cost_usd == 0.0
    assert not record(ledger, "t", tokens(cost=0.0), cumulative=False)


def test_total_cost_covers_priced_turns_and_never_turns_unknown() -> None:
    ledger = UsageLedger()
    record(ledger, "t1", tokens(o=5, cost=0.5), cumulative=True)
    record(ledger, "t2", tokens(o=5), cumulative=True)
    assert ledger.session_total("s").cost_usd == 0.5
    assert ledger.turn("s", "t2").cost_usd is None
    record(ledger, "t2", tokens(o=5, cost=0.25), cumulative=False)
    assert ledger.session_total("s").cost_usd == 0.75


def test_runs_and_sessions_are_totalled_separately() -> None:
    ledger = UsageLedger()
    ledger.record(session_id="a", run_id="r1", turn_id="t1", usage=tokens(o=1), cumulative=True)
    ledger.record(session_id="b", run_id="r1", turn_id="t1", usage=tokens(o=2), cumulative=True)
    ledger.record(session_id="b", run_id="r2", turn_id="t2", usage=tokens(o=4), cumulative=True)
    ledger.record(session_id="b", run_id=None, turn_id="t3", usage=tokens(o=8), cumulative=True)
    assert ledger.session_total("a").output_tokens == 1
    assert ledger.session_total("b").output_tokens == 14
    assert ledger.run_total("r1").output_tokens == 3
    assert ledger.run_total("r2").output_tokens == 4
    assert ledger.run_total("nope") == TokenUsage()
    assert ledger.session_total("nope") == TokenUsage()
    assert ledger.turn("a", "nope") == TokenUsage()


def test_a_turn_stays_with_the_run_of_its_first_record() -> None:
    ledger = UsageLedger()
    ledger.record(session_id="s", run_id="r1", turn_id="t", usage=tokens(o=1), cumulative=True)
    ledger.record(session_id="s", run_id="r2", turn_id="t", usage=tokens(o=5), cumulative=True)
    assert ledger.run_total("r1").output_tokens == 5
    assert ledger.run_total("r2") == TokenUsage()


def test_old_turns_are_forgotten_but_their_counts_stay_in_the_totals() -> None:
    ledger = UsageLedger(turns_per_session=2)
    for i in range(5):
        record(ledger, f"t{i}", tokens(o=10), cumulative=True)
    assert ledger.statistics().turns == 2
    assert ledger.statistics().forgotten_turns == 3
    assert ledger.turn("s", "t0") == TokenUsage()
    assert ledger.turn("s", "t4").output_tokens == 10
    assert ledger.session_total("s").output_tokens == 50
    # A late snapshot for a forgotten turn must not restart it from zero.
    assert not record(ledger, "t2", tokens(o=11), cumulative=True)
    assert ledger.session_total("s").output_tokens == 50
    assert ledger.statistics().late == 1


def test_forgetting_sessions_and_runs_frees_them() -> None:
    ledger = UsageLedger()
    record(ledger, "t", tokens(o=1), cumulative=True)
    ledger.forget_session("s")
    ledger.forget_run("r")
    ledger.forget_run("never-seen")
    stats = ledger.statistics()
    assert (stats.sessions, stats.runs, stats.turns) == (0, 0, 0)
    assert ledger.session_total("s") == TokenUsage()


def test_turns_per_session_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        UsageLedger(turns_per_session=0)


def test_negative_counts_in_a_hand_built_usage_are_ignored() -> None:
    ledger = UsageLedger()
    record(ledger, "t", tokens(o=5), cumulative=True)
    record(ledger, "t", tokens(o=-50, i=-1), cumulative=False)
    assert ledger.session_total("s") == tokens(o=5)


def leq(a: TokenUsage, b: TokenUsage) -> bool:
    fields = msgspec.structs.astuple(a)[:5], msgspec.structs.astuple(b)[:5]
    if not all(x <= y for x, y in zip(*fields, strict=True)):
        return False
    return a.cost_usd is None or (b.cost_usd is not None and a.cost_usd <= b.cost_usd + 1e-9)


turn_snapshots = st.lists(usages, min_size=1, max_size=4)


@given(
    st.dictionaries(st.sampled_from(["t1", "t2", "t3"]), turn_snapshots, min_size=1),
    st.randoms(use_true_random=False),
)
def test_totals_are_monotonic_under_repeated_and_out_of_order_snapshots(
    turns: dict[str, list[TokenUsage]], rnd: Any
) -> None:
    deliveries = [(turn, u) for turn, snapshots in turns.items() for u in snapshots]
    deliveries += rnd.choices(deliveries, k=len(deliveries))  # repeats
    rnd.shuffle(deliveries)
    ledger = UsageLedger()
    previous = TokenUsage()
    for turn, usage in deliveries:
        record(ledger, turn, usage, cumulative=True)
        current = ledger.session_total("s")
        assert leq(previous, current)
        previous = current
    finals = {turn: TokenUsage() for turn in turns}
    for turn, usage in deliveries:
        finals[turn] = merge_cumulative(finals[turn], usage)
    expected = TokenUsage()
    for final in finals.values():
        expected = add_usage(expected, msgspec.structs.replace(final, cost_usd=None))
    total = ledger.session_total("s")
    assert msgspec.structs.astuple(total)[:5] == msgspec.structs.astuple(expected)[:5]
    assert ledger.run_total("r") == total
    known = [f.cost_usd for f in finals.values() if f.cost_usd is not None]
    if known:
        assert total.cost_usd == pytest.approx(sum(known))
    else:
        assert total.cost_usd is None


# -- issue 16: Gemini's usageMetadata, litellm's cache spellings, unknown shapes --

USAGE_FIXTURES = Path(__file__).resolve().parent / "fixtures" / "usage"


def _fixture(name: str) -> Any:
    return json.loads((USAGE_FIXTURES / name).read_text())


def test_gemini_usage_metadata_of_a_recorded_reasoning_response() -> None:
    """gemini-3-pro-preview: prompt 9, candidates 29, thoughts 282, total 320.

    Output is what Gemini bills as output, candidates + thoughts = 29 + 282 = 311,
    with the thoughts inside as reasoning; 9 + 311 = 320 = totalTokenCount.
    """
    response = _fixture("gemini-reasoning.json")
    usage = normalize_usage(response)  # the response wraps it in usageMetadata
    assert usage == tokens(i=9, o=29 + 282, r=282)
    assert normalize_usage(response["usageMetadata"], provider="gemini") == usage
    assert usage.input_tokens + usage.output_tokens == 320


def test_gemini_tool_use_prompt_is_input() -> None:
    """A hosted tool's prompt (toolUsePromptTokenCount 65) is input beside the prompt (12).

    input 12 + 65 = 77, output 60 + 82 = 142; 77 + 142 = 219 = totalTokenCount.
    """
    usage = normalize_usage(_fixture("gemini-usage-raw-live.json"))
    assert usage == tokens(i=12 + 65, o=60 + 82, r=82)


def test_gemini_cached_content_is_inside_the_prompt_count() -> None:
    """prompt 19 holds the 3 cached tokens: uncached input 19 + 63 (tool) - 3 = 79.

    79 + 3 (cache read) + 4 + 56 (output) = 142 = totalTokenCount.
    """
    usage = normalize_usage(_fixture("gemini-complete-usage.json"), provider="google")
    assert usage == tokens(i=19 + 63 - 3, o=4 + 56, r=56, cr=3)


def test_litellm_cache_read_and_creation_spellings_are_cached_not_uncached() -> None:
    """litellm's cache_read_tokens / cache_creation_tokens are inside prompt_tokens.

    Constructed (the recordings in tests/fixtures/usage/litellm-*.sse carry
    these names only as 0, and the read under ``cached_tokens``): prompt 1000
    of which 800 read and 150 written, so uncached 50.
    """
    payload = {
        "prompt_tokens": 1000,
        "completion_tokens": 20,
        "cache_read_tokens": 800,
        "cache_creation_tokens": 150,
    }
    assert normalize_usage(payload, provider="litellm") == tokens(i=50, o=20, cr=800, cw=150)
    assert normalize_usage(payload) == tokens(i=50, o=20, cr=800, cw=150)
    nested = {
        "prompt_tokens": 1000,
        "completion_tokens": 20,
        "prompt_tokens_details": {"cache_read_tokens": 800, "cache_creation_tokens": 150},
    }
    assert normalize_usage(nested, provider="litellm") == tokens(i=50, o=20, cr=800, cw=150)


def _sse_usages(name: str) -> list[Any]:
    """The ``usage`` of every ``data:`` line of a recorded SSE stream."""
    usages = []
    for line in (USAGE_FIXTURES / name).read_text().splitlines():
        if line.startswith("data: {"):
            chunk = json.loads(line.removeprefix("data: "))
            if chunk.get("usage") is not None:
                usages.append(chunk["usage"])
    return usages


def test_a_recorded_litellm_cache_hit_is_read_as_cache_not_as_uncached_input() -> None:
    """A real LiteLLM proxy in front of claude-opus-4-7, a cache hit.

    It reports both spellings: OpenAI's ``prompt_tokens`` 13,976 with
    ``prompt_tokens_details.cached_tokens`` 13,965 inside it, and Anthropic's
    ``cache_read_input_tokens`` 13,965 at the top. The read is inside the
    prompt count, not beside it: uncached 13,976 - 13,965 = 11 (the
    ``text_tokens`` it reports), never 13,976, and never 13,976 + 13,965.
    """
    before = unrecognized_usage()
    (usage,) = _sse_usages("litellm-cache-hit.sse")
    expected = tokens(i=11, o=8, cr=13_965)
    assert normalize_usage(usage) == expected
    assert normalize_usage(usage, provider="litellm") == expected
    assert read_usage({"usage": usage}) == expected
    assert usage["prompt_tokens_details"]["text_tokens"] == 11
    assert usage["total_tokens"] == 11 + 13_965 + 8
    assert unrecognized_usage() == before


def test_a_recorded_litellm_stream_without_cache_is_its_prompt_and_completion() -> None:
    """The same proxy with nothing cached: every cache field present and 0.

    The usage arrives in a chunk that still has a choice (``delta: {}``);
    17 prompt + 4 completion = 21 total.
    """
    (usage,) = _sse_usages("litellm-stream.sse")
    assert normalize_usage(usage, provider="litellm") == tokens(i=17, o=4)
    assert read_usage(usage) == tokens(i=17, o=4)


def test_an_unrecognised_usage_shape_is_reported_never_read_as_zeros(
    caplog: pytest.LogCaptureFixture,
) -> None:
    odd = {"inTok": 12, "outTok": 30}
    before = unrecognized_usage()
    with caplog.at_level(logging.WARNING, logger="busd.core.usage"):
        assert read_usage(odd) is None
        assert read_usage({"usage": odd}) is None
    assert unrecognized_usage() == before + 2
    assert "unrecognised shape" in caplog.text
    assert "inTok" in caplog.text
    normalize_usage(odd)  # compatible: still zeros, but counted
    assert unrecognized_usage() == before + 3
    # Known shapes and "no usage at all" are not reports.
    assert read_usage(None) is None
    assert read_usage({}) == TokenUsage()
    assert read_usage(_fixture("gemini-reasoning.json")) == tokens(i=9, o=311, r=282)
    assert unrecognized_usage() == before + 3


def test_cache_hit_percent_is_reads_over_the_whole_prompt() -> None:
    assert cache_hit_percent(TokenUsage()) is None  # no prompt, no ratio (not 0%)
    assert cache_hit_percent(TokenUsage(output_tokens=5)) is None
    tokens = TokenUsage(input_tokens=10, cache_read_tokens=80, cache_write_tokens=10)
    assert cache_hit_percent(tokens) == 80.0
    assert cache_hit_percent(TokenUsage(input_tokens=10)) == 0.0
