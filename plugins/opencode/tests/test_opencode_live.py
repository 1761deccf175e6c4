"""busd's opencode driver runs prompts on the real ``opencode serve`` (issue 17).

The server is the npm package pinned in contrib/agents, isolated in the
test's own home, its model the local stand-in (``opencode_standin.py``).
Nothing is faked between the daemon and OpenCode: the driver talks to the
server through the ``opencode-ai`` SDK, and the adapter translates the
server's own ``/event`` stream. Tokens and cost are checked against what
the stand-in served and what OpenCode itself reports for the session.
"""

from __future__ import annotations

import gc
import types
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from opencode_standin import ANSWER, MODEL, OPENCODE, SAID, THOUGHT, OpenCodeServer, StandIn

from busd import TokenUsage
from busd.core.events import (
    Envelope,
    Event,
    RunFinished,
    SessionStart,
    TextComplete,
    ThinkingComplete,
    ToolComplete,
    ToolStart,
)
from busd.daemon.hub import Daemon, DaemonConfig
from busd.plugins.manager import PluginManager

pytestmark = pytest.mark.skipif(
    not OPENCODE.exists(),
    reason=f"no opencode at {OPENCODE} (install it: cd contrib/agents && npm ci)",
)
PROMPT = "Run echo hello in the shell and tell me what it printed."


@pytest.fixture
def standin() -> Iterator[StandIn]:
    with StandIn() as served:
        yield served


@pytest.fixture
async def opencode(tmp_path: Path, standin: StandIn) -> AsyncIterator[OpenCodeServer]:
    server = OpenCodeServer(tmp_path / "oc", standin.url)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


class Runs:
    """A daemon with the installed plugins, recording what it publishes."""

    def __init__(self, server: OpenCodeServer) -> None:
        plugins = PluginManager(environ={})
        plugins.load_entry_points()
        self.daemon = Daemon(DaemonConfig(), plugins=plugins)
        self.server = server
        self.seen: list[Envelope[Event]] = []
        self._finished: dict[str, trio.Event] = {}
        self.daemon.bus.on_all(self._record)

    def _record(self, envelope: Envelope[Event]) -> None:
        self.seen.append(envelope)
        if isinstance(envelope.event, RunFinished) and envelope.run_id is not None:
            self._finished.setdefault(envelope.run_id, trio.Event()).set()

    async def run(self, prompt: str, session_id: str | None = None) -> tuple[str, RunFinished]:
        """Run ``prompt`` to its end: ``(run id, its summary)``."""
        state = self.daemon.runs.start(
            adapter="opencode",
            prompt=prompt,
            started_by="test",
            session_id=session_id,
            model=f"anthropic/{MODEL}",
            cwd=str(self.server.project),
            options={"base_url": self.server.url},
        )
        with trio.fail_after(60):
            await self._finished.setdefault(state.run_id, trio.Event()).wait()
        [finished] = self.of(state.run_id, RunFinished)
        return state.run_id, finished

    def of(self, run_id: str, cls: type[Any]) -> list[Any]:
        return [e.event for e in self.seen if e.run_id == run_id and isinstance(e.event, cls)]

    def session_of(self, run_id: str) -> str:
        """The busd session of ``run_id``."""
        (sid,) = {e.session_id for e in self.seen if e.run_id == run_id and e.session_id}
        return sid


async def reported(url: str) -> tuple[str, TokenUsage]:
    """The one OpenCode session and its totals, as ``GET /session`` reports them."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        (info,) = (await http.get("/session")).json()
    tokens = info["tokens"]
    return info["id"], TokenUsage(
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


def served(standin: StandIn, first: int = 0) -> tuple[int, int, int, int]:
    """What the stand-in served in its calls from ``first`` on that OpenCode counts."""
    calls = [s.usage for s in standin.served[first:] if s.counted]
    return (
        sum(u["input_tokens"] for u in calls),
        sum(u["output_tokens"] for u in calls),
        sum(u["cache_read_input_tokens"] for u in calls),
        sum(u["cache_creation_input_tokens"] for u in calls),
    )


def streams_left_reading() -> list[str]:
    """HTTP streams' async generators still suspended (the SDK's, over httpx's).

    A run must finish reading its ``/event`` stream, not walk away from it:
    each suspended link warns when it is collected, in whatever test runs then.
    """
    gc.collect()
    return [
        g.ag_code.co_qualname
        for g in gc.get_objects()
        if isinstance(g, types.AsyncGeneratorType)
        and g.ag_frame is not None
        and any(lib in g.ag_code.co_filename for lib in ("httpx", "httpcore", "opencode_ai"))
    ]


def same_cost(a: TokenUsage, b: TokenUsage) -> bool:
    return (
        a.cost_usd is not None and b.cost_usd is not None and abs(a.cost_usd - b.cost_usd) < 1e-12
    )


async def test_busd_drives_the_real_opencode_server(
    opencode: OpenCodeServer, standin: StandIn
) -> None:
    runs = Runs(opencode)
    async with trio.open_nursery() as nursery:
        await nursery.start(runs.daemon.run)
        run_id, finished = await runs.run(PROMPT)
        assert streams_left_reading() == []
        nursery.cancel_scope.cancel()
    assert (finished.status, finished.error) == ("ok", None)
    assert [t.text for t in runs.of(run_id, ThinkingComplete)] == [THOUGHT, THOUGHT]
    assert [t.text for t in runs.of(run_id, TextComplete)] == [SAID, ANSWER]
    (tool,) = runs.of(run_id, ToolStart)
    assert (tool.name, tool.input) == (
        "bash",
        {"command": "echo hello", "description": "Print hello"},
    )
    (done,) = runs.of(run_id, ToolComplete)
    assert (done.status, done.output) == ("ok", "hello\n")
    assert runs.of(run_id, SessionStart)[0].cwd == str(opencode.project)
    # Exact: the stand-in's two calls of the turn (not the title call), as OpenCode reports them.
    assert opencode.url is not None
    _, theirs = await reported(opencode.url)
    # (The title call may come first or between them: the usage is each call's own.)
    assert [s.kind for s in standin.served if s.counted] == ["tool", "answer"]
    assert counts(finished.usage) == served(standin) == counts(theirs)
    assert same_cost(finished.usage, theirs)


async def test_a_continued_session_adds_up_its_runs_as_opencode_does(
    opencode: OpenCodeServer, standin: StandIn
) -> None:
    """Run 2 resumes OpenCode's session: its usage is its own, the session's is OpenCode's."""
    runs = Runs(opencode)
    async with trio.open_nursery() as nursery:
        await nursery.start(runs.daemon.run)
        first_id, first = await runs.run(PROMPT)
        before = len(standin.served)
        session = runs.session_of(first_id)
        second_id, second = await runs.run("And again, please.", session_id=session)
        assert streams_left_reading() == []
        nursery.cancel_scope.cancel()
    assert (first.status, second.status) == ("ok", "ok")
    assert runs.session_of(second_id) == session
    assert counts(second.usage) == served(standin, before)
    assert opencode.url is not None
    _, theirs = await reported(opencode.url)  # one OpenCode session: the second run resumed it
    snapshot = runs.daemon.sessions.snapshot(session)
    assert snapshot is not None
    assert snapshot.usage is not None
    assert counts(snapshot.usage) == counts(theirs) == served(standin)
    assert same_cost(snapshot.usage, theirs)
