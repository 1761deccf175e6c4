"""Daemon names against a real ``nats-server -js``: one name, one live daemon.

A daemon's name is its subject token and its durable consumer, so two live
daemons with one name would share the consumer (each taking part of the
stream) and drop each other's events as their own. The default names of two
daemons on one host differ, and a name a live daemon holds is refused.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import msgspec
import pytest
import trio
from busd_nats import default_name
from nats_helpers import (
    INSTALL_HINT,
    ErrorLog,
    add_names_bucket,
    bridged_daemon,
    find_nats_server,
    put_key,
    read_stream,
    running_nats,
)

import busd
from busd import Envelope, Event, SessionInfo

pytestmark = pytest.mark.skipif(find_nats_server() is None, reason=INSTALL_HINT)

TTL = 1.5
"""Seconds a claim outlives its last renewal, in the bucket these tests make (default 15)."""


class Received:
    """The ``stream.session.info`` messages one daemon publishes, as they come."""

    def __init__(self) -> None:
        self.envelopes: list[Envelope[Event]] = []
        self._changed = trio.Event()

    def __call__(self, envelope: Envelope[Event]) -> None:
        self.envelopes.append(envelope)
        self._changed.set()
        self._changed = trio.Event()

    def bridged(self) -> list[str]:
        """The messages that came over the bridge, in order."""
        return [
            e.event.message
            for e in self.envelopes
            if isinstance(e.event, SessionInfo) and e.source.startswith("nats:")
        ]

    async def wait_for(self, message: str) -> Envelope[Event]:
        while True:
            for envelope in self.envelopes:
                assert isinstance(envelope.event, SessionInfo)
                if envelope.event.message == message:
                    return envelope
            await self._changed.wait()


@asynccontextmanager
async def receiving(daemon: busd.Daemon) -> AsyncIterator[Received]:
    received = Received()
    handle = daemon.bus.on("stream.session.info", received)
    try:
        yield received
    finally:
        handle.unsubscribe()


async def say(path: Path, message: str) -> None:
    async with busd.connect(path, role="agent") as client:
        await client.publish(SessionInfo(message=message), session_id="s1")
        await client.flush()


async def crosses(frm: Path, to: Received, message: str) -> Envelope[Event]:
    await say(frm, message)
    with trio.fail_after(15):
        return await to.wait_for(message)


async def test_a_name_a_live_daemon_holds_is_refused_loudly(tmp_path: Path) -> None:
    """The second 'alpha' says who holds the name and turns its bridge off for good; the
    first goes on bridging as before, and nothing of the second reaches the stream."""
    errors = ErrorLog()
    async with running_nats(tmp_path) as nats:
        await trio.to_thread.run_sync(add_names_bucket, nats.url, TTL)
        async with (
            bridged_daemon(tmp_path / "a.sock", nats.url, "alpha") as (daemon_a, _),
            bridged_daemon(tmp_path / "c.sock", nats.url, "gamma") as (daemon_c, _),
            receiving(daemon_a) as on_a,
            receiving(daemon_c) as on_c,
            bridged_daemon(
                tmp_path / "b.sock", nats.url, "alpha", wait_ready=False, errors=errors
            ) as (_, bridge_b),
        ):
            await say(tmp_path / "b.sock", "from the second alpha")
            with trio.fail_after(15):
                error = await errors.wait_for("is held by another daemon")
            assert error.plugin == "nats"
            assert "name 'alpha' on stream 'BUSD' is held by another daemon" in error.message
            assert str(tmp_path / "a.sock") in error.message  # which one
            assert "the bridge is off" in error.message
            stats = bridge_b.statistics()
            assert stats.disabled == error.message
            assert not bridge_b.ready.is_set()  # it never bound the consumer

            # Both ways between the first alpha and gamma, as if the second never came.
            back = await crosses(tmp_path / "c.sock", on_a, "gamma to alpha")
            assert back.source == "nats:gamma"
            there = await crosses(tmp_path / "a.sock", on_c, "alpha to gamma")
            assert there.source == "nats:alpha"
            await say(tmp_path / "b.sock", "to nobody")
            await crosses(tmp_path / "c.sock", on_a, "the last")  # in order: all is in
            assert on_c.bridged() == ["alpha to gamma"]
            assert on_a.bridged() == ["gamma to alpha", "the last"]
            stored = await trio.to_thread.run_sync(read_stream, nats.url)
            alpha = [m for m in stored if m[0].startswith("busd.alpha.")]
            assert len(alpha) == 1
            # One failure, not a service restarted for ever.
            assert sum("alpha" in e.message for e in errors.errors) == 1
            assert bridge_b.statistics().disabled == error.message


async def test_a_name_is_free_again_once_its_daemon_stops(tmp_path: Path) -> None:
    """A clean stop gives the name back at once (with the default TTL of 15 s, a name
    left to lapse would keep the next daemon waiting past the deadline below)."""
    async with running_nats(tmp_path) as nats:
        async with bridged_daemon(tmp_path / "a.sock", nats.url, "alpha"):
            pass
        with trio.fail_after(10):
            async with bridged_daemon(tmp_path / "b.sock", nats.url, "alpha") as (_, bridge):
                assert bridge.statistics().disabled is None


async def test_the_name_of_a_daemon_that_died_is_taken_once_it_lapses(tmp_path: Path) -> None:
    """A daemon killed with its name claimed: nobody renews the claim, the server expires
    it, and the next daemon with that name bridges then (not refused)."""
    errors = ErrorLog()
    async with running_nats(tmp_path) as nats:
        await trio.to_thread.run_sync(add_names_bucket, nats.url, TTL)
        dead = {"host": "elsewhere", "socket": "/run/busd/bus.sock", "pid": 4242, "since": 0.0}
        started = trio.current_time()  # the claim lapses TTL after it is stored, after this
        await trio.to_thread.run_sync(
            put_key, nats.url, "BUSD.alpha", msgspec.json.encode({**dead, "instance": "x"})
        )
        async with bridged_daemon(tmp_path / "a.sock", nats.url, "alpha", errors=errors) as (
            _,
            bridge,
        ):
            assert trio.current_time() - started >= TTL * 0.9  # it waited for the lapse
            assert bridge.statistics().disabled is None
            assert errors.errors == []


async def test_a_daemon_whose_name_was_taken_stops_bridging(tmp_path: Path) -> None:
    """Its claim was taken over (it was cut off from NATS for longer than the TTL, say):
    its next renewal finds another holder, and it says so and stops."""
    errors = ErrorLog()
    async with running_nats(tmp_path) as nats:
        await trio.to_thread.run_sync(add_names_bucket, nats.url, TTL)
        async with bridged_daemon(tmp_path / "a.sock", nats.url, "alpha", errors=errors) as (
            _,
            bridge,
        ):
            other = {"host": "elsewhere", "socket": None, "pid": 1, "since": 0.0}
            await trio.to_thread.run_sync(
                put_key, nats.url, "BUSD.alpha", msgspec.json.encode({**other, "instance": "y"})
            )
            with trio.fail_after(10):
                error = await errors.wait_for("was taken by another daemon")
            assert "pid 1 on elsewhere" in error.message
            assert bridge.statistics().disabled == error.message


async def test_two_daemons_on_one_host_get_different_default_names(tmp_path: Path) -> None:
    """Without a name, each daemon is the host plus its socket's hash: the two bridge."""
    host = default_name()  # no socket: the host part alone
    async with (
        running_nats(tmp_path) as nats,
        bridged_daemon(tmp_path / "a.sock", nats.url, None) as (daemon_a, bridge_a),
        bridged_daemon(tmp_path / "b.sock", nats.url, None) as (daemon_b, bridge_b),
        receiving(daemon_a) as on_a,
        receiving(daemon_b) as on_b,
    ):
        name_a, name_b = bridge_a.options.name, bridge_b.options.name
        assert name_a != name_b
        assert name_a.startswith(f"{host}-")
        assert name_b.startswith(f"{host}-")
        there = await crosses(tmp_path / "a.sock", on_b, "a to b")
        assert there.source == f"nats:{name_a}"
        back = await crosses(tmp_path / "b.sock", on_a, "b to a")
        assert back.source == f"nats:{name_b}"
