"""The journal's cost: events/s through the daemon with the journal on and off, in one command.

    python contrib/bench/bench_journal.py [--events 200000] [--subscribers 1] [--repeat 3]

Two ``busd serve`` processes, one with ``--journal`` (a fresh file in a
temporary directory) and one with ``--no-journal``, each measured the way
``bench_fanout.py`` measures busd: one publisher process, N subscriber
processes, the rate to the slowest subscriber, every event delivered in
order. Rounds alternate between the two daemons, so the machine's noise
falls on both; the best round of each counts. Then the latency at a steady
rate (``--latency-rate``, default 5,000 events/s), publish to receive, p50
and p99, in alternating rounds (``--latency-rounds``, default 3; the round
with the median p99 counts), and the daemon's CPU per event at that rate.
``--window-ms 0`` shows what the journal's writes do to the tail; at the
default 16 ms the window hides it. ``--no-staging-too`` adds a third
daemon, journaling with ``--no-journal-staging`` (each write inserts its
whole batch), to the same rounds. After the runs, the journaled daemon's
``status`` must show every event journaled (nothing lost to a slow disk)
and the file's size is reported.
"""

from __future__ import annotations

import argparse
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_fanout import (
    OUTBOUND_CAP,
    PYTHON,
    Processes,
    Server,
    _wait_connectable,
    daemon_status,
    measure,
    terminate_on_sigterm,
)
from fanout_report import Outcome, best, median_p99, percentile, table


def start_busd(
    procs: Processes, tmp: Path, name: str, journal: Path | None, *, staging: bool = True
) -> Server:
    path = tmp / f"{name}.sock"
    argv = [PYTHON, "-m", "busd", "serve", "--socket", str(path), "--log-level", "warning"]
    argv += ["--outbound-cap", str(OUTBOUND_CAP)]
    argv += ["--journal", str(journal)] if journal is not None else ["--no-journal"]
    argv += [] if staging else ["--no-journal-staging"]
    worker = procs.start(name, argv, server=True)
    _wait_connectable(socket.AF_UNIX, str(path), worker)
    return Server("busd", str(path), worker)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--subscribers", type=int, default=1)
    parser.add_argument("--window-ms", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3, help="alternating rounds; the best counts")
    parser.add_argument("--warmup", type=int, default=20_000)
    parser.add_argument("--latency-rate", type=float, default=5_000.0)
    parser.add_argument("--latency-events", type=int, default=10_000)
    parser.add_argument(
        "--latency-rounds",
        type=int,
        default=3,
        help="alternating latency runs of each daemon; the one with the median p99 counts",
    )
    parser.add_argument(
        "--no-staging-too",
        action="store_true",
        help="a third daemon: the journal with --no-journal-staging (docs/journal.md)",
    )
    args = parser.parse_args()
    if args.latency_rounds < 1:
        parser.error("--latency-rounds must be at least 1")

    with terminate_on_sigterm(), tempfile.TemporaryDirectory(prefix="busd-journal-") as name:
        tmp = Path(name)
        journal = tmp / "state" / "journal.sqlite3"
        procs = Processes(tmp)
        try:
            servers = {"journal on": start_busd(procs, tmp, "on", journal)}
            if args.no_staging_too:
                unstaged = tmp / "state" / "unstaged.sqlite3"
                servers["journal on, no staging"] = start_busd(
                    procs, tmp, "unstaged", unstaged, staging=False
                )
            servers["journal off"] = start_busd(procs, tmp, "off", None)
            for server in servers.values():
                measure(procs, server, subscribers=1, events=args.warmup)

            def alternating(rounds: int, **how: Any) -> dict[str, list[Outcome]]:
                """``rounds`` runs of each daemon, taking turns: the noise falls on both."""
                outcomes: dict[str, list[Outcome]] = {label: [] for label in servers}
                for _ in range(rounds):
                    for label, server in servers.items():
                        outcomes[label].append(
                            measure(procs, server, subscribers=args.subscribers, **how)
                        )
                return outcomes

            window = args.window_ms
            runs = alternating(args.repeat, events=args.events, window_ms=window)
            latency_runs = alternating(
                args.latency_rounds,
                events=args.latency_events,
                window_ms=window,
                rate=args.latency_rate,
            )
            latency = {label: median_p99(outcomes) for label, outcomes in latency_runs.items()}
            time.sleep(0.2)  # a few write intervals, for the last batch
            on = daemon_status(servers["journal on"])
        finally:
            procs.stop_all()
        size = journal.stat().st_size if journal.exists() else 0

    outcomes = {label: best(outcomes) for label, outcomes in runs.items()}
    rows = []
    for label, outcome in outcomes.items():
        cpu = outcome.cpu_server / outcome.events * 1e6 if outcome.events else 0.0
        late = sorted(latency[label].latencies_ns)
        p50, p99 = (
            (f"{percentile(late, 0.5) / 1e6:.2f}", f"{percentile(late, 0.99) / 1e6:.2f}")
            if late
            else (f"FAILED: {latency[label].problem}", "")
        )
        rounds = " ".join(f"{p / 1e6:.2f}" for p in latency[label].round_p99s_ns)
        steady = latency[label]
        steady_cpu = steady.cpu_server / steady.events * 1e6 if steady.events else 0.0
        rows.append(
            [label, outcome.cell(), f"{cpu:.1f}", p50, p99, rounds or "-", f"{steady_cpu:.1f}"]
        )
    print(
        f"{args.events:,} events, {args.subscribers} subscriber(s), window {args.window_ms} ms, "
        f"best of {args.repeat}; latency at {args.latency_rate:,.0f} events/s, "
        f"the round with the median p99 of {args.latency_rounds}"
    )
    header = ["daemon", "events/s", "daemon CPU µs/event", "p50 ms", "p99 ms"]
    at_rate = "daemon CPU µs/event at the rate"
    print(table([*header, "p99 of each round", at_rate], rows))
    rate_on = outcomes["journal on"].rate
    rate_off = outcomes["journal off"].rate
    if rate_on and rate_off:
        print(f"\nratio on/off: {rate_on / rate_off:.2f}")
    journal_status = on["journal"]
    assert isinstance(journal_status, dict)
    print(
        f"journal: {journal_status['events']:,} events, {size / 1e6:.1f} MB, "
        f"journaled_seq {journal_status['journaled_seq']:,} of head {on['head_seq']:,}, "
        f"lost {journal_status['lost']}"
    )
    if journal_status["lost"]:
        sys.exit("the journal fell behind: events were not journaled")


if __name__ == "__main__":
    main()
