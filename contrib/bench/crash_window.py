"""The journal's crash window: what subscribers got that the journal lacks after ``kill -9``.

    python contrib/bench/crash_window.py [--seconds 5] [--repeat 5] [--rate 0] [--ack-every 0]

Each round starts ``busd serve --journal`` on a fresh file, subscribes to
everything, publishes small deltas steadily (``--rate`` events/s; 0: as
fast as one publisher goes), and after ``--seconds`` kills the daemon with
SIGKILL. Then it counts the events the subscriber received whose seq is
not in the journal: the unacknowledged durability window. With
``--ack-every N`` the publisher also asks for an acknowledgement every N
events; every event acknowledged before the kill must be in the journal
(the acknowledged level: it prints how many were not, which must be 0).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from busd.client import ConnectionLost, connect  # noqa: E402
from busd.core.events import TextDelta  # noqa: E402
from busd.daemon.journalfile import JournalReader  # noqa: E402


async def one_round(tmp: Path, seconds: float, rate: float, ack_every: int) -> dict[str, int]:
    sock, journal = tmp / "bus.sock", tmp / "journal.sqlite3"
    daemon = await trio.lowlevel.open_process(
        [sys.executable, "-m", "busd", "serve", "--socket", str(sock), "--journal", str(journal)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert daemon.stdout is not None
    said = b""
    while b"listening" not in said:
        said += await daemon.stdout.receive_some(4096)
    seen: set[int] = set()
    acked = 0
    async with (
        connect(sock, client="watcher") as watcher,
        connect(sock, client="publisher", role="agent") as publisher,
        watcher.subscribe([">"], window_ms=0, deltas="raw") as sub,
        trio.open_nursery() as nursery,
    ):

        async def watch() -> None:
            try:
                async for batch in sub:
                    seen.update(e.seq for e in batch.events)
            except ConnectionLost:
                pass

        async def publish() -> None:
            nonlocal acked
            i = 0
            start = trio.current_time()
            try:
                while True:
                    await publisher.publish(TextDelta(message_id="m", text=f"{i} "), session_id="s")
                    i += 1
                    if ack_every and i % ack_every == 0:
                        result = await publisher.acknowledge()
                        acked = max(acked, result.last_seq or 0)
                    if rate and i % 100 == 0:
                        await trio.sleep_until(start + i / rate)
                    elif i % 500 == 0:
                        await trio.lowlevel.checkpoint()
            except ConnectionLost:
                pass

        nursery.start_soon(watch)
        nursery.start_soon(publish)
        await trio.sleep(seconds)
        daemon.kill()  # SIGKILL
        await daemon.wait()
        with trio.move_on_after(2):  # what was in flight arrives, or not
            while True:
                before = len(seen)
                await trio.sleep(0.2)
                if len(seen) == before:
                    break
        nursery.cancel_scope.cancel()
    journaled: set[int] = set()
    with JournalReader(journal) as reader:
        cursor = 0
        while cursor < (head := reader.meta()["head"]):
            page = reader.page(cursor, head)
            journaled.update(row[0] for row in page.rows)
            cursor = page.end
    missing = seen - journaled
    return {
        "delivered": len(seen),
        "journaled": len(journaled),
        "delivered_not_journaled": len(missing),
        "acked": acked,
        "acked_not_journaled": len({s for s in missing if s <= acked}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--rate", type=float, default=0.0, help="events/s; 0: as fast as it goes")
    parser.add_argument("--ack-every", type=int, default=0, help="ask for an ack every N events")
    args = parser.parse_args()
    rounds = []
    with tempfile.TemporaryDirectory(prefix="busd-crash-", dir="/tmp") as tmp:
        for n in range(args.repeat):
            began = time.monotonic()
            directory = Path(tempfile.mkdtemp(dir=tmp))
            result = trio.run(one_round, directory, args.seconds, args.rate, args.ack_every)
            rounds.append(result)
            print(f"round {n + 1}: {result} ({time.monotonic() - began:.1f} s)", flush=True)
    worst = max(r["delivered_not_journaled"] for r in rounds)
    print(f"delivered but not journaled: worst {worst} of {args.repeat} rounds")
    if args.ack_every:
        print(f"acknowledged but not journaled: {sum(r['acked_not_journaled'] for r in rounds)}")


if __name__ == "__main__":
    main()
