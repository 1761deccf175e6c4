"""The journal: every accepted event kept in SQLite, for restarts, resumes and ``busd export``.

The daemon hands each accepted envelope and its msgpack bytes (the ones it
already encoded for fan-out) to :meth:`Journal.append`: a list append, on
the hot path. What piles up is written in one transaction per batch, in a
worker thread, every ``interval`` seconds or every ``batch_events``
events. At a steady rate a publisher's burst's end (:meth:`Journal.stage_now`)
stages the events into that transaction and starts the write when it is
due, so the loop spends no task switch on either; the writer task
(:meth:`Journal.run`) writes what no burst's end does. The highest seq
committed is the *journaled watermark*: every event up to it is in the
file, or recorded as lost.

docs/journal.md states the promise (what survives a crash, backpressure
on publishers when the disk is slow, ``seq`` reservations, retention) and
the schema. :class:`JournalFile` is the writer and :class:`JournalReader`
a read-only view, both synchronous, run in worker threads
(:mod:`.journalfile`); a resume reads a :class:`JournalSpan` (:mod:`.journalspan`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Final, TypeAlias, TypeVar

import msgspec
import outcome
import trio

from ..core.events import Envelope, Event
from .handoff import Handoff
from .journalfile import (
    DEFAULT_MAX_AGE,
    DEFAULT_MAX_SIZE,
    JournalError,
    JournalFile,
    Opened,
    Retention,
    SessionRow,
    Written,
    session_row,
)
from .journalprune import prune_rounds
from .journalranges import Published, overlap
from .journalranges import describe as describe_ranges
from .journalranges import merge as merge_ranges
from .journalspan import Found, JournalSpan, Missing, page_items

__all__ = [
    "DEFAULT_MAX_AGE",
    "DEFAULT_MAX_PENDING",
    "DEFAULT_MAX_SIZE",
    "DEFAULT_STAGE_EVERY",
    "Found",
    "Journal",
    "JournalError",
    "JournalSpan",
    "Missing",
    "NotJournaled",
    "Published",
    "Retention",
    "page_items",
    "session_row",
]

logger = logging.getLogger("busd.journal")

_T = TypeVar("_T")

DEFAULT_MAX_PENDING: Final = 100_000
DEFAULT_MAX_WAIT: Final = 2.0
DEFAULT_INTERVAL: Final = 0.05
DEFAULT_BATCH_EVENTS: Final = 4096
DEFAULT_STAGE_EVERY: Final = 0.01
DEFAULT_STAGE_EVENTS: Final = 32

_PRUNE_EVERY = 600.0  # seconds between two age checks
_RETRY = 1.0  # seconds before a failed write is tried again
_EARLY = 0.2  # of the interval: a burst's end writes this much before the writer's deadline


class NotJournaled(JournalError):
    """Accepted events the journal does not hold: lost, or not written as the disk fails."""


# -- the Trio shell ------------------------------------------------------------------


@dataclass(slots=True)
class _Counters:
    lost: int = 0
    duplicates: int = 0
    write_errors: int = 0
    held: int = 0
    held_s: float = 0.0
    events: int = 0
    bytes: int = 0
    floor: int = 0


@dataclass(frozen=True, slots=True)
class _Write:
    """One transaction's contents, taken in the loop's thread and written in a worker's."""

    batch: list[Envelope[Event]]
    raws: list[msgspec.Raw]
    lost: list[tuple[int, int]]
    sessions: list[SessionRow]
    head: int
    reserved: int

    def run(self, file: JournalFile) -> Written:
        lost = [(a, b, "behind") for a, b in self.lost]
        return file.write(
            self.batch, self.raws, lost, self.sessions, head=self.head, reserved=self.reserved
        )


SessionsSince: TypeAlias = Callable[[int], list[SessionRow]]


class Journal:
    """Batches accepted events into the journal file, off the hot path.

    :param sessions: the ``sessions`` rows of every session with an event
        after a given seq (the daemon's registry, through :func:`session_row`).
    :param report: told, once per episode, that events were not journaled
        or that writes fail (the daemon publishes it as ``busd.internal.error``).
    """

    def __init__(
        self,
        file: JournalFile,
        opened: Opened,
        *,
        sessions: SessionsSince,
        report: Callable[[str], object] = lambda message: None,
        retention: Retention | None = None,
        max_pending: int = DEFAULT_MAX_PENDING,
        interval: float = DEFAULT_INTERVAL,
        batch_events: int = DEFAULT_BATCH_EVENTS,
        max_wait: float = DEFAULT_MAX_WAIT,
        stage_every: float = DEFAULT_STAGE_EVERY,
        stage_events: int = DEFAULT_STAGE_EVENTS,
    ) -> None:
        if max_pending < 2:
            raise ValueError("max_pending must be at least 2")
        self.file = file
        self.path = file.path
        self.retention = retention if retention is not None else Retention()
        self.max_pending = max_pending
        self.high_water = max_pending // 2
        self.max_wait = max_wait
        self.interval = interval
        self.batch_events = batch_events
        self.stage_every = stage_every
        self.stage_events = stage_events
        self._full_at = batch_events  # pending events that make a batch (some may be staged)
        self.restored = opened.sessions
        self.next_seq = opened.next_seq
        self.crashed = opened.crashed
        self._sessions = sessions
        self._report = report
        # Envelopes and their bytes side by side: no tuple per event for the collector to walk.
        self._pending: list[Envelope[Event]] = []
        self._pending_raws: list[msgspec.Raw] = []
        self._lost: list[tuple[int, int]] = []  # not journaled, not yet recorded
        self._flushing: list[Envelope[Event]] = []  # a write in flight
        self._flushing_raws: list[msgspec.Raw] = []
        self._flushing_lost: list[tuple[int, int]] = []
        self._journaled = opened.next_seq - 1
        self._sessions_seq = opened.next_seq - 1
        self._reserved = 0 if self._journaled == 0 else self._journaled + max_pending
        self._given = self._journaled  # the highest seq appended
        self._reserve_at = self._reserved - self.high_water  # past it, append reserves ahead
        self.unjournaled: list[tuple[int, int]] = []
        """Seqs given but not journaled when it closed (the daemon then exits non-zero)."""
        self._lost_log: list[tuple[int, int]] = []  # recorded lost in this life (for acks)
        self._write_error: str | None = None  # why the last write failed, until one works
        self._attempted = trio.Event()  # set (and replaced) after every write, good or not
        self._closed = False
        self._behind = False  # dropping events until the next write
        self._failing = False
        self._stalled = False  # publishers waited max_wait in vain: stop holding them
        self._wake = trio.Event()
        self._nudge = trio.Event()  # a full batch
        self._token: trio.lowlevel.TrioToken | None = None  # run()'s, for stages' answers
        self._stage: Handoff[Written | None] = Handoff()  # a stage or a write in a thread
        self._due = math.inf  # the gathering write is due then (a burst's end may write it)
        self._gather_scope: trio.CancelScope | None = None  # the writer's wait for it
        self._stage_from = -math.inf  # no stage before then (stage_every after the last)
        self._busy = False  # the task needs the file (a write, retention, the stop): no stage
        self._written = trio.Event()  # set (and replaced) by every successful write
        self._over_size = False
        stats = file.statistics()
        self._counters = _Counters(events=stats["events"], bytes=stats["bytes"])
        self._counters.floor = stats["floor"]

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        sessions: SessionsSince,
        keep_sessions: int = 10_000,
        **options: Any,
    ) -> Journal:
        """Open the file, recover from an unclean stop, reserve seqs (:class:`JournalError`)."""
        file = JournalFile.open(path)
        try:
            opened = file.recover(
                reserve=options.get("max_pending", DEFAULT_MAX_PENDING), sessions=keep_sessions
            )
            return cls(file, opened, sessions=sessions, **options)
        except sqlite3.Error as exc:
            file.close()
            raise JournalError(f"cannot use the journal {path}: {exc}") from None
        except BaseException:
            file.close()
            raise

    # -- the hot path ----------------------------------------------------------

    def append(self, envelope: Envelope[Event], raw: msgspec.Raw) -> None:
        """Queue one accepted envelope for the next write (never blocks, never fails)."""
        seq = self._given = envelope.seq
        if seq > self._reserve_at:
            self._reserve_ahead(seq)
        pending = self._pending
        if len(pending) + len(self._flushing) >= self.max_pending:
            self._drop(envelope.seq)
            return
        pending.append(envelope)
        self._pending_raws.append(raw)
        n = len(pending)
        if n == 1:
            self._wake.set()
        if n == self._full_at:
            self._nudge.set()

    def extend(self, envelopes: list[Envelope[Event]], raws: list[msgspec.Raw]) -> None:
        """:meth:`append` each of a run (in seq order) at once: a delta run's, on the hot path.

        A run that needs a reservation or would not fit goes one by one.
        """
        if not envelopes:
            return
        last = envelopes[-1].seq
        pending = self._pending
        before = len(pending)
        if last > self._reserve_at or before + len(self._flushing) + len(envelopes) > (
            self.max_pending
        ):
            for envelope, raw in zip(envelopes, raws, strict=True):
                self.append(envelope, raw)
            return
        self._given = last
        pending += envelopes
        self._pending_raws += raws
        n = len(pending)
        if not before:
            self._wake.set()
        if before < self._full_at <= n:
            self._nudge.set()

    def _reserve_ahead(self, seq: int) -> None:
        """Seqs near what the database reserved (its writes are behind or fail): reserve more
        in the lock file, so that not even a crash now gives a seq twice."""
        target = seq + self.max_pending
        if self.file.reserve_beside(target):
            self._reserved = target
            self._reserve_at = target - self.high_water
            return
        self._reserve_at = seq + max(self.high_water // 8, 1)  # try again a little later
        logger.error(
            "cannot reserve seqs in the lock file of %s: a crash now may give seqs after %d again",
            self.path,
            self._reserved,
        )

    def _drop(self, seq: int) -> None:
        self._counters.lost += 1
        lost = self._lost
        if lost and lost[-1][1] == seq - 1:
            lost[-1] = (lost[-1][0], seq)
        else:
            lost.append((seq, seq))
        self._wake.set()
        if not self._behind:
            self._behind = True
            self._report(
                f"the journal is {self.max_pending} events behind (the disk is too slow): "
                f"events from seq {seq} on are not journaled until it catches up"
            )

    # -- writing ---------------------------------------------------------------

    @property
    def journaled_seq(self) -> int:
        """Every event up to this seq is in the file or recorded as lost."""
        return self._journaled

    @property
    def pending(self) -> int:
        return len(self._pending) + len(self._flushing)

    @property
    def congested(self) -> bool:
        """Publishers should wait: half of ``max_pending`` events wait for the disk."""
        return len(self._pending) + len(self._flushing) >= self.high_water and not self._stalled

    async def room(self) -> None:
        """Wait until the journal is below its high-water mark (a publisher's backpressure).

        A disk stuck for ``max_wait`` seconds lets publishers go until the
        next write succeeds: the live stream does not stop for it, and what
        does not fit in ``max_pending`` is recorded as lost.
        """
        if not self.congested:
            return
        self._counters.held += 1
        started = trio.current_time()
        with trio.move_on_after(self.max_wait) as scope:
            while self.congested:
                await self._next(self._written)
        self._counters.held_s += trio.current_time() - started
        if scope.cancelled_caught and not self._stalled:
            self._stalled = True
            logger.warning("the journal has not written for %.1f s", self.max_wait)

    async def journaled(self, seq: int) -> None:
        """Return once every event up to ``seq`` is journaled (or recorded as lost)."""
        while self._journaled < seq:
            await self._next(self._written)

    async def durable(self, ranges: Sequence[tuple[int, int]]) -> None:
        """Return once every seq in ``ranges`` is journaled (an acknowledged publish).

        :raises NotJournaled: some of them were recorded lost (the disk fell
            behind, or the daemon stopped without writing them), or the last
            write failed and they wait for the next try.
        """
        if not ranges:
            return
        last = ranges[-1][1]
        while True:
            lost = overlap(ranges, [*self._lost_log, *self._flushing_lost, *self._lost])
            if lost:
                raise NotJournaled(
                    f"{sum(b - a + 1 for a, b in lost)} events (seqs {describe_ranges(lost)}) were "
                    "delivered but not journaled"
                )
            if self._journaled >= last:
                return
            if self._write_error is not None:
                raise NotJournaled(
                    f"cannot write the journal now ({self._write_error}); the events wait for "
                    "the next try"
                )
            if self._closed:
                raise NotJournaled("the daemon stopped before it wrote them")
            await self._next(self._attempted)

    async def _next(self, event: trio.Event) -> None:
        """Until ``event`` (the next write's) is set; a write in flight from a burst's end
        is answered now if it is done, else its thread wakes the loop for it."""
        self._stage.want()
        await event.wait()

    def _has_work(self) -> bool:
        return bool(self._pending or self._lost or self._flushing or self._flushing_lost)

    async def flush(self) -> bool:
        """Write everything queued so far in one transaction; ``False`` if the write failed."""
        await self._stage.wait()  # a stage's or a burst's write's answer first
        write = self._next_write()  # (_in_thread then holds the file at once: no checkpoint)
        if write is None:
            return True
        try:
            written = await self._in_thread(partial(write.run, self.file))
        except (sqlite3.Error, OSError) as exc:
            self._failed(exc)
            return False
        self._wrote(write, written)
        return True

    def _next_write(self) -> _Write | None:
        """The next transaction: a failed write's batch again, with what came since."""
        if self._pending or self._lost:  # new lists: a failed write's may still be referenced
            self._flushing = self._flushing + self._pending
            self._flushing_raws = self._flushing_raws + self._pending_raws
            self._flushing_lost = self._flushing_lost + self._lost
            self._pending, self._pending_raws, self._lost = [], [], []
        batch, lost = self._flushing, self._flushing_lost
        if not batch and not lost:
            return None
        head = max(batch[-1].seq if batch else 0, max((b for _, b in lost), default=0))
        sessions = self._sessions(self._sessions_seq)
        return _Write(batch, self._flushing_raws, lost, sessions, head, head + self.max_pending)

    def _failed(self, exc: BaseException) -> None:
        self._full_at = self.batch_events
        self._counters.write_errors += 1
        self._write_error = str(exc)
        self._attempted.set()
        self._attempted = trio.Event()
        logger.error("cannot write the journal %s: %s", self.path, exc)
        if not self._failing:
            self._failing = True
            self._report(f"cannot write the journal {self.path}: {exc} (retrying)")

    def _wrote(self, write: _Write, written: Written) -> None:
        batch, lost, head = write.batch, write.lost, write.head
        self._flushing, self._flushing_raws, self._flushing_lost = [], [], []
        self._full_at = self.batch_events
        self._stalled = False
        self._journaled = max(self._journaled, head)
        self._sessions_seq = max(self._sessions_seq, head)
        self._reserved = max(self._reserved, write.reserved)
        self._reserve_at = self._reserved - self.high_water
        self._written.set()
        self._written = trio.Event()
        self._write_error = None
        if lost:
            self._lost_log = merge_ranges([*self._lost_log, *lost])
        self._attempted.set()
        self._attempted = trio.Event()
        counters = self._counters
        counters.events += written.inserted
        counters.duplicates += len(batch) - written.inserted
        counters.bytes = written.bytes
        if self.retention.max_size is not None and written.bytes > self.retention.max_size:
            self._over_size = True
            self._nudge.set()  # the writer stops gathering and applies retention
        if lost:
            ranges = ", ".join(f"{a}..{b}" for a, b in lost)
            self._report(f"the journal caught up; events {ranges} were not journaled")
        if self._behind and not self._lost:
            self._behind = False
        if self._failing:
            self._failing = False
            self._report(f"the journal {self.path} is written again")

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Write batches, and apply retention at start, every 10 minutes and when over size."""
        self._token = trio.lowlevel.current_trio_token()
        task_status.started()
        prune_at = trio.current_time()
        while True:
            if trio.current_time() >= prune_at or self._over_size:
                await self.prune()
                prune_at = trio.current_time() + _PRUNE_EVERY
            if not self._has_work():
                self._wake = trio.Event()
                with trio.move_on_at(prune_at):
                    await self._wake.wait()
                continue
            if self._journaled and len(self._pending) < self._full_at:
                await self._gather()
            if not await self.flush():
                await trio.sleep(_RETRY)

    async def _gather(self) -> None:
        """Wait for the next write: ``interval``, or a full batch (stages come meanwhile).

        A burst's end that finds the write due writes it and moves the deadline
        (:meth:`stage_now`): at a steady rate this task does not wake.
        """
        self._due = trio.current_time() + self.interval
        try:
            while (
                len(self._pending) < self._full_at
                and trio.current_time() < self._due
                and not self._over_size
            ):
                self._nudge = trio.Event()
                with trio.move_on_at(self._due) as self._gather_scope:
                    await self._nudge.wait()
        finally:
            self._due, self._gather_scope = math.inf, None

    def stage_now(self) -> None:
        """At a publisher's burst's end: write what waits if the write is due, else stage it.

        The write is due from ``1 - _EARLY`` of the interval on (the writer
        task, woken at its deadline, would beat the bursts to nearly every
        write); it moves the task's deadline on. A stage inserts what waits
        into the write's transaction once ``stage_events`` wait, at most
        every ``stage_every`` seconds. Either runs in a worker thread while
        the file is free and leaves its answer for the next burst's end: the
        thread wakes the loop only for a task that waits for it (each wake-up
        was a lump of the loop's CPU between bursts, docs/performance.md).
        """
        if self._stage.busy:
            self._stage.take()
        if (
            self._stage.busy
            or self._busy
            or self._token is None
            or len(self._flushing) != self.file.staged  # after a failed write: the writer's
        ):
            return
        now = trio.current_time()
        if now >= self._due - self.interval * _EARLY and len(self._pending) < self._full_at:
            self._write_now(now, self._token)
            return
        pending = len(self._pending)
        if (
            pending < self.stage_events
            or pending >= self._full_at  # a full batch: the write is coming, it inserts them
            or self.stage_every <= 0
            or now < self._stage_from
        ):
            return
        self._stage_from = now + self.stage_every
        events, raws = self._pending, self._pending_raws
        self._pending, self._pending_raws = [], []
        self._flushing.extend(events)
        self._flushing_raws.extend(raws)
        self._full_at = max(1, self.batch_events - len(self._flushing))
        try:
            self._stage.start(
                partial(self.file.stage, events, raws), self._staged, token=self._token
            )
        except RuntimeError as exc:  # no thread to be had: the write inserts them
            logger.warning("cannot stage events in the journal %s: %s", self.path, exc)

    def _write_now(self, now: float, token: trio.lowlevel.TrioToken) -> None:
        """The write the writer task gathers for, from a burst's end: its deadline moves on."""
        write = self._next_write()
        if write is None:
            return
        try:
            self._stage.start(
                partial(write.run, self.file), partial(self._written_at_end, write), token=token
            )
        except RuntimeError as exc:  # no thread to be had: the writer task writes it
            logger.warning("cannot write the journal %s from a burst's end: %s", self.path, exc)
            return
        self._full_at = self.batch_events  # what comes now goes into the next transaction
        self._due = now + self.interval
        if self._gather_scope is not None:
            self._gather_scope.deadline = self._due

    def _written_at_end(self, write: _Write, result: outcome.Outcome[Written | None]) -> None:
        """A burst's end's write, answered in Trio's thread (as :meth:`flush` ends)."""
        match result:
            case outcome.Value(value=Written() as written):
                self._wrote(write, written)
            case outcome.Error(error=sqlite3.Error() | OSError() as exc):
                self._failed(exc)
            case outcome.Error(error=exc):  # a bug: the writer task's retry meets it too
                logger.error("the journal's write broke: %r", exc, exc_info=exc)
                self._failed(exc)

    def _staged(self, result: outcome.Outcome[Written | None]) -> None:
        """A stage's answer, in Trio's thread; a failure rolled it back: the write inserts all."""
        if isinstance(result, outcome.Error):
            exc = result.error
            if isinstance(exc, (sqlite3.Error, OSError)):
                logger.warning("cannot stage events in the journal %s: %s", self.path, exc)
            else:
                logger.error(
                    "cannot stage events in the journal %s: %r", self.path, exc, exc_info=exc
                )

    async def _in_thread(self, fn: Callable[[], _T]) -> _T:
        """``fn()`` in a worker thread with the file to itself: after a stage in flight,
        and no stage starts until it returns (one connection, one thread at a time)."""
        await self._stage.wait()
        with self._holding():
            return await trio.to_thread.run_sync(fn)

    @contextlib.contextmanager
    def _holding(self) -> Iterator[None]:
        """No stage starts while the writer uses the file (a use inside another keeps it)."""
        busy, self._busy = self._busy, True
        try:
            yield
        finally:
            self._busy = busy

    async def prune(self, now: float | None = None) -> int:
        """Apply retention now (``now``: epoch seconds, for tests); the events removed.

        Retention runs between writes, never inside one: what is staged is
        written first, and nothing is staged until it is done.
        """
        self._over_size = False
        if self._stage.busy or self.file.staged:
            await self.flush()  # committed, or rolled back by a failure: nothing staged
        when = time.time() if now is None else now
        with self._holding():
            try:
                return await prune_rounds(
                    self.file,
                    self.retention,
                    when,
                    self._counters,
                    in_thread=self._in_thread,
                    between=self._write_between,
                )
            except sqlite3.Error as exc:
                logger.error("journal retention failed on %s: %s", self.path, exc)
                return 0

    async def _write_between(self) -> None:
        """Write what came during a step of retention: a full journal's prune takes two
        seconds or more, and the events published meanwhile keep the 50 ms bound."""
        if self.pending:
            await self.flush()

    async def aclose(self) -> None:
        """Write what is left, release the reservation and close (the daemon is stopping).

        What cannot be written (a full or failing disk) is recorded as lost
        and the head set to the last seq given, so the next daemon starts
        after it: in the database if a small transaction still works, else
        in the lock file. The log says how many and which; ``unjournaled``
        lists them (the daemon then exits non-zero).
        """
        self._busy = True  # no stage starts any more; one in flight is waited for
        for _ in range(3):  # a failing disk gets a few tries, not forever
            if not self._has_work():
                break
            await self.flush()  # reports published meanwhile are written by the next round
        unwritten = self._unwritten()
        given = max(self._given, self._journaled)

        def finish() -> str:
            try:
                self.file.release(given, unwritten)
                return f"recorded as lost in the journal; the next start continues after {given}"
            except (sqlite3.Error, OSError) as exc:
                logger.error("cannot record the stop in the journal %s: %s", self.path, exc)
                if self.file.reserve_beside(given):
                    return f"the next start skips them (reserved up to {given} in the lock file)"
                return "nothing could record them: the next start may give these seqs again"
            finally:
                self.file.close()

        how = await self._in_thread(finish)
        self.unjournaled = unwritten
        self._lost_log = merge_ranges([*self._lost_log, *unwritten])
        self._closed = True
        self._attempted.set()
        if unwritten:
            logger.error(
                "%d events (seqs %s) were delivered but not journaled: %s",
                sum(b - a + 1 for a, b in unwritten),
                describe_ranges(unwritten),
                how,
            )

    def _unwritten(self) -> list[tuple[int, int]]:
        """Every seq queued or dropped and not written, as ranges."""
        seqs = sorted(e.seq for e in (*self._flushing, *self._pending))
        return merge_ranges([*self._flushing_lost, *self._lost, *((seq, seq) for seq in seqs)])

    # -- resuming --------------------------------------------------------------

    def span(self, after: int, upto: int) -> JournalSpan:
        """Capture seqs ``after < seq <= upto`` for a resume: call it synchronously."""
        queued = (
            (*self._flushing, *self._pending),
            (*self._flushing_raws, *self._pending_raws),
        )
        lost = (*self._flushing_lost, *self._lost)
        return JournalSpan.capture(self.path, after, upto, self._journaled, queued, lost)

    def statistics(self) -> dict[str, Any]:
        c = self._counters
        return {
            "path": str(self.path),
            "journaled_seq": self._journaled,
            "pending": self.pending,
            "events": c.events,
            "bytes": c.bytes,
            "oldest_seq": c.floor + 1 if c.events else None,
            "lost": c.lost,
            "duplicates": c.duplicates,
            "write_errors": c.write_errors,
            "held": c.held,
            "held_s": round(c.held_s, 3),
            "max_age_s": self.retention.max_age,
            "max_size": self.retention.max_size,
        }
