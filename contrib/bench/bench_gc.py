"""``busd serve``'s garbage collections with its startup heap frozen or not, one command.

    .venv/bin/python contrib/bench/bench_gc.py [--rounds 4] [--events 20000] [--churn 50]

Each round starts ``busd serve --no-journal`` twice, once as it runs by
default (the startup heap frozen before it serves) and once with
``--no-gc-freeze``, alternating which goes first. Each runs
``bench_fanout.py``'s latency test (window 0, a steady 5,000 events/s, 4
subscribers) while frontends come and go as they do in a daemon left
running all day: ``--churn`` of them attach (each subscribed to another
session's events), stay a second and leave, over and over. What a
connection leaves behind is freed by the collector, which now and then
walks the whole heap. Then the daemon's ``status`` says how many
collections of each generation ran, their longest pause, and how many
objects are frozen. A collection stops the whole daemon: its pause is
every subscriber's latency for the events behind it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import trio
from bench_fanout import (
    PYTHON,
    Processes,
    daemon_status,
    measure,
    start_server,
    terminate_on_sigterm,
)
from fanout_report import percentile, table

HERE = Path(__file__).resolve()

# Each variant's label, and what it adds to `busd serve`'s arguments.
VARIANTS = {"frozen (default)": [], "--no-gc-freeze": ["--no-gc-freeze"]}


async def churn(address: str, clients: int, hold: float) -> None:
    """``clients`` frontends of another session: attach, stay ``hold`` seconds, leave; again."""
    from busd.client import connect

    async def frontend(k: int) -> None:
        while True:
            async with (
                connect(address, client=f"churn-{k}", role="frontend") as client,
                client.subscribe(sessions=["elsewhere"]),
            ):
                await trio.sleep(hold * (0.5 + (k % 10) / 10))  # not all at once

    async with trio.open_nursery() as nursery:
        for k in range(clients):
            nursery.start_soon(frontend, k)


def one(
    procs: Processes, tmp: Path, name: str, args: list[str], clients: int, **run: Any
) -> dict[str, Any]:
    server = start_server(procs, "busd", tmp, name=name, busd_args=args)
    churning = None
    try:
        if clients:
            argv = [PYTHON, str(HERE), "churn", server.address, str(clients)]
            churning = procs.start(f"{name}-churn", argv)
        outcome = measure(procs, server, window_ms=0, rate=5_000.0, **run)
        gc = daemon_status(server)["gc"]
    finally:
        if churning is not None:
            procs.stop(churning)
        procs.stop(server.worker)
    if outcome.problem:
        raise SystemExit(f"{name}: {outcome.problem}")
    latencies = sorted(outcome.latencies_ns)
    return {
        "p50": percentile(latencies, 0.50) / 1e6,
        "p99": percentile(latencies, 0.99) / 1e6,
        "p999": percentile(latencies, 0.999) / 1e6,
        "max": latencies[-1] / 1e6,
        "full": gc["collections"][2],
        "full_ms": gc["pause_ms_longest"][2],
        "young_ms": max(gc["pause_ms_longest"][:2]),
        "frozen": gc["frozen"],
    }


def main() -> None:
    if sys.argv[1:2] == ["churn"]:
        trio.run(churn, sys.argv[2], int(sys.argv[3]), 1.0)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--events", type=int, default=20_000, help="4 s at 5,000 events/s")
    parser.add_argument("--subscribers", type=int, default=4)
    parser.add_argument("--churn", type=int, default=50, help="frontends coming and going")
    args = parser.parse_args()
    if min(args.rounds, args.events, args.subscribers) < 1 or args.churn < 0:
        parser.error(
            "--rounds, --events and --subscribers must be at least 1, and --churn at least 0"
        )
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in VARIANTS}
    names = list(VARIANTS)
    with tempfile.TemporaryDirectory(prefix="busd-bench-gc-") as tmp, terminate_on_sigterm():
        procs = Processes(Path(tmp))
        try:
            for k in range(args.rounds):
                for name in names if k % 2 == 0 else names[::-1]:
                    row = one(
                        procs,
                        Path(tmp),
                        f"busd-{k}-{names.index(name)}",
                        VARIANTS[name],
                        args.churn,
                        subscribers=args.subscribers,
                        events=args.events,
                    )
                    rows[name].append(row)
                    print(f"round {k + 1}, {name}: {row}", file=sys.stderr)
        finally:
            procs.stop_all()
    header = ["busd serve", "p50 ms", "p99 ms", "p99.9 ms", "max ms"]
    header += ["full collections", "longest full ms"]
    header += ["longest other ms", "frozen objects"]
    lines = []
    for name, runs in rows.items():
        for row in runs:
            lines.append(
                [
                    name,
                    f"{row['p50']:.2f}",
                    f"{row['p99']:.2f}",
                    f"{row['p999']:.2f}",
                    f"{row['max']:.1f}",
                    str(row["full"]),
                    f"{row['full_ms']:.1f}",
                    f"{row['young_ms']:.2f}",
                    f"{row['frozen']:,}",
                ]
            )
    print(
        f"Latency over {args.events / 5_000:.0f} s (5,000 events/s, window 0, {args.subscribers} "
        f"subscribers, {args.churn} frontends coming and going), and the daemon's collections:\n"
    )
    print(table(header, lines))
    for key, label in (("p99", "p99"), ("p999", "p99.9"), ("max", "max")):
        median = {n: statistics.median(r[key] for r in runs) for n, runs in rows.items()}
        frozen, unfrozen = median.values()
        print(
            f"median {label}: frozen {frozen:.2f} ms, not frozen {unfrozen:.2f} ms "
            f"({unfrozen / frozen:.2f}x)"
        )


if __name__ == "__main__":
    main()
