"""Who may decide: every forged case of issue 15, against a real daemon on a real socket.

A hostile client of the same user tries what a forger would: publish a
driven run's permission request or decision, publish into a driven run's
session or run, name itself like a rule or the daemon, claim a ``source``,
cancel or answer without the right. Each is refused ``forbidden``, changes
nothing, is counted, and the daemon and its other clients go on.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from busd.client import ConnectionLost, RequestFailed, connect
from busd.core.events import (
    Event,
    PermissionRequested,
    PermissionResolved,
    RunCancelled,
    TextDelta,
)
from busd.daemon.authority import Vetted
from busd.daemon.config import ConfigError, load_config
from busd.daemon.hub import DaemonConfig
from busd.wire import (
    PROTOCOL_VERSION,
    CancelRun,
    Error,
    Hello,
    Ingest,
    Outgoing,
    Publish,
    Reply,
    Request,
    Status,
    Welcome,
    narrow,
)

from .daemon_helpers import RawClient
from .test_runs import ScriptDriver, Watcher, ask, make_daemon, serving, sock_path

__all__ = ["sock_path"]  # the fixture, imported for its use here

ME = f"pid={os.getpid()},uid={os.getuid()}"


async def _pending_request(watcher: Watcher, run_id: str) -> str:
    """Wait (on events, not time) until the run's permission request is on the bus."""
    request_id = f"{run_id}/perm-1"
    with trio.fail_after(10):
        while not any(
            isinstance(e.event, PermissionRequested) and e.event.request_id == request_id
            for e in watcher.seen
        ):
            await trio.testing.wait_all_tasks_blocked()
            await trio.lowlevel.checkpoint()
    return request_id


@asynccontextmanager
async def _raw(path: Path) -> AsyncIterator[RawClient]:
    raw = await RawClient.open(path, hello=False)
    try:
        yield raw
    finally:
        await raw.aclose()


async def _status(path: Path) -> dict[str, Any]:
    async with connect(path, client="status", role="admin") as admin:
        status: dict[str, Any] = await admin.request(Status())
        return status


async def test_a_driven_runs_permission_cannot_be_forged_or_decided_by_a_client(
    sock_path: Path,
) -> None:
    driver = ScriptDriver()
    daemon = make_daemon(driver)
    watcher = Watcher(daemon)
    async with (
        serving(sock_path, daemon),
        connect(sock_path, client="web") as web,
        connect(sock_path, client="forger", role="admin") as forger,
    ):
        started = await web.start_run("script", "ask")
        run_id, session_id = started["run_id"], started["session_id"]
        request_id = await _pending_request(watcher, run_id)
        forged_request = ask(request_id=request_id, tool="Read", input={"path": "README.md"})
        forged_decision = PermissionResolved(
            request_id=request_id, outcome="denied", by="watch@laptop"
        )
        attempts: list[Outgoing[Event]] = [
            Outgoing(event=forged_request, session_id="elsewhere"),  # the card, in another session
            Outgoing(event=forged_request, session_id=session_id),
            Outgoing(event=forged_decision, session_id="elsewhere"),
            Outgoing(event=forged_decision, session_id=session_id, run_id=run_id),
            Outgoing(event=TextDelta(message_id="m1", text=" (denied)"), session_id=session_id),
            Outgoing(event=TextDelta(message_id="m1", text="x"), session_id="s", run_id=run_id),
        ]
        head = daemon.bus.head_seq
        for outgoing in attempts:
            with pytest.raises(RequestFailed, match="forbidden") as refused:
                await forger.publish(
                    outgoing.event, session_id=outgoing.session_id, run_id=outgoing.run_id, ack=True
                )
            assert "busd" in str(refused.value)
        assert daemon.bus.head_seq == head  # nothing of any of them was published

        snapshot = daemon.sessions.snapshot(session_id)
        assert snapshot is not None
        cards = [p.event for p in snapshot.permissions]
        assert [(c.request_id, c.tool) for c in cards] == [(request_id, "Bash")]  # the real one

        decision = await web.reply_permission(request_id, option_id="allow_once")
        assert decision["by"] == f"web[{ME}]"  # the daemon's label, not a payload's
        finished = await watcher.finished(run_id)
        assert finished.status == "ok"
    assert [d.outcome for d in driver.decisions] == ["allowed"]
    resolved = [e.event for e in watcher.seen if isinstance(e.event, PermissionResolved)]
    assert [(r.outcome, r.by) for r in resolved] == [("allowed", f"web[{ME}]")]
    assert daemon.counters.forbidden == len(attempts)


@pytest.mark.parametrize(
    "name",
    ["rule:0", "policy", "policy:x", "busd", "busd.journal", "BUSD/x", "timeout", "run/claude"],
)
async def test_a_client_cannot_name_itself_like_the_daemons_deciders(
    sock_path: Path, name: str
) -> None:
    daemon = make_daemon(ScriptDriver())
    async with serving(sock_path, daemon):
        with pytest.raises(ConnectionLost) as lost:
            async with connect(sock_path, client=name):
                pass
        assert lost.value.reason == "forbidden"
        assert "reserved" in str(lost.value)
        status = await _status(sock_path)
    assert status["forbidden"] == 1
    assert status["clients"] == 1  # the status client itself: the others were never admitted


@pytest.mark.parametrize("name", ["", "x" * 65, "web[pid=1,uid=0]", "tab\tname"])
async def test_malformed_client_names_are_refused(sock_path: Path, name: str) -> None:
    async with serving(sock_path, make_daemon(ScriptDriver())), AsyncExitStack() as stack:
        raw = await stack.enter_async_context(_raw(sock_path))
        await raw.send(Hello(protocol=PROTOCOL_VERSION, client=name))
        refusal = await raw.receive()
        assert isinstance(refusal, Error)
        assert (refusal.code, refusal.fatal) == ("bad_handshake", True)


async def test_source_is_the_connections_identity_never_the_payloads(sock_path: Path) -> None:
    daemon = make_daemon(ScriptDriver())
    watcher = Watcher(daemon)
    async with serving(sock_path, daemon), AsyncExitStack() as stack:
        raw = await stack.enter_async_context(_raw(sock_path))
        await raw.send(Hello(protocol=PROTOCOL_VERSION, client="busd-publish", role="agent"))
        assert isinstance(await raw.receive(), Welcome)
        # A publish frame written by hand, claiming the journal as its source.
        frame = {
            "op": "publish",
            "ack": 1,
            "events": [
                {
                    "event": {"type": "stream.text.delta", "message_id": "m", "text": "hi"},
                    "session_id": "mine",
                    "source": "busd.journal",
                }
            ],
        }
        body = msgspec.msgpack.encode(frame)
        await raw.send_bytes(len(body).to_bytes(4, "big") + body)
        reply = await raw.receive()
        assert isinstance(reply, Reply)
        assert reply.ok, reply
    [envelope] = [e for e in watcher.seen if e.session_id == "mine"]
    assert envelope.source == f"busd-publish[{ME}]"


async def test_ingest_cannot_reach_a_driven_session(sock_path: Path) -> None:
    daemon = make_daemon(ScriptDriver())
    watcher = Watcher(daemon)
    async with (
        serving(sock_path, daemon),
        connect(sock_path, client="ui") as ui,
        connect(sock_path, client="ingest", role="agent") as agent,
    ):
        started = await ui.start_run("script", "hang")
        session_id = started["session_id"]
        head = daemon.bus.head_seq
        await agent.send_frame(Ingest(sdk="script", events=[{}], session_id=session_id))
        with pytest.raises(RequestFailed, match="forbidden"):
            await agent.acknowledge()
        assert daemon.bus.head_seq == head
        await ui.cancel_run(started["run_id"])
        await watcher.finished(started["run_id"])
        # The session stays the daemon's after its run: a continued run is driven again.
        delta = TextDelta(message_id="m", text="y")
        with pytest.raises(RequestFailed, match="forbidden"):
            await agent.publish(delta, session_id=session_id, ack=True)


# -- roles ------------------------------------------------------------------------------

RIGHTS_BY_ROLE = {
    "observer": set(),
    "frontend": {"start_run", "cancel_run", "permission_reply"},
    "responder": {"permission_reply"},
    "agent": {"publish"},
    "admin": {"publish", "start_run", "cancel_run", "permission_reply"},
}


@pytest.mark.parametrize("role", sorted(RIGHTS_BY_ROLE))
async def test_each_role_may_do_what_the_table_says_and_nothing_else(
    sock_path: Path, role: str
) -> None:
    driver = ScriptDriver()
    daemon = make_daemon(driver)
    watcher = Watcher(daemon)
    async with (
        serving(sock_path, daemon),
        connect(sock_path, client="owner", role="admin") as owner,
        connect(sock_path, client="tried", role=role) as tried,  # type: ignore[arg-type]
    ):
        asking = await owner.start_run("script", "ask")
        hanging = await owner.start_run("script", "hang")
        request_id = await _pending_request(watcher, asking["run_id"])
        attempts: dict[str, Callable[[], Awaitable[object]]] = {
            "publish": lambda: tried.publish(
                TextDelta(message_id="m", text="x"), session_id="own", ack=True
            ),
            "start_run": lambda: tried.start_run("script", "ok"),
            "cancel_run": lambda: tried.cancel_run(hanging["run_id"]),
            "permission_reply": lambda: tried.reply_permission(request_id, allow=True),
        }
        for right, attempt in attempts.items():
            if right in RIGHTS_BY_ROLE[role]:
                await attempt()
            else:
                with pytest.raises(RequestFailed, match=rf"forbidden.*role .{role}."):
                    await attempt()
        assert tried.welcome is not None
        assert tried.welcome.identity == f"tried[{ME}]"
        assert set(tried.welcome.rights) == RIGHTS_BY_ROLE[role]  # said before anything is tried
        # Reading is everyone's.
        assert (await tried.request(Status()))["roles"][role] == sorted(RIGHTS_BY_ROLE[role])
        async with tried.subscribe(["busd.run.>"], window_ms=0):
            pass
        if "cancel_run" not in RIGHTS_BY_ROLE[role]:
            await owner.cancel_run(hanging["run_id"])
        if "permission_reply" not in RIGHTS_BY_ROLE[role]:
            await owner.reply_permission(request_id, allow=False)
        await watcher.finished(hanging["run_id"])
        await watcher.finished(asking["run_id"])
    cancels = [e.event for e in watcher.seen if isinstance(e.event, RunCancelled)]
    who = "tried" if "cancel_run" in RIGHTS_BY_ROLE[role] else "owner"
    assert [c.by for c in cancels] == [f"{who}[{ME}]"]
    refused = set(attempts) - RIGHTS_BY_ROLE[role]
    # A refused publish with ack is two frames: the events, then the ack's empty publish.
    assert daemon.counters.forbidden == len(refused) + ("publish" in refused)


async def test_a_forbidden_frame_without_a_reply_gets_an_error_and_the_connection_goes_on(
    sock_path: Path,
) -> None:
    daemon = make_daemon(ScriptDriver())
    async with serving(sock_path, daemon), AsyncExitStack() as stack:
        raw = await stack.enter_async_context(_raw(sock_path))
        await raw.send(Hello(protocol=PROTOCOL_VERSION, client="watch", role="observer"))
        assert isinstance(await raw.receive(), Welcome)
        await raw.send(Publish(events=[Outgoing(event=TextDelta(message_id="m", text="x"))]))
        await raw.send(Ingest(sdk="script", events=[{"x": 1}]))
        for _ in range(2):
            error = await raw.receive()
            assert isinstance(error, Error)
            assert (error.code, error.fatal) == ("forbidden", False)
            assert "role 'observer' may not publish" in error.message
        await raw.send(Request(id=7, command=CancelRun(run_id="run-x")))
        reply = await raw.receive()
        assert isinstance(reply, Reply)
        assert reply.error is not None
        assert reply.error.code == "forbidden"
        await raw.send(Request(id=8, command=Status()))
        status = await raw.receive()
        assert isinstance(status, Reply)
        assert status.ok
        assert status.result["forbidden"] == 3
        await raw.send(Hello(protocol=PROTOCOL_VERSION, client="again"))
        again = await raw.receive()
        assert isinstance(again, Error)
        assert again.code == "bad_handshake"
        await raw.send(Request(id=9, command=Status()))
        status = await raw.receive()
        assert isinstance(status, Reply)
        assert status.result["repeated_hellos"] == 1


async def test_configuration_narrows_a_role(sock_path: Path) -> None:
    config = DaemonConfig(grants=narrow({"frontend": ["permission_reply"]}))
    async with serving(sock_path, make_daemon(ScriptDriver(), config)):
        async with connect(sock_path, client="ui") as ui:
            with pytest.raises(RequestFailed, match=r"forbidden.*may not start run"):
                await ui.start_run("script", "ok")
            assert (await ui.request(Status()))["roles"]["frontend"] == ["permission_reply"]


def test_the_config_file_only_takes_rights_away(tmp_path: Path) -> None:
    path = tmp_path / "busd.toml"
    path.write_text('[roles]\nfrontend = ["permission_reply"]\nagent = []\n')
    grants = load_config(path).grants()
    assert grants["frontend"] == {"permission_reply"}
    assert grants["agent"] == frozenset()
    assert grants["admin"] == {"publish", "start_run", "cancel_run", "permission_reply"}
    for text, why in [
        ('[roles]\nfrontend = ["publish"]', "cannot be given 'publish'"),
        ('[roles]\nroot = ["publish"]', "unknown role 'root'"),
        ('[roles]\nadmin = ["everything"]', "unknown right 'everything'"),
    ]:
        path.write_text(text)
        with pytest.raises(ConfigError, match=why):
            load_config(path)


# -- counters ---------------------------------------------------------------------------


async def test_handshake_timeouts_are_counted(sock_path: Path) -> None:
    daemon = make_daemon(ScriptDriver(), DaemonConfig(handshake_timeout=0.05))
    async with serving(sock_path, daemon), AsyncExitStack() as stack:
        silent = await stack.enter_async_context(_raw(sock_path))
        error = await silent.receive()  # the daemon's word, when its timeout ran out
        assert isinstance(error, Error)
        assert error.code == "handshake_timeout"
        assert (await _status(sock_path))["handshake_timeouts"] == 1


def _other_uid_connects(path: Path) -> bytes:
    """Connect to ``path`` as uid 65534 and return what the daemon said (a child process)."""
    import subprocess
    import sys

    code = (
        "import os, socket, sys\n"
        "os.setgid(65534); os.setuid(65534)\n"
        "s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])\n"
        "data = b''\n"
        "while chunk := s.recv(65536): data += chunk\n"
        "sys.stdout.buffer.write(data)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, os.fspath(path)], capture_output=True, timeout=30, check=True
    )
    return done.stdout


@pytest.mark.skipif(os.getuid() != 0, reason="only root can connect as another uid")
async def test_refused_peers_are_counted(sock_path: Path) -> None:
    daemon = make_daemon(ScriptDriver())
    async with serving(sock_path, daemon):
        sock_path.parent.chmod(0o755)
        sock_path.chmod(0o777)
        said = await trio.to_thread.run_sync(_other_uid_connects, sock_path)
        assert b"forbidden" in said
        assert (await _status(sock_path))["refused_peers"] == 1


async def test_a_driven_session_stays_the_daemons_after_a_restart(
    sock_path: Path, tmp_path: Path
) -> None:
    config = DaemonConfig(journal=str(tmp_path / "journal.sqlite3"))
    first = make_daemon(ScriptDriver(), config)
    watcher = Watcher(first)
    async with serving(sock_path, first), connect(sock_path, client="ui") as ui:
        started = await ui.start_run("script", "ok")
        await watcher.finished(started["run_id"])
    again = make_daemon(ScriptDriver(), config)
    async with (
        serving(sock_path, again),
        connect(sock_path, client="forger", role="agent") as forger,
    ):
        head = again.bus.head_seq
        delta = TextDelta(message_id="m", text="x")
        with pytest.raises(RequestFailed, match="forbidden"):
            await forger.publish(delta, session_id=started["session_id"], ack=True)
        assert again.bus.head_seq == head
        await forger.publish(TextDelta(message_id="m", text="x"), session_id="mine", ack=True)


async def test_a_frame_is_judged_event_by_event_though_each_place_is_asked_once(
    sock_path: Path,
) -> None:
    """A frame of deltas to one free session asks about that place once; a permission
    event there is still judged on its own, and a forged event anywhere in the frame,
    after any number of allowed ones, refuses the whole frame with its index."""
    driver = ScriptDriver()
    daemon = make_daemon(driver)
    watcher = Watcher(daemon)
    async with serving(sock_path, daemon), AsyncExitStack() as stack:
        web = await stack.enter_async_context(connect(sock_path, client="web"))
        started = await web.start_run("script", "ask")
        run_id, session_id = started["run_id"], started["session_id"]
        request_id = await _pending_request(watcher, run_id)
        raw = await stack.enter_async_context(_raw(sock_path))
        await raw.send(Hello(protocol=PROTOCOL_VERSION, client="forger", role="admin"))
        assert isinstance(await raw.receive(), Welcome)
        free: list[Outgoing[Event]] = [
            Outgoing(event=TextDelta(message_id="m", text="x"), session_id="free")
        ] * 50
        frames: dict[int, list[Outgoing[Event]]] = {
            50: [*free, Outgoing(event=TextDelta(message_id="m", text="y"), session_id=session_id)],
            # The same place as the 50 allowed deltas, but a driven run's request id.
            51: [
                *free,
                Outgoing(event=TextDelta(message_id="m", text="z"), session_id="free"),
                Outgoing(event=ask(request_id=request_id, tool="Read"), session_id="free"),
            ],
        }
        head = daemon.bus.head_seq
        for ack, (index, events) in enumerate(frames.items(), 1):
            await raw.send(Publish(events=events, ack=ack))
            reply = await raw.receive()
            assert isinstance(reply, Reply)
            assert reply.error is not None
            assert reply.error.code == "forbidden"
            assert reply.error.message.startswith(f"events[{index}]: ")
        assert daemon.bus.head_seq == head  # nothing of either frame was published
        await raw.send(Publish(events=free, ack=3))
        published = await raw.receive()
        assert isinstance(published, Reply)
        assert published.ok
        assert daemon.bus.head_seq == head + 50
        await web.reply_permission(request_id, option_id="allow_once")
        assert (await watcher.finished(run_id)).status == "ok"


async def test_a_place_a_client_was_allowed_is_judged_again_once_a_run_takes_it(
    sock_path: Path,
) -> None:
    """A connection keeps the kinds and places it was allowed (issue 20: judging each
    frame anew was a tenth of a burst's work); a run that takes the session ends that."""
    driver = ScriptDriver()
    daemon = make_daemon(driver)
    watcher = Watcher(daemon)
    async with (
        serving(sock_path, daemon),
        connect(sock_path, client="web") as web,
        connect(sock_path, client="agent", role="agent") as agent,
    ):
        for text in "ab":  # the second frame is allowed as the first one was
            await agent.publish(TextDelta(message_id="m", text=text), session_id="s", ack=True)
        started = await web.start_run("script", "ask", session_id="s")
        request_id = await _pending_request(watcher, started["run_id"])
        head = daemon.bus.head_seq
        with pytest.raises(RequestFailed, match="session 's' is driven by busd"):
            await agent.publish(TextDelta(message_id="m", text="c"), session_id="s", ack=True)
        assert daemon.bus.head_seq == head
        await agent.publish(TextDelta(message_id="m", text="d"), session_id="t", ack=True)
        await web.reply_permission(request_id, option_id="allow_once")
        assert (await watcher.finished(started["run_id"])).status == "ok"
        with pytest.raises(RequestFailed, match="session 's' is driven by busd"):
            await agent.publish(TextDelta(message_id="m", text="e"), session_id="s", ack=True)
    assert daemon.counters.forbidden == 2


def test_vetted_kinds_and_places_hold_for_one_epoch_and_never_for_permission_events() -> None:
    delta = Outgoing(event=TextDelta(message_id="m", text="x"), session_id="s")
    elsewhere = Outgoing(event=TextDelta(message_id="m", text="x"), session_id="t")
    request = Outgoing(event=ask(request_id="r", tool="Read"), session_id="s")
    vetted = Vetted()
    assert not vetted.covers([delta], 0)
    vetted.add([delta, request], 0)
    assert vetted.covers([delta, delta], 0)
    assert not vetted.covers([delta, elsewhere], 0)  # a place not judged yet
    assert not vetted.covers([delta, request], 0)  # judged each time, on its request id
    assert not vetted.covers([delta], 1)  # the runs took a place since
    vetted.add([elsewhere], 1)
    assert vetted.covers([elsewhere], 1)
    assert not vetted.covers([delta], 1)  # forgotten with the epoch
    vetted.add(
        [
            Outgoing(event=TextDelta(message_id="m", text="x"), session_id=f"s{i}")
            for i in range(1025)
        ],
        1,
    )
    assert not vetted.covers([elsewhere], 1)  # past its bound it starts again
