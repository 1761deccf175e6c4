"""What waits to go out: a bounded queue that drops its oldest, and per-session lanes.

The :class:`Outbox` is filled by a bus handler, which must never block, so
when NATS is unreachable for long it drops the *oldest* events past its
bound and counts them (a gap is reported; what is sent stays in order). The
:class:`Lanes` are the publisher's: one FIFO per session, at most one event
of a lane in flight, lanes served round-robin. Sans-I/O, no locks: each
lives on one thread.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import NamedTuple

__all__ = ["Lanes", "Outbox", "Outgoing"]


class Outgoing(NamedTuple):
    """One event on its way to JetStream."""

    id: str
    """The event id: the ``Nats-Msg-Id`` JetStream de-duplicates by."""
    subject: str
    payload: bytes
    lane: str | None
    """Its session: events of one lane are stored in the order given."""


class Outbox:
    """A FIFO of at most ``capacity`` events; over it, the oldest go (counted)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: deque[Outgoing] = deque()
        self.dropped_total = 0
        self._dropped = 0

    def __len__(self) -> int:
        return len(self._items)

    def put(self, item: Outgoing) -> None:
        items = self._items
        if len(items) >= self.capacity:
            items.popleft()
            self._dropped += 1
            self.dropped_total += 1
        items.append(item)

    def take(self, limit: int) -> list[Outgoing]:
        """Up to ``limit`` events, oldest first."""
        items = self._items
        return [items.popleft() for _ in range(min(limit, len(items)))]

    def restore(self, items: list[Outgoing]) -> None:
        """Put back ``items`` (taken earlier, oldest first) ahead of everything else."""
        self._items.extendleft(reversed(items))

    def take_dropped(self) -> int:
        """How many were dropped since the last call."""
        dropped, self._dropped = self._dropped, 0
        return dropped


class Lanes:
    """Per-lane FIFOs, each with at most one event out; :meth:`next` gives the next to send."""

    def __init__(self) -> None:
        self._lanes: dict[str | None, deque[Outgoing]] = {}
        self._runnable: deque[str | None] = deque()
        self._size = 0

    def __len__(self) -> int:
        """Events held, the ones in flight included."""
        return self._size

    def add(self, items: Iterable[Outgoing]) -> int:
        """Queue ``items``; returns how many lanes became ready to send."""
        lanes = self._lanes
        ready = 0
        for item in items:
            queue = lanes.get(item.lane)
            if queue is None:
                queue = lanes[item.lane] = deque()
                self._runnable.append(item.lane)
                ready += 1
            queue.append(item)
            self._size += 1
        return ready

    def next(self) -> Outgoing | None:
        """The head of the next lane with none in flight (it is in flight from now on)."""
        if not self._runnable:
            return None
        return self._lanes[self._runnable.popleft()][0]

    def done(self, item: Outgoing) -> bool:
        """``item`` (a lane's head, from :meth:`next`) is stored; True: its lane goes on."""
        queue = self._lanes[item.lane]
        queue.popleft()
        self._size -= 1
        if queue:
            self._runnable.append(item.lane)
            return True
        del self._lanes[item.lane]
        return False
