"""The real Claude Code CLI asks busd before it writes a file (issue 17).

busd's claude-code driver runs the CLI bundled in the claude-agent-sdk wheel
in its ``default`` permission mode against ``messages_stand_in.py``, whose
model calls ``Write`` once. The CLI asks through the SDK's ``can_use_tool``;
busd's broker decides: a rule on the tool's name, a rule on its category,
or a frontend. The file is written only when allowed, and the model is told
the outcome; the run's tokens and cost are what the stand-in served, priced
as busd's table prices the model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

import claude_agent_sdk
import pytest
import trio

from busd import TokenUsage, cost_usd
from busd.core.events import (
    Envelope,
    Event,
    PermissionRequested,
    PermissionResolved,
    RunFinished,
    ToolComplete,
    ToolStart,
)
from busd.core.permissions import PermissionRule
from busd.daemon.hub import Daemon, DaemonConfig
from busd.plugins.manager import PluginManager
from tests.daemon_helpers import load_module

CLI = Path(claude_agent_sdk.__file__).parent / "_bundled" / "claude"
HERE = Path(__file__).resolve().parent
MODEL = "claude-sonnet-4-5-20250929"

pytestmark = pytest.mark.skipif(not CLI.exists(), reason=f"no bundled Claude Code CLI at {CLI}")
E = TypeVar("E", bound=Event)


def _load(name: str) -> Any:
    return load_module(HERE / f"{name}.py", f"cc_perm_{name}")


standin_module = _load("messages_stand_in")


class Frontend:
    """A daemon with the installed plugins; its frontend answers what no rule decided."""

    def __init__(self, rules: tuple[PermissionRule, ...], *, allow: bool) -> None:
        plugins = PluginManager(environ={})
        plugins.load_entry_points()
        self.daemon = Daemon(DaemonConfig(permission_rules=rules), plugins=plugins)
        self.allow = allow
        self.seen: list[Envelope[Event]] = []
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
            if not self.daemon.broker.is_resolved(request.request_id):
                reason = None if self.allow else "not this file"
                self.daemon.broker.reply(
                    request.request_id, by="frontend", allow=self.allow, reason=reason
                )

    def of(self, cls: type[E]) -> list[E]:
        return [e.event for e in self.seen if e.run_id is not None and isinstance(e.event, cls)]


@pytest.mark.parametrize(
    ("rules", "allow", "outcome", "by"),
    [
        ((PermissionRule(action="allow", tool="Write"),), False, "allowed", "rule:0"),
        ((PermissionRule(action="deny", category="edit"),), True, "denied", "rule:0"),
        ((), False, "denied", "frontend"),
    ],
    ids=["allowed-by-its-name", "denied-by-its-category", "denied-by-a-frontend"],
)
async def test_the_real_cli_writes_a_file_only_when_busd_allows_it(
    tmp_path: Path, rules: tuple[PermissionRule, ...], allow: bool, outcome: str, by: str
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    target = project / "hello.txt"
    write = {"file_path": str(target), "content": "hello\n"}
    frontend = Frontend(rules, allow=allow)
    with standin_module.StandIn(tool=("Write", write)) as standin:
        env = {
            "ANTHROPIC_BASE_URL": standin.url,
            "ANTHROPIC_API_KEY": "sk-ant-stand-in",
            "HOME": str(tmp_path),
            "TMPDIR": str(tmp_path),
        }
        async with trio.open_nursery() as nursery:
            await nursery.start(frontend.daemon.run)
            nursery.start_soon(frontend.answer)
            frontend.daemon.runs.start(
                adapter="claude-code",
                prompt="Write hello into hello.txt.",
                started_by="test",
                model=MODEL,
                cwd=str(project),
                permission_mode="default",
                options={"env": env},
            )
            with trio.fail_after(150):
                await frontend.finished.wait()
            nursery.cancel_scope.cancel()
    [finished] = frontend.of(RunFinished)
    assert finished.status == "ok", finished.error
    [tool] = frontend.of(ToolStart)
    assert (tool.name, tool.input) == ("Write", write)
    [asked] = frontend.of(PermissionRequested)
    assert (asked.tool, asked.category, asked.input, asked.tool_call_id) == (
        "Write",
        "edit",
        write,
        tool.tool_call_id,
    )
    [resolved] = frontend.of(PermissionResolved)
    assert (resolved.request_id, resolved.outcome, resolved.by) == (
        asked.request_id,
        outcome,
        by,
    )
    allowed = outcome == "allowed"
    [done] = frontend.of(ToolComplete)
    assert (done.tool_call_id, done.status) == (tool.tool_call_id, "ok" if allowed else "error")
    assert target.exists() is allowed
    if allowed:
        assert target.read_text() == "hello\n"
    # The model was told: the file written, or the refusal (with the frontend's reason).
    kinds = standin.kinds()
    told = json.dumps(standin.requests[kinds.index("answer")]["messages"][-1])
    assert ('"is_error": true' in told) is not allowed
    if by == "frontend":
        assert "not this file" in told
    # Every call the CLI made was counted, each as served, and priced as busd prices it.
    served = TokenUsage(
        input_tokens=sum(s.usage["input_tokens"] for s in standin.served),
        output_tokens=sum(s.usage["output_tokens"] for s in standin.served),
        cache_read_tokens=sum(s.usage["cache_read_input_tokens"] for s in standin.served),
        cache_write_tokens=sum(s.usage["cache_creation_input_tokens"] for s in standin.served),
    )
    assert sorted(set(kinds)) == ["answer", "side", "tool"]
    assert {s.model for s in standin.served} == {MODEL}  # side calls too: one price
    tokens = finished.usage
    assert (
        tokens.input_tokens,
        tokens.output_tokens,
        tokens.cache_read_tokens,
        tokens.cache_write_tokens,
    ) == (
        served.input_tokens,
        served.output_tokens,
        served.cache_read_tokens,
        served.cache_write_tokens,
    )
    priced = cost_usd(MODEL, served)
    assert priced is not None
    assert tokens.cost_usd == pytest.approx(priced, rel=1e-6)
