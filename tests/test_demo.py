from __future__ import annotations

from importlib import resources

import msgspec
import pytest
from click.testing import CliRunner

from busd.cli import main
from busd.demo import load_recording
from busd.events import TextDelta, Usage


def test_demo_replays_the_recording_with_exact_derived_numbers() -> None:
    result = CliRunner().invoke(main, ["demo", "--speed", "0"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "● Weather in San Francisco · claude-sonnet-4-5-20250929"
    assert "⏺ I'll check the weather for you." in lines
    assert '⏺ get_weather({"location": "San Francisco, CA"})' in lines
    # The thinking timer ticked while thinking was in progress, with estimated counts.
    ticking = [line for line in lines if line.startswith("  ✶ Thinking… (")]
    assert len(ticking) >= 3
    assert all("~" in line for line in ticking)
    # Authoritative figures at the end: output 136 (cumulative, never summed),
    # the recorded thinking duration, one tool call of 1.4 s.
    assert "✻ Worked for 6s · ↓ 136 tokens · thought for 2s" in lines
    assert "  usage: input 300 · output 136 · cache read 0 · cost unknown" in lines
    assert "  tool get_weather: 1 call(s), 0 error(s), mean 1.4s" in lines


def test_a_wider_window_coalesces_into_fewer_frames_without_losing_text() -> None:
    def frames(window_ms: int) -> tuple[int, str]:
        result = CliRunner().invoke(main, ["demo", "--speed", "0", "--window-ms", str(window_ms)])
        assert result.exit_code == 0, result.output
        delivery = next(line for line in result.output.splitlines() if "delivery:" in line)
        return int(delivery.split(" events in ")[1].split()[0]), result.output

    immediate, raw_output = frames(0)
    coalesced, coalesced_output = frames(1000)
    assert coalesced < immediate
    answer = "⏺ It's 58°F and sunny in San Francisco right now — a light jacket should do."
    assert answer in raw_output.splitlines()
    assert answer in coalesced_output.splitlines()


def test_the_bundled_recording_is_valid_catalog_json_lines() -> None:
    text = (resources.files("busd") / "data" / "demo_session.jsonl").read_text("utf-8")
    rows = list(load_recording(text))
    assert [row.at for row in rows] == sorted(row.at for row in rows)
    assert (
        "".join(
            row.event.text
            for row in rows
            if isinstance(row.event, TextDelta) and row.event.message_id == "msg_02"
        )
        == "It's 58°F and sunny in San Francisco right now — a light jacket should do."
    )
    usages = [row.event.tokens.output_tokens for row in rows if isinstance(row.event, Usage)]
    assert usages == [112, 136]


def test_a_recording_line_that_is_not_a_catalog_event_is_rejected() -> None:
    with pytest.raises(msgspec.ValidationError, match=r"stream\.nope"):
        list(load_recording('{"at": 0, "event": {"type": "stream.nope"}}'))


def test_demo_refuses_a_negative_speed() -> None:
    result = CliRunner().invoke(main, ["demo", "--speed", "-1"])
    assert result.exit_code == 2
    assert "--speed" in result.output
