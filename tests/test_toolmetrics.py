from __future__ import annotations

from itertools import count
from typing import Literal

import pytest

from busd.core.events import (
    Envelope,
    Event,
    RunFinished,
    SessionIdle,
    ToolComplete,
    ToolMetrics,
    ToolStart,
    ToolTimeout,
)
from busd.core.toolmetrics import ToolTracker

_seq = count(1)


def env(
    event: Event, *, ts: float = 0.0, session: str = "s1", run: str | None = "r1"
) -> Envelope[Event]:
    return Envelope(next(_seq), ts, event, session, run)


def start(call_id: str, name: str = "bash", *, ts: float = 0.0) -> Envelope[Event]:
    return env(ToolStart(tool_call_id=call_id, name=name), ts=ts)


def done(
    call_id: str,
    status: Literal["ok", "error", "cancelled"] = "ok",
    *,
    duration_s: float | None = None,
    name: str | None = None,
) -> Envelope[Event]:
    return env(ToolComplete(tool_call_id=call_id, status=status, duration_s=duration_s, name=name))


# -- metrics -------------------------------------------------------------------


def test_metrics_count_calls_errors_and_durations_per_tool_sorted_by_name() -> None:
    tracker = ToolTracker()
    tracker.observe(start("1", "read", ts=1000.0), now=0.0)
    tracker.observe(done("1"), now=0.5)
    tracker.observe(start("2", "bash", ts=1001.0), now=1.0)
    tracker.observe(done("2", "error"), now=4.0)
    tracker.observe(start("3", "bash", ts=1005.0), now=5.0)
    tracker.observe(done("3"), now=6.0)

    assert tracker.metrics() == [
        ToolMetrics(
            name="bash", calls=2, errors=1, total_s=4.0, mean_s=2.0, last_called=1005.0, last_s=1.0
        ),
        ToolMetrics(
            name="read", calls=1, errors=0, total_s=0.5, mean_s=0.5, last_called=1000.0, last_s=0.5
        ),
    ]


def test_the_events_own_duration_wins_over_the_observed_one() -> None:
    tracker = ToolTracker()
    tracker.observe(start("1"), now=0.0)
    tracker.observe(done("1", duration_s=0.25), now=9.0)
    assert tracker.metric("bash") == ToolMetrics(
        name="bash", calls=1, total_s=0.25, mean_s=0.25, last_called=0.0, last_s=0.25
    )


def test_a_cancelled_call_is_not_an_error() -> None:
    tracker = ToolTracker()
    tracker.observe(start("1"), now=0.0)
    tracker.observe(done("1", "cancelled"), now=1.0)
    metric = tracker.metric("bash")
    assert metric is not None
    assert (metric.calls, metric.errors) == (1, 0)


def test_repeated_starts_and_completions_count_once() -> None:
    tracker = ToolTracker()
    tracker.observe(start("1"), now=0.0)
    tracker.observe(start("1"), now=0.1)
    tracker.observe(done("1"), now=1.0)
    tracker.observe(done("1"), now=2.0)

    metric = tracker.metric("bash")
    assert metric is not None
    assert (metric.calls, metric.total_s) == (1, 1.0)
    assert tracker.statistics().duplicates == 2


def test_a_completion_without_a_start_counts_when_it_names_its_tool() -> None:
    tracker = ToolTracker()
    tracker.observe(done("x", duration_s=2.0, name="grep"), now=5.0)
    tracker.observe(done("y"), now=6.0)  # no name: nothing to count it under

    assert tracker.metrics() == [
        ToolMetrics(name="grep", calls=1, total_s=2.0, mean_s=2.0, last_called=0.0, last_s=2.0)
    ]
    assert tracker.statistics().unmatched_completions == 2


def test_the_mean_only_covers_calls_whose_duration_is_known() -> None:
    tracker = ToolTracker()
    tracker.observe(start("1"), now=0.0)  # still running
    tracker.observe(start("2"), now=0.0)
    tracker.observe(done("2"), now=3.0)
    metric = tracker.metric("bash")
    assert metric is not None
    assert (metric.calls, metric.mean_s) == (2, 3.0)


# -- timeouts ------------------------------------------------------------------


def test_a_timeout_fires_once_when_the_limit_passes() -> None:
    tracker = ToolTracker(default_limit_s=10.0)
    tracker.observe(start("1"), now=100.0)

    assert tracker.check(109.9) == []
    assert tracker.check(110.0) == [
        ToolTimeout(tool_call_id="1", name="bash", limit_s=10.0, elapsed_s=10.0)
    ]
    assert tracker.check(200.0) == []
    assert tracker.timed_out("1") is True
    assert tracker.statistics().timeouts == 1


def test_a_per_tool_limit_overrides_the_default() -> None:
    tracker = ToolTracker(default_limit_s=10.0, limits={"bash": 60.0, "watch": None})
    tracker.observe(start("b", "bash"), now=0.0)
    tracker.observe(start("r", "read"), now=0.0)
    tracker.observe(start("w", "watch"), now=0.0)

    assert [t.tool_call_id for t in tracker.check(30.0)] == ["r"]
    assert [t.limit_s for t in tracker.check(60.0)] == [60.0]
    assert tracker.check(10_000.0) == []


def test_next_deadline_is_the_earliest_open_calls_limit() -> None:
    tracker = ToolTracker(default_limit_s=30.0, limits={"read": 5.0})
    assert tracker.next_deadline() is None

    tracker.observe(start("b", "bash"), now=0.0)
    tracker.observe(start("r", "read"), now=1.0)
    assert tracker.next_deadline() == 6.0

    tracker.observe(done("r"), now=2.0)
    assert tracker.next_deadline() == 30.0

    tracker.check(30.0)
    assert tracker.next_deadline() is None


def test_no_deadline_without_limits() -> None:
    tracker = ToolTracker()
    tracker.observe(start("1"), now=0.0)
    assert tracker.next_deadline() is None
    assert tracker.check(1e12) == []


def test_a_completion_after_a_timeout_still_counts_with_its_real_duration() -> None:
    tracker = ToolTracker(default_limit_s=10.0)
    tracker.observe(start("1"), now=0.0)
    tracker.check(10.0)
    tracker.observe(done("1", "error"), now=25.0)

    assert tracker.metric("bash") == ToolMetrics(
        name="bash", calls=1, errors=1, total_s=25.0, mean_s=25.0, last_called=0.0, last_s=25.0
    )
    assert tracker.open_calls == 0


def test_a_completed_call_never_times_out() -> None:
    tracker = ToolTracker(default_limit_s=10.0)
    tracker.observe(start("1"), now=0.0)
    tracker.observe(done("1"), now=9.0)
    assert tracker.check(100.0) == []


def test_a_finished_run_abandons_its_open_calls() -> None:
    tracker = ToolTracker(default_limit_s=10.0)
    tracker.observe(start("1"), now=0.0)
    tracker.observe(env(ToolStart(tool_call_id="2", name="bash"), run="r2"), now=0.0)
    tracker.observe(env(RunFinished(status="cancelled", duration_s=1.0)), now=1.0)

    assert [t.tool_call_id for t in tracker.check(20.0)] == ["2"]
    assert tracker.statistics().abandoned == 1


def test_the_main_agent_going_idle_abandons_its_sessions_open_calls() -> None:
    tracker = ToolTracker(default_limit_s=10.0)
    tracker.observe(start("1"), now=0.0)
    tracker.observe(env(SessionIdle(aborted=True), run=None), now=1.0)
    assert tracker.check(20.0) == []


def test_open_calls_are_bounded_and_the_oldest_goes_first() -> None:
    tracker = ToolTracker(default_limit_s=10.0, max_open=2)
    for i in range(3):
        tracker.observe(start(str(i)), now=float(i))

    assert tracker.open_calls == 2
    assert [t.tool_call_id for t in tracker.check(100.0)] == ["1", "2"]
    assert tracker.statistics().evicted == 1


def test_deadlines_stay_right_after_many_short_calls() -> None:
    tracker = ToolTracker(default_limit_s=1_000.0)
    tracker.observe(start("slow"), now=0.0)
    for i in range(500):
        tracker.observe(start(f"quick{i}"), now=1.0 + i)
        tracker.observe(done(f"quick{i}"), now=1.5 + i)

    assert tracker.next_deadline() == 1_000.0
    assert [t.tool_call_id for t in tracker.check(1_600.0)] == ["slow"]


def test_the_start_envelope_scopes_a_timeout() -> None:
    tracker = ToolTracker(default_limit_s=1.0)
    tracker.observe(start("1"), now=0.0)
    origin = tracker.started("1")
    assert origin is not None
    assert (origin.session_id, origin.run_id) == ("s1", "r1")
    assert tracker.started("nope") is None


@pytest.mark.parametrize(("default", "limits"), [(0.0, {}), (-1.0, {}), (None, {"bash": 0.0})])
def test_limits_must_be_positive(default: float | None, limits: dict[str, float | None]) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        ToolTracker(default, limits)


def test_the_event_types_a_run_of_which_runs_pass_over_change_nothing() -> None:
    """RunManager skips runs of these types whole (``_NOTHING_FOR_TOOLS``): they must not count."""
    from busd.core.events import TextDelta, ThinkingDelta
    from busd.daemon.runs import _NOTHING_FOR_TOOLS

    assert {TextDelta, ThinkingDelta} <= _NOTHING_FOR_TOOLS
    samples = {
        TextDelta: TextDelta(message_id="m", text="x"),
        ThinkingDelta: ThinkingDelta(message_id="t", text="y"),
    }
    fed, plain = ToolTracker(), ToolTracker()
    for tracker in (fed, plain):
        tracker.observe(start("c1"), 1.0)
    for cls in _NOTHING_FOR_TOOLS:
        fed.observe(env(samples[cls]), 2.0)
    for tracker in (fed, plain):
        tracker.observe(done("c1"), 3.0)
    assert fed.metrics() == plain.metrics()
    assert fed.statistics() == plain.statistics()
