"""Inclusive seq ranges: what the journal lost, what one connection published (its acks)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["Published", "describe", "merge", "overlap"]


def merge(ranges: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Inclusive seq ranges, sorted, with overlapping and adjacent ones joined."""
    merged: list[tuple[int, int]] = []
    for a, b in sorted(ranges):
        if merged and a <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(b, merged[-1][1]))
        else:
            merged.append((a, b))
    return merged


def describe(ranges: Sequence[tuple[int, int]], most: int = 10) -> str:
    """``11..310, 400`` for the log (the first ``most`` of them)."""
    text = ", ".join(f"{a}..{b}" if a != b else str(a) for a, b in ranges[:most])
    return text + (f" and {len(ranges) - most} more ranges" if len(ranges) > most else "")


class Published:
    """The seqs one connection has published, as a few ranges: what its acks answer for.

    Past ``most`` ranges the two oldest join, with the span between them: an
    ack may then blame a loss that was not this connection's, never miss one.
    """

    __slots__ = ("most", "ranges")

    def __init__(self, most: int = 64) -> None:
        self.most = most
        self.ranges: list[tuple[int, int]] = []

    def add(self, first: int, last: int) -> None:
        """Seqs ``first..last`` were accepted while one of this connection's frames was handled."""
        if first > last:
            return
        ranges = self.ranges
        if ranges and first <= ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], max(last, ranges[-1][1]))
        else:
            ranges.append((first, last))
            if len(ranges) > self.most:
                ranges[0:2] = [(ranges[0][0], ranges[1][1])]


def overlap(
    ours: Sequence[tuple[int, int]], lost: Sequence[tuple[int, int]]
) -> list[tuple[int, int]]:
    """The parts of ``ours`` inside ``lost``."""
    return merge([(max(a, c), min(b, d)) for a, b in ours for c, d in lost if a <= d and c <= b])
