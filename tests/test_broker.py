"""A permission request is answerable from the moment it is on the bus.

Some SDKs announce a request on their event stream before they call back
for the answer (Copilot: ``permission.requested``, then the
``on_permission_request`` callback). A frontend that answers as soon as the
card appears used to get ``unknown_request ... belongs to a stream busd
observes`` and the run then waited for ever (issue 17, 3 runs in 6). Here a
driver does exactly that, over a real socket.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from busd.client import connect
from busd.core.events import PermissionRequested, PermissionResolved, RunFinished, TextDelta
from busd.core.permissions import PermissionRule
from busd.daemon.hub import DaemonConfig
from busd.plugins.drivers import PermissionDecision, RunContext

from .test_runs import ScriptDriver, Watcher, ask, make_daemon, serving, sock_path

__all__ = ["sock_path"]  # the fixture


class AnnouncingDriver(ScriptDriver):
    """Feeds the request as an event first, asks for the answer only when told to."""

    def __init__(self) -> None:
        super().__init__()
        self.may_ask = trio.Event()

    async def run(self, context: RunContext) -> None:
        request = ask(tool="Write", input={"path": "a.txt"})
        context.feed(request)  # the SDK's event: the card appears
        await self.may_ask.wait()  # ...while the SDK has not called back yet
        decision: PermissionDecision = await context.request_permission(request)
        self.decisions.append(decision)
        context.feed(TextDelta(message_id="m1", text=f"({decision.outcome})"))


async def _card(watcher: Watcher) -> PermissionRequested:
    with trio.fail_after(10):
        while True:
            for envelope in watcher.seen:
                if isinstance(envelope.event, PermissionRequested):
                    return envelope.event
            await trio.testing.wait_all_tasks_blocked()


async def test_an_answer_before_the_driver_asks_is_taken(sock_path: Path) -> None:
    driver = AnnouncingDriver()
    daemon = make_daemon(driver)
    watcher = Watcher(daemon)
    async with serving(sock_path, daemon), connect(sock_path, client="web") as web:
        started = await web.start_run("script", "announce")
        card = await _card(watcher)
        decision = await web.reply_permission(card.request_id, option_id="allow_once")
        assert decision["outcome"] == "allowed"
        driver.may_ask.set()
        assert (await watcher.finished(started["run_id"])).status == "ok"
    assert [d.outcome for d in driver.decisions] == ["allowed"]
    resolved = [e.event for e in watcher.seen if isinstance(e.event, PermissionResolved)]
    assert [(r.request_id, r.outcome) for r in resolved] == [(card.request_id, "allowed")]


async def test_rules_decide_as_soon_as_the_request_is_on_the_bus(sock_path: Path) -> None:
    """Policy and rules still come before people: an early answer cannot beat a rule."""
    driver = AnnouncingDriver()
    rules = (PermissionRule(action="deny", tool="Write"),)
    daemon = make_daemon(driver, DaemonConfig(permission_rules=rules))
    watcher = Watcher(daemon)
    async with serving(sock_path, daemon), connect(sock_path, client="web") as web:
        started = await web.start_run("script", "announce")
        card = await _card(watcher)
        kinds = [type(e.event) for e in watcher.seen if e.run_id == started["run_id"]]
        assert kinds[-2:] == [PermissionRequested, PermissionResolved]  # decided at once
        with pytest.raises(Exception, match="already_resolved"):
            await web.reply_permission(card.request_id, allow=True)
        driver.may_ask.set()
        finished: RunFinished = await watcher.finished(started["run_id"])
        assert finished.status == "ok"
    assert [(d.outcome, d.by) for d in driver.decisions] == [("denied", "rule:0")]
