"""A claude-agent-acp sub-agent, live: its tools under its ``Agent`` call (issue 16).

The real ``claude-agent-acp`` (contrib/agents) against
``plugins/claude_code/tests/fixtures/record_stand_in_tasks.py``, the stand-in
the recording ``acp-claude-agent-acp-two-models.jsonl`` was made with: the
main model starts an ``Agent`` on haiku, whose first call runs ``Bash``
(``echo 42``), then answers; the main model answers. Claude Code runs the
agent in the background; claude-agent-acp holds the prompt's response until
it settles. busd publishes the ``Bash`` under the sub-agent the ``Agent``
call started, and ends the sub-agent with the turn.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import trio

from busd.core.events import (
    AgentComplete,
    AgentStart,
    Envelope,
    Event,
    PermissionRequested,
    RunFinished,
    TextComplete,
    ToolComplete,
    ToolStart,
)
from busd.daemon.hub import Daemon, DaemonConfig
from busd.plugins.manager import PluginManager
from tests.daemon_helpers import load_module

ROOT = Path(__file__).resolve().parents[3]
AGENT = ROOT / "contrib/agents/node_modules/.bin/claude-agent-acp"
NODE = shutil.which("node") or "node"
MODEL = "claude-sonnet-4-5-20250929"
CALL = "toolu_agent_1"  # the stand-in's Agent call

pytestmark = pytest.mark.skipif(
    not AGENT.exists(),
    reason=f"no claude-agent-acp at {AGENT} (install it: cd contrib/agents && npm install)",
)


@pytest.fixture
def model_url() -> Iterator[str]:
    tasks = load_module(
        ROOT / "plugins/claude_code/tests/fixtures/record_stand_in_tasks.py", "acp_stand_in_tasks"
    )
    server = ThreadingHTTPServer(("127.0.0.1", 0), tasks.Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


async def test_claude_agent_acp_runs_a_sub_agents_tool_under_its_agent_call(
    tmp_path: Path, model_url: str
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    home = tmp_path / "home"
    home.mkdir()
    env = {
        "HOME": str(home),
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "TMPDIR": str(tmp_path),
        "ANTHROPIC_BASE_URL": model_url,
        "ANTHROPIC_API_KEY": "sk-ant-stand-in",
        "ANTHROPIC_MODEL": MODEL,
    }
    plugins = PluginManager(environ={})
    plugins.load_entry_points()
    daemon = Daemon(DaemonConfig(), plugins=plugins)
    seen: list[Envelope[Event]] = []
    finished = trio.Event()

    def record(envelope: Envelope[Event]) -> None:
        seen.append(envelope)
        match envelope.event:
            case PermissionRequested() as asked:  # whatever it asks (the Bash): allowed
                daemon.broker.reply(asked.request_id, by="test", allow=True)
            case RunFinished():
                finished.set()

    daemon.bus.on_all(record)
    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.run)
        daemon.runs.start(
            adapter="acp",
            prompt="Have a sub-agent on haiku compute six times seven with the shell.",
            started_by="test",
            cwd=str(project),
            options={"command": [NODE, str(AGENT)], "env": env},
        )
        with trio.fail_after(60):
            await finished.wait()
        nursery.cancel_scope.cancel()

    def of(cls: type[Any]) -> list[Envelope[Any]]:
        return [e for e in seen if e.run_id is not None and isinstance(e.event, cls)]

    [done] = of(RunFinished)
    assert done.event.status == "ok", done.event.error
    [start] = of(AgentStart)
    assert (start.event.agent_id, start.event.name, start.event.tool_call_id) == (
        CALL,
        "general-purpose",
        CALL,
    )
    assert start.event.description == "Compute with the shell"
    # The Agent call is the main agent's; the Bash is the sub-agent's, and ran.
    tools = {e.event.name: e for e in of(ToolStart)}
    assert set(tools) == {"Agent", "Bash"}
    assert tools["Agent"].agent_id is None
    assert tools["Bash"].agent_id == CALL
    [bash_done] = [e for e in of(ToolComplete) if e.event.name == "Bash"]
    assert (bash_done.event.status, bash_done.agent_id) == ("ok", CALL)
    assert "42" in (bash_done.event.output or "")
    # The sub-agent ends once, after its Bash, and before the run does.
    [ended] = of(AgentComplete)
    assert (ended.event.agent_id, ended.event.status) == (CALL, "ok")
    assert seen.index(bash_done) < seen.index(ended) < seen.index(done)
    assert "The sub-agent ran echo: 42." in [e.event.text for e in of(TextComplete)]
