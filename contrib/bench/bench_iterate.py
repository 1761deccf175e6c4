"""What a subscription's iterator costs its process per wake-up, against a one-task reader.

At a steady rate a subscriber wakes for every frame: it reads the socket,
decodes one ``events`` frame and hands the batch to the application. A
scripted daemon (a child process, speaking the protocol over a Unix
socket) sends one frame of 5 envelopes every millisecond, and two
receivers, each in a fresh process, take them:

- ``bare``: one Trio task that reads with ``busd.transport.Receiver``,
  decodes with the client's decoder and builds a ``Batch`` per frame: the
  floor, with nothing of the client library around it;
- ``client``: ``busd.client``, ``async for batch in subscription``.

Reported per receiver: CPU time (user + system) per batch, best of the
rounds, and the client's ratio to the bare reader in the same command
(``docs/performance.md`` uses these).

    .venv/bin/python contrib/bench/bench_iterate.py              # about 30 s
    .venv/bin/python contrib/bench/bench_iterate.py --rounds 5 --batches 4000
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RECEIVERS = ("bare", "client")
PER_FRAME = 5  # envelopes in each frame, as at 5,000 events/s in bursts of 5


def _usage_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def daemon(path: str, batches: int, interval: float) -> None:
    """The scripted daemon: welcome, pong, then ``batches`` frames an ``interval`` apart."""
    from busd.core.catalog import Catalog
    from busd.core.events import Envelope, TextDelta
    from busd.wire import (
        PROTOCOL_VERSION,
        Events,
        Goodbye,
        Hello,
        Limits,
        Ping,
        Pong,
        Subscribe,
        Welcome,
        client_frame_decoder,
        encode_frame,
    )

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    print("ready", flush=True)
    conn, _ = listener.accept()
    decoder = client_frame_decoder(Catalog())
    sub: int | None = None
    subscribed: int | None = None
    while subscribed is None:  # hello, subscribe, then the ping that confirms it
        decoder.feed(conn.recv(65_536))
        for frame in decoder:
            match frame:
                case Hello():
                    welcome = Welcome(
                        server="script",
                        protocol=PROTOCOL_VERSION,
                        client_id=1,
                        head_seq=0,
                        limits=Limits(),
                    )
                    conn.sendall(encode_frame(welcome))
                case Subscribe(id=sub_id):
                    sub = sub_id
                case Ping(nonce=nonce):
                    conn.sendall(encode_frame(Pong(nonce=nonce)))
                    subscribed = sub
    text = TextDelta(message_id="m", text="x" * 40)
    frames = [
        encode_frame(
            Events(
                sub=subscribed,
                events=[
                    Envelope(seq=n * PER_FRAME + k, ts=0.0, event=text) for k in range(PER_FRAME)
                ],
            )
        )
        for n in range(batches)
    ]
    due = time.monotonic()
    for data in frames:
        conn.sendall(data)
        due += interval
        while (left := due - time.monotonic()) > 0:
            time.sleep(left)
    conn.sendall(encode_frame(Goodbye(reason="bye")))
    conn.recv(1)  # until the receiver has gone


def receive(mode: str, path: str, batches: int) -> None:
    """A receiver: take ``batches`` batches, report the CPU per batch after the first."""
    import trio

    from busd.client import Batch, connect
    from busd.core.catalog import Catalog
    from busd.transport import Receiver
    from busd.wire import (
        PROTOCOL_VERSION,
        Events,
        Hello,
        Ping,
        Pong,
        Subscribe,
        Welcome,
        encode_frame,
        server_frame_decoder,
    )

    start = 0.0

    async def bare() -> None:
        nonlocal start
        stream = await trio.open_unix_socket(path)
        hello = Hello(protocol=PROTOCOL_VERSION, client="bare", role="frontend")
        await stream.send_all(
            encode_frame(hello) + encode_frame(Subscribe(id=1, patterns=(">",), window_ms=0))
            + encode_frame(Ping(nonce=1))
        )  # fmt: skip
        receiver = Receiver(stream)
        decoder = server_frame_decoder(Catalog())
        taken = 0
        while taken < batches:
            data = await receiver.receive()
            if not data:
                raise SystemExit("the daemon went away")
            decoder.feed(data)
            for frame in decoder:
                match frame:
                    case Events(events=events):
                        Batch(events)
                        taken += 1
                        if taken == 1:
                            start = _usage_s()
                    case Welcome() | Pong():
                        pass
        await stream.aclose()

    async def client() -> None:
        nonlocal start
        async with (
            connect(path, client="bench-iterate") as conn,
            conn.subscribe([">"], window_ms=0, deltas="raw") as subscription,
        ):
            taken = 0
            async for _batch in subscription:
                taken += 1
                if taken == 1:
                    start = _usage_s()
                if taken == batches:
                    break

    trio.run(bare if mode == "bare" else client)
    print(json.dumps({"cpu_us": (_usage_s() - start) / (batches - 1) * 1e6}))


def run(mode: str, batches: int, interval: float) -> float:
    with tempfile.TemporaryDirectory(prefix="busd-iterate-", dir="/tmp") as tmp:
        path = os.path.join(tmp, "bus.sock")
        here = os.path.abspath(__file__)
        argv = [sys.executable, here, "--daemon", path, "--batches", str(batches)]
        server = subprocess.Popen(
            [*argv, "--interval", str(interval)], stdout=subprocess.PIPE, text=True
        )
        try:
            assert server.stdout is not None
            assert server.stdout.readline().strip() == "ready"
            out = subprocess.run(
                [sys.executable, here, "--receiver", mode, path, "--batches", str(batches)],
                check=True,
                capture_output=True,
                text=True,
            )
        finally:
            server.kill()
            server.wait()
        return float(json.loads(out.stdout.splitlines()[-1])["cpu_us"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=3_000)
    parser.add_argument("--interval", type=float, default=0.001, help="seconds between frames")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--receiver", nargs=2, metavar=("MODE", "PATH"), help=argparse.SUPPRESS)
    parser.add_argument("--daemon", metavar="PATH", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.daemon:
        daemon(args.daemon, args.batches, args.interval)
        return
    if args.receiver:
        receive(args.receiver[0], args.receiver[1], args.batches)
        return
    best: dict[str, float] = {}
    for number in range(1, args.rounds + 1):
        for mode in RECEIVERS:  # interleaved: the machine's drift falls on both
            cpu = run(mode, args.batches, args.interval)
            best[mode] = min(best.get(mode, cpu), cpu)
            print(f"round {number}: {mode} {cpu:.1f} us per batch", file=sys.stderr)
    load = os.getloadavg()[0]
    print(f"\n{args.batches:,} batches of {PER_FRAME} events, one per {args.interval * 1e3:g} ms;")
    print(f"best of {args.rounds} rounds, load {load:.2f}\n")
    print("| receiver | CPU us per batch | / bare |")
    print("| --- | ---: | ---: |")
    for mode in RECEIVERS:
        print(f"| {mode} | {best[mode]:.1f} | {best[mode] / best['bare']:.2f}x |")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
