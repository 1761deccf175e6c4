"""busd.transport: reading after waiting, writing without a task switch, over real sockets.

What the helpers save (a ``recv`` that fails after a drained read, a yield
after a write that went through at once) is counted here (calls of Trio's
``receive_some`` and of ``os.read``, both still reading) and checked with
Trio's checkpoint assertions; what they must keep is Trio's contract:
the bytes in order, ``b""`` at the end, ``BrokenResourceError`` and
``ClosedResourceError`` where ``receive_some`` and ``send_all`` raise them.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import trio
import trio.testing

from busd.transport import Receiver, send_eagerly, write_now


class Counted:
    """Trio's ``receive_some`` of one stream, counted (it still reads)."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.calls = 0
        self._real = stream.receive_some

    async def __call__(self, max_bytes: int | None = None) -> bytes:
        self.calls += 1
        return await self._real(max_bytes)


@contextmanager
def stream_pair() -> Iterator[tuple[trio.SocketStream, socket.socket, Counted]]:
    """Our Trio stream (its ``receive_some`` counted), and its peer's blocking end."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    stream = trio.SocketStream(trio.socket.from_stdlib_socket(ours))
    counted = Counted(stream)
    stream.receive_some = counted  # type: ignore[method-assign]
    try:
        yield stream, theirs, counted
    finally:
        stream.socket.close()
        theirs.close()


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The descriptors ``os.read`` was called on (it still reads)."""
    seen: list[int] = []
    real = os.read

    def read(fd: int, size: int) -> bytes:
        seen.append(fd)
        return real(fd, size)

    monkeypatch.setattr(os, "read", read)
    return seen


async def test_after_a_short_read_it_waits_for_the_socket_and_then_reads_once(
    reads: list[int],
) -> None:
    with stream_pair() as (stream, theirs, counted):
        receiver = Receiver(stream, size=64)
        theirs.send(b"hello")
        assert await receiver.receive() == b"hello"  # the first: Trio's, which tries first
        assert counted.calls == 1

        async def send_later() -> None:
            await trio.testing.wait_all_tasks_blocked()
            theirs.send(b"world")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send_later)
            with trio.testing.assert_checkpoints():
                assert await receiver.receive() == b"world"
        assert counted.calls == 1  # not Trio's again: it would try a recv that finds nothing
        assert reads == [stream.socket.fileno()]  # one read, once the socket was readable


async def test_after_a_full_read_it_reads_the_rest_without_waiting(reads: list[int]) -> None:
    with stream_pair() as (stream, theirs, counted):
        receiver = Receiver(stream, size=4)
        theirs.send(b"0123456789")
        chunks = [await receiver.receive() for _ in range(3)]
        assert chunks == [b"0123", b"4567", b"89"]
        assert (counted.calls, reads) == (3, [])  # after full reads: Trio's, which tries first
        theirs.send(b"more")
        assert await receiver.receive() == b"more"  # after the short one: waited, then read
        assert len(reads) == 1


async def test_the_end_of_the_stream_is_empty_bytes() -> None:
    with stream_pair() as (stream, theirs, _):
        receiver = Receiver(stream)
        theirs.send(b"last")
        assert await receiver.receive() == b"last"
        theirs.shutdown(socket.SHUT_WR)
        assert await receiver.receive() == b""


async def test_a_connection_reset_while_drained_is_a_broken_resource() -> None:
    with stream_pair() as (stream, theirs, _):
        receiver = Receiver(stream)
        theirs.send(b"x")
        assert await receiver.receive() == b"x"
        await stream.send_all(b"unread")  # the peer closes with this unread: a reset
        theirs.close()
        with pytest.raises(trio.BrokenResourceError):
            await receiver.receive()


async def test_closing_the_stream_while_it_waits_ends_the_wait() -> None:
    with stream_pair() as (stream, theirs, _):
        receiver = Receiver(stream)
        theirs.send(b"x")
        assert await receiver.receive() == b"x"
        async with trio.open_nursery() as nursery:

            async def close_soon() -> None:
                await trio.testing.wait_all_tasks_blocked()
                await stream.aclose()

            nursery.start_soon(close_soon)
            with pytest.raises(trio.ClosedResourceError):
                await receiver.receive()
        # and once closed, it never waits on a descriptor that may be someone else's now
        with pytest.raises(trio.ClosedResourceError):
            await receiver.receive()


async def test_any_other_stream_is_read_with_receive_some() -> None:
    ours, theirs = trio.testing.memory_stream_pair()
    receiver = Receiver(ours, size=3)
    await theirs.send_all(b"abcde")
    assert await receiver.receive() == b"abc"
    assert await receiver.receive() == b"de"
    await theirs.aclose()
    assert await receiver.receive() == b""


async def test_send_eagerly_is_no_checkpoint_when_the_socket_takes_it_all() -> None:
    with stream_pair() as (stream, theirs, _):
        with trio.testing.assert_no_checkpoints():
            await send_eagerly(stream, b"frame")
        assert theirs.recv(64) == b"frame"


async def test_send_eagerly_waits_for_what_the_socket_cannot_take_yet() -> None:
    with stream_pair() as (stream, theirs, _):
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        data = bytes(range(256)) * 4096  # 1 MiB: far more than the buffers hold
        received = bytearray()

        async def drain() -> None:
            theirs.setblocking(False)
            while len(received) < len(data):
                await trio.lowlevel.wait_readable(theirs)
                received.extend(theirs.recv(1 << 16))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(drain)
            with trio.testing.assert_checkpoints():
                await send_eagerly(stream, data)
        assert received == data


async def test_write_now_takes_what_fits_and_says_so() -> None:
    with stream_pair() as (stream, theirs, _):
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        big = b"x" * (1 << 20)
        first = write_now(stream, big)
        assert 0 < first < len(big)
        assert write_now(stream, big) == 0  # full: nothing, no exception
        theirs.close()
        with pytest.raises(trio.BrokenResourceError):
            write_now(stream, b"after the peer left")
        await stream.aclose()
        with pytest.raises(trio.ClosedResourceError):
            write_now(stream, b"after we closed")


async def test_write_now_leaves_any_other_stream_to_send_all() -> None:
    ours, _theirs = trio.testing.memory_stream_pair()
    assert write_now(ours, b"data") == 0
