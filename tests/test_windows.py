"""The context-window table, its overrides, and ``busd.context`` on a real stream (issue 16)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio
from busd_anthropic import AnthropicAdapter

from busd.client import connect
from busd.core.accounting import Accountant
from busd.core.events import (
    ContextUsage,
    Envelope,
    Event,
    RunStarted,
    SessionCompaction,
)
from busd.core.windows import MODEL_WINDOWS, ModelWindow, ModelWindows, normalize_model_id
from busd.daemon.config import ConfigError, load_config
from busd.wire import Snapshot

from .daemon_helpers import BUSD, serving

CAPTURE = Path(__file__).resolve().parent / "fixtures" / "sdk" / "anthropic-text.recorded.jsonl"


@pytest.mark.parametrize(
    ("model", "window", "reserve"),
    [
        ("claude-sonnet-4-5-20250929", 200_000, 64_000),
        ("us.anthropic.claude-sonnet-4-5-20250929-v1:0", 200_000, 64_000),  # Bedrock
        ("claude-opus-4-1@20250805", 200_000, 32_000),  # Vertex
        ("claude-opus-4-5-20251101", 200_000, 64_000),
        ("claude-3-5-haiku-20241022", 200_000, 8_192),
        ("claude-sonnet-4-5-20250929[1m]", 1_000_000, 64_000),  # Claude Code's 1M variant
        ("anthropic/claude-haiku-4.5", 200_000, 64_000),  # a router's id
        ("sonnet", 200_000, 64_000),
        ("gpt-5-codex", 400_000, 128_000),
        ("openai/gpt-4.1-mini", 1_047_576, 32_768),
        ("gpt-4o-mini-2024-07-18", 128_000, 16_384),
        ("gpt-4-0613", 8_192, 4_096),
        ("o4-mini", 200_000, 100_000),
        ("o1-mini", 128_000, 65_536),
        ("models/gemini-2.5-pro", 1_048_576, 65_536),
        ("gemini-3-pro-preview", 1_048_576, 65_536),
        ("gemini-1.5-pro-002", 2_097_152, 8_192),
    ],
)
def test_the_table_knows_claude_gpt_and_gemini_families(
    model: str, window: int, reserve: int
) -> None:
    assert ModelWindows().lookup(model) == ModelWindow(window, reserve)


def test_an_unknown_model_has_no_window() -> None:
    assert ModelWindows().lookup("llama-3.1-70b") is None
    assert normalize_model_id(" EU.Anthropic.Claude-3-Haiku-20240307-v1:0 ") == (
        "claude-3-haiku-20240307"
    )


def test_every_reserve_is_smaller_than_its_window() -> None:
    for prefix, entry in MODEL_WINDOWS.items():
        assert 0 <= entry.reserve < entry.window, prefix


def test_config_overrides_win_by_longest_prefix_and_keep_a_fitting_reserve() -> None:
    windows = ModelWindows(
        {
            "claude-sonnet-4": 1_000_000,  # the 1M beta everywhere
            "my-local-model": ModelWindow(32_768, 4_096),
            "gpt-4o": 8_000,  # smaller than gpt-4o's reserve: no reserve
        }
    )
    assert windows.lookup("claude-sonnet-4-5-20250929") == ModelWindow(1_000_000, 64_000)
    assert windows.lookup("my-local-model:q4") == ModelWindow(32_768, 4_096)
    assert windows.lookup("gpt-4o") == ModelWindow(8_000, 0)
    assert windows.lookup("claude-opus-4-1") == ModelWindow(200_000, 32_000)  # untouched
    with pytest.raises(ValueError, match="positive"):
        ModelWindows({"x": 0})


def _replay(accountant: Accountant) -> list[Event]:
    """Feed the capture, translated, to ``accountant``; return what it derived."""
    translator = AnthropicAdapter().translator(session_id="s1")
    out: list[Event] = []
    seq = 0
    for line in CAPTURE.read_text().splitlines():
        for item in translator.feed(json.loads(line), 0.0):
            seq += 1
            envelope: Envelope[Event] = Envelope(seq, 0.0, item.event, session_id="s1")
            out += [d.event for d in accountant.observe(envelope, 0.0)]
    return out


def _contexts(events: list[Event]) -> list[ContextUsage]:
    return [e for e in events if isinstance(e, ContextUsage)]


def test_an_anthropic_session_shows_its_window_free_and_percent() -> None:
    """The recorded claude-sonnet-4-5 reply: input 12 (no cache), output 30.

    used = 12 + 30 = 42 (the next call sends both); window 200,000;
    free = 200,000 - 42 - 64,000 (the model's output reserve) = 135,958;
    percent = 100 * 42 / 200,000 = 0.021.
    """
    accountant = Accountant()
    last = _contexts(_replay(accountant))[-1]
    assert last.used == 12 + 30
    assert last.window == 200_000
    assert last.breakdown.free == 200_000 - 42 - 64_000
    assert last.percent == pytest.approx(100 * 42 / 200_000)
    assert not last.estimated


def test_a_run_override_and_the_config_override_beat_the_table() -> None:
    accountant = Accountant(model_windows={"claude-sonnet-4-5": 500_000})
    assert _contexts(_replay(accountant))[-1].window == 500_000

    pinned = Accountant()
    pinned.set_context_window("s1", 50_000, reserve=10_000)
    last = _contexts(_replay(pinned))[-1]
    assert (last.window, last.breakdown.free) == (50_000, 50_000 - 42 - 10_000)


def test_compaction_restarts_context_accounting_from_its_figure() -> None:
    """After the recorded call (used 42), a compaction to 10 tokens (constructed event).

    The figure restarts from ``tokens_after`` and is an estimate again; text
    added afterwards is estimated on top of it.
    """
    accountant = Accountant()
    _replay(accountant)
    derived = accountant.observe(
        Envelope(100, 0.0, SessionCompaction(tokens_before=42, tokens_after=10), session_id="s1"),
        0.0,
    )
    (after,) = _contexts([d.event for d in derived])
    assert (after.used, after.estimated) == (10, True)
    assert after.breakdown.free == 200_000 - 10 - 64_000
    accountant.observe(Envelope(101, 0.0, RunStarted(adapter="x", prompt="hello"), "s1"), 0.0)
    window = accountant.context.get("s1")
    assert window is not None
    assert window.used == 10 + 1  # "hello" estimates to one token


def test_the_config_file_overrides_the_table(tmp_path: Path) -> None:
    path = tmp_path / "busd.toml"
    path.write_text(
        "[context.windows]\n"
        '"my-local-model" = 32768\n'
        '"claude-sonnet-4" = { window = 1000000, reserve = 64000 }\n'
    )
    windows = ModelWindows(load_config(path).context.model_windows())
    assert windows.lookup("my-local-model-q4") == ModelWindow(32_768, 0)
    assert windows.lookup("claude-sonnet-4-5-20250929") == ModelWindow(1_000_000, 64_000)
    assert windows.lookup("gpt-4o") == MODEL_WINDOWS["gpt-4o"]  # the table still answers
    for text, why in [
        ('[context.windows]\n"m" = 0', "must be positive"),
        ('[context.windows]\n"m" = { window = 10, reserve = 10 }', "reserve"),
        ('[context.windows]\n"m" = { size = 10 }', "size"),
    ]:
        path.write_text(text)
        with pytest.raises(ConfigError, match=why):
            load_config(path)


async def test_busd_serve_takes_the_window_from_its_config(tmp_path: Path) -> None:
    """A real ``busd serve --config``: the recorded Sonnet session reads 150,000, not 200,000."""
    config = tmp_path / "busd.toml"
    config.write_text('[context.windows]\n"claude-sonnet-4-5" = { window = 150000 }\n')
    sock = tmp_path / "bus.sock"
    async with serving(sock, "--no-journal", "--config", str(config)):
        ingest = [*BUSD, "ingest", "--socket", str(sock), "--sdk", "anthropic"]
        done = await trio.run_process(
            [*ingest, "--session", "s1", str(CAPTURE)], capture_stderr=True
        )
        assert done.returncode == 0, done.stderr
        async with connect(sock, client="test") as client:
            with trio.fail_after(20):
                while True:  # the daemon is another process: polled, with a deadline
                    snapshot = await client.request(Snapshot(session_id="s1"))
                    if snapshot.get("context"):
                        break
                    await trio.sleep(0.05)
    # 12 input + 30 output, in a window of 150,000 with no reserve.
    assert (snapshot["context"]["used"], snapshot["context"]["window"]) == (42, 150_000)
