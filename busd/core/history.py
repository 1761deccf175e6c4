"""The replay ring: the last accepted events' bytes, for subscribers that resume from a ``seq``.

A client that reconnects subscribes with ``since_seq``, the last ``seq`` it
received in full; the server answers with :meth:`History.since` and sends
what it returns before any live event. The ring keeps each event's msgpack
encoding, the bytes the server sent to every subscriber, so a replay sends
the same bytes again.

Memory is bounded: the ring holds at most ``capacity`` events and
overwrites the oldest. Finding where a replay starts is a binary search, so
a client that missed ten events does not pay for the hundred thousand the
ring holds. Seqs must increase strictly but may skip (holes are normal on
the wire); a replay reports a gap only for what was *evicted*, never for a
seq the ring was not given.

The bytes are kept in pages of about 64 KiB, with each slot's seq and
offsets in arrays: the ring holds no Python object per event. It used to
hold the envelope, its event and the encoding of each; a hundred thousand
such objects, replaced in turn, made every allocation of the daemon slower
the longer it ran (docs/performance.md, "The replay ring as bytes"). Only
the last :data:`RECENT` envelopes are kept, for :meth:`History.raw_of`.

Pure and I/O-free. The server must call :meth:`History.since` and register
the live subscription without a checkpoint in between, so that no event
falls between the replay and the live stream.
"""

from __future__ import annotations

import operator
from array import array
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate, islice
from typing import Final

import msgspec

from .events import Envelope, Event

__all__ = ["RECENT", "STRETCH", "History", "HistoryStatistics", "Replay"]

RECENT: Final = 8192
"""Envelopes kept by identity for :meth:`History.raw_of` (a slow subscriber's batch)."""

STRETCH: Final = 32
"""Events appended before they go into the ring together: each burst of a few
deltas paid the ring's fixed cost (docs/performance.md, "A shorter path in
Python"). Every read takes what waits first, so no reader sees the difference."""

_PAGE = 1 << 16  # bytes a page takes before the next one starts


class Replay:
    """What :meth:`History.since` found: held events after ``since_seq``, and what was lost.

    A snapshot, taken in O(k) copies of offsets (no decoding): the events'
    bytes are cut from the ring's pages when read, :meth:`chunks` at a time,
    so a server can send a long replay without stopping for all of it. The
    bytes are the envelopes as they were sent. ``gap`` is the inclusive
    ``(from_seq, to_seq)`` range of seqs after ``since_seq`` that were
    evicted before the oldest event returned; send it as a ``gap`` frame
    before the events. When :attr:`ahead` is true, ``since_seq`` is past the
    head (a client numbered by an earlier daemon): nothing is returned and
    ``gap`` is ``None``; the server decides what to tell the client.
    """

    __slots__ = ("_ends", "_pages", "_seqs", "_starts", "gap", "head_seq", "since_seq")

    def __init__(
        self,
        since_seq: int,
        head_seq: int,
        gap: tuple[int, int] | None = None,
        slots: tuple[array[int], list[bytearray], array[int], array[int]] | None = None,
    ) -> None:
        self.since_seq = since_seq
        self.head_seq = head_seq
        self.gap = gap
        self._seqs, self._pages, self._starts, self._ends = slots or (
            array("q"),
            [],
            array("Q"),
            array("Q"),
        )

    @property
    def ahead(self) -> bool:
        """``since_seq`` is greater than any ``seq`` this daemon has recorded."""
        return self.since_seq > self.head_seq

    @property
    def seqs(self) -> list[int]:
        return self._seqs.tolist()

    @property
    def raws(self) -> list[msgspec.Raw]:
        """Every event's bytes at once (:meth:`chunks` reads them a part at a time)."""
        return self._cut(0, len(self._seqs))

    def chunks(self, size: int) -> Iterator[tuple[list[int], list[msgspec.Raw]]]:
        """The seqs and bytes, ``size`` events at a time."""
        for start in range(0, len(self._seqs), size):
            stop = min(start + size, len(self._seqs))
            yield self._seqs[start:stop].tolist(), self._cut(start, stop)

    def _cut(self, start: int, stop: int) -> list[msgspec.Raw]:
        pages, starts, ends = self._pages, self._starts, self._ends
        return [msgspec.Raw(pages[k][starts[k] : ends[k]]) for k in range(start, stop)]

    def __len__(self) -> int:
        return len(self._seqs)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Replay):
            return NotImplemented
        return (self.since_seq, self.head_seq, self.gap, self._seqs, self.raws) == (
            other.since_seq,
            other.head_seq,
            other.gap,
            other._seqs,
            other.raws,
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"Replay(since_seq={self.since_seq}, head_seq={self.head_seq}, "
            f"seqs={self.seqs!r}, gap={self.gap!r})"
        )


@dataclass(frozen=True, slots=True)
class HistoryStatistics:
    held: int
    capacity: int
    appended: int
    """Envelopes appended over the lifetime."""
    evicted: int
    """Envelopes overwritten to make room (``appended - held``)."""
    head_seq: int
    oldest_seq: int | None


class History:
    """The last ``capacity`` events' encodings, in ``seq`` order.

    Parallel rings grow to ``capacity`` and are then used as one ring: a
    slot's seq, its page and its offsets in the page. ``_next`` is where the
    next append goes and, once full, the oldest slot. While full, slots
    ``[_next, capacity)`` hold the older run of seqs and ``[0, _next)`` the
    newer one, each sorted, so one :func:`bisect.bisect_right` over the
    right run finds where a replay starts. A page is a ``bytearray`` that
    encodings are added to until it is full; it goes when no slot is in it.

    :param capacity: how many events are kept (at least 1).
    :param first_seq: the first ``seq`` this history can be given (at least
        1), as the bus's ``first_seq``; seqs before it count as lost to a
        client that asks for them (they belong to an earlier daemon life).
    """

    __slots__ = (
        "_appended",
        "_base",
        "_capacity",
        "_ends",
        "_floor",
        "_head",
        "_next",
        "_page",
        "_pages",
        "_recent",
        "_recent_raws",
        "_seqs",
        "_starts",
        "_unkept",
        "_unkept_raws",
    )

    def __init__(self, capacity: int = 100_000, *, first_seq: int = 1) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, not {capacity}")
        if first_seq < 1:
            raise ValueError(f"first_seq must be at least 1, not {first_seq}")
        self._capacity = capacity
        self._seqs = array("q")
        self._pages: list[bytearray] = []
        self._starts = array("Q")
        self._ends = array("Q")
        self._page = bytearray()
        recent = min(capacity, RECENT)
        self._recent: list[Envelope[Event] | None] = [None] * recent
        self._recent_raws: list[msgspec.Raw | None] = [None] * recent
        self._next = 0
        self._head = first_seq - 1
        self._floor = first_seq - 1  # every seq up to here is lost to replay
        self._appended = 0
        self._base = 0  # the first seq appended: seq s is in recent slot (s - _base) % len(_recent)
        self._unkept: list[Envelope[Event]] = []  # appended, not in the ring yet (STRETCH)
        self._unkept_raws: list[msgspec.Raw] = []

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def head_seq(self) -> int:
        """The ``seq`` of the newest event (``first_seq - 1`` before any)."""
        return self._head

    @property
    def oldest_seq(self) -> int | None:
        """The ``seq`` of the oldest event held, ``None`` when empty."""
        if self._unkept:
            self._keep()
        seqs = self._seqs
        if not seqs:
            return None
        return seqs[self._next] if len(seqs) == self._capacity else seqs[0]

    def __len__(self) -> int:
        if self._unkept:
            self._keep()
        return len(self._seqs)

    def append(self, envelope: Envelope[Event], raw: msgspec.Raw) -> None:
        """Keep ``envelope``'s encoding ``raw``, overwriting the oldest when full.

        Raises :class:`ValueError` unless ``envelope.seq`` is greater than
        :attr:`head_seq`.
        """
        seq = envelope.seq
        if seq <= self._head:
            raise ValueError(f"seq {seq} is not after the head seq {self._head}")
        self._head = seq
        self._unkept.append(envelope)
        self._unkept_raws.append(raw)
        if len(self._unkept) >= STRETCH:
            self._keep()

    def extend(self, envelopes: Sequence[Envelope[Event]], raws: Sequence[msgspec.Raw]) -> None:
        """:meth:`append` each event with its encoding.

        For a run the bus sequenced at once. Raises :class:`ValueError`, and
        keeps nothing, unless the seqs increase strictly from after :attr:`head_seq`.
        """
        count = len(envelopes)
        if count != len(raws):
            raise ValueError(f"{count} envelopes but {len(raws)} encodings")
        if not count:
            return
        new = [envelope.seq for envelope in envelopes]
        if new[0] <= self._head:
            raise ValueError(f"seq {new[0]} is not after the head seq {self._head}")
        if not all(map(operator.lt, new, islice(new, 1, None))):
            raise ValueError(f"seqs {new[0]}..{new[-1]} do not increase")
        self._head = new[-1]
        unkept = self._unkept
        unkept += envelopes
        self._unkept_raws += raws
        if len(unkept) >= STRETCH:
            self._keep()

    def _keep(self) -> None:
        """Put the events appended since the last time into the ring, a slice at a time."""
        envelopes, raws = self._unkept, self._unkept_raws
        self._unkept, self._unkept_raws = [], []
        new = [envelope.seq for envelope in envelopes]
        count = len(new)
        if not self._appended:
            self._base = new[0]
        self._appended += count
        self._remember(new, envelopes, raws)
        page = self._page
        if len(page) >= _PAGE:
            page = self._page = bytearray()
        bounds = list(accumulate(map(len, raws), initial=len(page)))
        page += b"".join(raws)
        seqs, capacity = self._seqs, self._capacity
        start = 0
        if len(seqs) < capacity:
            start = min(count, capacity - len(seqs))
            seqs.extend(new[:start])
            self._pages.extend([page] * start)
            self._starts.extend(bounds[:start])
            self._ends.extend(bounds[1 : start + 1])
        while start < count:  # full: overwrite the oldest slots, wrapping at the end
            i = self._next
            stop = min(count, start + capacity - i)
            j = i + stop - start
            self._floor = seqs[j - 1]
            seqs[i:j] = array("q", new[start:stop])
            self._pages[i:j] = [page] * (stop - start)
            self._starts[i:j] = array("Q", bounds[start:stop])
            self._ends[i:j] = array("Q", bounds[start + 1 : stop + 1])
            self._next = 0 if j == capacity else j
            start = stop

    def _remember(
        self, seqs: list[int], envelopes: Sequence[Envelope[Event]], raws: Sequence[msgspec.Raw]
    ) -> None:
        """The last :data:`RECENT` envelopes of a run, in their slots for :meth:`raw_of`."""
        recent, recent_raws, size = self._recent, self._recent_raws, len(self._recent)
        skip = max(0, len(seqs) - size)  # a run longer than the ring: its end only
        if seqs[-1] - seqs[skip] != len(seqs) - 1 - skip:  # seqs skip: slot by slot
            for k in range(skip, len(seqs)):
                r = (seqs[k] - self._base) % size
                recent[r] = envelopes[k]
                recent_raws[r] = raws[k]
            return
        k = skip
        while k < len(seqs):  # contiguous slots, wrapping at the end
            r = (seqs[k] - self._base) % size
            stop = min(len(seqs), k + size - r)
            recent[r : r + stop - k] = envelopes[k:stop]
            recent_raws[r : r + stop - k] = raws[k:stop]
            k = stop

    def raw_of(self, envelope: Envelope[Event]) -> msgspec.Raw | None:
        """The encoding appended with this very envelope, ``None`` if it is not among the recent.

        O(1): the daemon appends every seq, so the slot follows from the seq
        (with gaps the guess misses and this answers ``None``). Identity, not
        the seq, decides: a merged delta is a new envelope with an old seq.
        Only the last :data:`RECENT` envelopes are kept: for an older one the
        caller encodes it again.
        """
        if self._unkept:
            self._keep()
        recent = self._recent
        r = (envelope.seq - self._base) % len(recent)
        if recent[r] is envelope:
            return self._recent_raws[r]
        return None

    def _slots(self, i: int, j: int) -> tuple[array[int], list[bytearray], array[int], array[int]]:
        return self._seqs[i:j], self._pages[i:j], self._starts[i:j], self._ends[i:j]

    def since(self, seq: int) -> Replay:
        """Every event held with a ``seq`` greater than ``seq``, and the gap before them.

        O(log n + k) for k events returned, in copies of their offsets (the
        pages are shared: appends only add to them). The gap runs from
        ``seq + 1`` to the seq before the oldest one held (to the head when
        nothing is held), and is set only when something after ``seq`` was
        lost. ``seq`` is the last one the client has (0: none); a negative
        one raises :class:`ValueError`.
        """
        if seq < 0:
            raise ValueError(f"since_seq must be at least 0, not {seq}")
        if self._unkept:
            self._keep()
        head = self._head
        if seq >= head:
            return Replay(seq, head)
        seqs = self._seqs
        gap: tuple[int, int] | None = None
        if seq < self._floor:
            oldest = self.oldest_seq
            gap = (seq + 1, head if oldest is None else oldest - 1)
        start = self._next
        if start == 0 or len(seqs) < self._capacity:
            i = bisect_right(seqs, seq)
            return Replay(seq, head, gap, self._slots(i, len(seqs)))
        if seq < seqs[0]:  # starts in the older run [start, capacity), then all of [0, start)
            i = bisect_right(seqs, seq, start)
            older, newer = self._slots(i, len(seqs)), self._slots(0, start)
            joined = (
                older[0] + newer[0],
                older[1] + newer[1],
                older[2] + newer[2],
                older[3] + newer[3],
            )
            return Replay(seq, head, gap, joined)
        i = bisect_right(seqs, seq, 0, start)
        return Replay(seq, head, gap, self._slots(i, start))

    def statistics(self) -> HistoryStatistics:
        if self._unkept:
            self._keep()
        held = len(self._seqs)
        return HistoryStatistics(
            held=held,
            capacity=self._capacity,
            appended=self._appended,
            evicted=self._appended - held,
            head_seq=self._head,
            oldest_seq=self.oldest_seq,
        )
