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
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from busd.client import ClientSubscription, ConnectionLost, connect
from busd.client.reading import QUIET
from busd.core.catalog import Catalog
from busd.core.events import Envelope, Event, TextDelta
from busd.wire import (
    PROTOCOL_VERSION,
    Bye,
    ClientFrame,
    Events,
    Gap,
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
from busd.wire.frames import Status


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
        self.answer_requests = True
        self.connections = 0
        self._stream: trio.SocketStream | None = None
        self._subscribed = trio.Event()
        self._sending = trio.Lock()

    async def send(self, *frames: ServerFrame) -> None:
        assert self._stream is not None
        async with self._sending:  # the test's frames and the answers, whole
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
                        await self.send(welcome)
                    case Subscribe():
                        self._subscribed.set()
                    case Ping(nonce=nonce):
                        await self.send(Pong(nonce=nonce))
                    case Request(id=request_id) if self.answer_requests:
                        reply = Reply(id=request_id, ok=True, result={"pong": request_id})
                        await self.send(reply)
                    case Bye():
                        await self.send(Goodbye(reason="bye"))
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


def events(sub: int, *seqs: int) -> Events[Envelope[Event]]:
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


class Steps(trio.abc.Instrument):
    """Counts the steps of each task, by name."""

    def __init__(self) -> None:
        self.steps: dict[str, int] = {}

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps[task.name] = self.steps.get(task.name, 0) + 1

    def of(self, suffix: str) -> int:
        return sum(n for name, n in self.steps.items() if name.endswith(suffix))


async def test_an_iterator_that_waits_reads_the_socket_itself(sock_path: Path) -> None:
    """Batch after batch, the waiting iterator reads: the reader task does not step per batch."""
    async with scripted(sock_path) as daemon, connect(sock_path) as client:
        async with client.subscribe(["stream.>"]) as sub:
            (frame,) = await daemon.subscribed()
            await daemon.send(events(frame.id, 1))
            assert seqs(await anext(sub)) == [1]  # the reader task's read: from now on, ours
            steps = Steps()
            trio.lowlevel.add_instrument(steps)
            try:
                for seq in range(2, 102):
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(daemon.send, events(frame.id, seq))
                        assert seqs(await anext(sub)) == [seq]
            finally:
                trio.lowlevel.remove_instrument(steps)
            assert steps.of(trio.lowlevel.current_task().name) >= 100  # this task read them
            assert steps.of("Client._run") <= 3, steps.steps  # the reader task: its quiet timer


async def led(daemon: Daemon, sub: ClientSubscription, seq: int) -> None:
    """One batch for ``sub``'s waiting iterator: from now on iterators lead; the reader waits."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(daemon.send, events(sub.id, seq))
        assert seqs(await anext(sub)) == [seq]


async def test_an_idle_iterator_costs_the_reader_task_no_wake_ups(
    sock_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """An iterator waiting on a quiet socket for a minute: the quiet timer does not tick."""
    async with scripted(sock_path) as daemon, connect(sock_path) as client:
        async with client.subscribe(["stream.>"]) as sub, trio.open_nursery() as nursery:
            await led(daemon, sub, 1)
            nursery.start_soon(anext, sub)  # it reads, and waits on the socket
            await trio.sleep(1)  # the reader task's timer, once, then nothing
            steps = Steps()
            trio.lowlevel.add_instrument(steps)
            try:
                await trio.sleep(60)
            finally:
                trio.lowlevel.remove_instrument(steps)
            assert steps.of("Client._run") == 0, steps.steps
            nursery.cancel_scope.cancel()


async def test_a_leading_iterator_routes_other_subscriptions_frames_in_order(
    sock_path: Path,
) -> None:
    """Frames for another subscription, read by this one's iterator, reach it in order."""
    async with scripted(sock_path) as daemon, connect(sock_path) as client:
        async with client.subscribe(["a.>"]) as a, client.subscribe(["b.>"]) as b:
            await led(daemon, a, 1)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    daemon.send,
                    events(b.id, 2),
                    Gap(sub=b.id, from_seq=3, to_seq=4),
                    events(b.id, 5, 6),
                    events(a.id, 7),
                )
                assert seqs(await anext(a)) == [7]
            first, gap, last = await anext(b), await anext(b), await anext(b)
            assert (seqs(first), gap.gap, seqs(last)) == ([2], (3, 4), [5, 6])
            assert b.last_seq == 6


async def test_a_reply_reaches_its_caller_while_an_iterator_reads(sock_path: Path) -> None:
    """The iterator that waits on the socket reads the reply for another task's request."""
    async with scripted(sock_path) as daemon, connect(sock_path) as client:
        async with client.subscribe(["stream.>"]) as sub, trio.open_nursery() as nursery:
            await led(daemon, sub, 1)
            got: list[int] = []

            async def iterate() -> None:
                got.extend(seqs(await anext(sub)))

            nursery.start_soon(iterate)
            await trio.testing.wait_all_tasks_blocked()  # the iterator waits on the socket
            assert client._inbox is not None
            assert client._inbox._busy
            assert "pong" in await client.request(Status())
            await client.ping()
            await daemon.send(events(sub.id, 2))
        assert got == [2]


async def test_a_reply_is_read_at_once_when_no_iterator_waits(
    sock_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Iterators led, then stopped: a request wakes the reader task, not its quiet timer."""
    async with scripted(sock_path) as daemon, connect(sock_path) as client:
        async with client.subscribe(["stream.>"]) as sub:
            await led(daemon, sub, 1)
            start = trio.current_time()
            await client.ping()
            await client.request(Status())
            assert trio.current_time() - start < QUIET


async def test_close_reads_the_goodbye_at_once_after_iterators_led(
    sock_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with scripted(sock_path) as daemon, connect(sock_path) as client:
        async with client.subscribe(["stream.>"]) as sub:
            await led(daemon, sub, 1)
        start = trio.current_time()
        await client.aclose()
        assert trio.current_time() - start < QUIET  # not the quiet timer, nor close's 2 s
        assert isinstance(daemon.frames[-1], Bye)


async def test_a_goodbye_nobody_waits_for_is_still_read(
    sock_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The application stopped iterating: the reader task reads again after a quiet spell."""
    async with scripted(sock_path) as daemon, connect(sock_path) as client:
        async with client.subscribe(["stream.>"]) as sub:
            await led(daemon, sub, 1)
            start = trio.current_time()
            await daemon.send(Goodbye(reason="shutdown", resume_seq=1))
            with trio.fail_after(1):
                stats = await client.wait_connection_change()
            assert not stats.connected
            assert stats.last_lost == "shutdown: the daemon said goodbye"
            assert trio.current_time() - start < 3 * QUIET
            with pytest.raises(ConnectionLost, match="shutdown"):
                await anext(sub)


async def test_an_iterator_cancelled_while_it_reads_loses_nothing(sock_path: Path) -> None:
    """Cancelled on the socket: the reader task takes over, and the next batch is the next one."""
    async with scripted(sock_path) as daemon, connect(sock_path) as client:
        async with client.subscribe(["stream.>"]) as sub:
            await led(daemon, sub, 1)
            with trio.move_on_after(0.01) as scope:
                await anext(sub)
            assert scope.cancelled_caught
            await daemon.send(events(sub.id, 2), events(sub.id, 3))
            await client.ping()  # the reader task read both batches, in order
            assert seqs(await anext(sub)) == [2]
            assert seqs(await anext(sub)) == [3]
            assert sub.last_seq == 3


async def test_an_iterator_that_stops_reading_hands_its_callers_to_the_reader_at_once(
    sock_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A request sent while an iterator read, answered after it was cancelled, arrives at once."""
    async with scripted(sock_path) as daemon, connect(sock_path) as client:
        async with client.subscribe(["stream.>"]) as sub, trio.open_nursery() as nursery:
            await led(daemon, sub, 1)
            daemon.answer_requests = False
            iterating = trio.CancelScope()

            async def iterate() -> None:
                with iterating:
                    await anext(sub)

            replies: list[object] = []

            async def ask() -> None:
                replies.append(await client.request(Status()))

            nursery.start_soon(iterate)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(ask)
            await trio.testing.wait_all_tasks_blocked()  # the request waits on the iterator's read
            iterating.cancel()
            await trio.testing.wait_all_tasks_blocked()
            start = trio.current_time()
            (request,) = [f for f in daemon.frames if isinstance(f, Request)]
            await daemon.send(Reply(id=request.id, ok=True, result={"late": True}))
        assert replies == [{"late": True}]
        assert trio.current_time() - start < QUIET


async def test_a_batch_for_a_full_channel_is_held_and_order_kept(sock_path: Path) -> None:
    """A leading iterator never waits for another subscription's room: the reader task does."""
    with trio.fail_after(5):  # a leader that read past the held batch would wait here forever
        await _held_and_order_kept(sock_path)


async def _held_and_order_kept(sock_path: Path) -> None:
    async with scripted(sock_path) as daemon, connect(sock_path) as client:
        async with client.subscribe(["a.>"]) as a, client.subscribe(["b.>"]) as b:
            await led(daemon, a, 1)
            await daemon.send(*(events(b.id, seq) for seq in range(2, 258)))  # 256: b is full
            await client.ping()
            got_a: list[int] = []

            async def iterate_a() -> None:
                got_a.extend(seqs(await anext(a)))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(iterate_a)
                await daemon.send(events(b.id, 258), events(a.id, 259))
                await trio.testing.wait_all_tasks_blocked()
                assert got_a == []  # behind b's batch, which waits for room
                got_b = [seqs(await anext(b))[0] for _ in range(257)]
            assert got_a == [259]
            assert got_b == list(range(2, 259))


async def test_a_reconnected_iterator_resumes_after_its_last_batch(sock_path: Path) -> None:
    """The connection drops under a leading iterator: it resubscribes from what it delivered."""
    async with (
        scripted(sock_path) as daemon,
        connect(sock_path, reconnect=True) as client,
        client.subscribe(["stream.>"]) as sub,
    ):
        await led(daemon, sub, 1)
        await led(daemon, sub, 2)
        await daemon.drop()
        with trio.fail_after(5):
            while client.statistics().reconnects == 0:
                await client.wait_connection_change()
            await client.ping()  # after the subscribe frame it queued first
        first, again = await daemon.subscribed()
        assert (first.id, first.since_seq) == (again.id, None)
        assert again.since_seq == 2
        await led(daemon, sub, 3)
        assert daemon.connections == 2


Op = tuple[str, int]  # ("send", sub), ("take", sub), ("wait", sub) or ("ping", 0)

ops = st.lists(
    st.tuples(st.sampled_from(["send", "take", "wait", "ping"]), st.integers(0, 1)),
    max_size=40,
)


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(script=ops)
def test_whoever_reads_each_subscription_gets_its_batches_once_in_order(script: list[Op]) -> None:
    """Sends, takes, waits cancelled on the socket and pings, interleaved at random.

    The clock stands still unless every task has waited a second: a task
    left waiting for a read that nobody does shows as time gone by, where
    the reader task's quiet timer would otherwise have rescued it.
    """
    directory = Path(tempfile.mkdtemp(prefix="busd-", dir="/tmp"))
    clock = trio.testing.MockClock(autojump_threshold=1.0)
    try:
        trio.run(_play, directory / "bus.sock", script, clock=clock)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


async def _play(path: Path, script: list[Op]) -> None:
    sent: list[list[int]] = [[], []]
    got: list[list[int]] = [[], []]
    seq = 0
    async with scripted(path) as daemon, connect(path) as client:
        async with client.subscribe(["a.>"]) as a, client.subscribe(["b.>"]) as b:
            subs = (a, b)
            for op, which in script:
                sub = subs[which]
                match op:
                    case "send":
                        seq += 1
                        sent[which].append(seq)
                        await daemon.send(events(sub.id, seq))
                    case "take" if len(got[which]) < len(sent[which]):
                        got[which].extend(seqs(await anext(sub)))
                    case "take" | "wait":  # wait on the socket, then give up
                        async with trio.open_nursery() as nursery:
                            nursery.start_soon(_take_until_cancelled, sub, got[which])
                            await trio.testing.wait_all_tasks_blocked()
                            nursery.cancel_scope.cancel()
                    case "ping":
                        await client.ping()
            for which, sub in enumerate(subs):
                while len(got[which]) < len(sent[which]):
                    got[which].extend(seqs(await anext(sub)))
    assert got == sent
    assert trio.current_time() == 0, "somebody waited for the quiet timer"


async def _take_until_cancelled(sub: ClientSubscription, into: list[int]) -> None:
    while True:
        into.extend(seqs(await anext(sub)))
