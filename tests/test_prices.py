"""The price table and ccusage's pricing rules, checked against the real ccusage 17.2.1.

The rules are tested on small tables made here; the shipped table against
what ``contrib/agents/update_prices.py`` regenerates from the installed
ccusage; and busd's costs against ``ccusage session --offline --json`` run
on a synthetic Claude Code transcript directory.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest

from busd.core.events import TokenUsage
from busd.core.prices import (
    TIER_THRESHOLD,
    ModelPrice,
    PriceTable,
    bundled_table,
    cost_usd,
    price_of,
)

ROOT = Path(__file__).resolve().parent.parent
AGENTS = ROOT / "contrib" / "agents"
CCUSAGE = AGENTS / "node_modules" / ".bin" / "ccusage"
UPDATE = AGENTS / "update_prices.py"
NODE = shutil.which("node")

needs_ccusage = pytest.mark.skipif(
    not CCUSAGE.exists() or NODE is None,
    reason="ccusage is not installed (run `npm ci` in contrib/agents; needs Node.js)",
)


def _table(models: dict[str, dict[str, float]], prefixes: list[str] | None = None) -> PriceTable:
    doc = {
        "source": "test",
        "source_url": "https://example.invalid/prices.json",
        "ccusage_version": "0",
        "date": "2026-01-01",
        "generator": "test",
        "provider_prefixes": ["anthropic/", "claude-"] if prefixes is None else prefixes,
        "models": models,
    }
    return PriceTable(json.dumps(doc))


FLAT = {
    "input_cost_per_token": 1e-6,
    "output_cost_per_token": 2e-6,
    "cache_creation_input_token_cost": 3e-6,
    "cache_read_input_token_cost": 4e-6,
}
TIERED = FLAT | {
    "input_cost_per_token_above_200k_tokens": 10e-6,
    "output_cost_per_token_above_200k_tokens": 20e-6,
    "cache_creation_input_token_cost_above_200k_tokens": 30e-6,
    "cache_read_input_token_cost_above_200k_tokens": 40e-6,
}


# --- matching --------------------------------------------------------------------------------


def test_an_exact_name_wins_over_a_prefixed_one_and_over_fuzzy_matches() -> None:
    table = _table({"claude-x-1-long": TIERED, "anthropic/x-1": TIERED, "x-1": FLAT})
    found = table.price_of("x-1")
    assert found is not None
    assert found.model == "x-1"


def test_prefixes_are_tried_in_the_tables_order() -> None:
    table = _table({"claude-x-1": FLAT, "anthropic/x-1": TIERED})
    found = table.price_of("x-1")
    assert found is not None
    assert found.model == "anthropic/x-1"


def test_a_name_behind_a_prefix_is_found_before_fuzzy_matching() -> None:
    table = _table({"x-1-preview": TIERED, "claude-x-1": FLAT})
    found = table.price_of("x-1")
    assert found is not None
    assert found.model == "claude-x-1"


def test_exact_and_prefixed_lookups_are_case_sensitive_fuzzy_is_not() -> None:
    table = _table({"zzz-claude-x-1-v1": TIERED, "claude-x-1": FLAT})
    found = table.price_of("Claude-X-1")
    assert found is not None
    assert found.model == "zzz-claude-x-1-v1"  # not the exact key: first fuzzy hit in order


def test_fuzzy_takes_the_first_entry_in_table_order_either_way_round() -> None:
    table = _table({"claude-x-1": FLAT, "claude-x-1-20250101": TIERED})
    dated = table.price_of("claude-x-1-20991231")  # a key inside the name
    short = table.price_of("x-1-2025")  # the name inside a key
    assert dated is not None
    assert dated.model == "claude-x-1"
    assert short is not None
    assert short.model == "claude-x-1-20250101"


def test_unknown_and_empty_names_have_no_price() -> None:
    table = _table({"claude-x-1": FLAT})
    assert table.price_of("gpt-5") is None
    assert table.price_of("") is None
    assert table.cost_usd("gpt-5", TokenUsage(input_tokens=1)) is None
    assert table.cost_usd("", TokenUsage()) is None


# --- cost ------------------------------------------------------------------------------------


def test_each_field_has_its_own_price() -> None:
    table = _table({"m": FLAT})
    usage = TokenUsage(
        input_tokens=1, output_tokens=10, cache_write_tokens=100, cache_read_tokens=1000
    )
    assert table.cost_usd("m", usage) == pytest.approx(1e-6 + 20e-6 + 300e-6 + 4000e-6, rel=1e-12)


def test_reasoning_tokens_are_inside_the_output_and_not_priced_again() -> None:
    table = _table({"m": FLAT})
    plain = table.cost_usd("m", TokenUsage(output_tokens=100))
    assert table.cost_usd("m", TokenUsage(output_tokens=100, reasoning_tokens=60)) == plain


def test_the_tier_applies_per_field_above_200k_only() -> None:
    table = _table({"m": TIERED})
    at = table.cost_usd("m", TokenUsage(input_tokens=TIER_THRESHOLD))
    above = table.cost_usd("m", TokenUsage(input_tokens=TIER_THRESHOLD + 1000))
    assert at == pytest.approx(TIER_THRESHOLD * 1e-6, rel=1e-12)
    assert above == pytest.approx(TIER_THRESHOLD * 1e-6 + 1000 * 10e-6, rel=1e-12)
    # Split over two fields, 300k tokens stay below the threshold in each.
    split = table.cost_usd("m", TokenUsage(input_tokens=150_000, cache_read_tokens=150_000))
    assert split == pytest.approx(150_000 * 1e-6 + 150_000 * 4e-6, rel=1e-12)
    cached = table.cost_usd("m", TokenUsage(cache_read_tokens=250_000))
    assert cached == pytest.approx(TIER_THRESHOLD * 4e-6 + 50_000 * 40e-6, rel=1e-12)


def test_without_a_tier_price_the_base_price_goes_on() -> None:
    table = _table({"m": FLAT})
    assert table.cost_usd("m", TokenUsage(output_tokens=300_000)) == pytest.approx(0.6, rel=1e-12)


def test_a_price_the_entry_lacks_costs_nothing() -> None:
    table = _table({"m": {"input_cost_per_token": 1e-6, "output_cost_per_token": 2e-6}})
    usage = TokenUsage(input_tokens=10, cache_read_tokens=10**6, cache_write_tokens=10**6)
    assert table.cost_usd("m", usage) == pytest.approx(10e-6, rel=1e-12)


def test_no_tokens_cost_zero_on_a_known_model() -> None:
    table = _table({"m": TIERED})
    assert table.cost_usd("m", TokenUsage()) == 0.0
    assert table.cost_usd("m", TokenUsage(input_tokens=-5)) == 0.0


def test_a_usages_own_cost_is_not_looked_at() -> None:
    table = _table({"m": FLAT})
    assert table.cost_usd("m", TokenUsage(input_tokens=1, cost_usd=99.0)) == pytest.approx(1e-6)


def test_a_table_with_an_unknown_kind_of_price_is_refused() -> None:
    with pytest.raises(msgspec.ValidationError, match="unknown field"):
        _table({"m": FLAT | {"input_cost_per_token_above_272k_tokens": 1.0}})


# --- the shipped table -------------------------------------------------------------------------


def test_the_shipped_table_says_where_it_comes_from() -> None:
    table = bundled_table()
    assert table.ccusage_version == "17.2.1"
    assert "LiteLLM model_prices_and_context_window" in table.source
    assert table.date[:4].isdigit()
    assert table.prefixes[0] == "anthropic/"
    assert all("claude" in key for key in table.prices)
    assert len(table.prices) >= 40


def test_the_shipped_table_prices_the_current_claude_models() -> None:
    opus = price_of("claude-opus-4-5-20251101")
    assert opus == ModelPrice(
        model="claude-opus-4-5-20251101",
        input=5e-6,
        output=25e-6,
        cache_write=6.25e-6,
        cache_read=5e-7,
        max_input_tokens=200_000,
        max_output_tokens=64_000,
    )
    sonnet = price_of("claude-sonnet-4-5-20250929")
    assert sonnet is not None
    assert sonnet.input_above_200k == 6e-6
    haiku = price_of("claude-haiku-4-5")
    assert haiku is not None
    assert haiku.model == "claude-haiku-4-5"
    usage = TokenUsage(input_tokens=4, output_tokens=210, cache_write_tokens=6000)
    assert cost_usd("claude-sonnet-4-5-20250929", usage) == pytest.approx(0.025662, rel=1e-12)
    assert price_of("gpt-5-codex") is None
    assert cost_usd("<synthetic>", usage) is None


def test_model_prices_are_frozen_and_encode() -> None:
    opus = price_of("claude-opus-4-5")
    assert opus is not None
    with pytest.raises(AttributeError):
        opus.input = 0.0  # type: ignore[misc]
    assert msgspec.json.decode(msgspec.json.encode(opus), type=ModelPrice) == opus


@needs_ccusage
def test_the_shipped_table_is_what_update_prices_generates_from_ccusage() -> None:
    """``--check`` also prices ~1,200 probes with ccusage's own code and with busd's."""
    run = subprocess.run(
        [sys.executable, str(UPDATE), "--check"], capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stderr
    assert "probes agree" in run.stdout


@needs_ccusage
def test_update_prices_check_fails_on_a_stale_table(tmp_path: Path) -> None:
    stale = tmp_path / "prices.json"
    text = (ROOT / "busd" / "data" / "prices.json").read_text()
    stale.write_text(text.replace('"input_cost_per_token": 5e-06', '"input_cost_per_token": 4e-06'))
    run = subprocess.run(
        [sys.executable, str(UPDATE), "--check", "--output", str(stale)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 1
    assert "is not what ccusage 17.2.1 gives" in run.stderr


# --- parity with the real ccusage ----------------------------------------------------------


@dataclass(frozen=True)
class Call:
    project: str
    session: str
    model: str
    usage: TokenUsage


def _u(input_: int, output: int, cache_write: int = 0, cache_read: int = 0) -> TokenUsage:
    return TokenUsage(
        input_tokens=input_,
        output_tokens=output,
        cache_write_tokens=cache_write,
        cache_read_tokens=cache_read,
    )


ALPHA = "6f1c1e3a-0000-4000-8000-00000000a1fa"
BETA = "6f1c1e3a-0000-4000-8000-00000000be7a"
CALLS = [
    Call("-tmp-alpha", ALPHA, "claude-opus-4-5-20251101", _u(12, 845, 15_300, 42_017)),
    Call("-tmp-alpha", ALPHA, "claude-sonnet-4-5-20250929", _u(7, 311, 2_050, 61_234)),
    # Above 200k input tokens: the tier price for the rest.
    Call("-tmp-alpha", ALPHA, "claude-sonnet-4-5-20250929", _u(254_321, 1_999, 800, 9)),
    Call("-tmp-alpha", ALPHA, "claude-haiku-4-5-20251001", _u(3, 30, 15_000)),
    Call("-tmp-alpha", ALPHA, "claude-opus-4-5-20251101", _u(1, 77, 0, 57_317)),
    # A dated name the table does not have: fuzzy, to claude-opus-4-1.
    Call("-tmp-beta", BETA, "claude-opus-4-1-20991231", _u(40, 500, 1_000, 2_000)),
    # Above 200k cache reads on a model whose tier covers them.
    Call("-tmp-beta", BETA, "claude-sonnet-4-20250514", _u(5, 60, 3_000, 310_000)),
    Call("-tmp-beta", BETA, "claude-3-5-haiku-20241022", _u(900, 90)),
    # A name in another case, found in lower case.
    Call("-tmp-beta", BETA, "Claude-Haiku-4-5", _u(10, 20)),
    # Unknown to ccusage's table.
    Call("-tmp-beta", BETA, "gpt-5-codex", _u(1_000, 100)),
]


def _write_transcripts(config: Path) -> None:
    lines: dict[Path, list[str]] = {}
    for n, call in enumerate(CALLS):
        path = config / "projects" / call.project / f"{call.session}.jsonl"
        u = call.usage
        line = {
            "parentUuid": None,
            "isSidechain": False,
            "userType": "external",
            "cwd": "/tmp/" + call.project.rsplit("-", 1)[-1],
            "sessionId": call.session,
            "version": "2.1.332",
            "type": "assistant",
            "message": {
                "id": f"msg_{n:03}",
                "type": "message",
                "role": "assistant",
                "model": call.model,
                "content": [{"type": "text", "text": f"answer {n}"}],
                "stop_reason": "end_turn",
                "usage": {
                    "input_tokens": u.input_tokens,
                    "cache_creation_input_tokens": u.cache_write_tokens,
                    "cache_read_input_tokens": u.cache_read_tokens,
                    "output_tokens": u.output_tokens,
                },
            },
            "requestId": f"req_{n:03}",
            "uuid": f"00000000-0000-4000-8000-{n:012}",
            "timestamp": f"2026-11-26T06:{n:02}:00.000Z",
        }
        lines.setdefault(path, []).append(json.dumps(line))
    for path, text in lines.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(text) + "\n")


def _ccusage_sessions(config: Path) -> dict[str, Any]:
    assert NODE is not None
    home = config / "home"
    home.mkdir()
    env = {
        "PATH": f"{Path(NODE).parent}:/usr/bin:/bin",
        "HOME": str(home),
        "CLAUDE_CONFIG_DIR": str(config),
        "TZ": "UTC",
        "LANG": "C.UTF-8",
    }
    run = subprocess.run(
        [str(CCUSAGE), "session", "--offline", "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=home,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    report: dict[str, Any] = json.loads(run.stdout)
    # ccusage's "session" is the transcript's folder: here, one project per session.
    return {s["sessionId"]: s for s in report["sessions"]}


@needs_ccusage
def test_costs_equal_ccusage_offline_per_model_and_per_session(tmp_path: Path) -> None:
    _write_transcripts(tmp_path)
    theirs = _ccusage_sessions(tmp_path)
    assert set(theirs) == {c.project for c in CALLS}
    for project, session in theirs.items():
        calls = [c for c in CALLS if c.project == project]
        by_model = {b["modelName"]: b for b in session["modelBreakdowns"]}
        assert set(by_model) == {c.model for c in calls}
        known_total = 0.0
        for model, their in by_model.items():
            costs = [cost_usd(c.model, c.usage) for c in calls if c.model == model]
            tokens = sum(c.usage.input_tokens for c in calls if c.model == model)
            assert their["inputTokens"] == tokens
            if model == "gpt-5-codex":  # unknown: ccusage says 0, busd says unknown
                assert costs == [None]
                assert their["cost"] == 0
                continue
            ours = sum(c for c in costs if c is not None)
            assert None not in costs
            assert math.isclose(ours, their["cost"], rel_tol=1e-9), (model, ours, their)
            known_total += ours
        assert math.isclose(known_total, session["totalCost"], rel_tol=1e-9), project


def test_the_tier_in_the_parity_transcripts_is_real() -> None:
    """The >200k calls above cost more than their flat price: the parity test covers tiers."""
    for call in CALLS:
        price = price_of(call.model)
        u = call.usage
        if price is None or max(u.input_tokens, u.cache_read_tokens) <= TIER_THRESHOLD:
            continue
        flat = _table(
            {
                "m": {
                    "input_cost_per_token": price.input or 0.0,
                    "output_cost_per_token": price.output or 0.0,
                    "cache_creation_input_token_cost": price.cache_write or 0.0,
                    "cache_read_input_token_cost": price.cache_read or 0.0,
                }
            }
        ).cost_usd("m", u)
        tiered = cost_usd(call.model, u)
        assert flat is not None
        assert tiered is not None
        assert tiered > flat * 1.2, call
