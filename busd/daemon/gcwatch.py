"""How long Python's cyclic garbage collector stops the daemon, for ``status``.

While a collection runs, nothing else in the process does: no frame is
read, sequenced or written. A full collection walks every tracked object,
the modules and plugins loaded at startup included: 14–32 ms measured for
a fresh ``busd serve``, a hundred events late at 5,000 a second. ``busd serve``
therefore freezes its startup heap (:func:`freeze_startup_heap`) and full
collections walk only what came after; ``status`` shows each generation's
pauses, so an operator can see a stall's cause (docs/operations.md,
"Garbage collection").
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

from ..wire.results import GcStatistics

__all__ = ["GcWatch", "freeze_startup_heap"]


class GcWatch:
    """Times every collection while entered (a ``gc.callbacks`` entry of its own)."""

    def __init__(self, clock: Callable[[], int] = time.perf_counter_ns) -> None:
        self._clock = clock
        self._started = 0
        self._collections = [0, 0, 0]
        self._total_ns = [0, 0, 0]
        self._longest_ns = [0, 0, 0]
        self.frozen = 0
        """Objects frozen out of collections, as whoever froze them said.

        ``gc.get_freeze_count()`` walks them all, too slow for each ``status``.
        """

    def __enter__(self) -> GcWatch:
        gc.callbacks.append(self._observe)
        return self

    def __exit__(self, *exc_info: object) -> None:
        gc.callbacks.remove(self._observe)

    def _observe(self, phase: str, info: dict[str, int]) -> None:
        # Called by the collector around each collection: cheap, and never raises.
        if phase == "start":
            self._started = self._clock()
            return
        generation = info["generation"]
        pause = self._clock() - self._started
        self._collections[generation] += 1
        self._total_ns[generation] += pause
        if pause > self._longest_ns[generation]:
            self._longest_ns[generation] = pause

    def statistics(self) -> GcStatistics:
        def ms(values: list[int]) -> tuple[float, float, float]:
            young, middle, full = (round(v / 1e6, 3) for v in values)
            return young, middle, full

        young, middle, full = self._collections
        return GcStatistics(
            collections=(young, middle, full),
            pause_ms_total=ms(self._total_ns),
            pause_ms_longest=ms(self._longest_ns),
            frozen=self.frozen,
        )


def freeze_startup_heap() -> int:
    """Collect once, then move every object left to the permanent generation.

    For a process that serves after a long startup (imports, plugins, the
    journal's recovery): later full collections skip all of it. Objects
    frozen here are still freed by reference counting; only a cycle among
    them that becomes garbage later stays. Returns how many are frozen.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
