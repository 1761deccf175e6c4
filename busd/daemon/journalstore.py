"""How the journal stores events: schema 3's batches, and the rows of schemas 1 and 2.

Schema 3 stores what one stage or write inserts as one row of ``batches``
(several past 256 events, so that a damaged page loses no more): its
first and last seq and the msgpack array of its envelopes, each the bytes
the daemon sent. SQLite's work is per row, whatever the row holds, so a
row per event was most of the writer thread's CPU; a row per write takes
about a quarter off the write (docs/performance.md, "Schema 3: a row per
write"). ``ids`` keeps every stored event's id with its seq, so a copy
that a bridge loops back is still refused, as schema 2's unique column
refused it.

Schemas 1 and 2 stored one ``events`` row per event: readers read those
files as they are (:func:`read_events`), and a writer rebuilds them as
schema 3 when it opens one (:func:`rebuild`).
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from functools import cache
from itertools import chain
from typing import Any, Final, TypeVar

import msgspec

from .journalrows import BATCH_TABLES, SPANS_TABLE, EventHead, event_head

__all__ = [
    "ROW_EVENTS",
    "Stored",
    "last_before",
    "read_events",
    "rebuild",
    "remove",
    "row_items",
    "store",
]

ROW_EVENTS: Final = 256
"""Events per batch row at most: what a damaged page can take with it (``busd journal recover``)."""
_IDS_PER_INSERT = 256  # ids per INSERT statement (2 parameters each)
_REBUILD_BATCH = 1_000  # old rows read at a time when a schema 1 or 2 file is rebuilt
_FETCH = 8  # batch rows fetched at a time by a reader

_encode = msgspec.msgpack.Encoder().encode
_array = msgspec.msgpack.Decoder(list[msgspec.Raw]).decode


class _Id(msgspec.Struct, frozen=True, gc=False):
    id: str


class _SeqId(msgspec.Struct, frozen=True, gc=False):
    seq: int
    id: str


_ids_of = msgspec.msgpack.Decoder(list[_Id]).decode
_seq_id_of = msgspec.msgpack.Decoder(_SeqId).decode

Stored = tuple[EventHead, bytes]
"""An event read back: its envelope's head and its bytes."""


# -- writing -----------------------------------------------------------------------


@cache
def _insert_ids(rows: int) -> str:
    return "INSERT OR IGNORE INTO ids VALUES " + ", ".join(["(?, ?)"] * rows)


@cache
def _marks(rows: int) -> str:
    """``?, ?, ...``: an ``IN`` list of ``rows`` parameters (few sizes: :func:`_chunks`)."""
    return ", ".join("?" * rows)


def _chunks(count: int) -> Iterator[int]:
    """Statement sizes for ``count`` ids: 256s, then powers of two (few distinct statements)."""
    while count >= _IDS_PER_INSERT:
        yield _IDS_PER_INSERT
        count -= _IDS_PER_INSERT
    size = _IDS_PER_INSERT
    while count:
        size //= 2
        if count >= size:
            yield size
            count -= size


def store(
    conn: sqlite3.Connection, seqs: Sequence[int], ids: Sequence[str], raws: Sequence[Any]
) -> int:
    """Store events (in seq order; ``raws`` their envelopes' bytes) in rows; how many.

    An event whose id is already stored (a copy) is left out. The ids go
    in first, many per statement; only when a statement adds fewer than it
    was given does the write look up which ones were copies.
    """
    copies: set[int] = set()
    start = 0
    for size in _chunks(len(seqs)):
        stop = start + size
        params = list(chain.from_iterable(zip(ids[start:stop], seqs[start:stop], strict=True)))
        before = conn.total_changes
        conn.execute(_insert_ids(size), params)
        if conn.total_changes - before != size:  # the ids stored now carry this event's seq
            chunk = ids[start:stop]
            owners = dict(
                conn.execute(
                    f"SELECT id, seq FROM ids WHERE id IN ({_marks(size)})", chunk
                ).fetchall()
            )
            copies.update(i for i in range(start, stop) if owners.get(ids[i]) != seqs[i])
        start = stop
    if copies:
        kept = [i for i in range(len(seqs)) if i not in copies]
        seqs, raws = [seqs[i] for i in kept], [raws[i] for i in kept]
    count = len(seqs)
    for start in range(0, count, ROW_EVENTS):
        stop = min(start + ROW_EVENTS, count)
        row = (seqs[start], seqs[stop - 1], _encode(raws[start:stop]))
        conn.execute("INSERT INTO batches VALUES (?, ?, ?)", row)
    return count


def _forget(conn: sqlite3.Connection, ids: Sequence[str]) -> None:
    """Delete the ids of removed events, many per statement."""
    start = 0
    for size in _chunks(len(ids)):
        conn.execute(f"DELETE FROM ids WHERE id IN ({_marks(size)})", ids[start : start + size])
        start += size


def _seq_id(raw: msgspec.Raw) -> tuple[int, str] | None:
    try:
        envelope = _seq_id_of(raw)
    except msgspec.DecodeError:
        return None
    return envelope.seq, envelope.id


def _split_row(
    first: int, last: int, blob: bytes, upto: int
) -> tuple[int, list[str], tuple[int, int, bytes] | None, list[tuple[int, int]]]:
    """A batch row cut at ``upto`` for retention: the events removed, their ids, the row
    that stays (first seq, last seq, envelopes) if an event is after ``upto``, and the seqs
    after ``upto`` it could not read (they are not in the row that stays).

    Only what decodes counts as removed (an id that cannot be read cannot be forgotten).
    """
    if last <= upto:  # the whole row: its ids in one decode
        with contextlib.suppress(msgspec.DecodeError):
            whole = _ids_of(blob)
            return len(whole), [envelope.id for envelope in whole], None, []
    found, lost = row_items(first, last, blob, _seq_id)
    ids = [id_ for seq, _, id_ in found if seq <= upto]
    kept = [(seq, raw) for seq, raw, _ in found if seq > upto]
    rest = (kept[0][0], kept[-1][0], _encode([raw for _, raw in kept])) if kept else None
    return len(ids), ids, rest, [(max(a, upto + 1), b) for a, b in lost if b > upto]


def remove(conn: sqlite3.Connection, target: int, chunk: int) -> tuple[int, int]:
    """Remove about ``chunk`` events at or below ``target``, in the caller's transaction:
    the last seq it removed through, and the events removed.

    Whole rows go, with their ids; a row that reaches past ``target`` is
    written again without the events up to it (and what it could not read
    after ``target`` is recorded lost, reason ``damaged``).
    """
    upto, removed, ids, rest = target, 0, [], None
    cursor = conn.execute(
        "SELECT first_seq, last_seq, envelopes FROM batches WHERE first_seq <= ? "
        "ORDER BY first_seq",
        (target,),
    )
    for first, last, blob in cursor:
        count, row_ids, rest, damaged = _split_row(first, last, blob, target)
        removed += count
        ids += row_ids
        if last > target or removed >= chunk:
            upto = min(last, target)
            conn.executemany("INSERT OR REPLACE INTO lost VALUES (?, ?, 'damaged')", damaged)
            break
    cursor.close()
    conn.execute("DELETE FROM batches WHERE first_seq <= ?", (upto,))
    if rest is not None:
        conn.execute("INSERT INTO batches VALUES (?, ?, ?)", rest)
    _forget(conn, ids)
    return upto, removed


# -- reading -----------------------------------------------------------------------


_T = TypeVar("_T")


def row_items(
    first: int, last: int, blob: Any, decode: Callable[[msgspec.Raw], tuple[int, _T] | None]
) -> tuple[list[tuple[int, msgspec.Raw, _T]], list[tuple[int, int]]]:
    """A batch row's envelopes that ``decode`` reads (seq, bytes, value), and the seqs it lost.

    A row that does not decode loses its whole range; an envelope that does
    not (``decode`` gives ``None``), the seqs between its readable neighbours.
    """
    try:
        raws = _array(blob)
    except (msgspec.DecodeError, TypeError):
        return [], [(first, last)]
    found: list[tuple[int, msgspec.Raw, _T]] = []
    lost: list[tuple[int, int]] = []
    previous, bad = first - 1, False
    for raw in raws:
        item = decode(raw)
        if item is None:
            bad = True
            continue
        seq, value = item
        if bad:
            lost.append((previous + 1, seq - 1))
            bad = False
        found.append((seq, raw, value))
        previous = seq
    if bad:
        lost.append((previous + 1, last))
    return found, [(a, b) for a, b in lost if a <= b]


def _head(raw: msgspec.Raw) -> tuple[int, EventHead] | None:
    try:
        head = event_head(raw)
    except msgspec.DecodeError:
        return None
    return head.seq, head


def _batch_events(
    first: int, last: int, blob: bytes, low: int, high: int, out: list[Stored]
) -> list[tuple[int, int]]:
    """A batch row's events with ``low < seq <= high`` into ``out``; the seqs of them it lost."""
    try:
        raws = _array(blob)
        heads = [event_head(raw) for raw in raws]
    except msgspec.DecodeError:  # damaged: read what can be, envelope by envelope
        pass
    else:
        out.extend((h, bytes(r)) for h, r in zip(heads, raws, strict=True) if low < h.seq <= high)
        return []
    found, lost = row_items(first, last, blob, _head)
    out.extend((head, bytes(raw)) for seq, raw, head in found if low < seq <= high)
    clipped = ((max(a, low + 1), min(b, high)) for a, b in lost)
    return [(a, b) for a, b in clipped if a <= b]


def read_events(
    conn: sqlite3.Connection, version: int, low: int, high: int, limit: int
) -> tuple[list[Stored], list[tuple[int, int]], int | None]:
    """Events with ``low < seq <= high`` in seq order, read until at least ``limit`` are.

    Returns them, the seq ranges that could not be read, and the last seq
    accounted for when the read stopped at ``limit`` (``None``: it read the
    whole range). Call it inside a read transaction.
    """
    out: list[Stored] = []
    damaged: list[tuple[int, int]] = []
    if version < 3:
        rows = conn.execute(
            "SELECT seq, envelope FROM events WHERE seq > ? AND seq <= ? ORDER BY seq LIMIT ?",
            (low, high, limit),
        ).fetchall()
        for seq, blob in rows:
            try:
                out.append((event_head(blob), blob))
            except msgspec.DecodeError:
                damaged.append((seq, seq))
        return out, damaged, rows[-1][0] if len(rows) == limit else None
    # The row holding low + 1 may start before it: rows are disjoint and in seq order.
    start = conn.execute(
        "SELECT max(first_seq) FROM batches WHERE first_seq <= ?", (low + 1,)
    ).fetchone()[0]
    cursor = conn.execute(
        "SELECT first_seq, last_seq, envelopes FROM batches "
        "WHERE first_seq >= ? AND first_seq <= ? ORDER BY first_seq",
        (low + 1 if start is None else start, high),
    )
    try:
        while rows := cursor.fetchmany(_FETCH):
            for first, last, blob in rows:
                damaged += _batch_events(first, last, blob, low, high, out)
                if len(out) >= limit:
                    return out, damaged, min(last, high)
    finally:
        cursor.close()
    return out, damaged, None


def last_before(conn: sqlite3.Connection, cutoff: float) -> int | None:
    """The last seq accepted before ``cutoff``, in a schema 3 file (``None``: none was).

    Accept times follow seq: a binary search over the rows by their first
    event's time, then through the last row that starts before the cutoff.
    """

    def row_at(seq: int) -> tuple[int, list[EventHead]]:
        first, blob = conn.execute(
            "SELECT first_seq, envelopes FROM batches WHERE first_seq >= ? "
            "ORDER BY first_seq LIMIT 1",
            (seq,),
        ).fetchone()
        heads: list[EventHead] = []
        with contextlib.suppress(msgspec.DecodeError):  # a damaged row: no times to go by
            for raw in _array(blob):
                with contextlib.suppress(msgspec.DecodeError):
                    heads.append(event_head(raw))
        return int(first), heads

    def starts_before(seq: int) -> tuple[int, bool]:
        first, heads = row_at(seq)
        return first, bool(heads) and heads[0].ts < cutoff

    lo_hi = conn.execute("SELECT min(first_seq), max(first_seq) FROM batches").fetchone()
    if lo_hi[0] is None:
        return None
    lo, hi = int(lo_hi[0]), int(lo_hi[1])
    if not starts_before(lo)[1]:
        return None
    if starts_before(hi)[1]:
        lo = hi
    else:
        while hi - lo > 1:  # the row at lo starts before the cutoff, none from hi on does
            mid = (lo + hi) // 2
            first, before = starts_before(mid)
            if before:
                lo = first
            else:
                hi = mid
    first, heads = row_at(lo)
    earlier = [head.seq for head in heads if head.ts < cutoff]
    return earlier[-1] if earlier else first - 1


# -- schemas 1 and 2 rebuilt ----------------------------------------------------------


def rebuild(conn: sqlite3.Connection, version: int) -> int:
    """Schema 1 or 2's ``events`` rows as schema 3's batches; the events kept.

    Runs in the caller's transaction. An envelope that does not decode is
    recorded lost (reason ``damaged``) instead of being copied: in a batch
    it would make its neighbours unreadable too.
    """
    for statement in BATCH_TABLES.split(";"):
        if statement.strip():
            conn.execute(statement)
    if version == 1:  # schema 1 had the session as a column, indexed: the spans come from it
        conn.execute(SPANS_TABLE)
        conn.execute(
            "INSERT INTO spans SELECT session_id, min(seq), max(seq) FROM events "
            "WHERE session_id IS NOT NULL GROUP BY session_id"
        )
    kept = 0
    cursor = conn.execute("SELECT seq, id, envelope FROM events ORDER BY seq")
    while rows := cursor.fetchmany(_REBUILD_BATCH):
        good = []
        for seq, id_, blob in rows:
            try:
                event_head(blob)
            except msgspec.DecodeError:
                conn.execute("INSERT OR REPLACE INTO lost VALUES (?, ?, 'damaged')", (seq, seq))
            else:
                good.append((seq, id_, blob))
        if good:
            seqs, ids, blobs = zip(*good, strict=True)
            kept += store(conn, seqs, ids, [msgspec.Raw(b) for b in blobs])
    cursor.close()
    conn.execute("DROP TABLE events")
    conn.execute("UPDATE meta SET value = ? WHERE key = 'events'", (kept,))
    conn.execute("PRAGMA user_version = 3")
    return kept
