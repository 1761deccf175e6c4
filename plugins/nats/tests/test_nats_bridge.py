"""Two daemons bridged through a real ``nats-server -js`` on loopback.

Skipped with an install hint where nats-server is missing; ``.ci/run``
installs it from Debian's packages.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import busd_nats
import msgspec
import pytest
import trio
from nats_helpers import (
    INSTALL_HINT,
    ErrorLog,
    NatsServer,
    StoredMessage,
    add_stream,
    bridged_daemon,
    count_requests,
    find_nats_server,
    read_stream,
    running_nats,
    stream_config,
)

import busd
from busd import (
    Daemon,
    DaemonConfig,
    Envelope,
    Event,
    InternalError,
    PluginConfigError,
    PluginManager,
    SessionInfo,
)

SESSIONS = ("s1", "s2", "s3")

needs_nats_server = pytest.mark.skipif(find_nats_server() is None, reason=INSTALL_HINT)


class Frontend:
    """A client subscribed to one daemon, keeping what it receives."""

    def __init__(self) -> None:
        self.envelopes: list[Envelope[Event]] = []
        self._changed = trio.Event()
        self._scope = trio.CancelScope()

    async def run(self, path: Path, *, task_status: trio.TaskStatus[None]) -> None:
        async with busd.connect(path) as client:
            with self._scope:  # cancelled by stop(): the client still says bye
                async with client.subscribe(
                    ["stream.session.info"], deltas="raw", window_ms=0
                ) as sub:
                    task_status.started()
                    async for batch in sub:
                        self.envelopes.extend(batch.events)
                        self._changed.set()
                        self._changed = trio.Event()

    def stop(self) -> None:
        self._scope.cancel()

    async def wait_for(self, count: int) -> None:
        while len(self.envelopes) < count:
            await self._changed.wait()

    def messages(self) -> dict[str | None, list[str]]:
        """Each session's messages, in the order received."""
        by_session: dict[str | None, list[str]] = defaultdict(list)
        for envelope in self.envelopes:
            by_session[envelope.session_id].append(_message(envelope))
        return dict(by_session)

    def ids(self) -> dict[str, str]:
        return {_message(e): e.id for e in self.envelopes}


@asynccontextmanager
async def frontend(path: Path) -> AsyncIterator[Frontend]:
    """A frontend of the daemon at ``path``, subscribed once this yields."""
    front = Frontend()
    async with trio.open_nursery() as nursery:
        await nursery.start(front.run, path)
        yield front
        front.stop()


def _message(envelope: Envelope[Event]) -> str:
    assert isinstance(envelope.event, SessionInfo)
    return envelope.event.message


def expected(first: int, last: int) -> dict[str | None, list[str]]:
    """Event i goes to session i % 3, so the sessions interleave."""
    out: dict[str | None, list[str]] = defaultdict(list)
    for i in range(first, last):
        session = SESSIONS[i % len(SESSIONS)]
        out[session].append(f"{session}:{i}")
    return dict(out)


async def publish(path: Path, first: int, last: int) -> None:
    async with busd.connect(path, role="agent") as client:
        for i in range(first, last):
            session = SESSIONS[i % len(SESSIONS)]
            await client.publish(SessionInfo(message=f"{session}:{i}"), session_id=session)
        await client.flush()


def stored_by(daemon: str, messages: list[StoredMessage]) -> list[StoredMessage]:
    return [m for m in messages if m[0].startswith(f"busd.{daemon}.")]


def stored_message(stored: StoredMessage) -> str:
    envelope = msgspec.msgpack.decode(stored[1], type=Envelope[SessionInfo])
    assert stored[2]["Nats-Msg-Id"] == envelope.id
    assert stored[0] == f"busd.alpha.{envelope.session_id}.stream.session.info"
    return envelope.event.message


@needs_nats_server
async def test_events_cross_in_order_exactly_once_both_ways(tmp_path: Path) -> None:
    async with (
        running_nats(tmp_path) as nats,
        bridged_daemon(tmp_path / "a.sock", nats.url, "alpha") as (_, bridge_a),
        bridged_daemon(tmp_path / "b.sock", nats.url, "beta") as (_, bridge_b),
        frontend(tmp_path / "a.sock") as on_a,
        frontend(tmp_path / "b.sock") as on_b,
    ):
        await publish(tmp_path / "a.sock", 0, 300)
        with trio.fail_after(20):
            await on_b.wait_for(300)
        assert on_b.messages() == expected(0, 300)
        assert on_b.ids() == on_a.ids()  # the same events, by id
        assert {e.source for e in on_b.envelopes} == {"nats:alpha"}

        # The other way round; alpha's own events must not come back to it.
        async with busd.connect(tmp_path / "b.sock", role="agent") as client:
            await client.publish(SessionInfo(message="from beta"), session_id="s9")
            await client.flush()
        with trio.fail_after(20):
            await on_a.wait_for(301)
        back = on_a.envelopes[300]
        assert (_message(back), back.source) == ("from beta", "nats:beta")
        assert back.id == on_b.envelopes[300].id

        # Per-session order means that once these last ones are in, everything
        # before them is: the counts are final, so nothing came twice or echoed.
        await publish(tmp_path / "a.sock", 300, 303)
        with trio.fail_after(20):
            await on_b.wait_for(304)
        assert on_b.messages() == {**expected(0, 303), "s9": ["from beta"]}
        assert len(on_a.envelopes) == 304
        stats_a, stats_b = bridge_a.statistics(), bridge_b.statistics()
        assert stats_b.ingest.published == 303
        assert stats_a.ingest.published == 1
        assert stats_a.ingest.duplicate == stats_b.ingest.duplicate == 0

        await bridge_a.wait_sent()
        await bridge_b.wait_sent()
        stored = await trio.to_thread.run_sync(read_stream, nats.url)
        from_alpha = [stored_message(m) for m in stored_by("alpha", stored)]
        assert sorted(from_alpha) == sorted(m for ms in expected(0, 303).values() for m in ms)
        assert len(stored_by("beta", stored)) == stats_b.exported == 1  # nothing re-sent

        config = await trio.to_thread.run_sync(stream_config, nats.url)
        assert config["subjects"] == ["busd.>"]
        assert config["storage"] == "file"
        assert config["duplicate_window"] == 120 * 10**9  # nanoseconds
        assert config["max_age"] == 86_400 * 10**9


@needs_nats_server
async def test_nothing_lost_or_doubled_when_nats_restarts_mid_stream(tmp_path: Path) -> None:
    async with (
        running_nats(tmp_path) as nats,
        bridged_daemon(tmp_path / "a.sock", nats.url, "alpha") as (_, bridge_a),
        bridged_daemon(tmp_path / "b.sock", nats.url, "beta") as (_, bridge_b),
        frontend(tmp_path / "b.sock") as on_b,
    ):
        await publish(tmp_path / "a.sock", 0, 400)
        with trio.fail_after(20):
            await on_b.wait_for(50)
        await nats.stop()  # mid-stream: beta has some, the rest is on its way

        await publish(tmp_path / "a.sock", 400, 600)  # into alpha while NATS is down
        assert len(on_b.envelopes) <= 400  # nothing can have crossed
        await nats.start()  # the same port and store

        with trio.fail_after(30):
            await on_b.wait_for(600)
        await publish(tmp_path / "a.sock", 600, 603)  # once these are in, all are
        with trio.fail_after(30):
            await on_b.wait_for(603)
        assert on_b.messages() == expected(0, 603)
        assert len({e.id for e in on_b.envelopes}) == 603
        assert bridge_a.statistics().dropped == 0
        assert bridge_b.statistics().ingest.published == 603

        await bridge_a.wait_sent()
        stored = stored_by("alpha", await trio.to_thread.run_sync(read_stream, nats.url))
        assert len(stored) == 603  # retries were de-duplicated by their message ids
        by_session: dict[str, list[str]] = defaultdict(list)
        for message in map(stored_message, stored):
            by_session[message.split(":")[0]].append(message)
        assert by_session == expected(0, 603)  # and stored in order, per session


@needs_nats_server
async def test_a_full_buffer_drops_the_oldest_and_says_so(tmp_path: Path) -> None:
    """NATS is not up yet: the daemon runs, keeps the newest events, reports the others,
    and sends what it kept once the server is there."""
    binary = find_nats_server()
    assert binary is not None
    errors: list[InternalError] = []
    reported = trio.Event()

    def on_error(envelope: Envelope[Event]) -> None:
        assert isinstance(envelope.event, InternalError)
        errors.append(envelope.event)
        reported.set()

    async with trio.open_nursery() as nursery:
        nats = NatsServer(binary, tmp_path, nursery)  # not started yet
        options = {"url": nats.url, "name": "alpha", "buffer": 5}
        daemon = Daemon(
            DaemonConfig(plugin_options={"nats": options}), plugins=PluginManager(environ={})
        )
        bridge = busd_nats.Bridge(  # by hand, to hold 2 on the asyncio side (default 4096)
            daemon, busd_nats.parse_options(options), handoff=2
        )
        daemon.bus.on("busd.internal.error", on_error)
        await nursery.start(daemon.run)
        nursery.start_soon(bridge.run)
        for i in range(20):
            daemon.publish(SessionInfo(message=str(i)), session_id="s1")
            await trio.lowlevel.checkpoint()
        with trio.fail_after(10):
            await reported.wait()
        said = re.search(r"dropped the (\d+) oldest events", errors[0].message)
        assert said is not None, errors
        assert errors[0].plugin == "nats"
        stats = bridge.statistics()
        assert int(said[1]) == stats.dropped
        assert stats.waiting + stats.in_flight + stats.dropped == 20
        assert stats.waiting <= 5  # the pump may have taken its 2 before or after

        await nats.start()
        with trio.fail_after(20):
            await bridge.wait_sent()
        stored = await trio.to_thread.run_sync(read_stream, nats.url)
        messages = [
            msgspec.msgpack.decode(data, type=Envelope[SessionInfo]).event.message
            for subject, data, _ in stored
            if subject == "busd.alpha.s1.stream.session.info"
        ]
        assert len(messages) == 20 - stats.dropped  # all that were kept, no more
        assert messages == sorted(messages, key=int)  # in order
        assert messages[-1] == "19"  # the newest were kept
        await nats.stop()
        nursery.cancel_scope.cancel()


@needs_nats_server
async def test_an_idle_consumer_takes_empty_fetches_in_its_stride(tmp_path: Path) -> None:
    """A fetch may end with no message at all (nats-py returns an empty list when the
    server's 408 beats its own timeout): nothing to acknowledge, fetch again. Polled every
    10 ms, alpha's consumer meets many; after 200 pull requests it still takes beta's."""
    errors = ErrorLog()
    options = {"url": "", "name": "alpha"}
    async with running_nats(tmp_path) as nats, trio.open_nursery() as nursery:
        options["url"] = nats.url
        daemon = Daemon(
            DaemonConfig(plugin_options={"nats": options}), plugins=PluginManager(environ={})
        )
        daemon.bus.on("busd.internal.error", errors)
        arrived = trio.Event()
        daemon.bus.on("stream.session.info", lambda _: arrived.set())
        bridge = busd_nats.Bridge(daemon, busd_nats.parse_options(options), fetch_wait=0.01)
        await nursery.start(daemon.run)
        nursery.start_soon(bridge.run)  # not supervised: whatever it raises fails the test
        with trio.fail_after(15):
            await bridge.ready.wait()
        await trio.to_thread.run_sync(
            count_requests, nats.url, "$JS.API.CONSUMER.MSG.NEXT.BUSD.busd-alpha", 200
        )
        async with bridged_daemon(tmp_path / "b.sock", nats.url, "beta"):
            await publish(tmp_path / "b.sock", 0, 1)
            with trio.fail_after(15):
                await arrived.wait()
        assert errors.errors == []
        assert bridge.statistics().ingest.published == 1
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"url": "http://x"}, "is not a NATS server address"),
        ({"url": "nats://h", "ulr": "x"}, "unknown option 'ulr'"),
        ({"ulr": "nats://h"}, "unknown option 'ulr'"),
    ],
)
async def test_bad_options_stop_the_daemon_with_a_message(
    options: dict[str, str], says: str
) -> None:
    """A misconfigured bridge is a refusal to start, not a daemon quietly running without it."""
    manager = PluginManager(environ={})
    manager.register(busd_nats, name="nats")
    daemon = Daemon(DaemonConfig(plugin_options={"nats": options}), plugins=manager)
    with pytest.RaisesGroup(
        pytest.RaisesExc(PluginConfigError, match=says), flatten_subgroups=True
    ):
        async with trio.open_nursery() as nursery:
            await nursery.start(daemon.run)


@needs_nats_server
async def test_a_stream_that_takes_other_subjects_is_an_error_that_says_so(
    tmp_path: Path,
) -> None:
    manager = PluginManager(environ={})
    manager.register(busd_nats, name="nats")
    errors: list[InternalError] = []
    failed = trio.Event()

    def on_error(envelope: Envelope[Event]) -> None:
        assert isinstance(envelope.event, InternalError)
        errors.append(envelope.event)
        failed.set()

    async with running_nats(tmp_path) as nats, trio.open_nursery() as nursery:
        await trio.to_thread.run_sync(add_stream, nats.url, "BUSD", ["other.>"])
        daemon = Daemon(
            DaemonConfig(plugin_options={"nats": {"url": nats.url, "name": "alpha"}}),
            plugins=manager,
        )
        daemon.bus.on("busd.internal.error", on_error)
        await nursery.start(daemon.run)
        with trio.fail_after(10):
            await failed.wait()
        assert errors[0].where == "service nats"
        assert "stream 'BUSD' takes ['other.>'], not busd.>" in errors[0].message
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("options", [{}, {"stream": "X"}])
async def test_off_without_a_url(options: dict[str, str]) -> None:
    daemon = Daemon(
        DaemonConfig(plugin_options={"nats": options}), plugins=PluginManager(environ={})
    )
    assert busd_nats.busd_services(daemon) == []
    assert busd_nats.bridge_of(daemon) is None
