"""Soak busd: the protocol model for as long as asked, beside a churn of hundreds of clients.

One ``busd serve`` (journal on, the model's small limits) serves both for
the whole run:

- the model (``tests/test_protocol_model.py``, the hypothesis state
  machine CI runs a few examples of) runs example after example in the main
  thread, every example against this same daemon;
- in a second thread, a Trio churn: a publisher at ``--rate`` events/s
  (``stream.session.info`` in session ``soak``, numbered 1, 2, 3...), a
  reference reader that stays for the whole run, and ``--clients``
  churners that each connect, subscribe, read for a moment and leave (bye,
  a hang-up, or a hang-up mid-frame), over and over. After a bye a churner
  resumes from ``goodbye.resume_seq`` on a new connection and checks that
  the next event it gets is the one after the last it had.

Every loop is bounded by the deadline (and each wait by a timeout). At the
end: the numbers, the daemon's RSS and open fds before and after, and its
exit code on SIGTERM. Exits 1 if the daemon exited, a seq was lost or
repeated, or the model found a violation.

    .venv/bin/python contrib/soak/soak.py --minutes 10
    .venv/bin/python contrib/soak/soak.py --minutes 1 --no-model   # the churn alone

See contrib/soak/README.md for what it prints.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import trio
from hypothesis.stateful import run_state_machine_as_test

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.test_protocol_model import (  # noqa: E402  (needs ROOT on the path)
    DAEMON_ARGS,
    ProtocolModel,
    ServeProcess,
    model_settings,
)

SESSION = "soak"
TIMEOUT = 10.0  # seconds any one answer may take
_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder().decode


def status(path: str) -> dict[str, Any]:
    """``status`` over a blocking socket (hello, request, bye in one write)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(TIMEOUT)
        sock.connect(path)
        sock.sendall(
            framed({"op": "hello", "protocol": 1, "client": "soak-status"})
            + framed({"op": "request", "id": 1, "command": {"cmd": "status"}})
            + framed({"op": "bye"})
        )
        data = b""
        while chunk := sock.recv(1 << 16):
            data += chunk
    while data:
        size = int.from_bytes(data[:4], "big")
        frame = _decode(data[4 : 4 + size])
        data = data[4 + size :]
        if frame.get("op") == "reply":
            result: dict[str, Any] = frame["result"]
            return result
    raise OSError("no status reply")


def fd_summary(pid: int) -> dict[str, int]:
    """The daemon's open fds by kind (socket, pipe, anon_inode:..., or the file)."""
    kinds: Counter[str] = Counter()
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in fd_dir.iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            kinds[target.split(":[")[0] if ":[" in target else target] += 1
    return dict(kinds)


def framed(value: object) -> bytes:
    body = _encode(value)
    return len(body).to_bytes(4, "big") + body


# -- the daemon, restarted on the same socket and journal if it dies -----------------


class Daemon:
    """The one daemon of the soak; a dead one is counted, logged and started again.

    A thread samples its RSS and open fds once a second for the peaks.
    """

    def __init__(self, directory: Path, args: list[str]) -> None:
        self.directory = directory
        self.args = args
        self.exits: list[int] = []
        self.logs: list[str] = []
        self.lock = threading.Lock()
        self.current = ServeProcess(args, directory=directory)
        self.current.ready()
        self.generation = 0
        self.peak_rss_kib = 0
        self.peak_fds = 0
        self.samples: list[tuple[float, int, int]] = []  # (seconds, RSS KiB, fds)
        self.started = time.monotonic()
        self.done = threading.Event()
        self.sampler = threading.Thread(target=self._sample, name="sampler", daemon=True)
        self.sampler.start()

    def _sample(self) -> None:
        while not self.done.wait(1.0):  # a sampling period
            with contextlib.suppress(OSError, ValueError):
                process = self.current
                rss, fds = process.rss_kib(), process.open_fds()
                self.peak_rss_kib = max(self.peak_rss_kib, rss)
                self.peak_fds = max(self.peak_fds, fds)
                self.samples.append((time.monotonic() - self.started, rss, fds))

    def settle(self, timeout: float = 15.0) -> int:
        """Wait (bounded) until the daemon counts no clients; the count left."""
        deadline = time.monotonic() + timeout
        clients = -1
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                clients = status(self.socket)["clients"] - 1  # less this connection
                if clients == 0:
                    break
            time.sleep(0.2)  # polling the daemon's own count, bounded
        return clients

    @property
    def socket(self) -> str:
        return self.current.socket

    def get(self) -> ServeProcess:
        """The running daemon (restarted first if it died)."""
        with self.lock:
            if not self.current.alive():
                code = self.current.wait()
                self.exits.append(code)
                self.logs.append(self.current.log_tail(60))
                print(f"!! busd serve exited {code}; restarting it", flush=True)
                self.current = ServeProcess(self.args, directory=self.directory)
                self.current.ready()
                self.generation += 1
            return self.current


# -- the churn ---------------------------------------------------------------------


@dataclass
class Churn:
    """What the churn saw; ``lost``, ``repeated`` and ``regressions`` must stay 0."""

    published: int = 0
    connections: int = 0
    connect_failures: Counter[str] = field(default_factory=Counter)
    leaves: Counter[str] = field(default_factory=Counter)
    goodbyes: Counter[str] = field(default_factory=Counter)
    received: int = 0
    resumes: int = 0
    resume_skipped: int = 0
    """Resumes from goodbye.resume_seq whose next event was not the next one."""
    no_goodbye: int = 0
    """A bye answered by a bare close."""
    stalled: int = 0
    """The daemon did not answer within TIMEOUT."""
    lost: int = 0
    """Events missing inside one connection's stream (numbers skipped)."""
    repeated: int = 0
    """Events delivered twice on one connection."""
    regressions: int = 0
    """A seq not above the previous one on one subscription."""
    seq_reused: int = 0
    """A restarted daemon whose head is below a seq already delivered."""
    errors: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)
    max_seq: int = 0

    def note(self, what: str) -> None:
        if len(self.examples) < 10:
            self.examples.append(what)


class Lost(Exception):
    """The connection ended (EOF or reset); the message says how."""

    @classmethod
    def from_error(cls, exc: BaseException) -> Lost:
        cause = exc.__cause__ or exc.__context__
        errno = getattr(cause, "errno", None)
        return cls(f"{type(exc).__name__}" + (f" errno {errno}" if errno else ""))


class Wire:
    """Frames over one Trio Unix socket stream, as dicts."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = bytearray()

    @classmethod
    async def open(cls, path: str, churn: Churn, name: str) -> Wire | None:
        delivered = churn.max_seq  # before connecting: the welcome's head is at least this
        try:
            with trio.fail_after(TIMEOUT):
                stream = await trio.open_unix_socket(path)
        except (OSError, trio.TooSlowError) as exc:
            churn.connect_failures[type(exc).__name__ + f"({getattr(exc, 'errno', '')})"] += 1
            return None
        wire = cls(stream)
        churn.connections += 1
        try:
            await wire.send({"op": "hello", "protocol": 1, "client": name, "role": "admin"})
        except Lost as exc:
            churn.connect_failures[f"hello not sent: {exc}"] += 1
            await wire.close()
            return None
        try:
            welcome = await wire.receive()
        except Lost as exc:
            churn.connect_failures[f"no welcome: {exc}"] += 1
            await wire.close()
            return None
        if welcome.get("op") != "welcome":
            churn.connect_failures[f"{welcome.get('op')}:{welcome.get('code')}"] += 1
            await wire.close()
            return None
        head = welcome["head_seq"]
        if head < delivered:
            churn.seq_reused += 1
            churn.note(f"welcome head_seq {head} below seq {delivered}, delivered before")
        return wire

    async def send(self, frame: dict[str, Any]) -> None:
        try:
            await self.stream.send_all(framed(frame))
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise Lost.from_error(exc) from exc

    async def receive(self) -> dict[str, Any]:
        """The next frame; ``Lost`` at the end, ``TooSlowError`` after ``TIMEOUT`` of silence."""
        while True:
            if len(self.buffer) >= 4:
                size = int.from_bytes(self.buffer[:4], "big")
                if len(self.buffer) >= 4 + size:
                    body = bytes(self.buffer[4 : 4 + size])
                    del self.buffer[: 4 + size]
                    frame: dict[str, Any] = _decode(body)
                    return frame
            with trio.fail_after(TIMEOUT):
                try:
                    data = await self.stream.receive_some(1 << 16)
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    raise Lost.from_error(exc) from exc
            if not data:
                raise Lost("EOF")
            self.buffer += data

    async def close(self) -> None:
        await trio.aclose_forcefully(self.stream)


@dataclass
class Stream:
    """One subscription's view of the publisher's numbers: contiguous, once each."""

    churn: Churn
    who: str
    last_n: int | None = None
    last_seq: int = 0
    resuming: bool = False
    """Subscribed again from a resume point: what it repeats first is not a repeat."""

    def reconnected(self, since: int | None) -> None:
        self.last_seq = since or 0
        self.resuming = since is not None

    def take(self, frame: dict[str, Any]) -> None:
        for envelope in frame["events"]:
            seq = envelope["seq"]
            self.churn.max_seq = max(self.churn.max_seq, seq)
            if seq <= self.last_seq:
                self.churn.regressions += 1
                self.churn.note(f"{self.who}: seq {seq} after {self.last_seq}")
            self.last_seq = seq
            n = int(envelope["event"]["message"])
            self.churn.received += 1
            if self.resuming and self.last_n is not None and n <= self.last_n:
                continue
            self.resuming = False
            if self.last_n is not None:
                if n <= self.last_n:
                    self.churn.repeated += 1
                    self.churn.note(f"{self.who}: event {n} again after {self.last_n}")
                    continue
                if n > self.last_n + 1:
                    self.churn.lost += n - self.last_n - 1
                    self.churn.note(f"{self.who}: events {self.last_n + 1}..{n - 1} never came")
            self.last_n = n


SUBSCRIBE = {"op": "subscribe", "patterns": ["stream.session.info"], "sessions": [SESSION]}


async def publisher(daemon: Daemon, churn: Churn, rate: int, deadline: float) -> None:
    """``rate`` events a second in batches every 10 ms, numbered; reconnects if cut off."""
    per_tick = max(1, rate // 100)
    n = 0
    while trio.current_time() < deadline:
        wire = await Wire.open(daemon.socket, churn, "soak-publisher")
        if wire is None:
            await trio.sleep(0.1)  # back off, then try again
            continue
        try:
            next_tick = trio.current_time()
            while trio.current_time() < deadline:
                events = []
                for _ in range(per_tick):
                    n += 1
                    events.append(
                        {
                            "event": {"type": "stream.session.info", "message": str(n)},
                            "session_id": SESSION,
                        }
                    )
                await wire.send({"op": "publish", "events": events})
                churn.published = n
                next_tick += 0.01
                await trio.sleep_until(next_tick)  # pacing: the rate, not an event
        except Lost:
            churn.errors["publisher cut off"] += 1  # what it sent last may be lost
        finally:
            await wire.close()


async def read_until_closed(wire: Wire, stream: Stream, churn: Churn) -> dict[str, Any] | None:
    """Every frame up to the end; the goodbye, if one came."""
    goodbye = None
    with contextlib.suppress(Lost):
        while True:
            frame = await wire.receive()
            match frame.get("op"):
                case "events":
                    stream.take(frame)
                case "goodbye":
                    goodbye = frame
                    churn.goodbyes[str(frame.get("reason"))] += 1
                case "error":
                    churn.errors[f"error {frame.get('code')}"] += 1
                case "gap":
                    churn.errors["gap"] += 1
    await wire.close()
    return goodbye


async def resume_check(
    daemon: Daemon, churn: Churn, stream: Stream, resume: int, deadline: float
) -> None:
    """Subscribe from ``resume``: the first number past the last one seen must follow it."""
    if stream.last_n is None:
        return
    wire = await Wire.open(daemon.socket, churn, "soak-resume")
    if wire is None:
        return
    churn.resumes += 1
    try:
        await wire.send({**SUBSCRIBE, "id": 1, "window_ms": 0, "since_seq": resume})
        with trio.move_on_at(min(deadline, trio.current_time() + TIMEOUT)):
            while True:
                frame = await wire.receive()
                if frame.get("op") == "goodbye":
                    return
                if frame.get("op") != "events":
                    continue
                for envelope in frame["events"]:
                    n = int(envelope["event"]["message"])
                    if n <= stream.last_n:
                        continue  # already seen: resuming may repeat, never skip
                    if n != stream.last_n + 1:
                        churn.resume_skipped += 1
                        churn.note(
                            f"{stream.who}: resumed from resume_seq {resume} after event "
                            f"{stream.last_n} (seq {stream.last_seq}); the next one was {n} "
                            f"(seq {envelope['seq']})"
                        )
                    return
    except Lost:
        return
    finally:
        await wire.close()


async def churner(index: int, daemon: Daemon, churn: Churn, deadline: float) -> None:
    """Connect, subscribe, read for a moment, leave; again and again until the deadline."""
    rng = random.Random(index)
    rounds = 0
    while trio.current_time() < deadline and rounds < 100_000:
        rounds += 1
        wire = await Wire.open(daemon.socket, churn, f"soak-churn-{index}")
        if wire is None:
            await trio.sleep(rng.uniform(0.05, 0.2))  # back off, then try again
            continue
        stream = Stream(churn, f"churner {index} round {rounds}")
        window = rng.choice([0, 16, 50])
        try:
            await wire.send({**SUBSCRIBE, "id": 1, "window_ms": window})
            with trio.move_on_after(rng.uniform(0.05, 0.5)):
                while True:
                    frame = await wire.receive()
                    if frame.get("op") == "events":
                        stream.take(frame)
                    elif frame.get("op") == "goodbye":
                        churn.goodbyes[str(frame.get("reason"))] += 1
                        raise Lost("goodbye")
            how = rng.choices(["bye", "hang_up", "mid_frame"], [7, 2, 1])[0]
            churn.leaves[how] += 1
            if how == "bye":
                await wire.send({"op": "bye"})
                goodbye = await read_until_closed(wire, stream, churn)
                resume = None if goodbye is None else goodbye.get("resume_seq")
                if goodbye is None:
                    churn.no_goodbye += 1
                    churn.note(f"{stream.who}: bye answered by a bare close")
                elif isinstance(resume, int):
                    await resume_check(daemon, churn, stream, resume, deadline)
                continue
            if how == "mid_frame":
                await wire.stream.send_all(framed({"op": "ping"})[:3])
        except Lost:
            churn.errors["churner cut off"] += 1
        except trio.TooSlowError:
            churn.stalled += 1
            churn.note(f"{stream.who}: no answer within {TIMEOUT} s")
        await wire.close()


async def reference_reader(daemon: Daemon, churn: Churn, deadline: float) -> None:
    """One subscriber for the whole run; when dropped it resumes from its resume point."""
    stream = Stream(churn, "reference reader")
    since: int | None = None
    while trio.current_time() < deadline:
        wire = await Wire.open(daemon.socket, churn, "soak-reference")
        if wire is None:
            await trio.sleep(0.1)  # back off, then try again
            continue
        stream.reconnected(since)
        try:
            subscribe: dict[str, Any] = {**SUBSCRIBE, "id": 1}
            if since is not None:
                subscribe["since_seq"] = since
            await wire.send(subscribe)
            while True:
                with trio.move_on_at(deadline) as scope:
                    frame = await wire.receive()
                if scope.cancelled_caught:
                    break
                if frame.get("op") == "events":
                    stream.take(frame)
                elif frame.get("op") == "goodbye":
                    churn.goodbyes[f"reference: {frame.get('reason')}"] += 1
                    since = frame.get("resume_seq")
                    break
        except (Lost, trio.TooSlowError):
            churn.errors["reference reader cut off"] += 1
            since = stream.last_seq or None
        finally:
            await wire.close()


async def run_churn(daemon: Daemon, churn: Churn, clients: int, rate: int, seconds: float) -> None:
    deadline = trio.current_time() + seconds
    async with trio.open_nursery() as nursery:
        nursery.start_soon(publisher, daemon, churn, rate, deadline)
        nursery.start_soon(reference_reader, daemon, churn, deadline)
        for index in range(clients):
            nursery.start_soon(churner, index, daemon, churn, deadline)


# -- the model -------------------------------------------------------------------------


@dataclass
class Model:
    batches: int = 0
    failures: list[str] = field(default_factory=list)


def describe(exc: BaseException) -> str:
    """What hypothesis found: each error's message and its falsifying example."""
    if isinstance(exc, BaseExceptionGroup):
        return "\n".join(describe(e) for e in exc.exceptions)
    notes = "\n".join(getattr(exc, "__notes__", []))
    origin = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    where = f" (at {origin.filename}:{origin.lineno})" if origin else ""
    return f"{type(exc).__name__}{where}: {str(exc)[:3000]}\n{notes[-4000:]}"


def run_model(daemon: Daemon, model: Model, deadline: float, steps: int, shrink: bool) -> None:
    """Batches of examples until the deadline; a failing batch is printed and counted."""
    ProtocolModel.daemon_factory = daemon.get
    settings = model_settings(examples=10, steps=steps, shrink=shrink, database=None)
    while time.monotonic() < deadline:
        model.batches += 1
        examples = ProtocolModel.stats["examples"]
        try:
            run_state_machine_as_test(ProtocolModel, settings=settings)
        except Exception as exc:  # a violation: keep it, and go on
            if ProtocolModel.stats["examples"] == examples:
                raise  # not the daemon's doing: the soak itself is broken
            text = describe(exc)
            model.failures.append(text)
            print(f"!! model violation: {text}", flush=True)


# -- main ------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=200, help="churners at once")
    parser.add_argument("--rate", type=int, default=1000, help="events/s published")
    parser.add_argument("--steps", type=int, default=50, help="steps per model example")
    parser.add_argument("--no-model", action="store_true", help="the churn alone")
    parser.add_argument("--no-churn", action="store_true", help="the model alone")
    parser.add_argument("--shrink", action="store_true", help="shrink model failures (slow)")
    parser.add_argument(
        "--together",
        action="store_true",
        help="run the model and the churn at once for the whole time (the model then runs "
        "few examples: the churn keeps the daemon busy)",
    )
    args = parser.parse_args()
    seconds = args.minutes * 60
    model_seconds = churn_seconds = seconds
    if not (args.together or args.no_model or args.no_churn):
        model_seconds, churn_seconds = seconds / 2, seconds / 2  # one after the other

    directory = Path(tempfile.mkdtemp(prefix="busd-soak-"))
    # A churner's closing connection still counts while the daemon drains it.
    serve_args = [*DAEMON_ARGS, f"--max-connections-per-uid={3 * args.clients + 100}"]
    daemon = Daemon(directory, serve_args)
    rss_before, fds_before = daemon.current.rss_kib(), daemon.current.open_fds()
    print(
        f"busd serve pid {daemon.current.pid} on {daemon.socket}: RSS {rss_before} KiB, "
        f"{fds_before} fds; soaking {args.minutes:g} min "
        f"({'at once' if args.together else 'the model, then the churn'}) "
        f"(model: {not args.no_model}, churn: {not args.no_churn}, {args.clients} clients, "
        f"{args.rate} events/s)",
        flush=True,
    )
    churn = Churn()
    model = Model()
    started = time.monotonic()
    churn_error: list[BaseException] = []

    def churn_thread() -> None:
        try:
            trio.run(run_churn, daemon, churn, args.clients, args.rate, churn_seconds)
        except BaseException as exc:
            churn_error.append(exc)

    thread = threading.Thread(target=churn_thread, name="churn")
    churn_first = not args.no_churn and (args.together or args.no_model)
    if churn_first:
        thread.start()
    if not args.no_model:
        run_model(daemon, model, started + model_seconds, args.steps, args.shrink)
        print(f"model done: {ProtocolModel.stats['examples']} examples", flush=True)
    if not args.no_churn:
        if not churn_first:
            thread.start()
        thread.join()
    elapsed = time.monotonic() - started

    final = daemon.get()
    left = daemon.settle()
    daemon.done.set()
    rss_after, fds_after = final.rss_kib(), final.open_fds()
    fd_kinds = fd_summary(final.pid)
    final.terminate()
    exit_code = final.wait()
    daemon.exits.append(exit_code)
    final.close()

    stats = ProtocolModel.stats
    nonzero = [code for code in daemon.exits if code != 0]
    print()
    print(f"== soak: {elapsed / 60:.1f} min")
    print(
        f"daemon: {len(daemon.exits)} exits {daemon.exits} (the last on SIGTERM), "
        f"{len(nonzero)} non-zero"
    )
    again = f" (of the daemon started {daemon.generation} times over)" if daemon.generation else ""
    print(
        f"daemon RSS: {rss_before} KiB before, {rss_after} KiB after{again}, "
        f"peak {daemon.peak_rss_kib} KiB"
    )
    print(
        f"daemon open fds: {fds_before} before, {fds_after} after ({left} clients left), "
        f"peak {daemon.peak_fds}"
    )
    if fds_after > fds_before:
        print(f"  what the daemon holds open after: {fd_kinds}")
    minute = -60.0
    for seconds, rss, fds in daemon.samples:
        if seconds - minute >= 60:
            minute = seconds
            print(f"  at {seconds / 60:4.1f} min: RSS {rss} KiB, {fds} fds")
    if not args.no_model:
        print(
            f"model: {stats['examples']} examples, {stats['steps']} steps in {model.batches} "
            f"batches, {len(model.failures)} failing batches"
        )
        for key, count in sorted(stats.items()):
            if key.startswith(("violation", "ignored")):
                print(f"  {key}: {count}")
        for kind, messages in sorted(ProtocolModel.ignored_examples.items()):
            distinct = {m[:160]: m for m in messages}  # one of each beginning
            for message in list(distinct.values())[:5]:
                print(f"  e.g. {kind}: {message[:3000]}")
    if not args.no_churn:
        print(
            f"churn: {churn.published} published, {churn.connections} connections "
            f"({sum(churn.connect_failures.values())} failed to connect: "
            f"{dict(churn.connect_failures)}), {churn.received} events received"
        )
        print(f"  leaves: {dict(churn.leaves)}; goodbyes: {dict(churn.goodbyes)}")
        print(
            f"  lost seqs: {churn.lost}, repeated: {churn.repeated}, seq regressions: "
            f"{churn.regressions}, seq reused after restart: {churn.seq_reused}"
        )
        print(
            f"  resumes from goodbye.resume_seq: {churn.resumes}, skipping: "
            f"{churn.resume_skipped}; byes without goodbye: {churn.no_goodbye}; "
            f"stalls: {churn.stalled}"
        )
        if churn.errors:
            print(f"  other: {dict(churn.errors)}")
        for example in churn.examples:
            print(f"  e.g. {example}")
        if churn_error:
            print("  the churn itself failed:")
            print("".join(traceback.format_exception(churn_error[0])))
    for log in daemon.logs:
        print(f"-- log of a daemon that exited --\n{log}")
    bad = (
        nonzero
        or model.failures
        or churn_error
        or churn.lost
        or churn.repeated
        or churn.regressions
        or churn.seq_reused
        or churn.resume_skipped
        or churn.no_goodbye
        or churn.stalled
    )
    print(f"== {'FAILED' if bad else 'OK'} (logs and journal in {directory})")
    return 1 if bad else 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
    os._exit(130)
