"""Whether a daemon's cost per event grows as it runs: one daemon, round after round.

    python contrib/bench/bench_aging.py [--rounds 6] [--events 200000] [--journal]
        [--replay N] [--malloc] [--subscribers 4] [--serve-arg=--journal-max-size=150MiB ...]

One ``busd serve`` (bench_fanout's ``start_server``) and, each round,
bench_fanout's publisher and ``--subscribers`` subscriber processes at
window 16 ms, flat out. After each round: the rate, the daemon's CPU per
event, its main thread's and its other threads' CPU ticks (user and
system, from ``/proc/PID/task``), its RSS and the journal's size. A daemon
whose main thread needs more ticks each round for the same events ages:
the replay ring of Python objects did (docs/performance.md, "The replay
ring as bytes"). ``--replay`` sets the ring's size; ``--malloc`` runs the
daemon with ``PYTHONMALLOC=malloc`` (glibc's allocator for every object,
which shows an allocation pattern's cost several times larger);
``--serve-arg`` passes more options to ``busd serve`` (a capped journal
prunes every round).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from bench_fanout import (
    PYTHON,
    Processes,
    daemon_status,
    measure,
    rss_bytes,
    start_server,
)


def thread_ticks(pid: int) -> dict[str, tuple[int, int]]:
    """User and system ticks of each of the process's threads, by thread id."""
    ticks = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        ticks[task.name] = (int(fields[11]), int(fields[12]))
    return ticks


def _minus(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    return a[0] - b[0], a[1] - b[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--events", type=int, default=200_000, help="events a round")
    parser.add_argument("--subscribers", type=int, default=4)
    parser.add_argument("--journal", action="store_true", help="as busd serve runs by default")
    parser.add_argument("--replay", type=int, help="the replay ring's size (busd's default)")
    parser.add_argument("--malloc", action="store_true", help="the daemon with PYTHONMALLOC=malloc")
    parser.add_argument(
        "--serve-arg",
        action="append",
        default=[],
        help="one more busd serve argument (repeat it): --serve-arg=--journal-max-size=150MiB",
    )
    args = parser.parse_args()
    command: tuple[str, ...] = (PYTHON, "-m", "busd")
    if args.malloc:
        command = ("env", "PYTHONMALLOC=malloc", *command)
    extra = (["--replay", str(args.replay)] if args.replay else []) + args.serve_arg
    with tempfile.TemporaryDirectory(prefix="busd-aging-") as tmp:
        procs = Processes(Path(tmp))
        try:
            server = start_server(
                procs,
                "busd",
                Path(tmp),
                journal=args.journal,
                outbound_cap=64 << 20,
                busd_command=command,
                busd_args=extra,
            )
            pid = server.worker.proc.pid
            main_id = str(pid)
            measure(procs, server, subscribers=1, events=20_000)  # warm up
            print(
                "round  events/s  µs/event  main user+sys  other threads  RSS MiB  journal MiB",
                flush=True,
            )
            for round_ in range(args.rounds):
                before = thread_ticks(pid)
                outcome = measure(
                    procs, server, subscribers=args.subscribers, events=args.events, window_ms=16
                )
                after = thread_ticks(pid)
                spent = {t: _minus(after[t], before.get(t, (0, 0))) for t in after}
                main_ticks = spent.pop(main_id)
                other = tuple(sum(s[i] for s in spent.values()) for i in range(2))
                journal = Path(tmp) / "busd.sqlite3"
                size = journal.stat().st_size >> 20 if journal.exists() else 0
                daemon_status(server)  # it still answers
                per_event = outcome.cpu_server / args.events * 1e6
                print(
                    f"{round_:>5}  {outcome.rate:>8,.0f}  {per_event:>8.2f}"
                    f"  {main_ticks[0]:>6}+{main_ticks[1]:<6}  {other[0]:>6}+{other[1]:<6}"
                    f"  {rss_bytes(pid) >> 20:>7}  {size:>11}",
                    flush=True,
                )
        finally:
            procs.stop_all()


if __name__ == "__main__":
    main()
