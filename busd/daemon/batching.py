"""The per-subscriber flush loop: one coalesced batch per window, in order, never blocking the bus.

:class:`BatchDispatcher` is the thin Trio shell around a
:class:`~busd.core.coalesce.Accumulator`. Events come in synchronously,
one by one (:meth:`~BatchDispatcher.add`) or as a batch coalesced for a
whole cohort (:meth:`~BatchDispatcher.offer`, the daemon's fan-out); the
owner runs :meth:`~BatchDispatcher.run` in its own nursery, and that loop
hands batches to an async ``send`` callable one at a time.

Timing: a batch goes out when ``window`` seconds have passed since the
previous one started, so the first event after a quiet period goes out at
once and events that arrive while a send is in flight, or within the window,
travel together. ``window=0`` sends whatever is buffered as soon as the loop
runs.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

import trio

from ..core.coalesce import (
    DEFAULT_MAX_MERGED_CHARS,
    Accumulator,
    AccumulatorFull,
    AccumulatorStatistics,
    Keyer,
    coalescing_key,
)
from ..core.cohorts import SharedBatch
from ..core.errors import BusdError
from ..core.events import Envelope, Event

__all__ = [
    "DEFAULT_WINDOW",
    "BatchDispatcher",
    "DispatcherStatistics",
    "Overflow",
    "SubscriberOverflowed",
]

DEFAULT_WINDOW: Final = 0.016
"""Seconds between two batches to one subscriber (about one frame at 60 Hz)."""

Send = Callable[[list[Envelope[Event]]], Awaitable[object]]
SendShared = Callable[[SharedBatch], bool]
"""Takes a cohort's batch at once and returns ``True``, or ``False`` when it would have to wait."""


@dataclass(frozen=True, slots=True)
class Overflow:
    """Why a dispatcher stopped: its subscriber could not keep up.

    ``resume_seq`` is the ``seq`` of the oldest event whose delivery was not
    confirmed (the subscriber resumes from there and skips any ``seq`` it has
    already seen); ``dropped`` counts the events given to ``add`` that will
    never be delivered by this dispatcher, those buffered included.
    """

    resume_seq: int
    dropped: int

    @property
    def since_seq(self) -> int:
        """The last ``seq`` delivered in full: the wire's ``goodbye.resume_seq``/``since_seq``."""
        return self.resume_seq - 1


class SubscriberOverflowed(BusdError, trio.BrokenResourceError):
    """:meth:`BatchDispatcher.flush` cannot deliver: the subscriber overflowed."""

    def __init__(self, overflow: Overflow) -> None:
        super().__init__(
            f"the subscriber fell behind; resume from seq {overflow.resume_seq} "
            f"({overflow.dropped} events dropped)"
        )
        self.overflow = overflow


@dataclass(frozen=True, slots=True)
class DispatcherStatistics:
    batches_sent: int
    events_sent: int
    """Survivors delivered (after coalescing), the sum of the batch sizes."""
    largest_batch: int
    buffered: int
    """Survivors waiting for a send (the batch in flight not included)."""
    sending: bool
    """A send is in flight."""
    overflowed: bool
    dropped: int
    accumulator: AccumulatorStatistics


class _State(enum.Enum):
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"
    OVERFLOWED = "overflowed"
    BROKEN = "broken"


_OPEN: Final = _State.OPEN


class BatchDispatcher:
    """Coalesces one subscriber's events and hands them to ``send`` one batch per window.

    ``send(batch)`` receives a non-empty list of envelopes in ``seq`` order;
    two sends never overlap. It may be cancelled when the subscriber
    overflows, and a cancelled send counts as not delivered.

    Shared batches: :meth:`offer` takes a batch the daemon coalesced once
    for a whole cohort of subscriptions. When the loop is idle, nothing is
    buffered and the window has passed, it goes to ``send_shared`` at once
    (the owner writes it without waiting, or returns ``False``: the loop then
    sends it); otherwise it is buffered, coalescing with what waits, as
    :meth:`add` would. A subscriber that keeps up thus costs no task switch
    and no per-event work; one that falls behind catches up on its own.

    Capacity: at most ``max_events`` survivors wait behind a send in flight.
    If the buffer fills while no send is in flight (a burst faster than the
    loop gets to run), it becomes the next batch at once, window or not. If
    it fills again before that batch has been sent, or while a send is in
    flight, the dispatcher *overflows*: it cancels the send in flight, keeps
    an :class:`Overflow` in :attr:`overflow`, ignores (and counts) every later
    :meth:`add`, and :meth:`run` returns. The publisher is never blocked and
    nothing is dropped silently.
    """

    __slots__ = (
        "_acc",
        "_added",
        "_batches_sent",
        "_done",
        "_drained",
        "_events_sent",
        "_failure",
        "_flush_target",
        "_idle",
        "_ignored",
        "_inflight_first",
        "_largest_batch",
        "_last_flush",
        "_lost",
        "_progress",
        "_ran",
        "_ready",
        "_ready_first",
        "_ready_ticket",
        "_resume_seq",
        "_scope",
        "_send",
        "_send_shared",
        "_sent",
        "_state",
        "_wakeup",
        "_window",
    )

    def __init__(
        self,
        send: Send,
        *,
        window: float = DEFAULT_WINDOW,
        merge_deltas: bool = True,
        max_events: int = 10_000,
        keyer: Keyer = coalescing_key,
        max_merged_chars: int = DEFAULT_MAX_MERGED_CHARS,
        send_shared: SendShared | None = None,
    ) -> None:
        if not (window >= 0 and math.isfinite(window)):
            raise ValueError(f"window must be a finite number of seconds >= 0, not {window!r}")
        self._send = send
        self._send_shared = send_shared
        self._window = window
        self._acc = Accumulator(
            keyer=keyer,
            merge_deltas=merge_deltas,
            max_events=max_events,
            max_merged_chars=max_merged_chars,
        )
        self._state = _State.OPEN
        # A full buffer handed over while no send was in flight.
        self._ready: list[Envelope[Event]] | None = None
        self._ready_first = 0
        self._ready_ticket = 0
        # Tickets count accepted adds: flush() waits until ``_sent`` reaches its ticket.
        self._added = 0
        self._drained = 0
        self._sent = 0
        self._flush_target = 0
        self._inflight_first: int | None = None
        self._last_flush = -math.inf
        self._idle = False
        self._wakeup = trio.Event()
        self._progress = trio.lowlevel.ParkingLot()
        self._done = trio.Event()
        self._scope = trio.CancelScope()
        self._ran = False
        self._resume_seq: int | None = None
        self._failure: Exception | None = None
        self._lost = 0
        self._ignored = 0
        self._batches_sent = 0
        self._events_sent = 0
        self._largest_batch = 0

    @property
    def window(self) -> float:
        return self._window

    @property
    def overflow(self) -> Overflow | None:
        """What was lost, once the subscriber has overflowed; ``None`` before."""
        if self._resume_seq is None:
            return None
        return Overflow(resume_seq=self._resume_seq, dropped=self._lost + self._ignored)

    # -- the publisher's side (synchronous, never blocks) ----------------------

    @property
    def merge_deltas(self) -> bool:
        return self._acc.merge_deltas

    def add(self, envelope: Envelope[Event]) -> None:
        """Buffer ``envelope`` for the next batch.

        Never blocks. After an overflow it ignores the event (counted in
        :attr:`overflow`); after :meth:`aclose` it raises
        :class:`trio.ClosedResourceError`, and after the loop died of an
        exception :class:`trio.BrokenResourceError`.
        """
        if self._state is not _OPEN:
            self._add_when_not_open(1)
            return
        if self._buffer(envelope):
            self._woken()

    def offer(self, batch: SharedBatch, now: float | None = None) -> None:
        """Deliver a cohort's batch: at once when this subscriber is idle, else buffered.

        ``batch`` is already coalesced; it stands for the events from
        ``batch.first_seq`` on (the resume point if it is not delivered).
        Never blocks; raises as :meth:`add` does. An exception from
        ``send_shared`` propagates to the caller, and the batch counts as
        not delivered. ``now`` is the time of the caller's pass: members of
        one cohort then keep one phase (each reading the clock anew would put
        the later ones a little behind, and out of the shared batches).
        """
        if self._state is not _OPEN:
            self._add_when_not_open(len(batch.envelopes))
            return
        if now is None:
            now = trio.current_time()
        if self.write_now(batch, now):
            self.written(batch, now)
            return
        if self._at_once(now):  # no room: the loop sends it, waiting as a send does
            self._added += len(batch.envelopes)
            self._ready, self._ready_first, self._ready_ticket = (
                batch.envelopes,
                batch.first_seq,
                self._added,
            )
            self._woken()
            return
        envelopes = batch.envelopes
        for i, envelope in enumerate(envelopes):
            if not self._buffer(envelope):  # overflowed: the rest is ignored, and counted
                self._ignored += len(envelopes) - i - 1
                return
        self._acc.hold_from(batch.first_seq)
        self._woken()

    def _at_once(self, now: float) -> bool:
        """Whether a batch offered now goes to ``send_shared`` rather than the buffer."""
        return (
            self._state is _OPEN
            and self._idle
            and self._ready is None
            and not self._acc
            and self._send_shared is not None
            and now >= self._last_flush + self._window
        )

    def write_now(self, batch: SharedBatch, now: float) -> bool:
        """:meth:`offer`'s path for an idle subscriber, up to the write and no further.

        ``True``: ``batch`` went to ``send_shared``; call :meth:`written`
        for it, which the fan-out does once every member of the cohort was
        written (the bookkeeping waits, the later members' writes do not).
        ``False``: nothing happened (busy, window not passed, no room, not
        open); :meth:`offer` it. Raises as :meth:`offer` does.
        """
        send_shared = self._send_shared
        if send_shared is None or not self._at_once(now):
            return False
        self._inflight_first = batch.first_seq  # if send_shared raises: not delivered
        done = send_shared(batch)
        self._inflight_first = None
        return done

    def written(self, batch: SharedBatch, now: float) -> None:
        """The bookkeeping of a batch :meth:`write_now` wrote: counted as sent at ``now``."""
        self._added += len(batch.envelopes)
        self._drained = self._sent = self._added
        self._last_flush = now
        self._sent_batch(len(batch.envelopes))

    def _buffer(self, envelope: Envelope[Event]) -> bool:
        """Add one envelope to the buffer; ``False`` when the subscriber overflowed instead."""
        acc = self._acc
        try:
            acc.add(envelope)
        except AccumulatorFull:
            if self._ready is not None or self._inflight_first is not None:
                self._overflow()
                return False
            # Nothing is being sent: flush now instead of giving up on a fast subscriber.
            self._ready_first = _first_seq(acc)
            self._ready = acc.drain()
            self._ready_ticket = self._added
            self._wakeup.set()
            acc.add(envelope)
        self._added += 1
        return True

    def _woken(self) -> None:
        """Something waits: an idle loop wakes up for it."""
        if self._idle:
            self._idle = False
            self._wakeup.set()

    def _add_when_not_open(self, events: int) -> None:
        state = self._state
        if state is _State.OVERFLOWED:
            self._ignored += events
        elif state is _State.BROKEN:
            raise trio.BrokenResourceError("the dispatcher's send failed; it delivers no more")
        else:
            raise trio.ClosedResourceError("the dispatcher is closed")

    def _overflow(self) -> None:
        # Either a send is in flight (it gets cancelled, so its delivery is not
        # confirmed) or a full batch is ready: both are older than the buffer.
        inflight = self._inflight_first
        self._resume_seq = self._ready_first if inflight is None else inflight
        self._state = _State.OVERFLOWED
        self._lost = self._added - self._sent
        self._ignored = 1
        self._ready = None
        self._acc.clear()
        self._scope.cancel()
        self._progress.unpark_all()

    # -- the owner's side -------------------------------------------------------

    def since(self, batch: list[Envelope[Event]]) -> int:
        """The resume point before a batch being handed to ``send``: before its first event."""
        first = self.pending_seq()
        return (first if first is not None else batch[0].seq) - 1

    def pending_seq(self) -> int | None:
        """The oldest ``seq`` given to ``add`` whose ``send`` has not returned, if any.

        A connection uses it to tell a client it drops where to resume from.
        After the loop failed, the batch it was sending still counts.
        """
        if self._inflight_first is not None:
            return self._inflight_first
        if self._ready is not None:
            return self._ready_first
        return self._acc.first_seq

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The flush loop; run it in the owner's nursery: ``await nursery.start(d.run)``.

        Returns after :meth:`aclose` (everything flushed) or when the
        subscriber overflowed (see :attr:`overflow`). An exception from
        ``send`` propagates, and the
        dispatcher is then broken.
        """
        if self._state in (_State.CLOSING, _State.CLOSED):
            raise trio.ClosedResourceError("the dispatcher is closed")
        if self._ran:
            raise RuntimeError("BatchDispatcher.run() can only be called once")
        self._ran = True
        try:
            with self._scope:
                task_status.started()
                await self._loop()
        except trio.Cancelled:
            self._stopped(_State.CLOSED)  # the owner cancelled us: as good as closed
            raise
        except BaseException:
            self._stopped(_State.BROKEN)
            raise
        finally:
            self._stopped(_State.CLOSED)
            if self._state is not _State.BROKEN:  # broken, it was not delivered: pending_seq
                self._inflight_first = None
            self._forget_senders()
            self._done.set()
            self._progress.unpark_all()

    def _forget_senders(self) -> None:
        """Nothing is sent any more: drop the owner's callbacks.

        They are usually closures over the subscription that holds this
        dispatcher; kept, the pair would be a cycle only the garbage
        collector frees.
        """
        self._send = _send_nowhere
        self._send_shared = None

    def _stopped(self, state: _State) -> None:
        """The loop ended: a dispatcher that was still delivering becomes ``state``."""
        if self._state is _State.OPEN or self._state is _State.CLOSING:
            self._state = state

    async def _loop(self) -> None:
        acc = self._acc
        while self._state is not _State.OVERFLOWED:
            if self._failure is not None:
                raise self._failure
            batch = self._ready
            if batch is not None:
                self._ready = None
                first, ticket = self._ready_first, self._ready_ticket
            elif acc:
                deadline = self._last_flush + self._window
                if (
                    self._state is _State.OPEN
                    and self._flush_target <= self._drained
                    and trio.current_time() < deadline
                ):
                    self._wakeup = trio.Event()
                    with trio.move_on_at(deadline):
                        await self._wakeup.wait()
                    continue
                first, ticket = _first_seq(acc), self._added
                batch = acc.drain()
            elif self._state is _State.CLOSING:
                return
            else:
                self._wakeup = trio.Event()
                self._idle = True
                await self._wakeup.wait()
                self._idle = False
                continue
            await self._deliver(batch, first, ticket)

    async def _deliver(self, batch: list[Envelope[Event]], first: int, ticket: int) -> None:
        self._drained = ticket
        self._inflight_first = first
        self._last_flush = trio.current_time()
        await self._send(batch)
        self._inflight_first = None
        self._sent = ticket
        self._sent_batch(len(batch))

    def _sent_batch(self, size: int) -> None:
        self._batches_sent += 1
        self._events_sent += size
        if size > self._largest_batch:
            self._largest_batch = size
        if self._progress:  # someone flushes: the common case has nobody to wake
            self._progress.unpark_all()

    async def flush(self) -> None:
        """Deliver everything added so far, window or not; return once ``send`` returned.

        Needs :meth:`run` to be running (or to start). Raises
        :class:`SubscriberOverflowed` if the subscriber overflows first,
        :class:`trio.ClosedResourceError` or :class:`trio.BrokenResourceError`
        if the loop ended without delivering.
        """
        target = self._added
        if self._sent >= target:
            self._raise_if_overflowed()
            await trio.lowlevel.checkpoint()
            return
        self._flush_target = max(self._flush_target, target)
        self._wakeup.set()
        while self._sent < target:
            self._raise_if_overflowed()
            if self._done.is_set():
                if self._state is _State.BROKEN:
                    raise trio.BrokenResourceError("the dispatcher's send failed")
                raise trio.ClosedResourceError("the dispatcher stopped before delivering")
            await self._progress.park()

    def _raise_if_overflowed(self) -> None:
        overflow = self.overflow
        if overflow is not None:
            raise SubscriberOverflowed(overflow)

    async def aclose(self) -> None:
        """Flush what is pending, then end the loop; :meth:`add` raises from now on.

        Without a running loop the pending events are sent from here. If this
        is cancelled, the loop is cancelled too and what was pending is lost.
        Calling it again, or after an overflow, is harmless.
        """
        state = self._state
        if state is _State.OPEN:
            self._state = _State.CLOSING
            if not self._ran:
                try:
                    await self._close_without_loop()
                finally:
                    self._state = _State.CLOSED
                    self._forget_senders()
                    self._done.set()
                    self._progress.unpark_all()
                return
            self._wakeup.set()
        elif state is _State.OVERFLOWED:
            self._state = _State.CLOSED
        if self._ran and not self._done.is_set():
            try:
                await self._done.wait()
            except trio.Cancelled:
                self._scope.cancel()
                raise
        else:
            await trio.lowlevel.checkpoint()

    def close_nowait(self) -> None:
        """End at once, discarding what is pending (an unsubscribe, a dropped client).

        :meth:`add` raises :class:`trio.ClosedResourceError` from now on and
        the loop, if running, is cancelled; nothing more is sent.
        """
        if self._state in (_State.CLOSED, _State.BROKEN):
            return
        self._state = _State.CLOSED
        self._ready = None
        self._acc.clear()
        self._forget_senders()
        self._scope.cancel()
        if not self._ran:
            self._done.set()
        self._progress.unpark_all()

    async def _close_without_loop(self) -> None:
        self._ran = True
        for batch, first, ticket in self._take_everything():
            await self._deliver(batch, first, ticket)
        await trio.lowlevel.checkpoint()

    def _take_everything(self) -> list[tuple[list[Envelope[Event]], int, int]]:
        batches = []
        if self._ready is not None:
            batches.append((self._ready, self._ready_first, self._ready_ticket))
            self._ready = None
        if self._acc:
            first = _first_seq(self._acc)
            batches.append((self._acc.drain(), first, self._added))
        return batches

    def statistics(self) -> DispatcherStatistics:
        overflow = self.overflow
        return DispatcherStatistics(
            batches_sent=self._batches_sent,
            events_sent=self._events_sent,
            largest_batch=self._largest_batch,
            buffered=len(self._acc) + (len(self._ready) if self._ready is not None else 0),
            sending=self._inflight_first is not None and self._state is not _State.BROKEN,
            overflowed=overflow is not None,
            dropped=0 if overflow is None else overflow.dropped,
            accumulator=self._acc.statistics(),
        )


async def _send_nowhere(batch: list[Envelope[Event]]) -> None:
    """The send of a dispatcher that sends nothing any more."""


def _first_seq(acc: Accumulator) -> int:
    first = acc.first_seq
    assert first is not None, "a non-empty accumulator has a first seq"
    return first
