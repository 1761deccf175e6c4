"""Who reads the daemon's socket in the client (issue 20), and what every reader must keep.

A subscription's iterator that waits for a batch reads the socket in its own
task, routing every frame it finds; the client's reader task steps aside
while iterators lead and reads whenever someone else waits (a reply, a pong,
a goodbye at close, an iterator that could not lead, a full channel) or
nobody has read for a while. These tests pin both halves over real Unix
sockets: the frames a scripted daemon sends reach the right subscription, in
order, none lost and none twice, whichever task reads them; and the saving
itself (no step of the reader task per batch while an iterator leads).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import trio.testing

from busd.client import ConnectionLost, connect
from busd.core.catalog import Catalog
from busd.core.events import Envelope, Event, TextDelta
from busd.wire import (
    PROTOCOL_VERSION,
    Bye,
    ClientFrame,
    Events,
    Goodbye,
    Hello,
    Limits,
    Ping,
    Pong,
    Reply,
    Request,
    ServerFrame,
    Subscribe,
    Welcome,
    client_frame_decoder,
    encode_frame,
)


@pytest.fixture
def sock_path() -> Iterator[Path]:
    # AF_UNIX paths are short: pytest's tmp_path can be too long.
    directory = Path(tempfile.mkdtemp(prefix="busd-", dir="/tmp"))
    yield directory / "bus.sock"
    shutil.rmtree(directory, ignore_errors=True)


class Daemon:
    """A scripted daemon, one connection at a time: welcome, pongs, and what the test sends."""

    def __init__(self) -> None:
        self.frames: list[ClientFrame] = []
        self.answer_pings = True
        self.answer_requests = True
        self.connections = 0
        self._stream: trio.SocketStream | None = None
        self._subscribed = trio.Event()
        self._gone = trio.Event()

    async def send(self, *frames: ServerFrame) -> None:
        assert self._stream is not None
        await self._stream.send_all(b"".join(encode_frame(f) for f in frames))

    async def subscribed(self) -> list[Subscribe]:
        """Every ``subscribe`` frame so far (waits for the first)."""
        await self._subscribed.wait()
        return [f for f in self.frames if isinstance(f, Subscribe)]

    async def drop(self) -> None:
        """Close the connection (the daemon restarted)."""
        assert self._stream is not None
        await self._stream.aclose()

    async def serve(self, listener: trio.SocketListener) -> None:
        while True:
            stream = await listener.accept()
            self._stream = stream
            self.connections += 1
            async with stream:
                await self._serve(stream)

    async def _serve(self, stream: trio.SocketStream) -> None:
        decoder = client_frame_decoder(Catalog())
        while True:
            for frame in decoder:
                self.frames.append(frame)
                match frame:
                    case Hello():
                        welcome = Welcome(
                            server="script",
                            protocol=PROTOCOL_VERSION,
                            client_id=1,
                            head_seq=0,
                            limits=Limits(),
                        )
                        await stream.send_all(encode_frame(welcome))
                    case Subscribe():
                        self._subscribed.set()
                    case Ping(nonce=nonce) if self.answer_pings:
                        await stream.send_all(encode_frame(Pong(nonce=nonce)))
                    case Request(id=request_id) if self.answer_requests:
                        reply = Reply(id=request_id, ok=True, result={"pong": request_id})
                        await stream.send_all(encode_frame(reply))
                    case Bye():
                        await stream.send_all(encode_frame(Goodbye(reason="bye")))
                        return
            try:
                data = await stream.receive_some(65_536)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            if not data:
                return
            decoder.feed(data)


@asynccontextmanager
async def scripted(path: Path) -> AsyncIterator[Daemon]:
    sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await sock.bind(str(path))
    sock.listen(4)
    daemon = Daemon()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(daemon.serve, trio.SocketListener(sock))
        yield daemon
        nursery.cancel_scope.cancel()
    sock.close()


def envelope(seq: int) -> Envelope[Event]:
    return Envelope(seq=seq, ts=0.0, event=TextDelta(message_id="m1", text=str(seq)))


def events(sub: int, *seqs: int) -> Events:
    return Events(sub=sub, events=[envelope(seq) for seq in seqs])


def seqs(batch: object) -> list[int]:
    assert not isinstance(batch, ConnectionLost)
    return [e.seq for e in batch.events]  # type: ignore[attr-defined]


async def test_a_subscription_closed_while_its_channel_is_full_ends_quietly(
    sock_path: Path,
) -> None:
    """The reader waiting for room in a subscription's channel must not fail when it closes."""
    async with scripted(sock_path) as daemon, connect(sock_path) as client:
        async with client.subscribe(["stream.>"]) as sub:
            (frame,) = await daemon.subscribed()
            await daemon.send(*(events(frame.id, seq) for seq in range(1, 301)))
            while sub._send.statistics().tasks_waiting_send == 0:
                await trio.testing.wait_all_tasks_blocked()
        await client.ping()  # the client still works; the connection was not lost
        assert client.statistics().connected
