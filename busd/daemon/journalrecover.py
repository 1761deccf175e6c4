"""``busd journal check`` and ``busd journal recover``: the way out of a damaged journal.

:func:`recover` moves the damaged file aside (with a timestamped name,
its ``-wal`` and ``-shm`` beside it) and builds a new journal at the same
path from what can still be read, row by row: a range that cannot be read
is skipped, and its seqs are recorded as lost (reason ``damaged``) so that
a resuming client gets a ``gap`` for them. The new journal's head is past
every seq the old one knew or reserved: the next daemon gives no seq twice.
Synchronous; the daemon must not be running (the journal's lock says).
"""

from __future__ import annotations

import bisect
import contextlib
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from .journalcheck import integrity_problems
from .journalfile import JournalError, JournalFile
from .journallock import JournalLock, LockHeld
from .journalrows import UPSERT_SPAN
from .journalstore import row_items, store

__all__ = ["Recovered", "check", "recover"]

_CHUNK = 1000  # rows per read
_PROBE = 256  # seqs looked up one by one past a range that cannot be read
_SUFFIXES = ("", "-wal", "-shm", "-journal")  # -journal: a rebuild from schema 1, killed


def check(path: str | os.PathLike[str]) -> list[str]:
    """SQLite's full ``integrity_check`` of the journal: ``["ok"]`` or the problems."""
    path = Path(path)
    if not path.is_file():
        raise JournalError(f"no journal at {path}")
    conn = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True)
    try:
        return integrity_problems(conn)
    except sqlite3.Error as exc:
        return [str(exc)]
    finally:
        conn.close()


@dataclass(slots=True)
class Recovered:
    """What :func:`recover` kept and where the damaged file went."""

    aside: Path
    events: int = 0
    sessions: int = 0
    damaged: list[tuple[int, int]] = field(default_factory=list)
    """Seq ranges that could not be read (recorded as lost)."""
    head: int = 0
    """The last seq the new journal accounts for; the next daemon continues after it."""


def _move_aside(path: Path, stamp: str) -> Path:
    aside = path.with_name(f"{path.name}.damaged-{stamp}")
    for suffix in _SUFFIXES:
        with contextlib.suppress(FileNotFoundError):
            os.rename(f"{path}{suffix}", f"{aside}{suffix}")
    return aside


def _rows(
    old: sqlite3.Connection, table: str, key: str, start: int, end: int, columns: str = "*"
) -> Iterator[tuple[Any, ...] | int]:
    """Rows of ``table`` with ``start < key <= end`` in order; an int is a key it could not read.

    A chunk that fails is read again key by key (``_PROBE`` keys), so one
    damaged page costs the rows on it, not the rest of the table.
    """
    cursor = start
    while cursor < end:
        try:
            rows = old.execute(
                f"SELECT {key}, {columns} FROM {table} "
                f"WHERE {key} > ? AND {key} <= ? ORDER BY {key} LIMIT ?",
                (cursor, end, _CHUNK),
            ).fetchall()
        except sqlite3.DatabaseError:
            stop = min(cursor + _PROBE, end)
            for probe in range(cursor + 1, stop + 1):
                try:
                    row = old.execute(
                        f"SELECT {key}, {columns} FROM {table} WHERE {key} = ?", (probe,)
                    ).fetchone()
                except sqlite3.DatabaseError:
                    yield probe
                    continue
                if row is not None:
                    yield tuple(row[1:])
            cursor = stop
            continue
        if not rows:
            return
        for row in rows:
            yield tuple(row[1:])
        cursor = rows[-1][0]


def _readable(old: sqlite3.Connection, sql: str, default: Any) -> Any:
    try:
        return old.execute(sql).fetchall()
    except sqlite3.DatabaseError:
        return default


def _merge(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Ranges of seqs, joined where they touch or overlap."""
    merged: list[tuple[int, int]] = []
    for a, b in sorted(ranges):
        if merged and a <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def _copy(
    old: sqlite3.Connection, new: sqlite3.Connection, result: Recovered, reserved: int
) -> None:
    """Events, lost ranges and sessions, as far as they can be read; the meta past all of it."""
    meta = dict(_readable(old, "SELECT key, value FROM meta", []))
    [(version,)] = _readable(old, "PRAGMA user_version", [(0,)])
    batched = version >= 3
    top_sql = "SELECT max(last_seq) FROM batches" if batched else "SELECT max(seq) FROM events"
    [(top,)] = _readable(old, top_sql, [(None,)])
    end = max(meta.get("head", 0), meta.get("reserved", 0), top or 0, reserved)
    bad: list[int] = []
    damaged: list[tuple[int, int]] = []
    envelope_of = _envelope_check()
    spans: dict[str, tuple[int, int]] = {}
    pending: list[tuple[int, str, Any]] = []

    def keep(seq: int, id_: str, blob: Any, envelope: dict[str, Any]) -> None:
        nonlocal end
        pending.append((seq, id_, msgspec.Raw(blob)))
        if len(pending) >= _CHUNK:
            flush()
        session = envelope.get("session_id")
        if isinstance(session, str):
            first = spans[session][0] if session in spans else seq
            spans[session] = (first, seq)  # the rows come in seq order
        end = max(end, seq)

    def flush() -> None:
        if pending:
            seqs, ids, raws = zip(*pending, strict=True)
            result.events += store(new, seqs, ids, raws)
            pending.clear()

    floor = meta.get("floor", 0)
    if batched:  # schema 3: each readable row's readable envelopes
        starts: list[int] = []
        unreadable: list[int] = []
        for row in _rows(old, "batches", "first_seq", floor, end, "first_seq, last_seq, envelopes"):
            if isinstance(row, int):
                unreadable.append(row)
                continue
            first, last = int(row[0]), int(row[1])
            starts.append(first)
            found, lost = _batch(first, last, row[2], envelope_of)
            damaged += lost
            for seq, id_, blob, envelope in found:
                keep(seq, id_, blob, envelope)
        # A row that cannot be read took its seqs up to the next readable row with it.
        covered = floor
        for seq in unreadable:
            if seq > covered:
                after = bisect.bisect_right(starts, seq)
                covered = starts[after] - 1 if after < len(starts) else end
                damaged.append((seq, covered))
    else:  # schemas 1 and 2 (the columns they share)
        for row in _rows(old, "events", "seq", floor, end, "seq, id, envelope"):
            if isinstance(row, int):
                bad.append(row)
                continue
            checked = envelope_of(row)
            if checked is None:
                bad.append(int(row[0]))
                continue
            keep(int(row[0]), row[1], row[2], checked)
    flush()
    new.executemany(UPSERT_SPAN, [(s, first, last) for s, (first, last) in spans.items()])
    for row in _rows(old, "lost", "from_seq", 0, end):
        if not isinstance(row, int):
            new.execute("INSERT OR REPLACE INTO lost VALUES (?, ?, ?)", row)
            end = max(end, int(row[1]))
    result.damaged = _merge([*((seq, seq) for seq in bad), *damaged])
    new.executemany("INSERT OR REPLACE INTO lost VALUES (?, ?, 'damaged')", result.damaged)
    columns = len(new.execute("SELECT * FROM sessions LIMIT 0").description)
    [(last,)] = _readable(old, "SELECT max(rowid) FROM sessions", [(None,)])
    for row in _rows(old, "sessions", "rowid", 0, last or 0):
        if not isinstance(row, int) and len(row) == columns:
            new.execute(f"INSERT OR REPLACE INTO sessions VALUES ({', '.join('?' * columns)})", row)
            result.sessions += 1
    result.head = end
    new.execute(
        "UPDATE meta SET value = CASE key WHEN 'floor' THEN ? WHEN 'events' THEN ? ELSE ? END",
        (meta.get("floor", 0), result.events, end),
    )


def _batch(
    first: int,
    last: int,
    blob: Any,
    envelope_of: Callable[[tuple[Any, ...]], dict[str, Any] | None],
) -> tuple[list[tuple[int, str, Any, dict[str, Any]]], list[tuple[int, int]]]:
    """A batch row's envelopes that decode (seq, id, bytes, envelope), and the seqs it lost."""

    def read(raw: msgspec.Raw) -> tuple[int, tuple[str, dict[str, Any]]] | None:
        envelope = envelope_of((None, None, raw))
        seq, id_ = (None, None) if envelope is None else (envelope.get("seq"), envelope.get("id"))
        if envelope is None or not isinstance(seq, int) or not isinstance(id_, str):
            return None
        return seq, (id_, envelope)

    found, lost = row_items(first, last, blob, read)
    return [(seq, id_, raw, envelope) for seq, raw, (id_, envelope) in found], lost


def _envelope_check() -> Callable[[tuple[Any, ...]], dict[str, Any] | None]:
    """An event row's envelope, decoded; ``None`` for garbage.

    A row whose envelope does not decode to its own seq and id is garbage, not an event.
    """
    decoder = msgspec.msgpack.Decoder(dict[str, Any])

    def envelope_of(row: tuple[Any, ...]) -> dict[str, Any] | None:
        try:
            envelope = decoder.decode(row[2])
        except (msgspec.DecodeError, TypeError):
            return None
        if row[0] is None:  # from a batch: the envelope says its own seq and id
            return envelope
        return envelope if (envelope.get("seq"), envelope.get("id")) == row[:2] else None

    return envelope_of


def recover(path: str | os.PathLike[str], *, now: float | None = None) -> Recovered:
    """Move the journal aside and rebuild it from what is readable (:class:`JournalError`)."""
    path = Path(path)
    if not path.is_file():
        raise JournalError(f"no journal at {path}")
    try:
        lock = JournalLock.acquire(path)
    except LockHeld as held:
        holder = f" (pid {held.pid})" if held.pid is not None else ""
        raise JournalError(
            f"the journal {path} is in use by a busd{holder}: stop it first"
        ) from None
    try:
        stamp = time.strftime("%Y%m%dT%H%M%S", time.localtime(now))
        result = Recovered(aside=_move_aside(path, stamp))
        building = path.with_name(path.name + ".recovering")
        for suffix in (*_SUFFIXES, ".lock"):
            Path(f"{building}{suffix}").unlink(missing_ok=True)
        JournalFile.open(building).close()  # the schema, as a daemon makes it
        old = sqlite3.connect(result.aside, isolation_level=None)
        new = sqlite3.connect(building, isolation_level=None)
        try:
            new.execute("BEGIN")
            _copy(old, new, result, lock.previous)
            new.execute("COMMIT")
        finally:
            old.close()
            new.close()  # the last connection: SQLite folds its WAL into the file
        for suffix in _SUFFIXES:
            with contextlib.suppress(FileNotFoundError):
                os.rename(f"{building}{suffix}", f"{path}{suffix}")
        Path(f"{building}.lock").unlink(missing_ok=True)
        lock.reserve(result.head)
    finally:
        lock.close()
    return result
