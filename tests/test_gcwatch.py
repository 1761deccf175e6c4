"""The garbage collector's pauses as ``status`` shows them, and the startup heap's freeze."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from busd.daemon.gcwatch import GcWatch, freeze_startup_heap


class Ticks:
    """A clock that moves 1 ms (in ns) at each read: each pause is exactly one tick."""

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        self.now += 1_000_000
        return self.now


@pytest.fixture
def unfrozen() -> Iterator[None]:
    yield
    gc.unfreeze()  # the rest of the test session collects as before


def test_each_collection_is_counted_and_timed_in_its_generation() -> None:
    with GcWatch(Ticks()) as watch:
        gc.collect(2)
        gc.collect(0)
        gc.collect(2)
    stats = watch.statistics()
    young, _, full = stats.collections
    # Collections the interpreter starts by itself may add to these, never subtract.
    assert full >= 2
    assert young >= 1
    assert stats.pause_ms_longest[2] == 1.0
    assert stats.pause_ms_total[2] == full * 1.0
    assert stats.pause_ms_total[0] == young * 1.0


def test_a_watch_counts_nothing_once_left() -> None:
    with GcWatch(Ticks()) as watch:
        pass
    gc.collect(2)
    assert watch.statistics().collections == (0, 0, 0)
    assert watch._observe not in gc.callbacks


def test_the_longest_pause_is_the_longest_not_the_last() -> None:
    watch = GcWatch(iter([0, 5_000_000, 10_000_000, 11_000_000]).__next__)
    watch._observe("start", {"generation": 2})
    watch._observe("stop", {"generation": 2})
    watch._observe("start", {"generation": 2})
    watch._observe("stop", {"generation": 2})
    stats = watch.statistics()
    assert stats.pause_ms_longest == (0.0, 0.0, 5.0)
    assert stats.pause_ms_total == (0.0, 0.0, 6.0)


def test_freezing_leaves_the_live_heap_out_of_collections(unfrozen: None) -> None:
    kept: list[list[int]] = [[] for _ in range(1_000)]  # live, tracked objects
    frozen = freeze_startup_heap()
    assert frozen == gc.get_freeze_count() >= len(kept)
    # A full collection walks the generations only: the frozen heap is in none of them.
    walked = {id(o) for generation in range(3) for o in gc.get_objects(generation)}
    assert not walked & set(map(id, kept))


def test_statistics_never_walk_the_frozen_heap(monkeypatch: pytest.MonkeyPatch) -> None:
    """``status`` asks for them at every call: counting the frozen heap walks it all.

    ``gc.get_freeze_count()`` is a walk of tens of thousands of objects in a
    served daemon; a status request cost milliseconds with it (the protocol
    model's soak ran 40% fewer steps).
    """

    def walk() -> int:
        raise AssertionError("gc.get_freeze_count() walks the frozen heap")

    watch = GcWatch()
    watch.frozen = 43_000  # what the freeze said
    monkeypatch.setattr(gc, "get_freeze_count", walk)
    assert watch.statistics().frozen == 43_000
