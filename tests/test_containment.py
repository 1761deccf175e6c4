"""No client can take the daemon down (issue 14): each case over a real Unix socket.

Every test here drives a real daemon (``running_daemon``) through a real
socket, with the client library or with raw bytes where the point is what a
client outside it can send. After each, the daemon still answers ``status``
and says how many connections it had to end for its own faults.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import socket
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import trio.testing

from busd.client import ConnectionLost, DaemonNotRunning, connect
from busd.core.cohorts import SharedBatch
from busd.core.events import Envelope, Event, SessionInfo, StreamingStats, TextDelta
from busd.daemon.batching import BatchDispatcher
from busd.daemon.hub import Daemon, DaemonConfig, Subscription
from busd.plugins.adapters import Emitted, Translator
from busd.plugins.hookspecs import hookimpl
from busd.plugins.manager import PluginManager
from busd.wire import (
    PROTOCOL_VERSION,
    Bye,
    Error,
    Events,
    Frame,
    Goodbye,
    Hello,
    Ingest,
    Outgoing,
    Ping,
    Pong,
    Publish,
    Reply,
    Status,
    Subscribe,
    Unsubscribe,
    Welcome,
    encode_frame,
)

from .daemon_helpers import RawClient, running_daemon


@pytest.fixture
def sock_path() -> Iterator[Path]:
    # AF_UNIX paths are short: pytest's tmp_path can be too long.
    directory = Path(tempfile.mkdtemp(prefix="busd-", dir="/tmp"))
    yield directory / "bus.sock"
    shutil.rmtree(directory, ignore_errors=True)


async def status(path: Path) -> dict[str, Any]:
    async with connect(path, client="status") as client:
        result: dict[str, Any] = await client.request(Status())
    return result


def frames_bytes(*frames: Frame) -> bytes:
    return b"".join(encode_frame(f) for f in frames)


def hello(name: str = "raw") -> Hello:
    return Hello(protocol=PROTOCOL_VERSION, client=name)


def event_seqs(frames: Sequence[object], sub: int | None = None) -> list[int]:
    return [
        e.seq
        for f in frames
        if isinstance(f, Events) and (sub is None or f.sub == sub)
        for e in f.events
    ]


async def publish_all(path: Path, events: Sequence[Event], *, session: str = "s1") -> None:
    async with connect(path, client="publisher", role="agent") as publisher:
        for event in events:
            await publisher.publish(event, session_id=session)
        await publisher.flush()


def deltas(count: int, size: int = 100) -> list[Event]:
    return [TextDelta(message_id="m", text=f"{i} " + "x" * size) for i in range(count)]


async def receive_until(raw: RawClient, done: Any) -> list[object]:
    """Frames until ``done(frames)`` holds (a guard fails a hung test)."""
    frames: list[object] = []
    with trio.fail_after(20):
        while not done(frames):
            frames.append(await raw.receive())
    return frames


# -- 1. pipelined subscribe/unsubscribe, one id twice ---------------------------------


async def test_subscribe_and_unsubscribe_in_one_write_leave_the_daemon_up(
    sock_path: Path,
) -> None:
    async with running_daemon(sock_path) as server:
        raw = await RawClient.open(sock_path, hello=False)
        await raw.send_bytes(
            frames_bytes(hello(), Subscribe(id=1), Unsubscribe(id=1), Ping(nonce=7))
        )
        first = await receive_until(raw, lambda f: Pong(nonce=7) in f)
        assert isinstance(first[0], Welcome)
        await publish_all(sock_path, [SessionInfo(message="after")])
        await raw.send(Bye())
        rest = await raw.receive_until_closed()
        assert [type(f).__name__ for f in rest] == ["Goodbye"]  # unsubscribed: no events
        assert (await status(sock_path))["internal_errors"] == 0
        assert server.daemon.counters.protocol_errors == 0


async def test_one_subscription_id_twice_in_one_write_is_a_replacement(sock_path: Path) -> None:
    async with running_daemon(sock_path):
        raw = await RawClient.open(sock_path, hello=False)
        await raw.send_bytes(
            frames_bytes(
                hello(),
                Subscribe(id=1, patterns=("stream.text.delta",), window_ms=0),
                Subscribe(id=1, patterns=("stream.session.info",), window_ms=0),
                Ping(nonce=1),
            )
        )
        await receive_until(raw, lambda f: Pong(nonce=1) in f)
        await publish_all(sock_path, [*deltas(2), SessionInfo(message="only this")])
        frames = await receive_until(raw, lambda f: event_seqs(f))
        (batch,) = [f for f in frames if isinstance(f, Events)]
        assert batch.sub == 1
        assert [e.event for e in batch.events] == [SessionInfo(message="only this")]
        await raw.aclose()
        assert (await status(sock_path))["internal_errors"] == 0


# -- 2. a replay larger than the outbound cap -----------------------------------------


async def test_a_replay_larger_than_the_outbound_cap_is_paced_not_fatal(sock_path: Path) -> None:
    config = DaemonConfig(outbound_cap=65_536)
    async with running_daemon(sock_path, config):
        await publish_all(sock_path, deltas(2500))  # ~500 KB in the ring
        async with (
            connect(sock_path) as reader,
            reader.subscribe(["stream.text.delta"], since_seq=0, window_ms=0, deltas="raw") as sub,
        ):
            got: list[Envelope[Event]] = []
            with trio.fail_after(20):
                async for batch in sub:
                    got.extend(batch.events)
                    if len(got) >= 2500:
                        break
        assert [e.event for e in got] == deltas(2500)
        state = await status(sock_path)
        assert (state["slow_consumer_disconnects"], state["internal_errors"]) == (0, 0)


# -- 3. a reader that leaves in the middle of a journal replay ------------------------


async def test_leaving_in_the_middle_of_a_journal_replay_after_a_restart(sock_path: Path) -> None:
    config = DaemonConfig(journal=str(sock_path.parent / "journal.sqlite3"))
    async with running_daemon(sock_path, config):
        await publish_all(sock_path, [SessionInfo(message=str(i)) for i in range(5000)])
    async with running_daemon(sock_path, config):  # a restart: the ring is empty
        for _ in range(3):  # `busd tail --since 0 --count 1`, three times
            async with connect(sock_path) as tail, tail.subscribe([">"], since_seq=0) as sub:
                with trio.fail_after(20):
                    first = await sub.__anext__()
                assert first.events[0].event == SessionInfo(message="0")
        async with (
            connect(sock_path) as reader,
            reader.subscribe(["stream.session.info"], since_seq=0, window_ms=0) as sub,
        ):
            got: list[Envelope[Event]] = []
            with trio.fail_after(20):
                async for batch in sub:
                    got.extend(batch.events)
                    if len(got) >= 5000:
                        break
        assert [e.event for e in got] == [SessionInfo(message=str(i)) for i in range(5000)]
        assert (await status(sock_path))["internal_errors"] == 0


# -- 4. churn beside a publisher ------------------------------------------------------


async def test_churn_of_clients_beside_a_publisher_leaves_the_daemon_up(sock_path: Path) -> None:
    """80 clients come and go in every way the protocol allows while events flow."""
    async with running_daemon(sock_path) as server:
        stop = trio.Event()

        async def publish() -> None:
            async with connect(sock_path, client="publisher", role="agent") as publisher:
                i = 0
                while not stop.is_set():
                    for _ in range(20):
                        await publisher.publish(SessionInfo(message=str(i)), session_id="s1")
                        i += 1
                    await publisher.flush()

        async def library_client(n: int) -> None:
            since = 0 if n % 3 == 0 else None
            async with (
                connect(sock_path, client=f"lib-{n}") as client,
                client.subscribe([">"], window_ms=(n % 3) * 8, since_seq=since) as sub,
            ):
                async for _ in sub:
                    break

        async def pipelined(n: int) -> None:
            raw = await RawClient.open(sock_path, hello=False)
            await raw.send_bytes(
                frames_bytes(
                    hello(f"raw-{n}"),
                    Subscribe(id=1, window_ms=0),
                    Subscribe(id=1, patterns=("stream.session.>",), since_seq=0),
                    Subscribe(id=2),
                    Unsubscribe(id=1),
                    Bye(),
                )
            )
            frames = await raw.receive_until_closed()
            assert isinstance(frames[-1], Goodbye), frames[-1]

        async def abrupt(n: int) -> None:
            raw = await RawClient.open(sock_path, hello=False)
            await raw.send_bytes(frames_bytes(hello(f"abrupt-{n}"), Subscribe(id=1, since_seq=0)))
            await receive_until(raw, lambda f: event_seqs(f))
            await raw.aclose()  # no bye, unread bytes left behind

        kinds = [library_client, pipelined, abrupt]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(publish)
            limiter = trio.CapacityLimiter(20)

            async def one(n: int) -> None:
                async with limiter:
                    with trio.fail_after(20):
                        await kinds[n % len(kinds)](n)

            async with trio.open_nursery() as clients:
                for n in range(90):
                    clients.start_soon(one, n)
            stop.set()
        state = await status(sock_path)
        assert state["internal_errors"] == 0
        assert state["clients"] == 1  # only the status client is left
        assert server.daemon.counters.protocol_errors == 0


# -- 5. exact resume points -----------------------------------------------------------


async def slow_read_until_closed(raw: RawClient, *, chunk: int = 4096) -> list[object]:
    """A reader that lags: ``chunk`` bytes every 50 ms (virtual time), until EOF."""
    frames: list[object] = []
    while True:
        frame = raw.decoder.next_frame()
        if frame is not None:
            frames.append(frame)
            continue
        await trio.sleep(0.05)
        try:
            data = await raw.stream.receive_some(chunk)
        except trio.BrokenResourceError:
            data = b""
        if not data:
            await raw.aclose()
            return frames
        raw.decoder.feed(data)


def published_seqs(frames: Sequence[object]) -> list[int]:
    return event_seqs(frames)


async def lagging_subscriber(path: Path) -> RawClient:
    """A raw subscriber to read with :func:`slow_read_until_closed`.

    Its daemon keeps the kernel's default send buffer (``send_buffer=0``):
    at 80 KB/s this reader would drain busd's own (1 MiB, twice that in the
    kernel's count) only after ``goodbye_timeout``, and its goodbye would
    not come (docs/operations.md).
    """
    raw = await RawClient.open(path)
    await raw.send(Subscribe(id=1, patterns=("stream.text.delta",), window_ms=0, deltas="raw"))
    await raw.send(Ping(nonce=1))
    assert await raw.receive() == Pong(nonce=1)
    return raw


async def resume_from(path: Path, since: int, count: int) -> list[int]:
    raw = await RawClient.open(path)
    await raw.send(
        Subscribe(id=1, patterns=("stream.text.delta",), window_ms=0, deltas="raw", since_seq=since)
    )
    frames = await receive_until(raw, lambda f: len(event_seqs(f)) >= count)
    await raw.aclose()
    return event_seqs(frames)


async def test_a_lagging_reader_that_says_bye_resumes_from_its_goodbye_missing_nothing(
    sock_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    config = DaemonConfig(
        outbound_cap=65_536, subscription_buffer=50_000, send_buffer=0
    )  # see lagging_subscriber
    async with running_daemon(sock_path, config) as server:
        raw = await lagging_subscriber(sock_path)
        await publish_all(sock_path, deltas(6000, size=200))  # ~1.5 MB: far past the buffers
        published = list(range(1, server.daemon.bus.head_seq + 1))
        await raw.send(Bye())
        frames = await slow_read_until_closed(raw)
        goodbye = frames[-1]
        assert isinstance(goodbye, Goodbye)
        assert goodbye.reason == "bye"
        resume = goodbye.resume_seq
        assert resume is not None
        got = event_seqs(frames)
        assert got == [s for s in published if s <= resume]  # all before it, nothing after it
        assert resume < published[-1]  # it did lag
        missed = [s for s in published if s > resume]
        assert await resume_from(sock_path, resume, len(missed)) == missed


async def test_a_lagging_reader_at_shutdown_resumes_after_a_restart_missing_nothing(
    sock_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    config = DaemonConfig(
        outbound_cap=65_536,
        subscription_buffer=50_000,
        send_buffer=0,  # see lagging_subscriber
        shutdown_grace=600.0,
        journal=str(sock_path.parent / "journal.sqlite3"),
    )
    async with running_daemon(sock_path, config) as server:
        raw = await lagging_subscriber(sock_path)
        await publish_all(sock_path, deltas(6000, size=200))
        published = list(range(1, server.daemon.bus.head_seq + 1))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server.shutdown)
            frames = await slow_read_until_closed(raw)
    goodbye = frames[-1]
    assert isinstance(goodbye, Goodbye)
    assert goodbye.reason == "shutdown"
    resume = goodbye.resume_seq
    assert resume is not None
    assert event_seqs(frames) == [s for s in published if s <= resume]
    assert resume < published[-1]
    missed = [s for s in published if s > resume]
    # The journal reads in a thread: from here on, time runs as it does (no jumps).
    autojump_clock.autojump_threshold = math.inf
    autojump_clock.rate = 1.0
    async with running_daemon(sock_path, config):
        assert await resume_from(sock_path, resume, len(missed)) == missed


async def test_a_fatal_frame_error_is_followed_by_a_goodbye_with_the_resume_point(
    sock_path: Path,
) -> None:
    async with running_daemon(sock_path):
        raw = await lagging_subscriber(sock_path)
        await publish_all(sock_path, deltas(3))
        got = event_seqs(await receive_until(raw, lambda f: len(event_seqs(f)) >= 3))
        await raw.send_bytes(b"\xff\xff\xff\xff")  # a length prefix far over max_frame
        frames = await raw.receive_until_closed()
    assert [type(f).__name__ for f in frames] == ["Error", "Goodbye"]
    error, goodbye = frames
    assert isinstance(error, Error)
    assert (error.code, error.fatal) == ("frame_too_large", True)
    assert goodbye == Goodbye(reason="frame_too_large", resume_seq=got[-1])


async def test_a_bad_handshake_is_followed_by_a_goodbye(sock_path: Path) -> None:
    async with running_daemon(sock_path) as server:
        await publish_all(sock_path, deltas(2))
        raw = await RawClient.open(sock_path, hello=False)
        await raw.send(Ping(nonce=1))
        frames = await raw.receive_until_closed()
        head = server.daemon.bus.head_seq
    assert [type(f).__name__ for f in frames] == ["Error", "Goodbye"]
    assert isinstance(frames[0], Error)
    assert (frames[0].code, frames[0].fatal) == ("bad_handshake", True)
    assert frames[1] == Goodbye(reason="bad_handshake", resume_seq=head)


# -- containment by structure ---------------------------------------------------------


class ExplodingTranslator(Translator):
    """Its stream can be fed; its end raises (a plugin that overrides ``finish``)."""

    def translate(self, raw: object, now: float) -> list[Emitted]:
        return [self.emit(SessionInfo(message=str(raw)))]

    def finish(self, now: float) -> list[Emitted]:
        raise RuntimeError("finish exploded")


class BrokenAdapter:
    """``broken``: cannot even make a translator; ``exploding``: its translators fail at the end."""

    def __init__(self, name: str) -> None:
        self.name = name

    def translator(self, *, session_id: str | None = None) -> Translator:
        if self.name == "broken":
            raise RuntimeError("translator factory exploded")
        return ExplodingTranslator(session_id=session_id, adapter=self.name)


class AdapterPlugin:
    @hookimpl
    def busd_adapters(self) -> Sequence[object]:
        return [BrokenAdapter("broken"), BrokenAdapter("exploding")]


def broken_plugins() -> PluginManager:
    pm = PluginManager(environ={})
    pm.register(AdapterPlugin(), name="broken-adapters")
    return pm


async def test_a_failure_serving_one_connection_ends_that_connection_only(
    sock_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with (
        running_daemon(sock_path, plugins=broken_plugins()),
        connect(sock_path, client="bystander") as bystander,
        bystander.subscribe(["stream.session.info"], window_ms=0) as sub,
    ):
        victim = await lagging_subscriber(sock_path)
        with caplog.at_level(logging.ERROR, logger="busd"), trio.fail_after(20):
            await victim.send(Ingest(sdk="broken", events=[{"type": "say"}]))
            frames = await victim.receive_until_closed()
        assert frames[-1] == Goodbye(reason="internal_error", resume_seq=0)
        await publish_all(sock_path, [SessionInfo(message="still here")])
        with trio.fail_after(20):
            batch = await sub.__anext__()
        assert [e.event for e in batch.events] == [SessionInfo(message="still here")]
        assert (await status(sock_path))["internal_errors"] == 1
    tracebacks = [r for r in caplog.records if r.exc_info is not None]
    assert len(tracebacks) == 1
    assert "translator factory exploded" in caplog.text


async def test_a_failure_while_a_connection_closes_is_contained_too(
    sock_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_daemon(sock_path, plugins=broken_plugins()):
        with caplog.at_level(logging.ERROR, logger="busd"):
            async with connect(sock_path, client="ingester", role="agent") as ingester:
                await ingester.send_frame(Ingest(sdk="exploding", events=["one"]))
                await ingester.flush()
            state = await status(sock_path)  # the stream was finished on the way out: it raised
        assert state["internal_errors"] == 1
        assert state["clients"] == 1
    assert "finish exploded" in caplog.text


async def test_a_subscription_failing_in_the_fanout_fails_alone() -> None:
    """One pass offers a batch to a whole cohort; a member that raises there breaks only itself."""
    daemon = Daemon(DaemonConfig(journal=None))
    delivered: list[list[Envelope[Event]]] = []
    failures: list[Exception] = []

    async def send(batch: list[Envelope[Event]]) -> None:
        delivered.append(batch)

    def explode(batch: SharedBatch) -> bool:
        raise RuntimeError("send_shared exploded")

    def accept(batch: SharedBatch) -> bool:
        delivered.append(batch.envelopes)
        return True

    def member(sub_id: int, send_shared: Callable[[SharedBatch], bool]) -> Subscription:
        dispatcher = BatchDispatcher(send, window=0, send_shared=send_shared)
        sub = Subscription(1, sub_id, [">"], sessions=None, owned_only=False, dispatcher=dispatcher)
        sub.on_error = failures.append
        return sub

    failing, healthy = member(1, explode), member(2, accept)
    async with trio.open_nursery() as services:
        await services.start(daemon.run)
        for sub in (failing, healthy):
            daemon.add_subscription(sub)
            await services.start(sub.dispatcher.run)
        assert daemon.fanout.statistics().cohorts == 1
        one = daemon.publish(SessionInfo(message="one"), session_id="s1")
        daemon.settle()
        assert delivered == [[one]]
        assert [str(e) for e in failures] == ["send_shared exploded"]
        assert failing.dispatcher.pending_seq() == one.seq  # not delivered: where it resumes
        assert daemon.status()["subscriptions"] == 1  # the failing one is gone
        two = daemon.publish(SessionInfo(message="two"), session_id="s1")
        daemon.settle()
        assert delivered == [[one], [two]]  # the fan-out goes on
        services.cancel_scope.cancel()


# -- 7. strict input: no extension types, no binary -----------------------------------


def publish_body(*events: dict[str, Any]) -> bytes:
    body = msgspec.msgpack.encode({"op": "publish", "events": [{"event": e} for e in events]})
    return len(body).to_bytes(4, "big") + body


def tool_start(value: object) -> dict[str, Any]:
    return {"type": "stream.tool.start", "tool_call_id": "t1", "name": "x", "input": {"v": value}}


@pytest.mark.parametrize(
    "value",
    [
        msgspec.msgpack.Ext(5, b"\x01\x02"),
        b"\x00binary",
        {"nested": [1, b"deep"]},
        msgspec.msgpack.Ext(-1, b"\x00\x00\x00\x01"),  # a msgpack timestamp
    ],
    ids=["ext", "bin", "nested-bin", "timestamp"],
)
async def test_extension_and_binary_values_are_refused_and_never_relayed(
    sock_path: Path, value: object
) -> None:
    async with running_daemon(sock_path) as server:
        watcher = await lagging_subscriber(sock_path)
        await watcher.send(Subscribe(id=2, window_ms=0))
        raw = await RawClient.open(sock_path)
        await raw.send_bytes(publish_body(tool_start(value)))
        await raw.send(Ping(nonce=2))
        frames = await receive_until(raw, lambda f: Pong(nonce=2) in f)
        assert [(f.code, f.fatal) for f in frames if isinstance(f, Error)] == [
            ("invalid_event", False)
        ]
        assert server.daemon.bus.head_seq == 0  # nothing was published
        await publish_all(sock_path, [SessionInfo(message="clean")])
        seen = await receive_until(watcher, lambda f: event_seqs(f, sub=2))
        assert [e.event for f in seen if isinstance(f, Events) for e in f.events] == [
            SessionInfo(message="clean")
        ]
        await watcher.aclose()
        await raw.aclose()


async def test_binary_in_an_ingest_or_a_request_is_a_malformed_frame(sock_path: Path) -> None:
    async with running_daemon(sock_path, plugins=broken_plugins()) as server:
        raw = await RawClient.open(sock_path)
        ingest = msgspec.msgpack.encode({"op": "ingest", "sdk": "exploding", "events": [b"\x00"]})
        request = msgspec.msgpack.encode(
            {
                "op": "request",
                "id": 9,
                "command": {
                    "cmd": "start_run",
                    "adapter": "x",
                    "prompt": "p",
                    "options": {"k": b""},
                },
            }
        )
        for body in (ingest, request):
            await raw.send_bytes(len(body).to_bytes(4, "big") + body)
        await raw.send(Ping(nonce=3))
        frames = await receive_until(raw, lambda f: Pong(nonce=3) in f)
        assert isinstance(frames[0], Error)
        assert frames[0].code == "malformed_frame"
        assert isinstance(frames[1], Reply)
        assert (frames[1].id, frames[1].ok) == (9, False)
        assert frames[1].error is not None
        assert frames[1].error.code == "malformed_frame"
        assert server.daemon.bus.head_seq == 0
        await raw.aclose()


async def test_text_whose_utf8_looks_like_binary_markers_is_accepted(sock_path: Path) -> None:
    texts = ["Zażółć gęślą jaźń", "שלום עולם", "Ղ Ճ Մ", "مرحبا"]
    async with running_daemon(sock_path):
        watcher = await lagging_subscriber(sock_path)
        await publish_all(sock_path, [TextDelta(message_id="m", text=t) for t in texts])
        frames = await receive_until(watcher, lambda f: len(event_seqs(f)) >= len(texts))
        await watcher.aclose()
    got = [e.event for f in frames if isinstance(f, Events) for e in f.events]
    assert got == [TextDelta(message_id="m", text=t) for t in texts]


# -- 8. all or nothing ----------------------------------------------------------------


@pytest.mark.parametrize("before", [1, 40])  # a small frame is looked at event by event
async def test_a_publish_frame_with_one_refused_event_publishes_none(
    sock_path: Path, before: int
) -> None:
    async with running_daemon(sock_path) as server:
        watcher = await lagging_subscriber(sock_path)
        await watcher.send(Subscribe(id=2, window_ms=0))
        raw = await RawClient.open(sock_path)
        frame = Publish(
            events=[
                *[Outgoing(event=SessionInfo(message="a"))] * before,
                Outgoing(event=StreamingStats(elapsed_s=1.0)),  # derived by the daemon: refused
                Outgoing(event=SessionInfo(message="b")),
            ]
        )
        await raw.send(frame)
        await raw.send(Ping(nonce=4))
        frames = await receive_until(raw, lambda f: Pong(nonce=4) in f)
        errors = [f for f in frames if isinstance(f, Error)]
        assert [(e.code, e.fatal) for e in errors] == [("invalid_event", False)]
        assert f"events[{before}]" in errors[0].message
        assert server.daemon.bus.head_seq == 0
        assert server.daemon.counters.rejected_events == before + 2
        await publish_all(sock_path, [SessionInfo(message="c")])
        seen = await receive_until(watcher, lambda f: event_seqs(f, sub=2))
        assert [e.event for f in seen if isinstance(f, Events) for e in f.events] == [
            SessionInfo(message="c")
        ]
        await watcher.aclose()
        await raw.aclose()


async def test_a_failed_resubscribe_leaves_the_live_subscription_alone(sock_path: Path) -> None:
    async with running_daemon(sock_path):
        raw = await RawClient.open(sock_path)
        await raw.send(Subscribe(id=1, patterns=("stream.session.info",), window_ms=0))
        await raw.send(Subscribe(id=1, patterns=("stream.te*",)))
        await raw.send(Ping(nonce=5))
        frames = await receive_until(raw, lambda f: Pong(nonce=5) in f)
        errors = [f for f in frames if isinstance(f, Error)]
        assert [(e.code, e.ref) for e in errors] == [("invalid_pattern", 1)]
        await publish_all(sock_path, [SessionInfo(message="still subscribed")])
        seen = await receive_until(raw, lambda f: event_seqs(f, sub=1))
        await raw.aclose()
    assert [e.event for f in seen if isinstance(f, Events) for e in f.events] == [
        SessionInfo(message="still subscribed")
    ]


# -- 10. admission --------------------------------------------------------------------


async def test_silent_sockets_do_not_count_toward_the_per_uid_limit(sock_path: Path) -> None:
    async with running_daemon(sock_path, DaemonConfig(max_connections_per_uid=3)):
        silent = [await RawClient.open(sock_path, hello=False) for _ in range(6)]
        state = await status(sock_path)
        assert (state["clients"], state["handshakes"]) == (1, 6)
        for raw in silent:
            await raw.aclose()


async def test_the_oldest_silent_sockets_make_room_for_a_newcomer(sock_path: Path) -> None:
    config = DaemonConfig(max_handshakes_per_uid=2)
    async with running_daemon(sock_path, config):
        silent = [await RawClient.open(sock_path, hello=False) for _ in range(6)]
        state = await status(sock_path)  # it was a newcomer in its handshake too
        assert state["clients"] == 1
        assert state["handshakes"] <= 2
        with trio.fail_after(20):
            first = await silent[0].receive_until_closed()
        assert [type(f).__name__ for f in first] == ["Error", "Goodbye"]
        assert isinstance(first[0], Error)
        assert (first[0].code, first[0].fatal) == ("too_many_connections", True)
        for raw in silent[1:]:
            await raw.aclose()


async def test_the_per_uid_limit_counts_connections_after_hello(sock_path: Path) -> None:
    config = DaemonConfig(max_connections_per_uid=2)
    async with running_daemon(sock_path, config):
        async with connect(sock_path) as first, connect(sock_path) as second:
            with pytest.raises(ConnectionLost) as refused:
                async with connect(sock_path):
                    pass
            assert refused.value.reason == "too_many_connections"
            await first.ping()
            await second.ping()
        assert (await status(sock_path))["clients"] == 1


def fill_backlog(path: Path) -> list[socket.socket]:
    """Connect without being accepted until the listener's queue is full."""
    filled: list[socket.socket] = []
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            sock.connect(os.fspath(path))
        except BlockingIOError:
            sock.close()
            return filled
        filled.append(sock)


async def test_connect_failures_are_the_client_librarys_own_errors(
    sock_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    with pytest.raises(DaemonNotRunning):  # ENOENT
        async with connect(sock_path):
            pass
    unbound = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unbound.bind(os.fspath(sock_path))  # a socket file nobody listens on: ECONNREFUSED
    with pytest.raises(DaemonNotRunning):
        async with connect(sock_path):
            pass
    unbound.close()
    os.unlink(sock_path)

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(os.fspath(sock_path))
    listener.listen(1)
    queued = fill_backlog(sock_path)  # EAGAIN from here on
    with pytest.raises(ConnectionLost) as busy:
        async with connect(sock_path):
            pass
    assert busy.value.reason == "busy"
    for sock in queued:
        sock.close()
    listener.close()


async def test_a_reset_during_the_handshake_is_a_connection_lost(sock_path: Path) -> None:
    listener = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await listener.bind(os.fspath(sock_path))
    listener.listen(8)

    async def rude_server() -> None:
        conn, _ = await listener.accept()
        await trio.lowlevel.wait_readable(conn)  # the hello arrived, unread:
        conn.close()  # closing now resets the connection

    async with trio.open_nursery() as nursery:
        nursery.start_soon(rude_server)
        with pytest.raises(ConnectionLost) as lost:
            async with connect(sock_path):
                pass
    assert lost.value.reason == "closed"
    listener.close()
