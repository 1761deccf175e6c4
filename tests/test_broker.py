"""A permission request is answerable from the moment it is on the bus, and not for ever.

Some SDKs announce a request on their event stream before they call back
for the answer (Copilot: ``permission.requested``, then the
``on_permission_request`` callback). A frontend that answers as soon as the
card appears used to get ``unknown_request ... belongs to a stream busd
observes`` and the run then waited for ever (issue 17, 3 runs in 6). Here a
driver does exactly that, over a real socket.

A request nobody answers is denied after the permission timeout (``busd
serve``: five minutes unless told otherwise), with the reason on the bus.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from busd.client import connect
from busd.core.events import (
    Envelope,
    Event,
    PermissionRequested,
    PermissionResolved,
    RunFinished,
    TextDelta,
)
from busd.core.permissions import PermissionRule
from busd.daemon.broker import DEFAULT_PERMISSION_TIMEOUT
from busd.daemon.hub import Daemon, DaemonConfig
from busd.frontends.headless import PrettyPrinter
from busd.plugins.drivers import PermissionDecision, RunContext

from .daemon_helpers import serving as serve_process
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


# -- nobody answers: the timeout -------------------------------------------------------


class _Clocked(Watcher):
    """A watcher that also notes when (on Trio's clock) each permission event came."""

    def __init__(self, daemon: Daemon) -> None:
        super().__init__(daemon)
        self.at: dict[type[Event], float] = {}
        daemon.bus.on_all(self._time)

    def _time(self, envelope: Envelope[Event]) -> None:
        if isinstance(envelope.event, PermissionRequested | PermissionResolved):
            self.at[type(envelope.event)] = trio.current_time()


async def test_a_request_nobody_answers_is_denied_after_the_default_timeout(
    autojump_clock: trio.abc.Clock,
) -> None:
    """``busd serve`` waits 5 minutes, then denies with a reason on the bus; the run goes on.

    The run's watchdog (also 5 minutes) pauses while a person is asked: the
    run is not stopped for the agent's silence meanwhile.
    """
    driver = ScriptDriver()
    daemon = make_daemon(driver, DaemonConfig(permission_timeout=DEFAULT_PERMISSION_TIMEOUT))
    watcher = _Clocked(daemon)
    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.run)
        state = daemon.runs.start(adapter="script", prompt="ask", started_by="t")
        finished = await watcher.finished(state.run_id)
        nursery.cancel_scope.cancel()
    waited = watcher.at[PermissionResolved] - watcher.at[PermissionRequested]
    assert waited == pytest.approx(DEFAULT_PERMISSION_TIMEOUT, abs=0.1)
    [resolved] = [e.event for e in watcher.seen if isinstance(e.event, PermissionResolved)]
    assert (resolved.outcome, resolved.by, resolved.reason) == (
        "denied",
        "timeout",
        "nobody answered within 300.0s",
    )
    assert [(d.outcome, d.by) for d in driver.decisions] == [("denied", "timeout")]
    assert (finished.status, finished.error) == ("ok", None)
    # What busd run prints for it (with --pretty, and on stderr with --json):
    printer = PrettyPrinter()
    [requested] = [e for e in watcher.seen if isinstance(e.event, PermissionRequested)]
    printer.render(requested)
    assert printer.decision(resolved) == "denied Bash (by timeout: nobody answered within 300.0s)"


async def test_an_answer_just_before_the_timeout_wins(
    autojump_clock: trio.abc.Clock, sock_path: Path
) -> None:
    driver = AnnouncingDriver()
    daemon = make_daemon(driver, DaemonConfig(permission_timeout=DEFAULT_PERMISSION_TIMEOUT))
    watcher = Watcher(daemon)
    async with serving(sock_path, daemon), connect(sock_path, client="web") as web:
        started = await web.start_run("script", "announce")
        card = await _card(watcher)
        driver.may_ask.set()
        await trio.sleep(DEFAULT_PERMISSION_TIMEOUT - 1)  # the virtual clock: a person hesitates
        decision = await web.reply_permission(card.request_id, allow=True)
        assert (decision["outcome"], decision["by"].split("[")[0]) == ("allowed", "web")
        assert (await watcher.finished(started["run_id"])).status == "ok"
    assert [d.outcome for d in driver.decisions] == ["allowed"]


async def test_busd_serve_denies_what_nobody_answered_within_its_permission_timeout(
    sock_path: Path,
) -> None:
    """``--permission-timeout`` reaches the daemon: a replayed request nobody answers is denied."""
    async with (
        serve_process(sock_path, "--no-journal", "--permission-timeout", "1s"),
        connect(sock_path, client="looker") as client,
        client.subscribe(["stream.permission.>", "busd.run.finished"], owned_only=True) as sub,
    ):
        started = await client.start_run(
            "claude-code", "x", driver="replay", options={"recording": "claude_code", "speed": 0}
        )
        seen: list[Event] = []
        with trio.fail_after(30):
            async for batch in sub:
                seen += [e.event for e in batch.events if e.run_id == started["run_id"]]
                if any(isinstance(event, RunFinished) for event in seen):
                    break
    [requested] = [e for e in seen if isinstance(e, PermissionRequested)]
    [resolved] = [e for e in seen if isinstance(e, PermissionResolved)]
    assert (resolved.request_id, resolved.outcome, resolved.by, resolved.reason) == (
        requested.request_id,
        "denied",
        "timeout",
        "nobody answered within 1.0s",
    )
