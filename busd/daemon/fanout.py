"""The daemon's fan-out: cohorts of subscriptions reading the shared log, one task for all.

Per event the daemon does a fixed amount of work, whatever the number of
subscribers (:meth:`Fanout.append`: add it, encoded once, to the log, and
make sure a pass is coming). A *pass* (:meth:`Fanout.flush_nowait`: a
publisher's burst is over, or the fan-out's own task woke) takes, for each
cohort whose window has passed, the slice since its cursor, filtered and
coalesced once (:class:`~busd.core.cohorts.Cohort`), and offers that one
:class:`~busd.core.cohorts.SharedBatch` to each member's
:class:`~busd.daemon.batching.BatchDispatcher`. A member that keeps up
writes the shared bytes at once; one that is behind buffers and catches up
in its own loop, as before. The task sleeps until the earliest window of a
cohort that waits. docs/performance.md has the measurements.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Protocol

import msgspec
import trio

from ..core.coalesce import Keyer
from ..core.cohorts import Cohort, Log, SharedBatch, SharedPart
from ..core.events import Envelope, Event
from ..wire import encode_envelope, pack_events
from .batching import BatchDispatcher

__all__ = ["Fanout", "FanoutStatistics", "Member", "shared_parts"]

logger = logging.getLogger("busd.daemon")


class Member(Protocol):
    """What the fan-out needs of a subscription (:class:`busd.daemon.hub.Subscription`)."""

    dispatcher: BatchDispatcher
    cohort: Cohort[Member] | None

    @property
    def filtered(self) -> bool:
        """Whether :meth:`admits` must see each event (sessions, owner)."""

    def cohort_key(self) -> Hashable:
        """Equal for members that want the same events at the same pace."""

    def matches(self, name: str) -> bool: ...
    def admits(self, envelope: Envelope[Event]) -> bool: ...
    def failed(self, exc: Exception) -> None:
        """Offering to it raised: its connection ends."""


@dataclass(frozen=True, slots=True)
class FanoutStatistics:
    cohorts: int
    members: int
    held: int
    """Events the log holds for cohorts whose window has not passed."""
    passes: int
    """Passes that found something to take (a publisher's settle or the task)."""
    task_wakeups: int
    batches: int
    """Shared batches taken: one per cohort per window with wanted events."""
    offered: int
    """Batches offered to members: ``offered / batches`` is the sharing."""


Drop = Callable[[Member], None]


class Fanout:
    """Cohorts over one log; :meth:`run` in the daemon's nursery paces the windows.

    ``drop`` is told about a member whose dispatcher refused a batch (its
    connection is going away) or failed (its connection ends): the daemon
    removes that subscription. ``limit`` bounds the log: past it, every
    cohort takes what it holds, window or not (its members buffer it,
    coalescing, as a burst always did).
    """

    def __init__(
        self,
        *,
        keyer: Keyer,
        max_merged_chars: int,
        limit: int,
        head_seq: int = 0,
        drop: Drop,
    ) -> None:
        self.log = Log(head_seq=head_seq)
        self._keyer = keyer
        self._max_merged_chars = max_merged_chars
        self._limit = limit
        self._drop = drop
        self._cohorts: dict[Hashable, Cohort[Member]] = {}
        self._pending = False  # appended since the last pass
        self._held = 0  # callers whose own pass comes before they wait (hold)
        self._owed = False  # a wake-up held back
        self._pass_with: Event | None = None  # a hold's pass: with the append of this event
        self._wakeup = trio.Event()
        self._sleeping_until = math.inf
        self._in_task = False  # the task's own pass: it sleeps afterwards anyway
        self._passes = 0
        self._woken = 0
        self._batches = 0
        self._offered = 0

    # -- per event ---------------------------------------------------------------

    def append(self, envelope: Envelope[Event], raw: msgspec.Raw) -> None:
        """Log one accepted event (its bytes already encoded); a pass will offer it."""
        log = self.log
        log.append(envelope, raw)
        if not self._cohorts:
            log.trim(envelope.seq)  # nobody reads: nothing to keep
            return
        if not self._pending:
            self._pending = True
            self._wake()
        elif len(log) == self._limit:
            self._wakeup.set()
        if envelope.event is self._pass_with:
            self._pass_now()

    def extend(self, envelopes: list[Envelope[Event]], raws: list[msgspec.Raw]) -> None:
        """:meth:`append` a run at once."""
        log = self.log
        log.extend(envelopes, raws)
        if not self._cohorts:
            log.trim(log.head_seq)
            return
        if not self._pending:
            self._pending = True
            self._wake()
        if len(log) >= self._limit > len(log) - len(envelopes):
            self._wakeup.set()
        if envelopes[-1].event is self._pass_with:
            self._pass_now()

    def _pass_now(self) -> None:
        self._pass_with = None
        self.flush_nowait()

    def _wake(self) -> None:
        if self._held:
            self._owed = True
        else:
            self._wakeup.set()

    def hold(self, *, pass_with: Event | None = None) -> None:
        """Appends do not wake the task until :meth:`release`: the caller passes first.

        A publisher whose burst ends calls :meth:`flush_nowait` itself; the
        task it would have woken would find nothing (a task switch per
        burst at a steady rate). Hold only across synchronous code.
        ``pass_with``: the pass comes from the append of this event (the
        burst's last), before the daemon's handlers after the fan-out's do
        their bookkeeping: the subscribers read meanwhile. What handlers
        publish in reply comes after it, and goes out with the next pass.
        """
        self._held += 1
        if pass_with is not None:
            self._pass_with = pass_with

    def release(self) -> None:
        """End a :meth:`hold`; a wake-up held back that no pass made moot happens now."""
        self._held -= 1
        if self._held:
            return
        self._pass_with = None
        if self._owed:
            self._owed = False
            if self._pending:
                self._wakeup.set()

    # -- members -----------------------------------------------------------------

    def join(self, member: Member) -> None:
        """Add ``member`` to the cohort of its key; it gets the events after the head."""
        key = member.cohort_key()
        cohort = self._cohorts.get(key)
        log = self.log
        if cohort is not None and cohort.cursor < log.head_seq:
            # What the others have not been given yet predates this member: give it
            # to them now (their dispatchers keep their windows). Those whose
            # connections are going away leave meanwhile, maybe all of them.
            self._take(cohort, trio.current_time(), force=True)
            cohort = self._cohorts.get(key)
        if cohort is None:
            dispatcher = member.dispatcher
            cohort = self._cohorts[key] = Cohort(
                key,
                matches=member.matches,
                admits=member.admits if member.filtered else None,
                window=dispatcher.window,
                merge_deltas=dispatcher.merge_deltas,
                cursor=log.head_seq,
                keyer=self._keyer,
                max_merged_chars=self._max_merged_chars,
            )
        cohort.members.append(member)
        member.cohort = cohort

    def leave(self, member: Member) -> None:
        cohort = member.cohort
        if cohort is None:
            return
        member.cohort = None
        if member in cohort.members:
            cohort.members.remove(member)
        if not cohort.members and self._cohorts.get(cohort.key) is cohort:
            del self._cohorts[cohort.key]
            self._trim()

    def pending_seq(self, member: Member) -> int | None:
        """The oldest seq ``member`` wants that its cohort has not taken yet."""
        cohort = member.cohort
        return None if cohort is None else cohort.first_pending(self.log)

    async def flush(self, member: Member) -> None:
        """Deliver what ``member`` was given or may take, window or not (its dispatcher's flush)."""
        cohort = member.cohort
        if cohort is not None and cohort.cursor < self.log.head_seq:
            self._take(cohort, trio.current_time(), force=True)
        await member.dispatcher.flush()

    # -- passes ------------------------------------------------------------------

    def flush_nowait(self) -> None:
        """A pass: each cohort whose window has passed takes and offers what it has."""
        if not self._pending:
            return
        self._pending = False
        self._owed = False  # what waits for a window has its deadline below
        log = self.log
        head = log.head_seq
        now = trio.current_time()
        over = len(log) >= self._limit
        deadline = math.inf
        took = False
        for cohort in list(self._cohorts.values()):
            if cohort.cursor >= head:
                continue
            due = cohort.last_flush + cohort.window
            if now >= due or over:
                took = True
                self._take(cohort, now)
            else:
                deadline = min(deadline, due)
        if took:
            self._passes += 1
        if deadline < math.inf:
            self._pending = True  # the task comes back for it
        self._trim()
        if deadline < self._sleeping_until:  # sooner than the task planned to wake
            self._sleeping_until = deadline
            if not self._in_task:
                self._wakeup.set()

    def _take(self, cohort: Cohort[Member], now: float, *, force: bool = False) -> None:
        try:
            batch = cohort.take(self.log, encode_envelope)
        except Exception as exc:  # its members' connections fail, not this pass nor the daemon
            cohort.cursor = self.log.head_seq
            for member in tuple(cohort.members):
                member.failed(exc)
                self._drop(member)
            return
        if batch is None:
            return
        if not force:
            cohort.last_flush = now
        self._batches += 1
        self._offer(cohort, batch, now)

    def _offer(self, cohort: Cohort[Member], batch: SharedBatch, now: float) -> None:
        """Write the batch to every idle member first, then do their bookkeeping.

        A member's dispatcher counting a batch sent is no one's wait: the
        later members' writes go before it (docs/performance.md, "A shorter
        path in Python"). A busy member buffers it, as :meth:`BatchDispatcher.offer` does.
        """
        dead = []
        written = []
        # A copy: a member's connection may drop its subscriptions as it is offered
        # (a slow consumer), and the members after it must still get the batch.
        for member in tuple(cohort.members):
            dispatcher = member.dispatcher
            try:
                if dispatcher.write_now(batch, now):  # one clock for all: one phase
                    written.append(dispatcher)
                else:
                    dispatcher.offer(batch, now)
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                dead.append(member)  # its connection is going away
            except Exception as exc:  # that member's connection fails, not this pass
                dead.append(member)
                member.failed(exc)
        for dispatcher in written:
            dispatcher.written(batch, now)
        self._offered += len(cohort.members)
        for member in dead:
            self._drop(member)

    def _trim(self) -> None:
        log = self.log
        cursors = [c.cursor for c in self._cohorts.values()]
        log.trim(min(cursors) if cursors else log.head_seq)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Pass whenever events come in or a window ends, until cancelled."""
        task_status.started()
        while True:
            if self._sleeping_until == math.inf:
                await self._wakeup.wait()  # no window to wait for: no cancel scope either
            else:
                with trio.move_on_at(self._sleeping_until):
                    await self._wakeup.wait()
            self._wakeup = trio.Event()
            self._sleeping_until = math.inf
            self._woken += 1
            # Nothing pending: a publisher's settle() took it all before we ran (a
            # window that ends leaves _pending set, as does anything appended since).
            self._in_task = True
            try:
                self.flush_nowait()
            finally:
                self._in_task = False

    def statistics(self) -> FanoutStatistics:
        return FanoutStatistics(
            cohorts=len(self._cohorts),
            members=sum(len(c.members) for c in self._cohorts.values()),
            held=len(self.log),
            passes=self._passes,
            task_wakeups=self._woken,
            batches=self._batches,
            offered=self._offered,
        )


def shared_parts(batch: SharedBatch, cap: int) -> list[SharedPart] | None:
    """``batch`` as ``events`` arrays of at most ``cap`` bytes of envelopes, packed once.

    The first member to send the batch packs it; the others send the same
    parts. A batch over ``cap`` (a long window at a high rate) goes as
    several frames, each still shared, where it used to fall back to every
    member encoding its own. ``None`` if one envelope alone is over ``cap``:
    no frame carries it, and the member's own send reports it. Every member
    of a daemon passes the same ``cap``.
    """
    if batch.parts is not None:
        return batch.parts
    raws = batch.raws
    if batch.size <= cap:
        parts = [SharedPart(batch.first_seq - 1, pack_events(raws))]
    else:
        parts = []
        since, start = batch.first_seq - 1, 0
        while start < len(raws):
            end, size = start, 0
            while end < len(raws) and size + len(raws[end]) <= cap:
                size += len(raws[end])
                end += 1
            if end == start:
                return None
            parts.append(SharedPart(since, pack_events(raws[start:end])))
            since, start = batch.envelopes[end - 1].seq, end
    batch.parts = parts
    return parts
