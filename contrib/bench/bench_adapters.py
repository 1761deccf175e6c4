"""Adapter translation throughput: raw SDK events per second through each adapter.

    python contrib/bench/bench_adapters.py [--passes 300] [--repeat 5]

Each adapter (loaded from the ``busd`` entry-point group, as the daemon
loads them) translates its recorded fixture ``--passes`` times, a fresh
translator per pass, from already-decoded dicts: this measures the
translator alone. The peer, run in the same command, is ``msgspec.json``
decoding the same lines: the cost of merely reading the stream, so the
ratio says how many times a decode the translation costs.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from busd.plugins.manager import PluginManager

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "sdk"
FIXTURE_OF = {
    "anthropic": "anthropic.jsonl",
    "claude-code": "claude_code.jsonl",
    "copilot": "copilot.jsonl",
    "opencode": "opencode.jsonl",
    "acp": "acp.jsonl",
}


def best(fn: Callable[[], int], repeat: int) -> float:
    """Best rate in items per second over ``repeat`` runs of ``fn`` (which returns its count)."""
    rate = 0.0
    for _ in range(repeat):
        start = time.perf_counter()
        count = fn()
        rate = max(rate, count / (time.perf_counter() - start))
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    passes: int = args.passes

    plugins = PluginManager()
    plugins.load_entry_points()
    adapters = plugins.adapters()
    decoder = msgspec.json.Decoder()
    print(f"{args.passes} passes over each fixture, best of {args.repeat}")
    print(
        f"{'adapter':<12} {'raw/pass':>8} {'out/pass':>8} {'raw events/s':>14} "
        f"{'json decode/s':>14} {'ratio':>6}"
    )
    for name, fixture in FIXTURE_OF.items():
        adapter = adapters.get(name)
        if adapter is None:
            print(f"{name:<12} not installed (pip install -e plugins/...)")
            continue
        lines = (FIXTURES / fixture).read_bytes().splitlines()
        raws: list[Any] = [decoder.decode(line) for line in lines if line.strip()]
        emitted = [0]

        def translate(
            adapter: Any = adapter, raws: list[Any] = raws, emitted: list[int] = emitted
        ) -> int:
            out = 0
            for _ in range(passes):
                translator = adapter.translator(session_id="bench")
                for now, raw in enumerate(raws):
                    out += len(translator.feed(raw, now * 0.01))
                out += len(translator.finish(len(raws) * 0.01))
            emitted[0] = out // passes
            return len(raws) * passes

        def decode(lines: list[bytes] = lines) -> int:
            for _ in range(passes):
                for line in lines:
                    decoder.decode(line)
            return len(lines) * passes

        rate = best(translate, args.repeat)
        peer = best(decode, args.repeat)
        print(
            f"{name:<12} {len(raws):>8} {emitted[0]:>8} {rate:>14,.0f} {peer:>14,.0f} "
            f"{rate / peer:>6.2f}"
        )


if __name__ == "__main__":
    main()
