"""The replay ring: the last accepted envelopes, for subscribers that resume from a ``seq``.

A client that reconnects subscribes with ``since_seq``, the last ``seq`` it
received in full; the server answers with :meth:`History.since` and sends
what it returns before any live event. The ring keeps each envelope beside
its msgpack encoding, because the server encodes an envelope once and sends
the same bytes to every subscriber, replays included.

Memory is bounded: the ring holds at most ``capacity`` envelopes and
overwrites the oldest. Finding where a replay starts is a binary search, so
a client that missed ten events does not pay for the hundred thousand the
ring holds. Seqs must increase strictly but may skip (holes are normal on
the wire); a replay reports a gap only for what was *evicted*, never for a
seq the ring was not given.

Pure and I/O-free. The server must call :meth:`History.since` and register
the live subscription without a checkpoint in between, so that no event
falls between the replay and the live stream.
"""

from __future__ import annotations

import operator
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import islice

import msgspec

from .events import Envelope, Event

__all__ = ["History", "HistoryStatistics", "Replay"]


@dataclass(frozen=True, slots=True)
class Replay:
    """What :meth:`History.since` found: held events after ``since_seq``, and what was lost.

    ``envelopes`` and ``raws`` are parallel lists in ``seq`` order: filter on
    the envelope, send the raw bytes. ``gap`` is the inclusive ``(from_seq,
    to_seq)`` range of seqs after ``since_seq`` that were evicted before the
    oldest event returned; send it as a ``gap`` frame before the events.
    When :attr:`ahead` is true, ``since_seq`` is past the head (a client
    numbered by an earlier daemon): nothing is returned and ``gap`` is
    ``None``; the server decides what to tell the client.
    """

    since_seq: int
    head_seq: int
    envelopes: list[Envelope[Event]]
    raws: list[msgspec.Raw]
    gap: tuple[int, int] | None = None

    @property
    def ahead(self) -> bool:
        """``since_seq`` is greater than any ``seq`` this daemon has recorded."""
        return self.since_seq > self.head_seq

    def __len__(self) -> int:
        return len(self.envelopes)


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
    """The last ``capacity`` envelopes and their encodings, in ``seq`` order.

    Three parallel lists grow to ``capacity`` and are then used as a ring:
    ``_next`` is where the next append goes and, once full, the oldest slot.
    While full, slots ``[_next, capacity)`` hold the older run of seqs and
    ``[0, _next)`` the newer one, each sorted, so one :func:`bisect.bisect_right`
    over the right run finds where a replay starts.

    :param capacity: how many envelopes are kept (at least 1).
    :param first_seq: the first ``seq`` this history can be given (at least
        1), as the bus's ``first_seq``; seqs before it count as lost to a
        client that asks for them (they belong to an earlier daemon life).
    """

    __slots__ = (
        "_appended",
        "_base",
        "_capacity",
        "_envelopes",
        "_floor",
        "_head",
        "_next",
        "_raws",
        "_seqs",
    )

    def __init__(self, capacity: int = 100_000, *, first_seq: int = 1) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, not {capacity}")
        if first_seq < 1:
            raise ValueError(f"first_seq must be at least 1, not {first_seq}")
        self._capacity = capacity
        self._seqs: list[int] = []
        self._envelopes: list[Envelope[Event]] = []
        self._raws: list[msgspec.Raw] = []
        self._next = 0
        self._head = first_seq - 1
        self._floor = first_seq - 1  # every seq up to here is lost to replay
        self._appended = 0
        self._base = 0  # the seq of the first append: slot of seq s is (s - _base) % capacity

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def head_seq(self) -> int:
        """The ``seq`` of the newest envelope (``first_seq - 1`` before any)."""
        return self._head

    @property
    def oldest_seq(self) -> int | None:
        """The ``seq`` of the oldest envelope held, ``None`` when empty."""
        seqs = self._seqs
        if not seqs:
            return None
        return seqs[self._next] if len(seqs) == self._capacity else seqs[0]

    def __len__(self) -> int:
        return len(self._seqs)

    def append(self, envelope: Envelope[Event], raw: msgspec.Raw) -> None:
        """Keep ``envelope`` and its encoding ``raw``, overwriting the oldest when full.

        Raises :class:`ValueError` unless ``envelope.seq`` is greater than
        :attr:`head_seq`.
        """
        seq = envelope.seq
        if seq <= self._head:
            raise ValueError(f"seq {seq} is not after the head seq {self._head}")
        self._head = seq
        if not self._appended:
            self._base = seq
        self._appended += 1
        seqs = self._seqs
        if len(seqs) < self._capacity:
            seqs.append(seq)
            self._envelopes.append(envelope)
            self._raws.append(raw)
            return
        i = self._next
        self._floor = seqs[i]
        seqs[i] = seq
        self._envelopes[i] = envelope
        self._raws[i] = raw
        i += 1
        self._next = 0 if i == self._capacity else i

    def extend(self, envelopes: Sequence[Envelope[Event]], raws: Sequence[msgspec.Raw]) -> None:
        """:meth:`append` each envelope with its encoding, a slice of the ring at a time.

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
        if not self._appended:
            self._base = new[0]
        self._appended += count
        self._head = new[-1]
        seqs, capacity = self._seqs, self._capacity
        start = 0
        if len(seqs) < capacity:
            start = min(count, capacity - len(seqs))
            seqs.extend(new[:start])
            self._envelopes.extend(envelopes[:start])
            self._raws.extend(raws[:start])
        while start < count:  # full: overwrite the oldest slots, wrapping at the end
            i = self._next
            stop = min(count, start + capacity - i)
            j = i + stop - start
            self._floor = seqs[j - 1]
            seqs[i:j] = new[start:stop]
            self._envelopes[i:j] = envelopes[start:stop]
            self._raws[i:j] = raws[start:stop]
            self._next = 0 if j == capacity else j
            start = stop

    def raw_of(self, envelope: Envelope[Event]) -> msgspec.Raw | None:
        """The encoding appended with this very envelope, ``None`` if it is not held.

        O(1): the daemon appends every seq, so the slot follows from the seq
        (with gaps the guess misses and this answers ``None``). Identity, not
        the seq, decides: a merged delta is a new envelope with an old seq.
        """
        i = (envelope.seq - self._base) % self._capacity
        envelopes = self._envelopes
        if i < len(envelopes) and envelopes[i] is envelope:
            return self._raws[i]
        return None

    def since(self, seq: int) -> Replay:
        """Every envelope held with a ``seq`` greater than ``seq``, and the gap before them.

        O(log n + k) for k envelopes returned. The gap runs from ``seq + 1``
        to the seq before the oldest one held (to the head when nothing is
        held), and is set only when something after ``seq`` was lost. ``seq``
        is the last one the client has (0: none); a negative one raises
        :class:`ValueError`.
        """
        if seq < 0:
            raise ValueError(f"since_seq must be at least 0, not {seq}")
        head = self._head
        if seq >= head:
            return Replay(seq, head, [], [])
        seqs = self._seqs
        gap: tuple[int, int] | None = None
        if seq < self._floor:
            oldest = self.oldest_seq
            gap = (seq + 1, head if oldest is None else oldest - 1)
        envelopes = self._envelopes
        raws = self._raws
        start = self._next
        if start == 0 or len(seqs) < self._capacity:
            i = bisect_right(seqs, seq)
            return Replay(seq, head, envelopes[i:], raws[i:], gap)
        if seq < seqs[0]:  # starts in the older run [start, capacity), then all of [0, start)
            i = bisect_right(seqs, seq, start)
            return Replay(
                seq, head, envelopes[i:] + envelopes[:start], raws[i:] + raws[:start], gap
            )
        i = bisect_right(seqs, seq, 0, start)
        return Replay(seq, head, envelopes[i:start], raws[i:start], gap)

    def statistics(self) -> HistoryStatistics:
        held = len(self._seqs)
        return HistoryStatistics(
            held=held,
            capacity=self._capacity,
            appended=self._appended,
            evicted=self._appended - held,
            head_seq=self._head,
            oldest_seq=self.oldest_seq,
        )
