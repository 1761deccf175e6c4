"""Cancelling the real ``opencode serve`` mid-answer, as a user does it (issue 17).

``busd`` runs as a user runs it, a subprocess in an ``env -i``-like
environment of the test's own directories, with nothing listening at
``OPENCODE_BASE_URL``: busd starts ``opencode serve`` itself (the npm
package pinned in contrib/agents, on ``PATH``) in the project, whose
``opencode.json`` points the ``anthropic`` provider at the slow stand-in
(``plugins/claude_code/tests/messages_stand_in.py``): a title, then an answer
that streams five words and stalls with its request open. Once every word
is out, the run is cancelled with Ctrl-C on ``busd run`` (its in-process
daemon; the SIGINT to its whole process group, as a terminal sends it), or
with ``busd cancel RUN_ID`` through a running ``busd serve``. Either way
``busd run`` exits 130, the driver has OpenCode abort the session (its
idle says ``aborted``), the server it started is gone, the partial text is
``stopped``, the last turn ``cancelled``, and no error is published or shown.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opencode_standin import MODEL, OPENCODE, opencode_config, opencode_env

from tests.daemon_helpers import load_module

HELPERS = Path(__file__).resolve().parents[2] / "claude_code" / "tests"
PROMPT = "Count slowly to three."
NOWHERE = "http://127.0.0.1:9"  # the discard port: nothing answers there

pytestmark = pytest.mark.skipif(
    not OPENCODE.exists(),
    reason=f"no opencode at {OPENCODE} (install it: cd contrib/agents && npm ci)",
)


def _load(name: str) -> Any:
    return load_module(HELPERS / f"{name}.py", f"opencode_live_{name}")


standin_module = _load("messages_stand_in")
live = _load("live_processes")
PARTIAL = "".join(standin_module.SLOW_WORDS)
LAST = standin_module.SLOW_WORDS[-1]


@pytest.fixture
def standin() -> Iterator[Any]:
    with standin_module.StandIn(slow=True) as served:
        yield served


def _setup(root: Path, model_url: str) -> tuple[dict[str, str], list[Any]]:
    """The environment of ``busd`` (OpenCode on ``PATH``, no server) and ``busd run``'s args."""
    project = root / "project"
    project.mkdir()
    (project / "opencode.json").write_text(json.dumps(opencode_config(model_url)))
    env = {**opencode_env(root / "home"), **live.busd_env(root)}
    env["PATH"] = f"{OPENCODE.parent}:{env['PATH']}"
    env["OPENCODE_BASE_URL"] = NOWHERE
    args = ["--adapter", "opencode", "--model", f"anthropic/{MODEL}", "--cwd", project, PROMPT]
    return env, args


def _cancelled_by(midway: Any) -> dict[str, Any]:
    [cancelled] = [
        e["event"] for e in midway.envelopes if e["event"]["type"] == "busd.run.cancelled"
    ]
    return dict(cancelled)


def _server_pids(midway: Any) -> list[int]:
    """The ``opencode serve`` busd started (and what it started), as seen mid-answer."""
    pids = [pid for pid, command in midway.processes.items() if "opencode" in command]
    assert any(" serve " in midway.processes[pid] for pid in pids), midway.processes
    return pids


async def test_ctrl_c_on_busd_run_aborts_opencode_mid_answer(tmp_path: Path, standin: Any) -> None:
    """The SIGINT goes to the whole job; ``opencode serve`` leads a group of its own, so
    only busd hears it, aborts the session in order and then stops the server."""
    env, args = _setup(tmp_path, standin.url)
    midway = await live.ctrl_c_midway(
        tmp_path, standin, args, env=env, agent="opencode", last=LAST, job=True
    )
    assert midway.code == live.RUN_EXIT_CANCELLED, midway.run.stderr
    pids = _server_pids(midway)
    assert [pid for pid in pids if not live.gone(pid)] == [], midway.processes
    live.cancelled_midway(midway.envelopes, midway.run_id, PARTIAL)
    assert _cancelled_by(midway)["by"].startswith("busd-run[")
    assert "SIGINT: cancelling the run" in midway.run.stderr
    assert "Traceback" not in midway.run.stderr, midway.run.stderr
    assert "busd.opencode" not in midway.run.stderr, midway.run.stderr  # no warning: aborted
    assert sorted(standin.kinds()) == ["answer", "side"]  # the title, the answer: no more


async def test_busd_cancel_through_a_running_daemon_aborts_opencode_mid_answer(
    tmp_path: Path, standin: Any
) -> None:
    env, args = _setup(tmp_path, standin.url)
    midway = await live.busd_cancel_midway(
        tmp_path, standin, args, env=env, agent="opencode", last=LAST
    )
    assert midway.code == live.RUN_EXIT_CANCELLED, midway.run.stderr
    assert midway.daemon_alive, midway.processes  # OpenCode is gone, the daemon carries on
    _server_pids(midway)
    live.cancelled_midway(midway.envelopes, midway.run_id, PARTIAL)
    cancelled = _cancelled_by(midway)
    assert (cancelled["by"].split("[")[0], cancelled["reason"]) == ("busd-cancel", "enough")
    shown = "\n".join(midway.run.lines)
    assert PARTIAL in shown
    assert "cancelled by busd-cancel" in shown
    assert "error" not in shown.lower()
    assert midway.serve is not None
    assert "Traceback" not in midway.serve.stderr + midway.run.stderr
    assert "busd.opencode" not in midway.serve.stderr, midway.serve.stderr
    assert sorted(standin.kinds()) == ["answer", "side"]
