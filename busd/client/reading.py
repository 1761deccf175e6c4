"""The incoming side of a connection: which task reads the socket, and where each frame goes.

A subscriber's task waits in ``__anext__`` for its next batch. If the
client's reader task read every frame and handed the batch over, each batch
would cost two task steps: the reader's, then one more pass of Trio's run
loop for the subscriber (about 11.5 µs of CPU, docs/performance.md). So the
task that waits reads (a leader/follower handoff): an iterator with nothing
queued and nobody else reading does the read itself, routes every frame it
finds (its own batches, other subscriptions', replies, pongs), and returns
once its own channel holds one. The reader task steps aside while iterators
lead and reads whenever someone else waits: a reply, a pong, the goodbye
at close, an iterator that could not lead, a batch for a full channel. And
when no iterator has read for ``QUIET`` seconds, so a goodbye or a lost
connection is still noticed while the application is busy elsewhere.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from typing import Protocol

import trio

from ..transport import Receiver
from ..wire import Events, Gap, ProtocolError
from ..wire.codec import ServerFrameDecoder
from .errors import Batch, ConnectionLost

__all__ = ["Inbox", "Mailbox"]

logger = logging.getLogger("busd.client")

RECEIVE = 65_536  # bytes a read asks for
QUIET = 0.05  # seconds without an iterator's read before the reader task reads again


class Mailbox(Protocol):
    """Where the inbox routes a subscription's batches (``ClientSubscription``)."""

    def _offer(self, batch: Batch) -> bool:
        """Queue ``batch`` if there is room: False when full."""

    async def _deliver(self, batch: Batch) -> None:
        """Queue ``batch``, waiting for room."""


class Inbox:
    """One connection's frames from the daemon: who reads them, and where they go.

    At most one task reads at a time (``_busy``), the reader task or an
    iterator; frames are routed in the order they came, whoever read them.
    A batch for a full channel is held, and only the reader task, which may
    wait for room, delivers it; nobody reads further until it has.
    """

    def __init__(
        self,
        stream: trio.SocketStream,
        decoder: ServerFrameDecoder,
        *,
        subs: Mapping[int, Mailbox],
        handle: Callable[[object], ConnectionLost | None],
        needed: Callable[[], bool],
    ) -> None:
        self._subs = subs
        self._handle = handle  # every frame but a batch; a lost connection, if it says so
        self._receiver = Receiver(stream, RECEIVE)
        self._decoder = decoder
        self._needed = needed  # someone waits for a frame no iterator's read is sure to bring
        self._held: tuple[Mailbox, Batch] | None = None
        self._lost: ConnectionLost | None = None
        self._busy = False  # a task reads the socket, or waits to
        self._led = False  # iterators read: the reader task steps aside
        self._leads = 0  # reads iterators began: the reader task's sign of life
        self._wake = trio.Event()
        self._parked: trio.CancelScope | None = None

    def nudge(self) -> None:
        """Someone now waits for a frame: the reader task reads, unless another task already is."""
        if not self._busy:
            self._wake.set()

    async def read_for_iterator(self) -> bool:
        """One read, and the routing of its frames, in the calling task; False if it may not.

        It may not while another task reads, a batch is held for the reader
        task, or the connection is lost: then it waits for the task that
        reads, as before.
        """
        self._led = True
        if self._busy or self._held is not None or self._lost is not None:
            return False
        self._leads += 1
        try:
            lost = await self._read()
            if lost is None:
                lost = self._route()
            if lost is not None:
                self._lost = lost
        finally:  # cancelled too: whoever waits must not depend on this task any more
            if self._lost is not None or self._held is not None or self._needed():
                self._wake.set()
            elif (parked := self._parked) is not None and parked.deadline == math.inf:
                parked.deadline = trio.current_time() + QUIET
        return True

    async def run(self) -> ConnectionLost:
        """The reader task: read whenever no iterator does; return why the connection ended."""
        while True:
            if (held := self._held) is not None:
                await held[0]._deliver(held[1])
                self._held = None
            if self._lost is not None:
                return self._lost
            if (lost := self._route()) is not None:
                return lost
            if self._held is not None:
                continue
            if self._busy or (self._led and not self._needed()):
                await self._step_aside()
                continue
            if (lost := await self._read()) is not None:
                return lost

    async def _step_aside(self) -> None:
        """Wait until woken, or until no iterator has read for ``QUIET`` (then read again)."""
        leads = self._leads
        self._wake = trio.Event()
        # While an iterator reads it wakes this task if need be; the clock runs once it stops.
        deadline = math.inf if self._busy else trio.current_time() + QUIET
        with trio.CancelScope(deadline=deadline) as parked:
            self._parked = parked
            await self._wake.wait()
        self._parked = None
        if parked.cancelled_caught and not self._busy and self._leads == leads:
            self._led = False

    async def _read(self) -> ConnectionLost | None:
        self._busy = True
        try:
            data = await self._receiver.receive()
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            return ConnectionLost("closed", str(exc))
        finally:
            self._busy = False
        if not data:
            return ConnectionLost("closed", "the daemon closed the connection")
        self._decoder.feed(data)
        return None

    def _route(self) -> ConnectionLost | None:
        """Route every frame read so far, without waiting; a batch for a full channel is held."""
        subs = self._subs
        while True:
            try:
                for frame in self._decoder:
                    match frame:  # events first: nearly every frame a subscriber reads
                        case Events(sub=sub_id, events=events):
                            batch = Batch(events)
                        case Gap(sub=sub_id, from_seq=first, to_seq=last):
                            batch = Batch([], (first, last))
                        case _:
                            if (lost := self._handle(frame)) is not None:
                                return lost
                            continue
                    if (sub := subs.get(sub_id)) is not None and not sub._offer(batch):
                        self._held = (sub, batch)
                        return None
                return None
            except ProtocolError as exc:
                if exc.fatal:
                    return ConnectionLost(exc.code, exc.message)
                logger.warning("bad frame from the daemon: %s", exc)
