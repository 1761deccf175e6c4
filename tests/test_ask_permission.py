"""``ask_permission``: an agent busd does not drive asks the broker, over a real socket.

A Claude Code hook is such an agent: it asks, a frontend answers from
another screen (or a rule does), and the reply is the decision; nobody
answering in time leaves the decision to the agent (``unanswered``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from busd.client import Client, ClientSubscription, RequestFailed, connect
from busd.core.events import Envelope, Event, PermissionOption, PermissionRequested
from busd.core.events import PermissionResolved as Resolved
from busd.core.permissions import PermissionRule
from busd.daemon.hub import DaemonConfig
from busd.wire import AskPermission
from busd.wire.results import AskPermissionResult

from .test_runs import ScriptDriver, make_daemon, serving, sock_path

__all__ = ["sock_path"]  # the fixture

OPTIONS = [
    PermissionOption(id="allow", label="Allow", kind="allow_once"),
    PermissionOption(id="deny", label="Deny", kind="reject_once"),
]


def asking(**fields: Any) -> AskPermission:
    base: dict[str, Any] = {
        "session_id": "cc-1",
        "tool": "Bash",
        "input": {"command": "echo hooked > hooked.txt"},
        "title": "Bash: echo hooked > hooked.txt",
        "category": "execute",
        "options": OPTIONS,
        "timeout": 30.0,
    }
    return AskPermission(**{**base, **fields})


class Seen:
    """A subscription's envelopes, taken one at a time by type (a batch may hold several)."""

    def __init__(self, sub: ClientSubscription) -> None:
        self._sub = sub
        self._held: list[Envelope[Event]] = []

    async def next(self, kind: type[Event]) -> Envelope[Event]:
        with trio.fail_after(10):
            while True:
                for index, envelope in enumerate(self._held):
                    if isinstance(envelope.event, kind):
                        del self._held[: index + 1]
                        return envelope
                self._held = list((await self._sub.__anext__()).events)


@asynccontextmanager
async def bus(
    path: Path, config: DaemonConfig | None = None
) -> AsyncIterator[tuple[Client, Client, Seen]]:
    """A daemon, an agent (the hook) and a frontend subscribed to permission events."""
    daemon = make_daemon(ScriptDriver(), config)
    async with (
        serving(path, daemon),
        connect(path, client="hook", role="agent") as agent,
        connect(path, client="web", role="frontend") as web,
        web.subscribe(["stream.permission.>"], window_ms=0) as sub,
    ):
        yield agent, web, Seen(sub)


async def test_a_frontend_allows_and_the_agent_is_told(sock_path: Path) -> None:
    async with bus(sock_path) as (agent, web, sub), trio.open_nursery() as nursery:
        replies: list[dict[str, Any]] = []

        async def ask() -> None:
            replies.append(await agent.request(asking()))

        nursery.start_soon(ask)
        requested = await sub.next(PermissionRequested)
        assert isinstance(requested.event, PermissionRequested)
        assert requested.session_id == "cc-1"
        assert requested.source.startswith("hook[pid=")  # the asking connection, not a payload
        assert (requested.event.tool, requested.event.category) == ("Bash", "execute")
        assert requested.event.request_id.startswith("ask-")
        decided = await web.reply_permission(requested.event.request_id, option_id="allow")
        assert decided["outcome"] == "allowed"
        resolved = await sub.next(Resolved)
    [reply] = replies
    assert list(reply) == list(AskPermissionResult.__struct_fields__)
    assert reply["request_id"] == requested.event.request_id
    assert (reply["outcome"], reply["option_id"]) == ("allowed", "allow")
    assert reply["by"].startswith("web[pid=")
    assert isinstance(resolved.event, Resolved)
    assert (resolved.event.outcome, resolved.event.by) == ("allowed", reply["by"])
    assert resolved.session_id == "cc-1"


async def test_a_frontend_denies_with_a_reason(sock_path: Path) -> None:
    async with bus(sock_path) as (agent, web, sub), trio.open_nursery() as nursery:
        replies: list[dict[str, Any]] = []

        async def ask() -> None:
            replies.append(await agent.request(asking(request_id="mine-1")))

        nursery.start_soon(ask)
        requested = await sub.next(PermissionRequested)
        assert isinstance(requested.event, PermissionRequested)
        assert requested.event.request_id == "mine-1"  # the asker's own id, when it gives one
        await web.reply_permission("mine-1", option_id="deny", reason="not in this repo")
    [reply] = replies
    assert (reply["outcome"], reply["reason"]) == ("denied", "not in this repo")


async def test_nobody_answering_in_time_leaves_it_to_the_agent(sock_path: Path) -> None:
    async with bus(sock_path) as (agent, web, sub):
        with trio.fail_after(10):
            reply = await agent.request(asking(timeout=0.2))
        assert (reply["outcome"], reply["by"]) == ("unanswered", None)
        requested = await sub.next(PermissionRequested)
        resolved = await sub.next(Resolved)
        assert isinstance(resolved.event, Resolved)
        assert (resolved.event.outcome, resolved.event.by) == ("cancelled", "timeout")
        assert "the agent decides" in (resolved.event.reason or "")
        assert isinstance(requested.event, PermissionRequested)
        with pytest.raises(RequestFailed) as late:
            await web.reply_permission(requested.event.request_id, allow=True)
        assert late.value.code == "already_resolved"


async def test_without_a_frontend_the_agent_decides_at_once(sock_path: Path) -> None:
    daemon = make_daemon(ScriptDriver())
    async with serving(sock_path, daemon), connect(sock_path, client="hook", role="agent") as agent:
        with trio.fail_after(5):  # not the request's 30 s: nobody could answer
            reply = await agent.request(asking())
    assert (reply["outcome"], reply["by"]) == ("unanswered", None)
    assert daemon.broker.pending() == []


async def test_rules_decide_before_frontends_are_asked(sock_path: Path) -> None:
    rules = (
        PermissionRule(action="deny", tool="Bash", command=r"rm -rf"),
        PermissionRule(action="allow", tool="Bash", command=r"^echo "),
    )
    async with bus(sock_path, DaemonConfig(permission_rules=rules)) as (agent, _, sub):
        with trio.fail_after(5):
            allowed = await agent.request(asking())
            denied = await agent.request(asking(input={"command": "rm -rf /"}))
        assert (allowed["outcome"], allowed["by"]) == ("allowed", "rule:1")
        assert (denied["outcome"], denied["by"]) == ("denied", "rule:0")
        await sub.next(PermissionRequested)  # both were on the bus, decided there
        resolved = await sub.next(Resolved)
        assert isinstance(resolved.event, Resolved)
        assert resolved.event.by == "rule:1"


async def test_an_asker_that_goes_away_withdraws_its_request(sock_path: Path) -> None:
    daemon = make_daemon(ScriptDriver())
    async with (
        serving(sock_path, daemon),
        connect(sock_path, client="web", role="frontend") as web,
        web.subscribe(["stream.permission.>"], window_ms=0) as subscription,
    ):
        sub = Seen(subscription)
        async with connect(sock_path, client="hook", role="agent") as agent:
            with trio.move_on_after(30) as scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(agent.request, asking())
                    requested = await sub.next(PermissionRequested)
                    scope.cancel()  # the hook is killed while it waits
            assert scope.cancelled_caught
        resolved = await sub.next(Resolved)
        assert isinstance(resolved.event, Resolved)
        assert isinstance(requested.event, PermissionRequested)
        assert resolved.event.request_id == requested.event.request_id
        assert (resolved.event.outcome, resolved.event.by) == ("cancelled", "busd")
        with pytest.raises(RequestFailed) as late:
            await web.reply_permission(requested.event.request_id, allow=True)
        assert late.value.code == "already_resolved"
    assert daemon.broker.pending() == []


async def test_a_driven_session_a_known_request_and_a_frontend_are_refused(
    sock_path: Path,
) -> None:
    async with bus(sock_path) as (agent, web, sub):
        started = await web.start_run("script", "ok")
        driven = started["session_id"]
        with pytest.raises(RequestFailed) as refused:
            await agent.request(asking(session_id=driven))
        assert refused.value.code == "forbidden"
        assert "driven by busd" in str(refused.value)
        with pytest.raises(RequestFailed) as as_frontend:
            await web.request(asking())
        assert as_frontend.value.code == "forbidden"
        async with trio.open_nursery() as nursery:
            nursery.start_soon(agent.request, asking(request_id="dup"))
            await sub.next(PermissionRequested)
            with pytest.raises(RequestFailed) as reused:
                await agent.request(asking(request_id="dup"))
            assert reused.value.code == "forbidden"
            await web.reply_permission("dup", allow=False)
