"""Events per second across the NATS bridge, against the same events through one daemon.

Starts, all on this machine and on loopback: ``nats-server -js`` (a fresh
store), daemons A and B as ``python -m busd serve --nats URL`` (names
``bench-a``/``bench-b`` from a config file), and daemon C with no bridge.
The bench's own process is the publisher and the subscriber:

- **bridge**: the publisher sends N ``stream.text.delta`` events into A over
  S sessions, interleaved; a subscriber of B receives them (``deltas="raw"``,
  so every one). The clock runs from the first publish to the last receive.
- **peer**: the same N events into C, received by a subscriber of C.

The two alternate for ``--repeat`` rounds (3), and the best of each counts.

A run counts only if every event arrived once, in order within its session.
The figure is events per second; the ratio is bridge / peer. Before the
runs, a probe event is sent into A until B shows it, so B's consumer is
live (it takes events from when it is first made).

    python contrib/bench/bench_bridge.py                  # 20,000 events, 8 sessions, best of 3
    python contrib/bench/bench_bridge.py --sessions 1     # one session: one publish in flight
    python contrib/bench/bench_bridge.py --quick          # 5,000 events, one round

Needs ``nats-server`` (``apt-get install nats-server``) and the ``busd-nats``
plugin (``pip install -e plugins/nats``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

import busd
from busd.core.events import TextDelta

TEXT = ("The agent streams its answer one small piece at a time. " * 3)[:100]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@asynccontextmanager
async def process(
    argv: list[str], ready: bytes, *, env: dict[str, str] | None = None
) -> AsyncIterator[trio.Process]:
    """Run ``argv`` until the block ends; yield once its output shows ``ready``."""
    output = bytearray()
    async with trio.open_nursery() as nursery:
        proc = await trio.lowlevel.open_process(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env
        )
        seen = trio.Event()

        async def read() -> None:
            assert proc.stdout is not None
            async for chunk in proc.stdout:
                output.extend(chunk)
                if ready in output:
                    seen.set()
            if not seen.is_set():
                raise SystemExit(f"{argv[0]} exited before it was ready:\n{output.decode()}")

        nursery.start_soon(read)
        try:
            with trio.fail_after(20):
                await seen.wait()
            yield proc
        finally:
            with trio.CancelScope(shield=True):
                if proc.returncode is None:
                    proc.terminate()
                with trio.move_on_after(10):
                    await proc.wait()
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()


@asynccontextmanager
async def busd_daemon(work: Path, name: str, nats_url: str | None) -> AsyncIterator[Path]:
    sock = work / f"{name}.sock"
    argv = [sys.executable, "-m", "busd", "serve", "--socket", str(sock), "--log-level", "warning"]
    argv += ["--journal", str(work / f"{name}.sqlite3")]
    if nats_url is not None:
        config = work / f"{name}.toml"
        config.write_text(f'[plugins.nats]\nname = "bench-{name}"\n')
        argv += ["--nats", nats_url, "--config", str(config)]
    env = {**os.environ, "XDG_STATE_HOME": str(work / f"state-{name}"), "BUSD_BLOCK_PLUGINS": ""}
    async with process(argv, b"listening on", env=env):
        yield sock


class Receiver:
    """A subscriber that counts what arrives and checks the order within each session."""

    def __init__(self) -> None:
        self.count = 0
        self.ordered = True
        self.last: dict[str | None, int] = {}
        self.last_ns = 0
        self.probed = trio.Event()
        self.target = 0
        self.done = trio.Event()

    async def run(self, path: Path, *, task_status: trio.TaskStatus[None]) -> None:
        async with (
            busd.connect(path, client="bench-sub") as client,
            client.subscribe(["stream.text.delta"], deltas="raw") as sub,
        ):
            task_status.started()
            async for batch in sub:
                for envelope in batch.events:
                    event = envelope.event
                    assert isinstance(event, TextDelta)
                    if event.message_id == "probe":
                        self.probed.set()
                        continue
                    index = int(event.message_id)
                    if index <= self.last.get(envelope.session_id, -1):
                        self.ordered = False
                    self.last[envelope.session_id] = index
                    self.count += 1
                self.last_ns = time.monotonic_ns()
                if self.target and self.count >= self.target:
                    self.done.set()


async def publish(path: Path, events: int, sessions: int, prefix: str) -> int:
    """Publish ``events`` over ``sessions`` (interleaved); returns the start time (ns)."""
    async with busd.connect(path, client="bench-pub", role="agent") as client:
        started = time.monotonic_ns()
        for i in range(events):
            await client.publish(
                TextDelta(message_id=str(i), text=TEXT), session_id=f"{prefix}{i % sessions}"
            )
        await client.flush()
    return started


async def measure(
    publish_to: Path, receive_from: Path, events: int, sessions: int, prefix: str
) -> float:
    """Events per second from ``publish_to`` to a subscriber of ``receive_from``."""
    receiver = Receiver()
    receiver.target = events
    async with trio.open_nursery() as nursery:
        await nursery.start(receiver.run, receive_from)
        if publish_to != receive_from:  # the bridge: wait until B's consumer is live
            with trio.fail_after(30):
                while not receiver.probed.is_set():
                    async with busd.connect(publish_to, role="agent") as client:
                        await client.publish(
                            TextDelta(message_id="probe", text=""), session_id="probe"
                        )
                        await client.flush()
                    with trio.move_on_after(0.5):
                        await receiver.probed.wait()
        started = await publish(publish_to, events, sessions, prefix)
        with trio.fail_after(300):
            await receiver.done.wait()
        nursery.cancel_scope.cancel()
    if receiver.count != events or not receiver.ordered:
        raise SystemExit(f"FAILED: {receiver.count} of {events} events, ordered={receiver.ordered}")
    return events / ((receiver.last_ns - started) / 1e9)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3, help="rounds; the best counts")
    parser.add_argument("--quick", action="store_true", help="5,000 events, one round")
    args = parser.parse_args()
    events = 5_000 if args.quick else args.events
    if args.quick:
        args.repeat = 1
    nats_server = shutil.which("nats-server", path=os.environ["PATH"] + os.pathsep + "/usr/sbin")
    if nats_server is None:
        raise SystemExit("needs nats-server: apt-get install nats-server")
    with tempfile.TemporaryDirectory(prefix="busd-bench-bridge-") as tmp:
        work = Path(tmp)
        port = free_port()
        url = f"nats://127.0.0.1:{port}"
        nats_argv = [nats_server, "-js", "-a", "127.0.0.1", "-p", str(port)]
        nats_argv += ["-sd", str(work / "js")]
        async with (
            process(nats_argv, b"Server is ready"),
            busd_daemon(work, "a", url) as a,
            busd_daemon(work, "b", url) as b,
            busd_daemon(work, "c", None) as c,
        ):
            peer = bridge = 0.0
            for round_ in range(args.repeat):  # interleaved, the best of each
                prefix = f"r{round_}-"
                peer = max(peer, await measure(c, c, events, args.sessions, prefix + "peer-"))
                bridge = max(bridge, await measure(a, b, events, args.sessions, prefix))
    print(
        f"{events:,} stream.text.delta events over {args.sessions} session(s), "
        f"best of {args.repeat}, this machine:"
    )
    print(f"  one daemon (C → C):                 {peer:>9,.0f} events/s")
    print(f"  across the bridge (A → NATS → B):   {bridge:>9,.0f} events/s")
    print(f"  bridge / one daemon:                {bridge / peer:>9.2f}")


def run() -> None:
    """``main``, with a failure said in one line instead of nested exception groups."""
    try:
        trio.run(main)
    except BaseExceptionGroup as group:
        exits = group.subgroup(lambda exc: isinstance(exc, SystemExit))
        if exits is None:
            raise
        while isinstance(exits, BaseExceptionGroup):
            exits = exits.exceptions[0]
        raise exits from None


if __name__ == "__main__":
    run()
