"""The accountant's cost per delta, as the daemon feeds it, in one process.

    .venv/bin/python contrib/bench/bench_accountant.py [--deltas 102400] [--repeat 5]

The daemon hands the accountant each publish frame's deltas as one run
(``Accountant.observe_run``) and settles it once a stretch of them waits
(``settle(stretch=SETTLE_STRETCH)``, at each burst's end). Here the same
calls are made for ``stream.text.delta`` events of 100 characters (the
fan-out benchmark's), in frames of 256 (a publisher flat out) and of 5 (the
steady 5,000 events/s), and each figure is the best of ``--repeat`` rounds,
in microseconds a delta:

- the accountant as it is (also fed one delta at a time, as an adapter
  in the daemon publishes them);
- the same with the token estimator replaced by ``len(text) // 4``: what
  the accounting costs besides the estimate (a peer in the same run);
- the estimator alone over the same text, in 4 KiB chunks (the chunks the
  trackers estimate);
- a settle of one stretch with the caches as a burst meets them: 16 MiB
  swept between stretches (the median of 2,000 stretches, in µs a
  stretch; the daemon's lump after a burst's writes, docs/performance.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

import busd.core.estimate as estimate
from busd.core.accounting import SETTLE_STRETCH, Accountant
from busd.core.events import Envelope, Event, TextDelta

TEXT_LENGTH = 100
_FILLER = "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor " * 2


def make_envelopes(count: int) -> list[Envelope[Event]]:
    """Deltas of one message, as the fan-out benchmark's publisher sends them."""
    out: list[Envelope[Event]] = []
    for index in range(count):
        head = f"{index:09d} {123_456_789 + index:019d} "
        text = head + _FILLER[: TEXT_LENGTH - len(head)]
        delta = TextDelta(message_id="m1", text=text)
        out.append(Envelope(index + 1, 0.0, delta, "s1", None, "r1", "bench"))
    return out


def feed(envelopes: list[Envelope[Event]], per_frame: int) -> Accountant:
    """Every delta through a new accountant, a frame at a time, settled as the daemon does;
    ``per_frame`` 0: one at a time, as an adapter in the daemon publishes them (settled
    when the accountant holds 1,024, or is read)."""
    accountant = Accountant()
    if not per_frame:
        for envelope in envelopes:
            accountant.observe(envelope, 1.0)
        accountant.settle()
        return accountant
    for start in range(0, len(envelopes), per_frame):
        accountant.observe_run(envelopes[start : start + per_frame], 1.0)
        accountant.settle(stretch=SETTLE_STRETCH)
    accountant.settle()
    return accountant


def chars_over_4(text: str) -> int:
    """The estimator's stand-in: what the accounting costs without the estimate."""
    return len(text) // 4


def timed(fn: Callable[..., object], *args: object) -> float:
    """Seconds ``fn(*args)`` took."""
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def cold_stretch_us(envelopes: list[Envelope[Event]], rounds: int) -> float:
    """The median settle of a stretch of frames of 5, with 16 MiB swept before each."""
    junk = bytearray(16 << 20)
    zeros = bytes(len(junk[::64]))
    accountant = Accountant()
    times = []
    for start in range(0, rounds * SETTLE_STRETCH, SETTLE_STRETCH):
        stretch = envelopes[start : start + SETTLE_STRETCH]
        for at in range(0, len(stretch), 5):
            accountant.observe_run(stretch[at : at + 5], 1.0)
        junk[::64] = zeros  # a line of every 64 bytes: the caches as other processes left them
        begin = time.perf_counter_ns()
        accountant.settle(stretch=SETTLE_STRETCH)
        times.append(time.perf_counter_ns() - begin)
    return statistics.median(times[rounds // 10 :]) / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deltas", type=int, default=102_400)
    parser.add_argument("--repeat", type=int, default=5, help="rounds per figure (best kept)")
    args = parser.parse_args()
    if args.deltas < 1_024 or args.repeat < 1:
        sys.exit("bench_accountant: --deltas must be at least 1024 and --repeat at least 1")
    envelopes = make_envelopes(args.deltas)
    text = "".join(e.event.text for e in envelopes if isinstance(e.event, TextDelta))
    chunks = [text[at : at + 4096] for at in range(0, len(text), 4096)]
    fast = estimate._fast_estimate

    print(
        f"{args.deltas:,} deltas of {TEXT_LENGTH} characters, best of {args.repeat}; "
        f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs\n"
    )
    print("| µs a delta | frames of 256 | frames of 5 | one at a time |")
    print("| --- | ---: | ---: | ---: |")
    rows: dict[str, list[float]] = {
        "the accountant": [],
        "its estimator left out": [],
        "the estimator alone, 4 KiB chunks": [],
    }
    for per_frame in (256, 5, 0):
        best = dict.fromkeys(rows, float("inf"))
        for _ in range(args.repeat):  # interleaved: the machine's moods fall on each alike
            best["the accountant"] = min(best["the accountant"], timed(feed, envelopes, per_frame))
            estimate._fast_estimate = chars_over_4
            try:
                took = timed(feed, envelopes, per_frame)
            finally:
                estimate._fast_estimate = fast
            best["its estimator left out"] = min(best["its estimator left out"], took)
            took = timed(lambda: [fast(chunk) for chunk in chunks])
            best["the estimator alone, 4 KiB chunks"] = min(
                best["the estimator alone, 4 KiB chunks"], took
            )
        for name, seconds in best.items():
            rows[name].append(seconds / args.deltas * 1e6)
    for name, figures in rows.items():
        print(f"| {name} | " + " | ".join(f"{us:.2f}" for us in figures) + " |")
    rounds = min(2_000, args.deltas // SETTLE_STRETCH)
    print(
        f"\nA stretch of {SETTLE_STRETCH} deltas settled with cold caches (16 MiB swept "
        f"before each, median of {rounds:,}): {cold_stretch_us(envelopes, rounds):.0f} µs"
    )


if __name__ == "__main__":
    main()
