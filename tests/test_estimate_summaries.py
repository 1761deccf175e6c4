"""Summaries and transcripts say when an output count is busd's estimate (issue 16).

The real-capture tests are ``plugins/anthropic/tests/test_anthropic_estimates.py``,
``test_anthropic_run_estimates.py`` (a cancel through the daemon) and
``plugins/claude_code/tests/test_claude_code_estimates.py``; these pin the
accountant's rule on an equal count and what frontends print.
"""

from __future__ import annotations

from itertools import count

from busd.core.events import (
    Envelope,
    Event,
    RunFinished,
    RunStarted,
    TextDelta,
    TokenUsage,
    TurnEnd,
    TurnStart,
    Usage,
)
from busd.core.stats import StreamingStatsTracker
from busd.frontends.headless import summary_lines
from busd.frontends.transcript import build_transcript
from busd.frontends.view import Views

_seq = count(1)


def env(event: Event, *, run: str | None = None) -> Envelope[Event]:
    return Envelope(next(_seq), 0.0, event, "s1", run)


def usage(output: int) -> Envelope[Event]:
    return env(Usage(tokens=TokenUsage(input_tokens=10, output_tokens=output)))


def test_a_call_that_ends_normally_is_replaced_by_an_equal_count() -> None:
    tracker = StreamingStatsTracker()
    for e in (
        env(TurnStart(turn_id="c1")),
        usage(22),
        env(TextDelta(message_id="c1:0", text="The command printed hello.")),
        usage(22),
        env(TurnEnd(turn_id="c1")),
    ):
        tracker.observe(e, 0.0)
    assert (tracker.output_tokens, tracker.output_estimated) == (22, False)


def _finished(estimated: bool) -> RunFinished:
    return RunFinished(
        status="cancelled",
        duration_s=2.5,
        usage=TokenUsage(input_tokens=12, output_tokens=16),
        output_estimated=estimated,
    )


def test_summaries_mark_an_estimated_output_count_and_only_that() -> None:
    assert summary_lines(_finished(True)) == [
        "✻ Worked for 2s · ↓ ~16 tokens",
        "cancelled · 12 in · ~16 out",
    ]
    assert summary_lines(_finished(False)) == [
        "✻ Worked for 2s · ↓ 16 tokens",
        "cancelled · 12 in · 16 out",
    ]
    for estimated, line in (
        (True, "✻ Worked for 2s · ↓ ~16 tokens"),
        (False, "✻ Worked for 2s · ↓ 16 tokens"),
    ):
        views = Views()
        views.apply_all(
            [
                env(RunStarted(adapter="anthropic"), run="r1"),
                env(_finished(estimated), run="r1"),
            ]
        )
        assert views.sessions["s1"].summary_line() == line


def test_a_transcript_keeps_the_flag_of_its_runs() -> None:
    transcript = build_transcript(
        "s1", [env(RunStarted(adapter="anthropic"), run="r1"), env(_finished(True), run="r1")]
    )
    [run] = transcript.runs
    assert (run.usage, run.output_estimated) == (_finished(True).usage, True)
