"""What one wake-up on a socket costs a receiving process: a blocking recv, asyncio and Trio.

At a steady rate every hop between busd's processes is a process waking
on a socket, reading one frame and going back to sleep. This measures that
floor on this machine, with nothing else in the way: a sender writes an
8-byte ``time.monotonic_ns()`` stamp every millisecond over a Unix socket
pair, and a receiver (a fresh process) reads it with a blocking
``recv``, with asyncio's ``StreamReader``, with Trio's ``SocketStream``, or
with busd's ``Receiver`` over it (``busd.transport``: after a read that
drained the socket, it waits before reading, where Trio tries a ``recv``
that fails first).

Reported per receiver: the CPU time (user + system) per wake-up, and the
p50/p99 latency from stamp to receipt, with the ratios to the blocking
``recv`` run in the same command (``docs/performance.md`` uses these).

    .venv/bin/python contrib/bench/bench_wake.py            # about 15 s
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import struct
import subprocess
import sys
import time

STAMP = struct.Struct("!Q")
RECEIVERS = ("recv", "asyncio", "trio", "busd")


def _usage_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def receive(mode: str, fd: int, messages: int) -> None:
    """The receiving process: read ``messages`` stamps, then report on stdout."""
    import asyncio

    import trio

    if mode == "busd":  # before the ready byte, as the others' imports
        from busd.transport import Receiver

    sock = socket.socket(fileno=fd)
    latencies: list[int] = []
    pending = bytearray()  # a stamp split across two reads
    wakeups = 0

    def took(data: bytes) -> None:
        nonlocal wakeups
        now = time.monotonic_ns()
        if not data:
            raise SystemExit("the sender went away")
        wakeups += 1
        pending.extend(data)
        whole = len(pending) - len(pending) % STAMP.size
        for offset in range(0, whole, STAMP.size):
            latencies.append(now - STAMP.unpack_from(pending, offset)[0])
        del pending[:whole]

    sock.sendall(b"r")  # ready: the loop's modules are imported, count from here
    cpu_start = _usage_s()
    if mode == "recv":
        while len(latencies) < messages:
            took(sock.recv(65536))
    elif mode == "asyncio":

        async def asyncio_main() -> None:
            reader, writer = await asyncio.open_connection(sock=sock)
            while len(latencies) < messages:
                took(await reader.read(65536))
            writer.close()

        asyncio.run(asyncio_main())
    elif mode == "trio":

        async def trio_main() -> None:
            stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
            while len(latencies) < messages:
                took(await stream.receive_some(65536))

        trio.run(trio_main)
    else:

        async def busd_main() -> None:
            receiver = Receiver(trio.SocketStream(trio.socket.from_stdlib_socket(sock)), 65536)
            while len(latencies) < messages:
                took(await receiver.receive())

        trio.run(busd_main)
    cpu = _usage_s() - cpu_start
    latencies.sort()
    print(
        json.dumps(
            {
                "cpu_us": cpu / wakeups * 1e6,
                "p50_us": latencies[len(latencies) // 2] / 1e3,
                "p99_us": latencies[int(len(latencies) * 0.99)] / 1e3,
                "wakeups": wakeups,
            }
        )
    )


def run(mode: str, messages: int, interval: float) -> dict[str, float]:
    """One receiver process, fed one stamp per ``interval`` seconds."""
    ours, theirs = socket.socketpair()
    child = subprocess.Popen(
        [sys.executable, __file__, "--receiver", mode, str(theirs.fileno()), str(messages)],
        pass_fds=[theirs.fileno()],
        stdout=subprocess.PIPE,
        text=True,
    )
    theirs.close()
    try:
        if ours.recv(1) != b"r":
            raise SystemExit(f"the {mode} receiver did not start")
        for _ in range(messages):
            ours.sendall(STAMP.pack(time.monotonic_ns()))
            time.sleep(interval)
        out, _ = child.communicate(timeout=60)
    finally:
        ours.close()
        if child.poll() is None:
            child.kill()
    if child.returncode != 0:
        raise SystemExit(f"the {mode} receiver failed (exit {child.returncode})")
    result: dict[str, float] = json.loads(out)
    return result


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--receiver":
        receive(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=3_000)
    parser.add_argument("--interval-ms", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=1, help="rounds; each row keeps its best")
    args = parser.parse_args()

    best: dict[str, dict[str, float]] = {}
    for _ in range(args.repeat):
        for mode in RECEIVERS:  # interleaved, so that noise spreads over every receiver
            result = run(mode, args.messages, args.interval_ms / 1e3)
            if mode not in best or result["cpu_us"] < best[mode]["cpu_us"]:
                best[mode] = result
    load = os.getloadavg()[0]
    print(f"{args.messages} wake-ups, one every {args.interval_ms} ms; load average {load:.2f}")
    print()
    print("| receiver | CPU µs per wake-up | / recv | p50 µs | p99 µs | p99 / recv |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    base = best["recv"]
    for mode in RECEIVERS:
        r = best[mode]
        print(
            f"| {mode} | {r['cpu_us']:.1f} | {r['cpu_us'] / base['cpu_us']:.1f}x "
            f"| {r['p50_us']:.0f} | {r['p99_us']:.0f} | {r['p99_us'] / base['p99_us']:.1f}x |"
        )


if __name__ == "__main__":
    main()
