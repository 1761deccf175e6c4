"""Acknowledged publishes: a connection's ``ack`` answered once the journal holds its events.

A ``publish`` or ``ingest`` frame with ``ack: ID`` gets one ``reply`` with
that id: ``ok`` once every event this connection has published (in this
frame and all before it) is in the journal, or a failed reply
``not_journaled`` when some of them are not and will not be (lost), or the
disk fails now. Without a journal the reply comes at once, ``journaled:
false``. Each waiting ack is a task in its connection's nursery, so it ends
with the connection. docs/journal.md has the durability levels.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from functools import partial
from typing import Any

import trio

from ..wire import NOT_JOURNALED, TOO_MANY_REQUESTS, ErrorInfo, Ingest, Publish, Reply
from .hub import Daemon
from .journal import Journal, NotJournaled, Published
from .outbox import ignore, start_nothing

__all__ = ["Acks"]


class Acks:
    """One connection's published seqs and the acks that wait for the journal."""

    def __init__(
        self,
        daemon: Daemon,
        queue: Callable[..., None],
        start: Callable[[Callable[[], Awaitable[object]], str], bool],
    ) -> None:
        self._daemon = daemon
        self._queue = queue  # the connection's: queue(frame, reply=True)
        self._start = start  # the connection's: a guarded task in its scope; False if none

        self._published = Published()
        self._waiting = 0
        self._answered = trio.Event()  # set whenever no ack waits
        self._answered.set()

    def detach(self) -> None:
        """The connection is over: keep none of its methods (a cycle left to the collector)."""
        self._queue = ignore
        self._start = start_nothing

    async def around(self, frame: Publish[Any], publish: Coroutine[Any, Any, None]) -> None:
        """Await ``publish`` (the frame's publishing), note the seqs it made, answer its ``ack``."""
        first = self._before(frame)
        if first is None:
            publish.close()
            return
        try:
            await publish
        finally:
            self._after(frame, first)

    def around_sync(self, frame: Ingest, ingest: Callable[[Ingest], None]) -> None:
        """:meth:`around` for an ``ingest`` frame, translated and published synchronously."""
        first = self._before(frame)
        if first is None:
            return
        try:
            ingest(frame)
        finally:
            self._after(frame, first)

    def _before(self, frame: Publish[Any] | Ingest) -> int | None:
        """The first seq the frame may get; ``None``: refused whole (too many acks waiting)."""
        limit = self._daemon.config.max_requests
        if frame.ack is not None and self._waiting >= limit:
            message = f"more than {limit} acks are waiting for the journal"
            self._reply(frame.ack, error=ErrorInfo(code=TOO_MANY_REQUESTS, message=message))
            return None
        return self._daemon.bus.head_seq + 1

    def _after(self, frame: Publish[Any] | Ingest, first: int) -> None:
        self._published.add(first, self._daemon.bus.head_seq)
        if frame.ack is not None:
            self._answer(frame.ack)

    def _reply(self, ack: int, *, result: Any = None, error: ErrorInfo | None = None) -> None:
        self._queue(Reply(id=ack, ok=error is None, result=result, error=error), reply=True)

    def _answer(self, ack: int) -> None:
        ranges = list(self._published.ranges)
        journal = self._daemon.journal
        result = {
            "first_seq": ranges[0][0] if ranges else None,
            "last_seq": ranges[-1][1] if ranges else None,
            "journaled": journal is not None,
        }
        if journal is None or not ranges:
            self._reply(ack, result=result)
            return
        wait = partial(self._wait, journal, ack, ranges, result)
        if not self._start(wait, "waiting for the journal"):
            self._reply(ack, result=result)
            return
        if not self._waiting:
            self._answered = trio.Event()
        self._waiting += 1

    async def _wait(
        self, journal: Journal, ack: int, ranges: list[tuple[int, int]], result: dict[str, Any]
    ) -> None:
        try:
            await journal.durable(ranges)
            self._reply(ack, result=result)
        except NotJournaled as exc:
            self._reply(ack, error=ErrorInfo(code=NOT_JOURNALED, message=str(exc)))
        finally:
            self._waiting -= 1
            if not self._waiting:
                self._answered.set()

    async def answered(self) -> None:
        """Return once no ack waits (a goodbye lets them answer first)."""
        await self._answered.wait()

    @property
    def waiting(self) -> int:
        return self._waiting
