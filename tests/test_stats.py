from __future__ import annotations

from itertools import count

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from busd.core.estimate import estimate_json_tokens, estimate_tokens
from busd.core.events import (
    Envelope,
    Event,
    RunFinished,
    RunStarted,
    SessionIdle,
    SessionStart,
    StreamingStats,
    TextComplete,
    TextDelta,
    ThinkingComplete,
    ThinkingDelta,
    TokenUsage,
    ToolStart,
    TurnEnd,
    TurnStart,
    Usage,
)
from busd.core.stats import StatsRegistry, StreamingStatsTracker

_seq = count(1)


def env(
    event: Event, *, session: str | None = "s1", run: str | None = None, agent: str | None = None
) -> Envelope[Event]:
    return Envelope(next(_seq), 0.0, event, session, run, agent)


def think(text: str = "hmm", message_id: str = "m1") -> Envelope[Event]:
    return env(ThinkingDelta(message_id=message_id, text=text))


def text(chunk: str = "hello", message_id: str = "m1") -> Envelope[Event]:
    return env(TextDelta(message_id=message_id, text=chunk))


def usage(output: int, *, agent: str | None = None, run: str | None = None) -> Envelope[Event]:
    return env(Usage(tokens=TokenUsage(output_tokens=output)), agent=agent, run=run)


# -- thinking time -------------------------------------------------------------


def test_thinking_timer_ticks_while_thinking_is_in_progress() -> None:
    tracker = StreamingStatsTracker()
    tracker.observe(think(), now=10.0)
    tracker.observe(think(), now=11.0)

    assert tracker.snapshot(12.0).thinking_s == pytest.approx(2.0)
    later = tracker.snapshot(15.5)
    assert later.thinking_s == pytest.approx(5.5)
    assert later.thinking is True


def test_thinking_timer_stops_at_the_first_text_delta() -> None:
    tracker = StreamingStatsTracker()
    tracker.observe(think(), now=10.0)
    tracker.observe(text(), now=14.0)

    stats = tracker.snapshot(100.0)
    assert stats.thinking_s == pytest.approx(4.0)
    assert stats.thinking is False


@pytest.mark.parametrize(
    "other",
    [
        ToolStart(tool_call_id="t1", name="bash"),
        TurnEnd(finish_reason="end_turn"),
        SessionIdle(),
    ],
)
def test_thinking_timer_stops_at_any_non_thinking_activity(other: Event) -> None:
    tracker = StreamingStatsTracker()
    tracker.observe(think(), now=1.0)
    tracker.observe(env(other), now=3.0)
    assert tracker.snapshot(50.0).thinking_s == pytest.approx(2.0)


def test_usage_and_derived_events_do_not_stop_the_thinking_timer() -> None:
    tracker = StreamingStatsTracker()
    tracker.observe(think(), now=1.0)
    tracker.observe(usage(5), now=2.0)
    tracker.observe(env(StreamingStats(elapsed_s=1.0)), now=2.5)

    stats = tracker.snapshot(4.0)
    assert stats.thinking is True
    assert stats.thinking_s == pytest.approx(3.0)


def test_authoritative_thinking_duration_wins_over_the_timer() -> None:
    tracker = StreamingStatsTracker()
    tracker.observe(think(), now=10.0)
    tracker.observe(env(ThinkingComplete(message_id="m1", text="hmm", duration_s=3.5)), now=14.0)

    stats = tracker.snapshot(30.0)
    assert stats.thinking_s == pytest.approx(3.5)
    assert stats.thinking is False


def test_late_authoritative_duration_replaces_what_the_timer_measured() -> None:
    tracker = StreamingStatsTracker()
    tracker.observe(think(), now=10.0)
    tracker.observe(text(), now=14.0)
    assert tracker.snapshot(14.0).thinking_s == pytest.approx(4.0)

    tracker.observe(env(ThinkingComplete(message_id="m1", text="hmm", duration_s=2.5)), now=15.0)
    assert tracker.snapshot(30.0).thinking_s == pytest.approx(2.5)


def test_thinking_complete_without_duration_keeps_the_measured_time() -> None:
    tracker = StreamingStatsTracker()
    tracker.observe(think(), now=10.0)
    tracker.observe(env(ThinkingComplete(message_id="m1", text="hmm")), now=13.0)
    tracker.observe(text(), now=20.0)
    assert tracker.snapshot(30.0).thinking_s == pytest.approx(3.0)


def test_several_thinking_blocks_add_up() -> None:
    tracker = StreamingStatsTracker()
    tracker.observe(think(message_id="m1"), now=10.0)
    tracker.observe(text(message_id="m1"), now=12.0)
    tracker.observe(think(message_id="m2"), now=20.0)
    tracker.observe(env(ThinkingComplete(message_id="m2", text="", duration_s=5.0)), now=24.0)
    tracker.observe(think(message_id="m3"), now=30.0)

    assert tracker.snapshot(31.0).thinking_s == pytest.approx(2.0 + 5.0 + 1.0)


def test_a_sub_agent_does_not_stop_the_main_agents_thinking_timer() -> None:
    tracker = StreamingStatsTracker()
    tracker.observe(think(), now=0.0)
    tracker.observe(env(TextDelta(message_id="x", text="hi"), agent="sub"), now=1.0)

    stats = tracker.snapshot(3.0)
    assert stats.thinking is True
    assert stats.thinking_s == pytest.approx(3.0)


# -- output tokens -------------------------------------------------------------


def test_output_is_estimated_from_deltas_until_a_report_arrives() -> None:
    tracker = StreamingStatsTracker()
    tracker.observe(think("Let me think about the weather."), now=0.0)
    tracker.observe(text("It is sunny in San Francisco."), now=1.0)
    tracker.observe(env(ToolStart(tool_call_id="t", name="get_weather", input={"x": 1})), now=2.0)

    expected = (
        estimate_tokens("Let me think about the weather." + "It is sunny in San Francisco.")
        + estimate_tokens("get_weather")
        + estimate_json_tokens({"x": 1})
    )
    stats = tracker.snapshot(3.0)
    assert stats.output_tokens == expected
    assert stats.output_estimated is True


def test_a_report_replaces_the_estimate_and_clears_the_flag() -> None:
    tracker = StreamingStatsTracker()
    tracker.observe(text("a fairly long answer " * 20), now=0.0)
    tracker.observe(usage(30), now=1.0)

    stats = tracker.snapshot(1.0)
    assert stats.output_tokens == 30
    assert stats.output_estimated is False


def test_deltas_after_the_last_report_are_estimated_on_top() -> None:
    tracker = StreamingStatsTracker()
    tracker.observe(usage(30), now=0.0)
    tracker.observe(text("more words"), now=1.0)

    stats = tracker.snapshot(1.0)
    assert stats.output_tokens == 30 + estimate_tokens("more words")
    assert stats.output_estimated is True

    tracker.observe(usage(35), now=2.0)
    assert tracker.snapshot(2.0).output_tokens == 35
    assert tracker.snapshot(2.0).output_estimated is False


def test_a_late_lower_report_does_not_erase_the_estimate_of_newer_deltas() -> None:
    tracker = StreamingStatsTracker()
    tracker.observe(usage(30), now=0.0)
    tracker.observe(text("more words"), now=1.0)
    tracker.observe(usage(12), now=3.0)  # late, out of order

    stats = tracker.snapshot(3.0)
    assert stats.output_tokens == 30 + estimate_tokens("more words")
    assert stats.output_estimated is True
    assert tracker.statistics().stale_reports == 1


def test_a_report_equal_to_the_last_one_replaces_the_estimate() -> None:
    """Issue 16: the provider's count wins even when it did not move.

    Anthropic's second call can carry its final output in ``message_start``
    already, so the ``message_delta`` after its text repeats the figure: the
    text streamed in between was counted, not new.
    """
    tracker = StreamingStatsTracker()
    tracker.observe(usage(30), now=0.0)
    tracker.observe(text("more words"), now=1.0)
    assert tracker.snapshot(1.0).output_estimated is True
    tracker.observe(usage(30), now=2.0)  # repeated

    stats = tracker.snapshot(2.0)
    assert (stats.output_tokens, stats.output_estimated) == (30, False)
    assert tracker.statistics().stale_reports == 0


def test_an_authoritative_zero_replaces_the_estimate() -> None:
    """Issue 16: a failed model call reports 0 output; "40 (estimated)" was wrong."""
    tracker = StreamingStatsTracker()
    tracker.observe(text("some words the model never billed"), now=0.0)
    assert tracker.snapshot(0.0).output_tokens > 0
    tracker.observe(usage(0), now=1.0)
    stats = tracker.snapshot(1.0)
    assert (stats.output_tokens, stats.output_estimated) == (0, False)


@given(st.lists(st.integers(min_value=0, max_value=10**7), max_size=40))
def test_output_never_goes_down_under_repeated_or_out_of_order_reports(reports: list[int]) -> None:
    tracker = StreamingStatsTracker()
    shown = 0
    for i, output in enumerate(reports):
        tracker.observe(usage(output), now=float(i))
        stats = tracker.snapshot(float(i))
        assert stats.output_tokens >= shown
        shown = stats.output_tokens
    assert shown == max(reports, default=0)


@given(
    st.lists(
        st.one_of(
            st.integers(min_value=0, max_value=10**6),
            st.text(min_size=1, max_size=20),
        ),
        max_size=40,
    )
)
def test_the_authoritative_part_never_goes_down_with_deltas_interleaved(
    steps: list[int | str],
) -> None:
    tracker = StreamingStatsTracker()
    authoritative = 0
    for i, step in enumerate(steps):
        tracker.observe(usage(step) if isinstance(step, int) else text(step), now=float(i))
        assert tracker.authoritative_output_tokens >= authoritative
        authoritative = tracker.authoritative_output_tokens
        assert tracker.output_tokens >= authoritative


def test_sub_agents_report_their_own_cumulative_counts_which_add_up() -> None:
    tracker = StreamingStatsTracker()
    tracker.observe(usage(100), now=0.0)
    tracker.observe(usage(40, agent="sub"), now=1.0)
    tracker.observe(usage(60, agent="sub"), now=2.0)
    tracker.observe(usage(120), now=3.0)

    assert tracker.snapshot(3.0).output_tokens == 120 + 60


def test_a_main_report_covers_sub_agents_that_never_report_on_their_own() -> None:
    tracker = StreamingStatsTracker()
    tracker.observe(env(TextDelta(message_id="x", text="explorer output"), agent="sub"), now=0.0)
    assert tracker.output_estimated is True

    tracker.observe(usage(300), now=1.0)  # the session's total, sub-agent included
    stats = tracker.snapshot(1.0)
    assert (stats.output_tokens, stats.output_estimated) == (300, False)


def test_a_sub_agent_that_reports_keeps_its_estimate_until_its_own_report() -> None:
    tracker = StreamingStatsTracker()
    tracker.observe(usage(10, agent="sub"), now=0.0)
    tracker.observe(env(TextDelta(message_id="x", text="more from sub"), agent="sub"), now=1.0)
    tracker.observe(usage(300), now=2.0)

    stats = tracker.snapshot(2.0)
    assert stats.output_tokens == 310 + estimate_tokens("more from sub")
    assert stats.output_estimated is True


def test_a_streamed_message_is_not_counted_again_when_it_completes() -> None:
    tracker = StreamingStatsTracker()
    tracker.observe(text("Hello there"), now=0.0)
    tracker.observe(env(TextComplete(message_id="m1", text="Hello there")), now=1.0)
    assert tracker.output_tokens == estimate_tokens("Hello there")


def test_a_message_that_never_streamed_is_estimated_when_it_completes() -> None:
    tracker = StreamingStatsTracker()
    tracker.observe(env(TextComplete(message_id="m9", text="Whole answer at once")), now=0.0)
    assert tracker.output_tokens == estimate_tokens("Whole answer at once")
    assert tracker.output_estimated is True


# -- elapsed -------------------------------------------------------------------


def test_elapsed_runs_from_the_first_sign_of_work() -> None:
    tracker = StreamingStatsTracker()
    tracker.observe(env(SessionStart(model="m")), now=1.0)
    assert tracker.snapshot(5.0).elapsed_s == 0.0

    tracker.observe(env(TurnStart()), now=5.0)
    assert tracker.snapshot(9.0).elapsed_s == pytest.approx(4.0)


def test_elapsed_pauses_while_the_agent_is_idle() -> None:
    tracker = StreamingStatsTracker()
    tracker.observe(text(), now=0.0)
    tracker.observe(env(SessionIdle()), now=10.0)
    assert tracker.snapshot(500.0).elapsed_s == pytest.approx(10.0)
    assert tracker.active is False

    tracker.observe(usage(3), now=600.0)  # a late report is not work
    assert tracker.snapshot(700.0).elapsed_s == pytest.approx(10.0)

    tracker.observe(env(TurnStart()), now=1000.0)
    assert tracker.snapshot(1003.0).elapsed_s == pytest.approx(13.0)


def test_a_late_ending_after_idle_does_not_restart_the_clock() -> None:
    tracker = StreamingStatsTracker()
    tracker.observe(text(), now=0.0)
    tracker.observe(env(SessionIdle()), now=5.0)
    tracker.observe(env(TurnEnd()), now=6.0)
    assert tracker.snapshot(100.0).elapsed_s == pytest.approx(5.0)


def test_an_explicit_start_opens_the_clock() -> None:
    tracker = StreamingStatsTracker()
    tracker.start(2.0)
    tracker.observe(text(), now=5.0)
    assert tracker.snapshot(7.0).elapsed_s == pytest.approx(5.0)


def test_idle_stops_every_thinking_timer() -> None:
    tracker = StreamingStatsTracker()
    tracker.observe(think(), now=0.0)
    tracker.observe(env(ThinkingDelta(message_id="x", text="t"), agent="sub"), now=1.0)
    tracker.observe(env(SessionIdle(aborted=True)), now=4.0)

    stats = tracker.snapshot(100.0)
    assert stats.thinking is False
    assert stats.thinking_s == pytest.approx(4.0 + 3.0)


# -- registry ------------------------------------------------------------------


def test_registry_keeps_one_tracker_per_session_and_per_run() -> None:
    registry = StatsRegistry()
    registry.observe(env(RunStarted(adapter="claude"), run="r1"), now=0.0)
    registry.observe(env(TextDelta(message_id="m", text="hi"), run="r1"), now=1.0)
    registry.observe(env(TextDelta(message_id="m", text="hi"), session="s2"), now=1.0)

    assert registry.run_stats("r1", 2.0) is not None
    assert registry.session_stats("s1", 2.0) is not None
    assert registry.session_stats("s2", 2.0) is not None
    assert registry.run_stats("nope", 2.0) is None
    assert registry.statistics().sessions == 2
    assert registry.statistics().runs == 1


def test_a_run_counts_output_from_where_the_session_was_when_it_began() -> None:
    registry = StatsRegistry()
    registry.observe(usage(500, run="r1"), now=0.0)
    registry.observe(env(RunFinished(status="ok", duration_s=1.0), run="r1"), now=1.0)

    registry.observe(env(RunStarted(adapter="claude"), run="r2"), now=2.0)
    registry.observe(usage(700, run="r2"), now=3.0)

    assert registry.run_stats("r1", 4.0) == StreamingStats(elapsed_s=0.0, output_tokens=500)
    r2 = registry.run_stats("r2", 4.0)
    assert r2 is not None
    assert r2.output_tokens == 200
    session = registry.session_stats("s1", 4.0)
    assert session is not None
    assert session.output_tokens == 700


def test_a_run_clock_runs_through_session_idle_until_the_run_finishes() -> None:
    registry = StatsRegistry()
    registry.observe(env(RunStarted(adapter="claude"), run="r1"), now=0.0)
    registry.observe(env(SessionIdle(), session="child", run="r1"), now=2.0)
    run = registry.run_stats("r1", 5.0)
    assert run is not None
    assert run.elapsed_s == pytest.approx(5.0)

    registry.observe(env(RunFinished(status="ok", duration_s=6.0), run="r1"), now=6.0)
    run = registry.run_stats("r1", 60.0)
    assert run is not None
    assert run.elapsed_s == pytest.approx(6.0)


def test_registry_forgets_the_least_recently_fed_session_first() -> None:
    registry = StatsRegistry(max_sessions=2)
    registry.observe(text(), now=0.0)  # s1
    registry.observe(env(TurnStart(), session="s2"), now=1.0)
    registry.observe(text(), now=2.0)  # s1 again: now the most recent
    registry.observe(env(TurnStart(), session="s3"), now=3.0)

    assert registry.session("s1") is not None
    assert registry.session("s2") is None
    assert registry.session("s3") is not None
    assert registry.statistics().evicted_sessions == 1


def test_a_tracker_rejects_a_useless_bound() -> None:
    with pytest.raises(ValueError, match="max_lanes"):
        StreamingStatsTracker(max_lanes=0)


_PROSE = "abcdefghij klmno\npq rstuvwxyz " * 200


@given(
    st.lists(st.integers(min_value=0, max_value=2100), min_size=1, max_size=12),
    st.integers(min_value=0, max_value=4095),
    st.sampled_from(["text", "think"]),
)
@example([1, 1, 44, 50, 5], 4000, "text")  # the fourth delta reaches the flush exactly
@example([1, 1, 44, 49, 5], 4000, "think")  # the fourth falls one short of it
def test_a_run_of_deltas_at_once_is_each_delta_in_turn(
    lengths: list[int], already: int, kind: str
) -> None:
    """Flushes happen after the same deltas (a letter run cut at a flush counts differently)."""
    delta = text if kind == "text" else think
    one, many = StreamingStatsTracker(), StreamingStatsTracker()
    for tracker in (one, many):
        tracker.observe(delta("a" * already), now=0.0)  # pending text before the run
    envelopes = [delta(_PROSE[i : i + n]) for i, n in enumerate(lengths)]
    for envelope in envelopes:
        one.observe(envelope, 1.0)
    many.observe_many(envelopes, 1.0)
    lanes = [next(iter(t._lanes.values())) for t in (one, many)]
    assert lanes[1].pending == lanes[0].pending  # before statistics(), which flushes
    assert lanes[1].pending_chars == lanes[0].pending_chars
    assert list(many._pending) == list(one._pending)
    assert many.statistics() == one.statistics()
    assert many.snapshot(2.0) == one.snapshot(2.0)


@given(
    st.lists(st.integers(min_value=1, max_value=700), min_size=1, max_size=16),
    st.sets(st.integers(min_value=0, max_value=15)),
)
@example([3, 3], {0})  # a read between two halves of a word
def test_reading_a_tracker_leaves_the_figures_that_follow_as_they_would_be(
    lengths: list[int], reads: set[int]
) -> None:
    """A read estimates the text not flushed yet without flushing it: a flush there cut
    the text where a later one would not, and a word cut in two counts as two pieces."""
    read, unread = StreamingStatsTracker(), StreamingStatsTracker()
    at = 0
    for i, n in enumerate(lengths):
        envelope = text(_PROSE[at : at + n])
        at += n
        for tracker in (read, unread):
            tracker.observe(envelope, now=1.0)
        if i in reads:
            read.snapshot(1.5)
            read.statistics()
    assert read.output_tokens == unread.output_tokens
    assert read.statistics() == unread.statistics()
    assert read.snapshot(2.0) == unread.snapshot(2.0)


def test_a_run_that_is_all_of_its_sessions_output_shows_the_sessions_estimate() -> None:
    """The daemon reads a busy session's stats every tick, its run's at the run's end:
    the two trackers, fed the same text, must cut it alike to agree."""
    registry = StatsRegistry()
    at = 0
    for n in (5, 800, 3, 2000, 7, 1500, 2500, 11):
        delta = TextDelta(message_id="m1", text=_PROSE[at : at + n])
        at += n
        registry.observe(env(delta, run="r1"), now=1.0)
        assert registry.session_stats("s1", 1.0) is not None  # a tick
    session, run = registry.session_stats("s1", 2.0), registry.run_stats("r1", 2.0)
    assert session is not None
    assert run is not None
    assert run.output_tokens == session.output_tokens
    assert run.output_estimated
