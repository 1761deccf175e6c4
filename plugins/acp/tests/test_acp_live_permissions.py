"""``opencode acp`` asks before its shell runs: a frontend answers, or the run's own rule.

The agent is the npm package pinned in contrib/agents, isolated in the
test's own home, its model the scripted stand-in of the OpenCode tests
(``plugins/opencode/tests/opencode_standin.py``: thinking, a ``bash`` call of
``echo hello``, an answer), its project configuration ``"permission":
{"bash": "ask"}``: OpenCode then asks the ACP client
(``session/request_permission``) before it runs the command (issue 17).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TypeVar

import pytest
import trio

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
from busd.plugins.manager import PluginManager
from tests.daemon_helpers import load_module

HERE = Path(__file__).resolve().parent
standin_module = load_module(
    HERE.parents[1] / "opencode" / "tests" / "opencode_standin.py", "acp_perm_opencode_standin"
)
OPENCODE: Path = standin_module.OPENCODE
PROMPT = "Run echo hello in the shell and tell me what it printed."
E = TypeVar("E", bound=Event)

pytestmark = pytest.mark.skipif(
    not OPENCODE.exists(),
    reason=f"no opencode at {OPENCODE} (install it: cd contrib/agents && npm install)",
)


class Frontend:
    """A daemon with the installed plugins; its frontend answers every request it sees."""

    def __init__(self, *, allow: bool) -> None:
        plugins = PluginManager(environ={})
        plugins.load_entry_points()
        self.daemon = Daemon(DaemonConfig(), plugins=plugins)
        self.allow = allow
        self.seen: list[Envelope[Event]] = []
        self.refused: list[str] = []
        self.finished = trio.Event()
        self._send, self._requests = trio.open_memory_channel[PermissionRequested](16)
        self.daemon.bus.on_all(self._record)

    def _record(self, envelope: Envelope[Event]) -> None:
        self.seen.append(envelope)
        match envelope.event:
            case PermissionRequested() as request:
                self._send.send_nowait(request)
            case RunFinished():
                self.finished.set()

    async def answer(self) -> None:
        async for request in self._requests:
            reason = None if self.allow else "not now"
            try:
                self.daemon.broker.reply(
                    request.request_id, by="frontend", allow=self.allow, reason=reason
                )
            except PermissionRejected as exc:  # a rule decided first: a frontend is told so
                self.refused.append(str(exc))

    def of(self, cls: type[E]) -> list[E]:
        return [e.event for e in self.seen if e.run_id is not None and isinstance(e.event, cls)]


@pytest.mark.parametrize(
    ("allow", "rules", "outcome", "by"),
    [
        (True, (), "allowed", "frontend"),
        (False, (), "denied", "frontend"),
        (
            True,
            (PermissionRule(action="deny", tool="bash", reason="--deny bash"),),
            "denied",
            "test",
        ),
    ],
    ids=["allowed-by-a-frontend", "denied-by-a-frontend", "denied-by-the-runs-own-rule"],
)
async def test_opencode_acp_asks_before_its_shell_and_runs_it_only_when_allowed(
    tmp_path: Path,
    allow: bool,
    rules: tuple[PermissionRule, ...],
    outcome: str,
    by: str,
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    frontend = Frontend(allow=allow)
    with standin_module.StandIn() as standin:
        config = standin_module.opencode_config(standin.url, bash="ask")
        (project / "opencode.json").write_text(json.dumps(config))
        env = standin_module.opencode_env(tmp_path / "home")
        async with trio.open_nursery() as nursery:
            await nursery.start(frontend.daemon.run)
            nursery.start_soon(frontend.answer)
            frontend.daemon.runs.start(
                adapter="acp",
                prompt=PROMPT,
                started_by="test",
                cwd=str(project),
                permission_rules=rules,
                options={"command": [str(OPENCODE), "acp"], "env": env},
            )
            with trio.fail_after(120):
                await frontend.finished.wait()
            nursery.cancel_scope.cancel()
    [finished] = frontend.of(RunFinished)
    assert finished.status == "ok", finished.error
    # Asked once, for the shell, by its name and ACP kind, before it ran.
    [tool] = frontend.of(ToolStart)
    [asked] = frontend.of(PermissionRequested)
    assert (asked.tool, asked.category, asked.tool_call_id) == (
        "bash",
        "execute",
        tool.tool_call_id,
    )
    assert asked.input == {"command": "echo hello"}  # what it asks to run
    assert {o.kind for o in asked.options} >= {"allow_once", "reject_once"}
    [resolved] = frontend.of(PermissionResolved)
    assert (resolved.request_id, resolved.outcome, resolved.by) == (asked.request_id, outcome, by)
    if rules:
        assert resolved.reason == "--deny bash"
        assert len(frontend.refused) == 1  # the frontend's allow came too late, and was refused
    [done] = frontend.of(ToolComplete)
    assert done.tool_call_id == tool.tool_call_id
    counted = [served.kind for served in standin.served if served.counted]
    if outcome == "allowed":
        assert (done.status, done.output) == ("ok", "hello\n")
        assert counted == ["tool", "answer"]
        assert standin_module.ANSWER in [t.text for t in frontend.of(TextComplete)]
    else:
        # Refused, the command never ran, and OpenCode ends the turn without asking
        # the model again (it says so in the tool's error).
        assert (done.status, done.output) == ("error", None)
        assert "rejected permission" in (done.error or "")
        assert counted == ["tool"]
        assert standin_module.ANSWER not in [t.text for t in frontend.of(TextComplete)]
