"""busd's copilot driver runs a prompt on the real Copilot CLI (issue 17).

The CLI is the npm package ``@github/copilot`` pinned in contrib/agents,
isolated in the test's own home with an ``env -i``-like environment; its
model is the scripted Anthropic stand-in the OpenCode tests use
(``plugins/opencode/tests/opencode_standin.py``: thinking, a ``bash`` call,
an answer), reached through the SDK's bring-your-own-key ``provider``
option. With such a provider the CLI needs no GitHub token and calls
nothing else (traced with ``strace -e connect``: its one connection is to
the stand-in; it calls ``POST /v1/messages`` twice). Nothing is faked
between the daemon and the CLI: the driver starts it through the SDK, and a
frontend's answer to the shell permission goes through busd's broker.

What Copilot reports: each call's ``assistant.usage`` counts input *with*
the cache (the adapter separates it again, so busd's totals equal what the
stand-in served) and a ``cost`` of ``0.0``, a premium-request multiplier
(``is_byok``), not money: the run's ``cost_usd`` stays unknown.
``session.usage_info`` gives Copilot's own context estimate against its
prompt limit for the model (128,000 here), before each call.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio
from busd_copilot import CopilotAdapter, CopilotDriver

from busd import Adapter, Driver, TokenUsage, hookimpl
from busd.core.events import (
    Envelope,
    Event,
    PermissionRequested,
    PermissionResolved,
    RunFinished,
    SessionContext,
    TextComplete,
    TextDelta,
    ThinkingComplete,
    ToolComplete,
    ToolStart,
    TurnEnd,
    TurnStart,
    Usage,
)
from busd.core.permissions import PermissionRejected, PermissionRule
from busd.daemon.hub import Daemon, DaemonConfig
from busd.daemon.runs import RunState
from busd.plugins.manager import PluginManager

pytest.importorskip("copilot")

ROOT = Path(__file__).resolve().parents[3]
COPILOT = ROOT / "contrib/agents/node_modules/.bin/copilot"
_STANDIN = ROOT / "plugins/opencode/tests/opencode_standin.py"

pytestmark = pytest.mark.skipif(
    not COPILOT.exists(),
    reason=f"no Copilot CLI at {COPILOT} (install it: cd contrib/agents && npm install)",
)


def _standin_module() -> Any:
    spec = importlib.util.spec_from_file_location("copilot_opencode_standin", _STANDIN)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look themselves up there
    spec.loader.exec_module(module)
    return module


standin_module = _standin_module()
E = TypeVar("E", bound=Event)
PROMPT = "Run echo hello in the shell and tell me what it printed."


class _LiveCopilot:
    """The ``copilot`` plugin, its driver starting the pinned CLI in an isolated home."""

    def __init__(self, home: Path) -> None:
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home)}
        self.driver = CopilotDriver(cli_path=str(COPILOT), client_options={"env": env})

    @hookimpl
    def busd_adapters(self) -> Sequence[Adapter]:
        return [CopilotAdapter()]

    @hookimpl
    def busd_drivers(self) -> Sequence[Driver]:
        return [self.driver]


class Frontend:
    """A daemon with the live ``copilot`` plugin, and a frontend that answers every request.

    The frontend replies through the broker the moment a request is on the
    bus (``allow``, or a denial with the reason ``not now``).
    """

    def __init__(self, home: Path, model_url: str, *, allow: bool) -> None:
        self.home = home
        self.project = home / "project"
        self.project.mkdir(parents=True)
        self.model_url = model_url
        self.allow = allow
        plugins = PluginManager(environ={})
        plugins.register(_LiveCopilot(home), name="copilot")  # instead of the entry point's
        plugins.load_entry_points()
        self.daemon = Daemon(DaemonConfig(), plugins=plugins)
        self.seen: list[Envelope[Event]] = []
        self.asked: list[PermissionRequested] = []
        self.refused: list[str] = []
        self._finished: dict[str, trio.Event] = {}
        self._send, self._requests = trio.open_memory_channel[PermissionRequested](16)
        self.daemon.bus.on_all(self._record)

    def _record(self, envelope: Envelope[Event]) -> None:
        self.seen.append(envelope)
        match envelope.event:
            case PermissionRequested() as request:
                self.asked.append(request)
                self._send.send_nowait(request)
            case RunFinished() if envelope.run_id is not None:
                self._finished.setdefault(envelope.run_id, trio.Event()).set()

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The daemon, and the frontend's answers."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self.daemon.run)
            nursery.start_soon(self._answer)
            task_status.started()

    async def _answer(self) -> None:
        async for request in self._requests:
            reason = None if self.allow else "not now"
            try:
                self.daemon.broker.reply(
                    request.request_id, by="frontend", allow=self.allow, reason=reason
                )
            except PermissionRejected as exc:  # a rule decided first: a frontend is told so
                self.refused.append(str(exc))

    async def run(
        self, session_id: str | None = None, rules: Sequence[PermissionRule] = ()
    ) -> tuple[RunState, RunFinished]:
        state = self.daemon.runs.start(
            adapter="copilot",
            prompt=PROMPT,
            started_by="test",
            permission_rules=rules,
            session_id=session_id,
            model=standin_module.MODEL,
            cwd=str(self.project),
            options={
                "provider": {"type": "anthropic", "base_url": self.model_url, "api_key": "sk-x"}
            },
        )
        with trio.fail_after(60):
            await self._finished.setdefault(state.run_id, trio.Event()).wait()
        [finished] = self.of(state.run_id, RunFinished)
        return state, finished

    def of(self, run_id: str | None, cls: type[E]) -> list[E]:
        return [e.event for e in self.seen if e.run_id == run_id and isinstance(e.event, cls)]


@pytest.fixture
def standin() -> Iterator[Any]:
    with standin_module.StandIn() as served:
        yield served


def _counts(usage: TokenUsage) -> tuple[int, int, int, int]:
    return (
        usage.input_tokens,
        usage.output_tokens,
        usage.cache_read_tokens,
        usage.cache_write_tokens,
    )


def _served(calls: Sequence[Any]) -> tuple[int, int, int, int]:
    """What the stand-in served over ``calls``, as busd counts it."""
    return (
        sum(c.usage["input_tokens"] for c in calls),
        sum(c.usage["output_tokens"] for c in calls),
        sum(c.usage["cache_read_input_tokens"] for c in calls),
        sum(c.usage["cache_creation_input_tokens"] for c in calls),
    )


@pytest.mark.parametrize("allow", [True, False], ids=["allowed", "denied"])
async def test_a_prompt_on_the_copilot_cli_streams_its_answer_and_asks_for_its_shell(
    tmp_path: Path, standin: Any, allow: bool
) -> None:
    home = tmp_path / "home"
    live = Frontend(home, standin.url, allow=allow)
    async with trio.open_nursery() as nursery:
        await nursery.start(live.serve)
        state, finished = await live.run()
        nursery.cancel_scope.cancel()

    def of(cls: type[E]) -> list[E]:
        return live.of(state.run_id, cls)

    assert finished.status == "ok", finished.error
    # The CLI kept its session in the test's home, under the id busd will resume.
    assert state.sdk_session is not None
    assert (home / ".copilot" / "session-state" / state.sdk_session / "events.jsonl").is_file()
    # The shell tool was asked for, answered by the frontend, and run only when allowed.
    [request] = live.asked
    assert (request.tool, request.input.get("command")) == ("bash", "echo hello")
    [resolved] = of(PermissionResolved)
    assert (resolved.request_id, resolved.outcome, resolved.by) == (
        request.request_id,
        "allowed" if allow else "denied",
        "frontend",
    )
    [tool] = of(ToolStart)
    [result] = of(ToolComplete)
    assert tool.tool_call_id == request.tool_call_id == "toolu_standin_1"
    assert (result.tool_call_id, result.status) == (tool.tool_call_id, "ok" if allow else "error")
    if allow:
        assert (result.output or "").startswith("hello\n")
    else:
        assert result.output is None
        assert "not now" in (result.error or "")
    # ...and the model was told: the tool's output, or the frontend's reason.
    told = json.dumps(standin.requests[-1]["messages"][-1])
    assert ("hello" if allow else "not now") in told
    # Streaming is on: the answer arrives in deltas before it is complete.
    deltas = "".join(d.text for d in of(TextDelta))
    assert standin_module.ANSWER in deltas
    texts = [t.text for t in of(TextComplete)]
    assert standin_module.ANSWER in texts
    # The CLI called the model twice, on the Messages API only, and counted exactly that.
    assert [s.kind for s in standin.served] == ["tool", "answer"]
    tokens = finished.usage
    assert _counts(tokens) == _served(standin.served)
    assert tokens.cost_usd is None  # Copilot's cost is 0.0 premium requests, not money
    assert of(Usage)[-1].tokens == tokens
    # One turn per call, though the CLI reports a call's usage before its message: each
    # thinking block completes once, the tool starts in the call that asked for it, and
    # nothing of a call comes after its usage, so busd estimates nothing on top.
    calls = (TurnStart, TurnEnd, Usage, ThinkingComplete, TextComplete, ToolStart)
    events = [e.event for e in live.seen if e.run_id == state.run_id]
    events = [e for e in events if isinstance(e, calls)]  # no derived busd.* events
    assert [(e.turn_id, e.finish_reason) for e in of(TurnEnd)] == [
        ("0", "tool_use"),
        ("1", "end_turn"),
    ]
    assert len(of(TurnStart)) == 2
    assert [t.text for t in of(ThinkingComplete)] == [standin_module.THOUGHT] * 2
    first_end = next(i for i, e in enumerate(events) if isinstance(e, TurnEnd))
    assert events.index(tool) < first_end
    assert [type(e) for e in events[first_end - 1 : first_end + 1]] == [Usage, TurnEnd]
    live_stats = live.daemon.session_stats(state.request.session_id)
    assert live_stats is not None
    assert (live_stats.output_tokens, live_stats.output_estimated) == (tokens.output_tokens, False)
    # The context: the last call's whole prompt and answer, as served; Copilot's own
    # estimate (system prompt and tools included) against its prompt limit before each call.
    assert finished.context is not None
    assert finished.context.used == sum(standin.served[-1].usage.values())
    reported = of(SessionContext)
    assert len(reported) == 2
    assert {r.window for r in reported} == {128_000}
    assert all(r.used > finished.context.used for r in reported)
    assert finished.context.window == 128_000  # the provider's, not busd's table's 200,000


async def test_the_runs_own_rule_denies_the_shell_before_a_frontend_that_allows(
    tmp_path: Path, standin: Any
) -> None:
    live = Frontend(tmp_path / "home", standin.url, allow=True)
    rule = PermissionRule(action="deny", category="shell", reason="--deny shell")
    async with trio.open_nursery() as nursery:
        await nursery.start(live.serve)
        state, finished = await live.run(rules=[rule])
        nursery.cancel_scope.cancel()
    assert finished.status == "ok", finished.error
    [request] = live.asked
    [resolved] = live.of(state.run_id, PermissionResolved)
    assert (resolved.request_id, resolved.outcome, resolved.by, resolved.reason) == (
        request.request_id,
        "denied",
        "test",
        "--deny shell",
    )
    assert len(live.refused) == 1  # the frontend's allow came too late, and was refused
    assert "already denied" in live.refused[0]
    [result] = live.of(state.run_id, ToolComplete)
    assert (result.status, result.output) == ("error", None)
    assert "--deny shell" in json.dumps(standin.requests[-1]["messages"][-1])  # the model told


async def test_a_continued_session_resumes_the_cli_and_adds_up_its_runs(
    tmp_path: Path, standin: Any
) -> None:
    """Run 2 resumes the CLI's own session; its tokens are its own, the session's the sum."""
    live = Frontend(tmp_path / "home", standin.url, allow=True)
    async with trio.open_nursery() as nursery:
        await nursery.start(live.serve)
        first_state, first = await live.run()
        session_id = first_state.request.session_id
        second_state, second = await live.run(session_id=session_id)
        nursery.cancel_scope.cancel()
    assert (first.status, second.status) == ("ok", "ok"), (first.error, second.error)
    assert second_state.request.session_id == session_id
    assert second_state.sdk_session == first_state.sdk_session  # resumed, not a new one
    # Run 2's model calls carry run 1's conversation: two prompts, two tool results.
    history = json.dumps(standin.requests[-1]["messages"])
    assert history.count(PROMPT) == 2
    assert [s.kind for s in standin.served] == ["tool", "answer", "tool", "answer"]
    assert _counts(first.usage) == _served(standin.served[:2])
    assert _counts(second.usage) == _served(standin.served[2:])
    snapshot = live.daemon.sessions.snapshot(session_id)
    assert snapshot is not None
    assert snapshot.usage is not None
    assert _counts(snapshot.usage) == _served(standin.served)
