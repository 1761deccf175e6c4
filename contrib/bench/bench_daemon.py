"""The daemon's CPU per event against the number of subscribers, in process: no sockets.

``bench_fanout.py`` measures busd end to end against its peers; on a shared
2-core machine its figures move with the load. This one isolates the part
that busd's own code decides: a ``Daemon`` receives ``publish`` frames
(bytes, decoded as the connection decodes them, 256 events each) and fans
every event out to N subscriptions (window 16 ms, raw deltas) that deliver
as a connection does, minus the socket write: a cohort's shared batch is
packed once (``pack_events``) and each subscription puts its own frame head
(``Encoder.events_head``, a distinct subscription id each) in front of it;
a subscription that is behind encodes its own ``events`` frame.

It runs twice per subscriber count: without a journal, and with one as
``busd serve`` runs by default (SQLite in a temporary directory, the
default retention). The journal's writer thread counts: the figure is the
CPU time of the whole process (``time.process_time``) from the first
frame until every subscription has delivered and, with the journal, every
event is in the file.

The floor is the least any broker with this wire format does: decode the
frame, encode each envelope once, pack the array once, and one frame head
per subscriber. Rounds interleave the runs (every count, both modes, the
floor); the best round counts.

    .venv/bin/python contrib/bench/bench_daemon.py          # 1 4 16 64, journal off and on
    .venv/bin/python contrib/bench/bench_daemon.py --subscribers 4 --no-journal
    .venv/bin/python contrib/bench/bench_daemon.py --plot docs/performance-fanout.svg --json x.json
    .venv/bin/python contrib/bench/bench_daemon.py --profile out.prof
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
from svgplot import Series, line_chart

from busd.core.catalog import Catalog
from busd.core.cohorts import SharedBatch
from busd.core.events import Envelope, Event, TextDelta
from busd.daemon.authority import forbidden
from busd.daemon.batching import BatchDispatcher
from busd.daemon.fanout import shared_parts
from busd.daemon.hub import Daemon, DaemonConfig, Subscription
from busd.daemon.outbox import Out
from busd.plugins.manager import PluginManager
from busd.wire import (
    ClientFrame,
    Encoder,
    Events,
    FrameDecoder,
    Outgoing,
    Publish,
    client_frame_decoder,
    encode_envelope,
    pack_events,
)

TEXT_LENGTH = 100
PER_FRAME = 256
YIELD_EVERY = 256  # events a connection publishes between two checkpoints (connection.py)
DEFAULT_SUBSCRIBERS = (1, 4, 16, 64)
MODES = {"off": "journal off", "on": "journal on"}
SPREAD = 1.3  # rounds further apart than this are pointed out
_FILLER = "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor " * 2


def make_frames(events: int, per_frame: int) -> list[bytes]:
    """``publish`` frames as the client library writes them (length prefix included)."""
    encoder = Encoder()
    frames = []
    for start in range(0, events, per_frame):
        batch = []
        for index in range(start, min(events, start + per_frame)):
            head = f"{index:09d} {time.monotonic_ns():019d} "
            text = head + _FILLER[: TEXT_LENGTH - len(head)]
            batch.append(Outgoing(event=TextDelta(message_id="m1", text=text), session_id="s1"))
        frames.append(encoder.encode(Publish(events=batch)))
    return frames


def publishes(frames: list[bytes], decoder: FrameDecoder[ClientFrame]) -> Iterator[Publish[Any]]:
    """Each frame's bytes through the decoder, as a connection reads them."""
    for data in frames:
        decoder.feed(data)
        frame = decoder.next_frame()
        assert isinstance(frame, Publish)
        yield frame


@dataclass
class Run:
    """One busd run: its CPU seconds and how the events went out."""

    cpu: float = 0.0
    delivered: int = 0
    shared: int = 0
    """Frames sent as a cohort's shared array behind the subscription's head."""
    own: int = 0
    """Frames a subscription that was behind encoded itself."""
    batches: int = 0
    """Shared batches the cohorts took (one per window with events)."""


async def busd_run(
    frames: list[bytes], subscribers: int, window: float, journal_path: Path | None
) -> Run:
    """Seconds of process CPU for the daemon's share, and how the events were delivered."""
    config = DaemonConfig(journal=None if journal_path is None else str(journal_path))
    daemon = Daemon(config, plugins=PluginManager(environ={}))
    decoder = client_frame_decoder(daemon.catalog)
    encoder = Encoder(max_frame=config.max_frame)
    run = Run()
    rights = config.grants["agent"]
    frame_cap = config.max_frame - 64  # an events frame's bytes besides its envelopes
    queued: list[Out] = []  # what the outboxes would write: dropped after each frame

    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.run)
        subs = []
        for sub_id in range(1, subscribers + 1):

            async def send(batch: list[Envelope[Event]], sub_id: int = sub_id) -> None:
                # A subscription that is behind: its own frames, as the connection's send
                # (split under the frame cap).
                raws, start, size = daemon.raws(batch), 0, 0
                for end, raw in enumerate(raws):
                    if size + len(raw) > frame_cap and end > start:
                        encoder.encode(Events(sub=sub_id, events=raws[start:end]))
                        run.own += 1
                        start, size = end, 0
                    size += len(raw)
                encoder.encode(Events(sub=sub_id, events=raws[start:]))
                run.delivered += len(batch)
                run.own += 1
                await trio.lowlevel.checkpoint()

            def send_shared(batch: SharedBatch, sub_id: int = sub_id) -> bool:
                # As Connection._send_shared: the arrays packed once (several frames over
                # the frame cap), a head per subscription id.
                parts = shared_parts(batch, frame_cap)
                assert parts is not None  # no envelope here is anywhere near the cap
                for part in parts:
                    head = part.heads.get(sub_id)
                    if head is None:
                        head = part.heads[sub_id] = encoder.events_head(sub_id, part.body)
                    queued.append(Out(head, part.since, tail=part.body))
                run.delivered += len(batch)
                run.shared += len(parts)
                return True

            dispatcher = BatchDispatcher(
                send,
                window=window,
                merge_deltas=False,
                max_merged_chars=config.max_frame // 8,
                keyer=daemon.keyer,
                max_events=config.subscription_buffer,
                send_shared=send_shared,
            )
            sub = Subscription(
                sub_id,  # one connection each, as separate frontends
                sub_id,
                ["stream.text.delta"],
                sessions=None,
                owned_only=False,
                dispatcher=dispatcher,
            )
            daemon.add_subscription(sub)
            await nursery.start(dispatcher.run)
            subs.append(sub)
        if daemon.journal is not None:
            await trio.sleep(0.2)  # its start-up (retention in a worker thread) is not ours
        journal = daemon.journal
        unyielded = 0
        started = time.process_time()
        for frame in publishes(frames, decoder):
            # As Connection: the frame checked (the role's rights and the daemon's hold
            # on its runs, then the event types), then published in chunks (deltas as
            # runs), the reader yielding every YIELD_EVERY events.
            assert forbidden(frame, role="agent", rights=rights, runs=daemon.runs) is None
            events = frame.events
            assert daemon.frame_refusal(events) is None
            start = 0
            while start < len(events):
                chunk = events[start : start + YIELD_EVERY - unyielded]
                daemon.publish_frame(chunk, source="bench")
                unyielded += len(chunk)
                start += len(chunk)
                if unyielded >= YIELD_EVERY:
                    unyielded = 0
                    if journal is not None and journal.congested:
                        await journal.room()  # a publisher's backpressure
                    await trio.lowlevel.checkpoint()
            daemon.settle()  # as a connection does before it reads on
            queued.clear()
            await trio.lowlevel.checkpoint()  # its next read: the other tasks run
        for sub in subs:
            await daemon.fanout.flush(sub)
        if journal is not None:
            await journal.journaled(daemon.bus.head_seq)
        run.cpu = time.process_time() - started
        run.batches = daemon.fanout.statistics().batches
        nursery.cancel_scope.cancel()
    return run


def floor_run(frames: list[bytes], subscribers: int) -> float:
    """The least any broker with this wire format does: decode, encode once, pack once, N heads."""
    decoder = client_frame_decoder(Catalog())
    encoder = Encoder()
    started = time.process_time()
    seq = 0
    for frame in publishes(frames, decoder):
        raws = []
        for outgoing in frame.events:
            seq += 1
            envelope = Envelope(
                seq=seq, ts=time.time(), session_id=outgoing.session_id, event=outgoing.event
            )
            raws.append(encode_envelope(envelope))
        body = pack_events(raws)
        for sub_id in range(1, subscribers + 1):
            encoder.events_head(sub_id, body)
    return time.process_time() - started


def run_busd(frames: list[bytes], subscribers: int, window: float, mode: str, events: int) -> Run:
    """One busd run in ``mode`` (checks that every event was delivered to every subscriber)."""
    with tempfile.TemporaryDirectory(prefix="busd-bench-daemon-") as tmp:
        journal = Path(tmp) / "journal.sqlite3" if mode == "on" else None
        run = trio.run(busd_run, frames, subscribers, window, journal)
    if run.delivered != events * subscribers:
        raise SystemExit(
            f"bench_daemon: {run.delivered:,} deliveries, expected {events * subscribers:,}"
        )
    return run


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| --- |" + " ---: |" * (len(header) - 1)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _stub_estimator() -> None:
    import busd.core.context
    import busd.core.stats

    for module in (busd.core.stats, busd.core.context):
        module.estimate_tokens = lambda text: len(text) // 4  # type: ignore[attr-defined]


def _stub_accounting() -> None:
    from busd.daemon.accounting import AccountingService

    AccountingService._on_event = lambda self, envelope: None  # type: ignore[method-assign]
    AccountingService._on_events = lambda self, envelopes: None  # type: ignore[method-assign]


def _stub_ids() -> None:
    from busd.core.ids import EventIds

    EventIds.__call__ = lambda self: "-"  # type: ignore[method-assign]
    EventIds.many = lambda self, n: ["-"] * n  # type: ignore[method-assign]


STUBS = {"estimator": _stub_estimator, "accounting": _stub_accounting, "ids": _stub_ids}
"""What ``--stub`` can take away: the difference it makes is what that part costs."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument(
        "--subscribers", type=int, nargs="+", default=list(DEFAULT_SUBSCRIBERS), metavar="N"
    )
    parser.add_argument("--window-ms", type=float, default=16)
    parser.add_argument(
        "--per-frame",
        type=int,
        default=PER_FRAME,
        help="events per publish frame (1 to 5 with --window-ms 0: the steady-rate case)",
    )
    parser.add_argument("--repeat", type=int, default=3, help="interleaved rounds; the best counts")
    journal = parser.add_mutually_exclusive_group()
    journal.add_argument(
        "--journal", dest="modes", action="store_const", const=["on"], help="journal on only"
    )
    journal.add_argument(
        "--no-journal", dest="modes", action="store_const", const=["off"], help="journal off only"
    )
    parser.add_argument("--plot", type=Path, help="write an SVG line chart of the figures here")
    parser.add_argument("--json", type=Path, help="write the raw figures here")
    parser.add_argument("--profile", help="cProfile the busd runs to this file")
    parser.add_argument(
        "--stub",
        nargs="+",
        choices=sorted(STUBS),
        default=[],
        help="replace a part of the daemon's per-event work with nothing, to see what it costs",
    )
    args = parser.parse_args()
    for name in args.stub:
        STUBS[name]()
    modes: list[str] = args.modes or list(MODES)
    counts = sorted(set(args.subscribers))
    if args.events < 1 or args.repeat < 1 or counts[0] < 1 or args.per_frame < 1:
        parser.error("--events, --repeat, --per-frame and --subscribers counts must be at least 1")
    began = time.monotonic()
    load_before = os.getloadavg()[0]
    figures = measure(args, modes, counts)
    figures.seconds = time.monotonic() - began
    figures.load = (load_before, os.getloadavg()[0])
    print(report(args, figures))
    if args.json is not None:
        args.json.write_text(json.dumps(figures.raw(args), indent=2) + "\n")
    if args.plot is not None:
        args.plot.write_text(plot(args, figures))


@dataclass
class Figures:
    """Every round's figures, in µs of CPU per event, and the best busd run's delivery counts."""

    modes: list[str]
    counts: list[int]
    rounds: dict[str, dict[int, list[float]]] = field(default_factory=dict)
    floor: dict[int, list[float]] = field(default_factory=dict)
    runs: dict[str, dict[int, Run]] = field(default_factory=dict)
    seconds: float = 0.0
    load: tuple[float, float] = (0.0, 0.0)

    def best(self, mode: str, n: int) -> float:
        return min(self.rounds[mode][n])

    def best_floor(self, n: int) -> float:
        return min(self.floor[n])

    def raw(self, args: argparse.Namespace) -> dict[str, Any]:
        """What ``--json`` writes."""
        counts = self.counts
        return {
            "events": args.events,
            "per_frame": args.per_frame,
            "window_ms": args.window_ms,
            "repeat": args.repeat,
            "python": platform.python_version(),
            "cores": os.cpu_count(),
            "load": list(self.load),
            "unit": "CPU microseconds per event (process_time; best: the least of the rounds)",
            "subscribers": counts,
            "best": {MODES[m]: {str(n): self.best(m, n) for n in counts} for m in self.modes},
            "rounds": {MODES[m]: {str(n): self.rounds[m][n] for n in counts} for m in self.modes},
            "floor": {str(n): self.best_floor(n) for n in counts},
            "floor_rounds": {str(n): self.floor[n] for n in counts},
            "delivery": {
                MODES[m]: {
                    str(n): {
                        "shared_frames": r.shared,
                        "own_frames": r.own,
                        "cohort_batches": r.batches,
                    }
                    for n, r in self.runs[m].items()
                }
                for m in self.modes
            },
        }


def measure(args: argparse.Namespace, modes: list[str], counts: list[int]) -> Figures:
    """Interleaved rounds: each count, each mode, then the floor, ``--repeat`` times."""
    frames = make_frames(args.events, args.per_frame)
    window = args.window_ms / 1000
    figures = Figures(modes, counts)
    figures.rounds = {m: {n: [] for n in counts} for m in modes}
    figures.floor = {n: [] for n in counts}
    figures.runs = {m: {} for m in modes}
    warm = min(args.events, 20_000)  # imports, caches, the allocator: not measured
    run_busd(make_frames(warm, args.per_frame), counts[0], window, "off", warm)
    profiler = cProfile.Profile() if args.profile else None
    for round_number in range(1, args.repeat + 1):
        for n in counts:
            for mode in modes:
                if profiler is not None:
                    profiler.enable()
                run = run_busd(frames, n, window, mode, args.events)
                if profiler is not None:
                    profiler.disable()
                per_event = run.cpu / args.events * 1e6
                if per_event <= min(figures.rounds[mode][n], default=per_event):
                    figures.runs[mode][n] = run
                figures.rounds[mode][n].append(per_event)
            figures.floor[n].append(floor_run(frames, n) / args.events * 1e6)
            done = ", ".join(f"{MODES[m]} {figures.rounds[m][n][-1]:.2f}" for m in modes)
            print(
                f"  round {round_number}, {n} subscribers: {done}, "
                f"floor {figures.floor[n][-1]:.2f} us/event",
                file=sys.stderr,
            )
    if profiler is not None:
        profiler.dump_stats(args.profile)
    return figures


def report(args: argparse.Namespace, figures: Figures) -> str:
    """The Markdown table, the ratio the issue sets a target for, and how events went out."""
    modes, counts = figures.modes, figures.counts
    base = counts[0]
    lines = [
        f"\n{args.events:,} stream.text.delta events in publish frames of {args.per_frame}, "
        f"window {args.window_ms:g} ms, raw deltas; best of {args.repeat} interleaved "
        f"round{'s' if args.repeat != 1 else ''}; Python {platform.python_version()}, "
        f"{os.cpu_count()} cores; {figures.seconds:.0f} s in all; load average "
        f"{figures.load[0]:.2f} before, {figures.load[1]:.2f} after\n"
    ]
    header = ["subscribers"]
    for mode in modes:
        header += [f"daemon us/event, {MODES[mode]}", f"ratio to {base}"]
    header += ["floor us/event", f"{MODES[modes[0]]} / floor"]
    rows = []
    for n in counts:
        row = [str(n)]
        for mode in modes:
            mine = figures.best(mode, n)
            row += [f"{mine:.2f}", f"{mine / figures.best(mode, base):.2f}x"]
        floor = figures.best_floor(n)
        row += [f"{floor:.2f}", f"{figures.best(modes[0], n) / floor:.1f}x"]
        rows.append(row)
    lines.append(table(header, rows))
    if base == 1 and 16 in counts:
        ratios = ", ".join(
            f"{MODES[m]} {figures.best(m, 16) / figures.best(m, 1):.2f}x" for m in modes
        )
        lines.append(f"\n16 subscribers / 1: {ratios} (issue 20's target: at most 1.3x)")
    spread = [
        f"{MODES[m]}, {n}: {min(figures.rounds[m][n]):.2f} to {max(figures.rounds[m][n]):.2f}"
        for m in modes
        for n in counts
        if max(figures.rounds[m][n]) > SPREAD * min(figures.rounds[m][n])
    ]
    if spread:
        lines.append(
            f"\nRounds more than {SPREAD - 1:.0%} apart (the machine's load, or a run that "
            f"went another way: see the frames encoded alone): {'; '.join(spread)}"
        )
    lines.append("\nHow the events went out (the best run of each):\n")
    rows = []
    for mode in modes:
        for n in counts:
            run = figures.runs[mode][n]
            rows.append(
                [f"{MODES[mode]}, {n}", f"{run.batches:,}", f"{run.shared:,}", f"{run.own:,}"]
            )
    header = ["run", "cohort batches", "frames from a shared array", "frames encoded alone"]
    lines.append(table(header, rows))
    return "\n".join(lines)


def plot(args: argparse.Namespace, figures: Figures) -> str:
    """The SVG line chart: one line per journal mode, and the floor dashed."""
    counts = figures.counts
    series = [Series(MODES[m], [(n, figures.best(m, n)) for n in counts]) for m in figures.modes]
    series.append(Series("floor", [(n, figures.best_floor(n)) for n in counts], dashed=True))
    return line_chart(
        series,
        title="busd daemon: CPU per event against subscribers",
        subtitle=f"{args.events:,} text deltas, window {args.window_ms:g} ms, "
        f"best of {args.repeat}, in process (contrib/bench/bench_daemon.py)",
        x_label="subscribers (log scale)",
        y_label="daemon CPU, µs per event",
    )


if __name__ == "__main__":
    main()
