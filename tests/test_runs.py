"""Run control and permissions, with a scripted driver standing in for an SDK.

The SDK drivers are tested against their own stand-ins in plugins/*; here the
daemon's side is under test: start/cancel, one run per session, the
watchdog, the summary, and permission requests answered by policy, rules or
the first of several frontends.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from busd.client import RequestFailed, connect
from busd.core.events import (
    Envelope,
    Event,
    PermissionOption,
    PermissionRequested,
    PermissionResolved,
    RunFinished,
    SessionError,
    SessionIdle,
    SessionStart,
    TextComplete,
    TextDelta,
    TokenUsage,
    ToolComplete,
    ToolStart,
    Usage,
)
from busd.core.permissions import PermissionRule
from busd.daemon.endpoint import Endpoint
from busd.daemon.hub import Daemon, DaemonConfig
from busd.daemon.server import Server
from busd.plugins.adapters import Adapter, Emitted, Translator
from busd.plugins.drivers import Driver, PermissionDecision, RunContext
from busd.plugins.hookspecs import hookimpl
from busd.plugins.manager import PluginManager
from busd.wire import Runs

OPTIONS = [
    PermissionOption(id="allow_once", label="Allow once", kind="allow_once"),
    PermissionOption(id="reject", label="Reject", kind="reject_once"),
]


def ask(request_id: str = "perm-1", **fields: Any) -> PermissionRequested:
    return PermissionRequested(
        request_id=request_id,
        tool=fields.pop("tool", "Bash"),
        input=fields.pop("input", {"command": "rm -rf build"}),
        options=OPTIONS,
        **fields,
    )


class ScriptTranslator(Translator):
    """Raw events are catalog events already; closing stops open text."""

    def __init__(self, *, session_id: str | None = None) -> None:
        super().__init__(session_id=session_id, adapter="script")
        self.open_text: dict[str, str] = {}

    def translate(self, raw: object, now: float) -> list[Emitted]:
        assert isinstance(raw, Event)
        if isinstance(raw, TextDelta):
            self.open_text[raw.message_id] = self.open_text.get(raw.message_id, "") + raw.text
        elif isinstance(raw, TextComplete):
            self.open_text.pop(raw.message_id, None)
        return [self.emit(raw)]

    def close(self, now: float) -> list[Emitted]:
        return [
            self.emit(TextComplete(message_id=m, text=t, stopped=True))
            for m, t in self.open_text.items()
        ] + [self.emit(SessionIdle(aborted=bool(self.open_text)))]


class ScriptAdapter:
    name = "script"

    def translator(self, *, session_id: str | None = None) -> Translator:
        return ScriptTranslator(session_id=session_id)


class ScriptDriver:
    """Behaves as its prompt says: ok, ask, hang, fail."""

    name = "script"
    default_model = "script-1"

    def __init__(self) -> None:
        self.decisions: list[PermissionDecision] = []
        self.cancelled = 0
        self.models: list[str | None] = []

    async def run(self, context: RunContext) -> None:
        self.models.append(context.request.model)
        feed = context.feed
        feed(SessionStart(model=context.request.model))
        feed(TextDelta(message_id="m1", text="Working"))
        prompt = context.request.prompt
        try:
            if prompt.startswith("ask"):
                category = prompt.split(":")[1] if ":" in prompt else None
                decision = await context.request_permission(ask(category=category))
                self.decisions.append(decision)
                feed(TextDelta(message_id="m1", text=f" ({decision.outcome})"))
            elif prompt == "hang":
                await trio.sleep_forever()
            elif prompt == "fail":
                raise RuntimeError("the agent crashed")
            elif prompt.startswith("cost:"):  # a call with its cost, as the agent priced it
                feed(Usage(tokens=TokenUsage(input_tokens=10, output_tokens=42, cost_usd=0.5)))
                return
            elif prompt.startswith("models:"):  # a session total and its breakdown, as given
                tokens = {m: TokenUsage(output_tokens=int(n)) for m, n in _pairs(prompt[7:])}
                total = TokenUsage(output_tokens=sum(t.output_tokens for t in tokens.values()))
                feed(Usage(tokens=total, models=tokens))
                return
            feed(ToolStart(tool_call_id="t1", name="Read", input={"path": "a"}))
            feed(ToolComplete(tool_call_id="t1", name="Read", status="ok", duration_s=0.5))
            feed(TextDelta(message_id="m1", text=" done."))
            feed(TextComplete(message_id="m1", text="Working done."))
            feed(Usage(tokens=TokenUsage(input_tokens=10, output_tokens=42)))
        except trio.Cancelled:
            self.cancelled += 1
            raise


def _pairs(text: str) -> list[tuple[str, str]]:
    """``a=40,b=2`` -> ``[("a", "40"), ("b", "2")]``."""
    return [(m, n) for m, _, n in (pair.partition("=") for pair in text.split(","))]


class ScriptPlugin:
    def __init__(self, driver: ScriptDriver) -> None:
        self.driver = driver

    @hookimpl
    def busd_adapters(self) -> Sequence[Adapter]:
        return [ScriptAdapter()]

    @hookimpl
    def busd_drivers(self) -> Sequence[Driver]:
        return [self.driver]


def make_daemon(driver: ScriptDriver, config: DaemonConfig | None = None, *extra: object) -> Daemon:
    plugins = PluginManager(environ={})
    plugins.register(ScriptPlugin(driver), name="script")
    for index, plugin in enumerate(extra):
        plugins.register(plugin, name=f"extra-{index}")
    return Daemon(config, plugins=plugins)


@pytest.fixture
def sock_path() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="busd-", dir="/tmp"))
    yield directory / "bus.sock"
    shutil.rmtree(directory, ignore_errors=True)


@asynccontextmanager
async def serving(path: Path, daemon: Daemon) -> AsyncIterator[Daemon]:
    with Endpoint.bind(path) as endpoint:
        async with trio.open_nursery() as nursery:
            await nursery.start(Server(daemon, endpoint.socket).run)
            yield daemon
            nursery.cancel_scope.cancel()


class Watcher:
    """Records every event and lets a test wait for a run's end without polling."""

    def __init__(self, daemon: Daemon) -> None:
        self.seen: list[Envelope[Event]] = []
        self._done: dict[str, trio.Event] = {}
        self._summaries: dict[str, RunFinished] = {}
        daemon.bus.on_all(self._record)

    def _record(self, envelope: Envelope[Event]) -> None:
        self.seen.append(envelope)
        if isinstance(envelope.event, RunFinished) and envelope.run_id is not None:
            self._summaries[envelope.run_id] = envelope.event
            self._event(envelope.run_id).set()

    def _event(self, run_id: str) -> trio.Event:
        return self._done.setdefault(run_id, trio.Event())

    async def finished(self, run_id: str) -> RunFinished:
        with trio.fail_after(600):
            await self._event(run_id).wait()
        return self._summaries[run_id]


# -- in-process, virtual time ----------------------------------------------------------


async def test_a_run_streams_and_ends_with_its_summary(autojump_clock: trio.abc.Clock) -> None:
    driver = ScriptDriver()
    daemon = make_daemon(driver)
    watcher = Watcher(daemon)
    seen = watcher.seen
    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.run)
        state = daemon.runs.start(adapter="script", prompt="ok", started_by="test")
        summary = await watcher.finished(state.run_id)
        nursery.cancel_scope.cancel()
    assert summary.status == "ok"
    assert (summary.usage.input_tokens, summary.usage.output_tokens) == (10, 42)
    assert [(t.name, t.calls, t.errors) for t in summary.tools] == [("Read", 1, 0)]
    assert driver.models == ["script-1"]  # the driver's documented default
    run_events = [e for e in seen if e.run_id == state.run_id]
    assert {e.session_id for e in run_events} == {state.request.session_id}
    names = [type(e.event).__name__ for e in run_events]
    assert names[0] == "RunStarted"
    assert names[-1] == "RunFinished"
    assert "SessionIdle" in names


async def test_a_run_summary_has_its_share_per_model(autojump_clock: trio.abc.Clock) -> None:
    """Two runs of one session whose usage breaks down by model.

    Run 1: sonnet 40, haiku 2 (42 output). Run 2's SDK counts from zero and
    reports sonnet 8: the session's totals become sonnet 48, haiku 2 (50),
    and run 2's share is sonnet 8 and nothing of haiku (left out).
    """
    daemon = make_daemon(ScriptDriver())
    watcher = Watcher(daemon)
    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.run)
        first = daemon.runs.start(
            adapter="script", prompt="models:sonnet=40,haiku=2", started_by="t"
        )
        one = await watcher.finished(first.run_id)
        session = first.request.session_id
        second = daemon.runs.start(
            adapter="script", prompt="models:sonnet=8", started_by="t", session_id=session
        )
        two = await watcher.finished(second.run_id)
        snapshot = daemon.sessions.snapshot(session)
        nursery.cancel_scope.cancel()
    assert one.usage.output_tokens == 40 + 2
    assert {m: u.output_tokens for m, u in one.models.items()} == {"sonnet": 40, "haiku": 2}
    assert two.usage.output_tokens == 8
    assert {m: u.output_tokens for m, u in two.models.items()} == {"sonnet": 8}
    assert snapshot is not None
    assert {m: u.output_tokens for m, u in snapshot.usage_by_model.items()} == {
        "sonnet": 48,
        "haiku": 2,
    }


async def test_a_failing_agent_ends_the_run_with_an_error(autojump_clock: trio.abc.Clock) -> None:
    daemon = make_daemon(ScriptDriver())
    watcher = Watcher(daemon)
    seen = watcher.seen
    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.run)
        state = daemon.runs.start(adapter="script", prompt="fail", started_by="test")
        summary = await watcher.finished(state.run_id)
        assert daemon.publish(SessionStart(), session_id="other").seq > 0  # the daemon lives on
        nursery.cancel_scope.cancel()
    assert summary.status == "error"
    assert summary.error == "RuntimeError: the agent crashed"
    errors = [e.event for e in seen if isinstance(e.event, SessionError)]
    assert [e.message for e in errors] == ["RuntimeError: the agent crashed"]


async def test_the_watchdog_ends_a_silent_run(autojump_clock: trio.abc.Clock) -> None:
    daemon = make_daemon(ScriptDriver(), DaemonConfig(watchdog=60.0))
    watcher = Watcher(daemon)
    seen = watcher.seen
    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.run)
        start = trio.current_time()
        state = daemon.runs.start(adapter="script", prompt="hang", started_by="test")
        summary = await watcher.finished(state.run_id)
        elapsed = trio.current_time() - start
        nursery.cancel_scope.cancel()
    assert summary.status == "timed_out"
    assert 60.0 <= elapsed < 61.0
    assert any(isinstance(e.event, SessionError) and "watchdog" in e.event.message for e in seen)


async def test_cancel_keeps_partial_text_and_cancels_pending_permissions(
    autojump_clock: trio.abc.Clock,
) -> None:
    driver = ScriptDriver()
    daemon = make_daemon(driver)
    watcher = Watcher(daemon)
    seen = watcher.seen
    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.run)
        state = daemon.runs.start(adapter="script", prompt="ask", started_by="test")
        await trio.testing.wait_all_tasks_blocked()  # the driver waits for an answer
        assert [r.request_id for r in daemon.broker.pending()] == [f"{state.run_id}/perm-1"]
        daemon.runs.cancel(state.run_id, by="ui")
        summary = await watcher.finished(state.run_id)
        with pytest.raises(Exception, match="already ended"):
            daemon.runs.cancel(state.run_id, by="ui")
        nursery.cancel_scope.cancel()
    assert summary.status == "cancelled"
    stopped = [e.event for e in seen if isinstance(e.event, TextComplete)]
    assert stopped == [TextComplete(message_id="m1", text="Working", stopped=True)]
    resolved = [e.event for e in seen if isinstance(e.event, PermissionResolved)]
    assert [(r.request_id, r.outcome) for r in resolved] == [
        (f"{state.run_id}/perm-1", "cancelled")
    ]
    assert driver.cancelled == 1  # the driver was cancelled while it waited


async def test_one_run_per_session_and_sessions_run_concurrently(
    autojump_clock: trio.abc.Clock,
) -> None:
    daemon = make_daemon(ScriptDriver())
    watcher = Watcher(daemon)
    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.run)
        first = daemon.runs.start(adapter="script", prompt="hang", started_by="a")
        session = first.request.session_id
        with pytest.raises(Exception, match="already has run") as refused:
            daemon.runs.start(adapter="script", prompt="ok", started_by="b", session_id=session)
        assert getattr(refused.value, "code", None) == "session_busy"
        other = daemon.runs.start(adapter="script", prompt="ok", started_by="b")
        assert (await watcher.finished(other.run_id)).status == "ok"
        daemon.runs.cancel(first.run_id, by="a")
        await watcher.finished(first.run_id)
        again = daemon.runs.start(adapter="script", prompt="ok", started_by="a", session_id=session)
        assert (await watcher.finished(again.run_id)).status == "ok"
        nursery.cancel_scope.cancel()
    with pytest.raises(Exception, match=r"no adapter 'nope' \(adapters loaded: script\); drivers"):
        daemon.runs.start(adapter="nope", prompt="x", started_by="a")


async def test_rules_decide_before_people(autojump_clock: trio.abc.Clock) -> None:
    rules = (
        PermissionRule(action="deny", category="destructive"),
        PermissionRule(action="allow", tool="Bash", annotations={"readOnlyHint": True}),
        PermissionRule(action="ask", tool="*"),
    )
    driver = ScriptDriver()
    daemon = make_daemon(driver, DaemonConfig(permission_rules=rules, permission_timeout=30.0))
    watcher = Watcher(daemon)
    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.run)
        denied = daemon.runs.start(adapter="script", prompt="ask:destructive", started_by="t")
        await watcher.finished(denied.run_id)
        asked = daemon.runs.start(adapter="script", prompt="ask", started_by="t")
        await watcher.finished(asked.run_id)  # nobody answers: denied after the timeout
        nursery.cancel_scope.cancel()
    first, second = driver.decisions
    assert (first.outcome, first.by, first.option_id) == ("denied", "rule:0", "reject")
    assert (second.outcome, second.by) == ("denied", "timeout")
    assert second.reason == "nobody answered within 30.0s"


async def test_a_policy_plugin_decides_first(autojump_clock: trio.abc.Clock) -> None:
    class AllowReads:
        @hookimpl
        def busd_permission_policy(
            self, request: PermissionRequested, envelope: Envelope[Event]
        ) -> str | None:
            return "allow" if request.tool == "Bash" else None

    driver = ScriptDriver()
    rules = (PermissionRule(action="deny"),)
    daemon = make_daemon(driver, DaemonConfig(permission_rules=rules), AllowReads())
    watcher = Watcher(daemon)
    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.run)
        state = daemon.runs.start(adapter="script", prompt="ask", started_by="t")
        await watcher.finished(state.run_id)
        nursery.cancel_scope.cancel()
    [decision] = driver.decisions
    assert (decision.outcome, decision.by, decision.option_id) == (
        "allowed",
        "policy",
        "allow_once",
    )


# -- over the socket, several frontends ---------------------------------------------------


async def test_the_first_frontend_to_answer_wins_and_everyone_sees_it(sock_path: Path) -> None:
    driver = ScriptDriver()
    daemon = make_daemon(driver)
    async with (
        serving(sock_path, daemon),
        connect(sock_path, client="tui") as tui,
        connect(sock_path, client="web") as web,
        tui.subscribe(["stream.permission.>", "busd.run.finished"], window_ms=0) as tui_sub,
        web.subscribe(["stream.permission.>", "busd.run.finished"], window_ms=0) as web_sub,
    ):
        started = await tui.start_run("script", "ask")
        assert set(started) == {"run_id", "session_id"}
        seen: dict[str, list[Envelope[Event]]] = {"tui": [], "web": []}

        asked = trio.Event()

        async def watch(name: str, sub: Any) -> None:
            with trio.fail_after(20):
                async for batch in sub:
                    for envelope in batch.events:
                        seen[name].append(envelope)
                        if name == "web" and isinstance(envelope.event, PermissionRequested):
                            asked.set()
                        if isinstance(envelope.event, RunFinished):
                            return

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch, "tui", tui_sub)
            nursery.start_soon(watch, "web", web_sub)
            with trio.fail_after(20):
                await asked.wait()
            request_id = f"{started['run_id']}/perm-1"  # busd scopes SDK ids per run
            answer = await web.reply_permission(request_id, option_id="allow_once")
            assert answer["outcome"] == "allowed"
            with pytest.raises(RequestFailed, match="already_resolved") as late:
                await tui.reply_permission(request_id, option_id="reject")
            assert "by web" in str(late.value)

    for name in ("tui", "web"):
        kinds = [type(e.event).__name__ for e in seen[name]]
        assert kinds == ["PermissionRequested", "PermissionResolved", "RunFinished"], name
        resolved = seen[name][1].event
        assert isinstance(resolved, PermissionResolved)
        assert (resolved.outcome, resolved.by, resolved.option_id) == (
            "allowed",
            f"web[pid={os.getpid()},uid={os.getuid()}]",  # who answered, as the kernel says
            "allow_once",
        )
    assert [d.outcome for d in driver.decisions] == ["allowed"]  # the driver got one answer


async def test_run_commands_fail_clearly_and_harmlessly(sock_path: Path) -> None:
    daemon = make_daemon(ScriptDriver())
    watcher = Watcher(daemon)
    async with serving(sock_path, daemon), connect(sock_path, client="ui") as ui:
        with pytest.raises(RequestFailed, match="unknown_adapter"):
            await ui.start_run("nope", "hello")
        with pytest.raises(RequestFailed, match="unknown_run"):
            await ui.cancel_run("run-nope")
        with pytest.raises(RequestFailed, match="unknown_request"):
            await ui.reply_permission("perm-nope", allow=True)
        started = await ui.start_run("script", "hang")
        runs = await ui.request(Runs())
        assert [r["run_id"] for r in runs] == [started["run_id"]]
        await ui.cancel_run(started["run_id"])
        assert (await watcher.finished(started["run_id"])).status == "cancelled"
        with pytest.raises(RequestFailed, match="run_finished"):
            await ui.cancel_run(started["run_id"])


async def test_the_watchdog_waits_while_a_person_decides(autojump_clock: trio.abc.Clock) -> None:
    driver = ScriptDriver()
    daemon = make_daemon(driver, DaemonConfig(watchdog=60.0, permission_timeout=None))
    watcher = Watcher(daemon)
    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.run)
        state = daemon.runs.start(adapter="script", prompt="ask", started_by="t")
        await trio.sleep(600)  # ten watchdog periods with the question unanswered
        assert state.status == "running"
        daemon.broker.reply(f"{state.run_id}/perm-1", by="ui", option_id="allow_once")
        summary = await watcher.finished(state.run_id)
        nursery.cancel_scope.cancel()
    assert summary.status == "ok"
    assert [d.outcome for d in driver.decisions] == ["allowed"]


async def test_owned_only_is_the_runs_this_client_started(sock_path: Path) -> None:
    """Another client's run is not ours; our own is, also after we reconnect."""
    daemon = make_daemon(ScriptDriver())
    watcher = Watcher(daemon)
    wanted = ["busd.run.>", "stream.text.complete"]
    async with (
        serving(sock_path, daemon),
        connect(sock_path, client="mine") as mine,
        connect(sock_path, client="theirs") as theirs,
        mine.subscribe(wanted, owned_only=True, window_ms=0) as own_sub,
    ):
        their_run = await theirs.start_run("script", "ok")
        my_run = await mine.start_run("script", "hang")
        await watcher.finished(their_run["run_id"])
        async with connect(sock_path, client="mine") as again:  # same process, same name
            async with again.subscribe(wanted, owned_only=True, since_seq=0, window_ms=0) as sub:
                await again.cancel_run(my_run["run_id"])
                await watcher.finished(my_run["run_id"])
                replayed = await _events_until_finished(sub)
        live = await _events_until_finished(own_sub)
    for seen in (live, replayed):
        assert {e.run_id for e in seen} == {my_run["run_id"]}
        assert isinstance(seen[-1].event, RunFinished)


async def _events_until_finished(sub: Any) -> list[Envelope[Event]]:
    seen: list[Envelope[Event]] = []
    with trio.fail_after(20):
        async for batch in sub:
            seen += batch.events
            if any(isinstance(e.event, RunFinished) for e in batch.events):
                return seen
    return seen


async def test_a_second_answer_from_the_same_client_is_already_resolved(sock_path: Path) -> None:
    """Two replies back to back on one connection: the second changes nothing and says so."""
    driver = ScriptDriver()
    daemon = make_daemon(driver)
    watcher = Watcher(daemon)
    async with serving(sock_path, daemon), connect(sock_path, client="ui") as ui:
        started = await ui.start_run("script", "ask")
        request_id = f"{started['run_id']}/perm-1"
        with trio.fail_after(20):
            while request_id not in {p.request_id for p in daemon.broker.pending()}:
                await trio.testing.wait_all_tasks_blocked()
        answers: dict[bool, str] = {}

        async def answer(allow: bool) -> None:
            try:
                await ui.reply_permission(request_id, allow=allow)
                answers[allow] = "ok"
            except RequestFailed as exc:
                answers[allow] = exc.code

        async with trio.open_nursery() as nursery:  # both queued before the writer runs
            nursery.start_soon(answer, True)
            nursery.start_soon(answer, False)
        assert sorted(answers.values()) == ["already_resolved", "ok"], answers
        winner = next(allow for allow, said in answers.items() if said == "ok")
        await watcher.finished(started["run_id"])
    outcome = "allowed" if winner else "denied"
    assert [d.outcome for d in driver.decisions] == [outcome]
    resolved = [e.event for e in watcher.seen if isinstance(e.event, PermissionResolved)]
    assert [r.outcome for r in resolved] == [outcome]


async def test_a_continued_session_adds_up_its_runs(autojump_clock: trio.abc.Clock) -> None:
    """Each run's SDK counts from zero; the session's running total goes on (issue 17, bug 1).

    ScriptDriver reports 10 in / 42 out for each run: three runs are 30 / 126,
    each run's summary its own 10 / 42, and the context sees three calls.
    """
    driver = ScriptDriver()
    daemon = make_daemon(driver)
    watcher = Watcher(daemon)
    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.run)
        first = daemon.runs.start(adapter="script", prompt="ok", started_by="a")
        session = first.request.session_id
        summaries = [await watcher.finished(first.run_id)]
        for _ in range(2):
            run = daemon.runs.start(
                adapter="script", prompt="ok", started_by="a", session_id=session
            )
            summaries.append(await watcher.finished(run.run_id))
        nursery.cancel_scope.cancel()
    assert [(s.usage.input_tokens, s.usage.output_tokens) for s in summaries] == [(10, 42)] * 3
    snapshot = daemon.sessions.snapshot(session)
    assert snapshot is not None
    assert snapshot.usage is not None
    assert (snapshot.usage.input_tokens, snapshot.usage.output_tokens) == (30, 126)
    reported = [e.event.tokens.output_tokens for e in watcher.seen if isinstance(e.event, Usage)]
    assert reported == [42, 84, 126]  # stream.usage stays the session's running total


async def test_a_run_that_reports_no_cost_has_an_unknown_cost_not_a_free_one(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Run 1 says $0.50; run 2 of the same session says nothing of cost.

    The session's running total keeps run 1's cost, so run 2's share of it
    would read $0.00: its summary says unknown (``None``) instead.
    """
    driver = ScriptDriver()
    daemon = make_daemon(driver)
    watcher = Watcher(daemon)
    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.run)
        first = daemon.runs.start(adapter="script", prompt="cost:", started_by="a")
        session = first.request.session_id
        priced = await watcher.finished(first.run_id)
        second = daemon.runs.start(
            adapter="script", prompt="ok", started_by="a", session_id=session
        )
        unpriced = await watcher.finished(second.run_id)
        nursery.cancel_scope.cancel()
    assert priced.usage.cost_usd == 0.5
    assert unpriced.usage.cost_usd is None
    assert (unpriced.usage.input_tokens, unpriced.usage.output_tokens) == (10, 42)
    snapshot = daemon.sessions.snapshot(session)
    assert snapshot is not None
    assert snapshot.usage is not None
    assert snapshot.usage.cost_usd == 0.5
