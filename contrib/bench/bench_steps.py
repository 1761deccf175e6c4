"""Where a burst's CPU goes, step by step: busd's daemon against the lean server, steady rate.

    .venv/bin/python contrib/bench/bench_steps.py [--events 30000] [--spread] [--lines]

Copies ``busd`` and ``fanout_peers.py`` into a temporary directory and puts a
mark (the thread's CPU clock, ``time.thread_time_ns()``) at each step of a
burst on the publisher's connection: the read, the frame decoded, the
rights checked, the call into the hub, the events numbered, encoded, the
first write to a subscriber, the last, the replay ring, the journal, the
rest of the publish, and the end before the next read. The lean server
(``fanout_peers.py lean``, the floor) gets the marks it has steps for.
Each server first takes 120,000 events flat out (a long-running daemon's
replay ring is full; while it fills, the daemon's growth faults pages in
one burst in five), then the marks record ``bench_fanout``'s latency test
(4 subscribers, 5,000 events/s, window 0, busd with its journal); it prints, per step, the
median and mean CPU of a burst's main thread in µs (``--spread``: and the
75th, 90th and 99th percentiles, where a step's occasional lumps show). A
mark costs about a microsecond; the tree in the repository is not changed.
``--lines`` also traces one recorded burst in 20 (``sys.settrace``, left
out of the timings) and prints the Python lines a burst runs, by function:
with caches gone cold between bursts, a burst's CPU follows how much code
it runs more than how many events it carries.

The marks go in by anchors: lines of the code they follow or precede. If
the code moved on and an anchor no longer matches, the run stops and names
it; update the anchor with the code. ``docs/performance.md`` ("The floor in
Python") uses it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bench_fanout
from bench_fanout import Processes, measure, start_server

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
SUBSCRIBERS = 4
RATE = 5_000.0
SKIP, KEEP = 500, 3_000  # bursts: the first ones warm up, then these are kept
WARMUP = 120_000  # events flat out first: more than the replay ring holds (100,000)
TRACE_EVERY = 20  # --lines: one recorded burst in this many is traced (and not timed)

STEPS_MODULE = f'''"""Marks at the steps of a burst (bench_steps.py writes this into a copy)."""
import json, os, sys, time

_OUT = os.environ.get("BUSD_STEPS_OUT")
_LINES = bool(os.environ.get("BUSD_STEPS_LINES"))  # --lines: trace 1 burst in {TRACE_EVERY}


class Lines:
    """The Python lines the main thread runs in traced bursts (``sys.settrace``), by function."""

    def __init__(self):
        self.counts, self.distinct, self.bursts = {{}}, set(), 0

    def trace(self, frame, event, arg):
        if event == "line":
            code = frame.f_code
            name = os.path.basename(code.co_filename)
            if name != "_steps.py":  # not the marks'
                key = name + ":" + code.co_name
                self.counts[key] = self.counts.get(key, 0) + 1
                self.distinct.add((code.co_filename, frame.f_lineno))
        return self.trace

    def summary(self):
        return {{"bursts": self.bursts, "distinct": len(self.distinct), "counts": self.counts}}


class Steps:
    on = _OUT is not None

    def __init__(self):
        self.rows, self.current = [], {{}}
        self.bursts = 0  # before recording: the warm-up's, counted to look for the go file
        self.recording = False
        self.lines = Lines() if _LINES else None
        self.seen = 0  # bursts since recording started, traced ones included
        self.tracing = False

    def mark(self, step):
        now = time.thread_time_ns()
        if step == "read":
            self.current = {{"read": now, "previous end": self.current.get("previous end")}}
            if self.lines is not None and self.recording and self.seen % {TRACE_EVERY} == 0:
                self.tracing = True  # from the next call on: the tracer's own time is no step
                sys.settrace(self.lines.trace)
        elif step == "last write":
            self.current[step] = now
        elif step == "end":
            if self.tracing:
                sys.settrace(None)
                self.tracing = False
                self.lines.bursts += 1
                self.seen += 1
            elif not self.recording:
                self.bursts += 1
                if self.bursts % 100 == 0 and os.path.exists(_OUT + ".go"):
                    self.recording = True
            elif "read" in self.current and "first write" in self.current:
                self.seen += 1
                self.current["end"] = now
                self.rows.append(self.current)
                if len(self.rows) == {SKIP + KEEP}:
                    with open(_OUT, "w") as f:
                        json.dump(self.rows[{SKIP}:], f)
                    if self.lines is not None:
                        with open(_OUT + ".lines", "w") as f:
                            json.dump(self.lines.summary(), f)
            self.current = {{"previous end": now}}
        else:
            self.current.setdefault(step, now)


steps = Steps()
'''

PUBLISHER = '_steps.on and self.role == "agent"'


def marked(indent: int, step: str, when: str = "_steps.on") -> str:
    """The lines of a mark at ``indent`` spaces: ``step`` is marked if ``when`` holds."""
    pad = " " * indent
    return f"{pad}if {when}:\n{pad}    _steps.mark({step!r})"


@dataclass(frozen=True)
class Mark:
    """Insert ``text`` before (or after) the line ``anchor`` of ``path`` in the copy."""

    path: str
    anchor: str
    text: str
    after: bool = False


DAEMON_MARKS = [
    Mark(
        "busd/daemon/connection.py",
        "                if frame is not None and (why := self._forbidden(frame)) is not None:",
        marked(16, "decoded", PUBLISHER + " and frame is not None"),
    ),
    Mark(
        "busd/daemon/connection.py",
        "                        await self._acks.around(frame, self._publish(frame))",
        marked(24, "rights", PUBLISHER),
    ),
    Mark(
        "busd/daemon/connection.py",
        "\n            data = await self._receive()\n            if not data:\n",
        marked(12, "end", PUBLISHER),
    ),
    Mark(
        "busd/daemon/connection.py",
        "\n            data = await self._receive()\n            if not data:\n"
        "                return  # the client went away",
        marked(12, "read", PUBLISHER),
        after=True,
    ),
    Mark(
        "busd/daemon/hub.py",
        "        self.fanout.hold(pass_with=events[-1].event if events else None)",
        marked(8, "into the hub"),
    ),
    Mark(
        "busd/daemon/hub.py",
        "            self.settle()\n        finally:\n            self.fanout.release()",
        marked(12, "published"),
    ),
    Mark(
        "busd/daemon/hub.py",
        "        raws = encode_envelopes(envelopes)",
        marked(8, "numbered"),
    ),
    Mark(
        "busd/daemon/hub.py",
        "        raws = encode_envelopes(envelopes)",
        marked(8, "encoded"),
        after=True,
    ),
    Mark(
        "busd/daemon/hub.py",
        "            self.history.extend(envelopes, raws)",
        marked(12, "ring"),
        after=True,
    ),
    Mark(
        "busd/daemon/hub.py",
        "            self.sessions.observe_many(envelopes)",
        marked(12, "journal"),
    ),
    Mark(
        "busd/daemon/outbox.py",
        "                written = os.writev(self._fd, (data, tail)) if tail else os.write(",
        marked(16, "first write"),
    ),
    Mark(
        "busd/daemon/outbox.py",
        "            if written == len(data) + len(tail):\n                return",
        marked(12, "last write"),
    ),
]
LEAN_MARKS = [
    Mark(
        "fanout_peers.py",
        "                        case Publish(events=events):",
        '                            _steps.mark("decoded")',
        after=True,
    ),
    Mark(
        "fanout_peers.py",
        "                            raws = encode_envelopes(envelopes)",
        '                            _steps.mark("encoded")',
        after=True,
    ),
    Mark(
        "fanout_peers.py",
        "                                            await peer.send(head_bytes, packed)",
        '                                            _steps.mark("first write")',
    ),
    Mark(
        "fanout_peers.py",
        "                                            await peer.send(head_bytes, packed)",
        '                                            _steps.mark("last write")',
        after=True,
    ),
    Mark(
        "fanout_peers.py",
        "\n                data = await receiver.receive()\n",
        marked(16, "end", "not me.subs"),
    ),
    Mark(
        "fanout_peers.py",
        "\n                data = await receiver.receive()",
        marked(16, "read", "not me.subs"),
        after=True,
    ),
]
# The steps in a burst's order, each named by the mark that ends it.
STEPS = [
    ("previous end", "read", "between bursts: Trio's wake-up and the read, other tasks"),
    ("read", "decoded", "the frame decoded"),
    ("decoded", "rights", "the rights check"),
    ("rights", "into the hub", "the frame's checks and acks"),
    ("into the hub", "numbered", "routing, numbering, ids, envelopes, handlers"),
    ("numbered", "encoded", "encoding the envelopes"),
    ("decoded", "encoded", "the frame decoded to its events encoded (all of the above)"),
    ("encoded", "first write", "to the first write: fan-out, batch, outbox"),
    ("first write", "last write", "the writes, first to last"),
    ("last write", "ring", "the pass's end and the replay ring"),
    ("ring", "journal", "the journal's extend"),
    ("journal", "published", "sessions, stats, the rest of the publish"),
    ("published", "end", "settle (accounting), acks, back to the read"),
    ("last write", "end", "after the last write"),
    ("read", "first write", "the read to the first write"),
    ("previous end", "end", "the burst, read to read"),
]


def insert(root: Path, marks: list[Mark], header: str) -> None:
    """Put ``marks`` into the copy under ``root``; each file gets ``header`` at its end."""
    touched: set[str] = set()
    for mark in marks:
        path = root / mark.path
        code = path.read_text()
        found = code.count(mark.anchor)
        if found != 1:
            where = "not found" if not found else f"found {found} times"
            raise SystemExit(f"bench_steps: anchor {where} in {mark.path}: {mark.anchor!r}")
        at = code.index(mark.anchor)
        if mark.after:
            at += len(mark.anchor)
            code = code[:at] + "\n" + mark.text + code[at:]
        else:
            at += mark.anchor.startswith("\n")  # the anchor's own line, not the one before it
            code = code[:at] + mark.text + "\n" + code[at:]
        path.write_text(code)
        touched.add(mark.path)
    for name in touched:  # the import at the end, but before a script's main guard
        path = root / name
        code = path.read_text()
        guard = code.find('\nif __name__ == "__main__":')
        at = len(code) if guard < 0 else guard
        path.write_text(code[:at] + "\n\n" + header + "\n" + code[at:])


def prepare(tmp: Path) -> Path:
    """A copy of busd and the benchmark's peers with the marks in; its root."""
    root = tmp / "tree"
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "busd", root / "busd", ignore=ignore)
    (root / "busd" / "_steps.py").write_text(STEPS_MODULE)
    insert(root, DAEMON_MARKS, "from .._steps import steps as _steps  # bench_steps.py")
    bench = tmp / "bench"
    shutil.copytree(HERE, bench, ignore=ignore)
    insert(bench, LEAN_MARKS, "from busd._steps import steps as _steps  # bench_steps.py")
    return root


@contextlib.contextmanager
def marked_processes(tmp: Path, root: Path) -> Iterator[Processes]:
    """Processes that import busd from the marked copy under ``root``, stopped at the end.

    They run in ``tmp``: ``python -m busd`` puts its working directory first on
    ``sys.path``, so run from the repository it would import the unmarked tree.
    """
    saved = dict(os.environ)
    paths = [str(root), *filter(None, saved.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(paths)
    procs = Processes(tmp, cwd=tmp)
    try:
        yield procs
    finally:
        procs.stop_all()
        os.environ.clear()
        os.environ.update(saved)


SPREAD = (75, 90, 99)  # the percentiles of --spread


def summarize(rows: list[dict[str, int]]) -> dict[str, tuple[float, ...]]:
    """Per step present in ``rows``: the median and mean of its CPU in µs, then the
    :data:`SPREAD` percentiles (a step's lumps: a median does not show them)."""
    out = {}
    for start, end, label in STEPS:
        values = [(r[end] - r[start]) / 1e3 for r in rows if r.get(start) and r.get(end)]
        if values:
            cuts = statistics.quantiles(values, n=100) if len(values) > 1 else values * 99
            spread = tuple(cuts[p - 1] for p in SPREAD)
            out[label] = (statistics.median(values), statistics.mean(values), *spread)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=30_000, help="per system (5,000/s)")
    parser.add_argument(
        "--spread", action="store_true", help="also each step's 75th, 90th and 99th percentiles"
    )
    parser.add_argument(
        "--lines",
        action="store_true",
        help=f"also count the Python lines a burst runs (1 in {TRACE_EVERY} traced, not timed)",
    )
    args = parser.parse_args()
    if args.events < (SKIP + KEEP) * 7:
        parser.error(f"--events must be at least {(SKIP + KEEP) * 7:,} (bursts of about 5)")
    results = {}
    lines: dict[str, dict[str, Any]] = {}
    if args.lines:
        os.environ["BUSD_STEPS_LINES"] = "1"
    with tempfile.TemporaryDirectory(prefix="busd-steps-") as name:
        tmp = Path(name)
        root = prepare(tmp)
        bench_fanout.PEERS = tmp / "bench" / "fanout_peers.py"
        with marked_processes(tmp, root) as procs:
            for system in ("busd", "busd-lean"):
                out = tmp / f"{system}.json"
                os.environ["BUSD_STEPS_OUT"] = str(out)
                server = start_server(procs, system, tmp, journal=True)
                del os.environ["BUSD_STEPS_OUT"]
                # A long-running daemon's replay ring is full: while it fills, its growth
                # (new pages, arrays resized) is a page fault in one burst in five.
                measure(procs, server, subscribers=1, events=WARMUP, window_ms=0)
                Path(f"{out}.go").touch()  # the marks record from the next bursts on
                measure(procs, server, subscribers=1, events=2_000, window_ms=0, rate=RATE)
                outcome = measure(
                    procs,
                    server,
                    subscribers=SUBSCRIBERS,
                    events=args.events,
                    window_ms=0,
                    rate=RATE,
                )
                procs.stop(server.worker)
                if outcome.problem or not out.exists():
                    sys.exit(f"bench_steps: {system}: {outcome.problem or 'too few bursts marked'}")
                results[system] = summarize(json.loads(out.read_text()))
                if args.lines:
                    lines[system] = json.loads(Path(f"{out}.lines").read_text())
    print(
        f"CPU of a burst's main thread, µs (median / mean of {KEEP:,} bursts), "
        f"{SUBSCRIBERS} subscribers at {RATE:,.0f} events/s, window 0:\n"
    )
    table(results, lambda found: f"{found[0]:.1f} / {found[1]:.1f}")
    if args.spread:
        cut = " / ".join(f"p{p}" for p in SPREAD)
        print(f"\nThe same steps' spread, µs ({cut}):\n")
        table(results, lambda found: " / ".join(f"{v:.0f}" for v in found[2:]))
    if args.lines:
        print_lines(lines)


def print_lines(lines: dict[str, dict[str, Any]], top: int = 15) -> None:
    """Lines a traced burst runs, and the functions that run the most of them, per server."""
    print("\nPython lines a burst runs (sys.settrace on the main thread; the marks' excluded):\n")
    print("| server | bursts traced | lines a burst | distinct lines, all traced bursts |")
    print("| --- | ---: | ---: | ---: |")
    for system, found in lines.items():
        per = sum(found["counts"].values()) / max(1, found["bursts"])
        print(f"| {system} | {found['bursts']} | {per:.0f} | {found['distinct']} |")
    for system, found in lines.items():
        print(f"\n{system}, the functions that run the most lines (a burst):\n")
        print("| function | lines |")
        print("| --- | ---: |")
        ranked = sorted(found["counts"].items(), key=lambda item: -item[1])[:top]
        for function, count in ranked:
            print(f"| {function} | {count / max(1, found['bursts']):.1f} |")


def table(
    results: dict[str, dict[str, tuple[float, ...]]], cell: Callable[[tuple[float, ...]], str]
) -> None:
    """Print a step per row, busd's cell beside the lean server's (– for a step it lacks)."""
    print("| step | busd | lean server |")
    print("| --- | ---: | ---: |")
    for _, _, label in STEPS:
        cells = [
            cell(found) if (found := results[system].get(label)) else "–"
            for system in ("busd", "busd-lean")
        ]
        print(f"| {label} | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main()
