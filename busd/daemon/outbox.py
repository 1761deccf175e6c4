"""One connection's outbox: what it has to send, capped in bytes, and the writer that drains it.

Frames are queued already encoded, an ``events`` frame often as its own
head and an array shared with other subscribers (never copied per
subscriber: both go to the kernel in one ``writev``/``sendmsg``). The
writer sends everything queued in one call; while it is parked with nothing
queued, a frame is written to the socket at once (non-blocking) instead of
waking it. Events frames wait for room under the cap (:meth:`Outbox.room`);
replies and errors do not, and past a hard cap the owner is told its client
does not read (``on_overflow``). Each events frame remembers the resume
point that holds if it is never delivered. :func:`close_gracefully` ends
the stream without losing the last frames.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio

__all__ = ["Out", "Outbox", "close_gracefully", "ignore", "start_nothing"]

_IOV_MAX = 1024  # pieces one sendmsg takes (Linux's IOV_MAX)
_CLOSE_TIMEOUT = 1.0  # how long a closing socket may take to drain what its peer still sends
_DRAIN_CHUNK = 65_536


@dataclass(slots=True)
class Out:
    """One encoded frame (or the rest of one) waiting to be written: ``data`` then ``tail``."""

    data: bytes
    since: int | None = None
    """Events frames: the resume point (a ``since_seq``) if this frame is not delivered."""
    reply: bool = False
    partial: bool = False
    """The rest of a frame already partly written: it must go out whole."""
    tail: bytes | memoryview = b""
    """The rest of the frame when it is shared with other connections (an events array)."""

    @property
    def size(self) -> int:
        return len(self.data) + len(self.tail)

    def rest(self, written: int) -> Out:
        """What is left after ``written`` bytes of it went out."""
        head = len(self.data)
        if written < head:
            return Out(self.data[written:], self.since, self.reply, True, self.tail)
        # A view, not a copy: a big shared array half written to a full socket
        # would otherwise be copied once per subscriber that is behind.
        return Out(b"", self.since, self.reply, True, memoryview(self.tail)[written - head :])


def ignore(*args: object, **kwargs: object) -> None:
    """The callback of a connection's part once the connection is over (``detach``)."""


def start_nothing(task: Callable[[], Awaitable[object]], what: str) -> bool:
    """A detached part's ``start``: the connection has no scope for tasks any more."""
    return False


class Outbox:
    """Queued frames and the writer task (:meth:`run`) of one connection.

    ``cap`` is what events may fill (queued plus in flight); past
    ``hard_cap`` (a client that asks and asks but never reads) the owner's
    ``on_overflow`` is called. ``on_broken`` is called once when the peer is
    gone. After :meth:`close`, nothing more is queued and the writer ends
    once what is queued is written.
    """

    def __init__(
        self,
        stream: trio.abc.Stream,
        *,
        cap: int,
        hard_cap: int,
        on_overflow: Callable[[], None],
        on_broken: Callable[[], None],
    ) -> None:
        self.stream = stream
        self.cap = cap
        self.hard_cap = hard_cap
        self._on_overflow = on_overflow
        self._on_broken = on_broken
        self._out: deque[Out] = deque()
        self._out_bytes = 0
        self._inflight: list[Out] = []
        self._inflight_bytes = 0
        self.replies = 0
        """Replies queued or being written."""
        self._ready = trio.Event()
        self._progress = trio.Event()  # set whenever the writer has written something
        self.closing = False
        self.done = trio.Event()
        """Set when the writer has ended."""
        # Write-through needs the raw descriptor (a real socket; tests may use memory streams).
        self._fd = stream.socket.fileno() if isinstance(stream, trio.SocketStream) else None
        self._parked = False
        self._overflowed = False

    @property
    def queued_bytes(self) -> int:
        """Bytes queued or being written."""
        return self._out_bytes + self._inflight_bytes

    def fits(self, size: int) -> bool:
        """Whether ``size`` more bytes of events may be queued now (always, when empty)."""
        return not (self._out or self._inflight) or self.queued_bytes + size <= self.cap

    async def room(self, size: int) -> bool:
        """Wait until ``size`` bytes of events fit; ``False`` if the outbox closed meanwhile."""
        while not self.fits(size):
            self._progress = trio.Event()
            await self._progress.wait()
            if self.closing:
                return False
        return not self.closing

    def push(
        self,
        data: bytes,
        tail: bytes | memoryview = b"",
        *,
        since: int | None = None,
        reply: bool = False,
    ) -> None:
        """Queue a frame, ``data`` then ``tail`` (:class:`Out` has the fields' meaning).

        When nothing waits before it, it is written through at once, and an
        :class:`Out` is made only for what the writer must finish: the
        fan-out's path (once per member and batch) makes none.
        """
        if self.closing:
            return
        written = 0
        if self._parked and not self._out and self._fd is not None:
            try:
                written = os.writev(self._fd, (data, tail)) if tail else os.write(self._fd, data)
            except BlockingIOError:
                pass
            except OSError:  # the peer is gone: as the writer does
                self._broke()
                return
            if written == len(data) + len(tail):
                return
        out = Out(data, since, reply, tail=tail)
        if written:
            out = out.rest(written)
        self._out.append(out)
        self._out_bytes += out.size
        if out.reply:
            self.replies += 1
        if self.queued_bytes > self.hard_cap and not self._overflowed:
            self._overflowed = True  # told once: its goodbye is queued here too
            self._on_overflow()
        self._ready.set()

    def undelivered(self) -> list[int]:
        """The resume points of the events frames still queued (not the one half written)."""
        return [o.since for o in self._out if o.since is not None and not o.partial]

    def drop_queued(self) -> None:
        """Forget what is queued, but the rest of a frame already partly written."""
        kept = [o for o in self._out if o.partial]
        self._out.clear()
        self._out.extend(kept)
        self._out_bytes = sum(o.size for o in kept)

    def close(self) -> None:
        """Queue nothing more; the writer ends once what is queued is written."""
        self.closing = True
        self._ready.set()
        self._progress.set()

    def detach(self) -> None:
        """The connection is over: no more write-through, no more callbacks.

        Its descriptor is about to be closed (and maybe reused); its callbacks
        are the connection's methods, a cycle only the garbage collector
        would free otherwise.
        """
        self._fd = None
        self._on_overflow = self._on_broken = ignore

    def _broke(self) -> None:
        if not self.closing:
            self.close()
            self._on_broken()

    async def _send(self, batch: list[Out]) -> None:
        """Write ``batch`` whole: a socket gets its pieces as they are (``sendmsg``)."""
        chunks = [c for o in batch for c in (o.data, o.tail) if c]
        sock = self.stream.socket if isinstance(self.stream, trio.SocketStream) else None
        if sock is None or len(chunks) == 1:
            await self.stream.send_all(chunks[0] if len(chunks) == 1 else b"".join(chunks))
            return
        views = [memoryview(c) for c in chunks]
        start = 0
        while start < len(views):
            try:
                sent = await sock.sendmsg(views[start : start + _IOV_MAX])
            except OSError as exc:  # as SocketStream.send_all says it
                raise trio.BrokenResourceError("the peer is gone") from exc
            while sent:
                view = views[start]
                if sent < len(view):
                    views[start] = view[sent:]
                    break
                sent -= len(view)
                start += 1

    async def run(self) -> None:
        """The writer: drain the outbox until it is closed and empty, or the peer is gone."""
        try:
            while True:
                if not self._out:
                    if self.closing:
                        return
                    self._ready = trio.Event()
                    self._parked = True
                    try:
                        await self._ready.wait()
                    finally:
                        self._parked = False
                    continue
                batch = list(self._out)
                self._out.clear()
                self._inflight = batch
                self._inflight_bytes = self._out_bytes
                self._out_bytes = 0
                try:
                    await self._send(batch)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    self._broke()
                    return
                self.replies -= sum(1 for o in batch if o.reply)
                self._inflight = []
                self._inflight_bytes = 0
                self._progress.set()
        finally:
            self.done.set()


async def close_gracefully(stream: trio.abc.Stream) -> None:
    """Half-close, drain what the peer still sends, then close.

    Closing a Unix socket with unread bytes in it makes the kernel reset the
    connection, and the peer may lose the last frames we wrote (the error
    that says why it is being closed). The drain is bounded (one second).
    """
    with trio.move_on_after(_CLOSE_TIMEOUT):
        try:
            if isinstance(stream, trio.abc.HalfCloseableStream):
                await stream.send_eof()
            while await stream.receive_some(_DRAIN_CHUNK):
                pass
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
    await trio.aclose_forcefully(stream)
