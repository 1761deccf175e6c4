from __future__ import annotations

import math
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from busd.core.events import StreamingStats
from busd.frontends.humanize import (
    format_duration,
    format_tokens,
    format_took,
    status_line,
    summary_line,
    tool_head,
)


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (-5, "0"),
        (0, "0"),
        (1, "1"),
        (999, "999"),
        (1000, "1.0k"),
        (1099, "1.0k"),
        (1100, "1.1k"),
        (1234, "1.2k"),
        (1999, "1.9k"),
        (16_700, "16.7k"),
        (16_799, "16.7k"),
        (999_949, "999.9k"),
        (999_999, "999.9k"),
        (1_000_000, "1.0M"),
        (1_300_000, "1.3M"),
        (999_999_999, "999.9M"),
        (1_000_000_000, "1.0B"),
        (2_500_000_000_000, "2500.0B"),
    ],
)
def test_format_tokens(n: int, text: str) -> None:
    assert format_tokens(n) == text


@given(st.integers(min_value=1000, max_value=10**12))
def test_format_tokens_never_overstates_nor_prints_a_thousand_of_a_unit(n: int) -> None:
    text = format_tokens(n)
    match = re.fullmatch(r"(\d+)\.(\d)([kMB])", text)
    assert match is not None
    value = float(f"{match[1]}.{match[2]}")
    scale = {"k": 10**3, "M": 10**6, "B": 10**9}[match[3]]
    assert value * scale <= n < (value + 0.1) * scale + 1
    if match[3] != "B":
        assert value < 1000


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (-3.0, "0s"),
        (math.nan, "0s"),
        (math.inf, "0s"),
        (0, "0s"),
        (0.99, "0s"),
        (54.9, "54s"),
        (59.999, "59s"),
        (60, "1m 00s"),
        (65, "1m 05s"),
        (382, "6m 22s"),
        (3599.9, "59m 59s"),
        (3600, "1h 00m"),
        (3720, "1h 02m"),
        (3779, "1h 02m"),
        (90_000, "25h 00m"),
    ],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@given(st.floats(min_value=0, max_value=10**7))
def test_format_duration_floors(seconds: float) -> None:
    parts = re.fullmatch(r"(?:(\d+)h )?(?:(\d+)m ?)?(?:(\d+)s)?", format_duration(seconds))
    assert parts is not None
    h, m, s = (int(p) if p else 0 for p in parts.groups())
    shown = h * 3600 + m * 60 + s
    granularity = 60 if h else 1
    assert shown <= seconds < shown + granularity
    assert m < 60
    assert s < 60


def test_status_line_matches_the_reference_example() -> None:
    stats = StreamingStats(elapsed_s=382.4, output_tokens=16_742, thinking_s=54.7)
    assert status_line(stats) == "✶ Thinking… (6m 22s · ↓ 16.7k tokens · thought for 54s)"


def test_status_line_marks_estimated_counts() -> None:
    stats = StreamingStats(elapsed_s=3, output_tokens=1234, output_estimated=True)
    assert status_line(stats) == "✶ Thinking… (3s · ↓ ~1.2k tokens)"


def test_status_line_leaves_out_parts_that_would_read_zero() -> None:
    assert status_line(StreamingStats(elapsed_s=0.2)) == "✶ Thinking… (0s)"
    assert status_line(StreamingStats(elapsed_s=2, thinking_s=0.6)) == "✶ Thinking… (2s)"
    assert (
        status_line(StreamingStats(elapsed_s=2, output_tokens=1)) == "✶ Thinking… (2s · ↓ 1 token)"
    )


def test_status_line_keeps_the_callers_verb_while_thinking() -> None:
    stats = StreamingStats(elapsed_s=65, output_tokens=10, thinking_s=12, thinking=True)
    assert (
        status_line(stats, verb="Pondering…", glyph="*")
        == "* Pondering… (1m 05s · ↓ 10 tokens · thought for 12s)"
    )
    assert status_line(stats, verb="Working", glyph="") == (
        "Working (1m 05s · ↓ 10 tokens · thought for 12s)"
    )


def test_summary_line_matches_the_reference_example() -> None:
    stats = StreamingStats(elapsed_s=18.9, output_tokens=1432, thinking_s=5.2)
    assert summary_line(stats) == "✻ Worked for 18s · ↓ 1.4k tokens · thought for 5s"


def test_summary_line_without_tokens_or_thinking() -> None:
    assert summary_line(StreamingStats(elapsed_s=3725)) == "✻ Worked for 1h 02m"
    assert summary_line(StreamingStats(elapsed_s=1), glyph="") == "Worked for 1s"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "<1s"), (0.4, "<1s"), (0.999, "<1s"), (1.0, "1s"), (65, "1m 05s"), (-1, "<1s")],
)
def test_format_took_says_under_a_second_rather_than_zero(seconds: float, text: str) -> None:
    assert format_took(seconds) == text


def test_a_tool_is_named_by_the_one_thing_worth_reading_in_its_input() -> None:
    assert tool_head("Write", {"file_path": "/tmp/a.txt", "content": "x"}) == "Write(/tmp/a.txt)"
    assert tool_head("Bash", {"command": "ls\nrm -rf /"}) == "Bash(ls …)"
    assert tool_head("Task", {}) == "Task"
    # ACP names a tool after its command: the input would only say it again
    assert tool_head("rm /tmp/x", {"command": "rm /tmp/x"}) == "rm /tmp/x"
