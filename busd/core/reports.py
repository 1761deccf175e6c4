"""Reporting a failure that repeats: its first, then at most one an interval, with a count.

A handler or a plugin's hook that raises on every event would otherwise be
a traceback (and, for a hook, a ``busd.internal.error``) per event: a flood
that slows the daemon for everyone. Its owner still counts every failure.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import Final

__all__ = ["REPORT_EVERY", "Reports"]

REPORT_EVERY: Final = 10.0
"""Seconds between two reports of one key's failures."""

_MAX_KEYS = 1024  # failing keys remembered; past it, each one's next failure is a first


class Reports:
    """Which failures of each key (a handler, a plugin and hook) to report.

    ``what`` names a key in the note of how many went unreported ("handler").
    """

    __slots__ = ("_clock", "_last", "_what")

    def __init__(self, what: str, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._what = what
        self._clock = clock
        self._last: dict[Hashable, tuple[float, int]] = {}  # key -> last report, quiet since

    def due(self, key: Hashable) -> str | None:
        """``None``: keep this failure quiet. Else report it, followed by this note.

        The note is empty for a key's first failure (or the first past the
        interval with none kept quiet), else says how many were not reported.
        """
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last[0] < REPORT_EVERY:
            self._last[key] = (last[0], last[1] + 1)
            return None
        if len(self._last) >= _MAX_KEYS:
            self._last.clear()
        self._last[key] = (now, 0)
        if last is None or not last[1]:
            return ""
        return (
            f" (and {last[1]} more failures of this {self._what} since the last report, "
            f"{now - last[0]:g} s ago)"
        )
