"""Would compiling busd's sans-I/O hot modules with mypyc pay? Measure it, same command.

    .venv/bin/python contrib/bench/bench_mypyc.py [--modules busd/core/sessions.py ...] [--steady]

Copies ``busd`` to a temporary directory, compiles the given modules there
with mypyc (it comes with mypy; it needs a C compiler and the Python
headers), then runs ``bench_daemon.py`` against the pure-Python tree and the
compiled one, interleaved, and prints both figures. The modules default to
the core modules on the per-event path that mypyc compiles as they are;
``busd/core/bus.py`` is left out because mypyc rejects its dataclasses
(``KeyError: 'Exception'`` at import, with postponed annotations).

A second figure isolates the token estimator, the largest single cost per
event: its regex against the same count written as a character loop and
compiled (docs/performance.md has the numbers).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from busd.core.estimate import (  # the pure-Python tree's, imported first
    _reference_estimate,
    estimate_tokens,
)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
DEFAULT_MODULES = [
    "busd/core/sessions.py",
    "busd/core/ids.py",
    "busd/core/history.py",
    "busd/core/cohorts.py",
    "busd/core/coalesce.py",
    "busd/core/correlation.py",
]

# The estimator's count as a character loop: a class per character, runs cut at
# each class's length (busd/core/estimate.py). At least the work the regex does.
LOOP = r"""

_LETTER = 1
_DIGIT = 2
_PUNCT = 3
_EXT = 4
_OTHER = 5
_BLANK = 6
_BREAK = 7
_NONE = 0

_LIMIT = (0, 6, 3, 2, 4, 1)

_ASCII: list[int] = []
for _c in range(128):
    ch = chr(_c)
    if ch.isascii() and (ch.isalpha() or ch == "_"):
        _ASCII.append(_LETTER)
    elif "0" <= ch <= "9":
        _ASCII.append(_DIGIT)
    elif 0x21 <= _c <= 0x2F or 0x3A <= _c <= 0x40 or 0x5B <= _c <= 0x60 or 0x7B <= _c <= 0x7E:
        _ASCII.append(_PUNCT)
    elif ch in " \t":
        _ASCII.append(_BLANK)
    elif ch in "\r\n":
        _ASCII.append(_BREAK)
    else:
        _ASCII.append(_NONE)


def count_pieces(text: str) -> int:
    n = 0
    run = 0  # class of the current piece-run, 0 if none
    left = 0  # characters the current piece may still take
    blanks = 0  # blanks seen in a row (not inside a break's indentation)
    in_break = False
    ascii_table = _ASCII
    limits = _LIMIT
    for ch in text:
        c = ord(ch)
        if c < 128:
            k = ascii_table[c]
        elif 0xC0 <= c <= 0x6FF:
            k = _EXT
        else:
            k = _OTHER
        if k == _BLANK:
            if in_break:
                continue
            run = 0
            blanks += 1
            continue
        if k == _BREAK:
            if blanks >= 2:
                n += 1
            blanks = 0
            run = 0
            if not in_break:
                in_break = True
                n += 1
            continue
        in_break = False
        if k == _NONE:
            if blanks >= 2:
                n += 1
            blanks = 0
            run = 0
            continue
        if blanks >= 2:
            n += 1
        blanks = 0
        if k == run and left > 0 and k != _OTHER:
            left -= 1
            continue
        run = k
        left = limits[k] - 1
        n += 1
    if blanks >= 2:
        n += 1
    return n
"""


def compile_tree(modules: list[str], into: Path) -> None:
    shutil.copytree(ROOT / "busd", into / "busd", ignore=shutil.ignore_patterns("__pycache__"))
    (into / "mypy.ini").write_text("[mypy]\nstrict = True\n")
    subprocess.run(
        [sys.executable, "-m", "mypyc", *modules],
        cwd=into,
        check=True,
        stdout=subprocess.DEVNULL,
    )


def daemon_us(pythonpath: Path | None, subscribers: int, events: int, steady: list[str]) -> float:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    out = subprocess.run(
        [
            sys.executable,
            str(HERE / "bench_daemon.py"),
            "--subscribers",
            str(subscribers),
            "--events",
            str(events),
            "--repeat",
            "2",
            "--no-journal",
            *steady,
        ],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    found = re.findall(rf"^\| {subscribers} \| ([0-9.]+) \|", out, re.MULTILINE)
    if not found:
        raise SystemExit(f"bench_daemon.py said something else:\n{out}")
    return min(map(float, found))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modules", nargs="+", default=DEFAULT_MODULES)
    parser.add_argument("--subscribers", type=int, default=4)
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--steady",
        action="store_true",
        help="publish frames of 5 events to window-0 subscribers (the steady rate's path)",
    )
    args = parser.parse_args()
    steady = ["--per-frame", "5", "--window-ms", "0"] if args.steady else []
    with tempfile.TemporaryDirectory(prefix="busd-mypyc-") as tmp:
        started = time.monotonic()
        compile_tree(args.modules, Path(tmp))
        print(f"compiled {len(args.modules)} modules in {time.monotonic() - started:.0f} s")
        pure, compiled = [], []
        for _ in range(args.rounds):
            pure.append(daemon_us(None, args.subscribers, args.events, steady))
            compiled.append(daemon_us(Path(tmp), args.subscribers, args.events, steady))
        shape = "frames of 5, window 0" if args.steady else "frames of 256, window 16 ms"
        print(
            f"daemon, {args.subscribers} subscribers, {shape}, journal off: pure Python "
            f"{min(pure):.2f} us/event, with mypyc {min(compiled):.2f} us/event "
            f"({min(pure) / min(compiled):.2f}x)"
        )
        estimator(Path(tmp))


def estimator(tmp: Path) -> None:
    """The regex, the fast exact count and the compiled loop, per 100 recorded characters."""
    (tmp / "pieces.py").write_text(LOOP)
    subprocess.run(
        [sys.executable, "-m", "mypyc", "pieces.py"], cwd=tmp, check=True, stdout=subprocess.DEVNULL
    )
    sys.path.insert(0, str(tmp))
    import pieces  # type: ignore[import-not-found]

    text = "".join(p.read_text() for p in sorted(ROOT.glob("tests/fixtures/**/*.jsonl")))
    chunks = [text[i : i + 100] for i in range(0, min(len(text), 1_000_000), 100)]
    timings = {}
    for name, count in (
        ("regex", _reference_estimate),
        ("fast path", estimate_tokens),
        ("mypyc loop", pieces.count_pieces),
    ):
        started = time.process_time()
        for chunk in chunks:
            count(chunk)
        timings[name] = (time.process_time() - started) / len(chunks) * 1e6
    print(
        "token estimator, per 100 characters: "
        + ", ".join(f"{name} {us:.2f} us" for name, us in timings.items())
    )


if __name__ == "__main__":
    main()
