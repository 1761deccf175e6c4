"""Micro-benchmarks of the sans-I/O core, with peers measured in the same run.

    python contrib/bench/bench_core.py [--events 300000] [--repeat 5]

Figures are events per second on one core (best of ``--repeat``), and each is
also given as a ratio to a peer run in the same command, because these
machines are shared and absolute numbers drift:

- dispatch: ``Bus.publish`` with 1 typed + 1 pattern + 1 catch-all handler,
  against the same three handlers called directly (the floor: no bus at all)
  and against a naive bus that re-matches every pattern with ``fnmatch`` on
  every event (the usual in-process design).
- batching: ``Accumulator.add`` + ``drain`` every 64 events (a 16 ms window at
  ~4k events/s), merged and raw, against appending to a plain list.
"""

from __future__ import annotations

import argparse
import fnmatch
import time
from collections.abc import Callable

from busd.core.bus import Bus
from busd.core.coalesce import Accumulator
from busd.core.events import Envelope, Event, TextDelta, TokenUsage, Usage


def best_rate(fn: Callable[[int], None], n: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn(n)
        best = min(best, time.perf_counter() - start)
    return n / best


def bench_dispatch(n: int, repeat: int) -> dict[str, float]:
    delivered = [0]

    def handler(envelope: Envelope[Event]) -> None:
        delivered[0] += 1

    event = TextDelta(message_id="msg_01", text="hello, world " * 8)

    bus = Bus()
    bus.on("stream.text.delta", handler)
    bus.on("stream.*.delta", handler)
    bus.on_all(handler)

    def run_bus(count: int) -> None:
        publish = bus.publish
        for _ in range(count):
            publish(event, session_id="s1", source="bench")

    def run_direct(count: int) -> None:
        for seq in range(1, count + 1):
            envelope: Envelope[Event] = Envelope(
                seq, time.time(), event, "s1", None, None, "bench", False
            )
            handler(envelope)
            handler(envelope)
            handler(envelope)

    naive: list[tuple[str, Callable[[Envelope[Event]], None]]] = [
        ("stream.text.delta", handler),
        ("stream.*.delta", handler),
        ("*", handler),
    ]

    def run_naive(count: int) -> None:
        for seq in range(1, count + 1):
            envelope: Envelope[Event] = Envelope(
                seq, time.time(), event, "s1", None, None, "bench", False
            )
            name = envelope.event.__struct_config__.tag
            assert isinstance(name, str)
            for pattern, fn in naive:
                if fnmatch.fnmatchcase(name, pattern):
                    fn(envelope)

    return {
        "bus": best_rate(run_bus, n, repeat),
        "direct": best_rate(run_direct, n, repeat),
        "naive": best_rate(run_naive, n, repeat),
    }


def bench_batching(n: int, repeat: int) -> dict[str, float]:
    envelopes: list[Envelope[Event]] = []
    for seq in range(1, n + 1):
        event: Event
        if seq % 10 == 0:
            event = Usage(tokens=TokenUsage(output_tokens=seq))
        else:
            event = TextDelta(message_id=f"m{seq // 1000}", text="tok ")
        envelopes.append(Envelope(seq, float(seq), event, "s1"))

    def run(merge: bool) -> Callable[[int], None]:
        def go(count: int) -> None:
            acc = Accumulator(merge_deltas=merge)
            add, drain = acc.add, acc.drain
            for i, envelope in enumerate(envelopes[:count]):
                add(envelope)
                if i % 64 == 63:
                    drain()
            drain()

        return go

    def run_list(count: int) -> None:
        buffer: list[Envelope[Event]] = []
        for i, envelope in enumerate(envelopes[:count]):
            buffer.append(envelope)
            if i % 64 == 63:
                buffer = []

    return {
        "merged": best_rate(run(True), n, repeat),
        "raw": best_rate(run(False), n, repeat),
        "list": best_rate(run_list, n, repeat),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    d = bench_dispatch(args.events, args.repeat)
    b = bench_batching(args.events, args.repeat)
    rows = [
        ("dispatch: busd Bus (typed+pattern+catch-all)", d["bus"], "direct calls", d["direct"]),
        ("dispatch: busd Bus", d["bus"], "naive fnmatch bus", d["naive"]),
        ("batching: Accumulator merged deltas", b["merged"], "list.append", b["list"]),
        ("batching: Accumulator raw deltas", b["raw"], "list.append", b["list"]),
    ]
    print(f"{args.events:,} events, best of {args.repeat}")
    print(f"{'workload':48} {'events/s':>12}  {'peer':18} {'peer ev/s':>12} {'ratio':>7}")
    for name, rate, peer, peer_rate in rows:
        print(f"{name:48} {rate:12,.0f}  {peer:18} {peer_rate:12,.0f} {rate / peer_rate:7.2f}")


if __name__ == "__main__":
    main()
