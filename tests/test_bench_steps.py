"""The step benchmark (contrib/bench/bench_steps.py) still fits the code it marks.

Its marks go into a copy of the tree by anchors; this checks that every
anchor matches the daemon and the lean server as they are (once each), that
the marked copy compiles, and the arithmetic of its table.
"""

from __future__ import annotations

import json
import py_compile
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "contrib" / "bench"))

from bench_steps import (
    DAEMON_MARKS,
    KEEP,
    LEAN_MARKS,
    SKIP,
    STEPS_MODULE,
    TRACE_EVERY,
    Mark,
    insert,
    marked_processes,
    prepare,
    summarize,
)

ROOT = Path(__file__).resolve().parents[1]


def test_every_mark_fits_the_code_and_the_marked_copy_compiles(tmp_path: Path) -> None:
    root = prepare(tmp_path)
    for mark in DAEMON_MARKS:
        py_compile.compile(str(root / mark.path), doraise=True)
        assert "_steps.mark(" in (root / mark.path).read_text()
    lean = tmp_path / "bench" / "fanout_peers.py"
    py_compile.compile(str(lean), doraise=True)
    code = lean.read_text()
    assert code.count("_steps.mark(") == len(LEAN_MARKS)
    assert code.index("import steps as _steps") < code.index('if __name__ == "__main__":')


def test_the_servers_run_the_marked_copy_even_started_from_the_repository(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ``python -m busd`` puts the working directory first on sys.path: run from
    # the repository's root, the daemon imported the unmarked tree, marked nothing,
    # and the run ended with "too few bursts marked".
    monkeypatch.chdir(ROOT)
    root = prepare(tmp_path)
    with marked_processes(tmp_path, root) as procs:
        probe = "import busd, busd._steps; print(busd.__file__)"
        worker = procs.start("probe", [sys.executable, "-c", probe])
        out, _ = worker.proc.communicate(timeout=60)
    assert worker.proc.returncode == 0
    assert Path(out.decode().strip()) == root / "busd" / "__init__.py"


def test_an_anchor_that_no_longer_matches_stops_the_run_naming_it(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("a = 1\na = 1\n")
    with pytest.raises(SystemExit, match=r"anchor not found in m.py: 'b = 2'"):
        insert(tmp_path, [Mark("m.py", "b = 2", "pass")], "")
    with pytest.raises(SystemExit, match=r"anchor found 2 times in m.py"):
        insert(tmp_path, [Mark("m.py", "a = 1", "pass")], "")


def test_a_step_is_the_difference_of_its_marks_in_microseconds() -> None:
    rows = [
        {"previous end": 0, "read": 50_000, "decoded": 60_000, "first write": 100_000},
        {"previous end": 0, "read": 70_000, "decoded": 90_000, "first write": 150_000},
    ]
    table = summarize(rows)
    assert table["the frame decoded"][:2] == (15.0, 15.0)
    assert table["the read to the first write"][:2] == (65.0, 65.0)
    assert "the rights check" not in table  # a step whose marks are missing is left out
    one = summarize(rows[:1])["the frame decoded"]  # one burst: its value, spread too
    assert one == (10.0,) * 5


def test_the_spread_shows_a_lump_the_median_hides() -> None:
    """One burst in a hundred with 500 µs after its writes: only the 99th percentile has it."""
    rows = [{"last write": 1_000, "end": 11_000} for _ in range(99)]
    rows.append({"last write": 1_000, "end": 501_000})
    median, mean, p75, p90, p99 = summarize(rows)["after the last write"]
    assert (median, p75, p90) == (10.0, 10.0, 10.0)
    assert mean == pytest.approx(14.9)
    assert p99 > 400


def _steps_module() -> dict[str, Any]:
    """The marks' module as the copy's ``busd/_steps.py`` runs it, read from the environment now."""
    module: dict[str, Any] = {}
    exec(compile(STEPS_MODULE, "_steps.py", "exec"), module)
    return module


def test_the_marks_record_only_after_the_warm_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The warm-up's bursts (a replay ring filling) are not the steady state's: the marks
    start recording once the go file is there."""
    out = tmp_path / "rows.json"
    monkeypatch.setenv("BUSD_STEPS_OUT", str(out))
    steps = _steps_module()["steps"]

    def bursts(count: int) -> None:
        for _ in range(count):
            for step in ("read", "decoded", "first write", "last write", "end"):
                steps.mark(step)

    bursts(300)
    assert steps.rows == []
    Path(f"{out}.go").touch()
    bursts(100)  # it looks for the file every 100 bursts
    assert steps.rows == []
    bursts(SKIP + KEEP)
    assert len(steps.rows) == SKIP + KEEP
    assert len(json.loads(out.read_text())) == KEEP


def _three_lines() -> int:
    a = 1
    b = a + 1
    return a + b


def test_lines_traces_one_recorded_burst_in_twenty_and_leaves_it_out_of_the_timings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BUSD_STEPS_OUT", str(tmp_path / "out.json"))
    monkeypatch.setenv("BUSD_STEPS_LINES", "1")
    steps = _steps_module()["steps"]
    steps.recording = True
    for _ in range(2 * TRACE_EVERY):
        steps.mark("read")
        _three_lines()
        steps.mark("first write")
        steps.mark("end")
    assert steps.lines.bursts == 2  # the 1st and the 21st
    assert steps.lines.counts == {"test_bench_steps.py:_three_lines": 6}
    assert len(steps.rows) == 2 * TRACE_EVERY - 2  # a traced burst's time is the tracer's
    assert sys.gettrace() is None
