"""Retention's rounds on the running journal: pruning steps with the writes between them.

A full journal's prune takes seconds; each step is short and runs in a
worker thread, and what was published meanwhile is written between two
steps (the 50 ms bound holds). The :class:`~.journal.Journal` owns the
file and says how to use it (``in_thread``) and how to write (``between``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Final, Protocol, TypeVar

from .journalfile import JournalFile, Retention

__all__ = ["ROUNDS", "InThread", "Tally", "prune_rounds"]

logger = logging.getLogger("busd.journal")

_T = TypeVar("_T")

ROUNDS: Final = 5  # retention passes at most, each on the size the last one left


class InThread(Protocol):
    """Runs a job on the file in a worker thread, with the file to itself."""

    async def __call__(self, fn: Callable[[], _T], /) -> _T: ...


class Tally(Protocol):
    """The journal's counts that retention moves."""

    floor: int  # every seq up to it is gone
    events: int
    bytes: int


async def prune_rounds(
    file: JournalFile,
    retention: Retention,
    when: float,
    tally: Tally,
    *,
    in_thread: InThread,
    between: Callable[[], Awaitable[object]],
) -> int:
    """Remove what ``retention`` lets go at ``when`` (epoch seconds); the events removed.

    Size is estimated from the average event, so a few rounds may be needed.
    Raises :class:`sqlite3.Error` as the file does.
    """
    removed = 0
    for again in range(ROUNDS):
        target = await in_thread(partial(file.prune_target, retention, when, again=again > 0))
        if target <= tally.floor:
            break
        while target > tally.floor:
            floor, count = await in_thread(partial(file.prune_step, target))
            tally.floor = floor
            tally.events -= count
            removed += count
            await between()
        left: int | None = None
        while True:  # until no page is left, or a file without auto_vacuum gives none
            was, left = left, await in_thread(partial(file.vacuum_step, retention))
            if left in (0, was):
                break
            await between()
        tally.bytes = await in_thread(file.checkpoint)
    if removed:
        logger.info("journal retention removed %d events (up to seq %d)", removed, tally.floor)
    return removed
