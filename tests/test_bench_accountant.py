"""The accountant's benchmark (contrib/bench/bench_accountant.py) feeds as the daemon does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "contrib" / "bench"))

from bench_accountant import feed, make_envelopes

from busd.core.accounting import Accountant

ROOT = Path(__file__).resolve().parents[1]


def test_its_frames_leave_the_figures_of_one_by_one_feeding() -> None:
    """What it times is the accounting the daemon does: its frames of 5 and of 256 give the
    figures the same deltas give fed one at a time."""
    envelopes = make_envelopes(2_000)
    reference = Accountant()
    for envelope in envelopes:
        reference.observe(envelope, 1.0)
    expected = reference.session_stats("s1", 2.0)
    assert expected is not None
    assert expected.output_tokens > 2_000
    for per_frame in (5, 256, 0):
        accountant = feed(envelopes, per_frame)
        assert accountant.session_stats("s1", 2.0) == expected
        assert accountant.stats.run_stats("r1", 2.0) == reference.stats.run_stats("r1", 2.0)


def test_it_prints_its_table_and_the_cold_stretch() -> None:
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "contrib" / "bench" / "bench_accountant.py"),
            "--deltas",
            "1024",
            "--repeat",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "| the accountant | " in result.stdout
    assert "| its estimator left out | " in result.stdout
    assert "settled with cold caches" in result.stdout
