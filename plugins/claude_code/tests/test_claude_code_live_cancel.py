"""Cancelling the real Claude Code CLI mid-answer, as a user does it (issue 17).

``busd`` runs as a user runs it, a subprocess in an ``env -i``-like
environment of the test's own directories, and the CLI bundled in the
claude-agent-sdk wheel answers from ``messages_stand_in.py`` in slow mode: a
side call, then an answer that streams five words and stalls with its
request open. Once every word is out, the run is cancelled two ways:

- Ctrl-C on ``busd run`` with its in-process daemon (SIGINT);
- ``busd cancel RUN_ID`` through a running ``busd serve``, followed by
  ``busd run --pretty`` and by a subscriber of the test.

Either way ``busd run`` exits 130, the CLI's processes are gone while
``busd`` itself lives on, the partial text is ``stopped``, the last turn
``cancelled``, and no error is published or shown.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import claude_agent_sdk
import pytest

from tests.daemon_helpers import load_module

CLI = Path(claude_agent_sdk.__file__).parent / "_bundled" / "claude"
HERE = Path(__file__).resolve().parent
MODEL = "claude-sonnet-4-5-20250929"
PROMPT = "Count slowly to three."

pytestmark = pytest.mark.skipif(not CLI.exists(), reason=f"no bundled Claude Code CLI at {CLI}")


def _load(name: str) -> Any:
    return load_module(HERE / f"{name}.py", f"cc_live_{name}")


standin_module = _load("messages_stand_in")
live = _load("live_processes")
PARTIAL = "".join(standin_module.SLOW_WORDS)
LAST = standin_module.SLOW_WORDS[-1]


@pytest.fixture
def standin() -> Iterator[Any]:
    with standin_module.StandIn(slow=True) as served:
        yield served


def _run_args(tmp_path: Path, *options: str) -> list[Any]:
    return ["--adapter", "claude-code", "--model", MODEL, "--cwd", tmp_path, *options, PROMPT]


async def test_ctrl_c_on_busd_run_stops_the_real_cli_mid_answer(
    tmp_path: Path, standin: Any
) -> None:
    env = live.busd_env(tmp_path, ANTHROPIC_BASE_URL=standin.url, ANTHROPIC_API_KEY="sk-ant-x")
    midway = await live.ctrl_c_midway(
        tmp_path, standin, _run_args(tmp_path), env=env, agent="claude", last=LAST
    )
    assert midway.code == live.RUN_EXIT_CANCELLED, midway.run.stderr
    assert [pid for pid in midway.processes if not live.gone(pid)] == [], midway.processes
    live.cancelled_midway(midway.envelopes, midway.run_id, PARTIAL)
    [cancelled] = [
        e["event"] for e in midway.envelopes if e["event"]["type"] == "busd.run.cancelled"
    ]
    assert cancelled["by"].startswith("busd-run[")
    assert "SIGINT: cancelling the run" in midway.run.stderr
    assert "Traceback" not in midway.run.stderr
    assert standin.kinds() == ["side", "answer"]  # nothing was asked after the cancel


async def test_busd_cancel_through_a_running_daemon_stops_the_real_cli_mid_answer(
    tmp_path: Path, standin: Any
) -> None:
    env = live.busd_env(tmp_path)  # the daemon has no key: the run's options carry it
    key = {"ANTHROPIC_BASE_URL": standin.url, "ANTHROPIC_API_KEY": "sk-ant-x"}
    args = _run_args(tmp_path, "--option", f"env={json.dumps(key)}")
    midway = await live.busd_cancel_midway(
        tmp_path, standin, args, env=env, agent="claude", last=LAST
    )
    assert midway.code == live.RUN_EXIT_CANCELLED, midway.run.stderr
    assert midway.daemon_alive, midway.processes  # the CLI is gone, the daemon carries on
    live.cancelled_midway(midway.envelopes, midway.run_id, PARTIAL)
    [cancelled] = [
        e["event"] for e in midway.envelopes if e["event"]["type"] == "busd.run.cancelled"
    ]
    assert (cancelled["by"].split("[")[0], cancelled["reason"]) == ("busd-cancel", "enough")
    shown = "\n".join(midway.run.lines)
    assert PARTIAL in shown
    assert "cancelled by busd-cancel" in shown
    assert "error" not in shown.lower()  # neither ✗ error nor a summary's error line
    assert midway.serve is not None
    assert "Traceback" not in midway.serve.stderr + midway.run.stderr
    assert standin.kinds() == ["side", "answer"]
