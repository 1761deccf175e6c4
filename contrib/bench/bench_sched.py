"""The scheduler's view of a burst: busd and NATS at the steady rate, traced with ``perf``.

    sudo .venv/bin/python contrib/bench/bench_sched.py [--rounds 3] [--seconds 2]

At 5,000 events/s a burst of about five events goes from the publisher to
the server, and from the server to each subscriber: every hop is a process
woken on a socket. When no CPU is idle the kernel places a process woken
by a socket write on the writer's CPU (the wake-up is "synchronous": the
writer is taken to be about to sleep), and the woken process may take that
CPU at once. A fan-out server writes to several sockets in a row, so a
subscriber that preempts it delays the writes after its own. This
measures how often that happens to busd's daemon and to NATS's server.

It runs ``bench_fanout``'s latency test (4 subscribers, window 0 for busd,
the journal on as ``busd serve`` has it) for each system in alternation,
records every CPU's ``sched_switch`` and ``sched_wakeup`` events with
``perf record -a`` for ``--seconds`` in the middle of each run, and prints
per system (then the median of the rounds):

- p50/p99 publish-to-receive and the server's CPU per event, as ``bench_fanout``;
- ``wakes/s``: subscribers woken by a thread of the server;
- ``own CPU``: the share of those wake-ups placed on the waker's CPU;
- ``preempted``: per such wake-up, how often the server then lost that CPU
  to a subscriber while still runnable;
- ``out/s``: how often a server thread left a CPU, and ``while runnable``
  the share of those that were preemptions.

Only events recorded on the server's CPU or by the task switching out are
used: on this 2-core VM the kernel records no switch out of the idle task
on the second CPU. Needs ``perf`` (Debian: ``linux-perf``) and root, or
``kernel.perf_event_paranoid`` at -1. ``docs/performance.md`` uses it.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench_fanout import Processes, Server, measure, start_server

SUBSCRIBERS = 4
RATE = 5_000.0
SETTLE_S = 1.0  # after the publisher starts, before the recording starts
SWITCH = re.compile(
    r"^\s*(?P<tid>\d+)\s+\[(?P<cpu>\d+)\]\s+(?P<ts>[\d.]+):\s+sched:(?P<kind>sched_\w+):\s+(?P<rest>.*)$"
)
FIELD = {
    name: re.compile(rf"(?<![\w]){name}=(\S+)")
    for name in ("prev_pid", "prev_state", "next_pid", "pid", "target_cpu")
}


@dataclass(frozen=True, slots=True)
class SchedEvent:
    """One line of ``perf script -F tid,cpu,time,event,trace``."""

    tid: int  # the task running on ``cpu`` when it happened
    cpu: int
    ts: float  # seconds
    kind: str  # sched_switch or sched_wakeup
    fields: dict[str, str]


def parse(lines: Iterable[str]) -> list[SchedEvent]:
    """The switch and wake-up events of ``perf script`` output; other lines are skipped."""
    events = []
    for line in lines:
        match = SWITCH.match(line)
        if match is None or match["kind"] not in ("sched_switch", "sched_wakeup"):
            continue
        rest = match["rest"]
        fields = {}
        for name, pattern in FIELD.items():
            found = pattern.search(rest)
            if found is not None:
                fields[name] = found[1]
        tid, cpu, ts = int(match["tid"]), int(match["cpu"]), float(match["ts"])
        events.append(SchedEvent(tid, cpu, ts, match["kind"], fields))
    return events


@dataclass(slots=True)
class Preemption:
    """What the trace says about a server's threads and the subscribers they woke."""

    seconds: float = 0.0
    wakes: int = 0
    """Subscriber wake-ups made by a server thread."""
    own_cpu: int = 0
    """Of those, placed on the waker's own CPU."""
    preempted: int = 0
    """Times the server lost a CPU, still runnable, to a subscriber, after waking one there."""
    switched_out: int = 0
    """Times a server thread left a CPU."""
    runnable: int = 0
    """Of those, while still runnable (preempted by anyone)."""

    def rates(self) -> dict[str, float]:
        per_s = 1 / self.seconds if self.seconds else 0.0
        return {
            "wakes/s": self.wakes * per_s,
            "own CPU": self.own_cpu / self.wakes if self.wakes else 0.0,
            "preempted": self.preempted / self.own_cpu if self.own_cpu else 0.0,
            "out/s": self.switched_out * per_s,
            "while runnable": self.runnable / self.switched_out if self.switched_out else 0.0,
        }


def preemption(events: Sequence[SchedEvent], server: set[int], subscribers: set[int]) -> Preemption:
    """Count the server's wake-ups of subscribers, and whether those on its own CPU preempted it.

    The same-CPU wake-ups since a server thread last left a CPU count as
    one preemption if its next switch out of that CPU leaves it runnable
    and hands the CPU to a subscriber.
    """
    result = Preemption()
    if events:
        result.seconds = events[-1].ts - events[0].ts
    woke_here: dict[int, int] = {}  # cpu -> same-CPU wake-ups since the server last left it
    for event in events:
        match event.kind:
            case "sched_wakeup":
                if event.tid not in server or int(event.fields.get("pid", -1)) not in subscribers:
                    continue
                result.wakes += 1
                if int(event.fields.get("target_cpu", -1)) == event.cpu:
                    result.own_cpu += 1
                    woke_here[event.cpu] = woke_here.get(event.cpu, 0) + 1
            case "sched_switch":
                if int(event.fields.get("prev_pid", -1)) not in server:
                    continue
                result.switched_out += 1
                still_runnable = event.fields.get("prev_state", "").startswith("R")
                result.runnable += still_runnable
                if (
                    woke_here.pop(event.cpu, 0)
                    and still_runnable
                    and int(event.fields.get("next_pid", -1)) in subscribers
                ):
                    result.preempted += 1
    return result


def tids(pid: int) -> set[int]:
    """The thread ids of ``pid`` now (none if it is gone)."""
    try:
        return {int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()}
    except FileNotFoundError:
        return set()


def pids_of(pattern: str) -> list[int]:
    found = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout
    return [int(p) for p in found.split()]


@dataclass(slots=True)
class Recording:
    server: set[int] = field(default_factory=set)
    subscribers: set[int] = field(default_factory=set)
    error: str | None = None


def record(system: str, server: Server, data: Path, seconds: float, into: Recording) -> None:
    """Wait for the run's publisher, then ``perf record -a`` the scheduler for ``seconds``."""
    deadline = time.monotonic() + 120
    while not pids_of(f"fanout_peers.py pub {system} "):
        if time.monotonic() > deadline:
            into.error = "the publisher never started"
            return
        time.sleep(0.05)
    time.sleep(SETTLE_S)
    into.server = tids(server.worker.proc.pid)
    into.subscribers = {t for p in pids_of(f"fanout_peers.py sub {system} ") for t in tids(p)}
    argv = ["perf", "record", "-q", "-a", "-o", str(data)]
    argv += ["-e", "sched:sched_switch", "-e", "sched:sched_wakeup", "--", "sleep", str(seconds)]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        into.error = f"perf record failed: {done.stderr.strip()[-200:]}"


def trace_lines(data: Path) -> list[str]:
    argv = ["perf", "script", "-i", str(data), "-F", "tid,cpu,time,event,trace"]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.splitlines()


def check_perf() -> str | None:
    """Why ``perf`` cannot record the scheduler here, or ``None``."""
    if shutil.which("perf") is None:
        return "perf is not installed (Debian: apt install linux-perf)"
    probe = ["perf", "record", "-q", "-a", "-e", "sched:sched_switch", "-o", "/dev/null"]
    done = subprocess.run([*probe, "--", "true"], capture_output=True, text=True)
    if done.returncode != 0:
        why = done.stderr.strip()[-200:]
        return f"perf cannot trace the scheduler (root, or perf_event_paranoid -1): {why}"
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per system")
    parser.add_argument("--seconds", type=float, default=2.0, help="recorded per run")
    parser.add_argument("--systems", default="busd,nats")
    args = parser.parse_args()
    if args.rounds < 1 or args.seconds <= 0:
        parser.error("--rounds must be 1 or more and --seconds above 0")
    if (why := check_perf()) is not None:
        sys.exit(f"bench_sched: {why}")
    systems = args.systems.split(",")
    events = int(RATE * (args.seconds + SETTLE_S + 2.0))
    rows: dict[str, list[dict[str, float]]] = {s: [] for s in systems}
    with tempfile.TemporaryDirectory() as tmp:
        procs = Processes(Path(tmp))
        try:
            servers = {}
            for system in systems:
                servers[system] = start_server(procs, system, Path(tmp), journal=True)
                measure(procs, servers[system], subscribers=1, events=2_000, window_ms=0, rate=RATE)
            for round_ in range(args.rounds):
                for system in systems:
                    data = Path(tmp) / f"{system}-{round_}.data"
                    recording = Recording()
                    recorder = threading.Thread(
                        target=record, args=(system, servers[system], data, args.seconds, recording)
                    )
                    recorder.start()
                    outcome = measure(
                        procs,
                        servers[system],
                        subscribers=SUBSCRIBERS,
                        events=events,
                        window_ms=0,
                        rate=RATE,
                    )
                    recorder.join()
                    if outcome.problem or recording.error:
                        sys.exit(f"bench_sched: {system}: {outcome.problem or recording.error}")
                    found = preemption(
                        parse(trace_lines(data)), recording.server, recording.subscribers
                    )
                    latencies = sorted(outcome.latencies_ns)
                    row = {
                        "p50 ms": latencies[len(latencies) // 2] / 1e6,
                        "p99 ms": latencies[int(len(latencies) * 0.99)] / 1e6,
                        "server µs/event": outcome.cpu_server / events * 1e6,
                        **found.rates(),
                    }
                    rows[system].append(row)
                    print(f"round {round_ + 1} {system}: " + _line(row), flush=True)
        finally:
            procs.stop_all()
    print(f"\nmedian of {args.rounds} rounds, {SUBSCRIBERS} subscribers at {RATE:,.0f} events/s:")
    for system in systems:
        keys = rows[system][0].keys()
        median = {k: statistics.median(r[k] for r in rows[system]) for k in keys}
        print(f"{system:>6}: " + _line(median))


def _line(row: dict[str, float]) -> str:
    parts = []
    for key, value in row.items():
        if key in ("own CPU", "preempted", "while runnable"):
            parts.append(f"{key} {value:.0%}")
        elif key.endswith("/s"):
            parts.append(f"{key} {value:,.0f}")
        else:
            parts.append(f"{key} {value:.2f}")
    return ", ".join(parts)


if __name__ == "__main__":
    main()
