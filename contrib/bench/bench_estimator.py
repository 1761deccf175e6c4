"""The token estimator's cost per character: the reference regex against the fast path.

    .venv/bin/python contrib/bench/bench_estimator.py            # about 10 s

``busd.core.estimate.estimate_tokens`` counts the pieces of the regex
``_PIECE`` without matching them (``_reference_estimate`` matches them). The
stats tracker estimates streamed text in chunks of up to 4,096 characters,
so what matters is ns per character on 1-4 KB strings; 100 characters shows
the fixed cost. Texts come from this repository: English prose (the
paragraphs of the docs), Python code (``busd/core/stats.py``), Markdown
(``docs/performance.md``, which has some ``µ`` and ``–``), JSON (the
recorded SDK streams) and prose with non-ASCII mixed in (quotes, dashes,
accents, Greek, Cyrillic, CJK, emoji). Each figure is the best of
``--repeat`` rounds; both estimators run in the same rounds, interleaved,
and must return the same count (the command fails otherwise). The fast path
is timed as a first estimate of a text costs (``_fast_estimate``):
``estimate_tokens`` remembers the last texts it estimated, so timing it on
one text over and over would time a dictionary lookup.
"""

from __future__ import annotations

import argparse
import os
import sys
import timeit
from collections.abc import Callable
from pathlib import Path

from busd.core.estimate import _fast_estimate, _reference_estimate, estimate_tokens

ROOT = Path(__file__).resolve().parents[2]
SIZES = (100, 4096)


def _read(*paths: str) -> str:
    return "\n".join((ROOT / path).read_text(encoding="utf-8") for path in paths)


def _prose() -> str:
    """Paragraph lines of the docs (no headings, lists, tables or code)."""
    docs = sorted((ROOT / "docs").glob("*.md"))
    lines = (line for doc in docs for line in doc.read_text(encoding="utf-8").splitlines())
    text = " ".join(line.strip() for line in lines if line[:1].isalpha())
    return text.encode("ascii", "ignore").decode()


def _mixed(prose: str) -> str:
    """Prose as a chat reply in several languages would have it."""
    inserts = (
        " Übergröße and café, naïve façade.",
        " Это пример текста на русском языке.",
        " Το παράδειγμα είναι ελληνικό.",
        " 这是一个中文句子，用来测试。",
        " それはテストです 🎉🚀.",
    )
    sentences = prose.replace("'", "\u2019").replace(" - ", " \u2014 ").split(". ")
    return ". ".join(s + inserts[i % len(inserts)] * (i % 3 == 0) for i, s in enumerate(sentences))


def texts() -> dict[str, str]:
    prose = _prose()
    return {
        "English prose": prose,
        "Python code": _read("busd/core/stats.py"),
        "Markdown": _read("docs/performance.md"),
        "JSON": _read(
            "tests/fixtures/sdk/anthropic-tool.recorded.jsonl", "tests/fixtures/sdk/opencode.jsonl"
        ),
        "prose, non-ASCII": _mixed(prose),
    }


def _window(source: str, size: int) -> str:
    """``size`` characters, from just before the first non-ASCII one if any."""
    start = next((i for i, c in enumerate(source) if not c.isascii()), 0)
    start = max(0, min(start - 40, len(source) - size))
    return (source * (size // len(source) + 2))[start : start + size]


def _best_ns(fn: Callable[[], object], number: int, rounds: list[float]) -> None:
    rounds.append(timeit.timeit(fn, number=number) / number * 1e9)


def measure(text: str, repeat: int) -> tuple[float, float]:
    """Best ns per call of the reference and of the fast path, interleaved."""
    if not estimate_tokens(text) == _fast_estimate(text) == _reference_estimate(text):
        sys.exit(f"bench_estimator: counts differ on {text[:40]!r}...")
    number = max(20, 1_000_000 // len(text))
    ref: list[float] = []
    fast: list[float] = []
    for _ in range(repeat):
        _best_ns(lambda: _reference_estimate(text), number, ref)
        _best_ns(lambda: _fast_estimate(text), number, fast)
    return min(ref), min(fast)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="rounds per figure (best kept)")
    args = parser.parse_args()
    if args.repeat < 1:
        sys.exit("bench_estimator: --repeat must be at least 1")
    print(
        f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs, best of {args.repeat}\n"
    )
    print("| text | chars | non-ASCII | reference ns/char | fast ns/char | speed-up |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, source in texts().items():
        for size in SIZES:
            text = _window(source, size)
            ref, fast = measure(text, args.repeat)
            non_ascii = sum(not c.isascii() for c in text)
            per_char = f"{ref / size:.1f} | {fast / size:.1f}"
            print(f"| {name} | {size} | {non_ascii} | {per_char} | {ref / fast:.1f}x |")


if __name__ == "__main__":
    main()
