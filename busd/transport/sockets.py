"""Read a socket after waiting when it was drained, and write to it without a task switch.

Trio's ``SocketStream.receive_some`` always tries ``recv`` first and waits
only when that fails: right when the socket has data, but at a steady rate
it was drained by the previous read, so every wake-up pays a ``recv`` that
fails and the exception's path through Trio. ``send_all`` yields to the
scheduler after a write that succeeded at once. Both are the right default
for a general stream and a measurable share of a burst's CPU in every busd
process (``contrib/bench/bench_wake.py``); these helpers keep Trio's
semantics (a read or write is a checkpoint, or follows one) without them.
"""

from __future__ import annotations

import os

import trio

__all__ = ["Receiver", "send_eagerly", "write_now"]


class Receiver:
    """Reads a stream in chunks of up to ``size`` bytes; waits first when the last read drained it.

    A read that returned less than ``size`` emptied the socket's buffer, so
    the next one waits for it to be readable before reading (no ``recv``
    that fails); after a full read, more may be there, and the read is
    Trio's (try first, then a checkpoint). Any other stream (a memory
    stream in a test) is read with ``receive_some``. Raises what
    ``receive_some`` raises: ``trio.BrokenResourceError`` when the
    connection breaks, ``trio.ClosedResourceError`` when the stream was
    closed (before or while waiting); ``b""`` is the end of the stream.
    """

    __slots__ = ("_drained", "_socket", "_stream", "size")

    def __init__(self, stream: trio.abc.ReceiveStream, size: int = 65_536) -> None:
        self._stream = stream
        self._socket = stream.socket if isinstance(stream, trio.SocketStream) else None
        self._drained = False
        self.size = size

    async def receive(self) -> bytes:
        """The next chunk of bytes, ``b""`` at the end of the stream."""
        sock = self._socket
        if sock is None or not self._drained:
            data = bytes(await self._stream.receive_some(self.size))
        else:
            while True:
                fd = sock.fileno()  # -1 once closed: never a descriptor reused meanwhile
                if fd < 0:
                    raise trio.ClosedResourceError("the stream was closed")
                await trio.lowlevel.wait_readable(fd)
                try:
                    data = os.read(fd, self.size)
                    break
                except BlockingIOError:  # woken, yet someone was faster: wait again
                    continue
                except OSError as exc:
                    raise trio.BrokenResourceError(f"the connection broke: {exc}") from exc
        self._drained = len(data) < self.size
        return data


def write_now(stream: trio.abc.SendStream, data: bytes | bytearray | memoryview) -> int:
    """Write what the socket takes at once, without waiting or yielding: the bytes written.

    0 when its buffer is full, or ``stream`` is no socket (then it is all
    for ``send_all``). Raises ``trio.BrokenResourceError`` when the peer is
    gone and ``trio.ClosedResourceError`` when the stream was closed. Not a
    checkpoint: the caller's loop must have one (its wait for more to send).
    """
    if not isinstance(stream, trio.SocketStream):
        return 0
    fd = stream.socket.fileno()
    if fd < 0:
        raise trio.ClosedResourceError("the stream was closed")
    try:
        return os.write(fd, data)
    except BlockingIOError:
        return 0
    except OSError as exc:
        raise trio.BrokenResourceError(f"the connection broke: {exc}") from exc


async def send_eagerly(stream: trio.abc.SendStream, data: bytes | bytearray) -> None:
    """``stream.send_all(data)``, without the task switch when the socket takes it all at once.

    Not a checkpoint then (Trio's ``send_all`` always is): for a writer task
    whose loop has one, its wait for more to send.
    """
    written = write_now(stream, data)
    if written < len(data):
        await stream.send_all(memoryview(data)[written:])
