"""The client's publish hot path (issue 20): what it skips must not change what is sent.

``Client.publish`` joins an event to the open run of publishes without a
catalog lookup, a queue frame of its own or a wake-up of the writer; these
tests pin what that must keep: the frames on the wire and their order, the
refusal of an unregistered event type, a lost connection, cancellation, and
the bounded queue. A scripted server records the frames the client writes;
a real daemon checks the events end to end.
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
from busd.core.errors import UnknownEventType
from busd.core.events import Event, SessionInfo, TextDelta
from busd.wire import (
    PROTOCOL_VERSION,
    Bye,
    ClientFrame,
    Goodbye,
    Hello,
    Limits,
    Ping,
    Pong,
    Publish,
    Welcome,
    client_frame_decoder,
    encode_frame,
)

from .daemon_helpers import running_daemon


class Unregistered(Event, frozen=True, tag="acme.unregistered"):
    """An event class no catalog of these tests holds (until one registers it)."""

    note: str = ""


@pytest.fixture
def sock_path() -> Iterator[Path]:
    # AF_UNIX paths are short: pytest's tmp_path can be too long.
    directory = Path(tempfile.mkdtemp(prefix="busd-", dir="/tmp"))
    yield directory / "bus.sock"
    shutil.rmtree(directory, ignore_errors=True)


class Script:
    """A one-connection server: welcome, pong every ping, record every frame, goodbye at bye."""

    def __init__(self, path: Path, catalog: Catalog) -> None:
        self.path = path
        self.catalog = catalog
        self.frames: list[ClientFrame] = []
        self.reading = True  # False: stop reading, so the client's writes back up
        self._dropped = trio.Event()

    def drop(self) -> None:
        """Close the connection without reading what the client has sent (a daemon gone)."""
        self._dropped.set()

    def published(self) -> list[str]:
        """The text of every event published so far, in order."""
        return [
            o.event.text if isinstance(o.event, TextDelta) else type(o.event).__name__
            for f in self.frames
            if isinstance(f, Publish)
            for o in f.events
        ]

    def ops(self) -> list[str]:
        return [type(f).__name__ for f in self.frames]

    async def serve(self, listener: trio.SocketListener) -> None:
        stream = await listener.accept()
        decoder = client_frame_decoder(self.catalog)
        async with stream:
            while True:
                for frame in decoder:
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
                        case Ping(nonce=nonce):
                            self.frames.append(frame)
                            await stream.send_all(encode_frame(Pong(nonce=nonce)))
                        case Bye():
                            await stream.send_all(encode_frame(Goodbye(reason="bye")))
                            return
                        case _:
                            self.frames.append(frame)
                if not self.reading:
                    await self._dropped.wait()
                    return  # closed with unread bytes: the client's writes fail
                data = await stream.receive_some(65_536)
                if not data:
                    return
                decoder.feed(data)


@asynccontextmanager
async def scripted(path: Path, catalog: Catalog | None = None) -> AsyncIterator[Script]:
    sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await sock.bind(str(path))
    sock.listen(1)
    script = Script(path, catalog if catalog is not None else Catalog())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(script.serve, trio.SocketListener(sock))
        yield script
    sock.close()


def delta(text: str) -> TextDelta:
    return TextDelta(message_id="m1", text=text)


async def test_publishes_around_another_frame_keep_their_order_and_their_frames(
    sock_path: Path,
) -> None:
    """A frame queued between publishes closes their run: publish, ping, publish, on the wire."""
    async with scripted(sock_path) as script, connect(sock_path, role="agent") as client:
        await client.publish(delta("a"), session_id="s1")
        await client.publish(delta("b"), session_id="s1")  # joins "a": no yield in between
        await client.send_frame(Ping(nonce=99))
        await client.publish(delta("c"), session_id="s1")
        await client.publish(delta("d"))
        await client.flush()
        assert script.ops() == ["Publish", "Ping", "Publish", "Ping"]
        first, _, second, _ = script.frames
        assert isinstance(first, Publish)
        assert isinstance(second, Publish)
        assert [(o.event, o.session_id) for o in first.events] == [
            (delta("a"), "s1"),
            (delta("b"), "s1"),
        ]
        assert [(o.event, o.session_id) for o in second.events] == [
            (delta("c"), "s1"),
            (delta("d"), None),
        ]


async def test_a_publish_after_the_writer_took_the_queue_is_sent_too(sock_path: Path) -> None:
    """Once the writer has taken a run of publishes, the next event starts a new one."""
    async with scripted(sock_path) as script, connect(sock_path, role="agent") as client:
        for text in ("a", "b"):
            await client.publish(delta(text), run_id="r1", agent_id="g1")
            await trio.testing.wait_all_tasks_blocked()  # the writer sent it
        await client.flush()
        assert script.ops() == ["Publish", "Publish", "Ping"]
        assert script.published() == ["a", "b"]
        frame = script.frames[1]
        assert isinstance(frame, Publish)
        assert (frame.events[0].run_id, frame.events[0].agent_id) == ("r1", "g1")


async def test_an_unregistered_type_is_refused_after_registered_ones_and_until_registered(
    sock_path: Path,
) -> None:
    """The per-class check is only ever skipped for a class the catalog accepted."""
    catalog, on_the_server = Catalog(), Catalog()
    on_the_server.register(Unregistered)
    async with (
        scripted(sock_path, on_the_server) as script,
        connect(sock_path, role="agent", catalog=catalog) as client,
    ):
        await client.publish(delta("a"))  # a run of publishes is open: the hot path
        for _ in range(2):  # a refusal is not remembered as an acceptance
            with pytest.raises(UnknownEventType, match="not a registered event type"):
                await client.publish(Unregistered())
            with pytest.raises(UnknownEventType):
                client.publish_nowait(Unregistered())
        catalog.register(Unregistered)
        await client.publish(Unregistered(note="now known"))
        await client.flush()
        assert script.published() == ["a", "Unregistered"]


async def test_a_publish_after_the_connection_is_lost_raises_with_events_queued(
    sock_path: Path,
) -> None:
    """Events queued behind a blocked write do not let later publishes pass a lost connection."""
    async with scripted(sock_path) as script, connect(sock_path, role="agent") as client:
        script.reading = False
        big = "x" * 1_000
        for _ in range(1_000):  # ~1 MB: more than the socket holds, so the writer blocks
            client.publish_nowait(delta(big))
        await trio.testing.wait_all_tasks_blocked()  # the writer is stuck in send_all
        await client.publish(delta("queued"))  # opens a new run of publishes behind it
        with trio.fail_after(10):
            script.drop()
            await client.wait_connection_change()
        with pytest.raises(ConnectionLost):
            await client.publish(delta("late"))
        with pytest.raises(ConnectionLost):
            client.publish_nowait(delta("late"))


async def test_a_cancelled_publish_raises_cancelled_on_the_hot_path(sock_path: Path) -> None:
    """Still a cancellation point: the event is queued, then ``Cancelled`` is raised."""
    async with scripted(sock_path) as script, connect(sock_path, role="agent") as client:
        await client.publish(delta("a"))
        reached = False
        with trio.CancelScope() as scope:
            scope.cancel()
            await client.publish(delta("b"))
            reached = True
        assert scope.cancelled_caught
        assert not reached
        await client.flush()
        assert script.published() == ["a", "b"]


async def test_more_events_than_the_queue_holds_all_arrive_in_order(sock_path: Path) -> None:
    """A tight loop past the 10,000-event queue waits for room and loses nothing."""
    events = 25_000
    async with running_daemon(sock_path):
        async with (
            connect(sock_path, client="reader") as reader,
            reader.subscribe(["stream.session.info"], window_ms=0, deltas="raw") as sub,
            connect(sock_path, client="writer", role="agent") as writer,
        ):
            with trio.fail_after(30):
                for i in range(events):
                    await writer.publish(SessionInfo(message=str(i)), session_id="s1")
                ack = await writer.acknowledge()  # every publish handled, in order
                received: list[int] = []
                last_seq = None
                async for batch in sub:
                    assert batch.gap is None
                    for envelope in batch.events:
                        assert isinstance(envelope.event, SessionInfo)
                        received.append(int(envelope.event.message))
                        last_seq = envelope.seq
                    if len(received) >= events:
                        break
            assert received == list(range(events))
            assert ack.last_seq == last_seq
