from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from itertools import count

import msgspec
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from busd.core.cohorts import SharedBatch
from busd.core.errors import BusdError
from busd.core.events import Envelope, Event, TextDelta, TokenUsage, TurnEnd, TurnStart, Usage
from busd.daemon.batching import BatchDispatcher, Overflow, SubscriberOverflowed

Batch = list[Envelope[Event]]


class Sink:
    """A ``send`` that records (time, batch), can be held shut, and checks for overlap."""

    def __init__(self, *, delay: float = 0.0) -> None:
        self.batches: list[tuple[float, Batch]] = []
        self.delay = delay
        self.gate: trio.Event | None = None
        self.cancelled = 0
        self._busy = False
        self._changed = trio.Event()

    async def send(self, batch: Batch) -> None:
        assert batch, "empty batches are never sent"
        assert not self._busy, "two sends overlapped"
        self._busy = True
        try:
            self.batches.append((trio.current_time(), batch))
            self._changed.set()
            self._changed = trio.Event()
            if self.gate is not None:
                await self.gate.wait()
            if self.delay:
                await trio.sleep(self.delay)
        except trio.Cancelled:
            self.cancelled += 1
            raise
        finally:
            self._busy = False

    async def wait_for(self, n: int) -> None:
        while len(self.batches) < n:
            await self._changed.wait()

    @property
    def events(self) -> Batch:
        return [e for _, batch in self.batches for e in batch]


class Stream:
    def __init__(self) -> None:
        self._seq = count(1)

    def __call__(self, event: Event | None = None, session: str = "s1") -> Envelope[Event]:
        seq = next(self._seq)
        return Envelope(seq=seq, ts=seq / 10, event=event or TurnStart(), session_id=session)


@pytest.fixture
def env() -> Stream:
    return Stream()


@asynccontextmanager
async def running(dispatcher: BatchDispatcher) -> AsyncIterator[BatchDispatcher]:
    """Run the dispatcher's loop in a nursery around the block, closing it on the way out."""
    async with trio.open_nursery() as nursery:
        await nursery.start(dispatcher.run)
        yield dispatcher
        await dispatcher.aclose()


def usage(n: int) -> Usage:
    return Usage(tokens=TokenUsage(output_tokens=n))


# -- timing -------------------------------------------------------------------------


async def test_first_event_goes_out_at_once(autojump_clock: trio.abc.Clock, env: Stream) -> None:
    sink = Sink()
    async with running(BatchDispatcher(sink.send, window=1.0)) as d:
        t0 = trio.current_time()
        e1 = env()
        d.add(e1)
        await sink.wait_for(1)
        assert sink.batches == [(t0, [e1])]


async def test_events_within_the_window_go_out_together_when_it_ends(
    autojump_clock: trio.abc.Clock, env: Stream
) -> None:
    sink = Sink()
    async with running(BatchDispatcher(sink.send, window=1.0)) as d:
        t0 = trio.current_time()
        d.add(e1 := env())
        await sink.wait_for(1)
        await trio.sleep(0.25)
        d.add(e2 := env())
        await trio.sleep(0.5)
        d.add(e3 := env())
        await sink.wait_for(2)
        assert sink.batches == [(t0, [e1]), (t0 + 1.0, [e2, e3])]


async def test_first_event_after_a_quiet_window_goes_out_at_once(
    autojump_clock: trio.abc.Clock, env: Stream
) -> None:
    sink = Sink()
    async with running(BatchDispatcher(sink.send, window=1.0)) as d:
        d.add(env())
        await sink.wait_for(1)
        await trio.sleep(5)
        t1 = trio.current_time()
        d.add(e2 := env())
        await sink.wait_for(2)
        assert sink.batches[1] == (t1, [e2])


async def test_default_window_is_16_ms(autojump_clock: trio.abc.Clock, env: Stream) -> None:
    sink = Sink()
    async with running(BatchDispatcher(sink.send)) as d:
        assert d.window == 0.016
        t0 = trio.current_time()
        d.add(env())
        await sink.wait_for(1)
        d.add(env())
        await sink.wait_for(2)
        assert sink.batches[1][0] == pytest.approx(t0 + 0.016)


async def test_window_zero_delivers_every_add_without_waiting(
    autojump_clock: trio.abc.Clock, env: Stream
) -> None:
    sink = Sink()
    async with running(BatchDispatcher(sink.send, window=0)) as d:
        t0 = trio.current_time()
        sent: Batch = []
        for _ in range(5):
            d.add(e := env())
            sent.append(e)
            await sink.wait_for(len(sent))
        assert sink.batches == [(t0, [e]) for e in sent]


async def test_events_added_while_a_send_is_in_flight_travel_in_the_next_batch(
    autojump_clock: trio.abc.Clock, env: Stream
) -> None:
    sink = Sink(delay=3.0)
    async with running(BatchDispatcher(sink.send, window=1.0)) as d:
        t0 = trio.current_time()
        d.add(e1 := env())
        await sink.wait_for(1)
        d.add(e2 := env())
        d.add(e3 := env())
        await sink.wait_for(2)
        # the window had long passed when the slow send returned: no extra wait
        assert sink.batches == [(t0, [e1]), (t0 + 3.0, [e2, e3])]


async def test_flush_delivers_pending_events_without_waiting_for_the_window(
    autojump_clock: trio.abc.Clock, env: Stream
) -> None:
    sink = Sink()
    async with running(BatchDispatcher(sink.send, window=10.0)) as d:
        t0 = trio.current_time()
        d.add(e1 := env())
        d.add(e2 := env())  # added before the loop ran: same batch
        await sink.wait_for(1)
        d.add(e3 := env())
        d.add(e4 := env())
        await d.flush()
        assert sink.batches == [(t0, [e1, e2]), (t0, [e3, e4])]
        await d.flush()  # nothing pending: returns at once
        assert trio.current_time() == t0


async def test_flush_waits_for_the_send_in_flight_and_then_the_rest(
    autojump_clock: trio.abc.Clock, env: Stream
) -> None:
    sink = Sink(delay=2.0)
    async with running(BatchDispatcher(sink.send, window=10.0)) as d:
        t0 = trio.current_time()
        d.add(e1 := env())
        await sink.wait_for(1)
        d.add(e2 := env())
        await d.flush()
        assert sink.batches == [(t0, [e1]), (t0 + 2.0, [e2])]
        assert trio.current_time() == t0 + 4.0  # returned once the send returned


# -- content ------------------------------------------------------------------------


async def test_batches_are_coalesced(autojump_clock: trio.abc.Clock, env: Stream) -> None:
    sink = Sink()
    async with running(BatchDispatcher(sink.send, window=1.0)) as d:
        d.add(env(TurnStart()))
        await sink.wait_for(1)
        d.add(env(usage(1)))
        d.add(env(TextDelta(message_id="m", text="a")))
        d.add(d2 := env(TextDelta(message_id="m", text="b")))
        d.add(u3 := env(usage(3)))
        await d.flush()
        merged = msgspec.structs.replace(d2, event=TextDelta(message_id="m", text="ab"))
        assert sink.batches[1][1] == [merged, u3]


async def test_raw_mode_passes_deltas_one_by_one(
    autojump_clock: trio.abc.Clock, env: Stream
) -> None:
    sink = Sink()
    async with running(BatchDispatcher(sink.send, window=1.0, merge_deltas=False)) as d:
        deltas = [env(TextDelta(message_id="m", text=t)) for t in "abc"]
        for e in deltas:
            d.add(e)
        await d.flush()
        assert sink.events == deltas


async def test_order_is_preserved_across_many_batches(
    autojump_clock: trio.abc.Clock, env: Stream
) -> None:
    sink = Sink(delay=0.007)
    sent: Batch = []
    async with running(BatchDispatcher(sink.send, window=0.016)) as d:
        for i in range(2_000):
            d.add(e := env(TurnEnd() if i % 2 else TurnStart()))
            sent.append(e)
            if i % 3 == 0:
                await trio.sleep((i % 11) * 0.001)
        await d.flush()
        assert sink.events == sent
        stats = d.statistics()
        assert stats.events_sent == len(sent)
        assert stats.batches_sent == len(sink.batches)
        assert 1 < stats.batches_sent < len(sent)
        assert stats.largest_batch == max(len(b) for _, b in sink.batches)


# -- the cap ------------------------------------------------------------------------


async def test_slow_subscriber_overflows_with_the_seq_to_resume_from(
    autojump_clock: trio.abc.Clock, env: Stream
) -> None:
    sink = Sink()
    sink.gate = trio.Event()  # the subscriber never reads again
    d = BatchDispatcher(sink.send, window=0.016, max_events=3)
    async with trio.open_nursery() as nursery:
        await nursery.start(d.run)
        d.add(e1 := env())
        await sink.wait_for(1)  # e1 is in flight, stuck
        for _ in range(3):
            d.add(env())  # fills the buffer
        assert d.overflow is None
        d.add(env())  # one too many: synchronous, returns at once
        # run() returns by itself, so the nursery closes without help
    assert sink.cancelled == 1  # the stuck send was cancelled: e1's delivery is unconfirmed
    overflow = d.overflow
    assert overflow is not None
    assert overflow == Overflow(resume_seq=e1.seq, dropped=5)
    assert overflow.since_seq == e1.seq - 1  # replay everything after it: e1 included
    d.add(env())  # ignored, but counted
    assert d.overflow == Overflow(resume_seq=e1.seq, dropped=6)
    stats = d.statistics()
    assert stats.overflowed
    assert (stats.dropped, stats.buffered, stats.events_sent) == (6, 0, 0)
    with pytest.raises(SubscriberOverflowed, match=f"resume from seq {e1.seq}") as info:
        await d.flush()
    assert info.value.overflow == d.overflow
    assert isinstance(info.value, BusdError)
    assert isinstance(info.value, trio.BrokenResourceError)
    await d.aclose()  # harmless after an overflow
    assert d.overflow == Overflow(resume_seq=e1.seq, dropped=6)


async def test_overflow_wakes_a_pending_flush(autojump_clock: trio.abc.Clock, env: Stream) -> None:
    sink = Sink()
    sink.gate = trio.Event()
    d = BatchDispatcher(sink.send, max_events=1)
    with pytest.RaisesGroup(SubscriberOverflowed):
        async with trio.open_nursery() as nursery:
            await nursery.start(d.run)
            d.add(env())
            nursery.start_soon(d.flush)
            await sink.wait_for(1)
            d.add(env())
            d.add(env())


async def test_a_burst_fills_the_buffer_while_nothing_is_in_flight_goes_out_at_once(
    autojump_clock: trio.abc.Clock, env: Stream
) -> None:
    sink = Sink()
    async with running(BatchDispatcher(sink.send, window=1.0, max_events=3)) as d:
        t0 = trio.current_time()
        d.add(e1 := env())
        await sink.wait_for(1)
        burst = [env() for _ in range(6)]
        for e in burst:
            d.add(e)  # the fourth hands the full buffer to the loop as the next batch
        await sink.wait_for(3)
        assert d.overflow is None
        assert sink.batches == [(t0, [e1]), (t0, burst[:3]), (t0 + 1.0, burst[3:])]


async def test_a_second_full_buffer_before_the_loop_runs_overflows(
    autojump_clock: trio.abc.Clock, env: Stream
) -> None:
    sink = Sink()
    d = BatchDispatcher(sink.send, window=1.0, max_events=2)
    burst = [env() for _ in range(5)]
    for e in burst:
        d.add(e)
    assert d.overflow == Overflow(resume_seq=burst[0].seq, dropped=5)
    await d.run()  # returns at once: nothing will be delivered
    assert sink.batches == []


# -- closing --------------------------------------------------------------------------


async def test_close_flushes_pending_events_then_ends_the_loop(
    autojump_clock: trio.abc.Clock, env: Stream
) -> None:
    sink = Sink()
    d = BatchDispatcher(sink.send, window=10.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(d.run)
        t0 = trio.current_time()
        d.add(e1 := env())
        await sink.wait_for(1)
        d.add(e2 := env())
        await d.aclose()
        assert sink.batches == [(t0, [e1]), (t0, [e2])]
    # run() returned by itself
    with pytest.raises(trio.ClosedResourceError):
        d.add(env())
    await d.aclose()  # idempotent
    await d.flush()  # everything accepted was delivered
    with pytest.raises(trio.ClosedResourceError):
        await d.run()


async def test_close_without_a_running_loop_sends_what_is_pending(env: Stream) -> None:
    sink = Sink()
    d = BatchDispatcher(sink.send)
    d.add(e1 := env())
    d.add(e2 := env())
    await d.aclose()
    assert sink.events == [e1, e2]
    with pytest.raises(trio.ClosedResourceError):
        d.add(env())


async def test_cancelled_close_abandons_the_pending_events(
    autojump_clock: trio.abc.Clock, env: Stream
) -> None:
    sink = Sink()
    sink.gate = trio.Event()
    d = BatchDispatcher(sink.send)
    async with trio.open_nursery() as nursery:
        await nursery.start(d.run)
        d.add(env())
        await sink.wait_for(1)
        d.add(env())
        with trio.move_on_after(1):
            await d.aclose()
    assert sink.cancelled == 1
    assert len(sink.batches) == 1
    with pytest.raises(trio.ClosedResourceError):
        d.add(env())


async def test_cancelling_the_loop_closes_the_dispatcher(
    autojump_clock: trio.abc.Clock, env: Stream
) -> None:
    d = BatchDispatcher(Sink().send)
    async with trio.open_nursery() as nursery:
        await nursery.start(d.run)
        nursery.cancel_scope.cancel()
    with pytest.raises(trio.ClosedResourceError):
        d.add(env())


async def test_a_failing_send_ends_the_loop_and_breaks_the_dispatcher(env: Stream) -> None:
    async def send(batch: Batch) -> None:
        raise OSError("connection reset")

    d = BatchDispatcher(send)
    d.add(env())
    with pytest.raises(OSError, match="connection reset"):
        await d.run()
    with pytest.raises(trio.BrokenResourceError):
        d.add(env())
    with pytest.raises(trio.BrokenResourceError):
        await d.flush()


# -- the rest -------------------------------------------------------------------------


async def test_run_can_only_be_called_once(autojump_clock: trio.abc.Clock) -> None:
    d = BatchDispatcher(Sink().send)
    async with running(d):
        with pytest.raises(RuntimeError, match="once"):
            await d.run()


async def test_statistics_report_the_traffic(autojump_clock: trio.abc.Clock, env: Stream) -> None:
    sink = Sink()
    async with running(BatchDispatcher(sink.send, window=1.0)) as d:
        d.add(env())
        await sink.wait_for(1)
        d.add(env(usage(1)))
        d.add(env(usage(2)))
        d.add(env())
        stats = d.statistics()
        assert (stats.batches_sent, stats.events_sent, stats.buffered) == (1, 1, 2)
        assert (stats.sending, stats.overflowed, stats.dropped) == (False, False, 0)
        assert stats.accumulator.superseded == 1
        await d.flush()
        stats = d.statistics()
        assert (stats.batches_sent, stats.events_sent, stats.largest_batch) == (2, 3, 2)
        assert stats.buffered == 0


@pytest.mark.parametrize("window", [-0.1, float("inf"), float("nan")])
def test_window_must_be_a_finite_non_negative_number(window: float) -> None:
    with pytest.raises(ValueError, match="window"):
        BatchDispatcher(Sink().send, window=window)


# -- shared batches (offer and send_shared) ----------------------------------------


class DirectSink(Sink):
    """A :class:`Sink` that also takes shared batches synchronously while it has ``room``."""

    def __init__(self) -> None:
        super().__init__()
        self.room = True
        self.direct = 0

    def send_shared(self, batch: SharedBatch) -> bool:
        assert batch.envelopes, "empty batches are never sent"
        assert not self._busy, "a direct send overlapped a send in flight"
        if not self.room:
            return False
        self.direct += 1
        self.batches.append((trio.current_time(), batch.envelopes))
        self._changed.set()
        self._changed = trio.Event()
        return True


def shared(envelopes: Batch, first_seq: int | None = None) -> SharedBatch:
    """A cohort's batch as the fan-out offers it (the bytes do not matter here)."""
    raws = [msgspec.Raw(b"") for _ in envelopes]
    first = envelopes[0].seq if first_seq is None else first_seq
    return SharedBatch(envelopes, raws, first, 0)


@asynccontextmanager
async def direct(
    sink: DirectSink, *, window: float = 0.0, max_events: int = 10_000
) -> AsyncIterator[BatchDispatcher]:
    dispatcher = BatchDispatcher(
        sink.send,
        window=window,
        merge_deltas=False,
        max_events=max_events,
        send_shared=sink.send_shared,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(dispatcher.run)
        yield dispatcher
        await dispatcher.aclose()
        nursery.cancel_scope.cancel()


async def test_an_offered_batch_goes_out_at_once_without_waking_the_loop(
    autojump_clock: trio.abc.Clock, env: Stream
) -> None:
    sink = DirectSink()
    async with direct(sink) as d:
        burst = [env() for _ in range(3)]
        d.offer(shared(burst))
        assert sink.batches == [(0.0, burst)]  # synchronously: no task switch
        assert sink.direct == 1
        await trio.sleep(1)
        d.offer(shared([later := env()]))
        assert sink.events == [*burst, later]
        assert d.statistics().batches_sent == 2
        assert d.statistics().events_sent == 4


async def test_a_refused_offer_is_sent_by_the_loop_in_order(
    autojump_clock: trio.abc.Clock, env: Stream
) -> None:
    sink = DirectSink()
    sink.room = False
    sink.gate = trio.Event()
    async with direct(sink) as d:
        first = [env(), env()]
        d.offer(shared(first))
        await sink.wait_for(1)  # the loop's send, held at the gate
        assert d.statistics().sending
        assert d.pending_seq() == first[0].seq
        d.offer(shared([second := env()]))  # the loop is busy: it buffers, no direct send
        assert sink.direct == 0
        sink.room = True
        sink.gate.set()
        await d.flush()
        assert [b for _, b in sink.batches] == [first, [second]]
        assert sink.direct == 0
        d.offer(shared([third := env()]))  # idle again, with room: direct
        assert sink.events[-1] is third
        assert sink.direct == 1


async def test_an_offer_keeps_the_subscribers_window(
    autojump_clock: trio.abc.Clock, env: Stream
) -> None:
    sink = DirectSink()
    async with direct(sink, window=1.0) as d:
        d.offer(shared([env()]))
        await trio.sleep(0.25)
        d.offer(shared([env()]))
        d.offer(shared([env()]))
        await sink.wait_for(2)
        assert [(t, len(b)) for t, b in sink.batches] == [(0.0, 1), (1.0, 2)]
        assert sink.direct == 1  # the second batch waited for the window, in the loop


async def test_a_buffered_offer_resumes_from_the_batchs_first_event(env: Stream) -> None:
    # A merged delta carries the seq of the last delta it holds: resuming from it
    # would skip the others.
    sink = DirectSink()
    d = BatchDispatcher(sink.send, window=0, send_shared=sink.send_shared)  # not running
    merged = env(TextDelta(message_id="m", text="abc"))
    d.offer(shared([merged], first_seq=merged.seq - 2))
    assert d.pending_seq() == merged.seq - 2
    assert sink.direct == 0  # its loop is not running: nothing goes out yet
    d.close_nowait()


async def test_offers_that_overflow_count_every_event_of_the_batch(
    autojump_clock: trio.abc.Clock, env: Stream
) -> None:
    sink = DirectSink()
    sink.room = False
    sink.gate = trio.Event()
    async with direct(sink, max_events=2) as d:
        d.offer(shared([first := env()]))
        await sink.wait_for(1)  # in flight, held
        d.offer(shared([env() for _ in range(5)]))  # 2 fit the buffer, the third overflows
        overflow = d.overflow
        assert overflow is not None
        assert overflow.resume_seq == first.seq
        assert overflow.dropped == 6  # the batch in flight and all five
        d.offer(shared([env(), env()]))
        assert d.statistics().dropped == 8


def test_without_send_shared_an_offer_waits_for_the_loop(env: Stream) -> None:
    async def main() -> None:
        sink = DirectSink()
        async with running(BatchDispatcher(sink.send, window=0)) as d:
            await trio.testing.wait_all_tasks_blocked()
            d.offer(shared([e := env()]))
            assert sink.events == []
            await d.flush()
            assert sink.events == [e]
            assert sink.direct == 0

    trio.run(main)


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from([0.0, 0.016]),
    st.lists(
        st.tuples(st.integers(1, 5), st.booleans(), st.sampled_from([0, 0, 0.001, 0.01, 0.03])),
        min_size=1,
        max_size=40,
    ),
)
def test_offers_and_loop_sends_together_deliver_everything_once_in_order(
    window: float, steps: list[tuple[int, bool, float]]
) -> None:
    """Batches, refusals and pauses in any mix: every event once, in order, no overlap."""

    async def main() -> None:
        env = Stream()
        sink = DirectSink()
        sink.delay = 0.005
        added: Batch = []
        async with direct(sink, window=window, max_events=10_000) as d:
            for burst, room, pause in steps:
                sink.room = room
                batch = [env() for _ in range(burst)]
                d.offer(shared(batch))
                added.extend(batch)
                if pause:
                    await trio.sleep(pause)
            await d.flush()
            assert sink.events == added
            assert d.statistics().events_sent == len(added)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
