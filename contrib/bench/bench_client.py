"""The client library's CPU per event, publisher and subscriber, against a real daemon.

``bench_fanout.py`` gives every process's CPU per event end to end; this one
isolates the part ``busd.client`` decides, in the process that uses it
(``time.process_time()`` of this process only; the daemon is a child
process, ``python -m busd serve --no-journal``, as bench_fanout runs it):

- publish: N events as ``fanout_peers.busd_publisher`` publishes them
  (``await client.publish(...)`` in a tight loop, then ``flush()``). The
  loop's own share (making each event and the send time, an ``await`` per
  event) is measured apart with a stand-in ``publish`` that does nothing,
  and subtracted: what is left is the library's.
- subscribe: N events as ``fanout_peers.busd_subscriber`` receives them
  (``deltas="raw"``, window 16 ms), published by a ``fanout_peers.py pub``
  child process. CPU is split at ``anext``: the loop's own (everything the
  subscriber does with a ``Batch``: seq and order checks, the event's text)
  and the library's (everything until ``anext`` returns the next batch:
  reading the socket, decoding frames, building ``Batch``es, Trio).

Two sans-I/O figures beside them, with nothing else on the clock and so
steadier on a shared machine: ``encode`` (``publish`` frames of 10,000
events, as the writer encodes them) and ``decode`` (the daemon's ``events``
frames, built as it builds them, through the client's decoder into
``Batch``es, in 64 KiB reads).

Rounds interleave every figure; each figure's best over the rounds counts
(a library share is taken per round: its total minus its loop) and the
spread (worst / best) says how noisy the machine was. The subscriber's
library share includes freeing the previous batch, as a real loop does.

    .venv/bin/python contrib/bench/bench_client.py                  # 200,000 events, 5 rounds
    .venv/bin/python contrib/bench/bench_client.py --rounds 3 --events 100000 --json out.json
    .venv/bin/python contrib/bench/bench_client.py --profile pub --profile-out pub.prof
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio
from fanout_peers import EVENT_TYPE, SESSION, Tally, busd_batch, make_event

from busd.client import Batch, connect
from busd.core.catalog import Catalog
from busd.core.events import Envelope, Event
from busd.wire import Encoder, Outgoing, Publish, encode_envelope, pack_events, server_frame_decoder

HERE = Path(__file__).resolve().parent
PYTHON = sys.executable
RECEIVE = 65_536  # the client's read size
PUBLISH_FRAME = 10_000  # events per publish frame when a tight loop fills the client's queue
FIGURES = ("publish", "publish loop", "publish library", "subscribe", "subscribe loop",
           "subscribe library", "encode", "decode")  # fmt: skip


# -- the daemon ------------------------------------------------------------------


class Daemon:
    """``busd serve --no-journal`` on a Unix socket in ``tmp``, stopped on exit."""

    def __init__(self, tmp: Path) -> None:
        self.path = tmp / "busd.sock"
        self.log = (tmp / "busd.log").open("wb")
        argv = [PYTHON, "-m", "busd", "serve", "--no-journal", "--socket", str(self.path)]
        argv += ["--log-level", "warning"]
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:  # an external program: poll until it listens
            with socket.socket(socket.AF_UNIX) as probe:
                try:
                    probe.connect(str(self.path))
                    return
                except OSError:
                    if self.proc.poll() is not None or time.monotonic() > deadline:
                        self.close()
                        message = f"busd: the daemon did not start (see {self.log.name})"
                        raise SystemExit(message) from None
            time.sleep(0.05)

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


# -- the figures ---------------------------------------------------------------------


async def publish_run(address: str, events: int) -> tuple[float, float]:
    """CPU seconds of publishing ``events`` as busd_publisher does, and of its loop alone."""

    async def nothing(event: Event, *, session_id: str | None = None) -> None:
        return None

    async def loop(publish: Callable[..., Awaitable[object]]) -> None:
        for index in range(events):
            await publish(make_event(index, time.monotonic_ns()), session_id=SESSION)

    async with connect(address, client="bench-publisher", role="agent") as client:
        await client.flush()
        start = time.process_time()
        await loop(nothing)
        alone = time.process_time() - start
        start = time.process_time()
        await loop(client.publish)
        await client.flush()
        total = time.process_time() - start
    return total, alone


async def subscribe_run(address: str, events: int) -> tuple[float, float]:
    """CPU seconds of receiving ``events`` as busd_subscriber does: (library, loop)."""
    peers = str(HERE / "fanout_peers.py")
    argv = [PYTHON, peers, "pub", "busd", address, "--events", str(events)]
    tally = Tally(events, latency=False)
    last_seq = 0
    library = own = 0.0
    async with (
        connect(address, client="bench-subscriber", role="frontend") as client,
        client.subscribe([EVENT_TYPE], window_ms=16, deltas="raw") as subscription,
        trio.open_nursery() as nursery,
    ):
        publisher = await nursery.start(_publisher, argv)
        mark = time.process_time()
        await publisher.go()
        while not tally.done:
            batch: Batch | None = None
            with trio.move_on_after(tally.timeout):
                batch = await anext(subscription, None)
            if batch is None:
                break
            now = time.process_time()
            library += now - mark
            mark = now
            # the loop's own work, as busd_subscriber does it
            last_seq = busd_batch(tally, batch, last_seq, time.monotonic_ns())
            now = time.process_time()
            own += now - mark
            mark = now
        await publisher.done()
    if tally.count != events or not tally.ordered:
        raise SystemExit(
            f"busd: the subscriber got {tally.count} of {events} events, or disordered"
        )
    return library, own


class _Publisher:
    """A ``fanout_peers.py pub busd`` child: ready, go, and its result line."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        assert process.stdin is not None
        assert process.stdout is not None
        self.stdin = process.stdin
        self.stdout = process.stdout
        self.pending = b""

    async def line(self) -> dict[str, Any]:
        while b"\n" not in self.pending:
            with trio.fail_after(120):
                data = await self.stdout.receive_some()
            if not data:
                raise SystemExit("busd: the publisher ended early")
            self.pending += data
        line, self.pending = self.pending.split(b"\n", 1)
        result: dict[str, Any] = json.loads(line)
        return result

    async def go(self) -> None:
        await self.stdin.send_all(b"go\n")

    async def done(self) -> None:
        await self.line()  # its result: every event sent and flushed
        with trio.fail_after(30):
            await self.process.wait()


async def _publisher(argv: list[str], task_status: trio.TaskStatus[_Publisher]) -> None:
    process = await trio.lowlevel.open_process(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        publisher = _Publisher(process)
        await publisher.line()  # {"ready": true}: connected
        task_status.started(publisher)
        await process.wait()
    finally:
        if process.returncode is None:
            process.kill()


def encode_run(events: int) -> float:
    """CPU seconds of encoding ``events`` into publish frames as the client's writer does."""
    encoder = Encoder()
    outgoing = [
        Outgoing(event=make_event(index, time.monotonic_ns()), session_id=SESSION)
        for index in range(PUBLISH_FRAME)
    ]
    out = bytearray()
    start = time.process_time()
    for _ in range(events // PUBLISH_FRAME):
        out.clear()
        encoder.encode_into(Publish(events=outgoing), out)
    return time.process_time() - start


def daemon_bytes(events: int, per_frame: int = 1_000) -> bytes:
    """``events`` frames of ``per_frame`` envelopes, as the daemon encodes them."""
    encoder = Encoder()
    chunks = []
    for first in range(1, events + 1, per_frame):
        raws = [
            encode_envelope(
                Envelope(
                    seq=seq,
                    ts=time.time(),
                    event=make_event(seq - 1, time.monotonic_ns()),
                    session_id=SESSION,
                    source="bench-publisher",
                    id=f"{seq:026d}",
                )
            )
            for seq in range(first, min(events + 1, first + per_frame))
        ]
        packed = pack_events(raws)
        chunks += [encoder.events_head(1, packed), packed]
    return b"".join(chunks)


def decode_run(data: bytes, events: int, catalog: Catalog) -> float:
    """CPU seconds of reading ``data`` into ``Batch``es as the client's reader does."""
    decoder = server_frame_decoder(catalog)
    view = memoryview(data)
    start = time.process_time()
    count = 0
    for offset in range(0, len(data), RECEIVE):
        decoder.feed(view[offset : offset + RECEIVE])
        for frame in decoder:
            count += len(Batch(frame.events).events)  # type: ignore[union-attr]
    elapsed = time.process_time() - start
    if count != events:
        raise SystemExit(f"busd: the decoder returned {count} of {events} events")
    return elapsed


# -- orchestration ----------------------------------------------------------------------


def one_round(address: str, events: int, data: bytes, catalog: Catalog) -> dict[str, float]:
    """Every figure once, in microseconds per event."""
    total, alone = trio.run(publish_run, address, events)
    library, own = trio.run(subscribe_run, address, events)
    us = 1e6 / events
    return {
        "publish": total * us,
        "publish loop": alone * us,
        "publish library": (total - alone) * us,
        "subscribe": (library + own) * us,
        "subscribe loop": own * us,
        "subscribe library": library * us,
        "encode": encode_run(events) * us,
        "decode": decode_run(data, events, catalog) * us,
    }


def profile(kind: str, address: str, events: int, out: Path) -> None:
    """One run of ``kind`` (``pub`` or ``sub``) under cProfile, written to ``out``."""
    profiler = cProfile.Profile()
    profiler.enable()
    if kind == "pub":
        trio.run(publish_run, address, events)
    else:
        trio.run(subscribe_run, address, events)
    profiler.disable()
    profiler.dump_stats(out)
    print(f"profile of {kind} written to {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=200_000, help="events per run")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (best counts)")
    parser.add_argument("--json", type=Path, help="write every round's figures here")
    parser.add_argument("--profile", choices=("pub", "sub"), help="profile one run instead")
    parser.add_argument("--profile-out", type=Path, default=Path("client.prof"))
    args = parser.parse_args()
    if args.events < PUBLISH_FRAME or args.rounds < 1:
        parser.error(f"--events must be at least {PUBLISH_FRAME} and --rounds at least 1")
    catalog = Catalog()
    with tempfile.TemporaryDirectory(prefix="bench-client-") as tmp:
        daemon = Daemon(Path(tmp))
        try:
            address = str(daemon.path)
            trio.run(publish_run, address, 20_000)  # warm the daemon up
            if args.profile is not None:
                profile(args.profile, address, args.events, args.profile_out)
                return
            data = daemon_bytes(args.events)
            load = os.getloadavg()[0]
            rounds = []
            for number in range(1, args.rounds + 1):
                rounds.append(one_round(address, args.events, data, catalog))
                figures = ", ".join(f"{k} {v:.2f}" for k, v in rounds[-1].items())
                print(f"round {number}: {figures}", file=sys.stderr)
        finally:
            daemon.close()
    report(rounds, args.events, load, os.getloadavg()[0])
    if args.json is not None:
        args.json.write_text(json.dumps({"events": args.events, "rounds": rounds}, indent=1))


def report(rounds: list[dict[str, float]], events: int, before: float, after: float) -> None:
    print(
        f"\nclient CPU per event, microseconds: {events:,} events a run, best of {len(rounds)} "
        f"interleaved rounds; load average {before:.2f} before, {after:.2f} after\n"
    )
    print("| figure            |  best | worst | spread |")
    print("| ----------------- | ----: | ----: | -----: |")
    for name in FIGURES:
        values = [r[name] for r in rounds]
        best, worst = min(values), max(values)
        spread = f"{worst / best:.2f}x" if best > 0 else "-"
        print(f"| {name:<17} | {best:5.2f} | {worst:5.2f} | {spread:>6} |")


if __name__ == "__main__":
    main()
