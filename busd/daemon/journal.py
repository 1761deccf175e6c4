"""The journal: every accepted event kept in SQLite, for restarts, resumes and ``busd export``.

The daemon hands each accepted envelope and its msgpack bytes (the ones it
already encoded for fan-out) to :meth:`Journal.append`: a list append, on
the hot path and synchronous. :meth:`Journal.run` writes what piled up in
one transaction per batch, in a worker thread, every ``interval`` seconds
or every ``batch_events`` events, whichever comes first. While a batch
gathers, a publisher's burst that ends (:meth:`Journal.stage_now`, the
daemon's ``settle``) stages the events into that transaction once
``stage_events`` wait, at most every ``stage_every`` seconds: the
thread's CPU in pieces, not one burst per write, and no task switch for
it (docs/performance.md, "Staged inserts"). The highest seq
committed is the *journaled watermark* (``status.journal.journaled_seq``):
every event up to it is in the file, or listed as lost.

The file is SQLite in WAL mode with ``synchronous=NORMAL``: a committed
batch survives the daemon being killed (the kernel has the bytes), not
necessarily a power cut (the last batches may go). docs/journal.md states
the promise and the schema.

A disk slower than the publishers slows them down: once half of
``max_pending`` events wait for it, connections that publish wait in
:meth:`Journal.room` before reading more (at most ``max_wait`` seconds per
stall). Memory stays bounded when the disk is stuck: at most
``max_pending`` events wait for it. Past that, events are still accepted,
delivered and kept in the replay ring, but not journaled: the range is
recorded as lost (reason ``behind``) and reported once as a
``busd.internal.error``.

``seq`` never goes back: every write also *reserves* the next
``max_pending`` seqs (the most that can be waiting when a write commits),
and a daemon that finds a reservation the last one did not release (it did
not stop cleanly) starts after it and records the skipped range as lost
(reason ``crash``). A resuming client gets a ``gap`` for lost ranges.

Retention (:class:`Retention`) removes the oldest events, as a prefix of
seq: everything older than ``max_age``, and more while the file is over
``max_size``. Sessions whose events are all gone go with them.

:class:`JournalFile` is the writer and :class:`JournalReader` a read-only
view (``busd sessions``, ``busd export``, resumes); both are synchronous and
run in worker threads (:mod:`.journalfile`); :class:`Journal` is the Trio
shell; a resume reads a :class:`JournalSpan` (:mod:`.journalspan`).
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
    JournalReader,
    Opened,
    Retention,
    SessionRecord,
    SessionRow,
    parse_duration,
    parse_size,
    session_row,
)
from .journalranges import Published, overlap
from .journalranges import describe as describe_ranges
from .journalranges import merge as merge_ranges
from .journalspan import Found, JournalSpan, Missing, memory_items, page_items

__all__ = [
    "DEFAULT_MAX_AGE",
    "DEFAULT_MAX_PENDING",
    "DEFAULT_MAX_SIZE",
    "DEFAULT_STAGE_EVERY",
    "Found",
    "Journal",
    "JournalError",
    "JournalReader",
    "JournalSpan",
    "Missing",
    "NotJournaled",
    "Published",
    "Retention",
    "SessionRecord",
    "memory_items",
    "page_items",
    "parse_duration",
    "parse_size",
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
_PRUNE_ROUNDS = 5  # retention passes at most, each on the size the last one left


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
        self._stage: Handoff[None] = Handoff()  # a stage in a worker thread
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
                await self._written.wait()
        self._counters.held_s += trio.current_time() - started
        if scope.cancelled_caught and not self._stalled:
            self._stalled = True
            logger.warning("the journal has not written for %.1f s", self.max_wait)

    async def journaled(self, seq: int) -> None:
        """Return once every event up to ``seq`` is journaled (or recorded as lost)."""
        while self._journaled < seq:
            await self._written.wait()

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
            await self._attempted.wait()

    def _has_work(self) -> bool:
        return bool(self._pending or self._lost or self._flushing or self._flushing_lost)

    async def flush(self) -> bool:
        """Write everything queued so far in one transaction; ``False`` if the write failed."""
        if self._pending or self._lost:  # after a failed write: that batch and the new events
            self._flushing = self._flushing + self._pending
            self._flushing_raws = self._flushing_raws + self._pending_raws
            self._flushing_lost = self._flushing_lost + self._lost
            self._pending, self._pending_raws, self._lost = [], [], []
        batch, raws, lost = self._flushing, self._flushing_raws, self._flushing_lost
        if not batch and not lost:
            return True
        head = max(batch[-1].seq if batch else 0, max((b for _, b in lost), default=0))
        reserved = head + self.max_pending
        sessions = self._sessions(self._sessions_seq)
        try:
            written = await self._in_thread(
                lambda: self.file.write(
                    batch,
                    raws,
                    [(a, b, "behind") for a, b in lost],
                    sessions,
                    head=head,
                    reserved=reserved,
                )
            )
        except (sqlite3.Error, OSError) as exc:
            self._full_at = self.batch_events
            self._counters.write_errors += 1
            self._write_error = str(exc)
            self._attempted.set()
            self._attempted = trio.Event()
            logger.error("cannot write the journal %s: %s", self.path, exc)
            if not self._failing:
                self._failing = True
                self._report(f"cannot write the journal {self.path}: {exc} (retrying)")
            return False
        self._flushing, self._flushing_raws, self._flushing_lost = [], [], []
        self._full_at = self.batch_events
        self._stalled = False
        self._journaled = max(self._journaled, head)
        self._sessions_seq = max(self._sessions_seq, head)
        self._reserved = max(self._reserved, reserved)
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
        if lost:
            ranges = ", ".join(f"{a}..{b}" for a, b in lost)
            self._report(f"the journal caught up; events {ranges} were not journaled")
        if self._behind and not self._lost:
            self._behind = False
        if self._failing:
            self._failing = False
            self._report(f"the journal {self.path} is written again")
        return True

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
        """Wait for the next write: ``interval``, or a full batch (stages come meanwhile)."""
        deadline = trio.current_time() + self.interval
        while len(self._pending) < self._full_at and trio.current_time() < deadline:
            self._nudge = trio.Event()
            with trio.move_on_at(deadline):
                await self._nudge.wait()

    def stage_now(self) -> None:
        """Insert what waits into the write's transaction, in a worker thread, if it is time.

        The daemon calls this when a publisher's burst ends: once
        ``stage_events`` wait, at most every ``stage_every`` seconds, while
        the file is free. The thread leaves its answer for the next burst's
        end to take; it wakes the loop only when the writer waits for it (a
        wake-up was a lump of the loop's CPU between bursts,
        docs/performance.md, "Where the daemon's CPU lands"). Events that no
        burst's end stages (an agent's pace) are inserted by the write.
        """
        if self._stage.busy:
            self._stage.take()
        pending = len(self._pending)
        if (
            pending < self.stage_events
            or pending >= self._full_at  # a full batch: the write is coming, it inserts them
            or self._stage.busy
            or self._busy
            or self._token is None
            or self.stage_every <= 0
            or len(self._flushing) != self.file.staged  # after a failed write: no stage
        ):
            return
        now = trio.current_time()
        if now < self._stage_from:
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

    def _staged(self, result: outcome.Outcome[None]) -> None:
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

        Size is estimated from the average event, so a few rounds may be needed.
        Retention runs between writes, never inside one: what is staged is
        written first, and nothing is staged until it is done.
        """
        self._over_size = False
        if self._stage.busy or self.file.staged:
            await self.flush()  # committed, or rolled back by a failure: nothing staged
        when = time.time() if now is None else now
        removed = 0
        with self._holding():
            try:
                for again in range(_PRUNE_ROUNDS):
                    target = await self._in_thread(
                        partial(self.file.prune_target, self.retention, when, again=again > 0)
                    )
                    if target <= self._counters.floor:
                        break
                    while target > self._counters.floor:
                        floor, count = await self._in_thread(partial(self.file.prune_step, target))
                        self._counters.floor = floor
                        self._counters.events -= count
                        removed += count
                        await self._write_between()
                    left: int | None = None
                    while True:  # until no page is left, or a file without auto_vacuum gives none
                        was, left = (
                            left,
                            await self._in_thread(partial(self.file.vacuum_step, self.retention)),
                        )
                        if left in (0, was):
                            break
                        await self._write_between()
                    self._counters.bytes = await self._in_thread(self.file.checkpoint)
                if removed:
                    logger.info(
                        "journal retention removed %d events (up to seq %d)",
                        removed,
                        self._counters.floor,
                    )
            except sqlite3.Error as exc:
                logger.error("journal retention failed on %s: %s", self.path, exc)
        return removed

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
        db_upto = min(upto, self._journaled)
        entries = [
            (envelope, raw)
            for envelope, raw in zip(
                (*self._flushing, *self._pending),
                (*self._flushing_raws, *self._pending_raws),
                strict=True,
            )
            if db_upto < envelope.seq <= upto and envelope.seq > after
        ]
        lost = [
            (max(a, db_upto + 1, after + 1), min(b, upto))
            for a, b in (*self._flushing_lost, *self._lost)
            if b > max(db_upto, after) and a <= upto
        ]
        return JournalSpan(self.path, after, db_upto, upto, entries, lost)

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
