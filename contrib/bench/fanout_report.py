"""The fanout benchmark's report: its tables and issue 20's targets, from the measured runs.

``bench_fanout.py`` measures; this module only formats what it measured
(Markdown tables on stdout) and judges each target of issue 20 against
it, saying when a target was not measured and which option measures it.
"""

from __future__ import annotations

import math
import os
import platform
from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import mean
from typing import Any

LABELS = {
    "busd": "busd",
    "redis": "Redis pub/sub",
    "nats": "NATS",
    "nats-js": "NATS with JetStream",
    "forwarder": "bare Python forwarder",
    "busd-lean": "lean busd server",
}


@dataclass
class Outcome:
    """One run: the rate to the slowest subscriber, or why it does not count."""

    events: int
    subscribers: int
    rate: float | None = None
    problem: str = ""
    latencies_ns: list[int] = field(default_factory=list)
    cpu_server: float = 0.0  # CPU seconds during the run
    cpu_server_user: float = 0.0  # of which in its own code
    cpu_server_system: float = 0.0  # of which in the kernel (for a broker: mostly copies)
    cpu_publisher: float = 0.0
    cpu_subscribers: list[float] = field(default_factory=list)
    round_p99s_ns: list[float] = field(default_factory=list)  # latency: every round's p99
    round_rates: list[float | None] = field(default_factory=list)  # throughput: every round's

    def cell(self) -> str:
        return f"{self.rate:,.0f}" if self.rate is not None else f"FAILED: {self.problem}"


def rounds_lower(mine: Outcome, theirs: Outcome) -> str:
    """``"; busd's lower in 2 of 3 rounds"``: the interleaved rounds compared pairwise.

    Round k of each system ran back to back, so a pair shares the machine's
    mood; a verdict on two medians that differ by microseconds says little
    without it.
    """
    pairs = list(zip(mine.round_p99s_ns, theirs.round_p99s_ns, strict=False))
    if len(pairs) < 2:
        return ""
    lower = sum(1 for a, b in pairs if a < b)
    return f"; busd's lower in {lower} of {len(pairs)} rounds"


def rounds_at_least(mine: Outcome, theirs: Outcome, factor: float | None = None) -> str:
    """``"; per round 1.51x 1.12x, at least 1.5x in 1 of 2"``: the rounds' ratios, pairwise.

    The verdict takes each system's best round, and the best of a noisy
    machine flatters whichever system had the quiet moment; round k of each
    ran back to back, so their ratio is the fairer figure to count.
    """
    pairs = [(a, b) for a, b in zip(mine.round_rates, theirs.round_rates, strict=False) if a and b]
    if len(pairs) < 2:
        return ""
    ratios = [a / b for a, b in pairs]
    out = "; per round " + " ".join(f"{r:.2f}x" for r in ratios)
    if factor is not None:
        out += f", at least {factor:g}x in {sum(r >= factor for r in ratios)} of {len(ratios)}"
    return out


def percentile(values: Sequence[int], q: float) -> float:
    """Nearest-rank percentile of sorted ``values``."""
    return float(values[max(0, math.ceil(q * len(values)) - 1)])


@dataclass(frozen=True)
class Variant:
    """A row: a system, and for busd its subscription window."""

    system: str
    window_ms: int = 16

    @property
    def label(self) -> str:
        if self.system == "busd":
            return f"busd (window {self.window_ms} ms)"
        return LABELS[self.system]


def journal_line(status: dict[str, Any]) -> str:
    """busd's journal after the runs: what it holds, its watermark, what it lost.

    A long run outgrows the default retention (1 GiB): the oldest events
    go, which is retention at work, not loss, and the line says so.
    """
    oldest = status.get("oldest_seq")
    held = f"{status['events']:,} events"
    if oldest is not None and oldest > 1:
        held += f" from seq {oldest:,} (the older ones removed by retention: --journal-max-size)"
    return (
        f"busd's journal at the end: {held}, journaled_seq {status['journaled_seq']:,} of head "
        f"{status['head_seq']:,}, lost {status['lost']:,}"
        + ("" if not status["lost"] else " (it fell behind: not every event kept)")
        + (
            f"; publishers waited for it {status['held']:,} times, {status['held_s']:.1f} s in all"
            if status.get("held")
            else ""
        )
    )


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "| " + " | ".join(c.ljust(w) for c, w in zip(header, widths, strict=True)) + " |",
        "| " + " | ".join("-" * (w - 1) + (":" if i else "-") for i, w in enumerate(widths)) + " |",
    ]
    for row in rows:
        cells = [
            c.rjust(w) if i else c.ljust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def best(outcomes: list[Outcome]) -> Outcome:
    """The fastest complete run of a repeated measurement (else the last failure).

    It carries every round's rate (``round_rates``), for the pairwise ratios.
    """
    done = [o for o in outcomes if o.rate is not None]
    chosen = max(done, key=lambda o: o.rate or 0.0) if done else outcomes[-1]
    chosen.round_rates = [o.rate for o in outcomes]
    return chosen


def median_p99(outcomes: list[Outcome]) -> Outcome:
    """The latency round whose p99 is the median (the lower one of an even count).

    A single p99 on a shared machine flips with its load; the median of
    interleaved rounds does less. A round that failed makes the whole fail.
    """
    failed = [o for o in outcomes if o.problem or not o.latencies_ns]
    if failed:
        return failed[0]
    p99s = [percentile(sorted(o.latencies_ns), 0.99) for o in outcomes]
    median = sorted(range(len(outcomes)), key=p99s.__getitem__)[(len(outcomes) - 1) // 2]
    chosen = outcomes[median]
    chosen.round_p99s_ns = p99s
    return chosen


def report(
    *,
    events: int,
    event_bytes: int,
    counts: list[int],
    variants: list[Variant],
    latency_variants: list[Variant],
    throughput: dict[tuple[Variant, int], Outcome],
    latency: dict[tuple[Variant, int], Outcome],
    latency_events: int,
    latency_rate: float,
    latency_counts: list[int],
    idle: tuple[int, int] | None,
    idle_clients: int,
    outbound_cap: int,
    journal: bool,
    journal_status: dict[str, int] | None = None,
    repeat: int,
    warmup: int,
    seconds: float,
    load: tuple[float, float],
) -> None:
    def subs(n: int) -> str:
        return f"{n} subscriber" + ("s" if n != 1 else "")

    print(
        f"\nfanout: {events:,} stream.text.delta events ({event_bytes} bytes of msgpack each), "
        f"1 publisher; {os.cpu_count()} cores, Python {platform.python_version()}; "
        f"busd serve --outbound-cap {outbound_cap} {'with' if journal else 'without'} a journal, "
        f"warmed up with {warmup:,} events; "
        f"best of {repeat} round{'s' if repeat != 1 else ''}; {seconds:.0f} s in all; "
        f"load average {load[0]:.2f} before, {load[1]:.2f} after (other work on the machine "
        "skews every figure)\n"
    )
    print("Throughput: events/s delivered to the slowest subscriber\n")
    rows = [[v.label, *(throughput[v, n].cell() for n in counts)] for v in variants]
    print(table(["system", *(subs(n) for n in counts)], rows))

    print(
        "\nCPU time per event, in microseconds (the server, the publisher, one subscriber "
        "on average, and all processes together; 2 cores give 2e6 us per second)\n"
    )
    cpu_rows = []
    for v in variants:
        for n in counts:
            o = throughput[v, n]
            per = 1e6 / o.events
            sub = sum(o.cpu_subscribers) / len(o.cpu_subscribers) if o.cpu_subscribers else 0.0
            total = o.cpu_server + o.cpu_publisher + sum(o.cpu_subscribers)
            cpu_rows.append(
                [
                    f"{v.label}, {subs(n)}",
                    f"{o.cpu_server * per:.1f}",
                    f"{o.cpu_publisher * per:.1f}",
                    f"{sub * per:.1f}",
                    f"{total * per:.1f}",
                ]
            )
    print(table(["run", "server", "publisher", "subscriber", "all"], cpu_rows))

    print(
        "\nServer CPU per event, in microseconds, against the number of subscribers "
        "(the server column above)\n"
    )
    print(table(*server_cpu_table(variants, counts, throughput)))
    print(
        "\nThe same, split: the server's own code (user) and the kernel's work for it "
        "(system: copying each batch into each subscriber's socket, waking readers)\n"
    )
    print(table(*server_split_table(variants, counts, throughput)))

    busd_rows = [v for v in variants if v.system == "busd"]
    peers = [v for v in variants if v.system != "busd"]
    ratio_rows = []
    for b in busd_rows:
        for p in peers:
            cells = []
            for n in counts:
                mine, theirs = throughput[b, n].rate, throughput[p, n].rate
                cells.append(f"{mine / theirs:.2f}x" if mine and theirs else "-")
            ratio_rows.append([f"{b.label} / {p.label}", *cells])
    if ratio_rows:
        print("\nRatios (busd's events/s over the peer's, same command)\n")
        print(table(["ratio", *(subs(n) for n in counts)], ratio_rows))

    if latency:
        print(
            f"\nLatency, publish to receive: {latency_events:,} events at a steady "
            f"{latency_rate:,.0f} events/s (all subscribers' events; of the interleaved rounds, "
            "the one with the median p99)\n"
        )
        print(table(*latency_table(latency_variants, latency_counts, latency)))
        print(
            f"\nServer CPU per event at the steady {latency_rate:,.0f} events/s, in microseconds, "
            "against the number of subscribers (the same input for every count: each "
            "server wakes for the same bursts)\n"
        )
        print(table(*server_cpu_table(latency_variants, latency_counts, latency)))
        print("\nThe same, split into user and system time\n")
        print(table(*server_split_table(latency_variants, latency_counts, latency)))

    if journal_status is not None:
        print(f"\n{journal_line(journal_status)}")

    if idle is not None:
        before, after = idle
        print(f"\nIdle frontends: {idle_clients} clients attached, each subscribed to '>'\n")
        print(
            table(
                ["daemon RSS before", "after", "growth", "per client"],
                [
                    [
                        f"{before / 2**20:.1f} MiB",
                        f"{after / 2**20:.1f} MiB",
                        f"{(after - before) / 2**20:.1f} MiB",
                        f"{(after - before) / idle_clients / 1024:.0f} KiB",
                    ]
                ],
            )
        )

    print("\nTargets (issue 20)\n")
    lines = targets(
        variants, throughput, latency, latency_counts, idle, idle_clients, journal=journal
    )
    for line in lines:
        print(f"- {line}")


def latency_table(
    variants: list[Variant], counts: list[int], latency: dict[tuple[Variant, int], Outcome]
) -> tuple[list[str], list[list[str]]]:
    """One row per subscriber count and system: p50/p99/max and every process's CPU per event."""
    rows = []
    for n in counts:
        for v in variants:
            outcome = latency.get((v, n))
            label = f"{v.label}, {n} sub"
            values = sorted(outcome.latencies_ns) if outcome is not None else []
            if outcome is None or outcome.problem or not values:
                why = outcome.problem if outcome is not None else ""
                rows.append([label, *"-------", why or "no data", "-"])
                continue
            p50, p99 = percentile(values, 0.50), percentile(values, 0.99)
            per = 1e6 / outcome.events
            # What the processes share the cores with: at a steady rate, the latency's queue.
            everyone = outcome.cpu_server + outcome.cpu_publisher + sum(outcome.cpu_subscribers)
            rows.append(
                [
                    label,
                    f"{p50 / 1e6:.2f}",
                    f"{p99 / 1e6:.2f}",
                    f"{values[-1] / 1e6:.2f}",
                    f"{outcome.cpu_server * per:.1f}"
                    f" ({outcome.cpu_server_user * per:.0f}"
                    f" + {outcome.cpu_server_system * per:.0f})",
                    f"{outcome.cpu_publisher * per:.1f}",
                    f"{mean(outcome.cpu_subscribers) * per:.1f}",
                    f"{everyone * per:.1f}",
                    "ok",
                    " ".join(f"{p / 1e6:.2f}" for p in outcome.round_p99s_ns),
                ]
            )
    header = ["run", "p50 ms", "p99 ms", "max ms", "CPU us/event: server (user + system)"]
    header += ["publisher", "one subscriber", "all", "delivery", "p99 of each round"]
    return header, rows


def server_cpu(outcome: Outcome | None, part: str = "cpu_server") -> float | None:
    """The server's CPU µs per event in a complete run, else ``None``.

    ``part``: the :class:`Outcome` field, all of it or its user or system time.
    """
    if outcome is None or outcome.rate is None:
        return None
    seconds: float = getattr(outcome, part)
    return seconds / outcome.events * 1e6


def _against_counts(cpu: dict[int, float | None], counts: list[int]) -> list[str]:
    """The figure at each count, then each count's ratio to its figure at 1 (if 1 was run)."""
    cells = [f"{cpu[n]:.1f}" if cpu[n] is not None else "-" for n in counts]
    for n in counts if 1 in counts else []:
        if n != 1:
            mine, one = cpu[n], cpu[1]
            cells.append(f"{mine / one:.2f}x" if mine is not None and one else "-")
    return cells


def _count_header(counts: list[int]) -> list[str]:
    ratios = [f"{n} / 1" for n in counts if n != 1] if 1 in counts else []
    return [*(f"{n} sub" for n in counts), *ratios]


def server_cpu_table(
    variants: list[Variant], counts: list[int], throughput: dict[tuple[Variant, int], Outcome]
) -> tuple[list[str], list[list[str]]]:
    """Per system, the server's CPU per event at each count, and each count's ratio to 1."""
    rows = [
        [v.label, *_against_counts({n: server_cpu(throughput.get((v, n))) for n in counts}, counts)]
        for v in variants
    ]
    return ["system", *_count_header(counts)], rows


def server_split_table(
    variants: list[Variant], counts: list[int], throughput: dict[tuple[Variant, int], Outcome]
) -> tuple[list[str], list[list[str]]]:
    """:func:`server_cpu_table` in two rows per system: user time, then system time."""
    rows = [
        [
            v.label,
            part,
            *_against_counts(
                {n: server_cpu(throughput.get((v, n)), f"cpu_server_{part}") for n in counts},
                counts,
            ),
        ]
        for v in variants
        for part in ("user", "system")
    ]
    return ["system", "part", *_count_header(counts)], rows


CPU_GROWTH = 1.3  # the daemon's CPU per event at 16 subscribers, at most this times that at 1
P99_SUBSCRIBERS = 4  # the p99 target's subscriber count (the measurement)
IDLE_LIMIT = 20e6  # bytes of RSS growth for 100 idle frontends


def _persisting(
    busd: list[Variant],
    throughput: dict[tuple[Variant, int], Outcome],
    latency: dict[tuple[Variant, int], Outcome],
    at: int,
    *,
    journal: bool,
) -> list[str]:
    """busd against NATS with JetStream, both storing every event: a comparison, no target."""
    peer = Variant("nats-js")
    how = (
        "like for like (both store every event)"
        if journal
        else "busd without its journal (--journal compares like for like)"
    )
    lines = []
    for n in (4, 16):
        theirs = throughput.get((peer, n))
        done = [(v, o) for v in busd if (o := throughput.get((v, n))) and o.rate]
        if theirs is None or not theirs.rate or not done:
            continue
        fastest, mine = max(done, key=lambda pair: pair[1].rate or 0.0)
        lines.append(
            f"{how}, {n} subscribers, busd / {LABELS['nats-js']}: "
            f"{(mine.rate or 0.0) / theirs.rate:.2f}x with {fastest.label}"
            f"{rounds_at_least(mine, theirs)} (no target)"
        )
    mine_p, theirs_p = latency.get((Variant("busd", 0), at)), latency.get((peer, at))
    if mine_p and theirs_p and mine_p.latencies_ns and theirs_p.latencies_ns:
        lines.append(
            f"{how}, p99 at the steady rate, {at} subscribers, busd window 0 vs "
            f"{LABELS['nats-js']}: {percentile(sorted(mine_p.latencies_ns), 0.99) / 1e6:.3f} vs "
            f"{percentile(sorted(theirs_p.latencies_ns), 0.99) / 1e6:.3f} ms"
            f"{rounds_lower(mine_p, theirs_p)} (no target)"
        )
    return lines


def targets(
    variants: list[Variant],
    throughput: dict[tuple[Variant, int], Outcome],
    latency: dict[tuple[Variant, int], Outcome],
    latency_counts: list[int],
    idle: tuple[int, int] | None,
    idle_clients: int,
    *,
    journal: bool = False,
) -> list[str]:
    """Issue 20's targets, each with its measured figure and verdict (or why it was not run)."""
    lines = []

    def verdict(ok: bool) -> str:
        return "met" if ok else "MISSED"

    def rate(v: Variant, n: int) -> float | None:
        outcome = throughput.get((v, n))
        return outcome.rate if outcome is not None else None

    busd = [v for v in variants if v.system == "busd"]
    for n, peer, factor in ((4, "redis", 2.0), (4, "nats", 1.5), (16, "nats", 2.0)):
        goal = f"{n} subscribers, busd >= {factor:g}x {LABELS[peer]}"
        done = [v for v in busd if rate(v, n)]
        theirs = rate(Variant(peer), n)
        if not done or not theirs:
            lines.append(f"{goal}: not measured (needs --subscribers {n}, busd and {peer})")
            continue
        fastest = max(done, key=lambda v: rate(v, n) or 0.0)
        ratio = (rate(fastest, n) or 0.0) / theirs
        rounds = rounds_at_least(throughput[fastest, n], throughput[Variant(peer), n], factor)
        lines.append(
            f"{goal}: {ratio:.2f}x with {fastest.label}{rounds}: {verdict(ratio >= factor)}"
        )

    p99 = {}
    at = P99_SUBSCRIBERS if P99_SUBSCRIBERS in latency_counts else latency_counts[-1]
    for key in (Variant("busd", 0), Variant("nats")):
        outcome = latency.get((key, at))
        if outcome is not None and outcome.latencies_ns and not outcome.problem:
            p99[key.system] = percentile(sorted(outcome.latencies_ns), 0.99)
    goal = "p99 publish-to-frontend at the steady rate, busd window 0 <= NATS"
    if len(p99) == 2:
        note = "" if at == P99_SUBSCRIBERS else " (the target is with 4: --latency-subscribers 4)"
        pairs = rounds_lower(latency[Variant("busd", 0), at], latency[Variant("nats"), at])
        lines.append(
            # to the microsecond: the verdict compares them unrounded, and they are often close
            f"{goal}, {at} subscribers{note}: {p99['busd'] / 1e6:.3f} ms vs "
            f"{p99['nats'] / 1e6:.3f} ms{pairs}: {verdict(p99['busd'] <= p99['nats'])}"
        )
    else:
        lines.append(f"{goal}: not measured (needs --windows 0 and nats, or a run failed)")

    lines += _persisting(busd, throughput, latency, at, journal=journal)

    if idle is not None:
        growth = idle[1] - idle[0]
        goal = f"{idle_clients} idle frontends < 20 MB: {growth / 1e6:.1f} MB"
        if idle_clients == 100:
            lines.append(f"{goal}: {verdict(growth < IDLE_LIMIT)}")
        else:
            scaled = growth / idle_clients * 100
            lines.append(
                f"{goal}, {scaled / 1e6:.1f} MB scaled to 100 (the target is measured with "
                "--idle-clients 100)"
            )
    else:
        lines.append("100 idle frontends < 20 MB: not measured (--idle-clients 0, or no busd)")

    runs = (
        ("flat out", throughput, "--subscribers 1 16"),
        ("at the steady rate", latency, "--latency-subscribers 1 16"),
    )
    for v in busd:
        for how, outcomes, option in runs:
            goal = (
                f"daemon CPU per event at 16 subscribers <= {CPU_GROWTH:g}x at 1, {v.label}, {how}"
            )
            one, sixteen = server_cpu(outcomes.get((v, 1))), server_cpu(outcomes.get((v, 16)))
            if one is None or sixteen is None:
                lines.append(f"{goal}: not measured (needs {option})")
                continue
            ratio = sixteen / one
            lines.append(
                f"{goal}: {sixteen:.1f} vs {one:.1f} us/event, {ratio:.2f}x: "
                f"{verdict(ratio <= CPU_GROWTH)}"
            )
    return lines
