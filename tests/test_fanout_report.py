"""The fanout benchmark's verdicts (contrib/bench/fanout_report.py), from made-up runs.

The benchmark itself runs real servers and takes minutes; what it prints
about issue 20's targets is plain arithmetic on its outcomes, checked here.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "contrib" / "bench"))

from fanout_report import (
    Outcome,
    Variant,
    best,
    journal_line,
    median_p99,
    rounds_at_least,
    rounds_lower,
    targets,
)

BUSD, NATS, JETSTREAM = Variant("busd", 0), Variant("nats"), Variant("nats-js")


def steady(*p99s_ms: float) -> Outcome:
    """Interleaved latency rounds whose p99s are ``p99s_ms`` (100 events each)."""
    rounds = []
    for p99 in p99s_ms:
        outcome = Outcome(events=100, subscribers=4)
        outcome.latencies_ns = [100_000] * 98 + [int(p99 * 1e6)] * 2
        rounds.append(outcome)
    return median_p99(rounds)


def flat(rate: float) -> Outcome:
    return Outcome(events=1000, subscribers=4, rate=rate)


def repeated(*rates: float | None) -> Outcome:
    """Throughput rounds at ``rates`` (``None``: a round that failed), as the report keeps them."""
    return best(
        [Outcome(events=1000, subscribers=4, rate=r, problem="" if r else "x") for r in rates]
    )


def lines_for(latency: dict[tuple[Variant, int], Outcome], *, journal: bool) -> list[str]:
    throughput = {(BUSD, 4): flat(120.0), (NATS, 4): flat(100.0), (JETSTREAM, 4): flat(60.0)}
    variants = [BUSD, NATS, JETSTREAM]
    return targets(variants, throughput, latency, [4], None, 100, journal=journal)


def test_the_p99_verdict_says_in_how_many_rounds_busd_was_lower() -> None:
    latency = {(BUSD, 4): steady(1.0, 3.0, 1.2), (NATS, 4): steady(1.1, 1.3, 0.9)}
    (line,) = [line for line in lines_for(latency, journal=False) if line.startswith("p99")]
    assert "1.200 ms vs 1.100 ms; busd's lower in 1 of 3 rounds: MISSED" in line


def test_rounds_are_compared_pairwise_in_order() -> None:
    assert rounds_lower(steady(1.0, 2.0), steady(2.0, 1.0)) == "; busd's lower in 1 of 2 rounds"
    assert rounds_lower(steady(1.0), steady(2.0)) == ""  # one round: no pairs to count


@pytest.mark.parametrize(
    ("journal", "how"),
    [
        (True, "like for like (both store every event)"),
        (False, "busd without its journal (--journal compares like for like)"),
    ],
)
def test_jetstream_is_compared_like_for_like_only_with_the_journal(journal: bool, how: str) -> None:
    latency = {(BUSD, 4): steady(1.0, 1.0, 1.0), (JETSTREAM, 4): steady(2.0, 0.5, 2.0)}
    lines = [line for line in lines_for(latency, journal=journal) if "JetStream" in line]
    assert lines == [
        f"{how}, 4 subscribers, busd / NATS with JetStream: 2.00x with busd (window 0 ms) "
        "(no target)",
        f"{how}, p99 at the steady rate, 4 subscribers, busd window 0 vs NATS with "
        "JetStream: 1.000 vs 2.000 ms; busd's lower in 2 of 3 rounds (no target)",
    ]


def test_without_jetstream_there_is_no_like_for_like_line() -> None:
    latency = {(BUSD, 4): steady(1.0), (NATS, 4): steady(1.1)}
    throughput = {(BUSD, 4): flat(120.0), (NATS, 4): flat(100.0)}
    lines = targets([BUSD, NATS], throughput, latency, [4], None, 100, journal=True)
    assert not [line for line in lines if "JetStream" in line]
    assert "4 subscribers, busd >= 1.5x NATS: 1.20x with busd (window 0 ms): MISSED" in lines


def test_the_throughput_verdict_counts_the_rounds_that_reached_the_factor() -> None:
    # The best rounds give 1.6x; paired round by round, only the first reached 1.5x.
    throughput = {(BUSD, 4): repeated(160.0, 120.0, 130.0), (NATS, 4): repeated(100.0, 95.0, 90.0)}
    lines = targets([BUSD, NATS], throughput, {}, [4], None, 100)
    assert (
        "4 subscribers, busd >= 1.5x NATS: 1.60x with busd (window 0 ms); per round 1.60x "
        "1.26x 1.44x, at least 1.5x in 1 of 3: met"
    ) in lines


def test_a_failed_round_is_left_out_of_the_pairs() -> None:
    mine, theirs = repeated(150.0, None, 120.0), repeated(100.0, 100.0, 100.0)
    assert rounds_at_least(mine, theirs, 1.5) == "; per round 1.50x 1.20x, at least 1.5x in 1 of 2"
    assert rounds_at_least(repeated(150.0, None), theirs, 1.5) == ""  # one pair: nothing to count
    assert rounds_at_least(mine, theirs) == "; per round 1.50x 1.20x"  # no target: no count


def test_the_journal_line_tells_retention_from_loss() -> None:
    status = {"events": 2_500, "journaled_seq": 4_000, "head_seq": 4_000, "lost": 0}
    assert journal_line({**status, "oldest_seq": 1_501}) == (
        "busd's journal at the end: 2,500 events from seq 1,501 (the older ones removed by "
        "retention: --journal-max-size), journaled_seq 4,000 of head 4,000, lost 0"
    )
    whole = {**status, "events": 4_000, "oldest_seq": 1}
    assert journal_line(whole) == (
        "busd's journal at the end: 4,000 events, journaled_seq 4,000 of head 4,000, lost 0"
    )
    fell_behind = journal_line({**whole, "lost": 10})
    assert fell_behind.endswith("lost 10 (it fell behind: not every event kept)")
