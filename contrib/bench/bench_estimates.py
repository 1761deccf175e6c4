"""How far the context figure shown before each model call was from the call's actual input.

    python contrib/bench/bench_estimates.py

Every recorded stream with more than one model call in a conversation is
translated by its adapter (loaded from the ``busd`` entry-point group, as
the daemon loads them) and folded by a :class:`~busd.core.context.ContextRegistry`
twice: with the per-conversation calibration (the default) and without it.
For each call that followed an estimate, the figure shown when the call went
out is compared with the call's actual input; the table gives the mean
absolute error in percent and in tokens, per stream and over all of them.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import msgspec

from busd.core.context import ContextRegistry
from busd.core.events import Envelope, Event
from busd.plugins.manager import PluginManager

ROOT = Path(__file__).resolve().parents[2]
STREAMS = {
    "anthropic": [
        "tests/fixtures/sdk/anthropic.jsonl",
        "tests/fixtures/sdk/anthropic-tool.recorded.jsonl",
    ],
    "claude-code": [
        "tests/fixtures/sdk/claude_code.jsonl",
        "plugins/claude_code/tests/fixtures/subagent-haiku.partial-hooks.jsonl",
        "plugins/claude_code/tests/fixtures/subagent-haiku.snapshots.jsonl",
    ],
    "copilot": ["tests/fixtures/sdk/copilot.jsonl"],
    "opencode": ["tests/fixtures/sdk/opencode.jsonl"],
    "acp": [
        "tests/fixtures/sdk/acp.jsonl",
        "tests/fixtures/sdk/acp-claude-agent-acp.jsonl",
        "tests/fixtures/sdk/acp-opencode-acp.jsonl",
    ],
}


@dataclass
class Grade:
    samples: int = 0
    abs_pct: float = 0.0
    abs_tokens: float = 0.0

    def add(self, other: Grade) -> None:
        self.samples += other.samples
        self.abs_pct += other.abs_pct
        self.abs_tokens += other.abs_tokens

    def row(self) -> str:
        if not self.samples:
            return f"{0:>7}  {'-':>9}  {'-':>9}"
        mean_pct = self.abs_pct / self.samples
        mean_tokens = self.abs_tokens / self.samples
        return f"{self.samples:>7}  {mean_pct:>8.1f}%  {mean_tokens:>9.0f}"


def envelopes(adapter: str, path: Path, plugins: PluginManager) -> list[Envelope[Event]]:
    translator = plugins.adapters()[adapter].translator(session_id="bench")
    decoder = msgspec.json.Decoder()
    out: list[Envelope[Event]] = []
    now = 0.0
    for line in path.read_bytes().splitlines():
        if not line.strip():
            continue
        now += 0.01
        for emitted in [*translator.feed(decoder.decode(line), now)]:
            out.append(
                Envelope(
                    seq=len(out) + 1,
                    ts=now,
                    event=emitted.event,
                    session_id=emitted.session_id or "bench",
                    agent_id=emitted.agent_id,
                )
            )
    for emitted in translator.finish(now):
        out.append(Envelope(seq=len(out) + 1, ts=now, event=emitted.event, session_id="bench"))
    return out


def grade(stream: list[Envelope[Event]], *, calibrate: bool) -> Grade:
    registry = ContextRegistry(window=200_000, calibrate=calibrate)
    for envelope in stream:
        registry.observe(envelope)
    result = Grade()
    for context in registry._windows.values():  # a benchmark may look inside
        for estimate, actual in context._errors:
            if actual > 0:
                result.samples += 1
                result.abs_pct += 100.0 * abs(estimate - actual) / actual
                result.abs_tokens += abs(estimate - actual)
    return result


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    plugins = PluginManager()
    plugins.load_entry_points()
    print(f"{'stream':<58} {'plain':>29}  {'calibrated':>29}")
    print(f"{'':<58} {'samples  mean |err|  tokens':>29}  {'samples  mean |err|  tokens':>29}")
    totals = (Grade(), Grade())
    for adapter, paths in STREAMS.items():
        for relative in paths:
            stream = envelopes(adapter, ROOT / relative, plugins)
            plain, calibrated = grade(stream, calibrate=False), grade(stream, calibrate=True)
            totals[0].add(plain)
            totals[1].add(calibrated)
            name = relative.rsplit("/", 1)[-1]
            print(f"{name:<58} {plain.row():>29}  {calibrated.row():>29}")
    print(f"{'all':<58} {totals[0].row():>29}  {totals[1].row():>29}")


if __name__ == "__main__":
    main()
