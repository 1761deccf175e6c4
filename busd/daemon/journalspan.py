"""Resuming from the journal: what a span of seqs holds, read in pages, as items to send.

:meth:`~.journal.Journal.span` captures a span synchronously (the file up
to the journaled watermark, then what waits in memory);
:meth:`JournalSpan.read` reads it later, in worker threads, with a gap for
anything neither holds.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TypeAlias

import msgspec
import trio

from ..core.events import Envelope, Event
from .journalfile import PAGE_ROWS, JournalError, JournalReader, Page

__all__ = [
    "EnvelopeFilter",
    "Found",
    "Item",
    "JournalSpan",
    "Missing",
    "RowFilter",
    "memory_items",
    "page_items",
]

logger = logging.getLogger("busd.journal")


@dataclass(frozen=True, slots=True)
class Found:
    """Events to send, in seq order."""

    seqs: list[int]
    raws: list[msgspec.Raw]


@dataclass(frozen=True, slots=True)
class Missing:
    """Seqs ``from_seq..to_seq`` (inclusive) that neither the journal nor memory holds."""

    from_seq: int
    to_seq: int


Item: TypeAlias = Found | Missing
RowFilter: TypeAlias = Callable[[str, str | None, str | None, bool], bool]
EnvelopeFilter: TypeAlias = Callable[[Envelope[Event]], bool]


def page_items(cursor: int, page: Page, wants: RowFilter) -> list[Item]:
    """A page as what to send: gaps for pruned and lost seqs, runs of wanted events between."""
    items: list[Item] = []
    end = page.end
    if cursor < page.floor:
        items.append(Missing(cursor + 1, min(page.floor, end)))
        cursor = page.floor
    lost = [(max(a, cursor + 1), min(b, end)) for a, b in page.lost if b > cursor and a <= end]
    seqs: list[int] = []
    raws: list[msgspec.Raw] = []
    i = 0
    for seq, name, session_id, run_id, stale, blob in page.rows:
        if seq <= cursor:
            continue
        while i < len(lost) and lost[i][0] < seq:
            if seqs:
                items.append(Found(seqs, raws))
                seqs, raws = [], []
            items.append(Missing(*lost[i]))
            i += 1
        if wants(name, session_id, run_id, bool(stale)):
            seqs.append(seq)
            raws.append(msgspec.Raw(blob))
    if seqs:
        items.append(Found(seqs, raws))
    items.extend(Missing(*r) for r in lost[i:])
    return items


def memory_items(
    entries: Sequence[tuple[Envelope[Event], msgspec.Raw]],
    lost: Sequence[tuple[int, int]],
    wants: EnvelopeFilter,
) -> list[Item]:
    """Not yet written events and lost ranges, merged in seq order."""
    items: list[Item] = []
    seqs: list[int] = []
    raws: list[msgspec.Raw] = []
    ranges = sorted(lost)
    i = 0
    for envelope, raw in entries:
        while i < len(ranges) and ranges[i][0] < envelope.seq:
            if seqs:
                items.append(Found(seqs, raws))
                seqs, raws = [], []
            items.append(Missing(*ranges[i]))
            i += 1
        if wants(envelope):
            seqs.append(envelope.seq)
            raws.append(raw)
    if seqs:
        items.append(Found(seqs, raws))
    items.extend(Missing(*r) for r in ranges[i:])
    return items


@dataclass(frozen=True, slots=True)
class JournalSpan:
    """Seqs ``after < seq <= upto`` for one resume: from the file up to ``db_upto``, then memory.

    Made synchronously (so nothing can fall between it and the replay ring),
    read later, in worker threads.
    """

    path: Path
    after: int
    db_upto: int
    upto: int
    entries: list[tuple[Envelope[Event], msgspec.Raw]]
    lost: list[tuple[int, int]]

    @classmethod
    def capture(
        cls,
        path: Path,
        after: int,
        upto: int,
        journaled: int,
        queued: tuple[Sequence[Envelope[Event]], Sequence[msgspec.Raw]],
        lost: Sequence[tuple[int, int]],
    ) -> JournalSpan:
        """The span of a journal written up to ``journaled``, with ``queued`` events (and
        their bytes) and ``lost`` ranges in memory, not written yet."""
        db_upto = min(upto, journaled)
        entries = [
            (envelope, raw)
            for envelope, raw in zip(*queued, strict=True)
            if db_upto < envelope.seq <= upto and envelope.seq > after
        ]
        cut = [
            (max(a, db_upto + 1, after + 1), min(b, upto))
            for a, b in lost
            if b > max(db_upto, after) and a <= upto
        ]
        return cls(path, after, db_upto, upto, entries, cut)

    async def read(
        self,
        wants_row: RowFilter,
        wants: EnvelopeFilter,
        *,
        sessions: Sequence[str] | None = None,
        page: int = PAGE_ROWS,
    ) -> AsyncGenerator[Item, None]:
        """What to send, in seq order; a gap for anything the journal cannot give."""
        cursor = self.after
        if cursor < self.db_upto:
            try:
                reader = await trio.to_thread.run_sync(JournalReader, self.path)
            except JournalError as exc:
                logger.error("resume from the journal: %s", exc)
                yield Missing(cursor + 1, self.db_upto)
            else:
                try:
                    while cursor < self.db_upto:
                        try:
                            found = await trio.to_thread.run_sync(
                                partial(
                                    reader.page, cursor, self.db_upto, limit=page, sessions=sessions
                                )
                            )
                        except sqlite3.Error as exc:
                            logger.error("resume from the journal %s: %s", self.path, exc)
                            yield Missing(cursor + 1, self.db_upto)
                            break
                        for item in page_items(cursor, found, wants_row):
                            yield item
                        cursor = found.end
                finally:
                    reader.close()
        for item in memory_items(self.entries, self.lost, wants):
            yield item
