"""busd's acp driver runs a prompt on a real ACP agent: ``opencode acp`` (issue 17).

The agent is the npm package pinned in contrib/agents, isolated in the
test's own home, its model the scripted Anthropic stand-in the OpenCode
tests use (``plugins/opencode/tests/opencode_standin.py``: thinking, a
``bash`` call, an answer). Nothing is faked between the daemon and the
agent: the driver starts it through the ACP SDK and speaks ACP over its
stdio; the adapter translates what the agent says.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from busd import TokenUsage, cost_usd
from busd.core.events import (
    Envelope,
    Event,
    RunFinished,
    TextComplete,
    ToolComplete,
    ToolStart,
)
from busd.daemon.hub import Daemon, DaemonConfig
from busd.plugins.manager import PluginManager

_STANDIN = Path(__file__).resolve().parents[2] / "opencode" / "tests" / "opencode_standin.py"


def _standin_module() -> Any:
    spec = importlib.util.spec_from_file_location("acp_opencode_standin", _STANDIN)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look themselves up there
    spec.loader.exec_module(module)
    return module


standin_module = _standin_module()
OPENCODE: Path = standin_module.OPENCODE

pytestmark = pytest.mark.skipif(
    not OPENCODE.exists(),
    reason=f"no opencode at {OPENCODE} (install it: cd contrib/agents && npm install)",
)


@pytest.fixture
def standin() -> Iterator[Any]:
    with standin_module.StandIn() as served:
        yield served


async def test_a_prompt_on_opencode_acp_streams_its_answer_and_its_tool(
    tmp_path: Path, standin: Any
) -> None:
    home = tmp_path / "home"
    project = tmp_path / "project"
    project.mkdir()
    config = standin_module.opencode_config(standin.url)
    (project / "opencode.json").write_text(json.dumps(config))
    env = standin_module.opencode_env(home)
    plugins = PluginManager(environ={})
    plugins.load_entry_points()
    daemon = Daemon(DaemonConfig(), plugins=plugins)
    seen: list[Envelope[Event]] = []
    done = trio.Event()

    def record(envelope: Envelope[Event]) -> None:
        seen.append(envelope)
        if isinstance(envelope.event, RunFinished):
            done.set()

    daemon.bus.on_all(record)
    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.run)
        state = daemon.runs.start(
            adapter="acp",
            prompt="Run echo hello in the shell and tell me what it printed.",
            started_by="test",
            cwd=str(project),
            options={"command": [str(OPENCODE), "acp"], "env": env},
        )
        with trio.fail_after(90):
            await done.wait()
        nursery.cancel_scope.cancel()

    def of(cls: type[Any]) -> list[Any]:
        return [e.event for e in seen if e.run_id == state.run_id and isinstance(e.event, cls)]

    [finished] = of(RunFinished)
    assert finished.status == "ok", finished.error
    [tool] = of(ToolStart)
    [result] = of(ToolComplete)
    assert (result.tool_call_id, result.status) == (tool.tool_call_id, "ok")
    assert "hello" in (result.output or "")
    texts = "".join(t.text for t in of(TextComplete))
    assert standin_module.ANSWER in texts
    calls = [s.usage for s in standin.served if s.counted]
    assert [s.kind for s in standin.served if s.counted] == ["tool", "answer"]
    # opencode acp's prompt response carries its last message's tokens only (the
    # capture's README says so), while its usage_update's cost covers every call:
    last = calls[-1]
    assert (
        finished.usage.input_tokens,
        finished.usage.output_tokens,
        finished.usage.cache_read_tokens,
        finished.usage.cache_write_tokens,
    ) == (
        last["input_tokens"],
        last["output_tokens"],
        last["cache_read_input_tokens"],
        last["cache_creation_input_tokens"],
    )
    priced = [
        cost_usd(
            standin_module.MODEL,
            TokenUsage(
                input_tokens=u["input_tokens"],
                output_tokens=u["output_tokens"],
                cache_read_tokens=u["cache_read_input_tokens"],
                cache_write_tokens=u["cache_creation_input_tokens"],
            ),
        )
        for u in calls
    ]
    assert finished.usage.cost_usd == pytest.approx(sum(p or 0.0 for p in priced), rel=1e-9)
