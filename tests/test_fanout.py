"""Cohorts over the shared log: per event a fixed amount of work, per window a batch per cohort."""

from __future__ import annotations

import shutil
import socket
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from busd.client import connect
from busd.core.accounting import SETTLE_STRETCH
from busd.core.coalesce import Accumulator
from busd.core.cohorts import Cohort, Log, SharedBatch
from busd.core.events import (
    Envelope,
    Event,
    SessionIdle,
    SessionInfo,
    TextDelta,
    TokenUsage,
    TurnStart,
    Usage,
    event_type,
)
from busd.daemon.batching import BatchDispatcher
from busd.daemon.fanout import shared_parts
from busd.daemon.hub import Daemon, DaemonConfig, Subscription
from busd.daemon.outbox import Out, Outbox
from busd.wire import (
    Encoder,
    Events,
    Outgoing,
    Ping,
    Publish,
    encode_envelope,
    encode_frame,
    pack_events,
)

from .daemon_helpers import RawClient, running_daemon

# -- the log ------------------------------------------------------------------------


def env(seq: int, event: Event | None = None, session: str = "s1") -> Envelope[Event]:
    return Envelope(seq=seq, ts=0.0, event=event or TurnStart(), session_id=session)


def test_the_log_takes_consecutive_seqs_and_forgets_what_every_cursor_read() -> None:
    log = Log(head_seq=10)
    assert log.head_seq == 10
    envelopes = [env(s) for s in (11, 12, 13)]
    for e in envelopes:
        log.append(e, encode_envelope(e))
    with pytest.raises(ValueError, match="does not follow"):
        log.append(env(15), encode_envelope(env(15)))
    assert log.after(11)[0] == envelopes[1:]
    assert log.raw_of(envelopes[1]) == encode_envelope(envelopes[1])
    assert log.raw_of(env(12)) is None  # an equal envelope, not the one appended
    log.trim(12)
    assert (len(log), log.head_seq) == (1, 13)
    with pytest.raises(ValueError, match="no longer in the log"):
        log.after(11)
    assert log.after(12)[0] == envelopes[2:]


def test_the_log_takes_a_run_only_if_it_follows_the_head() -> None:
    log = Log()
    run = [env(s) for s in (1, 2, 3)]
    log.extend(run, [encode_envelope(e) for e in run])
    assert (log.head_seq, log.after(1)[0]) == (3, run[1:])
    for bad in ([env(5)], [env(4), env(6)]):
        with pytest.raises(ValueError, match="do not follow"):
            log.extend(bad, [encode_envelope(e) for e in bad])
    assert log.head_seq == 3


# -- a cohort's take ----------------------------------------------------------------


def cohort(
    patterns: tuple[str, ...] = (">",), *, sessions: set[str] | None = None, merge: bool = True
) -> Cohort[object]:
    def matches(name: str) -> bool:
        return any(p == ">" or name.startswith(p.rstrip(">")) for p in patterns)

    admits = None if sessions is None else (lambda e: e.session_id in sessions)
    return Cohort("key", matches=matches, admits=admits, window=0.0, merge_deltas=merge, cursor=0)


def logged(*events: tuple[Event, str]) -> tuple[Log, list[Envelope[Event]]]:
    log = Log()
    out = []
    for seq, (event, session) in enumerate(events, 1):
        e = env(seq, event, session)
        log.append(e, encode_envelope(e))
        out.append(e)
    return log, out


def test_a_take_filters_and_coalesces_once_and_reuses_the_logged_bytes() -> None:
    log, es = logged(
        (Usage(tokens=TokenUsage(output_tokens=1)), "s1"),
        (TextDelta(message_id="m", text="a"), "s2"),
        (Usage(tokens=TokenUsage(output_tokens=2)), "s1"),  # supersedes the first
        (SessionInfo(message="hi"), "s1"),
    )
    c = cohort(sessions={"s1"})
    batch = c.take(log, encode_envelope)
    assert batch is not None
    assert batch.envelopes == [es[2], es[3]]
    assert batch.first_seq == 1  # the superseded event counts: a resume starts there
    assert [bytes(r) for r in batch.raws] == [bytes(log.raw_of(e) or b"") for e in es[2:]]
    assert batch.size == sum(map(len, batch.raws))
    assert c.cursor == 4
    assert c.take(log, encode_envelope) is None  # nothing new


def test_a_merged_delta_is_encoded_anew_and_resumes_from_its_first_piece() -> None:
    log, _ = logged(
        (TextDelta(message_id="m", text="a"), "s1"), (TextDelta(message_id="m", text="b"), "s1")
    )
    batch = cohort().take(log, encode_envelope)
    assert batch is not None
    [merged] = batch.envelopes
    assert isinstance(merged.event, TextDelta)
    assert (merged.event.text, merged.seq, batch.first_seq) == ("ab", 2, 1)
    assert batch.raws == [encode_envelope(merged)]


def test_raw_deltas_and_lifecycle_events_skip_the_accumulator_keyed_ones_do_not() -> None:
    log, es = logged((TextDelta(message_id="m", text="a"), "s1"), (TurnStart(), "s1"))
    c = cohort(merge=False)
    batch = c.take(log, encode_envelope)
    assert batch is not None
    assert batch.envelopes == es
    assert c._acc.statistics().added == 0  # nothing could be thinned: not even looked at
    for tokens in (1, 2):
        e = env(log.head_seq + 1, Usage(tokens=TokenUsage(output_tokens=tokens)))
        log.append(e, encode_envelope(e))
    batch = c.take(log, encode_envelope)
    assert batch is not None
    assert [e.seq for e in batch.envelopes] == [4]  # the later snapshot won
    assert batch.first_seq == 3


_KINDS: dict[str, Event] = {
    "delta": TextDelta(message_id="m", text="x"),
    "usage": Usage(tokens=TokenUsage(output_tokens=1)),
    "info": SessionInfo(message="i"),
    "turn": TurnStart(),
}


@given(
    st.lists(st.tuples(st.sampled_from(sorted(_KINDS)), st.sampled_from(["s1", "s2"]))),
    st.sampled_from([(">",), ("stream.text.",), ("stream.session.", "stream.turn."), ("none",)]),
    st.sampled_from([None, {"s1"}]),
    st.booleans(),
)
def test_a_take_wants_what_judging_each_event_wants(
    events: list[tuple[str, str]], patterns: tuple[str, ...], sessions: set[str] | None, merge: bool
) -> None:
    """Types are judged once per take and whole slices taken at once: the same batch."""
    c = cohort(patterns, sessions=sessions, merge=merge)
    log, sent = logged(*((_KINDS[kind], session) for kind, session in events))
    wanted = [
        e
        for e in sent
        if c._matches(event_type(e.event)) and (sessions is None or e.session_id in sessions)
    ]
    assert c.first_pending(log) == (wanted[0].seq if wanted else None)
    batch = c.take(log, encode_envelope)
    if not wanted:
        assert batch is None
        return
    assert batch is not None
    acc = Accumulator(merge_deltas=merge)
    for e in wanted:
        acc.add(e)
    assert batch.envelopes == acc.drain()
    assert batch.raws == [encode_envelope(e) for e in batch.envelopes]
    assert batch.first_seq == wanted[0].seq


def test_first_pending_is_the_oldest_wanted_event_not_taken_yet() -> None:
    log, _ = logged((TurnStart(), "s2"), (TurnStart(), "s1"))
    c = cohort(sessions={"s1"})
    assert c.first_pending(log) == 2
    c.take(log, encode_envelope)
    assert c.first_pending(log) is None


# -- the daemon's fan-out ---------------------------------------------------------------


class Recorder:
    """A member's sends: what arrived, when, and whether it was sent without waiting."""

    def __init__(self) -> None:
        self.batches: list[tuple[float, list[Envelope[Event]]]] = []
        self.direct = 0
        self.writing: Callable[[], object] = lambda: None
        """Called in each direct send: the time a write takes."""

    async def send(self, batch: list[Envelope[Event]]) -> None:
        self.batches.append((trio.current_time(), batch))
        await trio.lowlevel.checkpoint()

    def send_shared(self, batch: SharedBatch) -> bool:
        self.writing()
        self.direct += 1
        self.batches.append((trio.current_time(), batch.envelopes))
        return True

    @property
    def events(self) -> list[Envelope[Event]]:
        return [e for _, b in self.batches for e in b]


@asynccontextmanager
async def daemon_running(**config: object) -> AsyncIterator[tuple[Daemon, trio.Nursery]]:
    daemon = Daemon(DaemonConfig(journal=None, **config))  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.run)
        yield daemon, nursery
        nursery.cancel_scope.cancel()


async def member(
    daemon: Daemon,
    nursery: trio.Nursery,
    *,
    patterns: tuple[str, ...] = (">",),
    window: float = 0.0,
    merge: bool = True,
    sessions: list[str] | None = None,
    sub_id: int = 1,
    recorder: Recorder | None = None,
) -> tuple[Subscription, Recorder]:
    recorder = Recorder() if recorder is None else recorder
    dispatcher = BatchDispatcher(
        recorder.send,
        window=window,
        merge_deltas=merge,
        max_events=daemon.config.subscription_buffer,
        send_shared=recorder.send_shared,
    )
    sub = Subscription(
        1, sub_id, patterns, sessions=sessions, owned_only=False, dispatcher=dispatcher
    )
    daemon.add_subscription(sub)
    await nursery.start(dispatcher.run)
    return sub, recorder


INFO = ("stream.session.info",)  # not what the accountant derives
DELTAS = ("stream.text.delta",)


async def test_identical_subscriptions_share_one_cohort_and_its_work() -> None:
    async with daemon_running() as (daemon, nursery):
        members = [await member(daemon, nursery, sub_id=i) for i in range(16)]
        await member(daemon, nursery, window=0.016)  # another pace
        await member(daemon, nursery, patterns=("stream.>",))  # other events
        await member(daemon, nursery, sessions=["s1"])
        await member(daemon, nursery, merge=False)
        assert daemon.fanout.statistics().cohorts == 5
        for i in range(20):
            daemon.publish(TextDelta(message_id="m", text=f"{i} "), session_id="s1")
            daemon.settle()
        stats = daemon.fanout.statistics()
        shared = members[0][0].cohort
        assert shared is not None
        assert shared is members[-1][0].cohort
        # Coalesced once for the 16, not 16 times: the cohort's accumulator saw each event once.
        assert shared._acc.statistics().added == 20
        assert stats.offered == stats.batches + 15 * 20  # each of the 20 batches to 16 members
        assert all(r.events == members[0][1].events for _, r in members)
        assert all(r.direct == 20 for _, r in members)  # idle members: no task switch
        for sub, _ in members:
            daemon.remove_subscription(sub)
        assert daemon.fanout.statistics().cohorts == 4


async def test_a_member_joining_as_the_last_one_of_its_cohort_goes_keeps_getting_events(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Joining gives the others what predates it; if they all go meanwhile, it needs a cohort.

    Found by the churn test: the joiner was left in the dropped cohort, which no
    pass took from any more, and the log trimmed past its cursor (its resume point
    then raised, failing its connection).
    """
    async with daemon_running() as (daemon, nursery):
        leaving, _ = await member(daemon, nursery, patterns=INFO, window=5.0)
        daemon.publish(SessionInfo(message="first"), session_id="s1")
        daemon.settle()  # goes at once: the window starts
        daemon.publish(SessionInfo(message="held"), session_id="s1")
        daemon.settle()  # held for the window
        leaving.dispatcher.close_nowait()  # its connection is going away: offering it fails
        joiner, got = await member(daemon, nursery, patterns=INFO, window=5.0, sub_id=2)
        assert leaving.cohort is None
        assert joiner.cohort is not None
        assert daemon.fanout.statistics().cohorts == 1
        after = [daemon.publish(SessionInfo(message=str(i)), session_id="s1") for i in range(3)]
        daemon.settle()
        assert got.events == after  # at once: its window starts
        later = daemon.publish(SessionInfo(message="later"), session_id="s1")
        daemon.settle()
        assert daemon.fanout.pending_seq(joiner) == later.seq  # held for the window
        await daemon.fanout.flush(joiner)
        assert got.events == [*after, later]


async def test_a_member_dropped_while_offered_does_not_cost_the_others_the_batch() -> None:
    async with daemon_running() as (daemon, nursery):
        members = [await member(daemon, nursery, patterns=INFO, sub_id=i) for i in range(3)]
        first, recorder = members[0]
        recorder.writing = lambda: daemon.remove_subscription(first)  # a slow consumer's drop
        sent = daemon.publish(SessionInfo(message="one"), session_id="s1")
        daemon.settle()
        assert [r.events for _, r in members] == [[sent]] * 3
        assert daemon.fanout.statistics().members == 2


async def test_a_cohort_that_fails_to_take_fails_its_members_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whatever raises in a cohort's take ends its members' connections, not the daemon."""
    take = Cohort.take

    def fragile(self: Cohort[object], log: Log, encode: Any) -> SharedBatch | None:
        if self.window == 0.5:
            raise RuntimeError("take exploded")
        return take(self, log, encode)

    monkeypatch.setattr(Cohort, "take", fragile)
    async with daemon_running() as (daemon, nursery):
        doomed, _ = await member(daemon, nursery, window=0.5, patterns=INFO)
        failures: list[Exception] = []
        doomed.on_error = failures.append
        _, healthy = await member(daemon, nursery, patterns=INFO)
        sent = daemon.publish(SessionInfo(message="one"), session_id="s1")
        daemon.settle()
        assert [str(e) for e in failures] == ["take exploded"]
        assert healthy.events == [sent]
        assert daemon.fanout.statistics().cohorts == 1  # the failed one is gone
        again = daemon.publish(SessionInfo(message="two"), session_id="s1")
        daemon.settle()
        assert healthy.events == [sent, again]


async def test_the_first_event_goes_at_once_and_the_rest_wait_for_the_window(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with daemon_running() as (daemon, nursery):
        _, r = await member(daemon, nursery, window=1.0, patterns=INFO)
        daemon.publish(SessionInfo(message="one"), session_id="s1")
        daemon.settle()
        await trio.sleep(0.25)
        daemon.publish(SessionInfo(message="two"), session_id="s1")
        daemon.publish(SessionInfo(message="three"), session_id="s1")
        daemon.settle()
        assert len(r.batches) == 1  # held by the cohort, not by the member
        assert daemon.fanout.statistics().held >= 2  # (with what the accountant derived)
        await trio.sleep(1)  # the fan-out's task takes it when the window ends
        assert [(t, len(b)) for t, b in r.batches] == [(0.0, 1), (1.0, 2)]
        assert daemon.fanout.statistics().held == 0


async def test_the_members_of_a_cohort_keep_one_phase_when_a_pass_takes_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Each member reading the clock anew put the later ones out of the shared batches."""
    async with daemon_running() as (daemon, nursery):
        members = []
        for i in range(16):
            _, r = await member(
                daemon, nursery, window=0.016, patterns=DELTAS, merge=False, sub_id=i
            )
            members.append(r)

        def slow_first_write() -> None:
            if not members[0].direct:
                autojump_clock.jump(0.001)  # the first pass's first write took a while

        members[0].writing = slow_first_write
        for i in range(100):
            daemon.publish(TextDelta(message_id="m", text=f"{i}"), session_id="s1")
            daemon.settle()
            await trio.sleep(0.005)
        await trio.sleep(1)
        assert [len(r.events) for r in members] == [100] * 16
        assert [r.direct for r in members] == [len(r.batches) for r in members]


async def test_a_member_that_joins_mid_window_gets_only_what_follows(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with daemon_running() as (daemon, nursery):
        _, early = await member(daemon, nursery, window=1.0, patterns=INFO)
        first = daemon.publish(SessionInfo(message="one"), session_id="s1")
        daemon.settle()
        await trio.sleep(0.2)
        held = daemon.publish(SessionInfo(message="two"), session_id="s1")
        daemon.settle()
        _, late = await member(daemon, nursery, window=1.0, patterns=INFO)
        after = daemon.publish(SessionInfo(message="three"), session_id="s1")
        daemon.settle()
        await trio.sleep(2)
        assert early.events == [first, held, after]
        times = [t for t, _ in early.batches]
        assert times[:2] == [0.0, 1.0]  # its window held, join or not
        assert all(b - a >= 1.0 for a, b in pairwise(times))
        assert late.events == [after]


async def test_a_window_full_of_events_is_taken_early_and_nothing_is_lost(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with daemon_running(subscription_buffer=8) as (daemon, nursery):
        sub, r = await member(daemon, nursery, window=30.0, merge=False, patterns=DELTAS)
        sent = []
        for i in range(50):
            sent.append(daemon.publish(TextDelta(message_id="m", text=f"{i}"), session_id="s1"))
            await trio.lowlevel.checkpoint()  # a connection's reader yields every so often
            assert daemon.fanout.statistics().held <= 8 // 2 + 1  # half the member's buffer
        await trio.sleep(60)  # the member sends what it buffered, as a burst always did
        assert r.events == sent
        assert not sub.dispatcher.statistics().overflowed


async def test_the_resume_point_counts_what_a_cohort_holds(autojump_clock: trio.abc.Clock) -> None:
    async with daemon_running() as (daemon, nursery):
        sub, _ = await member(daemon, nursery, window=5.0, sessions=["s1"], patterns=INFO)
        daemon.publish(SessionInfo(message="one"), session_id="s1")
        daemon.settle()
        daemon.publish(SessionInfo(message="other"), session_id="s2")
        held = daemon.publish(SessionInfo(message="two"), session_id="s1")
        daemon.settle()
        assert sub.dispatcher.pending_seq() is None  # the member has nothing
        assert daemon.fanout.pending_seq(sub) == held.seq  # its cohort has
        await daemon.fanout.flush(sub)  # a goodbye's flush: window or not
        assert daemon.fanout.pending_seq(sub) is None


@pytest.fixture
def sock_path() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="busd-", dir="/tmp"))
    yield directory / "bus.sock"
    shutil.rmtree(directory, ignore_errors=True)


def burst(i: int) -> list[Outgoing[Event]]:
    return [Outgoing(event=TextDelta(message_id="m", text=f"{i} "), session_id="s1")]


async def test_a_burst_that_ends_with_its_own_pass_does_not_wake_the_task() -> None:
    async with daemon_running() as (daemon, nursery):
        _, recorder = await member(daemon, nursery, patterns=DELTAS)
        await trio.testing.wait_all_tasks_blocked()
        woken = daemon.fanout.statistics().task_wakeups
        for i in range(10):
            daemon.publish_frame_and_settle(burst(i), source="t")
            await trio.testing.wait_all_tasks_blocked()
        assert daemon.fanout.statistics().task_wakeups == woken
        assert daemon.accountant.deferred_deltas < SETTLE_STRETCH  # accounted in stretches
        for i in range(10, 20):  # a pass after the burst, the task woken all the same
            daemon.publish_frame(burst(i), source="t")
            daemon.settle()
            await trio.testing.wait_all_tasks_blocked()
        assert daemon.fanout.statistics().task_wakeups == woken + 10
        assert [e.event for e in recorder.events] == [o.event for i in range(20) for o in burst(i)]


async def test_a_publishers_settle_accounts_its_deltas_once_a_stretch_of_them_waits() -> None:
    """Accounting a run has a cost of its own: bursts of a few deltas share it."""
    async with daemon_running() as (daemon, _):
        for i in range(SETTLE_STRETCH - 1):
            daemon.publish_frame_and_settle(burst(i), source="t")
        assert daemon.accountant.deferred_deltas == SETTLE_STRETCH - 1
        daemon.publish_frame_and_settle(burst(SETTLE_STRETCH - 1), source="t")
        assert daemon.accountant.deferred_deltas == 0
        daemon.publish_frame_and_settle(burst(0), source="t")
        stats = daemon.session_stats("s1")  # a read takes what waits
        assert daemon.accountant.deferred_deltas == 0
        assert stats is not None
        assert stats.output_tokens > 0


async def test_a_wake_up_held_back_without_a_pass_comes_at_the_release() -> None:
    async with daemon_running() as (daemon, nursery):
        _, recorder = await member(daemon, nursery, patterns=DELTAS)
        await trio.testing.wait_all_tasks_blocked()
        daemon.fanout.hold()
        daemon.publish_frame(burst(0), source="t")
        await trio.testing.wait_all_tasks_blocked()
        assert recorder.events == []  # held: nothing woke the task
        daemon.fanout.release()
        await trio.testing.wait_all_tasks_blocked()
        assert [e.event for e in recorder.events] == [burst(0)[0].event]


def frame_of(middle: Event, last: Event | None = None) -> list[Outgoing[Event]]:
    """Deltas, ``middle``, deltas (and ``last``): stretches in one publish frame."""

    def deltas() -> list[Outgoing[Event]]:
        return [
            Outgoing(event=TextDelta(message_id="m", text=f"{i} "), session_id="s1")
            for i in range(3)
        ]

    tail = [] if last is None else [Outgoing(event=last, session_id="s1")]
    return [*deltas(), Outgoing(event=middle, session_id="s1"), *deltas(), *tail]


async def test_a_burst_goes_out_before_the_bookkeeping_after_the_fan_out() -> None:
    """One pass, with the frame's last event: the handlers after the fan-out find it all sent,
    and the replay ring takes each run only once its pass is written (it is no frontend's wait)."""
    async with daemon_running() as (daemon, nursery):
        _, recorder = await member(daemon, nursery, merge=False)
        await trio.testing.wait_all_tasks_blocked()
        ring_at_write: list[int] = []
        recorder.writing = lambda: ring_at_write.append(daemon.history.head_seq)
        had: dict[int, int] = {}  # seq -> events the member had when a later handler saw it

        def later(envelope: Envelope[Event]) -> None:
            had[envelope.seq] = len(recorder.events)

        def later_run(run: list[Envelope[Event]]) -> None:
            for envelope in run:
                later(envelope)

        daemon.bus.on_all(later, many=later_run)
        first = daemon.bus.head_seq + 1
        daemon.publish_frame_and_settle(frame_of(SessionInfo(message="hi")), source="t")
        assert had == {first + i: 0 for i in range(4)} | {first + i: 7 for i in range(4, 7)}
        assert daemon.fanout.statistics().batches == 1
        assert [e.seq for e in recorder.events] == list(range(first, first + 7))
        # Written with the last run (seqs first+4..first+6) not in the ring yet; then it is.
        assert ring_at_write == [first + 3]
        assert daemon.history.head_seq == first + 6


class NoRoom(Recorder):
    """A member whose socket never has room for a direct write: its loop sends."""

    def send_shared(self, batch: SharedBatch) -> bool:
        return False


async def test_every_member_is_written_before_any_counts_the_batch_sent() -> None:
    """The dispatchers' bookkeeping of a pass comes after the cohort's last write: the
    later members' writes do not wait for the earlier members' counters. A member that is
    busy still gets the batch, buffered, and a flush still waits for what was written."""
    async with daemon_running() as (daemon, nursery):
        members = [await member(daemon, nursery, patterns=INFO) for _ in range(3)]
        slow, slow_recorder = await member(daemon, nursery, patterns=INFO, recorder=NoRoom())
        await trio.testing.wait_all_tasks_blocked()
        sent_at_writes: list[list[int]] = []
        for _, recorder in members:
            recorder.writing = lambda: sent_at_writes.append(
                [m.dispatcher.statistics().batches_sent for m, _ in members]
            )
        info = daemon.publish(SessionInfo(message="one"), session_id="s1")
        daemon.settle()
        assert sent_at_writes == [[0, 0, 0]] * 3
        assert [m.dispatcher.statistics().batches_sent for m, _ in members] == [1, 1, 1]
        for sub, recorder in members:
            await sub.dispatcher.flush()  # returns: the written batch counts as sent
            assert [e.event for e in recorder.events] == [info.event]
        await slow.dispatcher.flush()
        assert [e.event for e in slow_recorder.events] == [info.event]
        assert slow_recorder.direct == 0  # by the loop, after the failed attempt


async def test_what_handlers_publish_inside_a_burst_goes_out_once_in_order() -> None:
    """The daemon answers each session.idle with busd.stats: inside the frame it takes the
    next seq; after the last event, the settle's pass delivers it."""
    async with daemon_running() as (daemon, nursery):
        _, recorder = await member(daemon, nursery, merge=False)
        await trio.testing.wait_all_tasks_blocked()
        first = daemon.bus.head_seq + 1
        daemon.publish_frame_and_settle(frame_of(SessionIdle(), SessionIdle()), source="t")
        names = [event_type(e.event) for e in recorder.events]
        assert [e.seq for e in recorder.events] == list(range(first, first + 10))
        assert [i for i, name in enumerate(names) if name == "busd.stats"] == [4, 9]
        assert daemon.fanout.statistics().batches == 2  # the burst's pass, then the settle's


@pytest.mark.parametrize(
    "frame", [burst(0), [Outgoing(event=SessionInfo(message="hi"), session_id="s1")]]
)
async def test_a_pass_that_raises_inside_the_handler_leaves_the_events_booked(
    frame: list[Outgoing[Event]],
) -> None:
    """The bookkeeping after the pass runs whatever the pass does (a run, and one event)."""
    async with daemon_running() as (daemon, nursery):
        await member(daemon, nursery)

        def broken() -> None:
            raise RuntimeError("the pass failed")

        daemon.fanout.flush_nowait = broken  # type: ignore[method-assign]
        first = daemon.bus.head_seq + 1
        with pytest.raises(RuntimeError):  # the settle's own pass, outside the bus
            daemon.publish_frame_and_settle(frame, source="t")
        del daemon.fanout.flush_nowait  # before the task's next pass
        assert daemon.bus.statistics().handler_errors == 1  # the one inside it: isolated
        assert daemon.sessions.get("s1") is not None
        assert len(daemon.history.since(first - 1)) == len(frame)  # kept for resumes all the same


async def test_a_publisher_s_bursts_over_a_socket_do_not_wake_the_fanout_task(
    sock_path: Path,
) -> None:
    async with (
        running_daemon(sock_path) as server,
        connect(sock_path) as frontend,
        connect(sock_path, role="agent") as agent,
        frontend.subscribe(list(DELTAS), window_ms=0, deltas="raw") as sub,
    ):
        woken = server.daemon.fanout.statistics().task_wakeups
        for i in range(10):  # one frame a burst, as an agent streaming at its pace
            await agent.publish(TextDelta(message_id="m", text=f"{i} "), session_id="s1")
            with trio.fail_after(5):
                batch = await anext(sub)
            assert [e.event.text for e in batch.events] == [f"{i} "]  # type: ignore[attr-defined]
        assert server.daemon.fanout.statistics().task_wakeups == woken


async def test_the_readers_yield_never_cuts_a_small_frame_in_two(sock_path: Path) -> None:
    """The reader lets others run every 256 events, counted across frames. It cut the frame
    that crossed the count: its first part went out in a pass of the fan-out's task (a wake-up
    and a batch of its own), the rest with the burst's end. Small frames are kept whole."""
    async with (
        running_daemon(sock_path) as server,
        connect(sock_path) as frontend,
        frontend.subscribe(list(DELTAS), window_ms=0, deltas="raw") as sub,
    ):
        agent = await RawClient.open(sock_path, role="agent")
        woken = server.daemon.fanout.statistics().task_wakeups
        for i in range(120):  # 600 events in frames of 5, one frame a burst
            texts = [f"{i}.{k} " for k in range(5)]
            events = [
                Outgoing(event=TextDelta(message_id="m", text=t), session_id="s1") for t in texts
            ]
            await agent.send(Publish(events=events))
            with trio.fail_after(5):
                batch = await anext(sub)
            assert [e.event.text for e in batch.events] == texts  # type: ignore[attr-defined]
        assert server.daemon.fanout.statistics().task_wakeups == woken
        await agent.aclose()


async def test_a_publishers_burst_is_settled_once(
    sock_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A publish frame that ends what came in settles its burst itself (the pass, accounting,
    ids, the journal's stage); the reader settled it again before its next read, finding
    nothing to do at the price of a cold pass through all of them. A chunk that ends with
    another frame is still settled by the reader, once."""
    async with (
        running_daemon(sock_path) as server,
        connect(sock_path) as frontend,
        frontend.subscribe(list(DELTAS), window_ms=0, deltas="raw") as sub,
    ):
        daemon = server.daemon
        agent = await RawClient.open(sock_path, role="agent")
        await agent.send(Publish(events=burst(-1)))  # read after the hello's chunk was settled
        with trio.fail_after(5):
            await anext(sub)
        settles = 0
        settle = daemon.settle

        def counted() -> None:
            nonlocal settles
            settles += 1
            settle()

        monkeypatch.setattr(daemon, "settle", counted)
        for i in range(10):  # one frame a burst
            await agent.send(Publish(events=burst(i)))
            with trio.fail_after(5):
                batch = await anext(sub)
            assert [e.event.text for e in batch.events] == [f"{i} "]  # type: ignore[attr-defined]
        assert settles == 10
        await agent.send_bytes(encode_frame(Publish(events=burst(10))) + encode_frame(Ping()))
        with trio.fail_after(5):
            batch = await anext(sub)
        assert [e.event.text for e in batch.events] == ["10 "]  # type: ignore[attr-defined]
        assert settles == 11  # the ping ended the chunk: the reader settled the publish
        await agent.aclose()


async def test_publish_frames_that_came_in_together_go_out_in_one_pass(sock_path: Path) -> None:
    async with (
        running_daemon(sock_path) as server,
        connect(sock_path) as frontend,
        frontend.subscribe(list(DELTAS), window_ms=0, deltas="raw") as sub,
    ):
        agent = await RawClient.open(sock_path, role="agent")
        await agent.send_bytes(b"".join(encode_frame(Publish(events=burst(i))) for i in range(3)))
        with trio.fail_after(5):
            batch = await anext(sub)
        assert [e.event.text for e in batch.events] == ["0 ", "1 ", "2 "]  # type: ignore[attr-defined]
        assert server.daemon.fanout.statistics().batches == 1
        await agent.aclose()


async def test_nobody_subscribed_keeps_nothing() -> None:
    async with daemon_running() as (daemon, _):
        for _ in range(100):
            daemon.publish(SessionIdle(), session_id="s1")
        assert daemon.fanout.statistics().held == 0


# -- what subscribers see, whatever the mix (model-based) ---------------------------------

Step = tuple[str, int]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("delta"), st.integers(0, 1)),
            st.tuples(st.just("usage"), st.integers(1, 50)),
            st.tuples(st.just("info"), st.integers(0, 9)),
            st.tuples(st.just("settle"), st.just(0)),
            st.tuples(st.just("sleep"), st.sampled_from([1, 5, 20])),
            st.tuples(st.just("join"), st.sampled_from([0, 10])),
        ),
        max_size=60,
    )
)
def test_every_member_gets_what_followed_its_join_losslessly_in_order(steps: list[Step]) -> None:
    """Deltas concatenate to what was sent, lifecycle events all arrive, the last usage wins."""

    async def main() -> None:
        async with daemon_running() as (daemon, nursery):
            joined: list[tuple[int, Recorder]] = []  # (head seq at join, its recorder)
            published: list[Envelope[Event]] = []
            for kind, arg in steps:
                match kind:
                    case "delta":
                        text = f"{len(published)}|"
                        event: Event = TextDelta(message_id=f"m{arg}", text=text)
                        published.append(daemon.publish(event, session_id="s1"))
                    case "usage":
                        tokens = TokenUsage(output_tokens=arg)
                        published.append(daemon.publish(Usage(tokens=tokens), session_id="s1"))
                    case "info":
                        info = SessionInfo(message=str(arg))
                        published.append(daemon.publish(info, session_id="s1"))
                    case "settle":
                        daemon.settle()
                    case "sleep":
                        await trio.sleep(arg / 1000)
                    case "join":
                        head = daemon.bus.head_seq
                        _, r = await member(daemon, nursery, window=arg / 1000)
                        joined.append((head, r))
            for sub in list(daemon._subscriptions):
                await daemon.fanout.flush(sub)
            for head, r in joined:
                check(r, [e for e in published if e.seq > head])

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def check(r: Recorder, sent: list[Envelope[Event]]) -> None:
    got = [e for e in r.events if e.source != "busd.accounting"]
    seqs = [e.seq for e in got]
    assert seqs == sorted(set(seqs))
    for message in ("m0", "m1"):
        texts = [
            e.event.text
            for e in sent
            if isinstance(e.event, TextDelta) and e.event.message_id == message
        ]
        mine = [
            e.event.text
            for e in got
            if isinstance(e.event, TextDelta) and e.event.message_id == message
        ]
        assert "".join(mine) == "".join(texts)
    infos = [e for e in sent if isinstance(e.event, SessionInfo)]
    assert [e for e in got if isinstance(e.event, SessionInfo)] == infos
    usages = [e for e in sent if isinstance(e.event, Usage)]
    if usages:
        assert [e for e in got if isinstance(e.event, Usage)][-1] == usages[-1]


# -- the bytes on the wire ---------------------------------------------------------------


def test_a_frame_head_and_a_shared_array_are_exactly_an_events_frame() -> None:
    raws = [encode_envelope(env(s)) for s in range(1, 40)]
    packed = pack_events(raws)
    encoder = Encoder()
    for sub in (0, 7, 300, 70_000):
        frame = encoder.events_head(sub, packed) + packed
        assert frame == encoder.encode(Events(sub=sub, events=raws))


def test_what_is_left_of_a_shared_array_is_a_view_of_it_not_a_copy() -> None:
    body = bytes(range(256)) * 4
    out = Out(b"head", 7, tail=body)
    rest = out.rest(10)
    assert isinstance(rest.tail, memoryview)
    assert rest.tail.obj is body  # every member behind on its socket would copy it otherwise
    assert (rest.data, bytes(rest.tail), rest.since, rest.partial) == (b"", body[6:], 7, True)
    assert out.rest(2).data + bytes(out.rest(2).tail) == (b"head" + body)[2:]


async def test_frames_with_a_shared_array_arrive_whole_through_a_small_socket_buffer() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    sender = trio.SocketStream(trio.socket.from_stdlib_socket(a))
    receiver = trio.SocketStream(trio.socket.from_stdlib_socket(b))
    broken: list[bool] = []
    outbox = Outbox(
        sender,
        cap=1 << 30,
        hard_cap=1 << 30,
        on_overflow=lambda: None,
        on_broken=lambda: broken.append(True),
    )
    body = bytes(range(256)) * 200  # 51,200 bytes shared by every frame
    heads = [f"head-{i}".encode() for i in range(20)]
    expected = b"".join(head + body for head in heads)
    got = bytearray()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(outbox.run)
        await trio.testing.wait_all_tasks_blocked()
        outbox.push(heads[0], body, since=0)  # written through (writev), most of it waits
        for i, head in enumerate(heads[1:], 1):
            outbox.push(head, body, since=i)  # queued: the writer's sendmsg
        with trio.fail_after(10):
            while len(got) < len(expected):
                got += await receiver.receive_some(1 << 16)
        outbox.close()
    await sender.aclose()
    await receiver.aclose()
    assert bytes(got) == expected
    assert not broken


async def test_subscribers_of_one_cohort_receive_the_same_events_over_the_socket(
    tmp_path: Path,
) -> None:
    path = tmp_path / "busd.sock"
    async with (
        running_daemon(path) as server,
        connect(path, role="agent") as publisher,
        connect(path) as c1,
        connect(path) as c2,
        connect(path) as c3,
        c1.subscribe(["stream.text.delta"], deltas="raw", window_ms=0) as s1,
        c2.subscribe(["stream.text.delta"], deltas="raw", window_ms=0) as s2,
        c3.subscribe(["stream.text.delta"], deltas="raw", window_ms=0) as s3,
    ):
        assert server.daemon.fanout.statistics().cohorts == 1
        for i in range(300):
            publisher.publish_nowait(TextDelta(message_id="m", text=f"{i} "), session_id="s1")
        await publisher.flush()
        got = [await collect_n(s, 300) for s in (s1, s2, s3)]
        assert got[0] == got[1] == got[2]
        texts = [e.event.text for e in got[0] if isinstance(e.event, TextDelta)]
        assert texts == [f"{i} " for i in range(300)]


async def collect_n(sub: AsyncIterator[object], n: int) -> list[Envelope[Event]]:
    got: list[Envelope[Event]] = []
    with trio.fail_after(20):
        async for batch in sub:
            got.extend(batch.events)  # type: ignore[attr-defined]
            if len(got) >= n:
                break
    return got


def test_a_batch_over_the_frame_cap_is_shared_in_parts_packed_once() -> None:
    envelopes = [env(s, TextDelta(message_id="m", text="x" * 50)) for s in range(5, 45)]
    raws = [encode_envelope(e) for e in envelopes]
    batch = SharedBatch(envelopes, raws, 3, sum(map(len, raws)))  # 3, 4: superseded before
    cap = len(raws[0]) * 7 + 5
    parts = shared_parts(batch, cap)
    assert parts is not None
    assert len(parts) == 6  # 40 envelopes, 7 to a part
    assert all(len(p.body) <= cap + 5 for p in parts)  # the array's own head: 3 bytes
    assert [p.body for p in parts] == [pack_events(raws[i : i + 7]) for i in range(0, 40, 7)]
    # Each resumes after the last event of the one before it (the first: the batch's).
    assert [p.since for p in parts] == [2, 11, 18, 25, 32, 39]
    assert shared_parts(batch, cap) is parts  # packed once for every member
    whole = SharedBatch(envelopes, raws, 5, batch.size)
    assert [(p.since, p.body) for p in shared_parts(whole, batch.size) or []] == [
        (4, pack_events(raws))
    ]
    over = SharedBatch(envelopes, raws, 5, batch.size)
    assert shared_parts(over, len(raws[0]) - 1) is None  # no frame carries one of them


async def test_a_window_over_the_frame_cap_arrives_whole_and_in_order(tmp_path: Path) -> None:
    path = tmp_path / "busd.sock"
    config = DaemonConfig(journal=None, max_frame=4096)
    async with (
        running_daemon(path, config),
        connect(path, role="agent") as publisher,
        connect(path) as c1,
        connect(path) as c2,
        c1.subscribe(["stream.text.delta"], deltas="raw", window_ms=200) as s1,
        c2.subscribe(["stream.text.delta"], deltas="raw", window_ms=200) as s2,
    ):
        for i in range(300):  # about 30 KB of envelopes in one window: 8 or more frames
            publisher.publish_nowait(TextDelta(message_id="m", text=f"{i:>20} "), session_id="s1")
        await publisher.flush()
        got = [await collect_n(s, 300) for s in (s1, s2)]
        assert got[0] == got[1]
        texts = [e.event.text for e in got[0] if isinstance(e.event, TextDelta)]
        assert texts == [f"{i:>20} " for i in range(300)]
