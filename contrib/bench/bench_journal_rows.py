"""What a journaled event costs the writer thread, and a resume's read, by schema.

    python contrib/bench/bench_journal_rows.py [--events 50000] [--batch 250] [--rounds 6]

In process, no daemon: the same envelopes (``stream.text.delta`` in four
sessions with a run, encoded as the daemon encodes them) written in
transactions of ``--batch`` events (5,000 events/s at the journal's 50 ms)
into a fresh file by ``JournalFile.write``, schema 3 (a row per write of
at most 256 envelopes, each event's id and seq in ``ids``); by the rows
schema 2 wrote (an event's row is seq, id, envelope); and by the rows
schema 1 wrote (eight columns and the index by session). The tables and
statements of schemas 1 and 2 are kept here as the reference. Then a
resume's read of each file: ``JournalReader.page`` (which reads schema 2
and 3 files, decoding each envelope's head) against the query schema 1's
reader ran (the columns, no decoding). The thread's CPU per event, the
variants taking turns, the median of the rounds; the ratios are to schema
2's in the same command.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from functools import cache
from pathlib import Path
from typing import Any

from busd.core.events import Envelope, Event, TextDelta
from busd.core.ids import new_event_id
from busd.daemon.journalfile import PAGE_ROWS, JournalFile, JournalReader
from busd.daemon.journalrows import UPSERT_SPAN, _spans
from busd.wire import encode_envelope

_OLD_EVENTS = """
DROP TABLE batches;
DROP TABLE ids;
CREATE TABLE events ({columns});
{index}
PRAGMA user_version = {version};
"""
SCHEMA_1_EVENTS = _OLD_EVENTS.format(
    columns="seq INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, ts REAL NOT NULL, "
    "session_id TEXT, run_id TEXT, type TEXT NOT NULL, stale INTEGER NOT NULL, "
    "envelope BLOB NOT NULL",
    index="CREATE INDEX events_by_session ON events (session_id, seq) "
    "WHERE session_id IS NOT NULL;",
    version=1,
)
SCHEMA_2_EVENTS = _OLD_EVENTS.format(
    columns="seq INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, envelope BLOB NOT NULL",
    index="",
    version=2,
)
SCHEMA_1_READ = (
    "SELECT seq, type, session_id, run_id, stale, envelope FROM events "
    "WHERE seq > ? AND seq <= ? ORDER BY seq LIMIT ?"
)
SCHEMAS = ("schema 1", "schema 2", "schema 3")


def envelopes(count: int) -> list[Envelope[Event]]:
    sessions = [new_event_id() for _ in range(4)]
    text = "The journal keeps every accepted event for resumes and export. "
    return [
        Envelope(
            seq,
            time.time(),
            TextDelta(message_id="msg_01", text=text),
            session_id=sessions[seq % 4],
            run_id=f"run-{seq % 4}",
            source="claude-code",
            id=new_event_id(),
        )
        for seq in range(1, count + 1)
    ]


def schema_1_write(file: JournalFile, batch: list[Envelope[Event]], raws: list[Any]) -> None:
    """One write as schema 1's writer made it: 8 parameters a row, 256 rows a statement."""
    conn = file._conn
    conn.execute("BEGIN IMMEDIATE")
    for start in range(0, len(batch), 256):
        part = range(start, min(start + 256, len(batch)))
        params: list[Any] = []
        for i in part:
            e = batch[i]
            tag = e.event.__struct_config__.tag
            params += (e.seq, e.id, e.ts, e.session_id, e.run_id, tag, e.stale, raws[i])
        values = ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?)"] * len(part))
        conn.execute(f"INSERT OR IGNORE INTO events VALUES {values}", params)
    conn.execute(  # the rest of a write, as JournalFile.write does it
        "UPDATE meta SET value = CASE key WHEN 'head' THEN ? WHEN 'reserved' THEN ? "
        "ELSE value + ? END WHERE key IN ('head', 'reserved', 'events')",
        (batch[-1].seq, batch[-1].seq, len(batch)),
    )
    conn.execute("COMMIT")
    file.size()


@cache
def _schema_2_insert(rows: int) -> str:
    return "INSERT OR IGNORE INTO events VALUES " + ", ".join(["(?, ?, ?)"] * rows)


def schema_2_write(file: JournalFile, batch: list[Envelope[Event]], raws: list[Any]) -> None:
    """One write as schema 2's writer made it: 3 parameters a row, 256 rows a statement."""
    conn = file._conn
    conn.execute("BEGIN IMMEDIATE")
    for start in range(0, len(batch), 256):
        part = range(start, min(start + 256, len(batch)))
        params: list[Any] = []
        for i in part:
            params += (batch[i].seq, batch[i].id, raws[i])
        conn.execute(_schema_2_insert(len(part)), params)
    conn.executemany(UPSERT_SPAN, _spans(batch))
    conn.execute(  # the rest of a write, as JournalFile.write does it
        "UPDATE meta SET value = CASE key WHEN 'head' THEN ? WHEN 'reserved' THEN ? "
        "ELSE value + ? END WHERE key IN ('head', 'reserved', 'events')",
        (batch[-1].seq, batch[-1].seq, len(batch)),
    )
    conn.execute("COMMIT")
    file.size()


def write(path: Path, variant: str, events: list[Envelope[Event]], size: int) -> float:
    """CPU µs per event of the writes; the file is left for the read."""
    raws = [encode_envelope(e) for e in events]
    file = JournalFile.open(path)
    try:
        if variant == "schema 1":
            file._conn.executescript(SCHEMA_1_EVENTS)
        elif variant == "schema 2":
            file._conn.executescript(SCHEMA_2_EVENTS)
        started = time.thread_time()
        for start in range(0, len(events), size):
            batch, part = events[start : start + size], raws[start : start + size]
            if variant == "schema 1":
                schema_1_write(file, batch, part)
            elif variant == "schema 2":
                schema_2_write(file, batch, part)
            else:
                last = batch[-1].seq
                file.write(batch, part, [], [], head=last, reserved=last)
        return (time.thread_time() - started) / len(events) * 1e6
    finally:
        file.close()


def read(path: Path, schema: int, count: int) -> float:
    """CPU µs per event of a resume's pages over the whole file."""
    reader = JournalReader(path)
    try:
        started = time.thread_time()
        cursor = 0
        while cursor < count:
            if schema == 1:
                conn = reader._conn
                rows = conn.execute(SCHEMA_1_READ, (cursor, count, PAGE_ROWS)).fetchall()
                cursor = rows[-1][0]
            else:
                cursor = reader.page(cursor, count).end
        return (time.thread_time() - started) / count * 1e6
    finally:
        reader.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=250, help="events per transaction")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    events = envelopes(args.events)
    figures: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for n, variant in enumerate(SCHEMAS if r % 2 == 0 else SCHEMAS[::-1]):
                path = Path(tmp) / f"r{r}-{n}.sqlite3"
                figures.setdefault(("write", variant), []).append(
                    write(path, variant, events, args.batch)
                )
                schema = SCHEMAS.index(variant) + 1
                figures.setdefault(("read", variant), []).append(read(path, schema, args.events))
                for suffix in ("", "-wal", "-shm", ".lock"):
                    Path(f"{path}{suffix}").unlink(missing_ok=True)
    print(
        f"{args.events:,} events, {args.batch} a transaction, {args.rounds} rounds "
        f"(CPU µs per event, median; each round's in brackets)"
    )
    print(f"{'':8} {'schema 1':>10} {'schema 2':>10} {'schema 3':>10} {'1 / 2':>6} {'3 / 2':>6}")
    for what in ("write", "read"):
        one, two, three = (statistics.median(figures[(what, s)]) for s in SCHEMAS)
        print(f"{what:8} {one:10.2f} {two:10.2f} {three:10.2f} {one / two:6.2f} {three / two:6.2f}")
        for s in SCHEMAS:
            rounds = " ".join(f"{x:.2f}" for x in figures[(what, s)])
            print(f"  {s} {what}: [{rounds}]")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
