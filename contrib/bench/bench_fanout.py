"""Fanout: busd against Redis pub/sub, NATS and a bare Python forwarder, in one command.

    python contrib/bench/bench_fanout.py [--events 200000] [--subscribers 1 4 16] [--quick]

One publisher process sends ``stream.text.delta`` events (a ``TextDelta``
with a 100-character text, about 150 bytes of msgpack) to 1, 4 and 16
subscriber processes (``--subscribers 1 4 16 64`` adds 64) through each
system, all on this machine. Every server is started here and stopped at the
end, error or Ctrl-C alike:

- busd: ``python -m busd serve`` on a Unix socket, without a journal unless
  ``--journal``; the publisher and the subscribers use ``busd.client``
  (subscribers with ``deltas="raw"``, so every event is delivered, at
  window 16 ms and at window 0);
- Redis pub/sub: ``redis-server`` on a Unix socket, redis-py with hiredis,
  the publisher pipelining 1,000 publishes per round trip;
- NATS: ``nats-server`` on 127.0.0.1, nats-py (its own write buffer, a flush
  at the end);
- NATS with JetStream (``nats-js``; by default only with ``--journal``):
  the same, with JetStream storing every event in a file-backed stream as
  it is published, as busd's journal does; a run counts only if the stream
  holds every event at the end;
- a bare Python forwarder: an asyncio Unix-socket server that copies the
  publisher's length-prefixed frames to every subscriber and does nothing
  else, the ceiling of any broker written in Python;
- a lean busd server (``busd-lean``; only on request, ``--systems``): busd's
  protocol and busd's clients, a Trio server that decodes each ``publish``
  frame, numbers and encodes its events and writes them to every
  subscriber, and does nothing else: the floor of busd's daemon in Python
  and Trio, so what the daemon spends beyond it is what its features cost.

Figures, see ``contrib/bench/README.md``:

- throughput: events/s delivered to the *slowest* subscriber, from the
  publisher's first send to the last receive of the last subscriber (all
  processes read the system-wide ``CLOCK_MONOTONIC``); a run counts only if
  every subscriber got every event in order (busd: ``seq`` order too);
- CPU per event of every process, and the server's alone per subscriber
  count (the daemon's cost against the number of subscribers);
- latency: p50/p99/max publish-to-receive at a steady 5,000 events/s, with
  1, 4 and 16 subscribers, and the server's CPU per event against the
  number of subscribers at that rate (the same input for every count);
- idle frontends: the daemon's RSS growth when 100 clients attach, each
  subscribed to everything.

The report ends with issue 20's targets and a verdict for each.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
from fanout_peers import NO_LOAD, LeanLoad, make_event
from fanout_report import LABELS, Outcome, Variant, best, median_p99, report

HERE = Path(__file__).resolve().parent
PEERS = HERE / "fanout_peers.py"
PYTHON = sys.executable
# Bytes busd queues for one client before dropping it as a slow consumer. The
# default (8 MiB) sheds a subscriber that falls that far behind a publisher
# running flat out, as Redis and NATS would with their defaults; here we
# measure delivery, so every server gets room for the whole run (Redis's
# pub/sub output buffer limit is lifted the same way).
OUTBOUND_CAP = 64 << 20


class BenchError(RuntimeError):
    """A process did not answer, or answered something else."""


# -- processes ---------------------------------------------------------------


@dataclass
class Worker:
    """A started process; for ours, JSON lines on stdout and a line on stdin to go."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path | None = None  # a server's output
    _buffer: bytes = b""

    def log_tail(self) -> str:
        if self.log is None or not self.log.exists():
            return ""
        tail = self.log.read_text(errors="replace")[-800:].strip()
        return f"; its log ends: {tail}" if tail else ""

    def message(self, timeout: float) -> dict[str, Any]:
        """The next JSON line the process prints, within ``timeout`` seconds."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BenchError(f"{self.name}: no answer within {timeout:.0f} s")
            readable, _, _ = select.select([fd], [], [], remaining)
            if readable:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    raise BenchError(f"{self.name} exited with code {self.proc.wait()}")
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        message: dict[str, Any] = json.loads(line)
        return message

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"go\n")
        self.proc.stdin.flush()


class Processes:
    """Everything the benchmark started: each in its own process group, all stopped at the end."""

    def __init__(self, logs: Path, *, cwd: Path | None = None) -> None:
        """``cwd``: where they run (``python -m busd`` imports busd from there first)."""
        self.logs = logs
        self.cwd = cwd
        self.workers: list[Worker] = []

    def start(self, name: str, argv: Sequence[str], *, server: bool = False) -> Worker:
        """Start ``argv``; a server logs to a file, one of ours talks through pipes."""
        log_path = self.logs / f"{name}.log" if server else None
        if log_path is not None:
            with log_path.open("wb") as log:
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    cwd=self.cwd,
                )
        else:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                start_new_session=True,  # Ctrl-C reaches us only; we stop them
                cwd=self.cwd,
            )
        worker = Worker(name, proc, log_path)
        self.workers.append(worker)
        return worker

    def stop(self, worker: Worker, sig: signal.Signals = signal.SIGTERM) -> None:
        """Signal the worker's process group, wait a little, then kill it."""
        if worker in self.workers:
            self.workers.remove(worker)
        proc = worker.proc
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        else:  # the leader is gone; anything it left in its group goes too
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)

    def stop_all(self) -> None:
        for worker in reversed(list(self.workers)):
            self.stop(worker)


def _wait_connectable(family: int, address: str | tuple[str, int], worker: Worker) -> None:
    deadline = time.monotonic() + 15
    while True:
        if worker.proc.poll() is not None:
            raise BenchError(
                f"{worker.name} exited with code {worker.proc.returncode}{worker.log_tail()}"
            )
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(address)
            except OSError:
                pass
            else:
                return
        if time.monotonic() > deadline:
            raise BenchError(
                f"{worker.name} is not listening on {address} after 15 s{worker.log_tail()}"
            )
        time.sleep(0.05)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _which(program: str) -> str | None:
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin", "/usr/local/sbin"])
    return shutil.which(program, path=path)


@dataclass(frozen=True)
class Server:
    system: str
    address: str
    worker: Worker


def start_server(
    procs: Processes,
    system: str,
    tmp: Path,
    *,
    outbound_cap: int | None = None,
    profile: Path | None = None,
    name: str | None = None,
    busd_command: Sequence[str] = (PYTHON, "-m", "busd"),
    journal: bool = False,
    busd_args: Sequence[str] = (),
    lean_load: LeanLoad = NO_LOAD,
) -> Server:
    name = name or system
    if system == "busd":
        path = tmp / f"{name}.sock"
        argv = list(busd_command)
        if profile is not None:
            argv[1:1] = ["-m", "cProfile", "-o", str(profile)]
        argv += ["serve", "--socket", str(path), "--log-level", "warning"]
        # busd serve's default is a journal; --no-journal compares like with like
        argv += ["--journal", str(tmp / f"{name}.sqlite3")] if journal else ["--no-journal"]
        if outbound_cap is not None:
            argv += ["--outbound-cap", str(outbound_cap)]
        argv += busd_args
        worker = procs.start(name, argv, server=True)
        _wait_connectable(socket.AF_UNIX, str(path), worker)
        return Server(system, str(path), worker)
    if system == "redis":
        path = tmp / "redis.sock"
        redis_server = _which("redis-server")
        assert redis_server is not None
        argv = [
            redis_server,
            "--port", "0",
            "--unixsocket", str(path),
            "--unixsocketperm", "700",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(tmp),
            # no disconnecting of subscribers that fall behind: we measure, not shed
            "--client-output-buffer-limit", "pubsub 0 0 0",
        ]  # fmt: skip
        worker = procs.start(name, argv, server=True)
        _wait_connectable(socket.AF_UNIX, str(path), worker)
        return Server(system, str(path), worker)
    if system in ("nats", "nats-js"):
        nats_server = _which("nats-server")
        assert nats_server is not None
        port = _free_port()
        argv = [nats_server, "-a", "127.0.0.1", "-p", str(port)]
        if system == "nats-js":  # JetStream's file store in the temporary directory
            argv += ["-js", "-sd", str(tmp / f"{name}-jetstream")]
        worker = procs.start(name, argv, server=True)
        _wait_connectable(socket.AF_INET, ("127.0.0.1", port), worker)
        return Server(system, f"nats://127.0.0.1:{port}", worker)
    if system == "busd-lean":
        path = tmp / f"{name}.sock"
        load = [
            f"--cpu-before-us={lean_load.before_us}",
            f"--cpu-after-us={lean_load.after_us}",
            f"--cpu-every={lean_load.every}",
        ]
        worker = procs.start(name, [PYTHON, str(PEERS), "lean", str(path), *load])
        worker.message(15)
        return Server(system, str(path), worker)
    path = tmp / "forwarder.sock"
    worker = procs.start(name, [PYTHON, str(PEERS), "forwarder", str(path)])
    worker.message(15)
    return Server(system, str(path), worker)


def missing(system: str) -> str | None:
    """Why ``system`` cannot run here, or ``None``."""
    needs = {
        "redis": ("redis-server", "redis"),
        "nats": ("nats-server", "nats"),
        "nats-js": ("nats-server", "nats"),
    }.get(system)
    if needs is None:
        return None
    program, module = needs
    if _which(program) is None:
        return f"{program} is not installed"
    if importlib.util.find_spec(module) is None:
        return f"the Python package {module!r} is not installed"
    return None


def daemon_status(server: Server) -> dict[str, Any]:
    """``busd status --json`` of a busd ``server``."""
    argv = [PYTHON, "-m", "busd", "status", "--json", "--socket", server.address]
    result = subprocess.run(argv, capture_output=True, check=True, timeout=60)
    answer: dict[str, Any] = json.loads(result.stdout)
    return answer


def cpu_seconds(pid: int) -> tuple[float, float]:
    """User and system CPU time of the process (every thread), from ``/proc/PID/stat``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def rss_bytes(pid: int) -> int:
    """The process's resident set size, from ``/proc/PID/status``."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise BenchError(f"no VmRSS for pid {pid}")


# -- one measurement ---------------------------------------------------------


def measure(
    procs: Processes,
    server: Server,
    *,
    subscribers: int,
    events: int,
    window_ms: int = 16,
    rate: float | None = None,
) -> Outcome:
    """One publisher, ``subscribers`` subscribers, ``events`` events through ``server``."""
    system, address = server.system, server.address
    latency = rate is not None
    # Many subscriber processes share 2 cores: their start-up and their reading take longer.
    crowd = max(1.0, subscribers / 16)
    timeout = 60 + events / (rate if rate is not None else 2_000) * crowd
    sub_argv = [PYTHON, str(PEERS), "sub", system, address, "--events", str(events)]
    sub_argv += ["--window-ms", str(window_ms)] + (["--latency"] if latency else [])
    pub_argv = [PYTHON, str(PEERS), "pub", system, address, "--events", str(events)]
    pub_argv += ["--rate", str(rate)] if rate is not None else []
    started: list[Worker] = []
    outcome = Outcome(events, subscribers)
    try:
        subs = [procs.start(f"{system}-sub-{k}", sub_argv) for k in range(subscribers)]
        started += subs
        publisher = procs.start(f"{system}-pub", pub_argv)
        started.append(publisher)
        for worker in (*subs, publisher):
            worker.message(30 + subscribers)  # ready: connected, and subscribed
        server_cpu = cpu_seconds(server.worker.proc.pid)
        publisher.go()
        sent = publisher.message(timeout)
        results = [sub.message(timeout) for sub in subs]
        user, kernel = cpu_seconds(server.worker.proc.pid)
        outcome.cpu_server_user = user - server_cpu[0]
        outcome.cpu_server_system = kernel - server_cpu[1]
        outcome.cpu_server = outcome.cpu_server_user + outcome.cpu_server_system
    except BenchError as exc:
        outcome.problem = str(exc)
        return outcome
    finally:
        for worker in started:
            procs.stop(worker)
    short = [r["count"] for r in results if r["count"] != events]
    stored = sent.get("stored")
    if short:
        outcome.problem = f"lost events: got {min(short):,} of {events:,}"
    elif stored is not None and stored != events:
        outcome.problem = f"the stream stored {stored:,} of {events:,} events"
    elif not all(r["ordered"] for r in results):
        outcome.problem = "events out of order"
    else:
        elapsed_ns = max(r["last_ns"] for r in results) - sent["start_ns"]
        outcome.rate = events / (elapsed_ns / 1e9)
    for r in results:
        outcome.latencies_ns += r["latencies_ns"] or []
    outcome.cpu_publisher = sent["cpu_s"]
    outcome.cpu_subscribers = [r["cpu_s"] for r in results]
    return outcome


@contextlib.contextmanager
def terminate_on_sigterm() -> Iterator[None]:
    """A SIGTERM unwinds like Ctrl-C, so every ``finally`` stops what it started."""

    def raise_interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=None, help="default 200,000 (quick: 20,000)")
    parser.add_argument(
        "--subscribers", type=int, nargs="+", default=[1, 4, 16], help="subscriber counts"
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: fewer events")
    parser.add_argument(
        "--repeat", type=int, default=1, help="rounds of throughput runs; the best counts"
    )
    parser.add_argument(
        "--warmup", type=int, default=70_000, help="events through busd before measuring"
    )
    parser.add_argument(
        "--systems",
        default=None,
        help="default busd,redis,nats,forwarder (and nats-js with --journal)",
    )
    parser.add_argument("--windows", type=int, nargs="+", default=[16, 0], help="busd windows")
    parser.add_argument("--latency-rate", type=float, default=5_000.0)
    parser.add_argument("--latency-events", type=int, default=None, help="default 2 s worth")
    parser.add_argument(
        "--latency-subscribers",
        type=int,
        nargs="+",
        default=[1, 4, 16],
        help="subscriber counts of the steady-rate runs (the p99 target is judged at 4)",
    )
    parser.add_argument(
        "--latency-rounds",
        type=int,
        default=None,
        help="latency runs per system, interleaved; the median p99 counts (default 3, quick 1)",
    )
    parser.add_argument("--idle-clients", type=int, default=100, help="0 to skip")
    parser.add_argument(
        "--outbound-cap",
        type=int,
        default=OUTBOUND_CAP,
        help="busd serve --outbound-cap for the throughput runs (busd's default: 8 MiB)",
    )
    parser.add_argument(
        "--journal",
        action="store_true",
        help="run busd with a journal, as busd serve does by default (in the temporary directory)",
    )
    parser.add_argument(
        "--profile-daemon", type=Path, default=None, help="run busd under cProfile, to this file"
    )
    parser.add_argument(
        "--lean-cpu",
        metavar="BEFORE,AFTER[,EVERY]",
        default="0,0",
        help="busy CPU the lean server adds, µs before and after its writes, on 1 burst in "
        "EVERY (default 1): where a daemon's own work would land (docs/performance.md)",
    )
    parser.add_argument(
        "--busd-command",
        default=f"{PYTHON} -m busd",
        help="how to start busd (before 'serve ...'), to compare daemon builds",
    )
    args = parser.parse_args()

    events = args.events or (20_000 if args.quick else 200_000)
    latency_events = args.latency_events or int(args.latency_rate * (0.5 if args.quick else 2.0))
    latency_counts = sorted(set(args.latency_subscribers))
    latency_rounds = args.latency_rounds
    if latency_rounds is None:
        latency_rounds = 1 if args.quick else 3
    counts = sorted(set(args.subscribers))
    if min(counts[0], latency_counts[0], events, args.repeat, latency_rounds) < 1:
        parser.error("event, subscriber and round counts must be at least 1")
    if not args.latency_rate > 0:
        parser.error("--latency-rate must be a rate above 0 events/s")
    busd_command = shlex.split(args.busd_command)
    try:
        parts = [int(part) for part in args.lean_cpu.split(",")]
        if len(parts) not in (2, 3):
            raise ValueError(args.lean_cpu)
        lean_load = LeanLoad(*parts)
    except ValueError:
        parser.error(f"--lean-cpu takes BEFORE,AFTER[,EVERY] in µs, not {args.lean_cpu!r}")
    default = "busd,redis,nats,forwarder" + (",nats-js" if args.journal else "")
    systems = [s.strip() for s in (args.systems or default).split(",") if s.strip()]
    for system in systems:
        if system not in LABELS:
            parser.error(f"unknown system {system!r}; choose from {', '.join(LABELS)}")
    skipped = {s: why for s in systems if (why := missing(s)) is not None}
    active = [s for s in systems if s not in skipped]
    for system, why in skipped.items():
        print(f"skipping {LABELS[system]}: {why} (see contrib/bench/README.md)", file=sys.stderr)

    variants = [
        v
        for s in systems
        if s not in skipped
        for v in ([Variant(s, w) for w in args.windows] if s == "busd" else [Variant(s)])
    ]
    latency_variants = [
        Variant(s, w)
        for s in systems
        if s not in skipped
        for w in (sorted(set(args.windows)) if s == "busd" else [16])
    ]
    event_bytes = len(msgspec.msgpack.encode(make_event(0, time.monotonic_ns())))

    throughput: dict[tuple[Variant, int], Outcome] = {}
    latency: dict[tuple[Variant, int], Outcome] = {}
    idle: tuple[int, int] | None = None
    journal_status: dict[str, int] | None = None
    began = time.monotonic()
    load_before = os.getloadavg()[0]
    with (
        terminate_on_sigterm(),
        tempfile.TemporaryDirectory(prefix="busd-fanout-") as tmp_name,
    ):
        tmp = Path(tmp_name)
        procs = Processes(tmp)
        try:
            servers = {
                system: start_server(
                    procs,
                    system,
                    tmp,
                    outbound_cap=args.outbound_cap,
                    profile=args.profile_daemon if system == "busd" else None,
                    busd_command=busd_command,
                    journal=args.journal,
                    lean_load=lean_load,
                )
                for system in active
            }
            if "busd" in servers and args.warmup:
                # A long-running daemon has full replay history and caches: measure that.
                measure(procs, servers["busd"], subscribers=1, events=args.warmup)
            runs: dict[tuple[Variant, int], list[Outcome]] = {}
            for round_number in range(1, args.repeat + 1):  # rounds spread the noise evenly
                for variant in variants:
                    for n in counts:
                        outcome = measure(
                            procs,
                            servers[variant.system],
                            subscribers=n,
                            events=events,
                            window_ms=variant.window_ms,
                        )
                        runs.setdefault((variant, n), []).append(outcome)
                        server_us = outcome.cpu_server / events * 1e6
                        print(
                            f"  round {round_number}: {variant.label}, {n} sub: {outcome.cell()}"
                            f" (server {server_us:.1f} us/event)",
                            file=sys.stderr,
                        )
            throughput = {key: best(outcomes) for key, outcomes in runs.items()}
            latency_runs: dict[tuple[Variant, int], list[Outcome]] = {}
            for _ in range(latency_rounds):  # interleaved: the machine's moods spread evenly
                for n in latency_counts:
                    for variant in latency_variants:
                        outcome = measure(
                            procs,
                            servers[variant.system],
                            subscribers=n,
                            events=latency_events,
                            window_ms=variant.window_ms,
                            rate=args.latency_rate,
                        )
                        latency_runs.setdefault((variant, n), []).append(outcome)
            latency = {key: median_p99(outcomes) for key, outcomes in latency_runs.items()}
            if args.journal and "busd" in servers:
                time.sleep(0.2)  # a few write intervals, for the last batch
                try:
                    status = daemon_status(servers["busd"])
                    journal_status = {**status["journal"], "head_seq": status["head_seq"]}
                except (subprocess.SubprocessError, OSError, ValueError, KeyError) as exc:
                    print(f"cannot read busd's journal status: {exc!r}", file=sys.stderr)
            for system, server in servers.items():
                # SIGINT: busd shuts down cleanly (and cProfile writes its file)
                procs.stop(server.worker, signal.SIGINT if system == "busd" else signal.SIGTERM)
            if args.idle_clients and "busd" in systems:
                daemon = start_server(
                    procs,
                    "busd",
                    tmp,
                    name="busd-idle",
                    busd_command=busd_command,
                    journal=args.journal,
                )
                time.sleep(0.5)
                before = rss_bytes(daemon.worker.proc.pid)
                frontends = procs.start(
                    "idle-frontends",
                    [
                        PYTHON,
                        str(PEERS),
                        "idle",
                        daemon.address,
                        "--clients",
                        str(args.idle_clients),
                    ],
                )
                frontends.message(60)
                time.sleep(0.5)
                idle = (before, rss_bytes(daemon.worker.proc.pid))
                procs.stop(frontends)
                procs.stop(daemon.worker)
        finally:
            procs.stop_all()

    if "busd-lean" in active and lean_load != NO_LOAD:
        print(f"The lean busd server adds busy CPU: {lean_load}.\n")
    report(
        events=events,
        event_bytes=event_bytes,
        counts=counts,
        variants=variants,
        latency_variants=latency_variants,
        throughput=throughput,
        latency=latency,
        latency_events=latency_events,
        latency_rate=args.latency_rate,
        latency_counts=latency_counts,
        idle=idle,
        idle_clients=args.idle_clients,
        outbound_cap=args.outbound_cap,
        journal=args.journal,
        journal_status=journal_status,
        repeat=args.repeat,
        warmup=args.warmup,
        seconds=time.monotonic() - began,
        load=(load_before, os.getloadavg()[0]),
    )


if __name__ == "__main__":
    try:
        main()
    except BenchError as exc:
        sys.exit(f"bench_fanout: {exc}")
    except KeyboardInterrupt:
        sys.exit(130)
