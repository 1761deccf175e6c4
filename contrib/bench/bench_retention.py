"""How long an agent's events wait for the journal while a full journal prunes.

    python contrib/bench/bench_retention.py [--events 1000000] [--rounds 2] [--seconds 3]

In process, no daemon: a journal of ``--events`` text deltas is built once
(a few hundred bytes an event), then each round copies it and runs the
journal's writer over the copy while one event is appended every 10 ms
(an agent's pace), timing each from its append until it is journaled.
Two runs a round, taking turns: the copy just over its size limit, so the
writer starts with a prune that removes a tenth of it (what happens each
time a full journal's file grows past ``max_size``), and the same copy
with no limit (the peer: the 50 ms write interval alone). Before each run
the copy is synced, so the prune's checkpoints do not also pay for the
copy's dirty pages.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import trio

from busd.core.events import Envelope, Event, TextDelta
from busd.core.ids import new_event_id
from busd.daemon.journal import Journal
from busd.daemon.journalfile import JournalFile, Retention
from busd.wire import encode_envelope

TEXT = "The journal keeps every accepted event for resumes and export. " * 2
PACE = 0.01  # seconds between two events


def build(path: Path, count: int) -> None:
    """A journal of ``count`` deltas in four sessions, written 2,000 a transaction."""
    file = JournalFile.open(path)
    sessions = [new_event_id() for _ in range(4)]
    try:
        for start in range(1, count + 1, 2000):
            batch: list[Envelope[Event]] = [
                Envelope(
                    seq,
                    time.time(),
                    TextDelta(message_id="m", text=TEXT),
                    session_id=sessions[seq % 4],
                    run_id="r",
                    source="bench",
                    id=new_event_id(),
                )
                for seq in range(start, min(start + 2000, count + 1))
            ]
            raws = [encode_envelope(e) for e in batch]
            last = batch[-1].seq
            file.write(batch, raws, [], [], head=last, reserved=last)
    finally:
        file.close()


def copy(source: Path, target: Path) -> int:
    """``source`` (and its WAL) at ``target``, synced; the database's size."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{target}{suffix}").unlink(missing_ok=True)
        if Path(f"{source}{suffix}").exists():
            shutil.copy(f"{source}{suffix}", f"{target}{suffix}")
    file = JournalFile.open(target)
    try:
        size = file.size()
    finally:
        file.close()
    os.sync()
    return size


async def lags(path: Path, limit: int | None, seconds: float) -> tuple[list[float], int]:
    """Each event's wait (s) from its append until journaled; the events retention removed."""
    journal = Journal.open(
        path,
        sessions=lambda since: [],
        report=lambda message: None,
        retention=Retention(max_age=None, max_size=limit),
    )
    before = journal.statistics()["events"]
    waits: list[float] = []

    async def timed(seq: int) -> None:
        start = time.monotonic()
        await journal.journaled(seq)
        waits.append(time.monotonic() - start)

    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)  # over its limit: it prunes at once
        seq = journal.next_seq - 1
        for _ in range(int(seconds / PACE)):
            seq += 1
            envelope: Envelope[Event] = Envelope(
                seq,
                time.time(),
                TextDelta(message_id="m", text=TEXT),
                session_id="agent",
                id=new_event_id(),
            )
            journal.append(envelope, encode_envelope(envelope))
            nursery.start_soon(timed, seq)
            await trio.sleep(PACE)
        await journal.journaled(seq)
        nursery.cancel_scope.cancel()
    removed = before + len(waits) - journal.statistics()["events"]
    await journal.aclose()
    return waits, removed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000, help="events in the journal")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=3.0, help="of an agent's events a run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="busd-retention-") as tmp:
        source, target = Path(tmp) / "full.sqlite3", Path(tmp) / "run.sqlite3"
        started = time.monotonic()
        build(source, args.events)
        print(f"built a journal of {args.events:,} events in {time.monotonic() - started:.0f} s")
        runs: dict[str, list[tuple[list[float], int]]] = {"pruning": [], "no limit": []}
        for r in range(args.rounds):
            for kind in ("pruning", "no limit") if r % 2 == 0 else ("no limit", "pruning"):
                size = copy(source, target)
                limit = int(size * 0.97) if kind == "pruning" else None
                runs[kind].append(trio.run(lags, target, limit, args.seconds))
    print(
        f"\nAn event every {PACE * 1e3:.0f} ms for {args.seconds:g} s; ms from its append until "
        f"journaled (each round: p50 / p99 / max)\n"
    )
    print("| journal | events removed | p50 | p99 | max | over 100 ms | each round |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for kind, outcomes in runs.items():
        every = sorted(w for waits, _ in outcomes for w in waits)
        rounds = "; ".join(
            f"{statistics.median(w) * 1e3:.0f} / {sorted(w)[int(len(w) * 0.99)] * 1e3:.0f} / "
            f"{max(w) * 1e3:.0f}"
            for w, _ in outcomes
        )
        print(
            f"| {kind} | {statistics.median(n for _, n in outcomes):,.0f} "
            f"| {statistics.median(every) * 1e3:.0f} | {every[int(len(every) * 0.99)] * 1e3:.0f} "
            f"| {every[-1] * 1e3:.0f} | {sum(w > 0.1 for w in every)} of {len(every)} | {rounds} |"
        )


if __name__ == "__main__":
    main()
