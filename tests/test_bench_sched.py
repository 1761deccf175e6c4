"""The scheduler benchmark's arithmetic (contrib/bench/bench_sched.py), on perf's own lines.

The benchmark itself needs root and ``perf`` and runs real servers; what it
counts in a trace is checked here, on ``fixtures/perf_sched.txt``: ``perf
script -F tid,cpu,time,event,trace`` lines cut from one of its recordings,
pids renamed (busd's daemon 100, its journal thread 101, the publisher
200, subscribers 301-303), with a few made up for the cases below, a line
of another event and one of garbage.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "contrib" / "bench"))

from bench_sched import parse, preemption

TRACE = (Path(__file__).parent / "fixtures" / "perf_sched.txt").read_text()


def test_a_trace_parses_into_switches_and_wake_ups_whatever_the_task_names() -> None:
    events = parse(TRACE.splitlines())
    assert len(events) == 13  # not the other event, not the garbage
    wake = events[7]
    assert (wake.tid, wake.cpu, wake.kind) == (100, 0, "sched_wakeup")
    assert wake.fields["pid"] == "101"  # after a task name with a space
    switch = events[8]
    assert (switch.fields["prev_pid"], switch.fields["next_pid"]) == ("101", "0")
    assert switch.fields["prev_state"] == "S"


def test_preemptions_count_same_cpu_wake_ups_the_woken_subscriber_acted_on() -> None:
    """301 woken on the daemon's CPU takes it at once (preempted); 302 goes to the other CPU;
    303 waits until the daemon sleeps (not preempted); the journal thread is no subscriber;
    the kworker's preemption is one of the daemon's, but by no subscriber."""
    found = preemption(parse(TRACE.splitlines()), server={100, 101}, subscribers={301, 302, 303})
    assert (found.wakes, found.own_cpu, found.preempted) == (3, 2, 1)
    assert (found.switched_out, found.runnable) == (4, 2)  # 101's sleep is a server switch too
    rates = found.rates()
    assert rates["own CPU"] == 2 / 3
    assert rates["preempted"] == 1 / 2
    assert rates["while runnable"] == 2 / 4
    assert rates["wakes/s"] == pytest.approx(3 / 0.000868)  # over the first to the last event


def test_an_empty_trace_has_no_rates_rather_than_a_division_by_zero() -> None:
    assert set(preemption([], server={1}, subscribers={2}).rates().values()) == {0.0}
