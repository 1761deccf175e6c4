"""The real ``opencode serve`` asks busd before it runs the shell (issue 17).

The server is the npm package pinned in contrib/agents, isolated in the
test's own home, its project configured with ``"permission": {"bash":
"ask"}``; its model is the stand-in (``opencode_standin.py``), which calls
``bash`` (``echo hello``) and answers after the tool's result. OpenCode
publishes ``permission.asked`` on its ``/event`` stream and waits; busd's
broker decides: a frontend that allows, a frontend that denies with a
reason, the run's own rule before a frontend that allows, or nobody before
the daemon's permission timeout. The shell runs only when allowed, the
model is told the outcome (the output, or the reason it was refused), and
the run's tokens and cost are exactly what OpenCode reports for its session.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

import httpx
import pytest
import trio
from opencode_standin import ANSWER, MODEL, OPENCODE, SAID, OpenCodeServer, StandIn

from busd import TokenUsage
from busd.core.events import (
    Envelope,
    Event,
    PermissionRequested,
    PermissionResolved,
    RunFinished,
    TextComplete,
    ToolComplete,
    ToolStart,
)
from busd.core.permissions import PermissionRejected, PermissionRule
from busd.daemon.hub import Daemon, DaemonConfig
from busd.daemon.runs import RunState
from busd.plugins.manager import PluginManager

pytestmark = pytest.mark.skipif(
    not OPENCODE.exists(),
    reason=f"no opencode at {OPENCODE} (install it: cd contrib/agents && npm ci)",
)
E = TypeVar("E", bound=Event)
PROMPT = "Run echo hello in the shell and tell me what it printed."
NOT_NOW = "not now"


class Frontend:
    """A daemon with the installed plugins, and a frontend that answers every request at once.

    ``allow`` is its answer (``None``: it never answers); a denial says ``not now``.
    """

    def __init__(
        self, server: OpenCodeServer, *, allow: bool | None, permission_timeout: float = 60.0
    ) -> None:
        plugins = PluginManager(environ={})
        plugins.load_entry_points()
        config = DaemonConfig(permission_timeout=permission_timeout)
        self.daemon = Daemon(config, plugins=plugins)
        self.server = server
        self.allow = allow
        self.seen: list[Envelope[Event]] = []
        self.refused: list[str] = []
        self._finished: dict[str, trio.Event] = {}
        self._send, self._requests = trio.open_memory_channel[PermissionRequested](16)
        self.daemon.bus.on_all(self._record)

    def _record(self, envelope: Envelope[Event]) -> None:
        self.seen.append(envelope)
        match envelope.event:
            case PermissionRequested() as request:
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
            if self.allow is None:
                continue
            reason = None if self.allow else NOT_NOW
            try:
                self.daemon.broker.reply(
                    request.request_id, by="frontend", allow=self.allow, reason=reason
                )
            except PermissionRejected as exc:  # a rule decided first: the frontend is told so
                self.refused.append(str(exc))

    async def run(self, rules: Sequence[PermissionRule] = ()) -> tuple[RunState, RunFinished]:
        state = self.daemon.runs.start(
            adapter="opencode",
            prompt=PROMPT,
            started_by="test",
            permission_rules=rules,
            model=f"anthropic/{MODEL}",
            cwd=str(self.server.project),
            options={"base_url": self.server.url},
        )
        with trio.fail_after(60):
            await self._finished.setdefault(state.run_id, trio.Event()).wait()
        [finished] = self.of(state.run_id, RunFinished)
        return state, finished

    def of(self, run_id: str, cls: type[E]) -> list[E]:
        return [e.event for e in self.seen if e.run_id == run_id and isinstance(e.event, cls)]


@pytest.fixture
def standin() -> Iterator[StandIn]:
    with StandIn() as served:
        yield served


@pytest.fixture
async def opencode(tmp_path: Path, standin: StandIn) -> AsyncIterator[OpenCodeServer]:
    server = OpenCodeServer(tmp_path / "oc", standin.url, bash="ask")
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def reported(url: str) -> TokenUsage:
    """The one OpenCode session's totals, as ``GET /session`` reports them."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        (info,) = (await http.get("/session")).json()
    tokens = info["tokens"]
    return TokenUsage(
        input_tokens=tokens["input"],
        output_tokens=tokens["output"],
        reasoning_tokens=tokens["reasoning"],
        cache_read_tokens=tokens["cache"]["read"],
        cache_write_tokens=tokens["cache"]["write"],
        cost_usd=info["cost"],
    )


def counts(usage: TokenUsage) -> tuple[int, int, int, int]:
    return (
        usage.input_tokens,
        usage.output_tokens,
        usage.cache_read_tokens,
        usage.cache_write_tokens,
    )


def served(standin: StandIn) -> tuple[int, int, int, int]:
    """What the stand-in served in the calls OpenCode counts (not the title call)."""
    calls = [s.usage for s in standin.served if s.counted]
    return (
        sum(u["input_tokens"] for u in calls),
        sum(u["output_tokens"] for u in calls),
        sum(u["cache_read_input_tokens"] for u in calls),
        sum(u["cache_creation_input_tokens"] for u in calls),
    )


async def asked_and_decided(
    live: Frontend,
    state: RunState,
    finished: RunFinished,
    opencode: OpenCodeServer,
    standin: StandIn,
) -> tuple[PermissionRequested, PermissionResolved, ToolComplete]:
    """What every case shares: one request for the stand-in's ``bash`` call, one decision,
    the tool's end, the answer after it, and tokens and cost exactly OpenCode's."""
    assert (finished.status, finished.error) == ("ok", None)
    [tool] = live.of(state.run_id, ToolStart)
    assert (tool.name, tool.input["command"]) == ("bash", "echo hello")
    [asked] = live.of(state.run_id, PermissionRequested)
    assert (asked.tool, asked.tool_call_id, asked.input) == ("bash", tool.tool_call_id, tool.input)
    assert (asked.category, asked.title) == ("execute", "bash: echo hello")
    assert asked.annotations["permission"] == "bash"
    [resolved] = live.of(state.run_id, PermissionResolved)  # the broker's; OpenCode's echo not
    assert resolved.request_id == asked.request_id
    [done] = live.of(state.run_id, ToolComplete)
    assert done.tool_call_id == tool.tool_call_id
    # The model was asked again after the tool, whatever the decision, and answered.
    assert [s.kind for s in standin.served if s.counted] == ["tool", "answer"]
    assert [t.text for t in live.of(state.run_id, TextComplete)] == [SAID, ANSWER]
    assert opencode.url is not None
    theirs = await reported(opencode.url)
    # Exact, whichever place the title call took among the stand-in's calls (it is not counted).
    assert counts(finished.usage) == counts(theirs) == served(standin)
    assert finished.usage.cost_usd == pytest.approx(theirs.cost_usd, abs=1e-12)
    return asked, resolved, done


def told(standin: StandIn) -> str:
    """What the model was told of the tool: the last request's last message."""
    return json.dumps(standin.requests[-1]["messages"][-1])


async def test_a_frontend_allows_the_shell_and_it_runs(
    opencode: OpenCodeServer, standin: StandIn
) -> None:
    live = Frontend(opencode, allow=True)
    async with trio.open_nursery() as nursery:
        await nursery.start(live.serve)
        state, finished = await live.run()
        nursery.cancel_scope.cancel()
    _, resolved, done = await asked_and_decided(live, state, finished, opencode, standin)
    assert (resolved.outcome, resolved.by) == ("allowed", "frontend")
    assert (done.status, done.output) == ("ok", "hello\n")
    assert "hello\\n" in told(standin)  # the shell's own output, as the model got it


async def test_a_frontend_denies_the_shell_and_the_model_is_told_why(
    opencode: OpenCodeServer, standin: StandIn
) -> None:
    live = Frontend(opencode, allow=False)
    async with trio.open_nursery() as nursery:
        await nursery.start(live.serve)
        state, finished = await live.run()
        nursery.cancel_scope.cancel()
    _, resolved, done = await asked_and_decided(live, state, finished, opencode, standin)
    assert (resolved.outcome, resolved.by, resolved.reason) == ("denied", "frontend", NOT_NOW)
    assert (done.status, done.output) == ("error", None)
    assert NOT_NOW in (done.error or "")
    assert NOT_NOW in told(standin)
    assert "hello\\n" not in told(standin)  # the shell did not run


async def test_the_runs_own_rule_denies_the_shell_before_a_frontend_that_allows(
    opencode: OpenCodeServer, standin: StandIn
) -> None:
    """``busd run --deny bash``: a rule on OpenCode's tool name, as its users write it."""
    live = Frontend(opencode, allow=True)
    rule = PermissionRule(action="deny", tool="bash", reason="--deny bash")
    async with trio.open_nursery() as nursery:
        await nursery.start(live.serve)
        state, finished = await live.run(rules=[rule])
        nursery.cancel_scope.cancel()
    _, resolved, done = await asked_and_decided(live, state, finished, opencode, standin)
    assert (resolved.outcome, resolved.by, resolved.reason) == ("denied", "test", "--deny bash")
    assert len(live.refused) == 1  # the frontend's allow came too late, and was refused
    assert "already denied" in live.refused[0]
    assert done.status == "error"
    assert "--deny bash" in told(standin)


async def test_nobody_answering_is_a_denial_at_the_daemons_timeout(
    opencode: OpenCodeServer, standin: StandIn
) -> None:
    live = Frontend(opencode, allow=None, permission_timeout=1.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(live.serve)
        state, finished = await live.run()
        nursery.cancel_scope.cancel()
    _, resolved, done = await asked_and_decided(live, state, finished, opencode, standin)
    reason = "nobody answered within 1.0s"
    assert (resolved.outcome, resolved.by, resolved.reason) == ("denied", "timeout", reason)
    assert done.status == "error"
    assert reason in told(standin)
