"""The daemon over a real Unix socket, driven by the client library and by raw bytes."""

from __future__ import annotations

import gc
import shutil
import struct
import tempfile
import warnings
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from socket import SO_SNDBUF, SOL_SOCKET
from types import FunctionType

import msgspec
import pytest
import trio
import trio.testing

from busd.client import (
    Batch,
    ClientStatistics,
    ClientSubscription,
    RequestFailed,
    SubscribeFailed,
    connect,
)
from busd.core.accounting import SETTLE_STRETCH, Accountant
from busd.core.catalog import Catalog
from busd.core.cohorts import SharedBatch
from busd.core.events import (
    Envelope,
    Event,
    SessionIdle,
    SessionInfo,
    SessionStart,
    StreamingStats,
    TextDelta,
    TokenUsage,
    ToolComplete,
    ToolStart,
    TurnEnd,
    Usage,
)
from busd.daemon.batching import BatchDispatcher
from busd.daemon.connection import Connection
from busd.daemon.hub import Daemon, DaemonConfig, Subscription
from busd.wire import (
    PROTOCOL_VERSION,
    Error,
    Events,
    Goodbye,
    Hello,
    Outgoing,
    Ping,
    Pong,
    Publish,
    Reply,
    Request,
    Sessions,
    Snapshot,
    Stats,
    Status,
    Subscribe,
    encode_frame,
    server_frame_decoder,
)

from .daemon_helpers import RawClient, accepted, running_daemon


@pytest.fixture
def sock_path() -> Iterator[Path]:
    # AF_UNIX paths are short: pytest's tmp_path can be too long.
    directory = Path(tempfile.mkdtemp(prefix="busd-", dir="/tmp"))
    yield directory / "bus.sock"
    shutil.rmtree(directory, ignore_errors=True)


async def collect(sub: ClientSubscription, count: int) -> list[Envelope[Event]]:
    """Read until ``count`` envelopes arrived (a guard fails a hung test)."""
    got: list[Envelope[Event]] = []
    with trio.fail_after(20):
        async for batch in sub:
            got.extend(batch.events)
            if len(got) >= count:
                break
    return got


def index_of(envelope: Envelope[Event]) -> int:
    assert isinstance(envelope.event, TextDelta)
    return int(envelope.event.text.split()[0])


def delta(i: int, message: str = "m1") -> TextDelta:
    return TextDelta(message_id=message, text=f"piece {i} ")


# -- several frontends at once ------------------------------------------------


async def test_three_frontends_each_get_exactly_their_events_in_seq_order(
    sock_path: Path,
) -> None:
    published: list[tuple[Event, str]] = []
    for i in range(200):
        session = "s1" if i % 3 else "s2"
        event: Event = delta(i) if i % 5 else SessionInfo(message=f"note {i}")
        published.append((event, session))
    published.append((SessionIdle(), "s1"))
    published.append((SessionIdle(), "s2"))

    def expected(pattern_types: set[str] | None, session: str | None) -> list[Event]:
        return [
            e
            for e, s in published
            if (pattern_types is None or e.__struct_config__.tag in pattern_types)
            and (session is None or s == session)
        ]

    everything = expected(None, None)
    text_of_s1 = expected({"stream.text.delta"}, "s1")
    lifecycle = expected({"stream.session.info", "stream.session.idle"}, None)

    async with (
        running_daemon(sock_path),
        connect(sock_path, client="all") as a,
        connect(sock_path, client="text-s1") as b,
        connect(sock_path, client="lifecycle") as c,
        connect(sock_path, client="agent", role="agent") as publisher,
        a.subscribe(["stream.>"], window_ms=0, deltas="raw") as sa,
        b.subscribe(["stream.text.*"], sessions=["s1"], window_ms=16, deltas="raw") as sb,
        c.subscribe(["stream.session.>"], window_ms=50) as sc,
    ):
        async with trio.open_nursery() as nursery:
            results: dict[str, list[Envelope[Event]]] = {}

            async def read(name: str, sub: ClientSubscription, count: int) -> None:
                results[name] = await collect(sub, count)

            nursery.start_soon(read, "a", sa, len(everything))
            nursery.start_soon(read, "b", sb, len(text_of_s1))
            nursery.start_soon(read, "c", sc, len(lifecycle))
            for event, session in published:
                await publisher.publish(event, session_id=session)
            await publisher.flush()

    for name, want in (("a", everything), ("b", text_of_s1), ("c", lifecycle)):
        got = results[name]
        assert [e.event for e in got] == want, name
        seqs = [e.seq for e in got]
        assert seqs == sorted(set(seqs)), f"{name}: not in strict seq order"
    assert {e.session_id for e in results["b"]} == {"s1"}


async def test_a_frontend_that_leaves_resumes_without_a_gap(sock_path: Path) -> None:
    async with running_daemon(sock_path), connect(sock_path, role="agent") as publisher:
        async with connect(sock_path) as first, first.subscribe(["stream.text.>"]) as sub:
            for i in range(50):
                await publisher.publish(delta(i), session_id="s1")
            await publisher.flush()
            seen = await collect(sub, 1)
            while "piece 49 " not in "".join(
                e.event.text for e in seen if isinstance(e.event, TextDelta)
            ):
                seen += await collect(sub, 1)
        last = seen[-1].seq
        for i in range(50, 120):  # published while nobody listens
            await publisher.publish(delta(i), session_id="s1")
        await publisher.flush()
        async with (
            connect(sock_path) as again,
            again.subscribe(["stream.text.>"], since_seq=last, deltas="raw") as resumed,
        ):
            rest = await collect(resumed, 70)
        text = "".join(e.event.text for e in (*seen, *rest) if isinstance(e.event, TextDelta))
        assert text == "".join(f"piece {i} " for i in range(120))
        assert rest[0].seq == last + 1


async def test_merged_and_raw_subscribers_agree_on_the_text(sock_path: Path) -> None:
    async with (
        running_daemon(sock_path),
        connect(sock_path) as client,
        connect(sock_path, role="agent") as publisher,
        client.subscribe(["stream.text.delta"], window_ms=1000, deltas="merged") as merged,
        client.subscribe(["stream.text.delta"], window_ms=0, deltas="raw") as raw,
    ):
        for i in range(100):
            publisher.publish_nowait(delta(i), session_id="s1")
        await publisher.flush()
        raw_events = await collect(raw, 100)
        merged_events: list[Envelope[Event]] = []
        while sum(len(e.event.text) for e in merged_events if isinstance(e.event, TextDelta)) < (
            sum(len(e.event.text) for e in raw_events if isinstance(e.event, TextDelta))
        ):
            merged_events += await collect(merged, 1)
    assert len(merged_events) < len(raw_events) == 100
    assert "".join(e.event.text for e in merged_events if isinstance(e.event, TextDelta)) == (
        "".join(e.event.text for e in raw_events if isinstance(e.event, TextDelta))
    )
    assert merged_events[-1].seq == raw_events[-1].seq


# -- send buffers ----------------------------------------------------------------


def _net_core(name: str) -> int:
    return int(Path(f"/proc/sys/net/core/{name}").read_text())


@pytest.mark.parametrize("asked", [0, 1 << 20])
async def test_each_client_socket_gets_the_configured_send_buffer(
    sock_path: Path, asked: int
) -> None:
    # Linux reports twice what was asked (its bookkeeping), capped by wmem_max.
    expected = 2 * min(asked, _net_core("wmem_max")) if asked else _net_core("wmem_default")
    async with running_daemon(sock_path, DaemonConfig(send_buffer=asked)) as server:
        async with connect(sock_path) as client:
            await client.ping()
            (connection,) = server._connections
            assert isinstance(connection.stream, trio.SocketStream)
            assert connection.stream.socket.getsockopt(SOL_SOCKET, SO_SNDBUF) == expected


async def test_a_send_buffer_the_kernel_caps_is_said_once(
    sock_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    asked = 2 * _net_core("wmem_max")
    caplog.set_level("INFO", logger="busd.server")
    async with running_daemon(sock_path, DaemonConfig(send_buffer=asked)):
        for _ in range(2):
            async with connect(sock_path) as client:
                await client.ping()
    said = [r.getMessage() for r in caplog.records if "wmem_max" in r.getMessage()]
    assert said == [
        f"client send buffers are {_net_core('wmem_max')} bytes, not {asked}: "
        "the kernel caps them (sysctl net.core.wmem_max)"
    ]


# -- slow consumers --------------------------------------------------------------


async def test_a_client_that_never_reads_is_dropped_with_its_resume_seq(sock_path: Path) -> None:
    config = DaemonConfig(outbound_cap=256 << 10, subscription_buffer=1000)
    text = "x" * 400
    total = 8000  # ~3.5 MB: far past the cap and the kernel's socket buffers
    async with running_daemon(sock_path, config) as server:
        stalled = await RawClient.open(sock_path)
        await stalled.send(
            Subscribe(id=1, patterns=("stream.text.delta",), window_ms=0, deltas="raw")
        )
        await stalled.send(Ping(nonce=1))
        assert isinstance(await stalled.receive(), Pong)
        async with (
            connect(sock_path) as bystander,
            connect(sock_path, role="agent") as publisher,
            bystander.subscribe(["stream.text.delta"], deltas="raw") as sub,
        ):
            async with trio.open_nursery() as nursery:
                received: list[Envelope[Event]] = []
                progress = trio.Condition()

                async def read() -> None:
                    with trio.fail_after(20):
                        async for batch in sub:
                            received.extend(batch.events)
                            async with progress:
                                progress.notify_all()
                            if len(received) >= total:
                                break

                nursery.start_soon(read)
                for i in range(total):
                    await publisher.publish(
                        TextDelta(message_id="m", text=f"{i} {text}"), session_id="s1"
                    )
                    if i % 250 == 249:
                        # The bystander reads as fast as this process lets it: keep the
                        # publisher (same process) within what it can buffer, so only
                        # the client that never reads can fall behind.
                        await publisher.flush()
                        async with progress:
                            while len(received) <= i - 500:
                                await progress.wait()
                await publisher.flush()  # the publisher was never blocked for good
        assert [index_of(e) for e in received] == list(range(total))
        assert server.daemon.counters.slow_consumer_disconnects == 1

        frames = await stalled.receive_until_closed()
        goodbye = frames[-1]
        assert isinstance(goodbye, Goodbye)
        assert goodbye.reason == "slow_consumer"
        assert goodbye.resume_seq is not None
        got = [e for f in frames if isinstance(f, Events) for e in f.events]
        assert [index_of(e) for e in got] == list(range(len(got)))  # a prefix, no holes
        assert len(got) < total
        # Resuming after resume_seq loses nothing, and sends nothing again: it is
        # exactly the last event that went out before the goodbye.
        assert goodbye.resume_seq == got[-1].seq


# -- bad input -------------------------------------------------------------------


async def test_hostile_bytes_get_error_frames_and_bystanders_carry_on(sock_path: Path) -> None:
    async with (
        running_daemon(sock_path) as server,
        connect(sock_path) as bystander,
        bystander.subscribe(["stream.session.info"]) as sub,
    ):
        # A body that is not msgpack: non-fatal, the connection lives on.
        garbage = await RawClient.open(sock_path)
        await garbage.send_bytes(struct.pack(">I", 3) + b"\xc1\xc1\xc1")
        error = await garbage.receive()
        assert isinstance(error, Error)
        assert (error.code, error.fatal) == ("malformed_frame", False)
        await garbage.send(Ping(nonce=7))
        assert await garbage.receive() == Pong(nonce=7)

        # Invalid UTF-8 inside a string, and absurd nesting: non-fatal too.
        bad_utf8 = b"\x81\xa2op\xa4pi\xffg"  # {"op": "pi\xffg"}: 0xff is never UTF-8
        await garbage.send_bytes(struct.pack(">I", len(bad_utf8)) + bad_utf8)
        error = await garbage.receive()
        assert isinstance(error, Error)
        assert error.fatal is False
        nested = b"\x91" * 10_000 + b"\x00"
        await garbage.send_bytes(struct.pack(">I", len(nested)) + nested)
        error = await garbage.receive()
        assert isinstance(error, Error)
        assert error.fatal is False
        await garbage.send(Ping(nonce=8))
        assert await garbage.receive() == Pong(nonce=8)

        # An oversized length prefix: fatal, refused before any body is read;
        # a goodbye with the resume point follows every fatal error.
        oversized = await RawClient.open(sock_path)
        await oversized.send_bytes(struct.pack(">I", 64 << 20))
        *frames, goodbye = await oversized.receive_until_closed()
        assert isinstance(frames[-1], Error)
        assert (frames[-1].code, frames[-1].fatal) == ("frame_too_large", True)
        assert goodbye == Goodbye(reason="frame_too_large", resume_seq=0)

        # A first frame that is not hello; a wrong protocol version.
        rude = await RawClient.open(sock_path, hello=False)
        await rude.send(Ping())
        *frames, goodbye = await rude.receive_until_closed()
        assert [(f.code, f.fatal) for f in frames] == [("bad_handshake", True)]
        assert goodbye == Goodbye(reason="bad_handshake", resume_seq=0)
        old = await RawClient.open(sock_path, hello=False)
        await old.send(Hello(protocol=PROTOCOL_VERSION + 1, client="future"))
        *frames, goodbye = await old.receive_until_closed()
        assert [(f.code, f.fatal) for f in frames] == [("version_mismatch", True)]
        assert goodbye.reason == "version_mismatch"

        # A truncated frame, then the client vanishes.
        truncated = await RawClient.open(sock_path)
        await truncated.send_bytes(struct.pack(">I", 100) + b"\x81")
        await truncated.aclose()

        # An event the daemon derives itself may not be published by a client.
        async with connect(sock_path, role="agent") as publisher:
            await publisher.publish(StreamingStats(elapsed_s=1.0), session_id="s1")
            await publisher.flush()
            assert [e.code for e in publisher.errors] == ["invalid_event"]
            await publisher.publish(SessionInfo(message="still here"), session_id="s1")
            await publisher.flush()
        [envelope] = await collect(sub, 1)
        assert envelope.event == SessionInfo(message="still here")
        assert server.daemon.counters.protocol_errors >= 5
        assert server.daemon.counters.rejected_events == 1
        await garbage.aclose()


async def test_unknown_commands_and_sessions_get_failed_replies(sock_path: Path) -> None:
    async with running_daemon(sock_path), connect(sock_path) as client:
        raw = await RawClient.open(sock_path)
        body = msgspec.msgpack.encode({"op": "request", "id": 9, "command": {"cmd": "nope"}})
        await raw.send_bytes(struct.pack(">I", len(body)) + body)
        reply = await raw.receive()
        assert isinstance(reply, Reply)
        assert (reply.id, reply.ok) == (9, False)
        assert reply.error is not None
        assert reply.error.code == "unknown_command"
        await raw.aclose()
        with pytest.raises(RequestFailed, match="unknown_session"):
            await client.request(Snapshot(session_id="never"))
        with pytest.raises(RequestFailed, match="unknown_session"):
            await client.request(Stats(session_id="never"))


async def test_bad_subscriptions_are_refused_clearly(sock_path: Path) -> None:
    async with (
        running_daemon(sock_path, DaemonConfig(max_subscriptions=2)),
        connect(sock_path) as client,
    ):
        with pytest.raises(SubscribeFailed, match="invalid_pattern"):
            async with client.subscribe(["stream.>.delta"]):
                pass
        async with client.subscribe(["a.>"]), client.subscribe(["b.>"]):
            with pytest.raises(SubscribeFailed, match="too_many_subscriptions"):
                async with client.subscribe(["c.>"]):
                    pass


async def test_connections_per_uid_are_limited(sock_path: Path) -> None:
    async with running_daemon(sock_path, DaemonConfig(max_connections_per_uid=2)) as server:
        first = await RawClient.open(sock_path)
        second = await RawClient.open(sock_path)
        third = await RawClient.open(sock_path, hello=False)  # counted once it says hello
        await third.send(Hello(protocol=PROTOCOL_VERSION, client="third"))
        *frames, goodbye = await third.receive_until_closed()
        assert [(f.code, f.fatal) for f in frames] == [("too_many_connections", True)]
        assert goodbye == Goodbye(reason="too_many_connections", resume_seq=0)
        await first.aclose()
        await second.send(Ping(nonce=3))
        assert await second.receive() == Pong(nonce=3)
        await second.aclose()
        assert server.daemon.counters.protocol_errors == 0


# -- requests --------------------------------------------------------------------


async def test_status_sessions_snapshot_and_stats(sock_path: Path) -> None:
    async with (
        running_daemon(sock_path),
        connect(sock_path, role="agent") as publisher,
        connect(sock_path, client="ui") as ui,
        ui.subscribe(["stream.session.idle"]) as sub,
    ):
        await publisher.publish(SessionStart(model="claude-x", title="T"), session_id="s1")
        await publisher.publish(delta(1), session_id="s1")
        await publisher.publish(ToolStart(tool_call_id="t1", name="Bash"), session_id="s1")
        await publisher.publish(ToolComplete(tool_call_id="t1", status="error"), session_id="s1")
        await publisher.publish(ToolStart(tool_call_id="t2", name="Bash"), session_id="s1")
        await publisher.publish(ToolComplete(tool_call_id="t2", output="ok"), session_id="s1")
        await publisher.publish(Usage(tokens=TokenUsage(output_tokens=30)), session_id="s1")
        await publisher.publish(Usage(tokens=TokenUsage(output_tokens=30)), session_id="s1")
        await publisher.publish(TurnEnd(finish_reason="end_turn"), session_id="s1")
        await publisher.publish(SessionIdle(), session_id="s1")
        await publisher.flush()
        await collect(sub, 1)

        status = await ui.request(Status())
        assert status["clients"] == 2
        assert status["clients_by_role"] == {"agent": 1, "frontend": 1}
        assert status["subscriptions"] == 1
        assert status["sessions"] == 1
        assert status["head_seq"] >= 6

        [summary] = await ui.request(Sessions())
        assert (summary["session_id"], summary["status"], summary["model"]) == (
            "s1",
            "idle",
            "claude-x",
        )
        snapshot = await ui.request(Snapshot(session_id="s1"))
        assert snapshot["usage"]["output_tokens"] == 30  # cumulative: 30, never 60
        stats = await ui.request(Stats(session_id="s1"))
        assert stats["output_tokens"] == 30
        daemon_stats = await ui.request(Stats())
        assert daemon_stats["bus"]["head_seq"] == status["head_seq"] or (
            daemon_stats["bus"]["head_seq"] > status["head_seq"]
        )
        assert set(daemon_stats) == {
            *("bus", "correlation", "history", "sessions", "fanout", "tools")
        }
        bash = daemon_stats["tools"]["Bash"]  # simse's getToolMetrics, by name (issue 22)
        assert (bash["name"], bash["calls"], bash["errors"]) == ("Bash", 2, 1)
        assert bash["last_called"] is not None
        fanout = daemon_stats["fanout"]
        assert (fanout["cohorts"], fanout["members"]) == (1, 1)
        assert fanout["batches"] > 0  # the idle event went out


async def test_too_many_unread_replies_are_refused(autojump_clock: trio.abc.Clock) -> None:
    """Over a lockstep stream, replies the client does not read pile up in the outbox."""
    daemon = Daemon(DaemonConfig(max_requests=3))
    server_side, client_side = trio.testing.lockstep_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(Connection(daemon, server_side, uid=0).serve)
        await client_side.send_all(encode_frame(Hello(protocol=PROTOCOL_VERSION, client="t")))
        decoder = server_frame_decoder(Catalog())
        decoder.feed(await client_side.receive_some(65536))
        assert decoder.next_frame() is not None  # welcome
        for request_id in range(1, 9):
            await client_side.send_all(encode_frame(Request(id=request_id, command=Status())))
        replies: list[Reply] = []
        while len(replies) < 8:
            decoder.feed(await client_side.receive_some(65536))
            replies += [f for f in decoder if isinstance(f, Reply)]
        nursery.cancel_scope.cancel()
    by_id = {r.id: r for r in replies}
    refused = [i for i, r in by_id.items() if not r.ok]
    assert refused
    codes = {error.code for i in refused if (error := by_id[i].error) is not None}
    assert codes == {"too_many_requests"}
    assert by_id[1].ok


async def test_a_client_that_never_says_hello_is_timed_out(
    autojump_clock: trio.abc.Clock,
) -> None:
    daemon = Daemon(DaemonConfig(handshake_timeout=5.0))
    server_side, client_side = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(Connection(daemon, server_side, uid=0).serve)
        start = trio.current_time()
        data = await client_side.receive_some(65536)
        assert trio.current_time() - start == pytest.approx(5.0)
    decoder = server_frame_decoder(Catalog())
    decoder.feed(data)
    frame = decoder.next_frame()
    assert isinstance(frame, Error)
    assert (frame.code, frame.fatal) == ("handshake_timeout", True)


# -- replay ------------------------------------------------------------------------


async def test_resume_from_evicted_history_reports_the_gap_first(sock_path: Path) -> None:
    async with (
        running_daemon(sock_path, DaemonConfig(replay=10)),
        connect(sock_path, role="agent") as publisher,
    ):
        for i in range(30):
            await publisher.publish(SessionInfo(message=str(i)), session_id="s1")
        await publisher.flush()
        async with connect(sock_path) as client:
            async with client.subscribe(["stream.session.info"], since_seq=5) as sub:
                batches: list[Batch] = []
                with trio.fail_after(10):
                    async for batch in sub:
                        batches.append(batch)
                        if sum(len(b.events) for b in batches) >= 10:
                            break
            assert batches[0].gap is not None
            gap_from, gap_to = batches[0].gap
            replayed = [e for b in batches for e in b.events]
            assert gap_from == 6
            assert gap_to == replayed[0].seq - 1
            assert [e.seq for e in replayed] == list(range(gap_to + 1, gap_to + 11))
            async with client.subscribe(["stream.session.info"], since_seq=27) as recent:
                tail = await collect(recent, 3)
            assert [e.event for e in tail] == [SessionInfo(message=str(i)) for i in (27, 28, 29)]


async def test_a_long_ring_replay_is_filtered_and_followed_by_live_events_once(
    sock_path: Path,
) -> None:
    """A replay of several chunks (cut and filtered between checkpoints) while a publisher
    goes on: each of the session's seqs once, in order, none of the other session's."""
    async with (
        running_daemon(sock_path, DaemonConfig(replay=20_000)) as server,
        connect(sock_path, role="agent") as publisher,
        connect(sock_path) as client,
        trio.open_nursery() as nursery,
    ):

        async def publish(count: int, *, end: bool = False) -> None:
            for i in range(count):
                await publisher.publish(SessionInfo(message=str(i)), session_id=f"s{i % 2}")
            if end:
                await publisher.publish(SessionInfo(message="end"), session_id="s0")
            await publisher.flush()

        await publish(6000)
        got: list[Envelope[Event]] = []
        async with client.subscribe([">"], since_seq=0, sessions=["s0"], window_ms=0) as sub:
            nursery.start_soon(partial(publish, 1000, end=True))  # live while it replays
            with trio.fail_after(20):
                async for batch in sub:
                    assert batch.gap is None
                    got += batch.events
                    if SessionInfo(message="end") in (e.event for e in batch.events):
                        break
        wanted = [e.seq for e in accepted(server.daemon) if e.session_id == "s0"]
        assert [e.seq for e in got] == wanted[: len(got)]
        assert got[-1].event == SessionInfo(message="end")
        assert sum(isinstance(e.event, SessionInfo) for e in got) == 3501


# -- shutdown and reconnection --------------------------------------------------------


async def test_shutdown_flushes_pending_batches_then_says_goodbye(sock_path: Path) -> None:
    async with running_daemon(sock_path) as server:
        raw = await RawClient.open(sock_path)
        await raw.send(Subscribe(id=1, patterns=("stream.>",), window_ms=60_000))
        await raw.send(Ping(nonce=1))
        assert await raw.receive() == Pong(nonce=1)
        async with connect(sock_path, role="agent") as publisher:
            await publisher.publish(SessionInfo(message="first"), session_id="s1")
            await publisher.flush()
            first = await raw.receive()  # the first event after idle goes out at once
            for i in range(5):
                await publisher.publish(SessionInfo(message=str(i)), session_id="s1")
            await publisher.flush()
        await server.shutdown()
        frames = [first, *await raw.receive_until_closed()]
    delivered = [e.event for f in frames if isinstance(f, Events) for e in f.events]
    assert delivered == [SessionInfo(message="first")] + [
        SessionInfo(message=str(i)) for i in range(5)
    ]
    assert isinstance(frames[-1], Goodbye)
    assert frames[-1].reason == "shutdown"


async def test_a_reconnecting_client_resumes_after_being_dropped(sock_path: Path) -> None:
    async with running_daemon(sock_path) as server, connect(sock_path, role="agent") as publisher:
        async with (
            connect(sock_path, client="ui", reconnect=True) as ui,
            ui.subscribe(["stream.session.info"], window_ms=0) as sub,
        ):
            await publisher.publish(SessionInfo(message="0"), session_id="s1")
            await publisher.flush()
            got = await collect(sub, 1)
            for connection in list(server._connections):
                if connection.name.startswith("ui["):  # its identity: ui[pid=…,uid=…]
                    await connection.goodbye()
            for i in range(1, 20):  # some while the client is away
                await publisher.publish(SessionInfo(message=str(i)), session_id="s1")
            await publisher.flush()
            got += await collect(sub, 19)
            assert ui.statistics().reconnects == 1  # it was dropped, and came back
    assert [e.event for e in got] == [SessionInfo(message=str(i)) for i in range(20)]
    assert [e.seq for e in got] == sorted({e.seq for e in got})


async def test_a_client_still_saying_hello_at_shutdown_gets_welcome_then_goodbye() -> None:
    daemon = Daemon()
    server_side, client_side = trio.testing.memory_stream_pair()
    connection = Connection(daemon, server_side, uid=0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(connection.serve)
        await trio.testing.wait_all_tasks_blocked()
        await connection.goodbye()  # the daemon stops before the hello arrived
        await client_side.send_all(encode_frame(Hello(protocol=PROTOCOL_VERSION, client="late")))
        decoder = server_frame_decoder(Catalog())
        frames: list[object] = []
        while data := await client_side.receive_some(65536):
            decoder.feed(data)
            frames += list(decoder)
    assert [type(f).__name__ for f in frames] == ["Welcome", "Goodbye"]
    goodbye = frames[-1]
    assert isinstance(goodbye, Goodbye)
    assert goodbye.reason == "shutdown"


async def test_the_resume_seq_covers_batches_split_over_many_frames(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A dropped client resumes before the oldest event of any frame it did not get."""
    daemon = Daemon(DaemonConfig(max_frame=4096, outbound_cap=8192, subscription_buffer=50))
    server_side, client_side = trio.testing.lockstep_stream_pair()  # no buffering at all
    decoder = server_frame_decoder(Catalog())

    async def receive() -> None:
        decoder.feed(await client_side.receive_some(65536))

    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.run)
        nursery.start_soon(Connection(daemon, server_side, uid=0).serve)
        await client_side.send_all(encode_frame(Hello(protocol=PROTOCOL_VERSION, client="t")))
        await receive()  # welcome
        subscribe = Subscribe(id=1, patterns=("stream.text.delta",), window_ms=0, deltas="raw")
        await client_side.send_all(encode_frame(subscribe))
        await trio.testing.wait_all_tasks_blocked()
        for i in range(400):  # ~9 events fit a 4 KiB frame: batches span many frames
            daemon.publish(TextDelta(message_id="m", text=f"{i} " + "x" * 400), session_id="s")
            await trio.testing.wait_all_tasks_blocked()
        assert daemon.counters.slow_consumer_disconnects == 1
        frames: list[object] = []
        with trio.fail_after(60):
            while not any(isinstance(f, Goodbye) for f in frames):
                await receive()
                frames += list(decoder)
        nursery.cancel_scope.cancel()
    goodbye = frames[-1]
    assert isinstance(goodbye, Goodbye)
    assert goodbye.reason == "slow_consumer"
    assert goodbye.resume_seq is not None
    received = {e.seq for f in frames if isinstance(f, Events) for e in f.events}
    published = [e.seq for e in accepted(daemon) if isinstance(e.event, TextDelta)]
    # Everything up to resume_seq arrived: resuming after it loses nothing.
    assert [s for s in published if s <= goodbye.resume_seq] == sorted(
        s for s in received if s <= goodbye.resume_seq
    )
    assert max(received) == goodbye.resume_seq < published[-1]  # and nothing is sent twice


async def test_a_client_cancelled_mid_connection_closes_its_socket(tmp_path: Path) -> None:
    """Cancelling the task that holds ``connect`` leaves no socket to the collector."""
    path = tmp_path / "bus.sock"
    async with running_daemon(path):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with trio.CancelScope() as scope:
                async with connect(path) as client:
                    scope.cancel()
                    await trio.sleep_forever()
            del client
            gc.collect()
        assert not [w for w in caught if issubclass(w.category, ResourceWarning)]


async def test_a_connection_that_ends_leaves_nothing_for_the_collector(tmp_path: Path) -> None:
    """Its objects go when it does (reference counting), not at the next collection.

    A full collection walks the whole heap and stops the daemon meanwhile;
    frontends that come and go all day should not feed it.
    """
    path = tmp_path / "bus.sock"

    async def visit(k: int) -> None:  # publishes, asks, subscribes twice, and leaves
        async with connect(path, client=f"visitor-{k}", role="agent") as client:
            async with client.subscribe(["stream.>"], window_ms=0) as sub:
                await client.publish(TextDelta(message_id="m", text="hi"), session_id="s", ack=True)
                assert (await anext(sub)).events
            async with client.subscribe(sessions=["s"]):
                await client.request(Status())

    async with running_daemon(path):
        await visit(0)  # the first connection makes what every later one reuses
        gc.collect()
        gc.disable()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            for k in range(1, 4):
                await visit(k)
            await trio.testing.wait_all_tasks_blocked()
            gc.collect()
            left = sorted({type(o).__qualname__ for o in gc.garbage if _of_busd_daemon(o)})
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
    assert left == []


def _of_busd_daemon(o: object) -> bool:
    """An instance of the daemon's classes, or one of its functions (closures included)."""
    module = o.__module__ if isinstance(o, FunctionType) else type(o).__module__
    return module.startswith("busd.daemon")


# -- a burst is settled before the daemon reads on -------------------------------


async def test_a_publish_frame_is_accounted_and_delivered_before_the_next_read(
    sock_path: Path,
) -> None:
    # No tick for an hour: the accountant's loop wakes once, for the first
    # delta, and then leaves the deltas alone.
    async with (
        running_daemon(sock_path, accountant=Accountant(tick_interval=3600)) as server,
        connect(sock_path) as reader,
        connect(sock_path, role="agent") as publisher,
        reader.subscribe(["stream.text.delta"], deltas="raw", window_ms=0) as sub,
    ):
        await publisher.publish(TextDelta(message_id="m", text="0 "), session_id="s1")
        await publisher.flush()
        for i in range(1, 50):
            publisher.publish_nowait(TextDelta(message_id="m", text=f"{i} "), session_id="s1")
        await publisher.flush()  # the daemon's reader handled the frame and waits again
        assert server.daemon.accountant.deferred_deltas == 0
        stats = server.daemon.session_stats("s1")
        assert stats is not None
        assert stats.output_tokens > 0
        got = await collect(sub, 50)
        assert [e.event.text for e in got if isinstance(e.event, TextDelta)][-1] == "49 "


async def test_settle_delivers_a_burst_before_it_accounts_the_deltas() -> None:
    # The subscribers get the burst first; the token estimates come after,
    # still before the connection reads on.
    daemon = Daemon(DaemonConfig(journal=None), accountant=Accountant(tick_interval=3600))
    pending_at_delivery: list[int] = []

    async def send(batch: list[Envelope[Event]]) -> None:
        raise AssertionError("a burst that finds the subscriber idle goes out without waiting")

    def send_shared(batch: SharedBatch) -> bool:
        pending_at_delivery.append(daemon.accountant.deferred_deltas)
        return True

    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.run)
        dispatcher = BatchDispatcher(send, window=0, merge_deltas=False, send_shared=send_shared)
        daemon.add_subscription(
            Subscription(
                1,
                1,
                ["stream.text.delta"],
                sessions=None,
                owned_only=False,
                dispatcher=dispatcher,
            )
        )
        await nursery.start(dispatcher.run)
        for i in range(SETTLE_STRETCH):  # a stretch: accounted at this settle
            daemon.publish(TextDelta(message_id="m", text=f"{i} "), session_id="s1")
        daemon.settle()
        assert pending_at_delivery == [SETTLE_STRETCH]
        assert daemon.accountant.deferred_deltas == 0
        nursery.cancel_scope.cancel()


# -- frames stay under the cap ----------------------------------------------------


async def test_merged_deltas_never_outgrow_a_frame(sock_path: Path) -> None:
    # 40 deltas of 3,000 characters in one window would merge into 120 kB,
    # over this daemon's 64 KiB frames: merged runs stop at max_frame // 8.
    config = DaemonConfig(max_frame=64 << 10)
    chunk = "x" * 3000
    async with (
        running_daemon(sock_path, config),
        connect(sock_path) as reader,
        connect(sock_path, role="agent") as publisher,
        reader.subscribe(["stream.text.delta"], deltas="merged", window_ms=200) as sub,
    ):
        for _ in range(40):
            await publisher.publish(TextDelta(message_id="m", text=chunk), session_id="s1")
        await publisher.flush()
        texts: list[str] = []
        with trio.fail_after(10):
            async for batch in sub:
                texts += [e.event.text for e in batch.events if isinstance(e.event, TextDelta)]
                if sum(map(len, texts)) >= 40 * len(chunk):
                    break
        assert "".join(texts) == chunk * 40
        assert max(map(len, texts)) <= (64 << 10) // 8
        assert len(texts) < 40  # and they did merge
        await reader.ping()  # the connection is alive


async def test_an_event_whose_envelope_cannot_fit_a_frame_is_reported_not_fatal(
    sock_path: Path,
) -> None:
    max_frame = 4096

    def publish_of(size: int) -> Publish[Event]:
        return Publish(events=[Outgoing(event=TextDelta(message_id="m", text="x" * size))])

    # The largest text whose publish frame the daemon accepts: its envelope
    # (seq, ts, id and source added) is then too large for an events frame.
    size = max(
        n for n in range(3900, max_frame) if len(encode_frame(publish_of(n))) - 4 <= max_frame
    )
    async with running_daemon(sock_path, DaemonConfig(max_frame=max_frame)):
        client = await RawClient.open(sock_path)
        await client.send(
            Subscribe(id=7, patterns=("stream.text.delta",), window_ms=0, deltas="raw")
        )
        await client.send(publish_of(size))
        error = await client.receive()
        assert isinstance(error, Error)
        assert (error.code, error.ref, error.fatal) == ("frame_too_large", 7, False)
        assert "not delivered" in error.message
        await client.send(publish_of(10))  # the next one arrives: nothing else was lost
        events = await client.receive()
        assert isinstance(events, Events)
        assert [e.event.text for e in events.events] == ["x" * 10]
        await client.aclose()


async def test_a_reconnecting_client_says_when_the_daemon_goes_and_comes_back(
    sock_path: Path,
) -> None:
    """What a UI shows as "reconnecting…": the connection's changes, in order."""
    changes: list[ClientStatistics] = []
    both = trio.Event()
    async with (
        running_daemon(sock_path) as server,
        connect(sock_path, client="ui", reconnect=True) as ui,
        trio.open_nursery() as nursery,
    ):
        assert ui.statistics() == ClientStatistics(
            connected=True, reconnects=0, last_lost=None, subscriptions=0
        )

        async def record(task_status: trio.TaskStatus[None]) -> None:
            task_status.started()
            while len(changes) < 2:
                changes.append(await ui.wait_connection_change())
            both.set()

        await nursery.start(record)
        for connection in list(server._connections):
            if connection.name.startswith("ui["):  # its identity: ui[pid=…,uid=…]
                await connection.goodbye()
        with trio.fail_after(10):
            await both.wait()
    lost, back = changes
    assert (lost.connected, lost.reconnects) == (False, 0)
    assert lost.last_lost is not None
    assert lost.last_lost.startswith("shutdown")
    assert (back.connected, back.reconnects) == (True, 1)
