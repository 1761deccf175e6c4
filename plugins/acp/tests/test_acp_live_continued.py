"""A continued ``opencode acp`` session, live (issue 17).

Run 2 names run 1's session: busd's acp driver starts a new ``opencode acp``
and continues the session with ``session/load`` (OpenCode keeps its sessions
in its data directory, the same home for both runs). The model is the
scripted stand-in of the OpenCode tests (``opencode_standin.py``: a title
call, a ``bash`` call, an answer, every call's usage distinct).

What ``opencode acp`` 1.18.33 reports: its prompt response's ``usage`` is
its last message's tokens; ``usage_update``'s cost is the session's, which
after a load holds the earlier runs too. The translator says so
(``cost_spans_runs``) and the daemon takes that cost as the session's: run 2's
share is the session's cost less run 1's, every call OpenCode priced.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from busd import TokenUsage, add_usage, cost_usd
from busd.core.events import (
    Envelope,
    Event,
    RunFinished,
    RunStarted,
    SessionWarning,
    TextComplete,
    ToolStart,
)
from busd.daemon.hub import Daemon, DaemonConfig
from busd.plugins.manager import PluginManager
from tests.daemon_helpers import load_module

ROOT = Path(__file__).resolve().parents[3]
standin_module = load_module(
    ROOT / "plugins/opencode/tests/opencode_standin.py", "acp_continued_opencode_standin"
)
OPENCODE: Path = standin_module.OPENCODE

pytestmark = pytest.mark.skipif(
    not OPENCODE.exists(),
    reason=f"no opencode at {OPENCODE} (install it: cd contrib/agents && npm install)",
)


def _tokens(served: Any) -> TokenUsage:
    u = served.usage
    return TokenUsage(
        input_tokens=u["input_tokens"],
        output_tokens=u["output_tokens"],
        cache_read_tokens=u["cache_read_input_tokens"],
        cache_write_tokens=u["cache_creation_input_tokens"],
    )


def _counts(tokens: TokenUsage) -> tuple[int, int, int, int]:
    return (
        tokens.input_tokens,
        tokens.output_tokens,
        tokens.cache_read_tokens,
        tokens.cache_write_tokens,
    )


def _price(served: list[Any]) -> float:
    """busd's price of the calls OpenCode counts (not its title call)."""
    prices = [cost_usd(standin_module.MODEL, _tokens(s)) for s in served if s.counted]
    assert None not in prices
    return sum(p or 0.0 for p in prices)


class Daemonized:
    """A daemon with the installed plugins, recording what its bus carries."""

    def __init__(self) -> None:
        plugins = PluginManager(environ={})
        plugins.load_entry_points()
        self.daemon = Daemon(DaemonConfig(), plugins=plugins)
        self.seen: list[Envelope[Event]] = []
        self.progress = trio.Event()
        self.daemon.bus.on_all(self._record)

    def _record(self, envelope: Envelope[Event]) -> None:
        self.seen.append(envelope)
        self.progress.set()

    def finished(self, run_id: str) -> list[RunFinished]:
        return [
            e.event for e in self.seen if e.run_id == run_id and isinstance(e.event, RunFinished)
        ]

    async def run(self, prompt: str, cwd: Path, env: dict[str, str], **fields: Any) -> Any:
        state = self.daemon.runs.start(
            adapter="acp",
            prompt=prompt,
            started_by="test",
            cwd=str(cwd),
            options={"command": [str(OPENCODE), "acp"], "env": env},
            **fields,
        )
        with trio.fail_after(60):
            while not self.finished(state.run_id):
                await self.progress.wait()
                self.progress = trio.Event()
        return state


async def test_a_continued_opencode_acp_session_remembers_and_adds_up_its_runs(
    tmp_path: Path,
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    d = Daemonized()
    with standin_module.StandIn() as standin:
        (project / "opencode.json").write_text(
            json.dumps(standin_module.opencode_config(standin.url))
        )
        env = standin_module.opencode_env(tmp_path / "home")
        async with trio.open_nursery() as nursery:
            await nursery.start(d.daemon.run)
            first_run = await d.run("Remember the word okra.", project, env)
            [started] = [
                e for e in d.seen if e.run_id == first_run.run_id and type(e.event) is RunStarted
            ]
            session_id = started.session_id
            assert session_id is not None
            served_first = len(standin.served)
            second_run = await d.run("Which word?", project, env, session_id=session_id)
            nursery.cancel_scope.cancel()
    [first] = d.finished(first_run.run_id)
    [second] = d.finished(second_run.run_id)
    assert (first.status, second.status) == ("ok", "ok"), (first.error, second.error)
    # Run 2 went on in run 1's session, in a new agent process.
    sessions = {e.session_id for e in d.seen if e.run_id == second_run.run_id}
    assert sessions == {session_id}
    later = json.dumps([r["messages"] for r in standin.requests[served_first:]])
    assert "Remember the word okra." in later
    assert standin_module.ANSWER in later
    texts = [
        e.event.text
        for e in d.seen
        if e.run_id == second_run.run_id and isinstance(e.event, TextComplete)
    ]
    assert standin_module.ANSWER in texts
    # The history the agent replays while loading is not published again: run 2's
    # only tool is its own bash call.
    tools = [
        e.event.tool_call_id
        for e in d.seen
        if e.run_id == second_run.run_id and isinstance(e.event, ToolStart)
    ]
    assert tools == [f"toolu_standin_{len(standin.requests[-2]['messages'])}"]
    # Each run counts its own calls: opencode acp's prompt response is its last
    # message's tokens (the answer), never run 1's again.
    assert [s.kind for s in standin.served[served_first:] if s.counted][-1] == "answer"
    assert _counts(first.usage) == _counts(_tokens(standin.served[served_first - 1]))
    assert _counts(second.usage) == _counts(_tokens(standin.served[-1]))
    # Cost: run 1's is OpenCode's session cost, every call it counted. After the
    # load, OpenCode's cost is the session's, run 1's included: the daemon takes it
    # as the session's, so run 2's share is the calls OpenCode priced since.
    assert first.usage.cost_usd == pytest.approx(_price(standin.served[:served_first]), rel=1e-9)
    assert second.usage.cost_usd == pytest.approx(_price(standin.served[served_first:]), rel=1e-9)
    warnings = [e for e in d.seen if isinstance(e.event, SessionWarning)]
    assert warnings == []
    # The session's tokens are the sum of its runs; its cost holds run 1's once.
    snapshot = d.daemon.sessions.snapshot(session_id)
    assert snapshot is not None
    assert snapshot.usage is not None
    assert _counts(snapshot.usage) == _counts(add_usage(first.usage, second.usage))
    assert snapshot.usage.cost_usd == pytest.approx(_price(standin.served), rel=1e-9)
