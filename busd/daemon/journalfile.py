"""The journal's SQLite file: its schema, the writer and a read-only view.

Synchronous, for worker threads (:mod:`busd.journal` is the Trio side that
batches writes). One daemon writes a journal, holding ``PATH.lock``; any
number of readers (``busd sessions``, ``busd export``, resuming clients)
read it at the same time, daemon or not: WAL mode lets them.

What is stored (docs/journal.md has the full schema): ``batches``, one row
per write holding its events' msgpack envelopes, and ``ids``, every stored
event's id and seq (:mod:`.journalstore`; readers decode each envelope's
head for its time, session, run and type; schema 1 and 2 files, which had
a row per event, are rebuilt as schema 3 by the writer that opens them);
``lost``, seq ranges the daemon accepted but could not journal;
``sessions``, each session's summary as last written, with its final
usage, stats and context; ``spans``, each session's first and last seq;
``meta``, the head seq, the seq reservation, the retention floor and the
event count. ``PRAGMA user_version`` is the schema version and ``PRAGMA
application_id`` says the file is busd's.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sqlite3
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, TypeAlias

import msgspec

from ..core.errors import BusdError
from ..core.events import Envelope, Event
from .journalcheck import Damaged, quick_check
from .journallock import JournalLock, LockHeld
from .journalrows import (
    _SCHEMA,
    _SESSION_COLUMNS,
    _UPSERT_SESSION,
    APPLICATION_ID,
    READS_VERSIONS,
    SCHEMA_VERSION,
    UPSERT_SPAN,
    SessionRecord,
    SessionRow,
    _record,
    _spans,
    session_row,
)
from .journalstore import last_before, read_events, rebuild, remove, store
from .journalunits import parse_duration, parse_size

__all__ = [
    "APPLICATION_ID",
    "DEFAULT_MAX_AGE",
    "DEFAULT_MAX_SIZE",
    "PAGE_ROWS",
    "SCHEMA_VERSION",
    "JournalError",
    "JournalFile",
    "JournalReader",
    "Opened",
    "Page",
    "Retention",
    "SessionRecord",
    "SessionRow",
    "Written",
    "parse_duration",
    "parse_size",
    "session_row",
]

logger = logging.getLogger(__name__)

DEFAULT_MAX_AGE: Final = 30 * 86_400.0
DEFAULT_MAX_SIZE: Final = 1 << 30

_PRUNE_CHUNK = 5_000  # events deleted per transaction (about 10 ms)
_VACUUM_PAGES = 512  # freed pages given back per step (about 10 ms)
_SIZE_TARGET = 0.9  # a size prune brings the file to this fraction of the limit
PAGE_ROWS = 2_000  # rows per read of a resume
_WAL_LIMIT = 64 << 20  # bytes the WAL file is truncated to after a checkpoint


class JournalError(BusdError):
    """The journal cannot be used; the message says which file and why."""


@dataclass(frozen=True, slots=True)
class Retention:
    """How much history the journal keeps; ``None`` means no limit of that kind."""

    max_age: float | None = DEFAULT_MAX_AGE
    """Seconds: events accepted longer ago are removed."""
    max_size: int | None = DEFAULT_MAX_SIZE
    """Bytes of database (the WAL aside): the oldest events go while it is over."""


# -- opening a file ----------------------------------------------------------------


def _connect(path: Path, *, read_only: bool) -> sqlite3.Connection:
    if read_only:
        uri = f"{path.absolute().as_uri()}?mode=ro"
        return sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
    return sqlite3.connect(path, isolation_level=None, check_same_thread=False)


def _check(conn: sqlite3.Connection, path: Path, *, create: bool) -> int | None:
    """Create the schema in an empty file (``None``), or check it is a journal we read.

    Returns the existing file's schema version (one of ``READS_VERSIONS``).
    """
    try:
        app = conn.execute("PRAGMA application_id").fetchone()[0]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        objects = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
    except sqlite3.DatabaseError as exc:  # "file is not a database"
        if getattr(exc, "sqlite_errorname", "") == "SQLITE_READONLY_ROLLBACK":
            raise JournalError(
                f"{path} was left mid-change by a busd that was killed: the next "
                f"`busd serve --journal {path}` undoes the change, then reads it"
            ) from None
        raise JournalError(f"{path} is not a busd journal ({exc})") from None
    if app == 0 and objects == 0:
        if not create:
            raise JournalError(f"{path} is an empty file, not a busd journal yet")
        conn.execute("PRAGMA auto_vacuum = INCREMENTAL")  # before the first table
        conn.execute("PRAGMA journal_mode = WAL")
        conn.executescript(_SCHEMA)
        return None
    if app != APPLICATION_ID:
        raise JournalError(f"{path} is an SQLite database but not a busd journal")
    if version > SCHEMA_VERSION:
        raise JournalError(
            f"{path} was written by a newer busd (journal schema {version}; this busd "
            f"reads {SCHEMA_VERSION}): use that busd, or another --journal"
        )
    if version not in READS_VERSIONS:
        raise JournalError(f"{path} has journal schema {version}, which this busd cannot read")
    return int(version)


def _version(conn: sqlite3.Connection) -> int:
    """The schema version now (a writer may rebuild a schema 1 file under a reader)."""
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def _migrate(conn: sqlite3.Connection, path: Path, version: int) -> None:
    """Rebuild a schema 1 or 2 journal as schema 3, once, before anything is written to it.

    In rollback-journal mode when no reader has the file open (the new
    table's pages are written once instead of twice, through the WAL and
    back: half the time); the caller turns WAL mode on again. The old
    table's pages stay in the file, free, and new events fill them first:
    giving them back would move every page of the new table (longer than
    the copy itself). One transaction: a crash leaves the file as it was.
    """
    events = conn.execute("SELECT value FROM meta WHERE key = 'events'").fetchone()[0]
    logger.info("journal %s: rebuilding schema %d as schema 3 (%d events)", path, version, events)
    started = time.monotonic()
    with contextlib.suppress(sqlite3.OperationalError):  # "locked": a reader has it open
        conn.execute("PRAGMA journal_mode = DELETE").fetchone()
    conn.execute("PRAGMA synchronous = FULL")
    try:
        conn.execute("BEGIN IMMEDIATE")
        kept = rebuild(conn, version)
        conn.execute("COMMIT")
    except sqlite3.Error as exc:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        raise JournalError(
            f"cannot rebuild the journal {path} (schema {version}) as schema 3: {exc}; "
            "it is unchanged, and the busd that wrote it still reads it"
        ) from None
    logger.info(
        "journal %s: rebuilt as schema 3 (%d events, %.1f s)",
        path,
        kept,
        time.monotonic() - started,
    )


def _lock(path: Path) -> JournalLock:
    """Hold ``PATH.lock``: one daemon writes a journal (readers need no lock)."""
    try:
        return JournalLock.acquire(path)
    except LockHeld as held:
        holder = f" (pid {held.pid})" if held.pid is not None else ""
        raise JournalError(f"the journal {path} is in use by another busd{holder}") from None
    except OSError as exc:
        raise JournalError(f"cannot lock {path}: {exc.strerror or exc}") from None


@dataclass(frozen=True, slots=True)
class Opened:
    """What a journal says when a daemon opens it."""

    next_seq: int
    """The first seq the daemon gives: after everything recorded and reserved."""
    crashed: tuple[int, int] | None
    """Seqs the last daemon reserved and may have given without journaling them."""
    sessions: list[SessionRecord]
    """The most recently active sessions, oldest first."""


@dataclass(frozen=True, slots=True)
class Written:
    inserted: int
    bytes: int


class JournalFile:
    """The writer: one open, locked journal. Synchronous; call it from one thread at a time."""

    def __init__(self, path: Path, conn: sqlite3.Connection, lock: JournalLock) -> None:
        self.path = path
        self._conn = conn
        self._lock = lock
        self._staged = 0  # events :meth:`stage` put in the open transaction
        self._staged_inserted = 0  # rows they added (a copy already journaled adds none)

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, check_within: float = 5.0) -> JournalFile:
        """Open (or create) the journal at ``path``; :class:`JournalError` if it cannot be.

        An existing file gets SQLite's ``quick_check`` first (at most
        ``check_within`` seconds), so a damaged journal stops the daemon
        before it serves anyone instead of failing every write later.
        """
        path = Path(path)
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise JournalError(f"cannot create {path.parent}: {exc.strerror or exc}") from None
        if path.exists() and not path.is_file():
            raise JournalError(f"the journal {path} exists and is not a file")
        lock = _lock(path)
        try:  # born 0600 (an empty file is an empty database); SQLite's -wal/-shm copy it
            os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
        except OSError as exc:
            lock.close()
            raise JournalError(f"cannot create the journal {path}: {exc.strerror}") from None
        conn: sqlite3.Connection | None = None
        try:
            conn = _connect(path, read_only=False)
            version = _check(conn, path, create=True)
            if version is not None:
                try:
                    quick_check(conn, within=check_within)
                except Damaged as exc:
                    raise JournalError(
                        f"the journal {path} is damaged ({exc}): `busd journal recover "
                        f"--journal {path}` keeps what is readable"
                    ) from None
            conn.execute("PRAGMA busy_timeout = 5000")
            conn.execute("PRAGMA cache_size = -16384")  # KiB: the indexes' hot pages stay
            if version is not None and version < SCHEMA_VERSION:
                _migrate(conn, path, version)
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode != "wal":
                raise JournalError(f"{path}: SQLite cannot use WAL mode there ({mode})")
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute(f"PRAGMA journal_size_limit = {_WAL_LIMIT}")
        except sqlite3.Error as exc:
            if conn is not None:
                conn.close()
            lock.close()
            raise JournalError(f"cannot open the journal {path}: {exc}") from None
        except BaseException:
            if conn is not None:
                conn.close()
            lock.close()
            raise
        return cls(path, conn, lock)

    def _meta(self) -> dict[str, int]:
        return dict(self._conn.execute("SELECT key, value FROM meta").fetchall())

    def recover(self, *, reserve: int, sessions: int) -> Opened:
        """Account for an unclean stop, reserve seqs, and read back the latest sessions.

        The last daemon's reservation is the higher of the database's and the
        lock file's (written there when the database could not be).
        """
        conn = self._conn
        meta = self._meta()
        head, reserved = meta["head"], max(meta["reserved"], self._lock.previous)
        crashed = (head + 1, reserved) if reserved > head else None
        conn.execute("BEGIN IMMEDIATE")
        try:
            if crashed is not None:
                conn.execute("INSERT OR REPLACE INTO lost VALUES (?, ?, 'crash')", crashed)
                head = reserved
            # A journal with history reserves at once: a crash before the first
            # write of this life must not give its seqs again either.
            new_reserved = head + reserve if head else 0
            conn.execute("UPDATE meta SET value = ? WHERE key = 'head'", (head,))
            conn.execute("UPDATE meta SET value = ? WHERE key = 'reserved'", (new_reserved,))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        self.reserve_beside(new_reserved)  # the database has it; this one is the fallback
        rows = conn.execute(
            f"SELECT {_SESSION_COLUMNS} FROM sessions ORDER BY last_seq DESC LIMIT ?", (sessions,)
        ).fetchall()
        floor = meta["floor"]
        return Opened(head + 1, crashed, [_record(row, floor) for row in reversed(rows)])

    def statistics(self) -> dict[str, int]:
        meta = self._meta()
        meta["bytes"] = self.size()
        return meta

    def size(self) -> int:
        """Bytes of database in use (the file's size minus its free pages)."""
        conn = self._conn
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        free = conn.execute("PRAGMA freelist_count").fetchone()[0]
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        return int((pages - free) * page_size)

    def write(
        self,
        envelopes: Sequence[Envelope[Event]],
        raws: Sequence[msgspec.Raw],
        lost: Sequence[tuple[int, int, str]],
        sessions: Sequence[SessionRow],
        *,
        head: int,
        reserved: int,
    ) -> Written:
        """One transaction: the events (``raws``: their bytes), the lost ranges, the sessions
        touched, the watermark. The first :attr:`staged` of ``envelopes`` are the ones
        :meth:`stage` already inserted: this commits them with the rest."""
        conn = self._conn
        staged = self._staged
        if staged > len(envelopes):
            raise ValueError(f"{staged} events are staged but the write has {len(envelopes)}")
        if not staged:
            conn.execute("BEGIN IMMEDIATE")
        try:
            inserted = self._staged_inserted + self._insert(envelopes, raws, staged)
            conn.executemany(UPSERT_SPAN, _spans(envelopes))
            if lost:
                conn.executemany("INSERT OR REPLACE INTO lost VALUES (?, ?, ?)", lost)
            if sessions:
                conn.executemany(_UPSERT_SESSION, sessions)
            conn.execute(
                "UPDATE meta SET value = CASE key WHEN 'head' THEN ? WHEN 'reserved' THEN ? "
                "ELSE value + ? END WHERE key IN ('head', 'reserved', 'events')",
                (head, reserved, inserted),
            )
            conn.execute("COMMIT")
        except BaseException:
            self._rollback()
            raise
        self._staged = self._staged_inserted = 0
        return Written(inserted, self.size())

    @property
    def staged(self) -> int:
        """Events inserted by :meth:`stage` and not yet committed by :meth:`write`."""
        return self._staged

    def stage(self, envelopes: Sequence[Envelope[Event]], raws: Sequence[msgspec.Raw]) -> None:
        """Insert rows ahead of the :meth:`write` that commits them, in its transaction.

        A write's inserts are most of its CPU: staged as the events come,
        they take the cores in small pieces instead of one burst per write,
        which delayed the events fanned out meanwhile. Nothing is committed
        (readers and the watermark see nothing) until :meth:`write`; a
        failure rolls back everything staged (the write then inserts it all).
        Until then only :meth:`write` or :meth:`release` may use the file
        (retention runs between writes).
        """
        conn = self._conn
        if not self._staged:
            conn.execute("BEGIN IMMEDIATE")
        try:
            inserted = self._insert(envelopes, raws, 0)
        except BaseException:
            self._rollback()
            raise
        self._staged += len(envelopes)
        self._staged_inserted += inserted

    def _insert(
        self, envelopes: Sequence[Envelope[Event]], raws: Sequence[msgspec.Raw], start: int
    ) -> int:
        """``envelopes[start:]`` as batch rows (copies left out); how many went in."""
        if start:
            envelopes, raws = envelopes[start:], raws[start:]
        if not envelopes:
            return 0
        seqs = [envelope.seq for envelope in envelopes]
        ids = [envelope.id for envelope in envelopes]
        return store(self._conn, seqs, ids, raws)

    def _rollback(self) -> None:
        """End the open transaction, dropping what it wrote (whatever state it is in)."""
        self._staged = self._staged_inserted = 0
        with contextlib.suppress(sqlite3.Error):
            self._conn.execute("ROLLBACK")

    def release(self, head: int, unwritten: Sequence[tuple[int, int]] = ()) -> None:
        """A stop: nothing past ``head`` was given, so the next daemon continues there.

        ``unwritten``: seqs given but not written (the disk failed), recorded
        lost in the same small transaction, which may work where batches did not
        (anything staged and not written is dropped first).
        """
        conn = self._conn
        if self._staged or conn.in_transaction:
            self._rollback()
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.executemany("INSERT OR REPLACE INTO lost VALUES (?, ?, 'unwritten')", unwritten)
            conn.execute("UPDATE meta SET value = ? WHERE key IN ('head', 'reserved')", (head,))
            conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise
        self.reserve_beside(head)

    def reserve_beside(self, seq: int) -> bool:
        """Reserve up to ``seq`` in the lock file (no new block needed); ``False`` if it failed."""
        try:
            self._lock.reserve(seq)
        except OSError:
            return False
        return True

    # -- retention ---------------------------------------------------------------

    def prune_target(self, retention: Retention, now: float, *, again: bool = False) -> int:
        """The seq up to which retention removes events (the current floor: nothing to do).

        Over ``max_size``, the oldest events go until the file is about
        ``_SIZE_TARGET`` of it (estimated from the average event); ``again``
        (a further round) prunes whenever the file is still over that target.
        The target may fall inside a batch row: :meth:`prune_step` cuts it there.
        """
        conn = self._conn
        meta = self._meta()
        target = meta["floor"]
        if retention.max_age is not None:
            before = self._last_before(now - retention.max_age)
            if before is not None:
                target = max(target, before)
        if retention.max_size is not None:
            size = self.size()
            aim = retention.max_size * _SIZE_TARGET
            if size > (aim if again else retention.max_size):
                events = meta["events"]  # kept with the rows: count(*) reads a whole index
                drop = min(events, max(1, math.ceil(events * (size - aim) / size)))
                # The oldest seq plus ``drop``: seqs are dense but for rare lost ranges, and
                # a round that falls short is followed by another; an OFFSET scan over a
                # tenth of the journal held the first write for tens of ms.
                oldest = conn.execute("SELECT min(first_seq) FROM batches").fetchone()[0]
                if oldest is not None:
                    target = max(target, oldest + drop - 1)
        return target

    def _last_before(self, cutoff: float) -> int | None:
        """The last seq accepted before ``cutoff``."""
        return last_before(self._conn, cutoff)

    def prune_step(self, target: int) -> tuple[int, int]:
        """Remove about ``_PRUNE_CHUNK`` events at or below ``target``: (new floor, removed).

        Whole batch rows go, with their ids; a row that reaches past
        ``target`` is written again without the events up to it (:func:`remove`).
        """
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            upto, removed = remove(conn, target, _PRUNE_CHUNK)
            conn.execute("DELETE FROM lost WHERE to_seq <= ?", (upto,))
            conn.execute("DELETE FROM sessions WHERE last_seq <= ?", (upto,))
            conn.execute("DELETE FROM spans WHERE last_seq <= ?", (upto,))
            conn.execute(
                "UPDATE meta SET value = CASE key WHEN 'floor' THEN max(value, ?) "
                "ELSE value - ? END WHERE key IN ('floor', 'events')",
                (upto, removed),
            )
            conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise
        return upto, removed

    def vacuum_step(self, retention: Retention | None = None) -> int:
        """Give up to ``_VACUUM_PAGES`` freed pages back to the file system; the pages left
        to give back.

        In steps, as the prune's deletes are: a full journal frees some 100 MiB
        at once, which takes the thread about half a second to give back. Under
        a ``max_size`` it keeps up to a tenth of it (what a size prune frees)
        for the next events to fill: a full journal would otherwise shrink at
        each prune and grow back at once, paying for both.
        """
        conn = self._conn
        free = int(conn.execute("PRAGMA freelist_count").fetchone()[0])
        keep = 0
        if retention is not None and retention.max_size is not None:
            page_size = int(conn.execute("PRAGMA page_size").fetchone()[0])
            keep = int(retention.max_size * (1 - _SIZE_TARGET)) // page_size
        pages = min(_VACUUM_PAGES, free - keep)
        if pages <= 0:
            return 0
        # executescript steps it to the end; execute() would free a single page.
        conn.executescript(f"PRAGMA incremental_vacuum({pages});")
        return max(0, int(conn.execute("PRAGMA freelist_count").fetchone()[0]) - keep)

    def checkpoint(self) -> int:
        """Copy the WAL into the file (never waiting on readers); the size after."""
        self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        return self.size()

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self._conn.execute("PRAGMA optimize")
        self._conn.close()
        self._lock.close()


# -- reading -----------------------------------------------------------------------

Row: TypeAlias = tuple[int, str, str | None, str | None, int, bytes]
"""seq, type, session_id, run_id, stale, envelope bytes."""


@dataclass(frozen=True, slots=True)
class Page:
    """One read of a seq range: the rows, and what is known lost in it."""

    floor: int
    rows: list[Row]
    lost: list[tuple[int, int]]
    end: int
    """The last seq this page accounts for."""


class JournalReader:
    """A read-only view of a journal (works while a daemon writes it, and without one)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise JournalError(f"no journal at {self.path}")
        try:
            self._conn = _connect(self.path, read_only=True)
        except sqlite3.Error as exc:
            raise JournalError(f"cannot open the journal {self.path}: {exc}") from None
        try:
            _check(self._conn, self.path, create=False)
        except BaseException:
            self._conn.close()
            raise

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> JournalReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def meta(self) -> dict[str, int]:
        return dict(self._conn.execute("SELECT key, value FROM meta").fetchall())

    def page(
        self,
        after: int,
        upto: int,
        *,
        limit: int = PAGE_ROWS,
        sessions: Sequence[str] | None = None,
    ) -> Page:
        """Rows with ``after < seq <= upto`` (at most ``limit`` read), in one read transaction.

        ``sessions``: only those sessions' events, read from the first of
        their spans to the last; lost ranges are reported over the whole
        range all the same. An envelope that does not decode is reported
        lost, as a one-seq range.
        """
        conn = self._conn
        conn.execute("BEGIN")
        try:
            floor = conn.execute("SELECT value FROM meta WHERE key = 'floor'").fetchone()[0]
            low, high = after, upto
            if sessions is not None and _version(conn) >= 2:
                first, last = conn.execute(
                    "SELECT min(first_seq), max(last_seq) FROM spans "
                    f"WHERE session_id IN ({', '.join('?' * len(sessions))})",
                    tuple(sessions),
                ).fetchone()
                low, high = (
                    (after, after) if first is None else (max(after, first - 1), min(upto, last))
                )
            version = _version(conn)
            stored, damaged, last = read_events(conn, version, low, high, limit)
            end = upto if last is None else last
            lost = conn.execute(
                "SELECT from_seq, to_seq FROM lost WHERE to_seq > ? AND from_seq <= ? "
                "ORDER BY from_seq",
                (after, end),
            ).fetchall()
        finally:
            conn.execute("COMMIT")
        ranges = [(a, b) for a, b in lost] + damaged
        rows: list[Row] = []
        keep = None if sessions is None else set(sessions)
        for head, blob in stored:
            if keep is None or head.session_id in keep:
                rows.append(
                    (head.seq, head.event.type, head.session_id, head.run_id, head.stale, blob)
                )
        ranges.sort()
        return Page(floor, rows, ranges, end)

    def sessions(self, limit: int | None = None) -> list[SessionRecord]:
        """Journaled sessions, most recently active first."""
        floor = self.meta()["floor"]
        rows = self._conn.execute(
            f"SELECT {_SESSION_COLUMNS} FROM sessions ORDER BY last_seq DESC LIMIT ?",
            (-1 if limit is None else limit,),
        ).fetchall()
        return [_record(row, floor) for row in rows]

    def session(self, session_id: str) -> SessionRecord | None:
        floor = self.meta()["floor"]
        row = self._conn.execute(
            f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE session_id = ?", (session_id,)
        ).fetchone()
        return None if row is None else _record(row, floor)

    def session_events(self, session_id: str) -> Iterator[bytes]:
        """The msgpack envelopes of one session, in seq order.

        Read from the session's first to its last seq (``spans``), keeping
        its own; in a schema 1 file, by its index.
        """
        conn = self._conn
        conn.execute("BEGIN")
        try:
            if _version(conn) < 2:
                for (blob,) in conn.execute(
                    "SELECT envelope FROM events WHERE session_id = ? ORDER BY seq", (session_id,)
                ):
                    yield blob
                return
            span = conn.execute(
                "SELECT first_seq, last_seq FROM spans WHERE session_id = ?", (session_id,)
            ).fetchone()
            if span is None:
                return
            low, high = span[0] - 1, span[1]
            version = _version(conn)
            while True:
                stored, _, last = read_events(conn, version, low, high, PAGE_ROWS)
                for head, blob in stored:
                    if head.session_id == session_id:
                        yield blob
                if last is None:
                    return
                low = last
        finally:
            conn.execute("COMMIT")
