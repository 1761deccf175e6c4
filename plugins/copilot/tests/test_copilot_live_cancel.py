"""Cancelling the real Copilot CLI mid-answer, as a user does it (issue 17).

``busd`` runs as a user runs it, a subprocess in an ``env -i``-like
environment of the test's own directories; the CLI is the npm package
``@github/copilot`` pinned in contrib/agents (``COPILOT_CLI_PATH``), its
model the slow stand-in (``plugins/claude_code/tests/messages_stand_in.py``)
through the SDK's bring-your-own-key ``provider`` option: one answer that
streams five words and stalls with its request open. Once every word is out,
the run is cancelled with Ctrl-C on ``busd run`` (its in-process daemon; the
SIGINT to its whole process group, as a terminal sends it), or with ``busd
cancel RUN_ID`` through a running ``busd serve``. Either way
``busd run`` exits 130, the CLI (``node`` and the native binary it starts)
is gone, the partial text is ``stopped``, the last turn ``cancelled``, and
no error is published or shown.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_helpers import load_module

pytest.importorskip("copilot")

ROOT = Path(__file__).resolve().parents[3]
COPILOT = ROOT / "contrib/agents/node_modules/.bin/copilot"
HELPERS = ROOT / "plugins/claude_code/tests"
MODEL = "claude-sonnet-4-5"
PROMPT = "Count slowly to three."

pytestmark = pytest.mark.skipif(
    not COPILOT.exists(),
    reason=f"no Copilot CLI at {COPILOT} (install it: cd contrib/agents && npm install)",
)


def _load(name: str) -> Any:
    return load_module(HELPERS / f"{name}.py", f"copilot_live_{name}")


standin_module = _load("messages_stand_in")
live = _load("live_processes")
PARTIAL = "".join(standin_module.SLOW_WORDS)
LAST = standin_module.SLOW_WORDS[-1]


@pytest.fixture
def standin() -> Iterator[Any]:
    with standin_module.StandIn(slow=True) as served:
        yield served


def _run_args(tmp_path: Path, model_url: str) -> list[Any]:
    provider = {"type": "anthropic", "base_url": model_url, "api_key": "sk-x"}
    return [
        "--adapter",
        "copilot",
        "--model",
        MODEL,
        "--cwd",
        tmp_path,
        "--option",
        f"provider={json.dumps(provider)}",
        PROMPT,
    ]


def _cancelled_by(midway: Any) -> dict[str, Any]:
    [cancelled] = [
        e["event"] for e in midway.envelopes if e["event"]["type"] == "busd.run.cancelled"
    ]
    return dict(cancelled)


async def test_ctrl_c_on_busd_run_stops_the_real_copilot_cli_mid_answer(
    tmp_path: Path, standin: Any
) -> None:
    """The SIGINT goes to the whole job, as a terminal sends it.

    The CLI leads a process group of its own, so only busd hears it and
    aborts the turn in order (before, the CLI died on it: the idle was not
    ``aborted`` and the SDK logged tracebacks).
    """
    env = live.busd_env(tmp_path, COPILOT_CLI_PATH=str(COPILOT))
    midway = await live.ctrl_c_midway(
        tmp_path,
        standin,
        _run_args(tmp_path, standin.url),
        env=env,
        agent="copilot",
        last=LAST,
        job=True,
    )
    assert midway.code == live.RUN_EXIT_CANCELLED, midway.run.stderr
    assert [pid for pid in midway.processes if not live.gone(pid)] == [], midway.processes
    live.cancelled_midway(midway.envelopes, midway.run_id, PARTIAL)
    assert _cancelled_by(midway)["by"].startswith("busd-run[")
    # Nothing to warn about either (--log-level warning): every kind the CLI sends on
    # an abort is known, and the SDK saw no CLI die under it.
    assert "unknown raw event kind" not in midway.run.stderr, midway.run.stderr
    assert "Traceback" not in midway.run.stderr, midway.run.stderr
    assert standin.kinds() == ["answer"]


async def test_busd_cancel_through_a_running_daemon_stops_the_real_copilot_cli_mid_answer(
    tmp_path: Path, standin: Any
) -> None:
    env = live.busd_env(tmp_path, COPILOT_CLI_PATH=str(COPILOT))
    midway = await live.busd_cancel_midway(
        tmp_path, standin, _run_args(tmp_path, standin.url), env=env, agent="copilot", last=LAST
    )
    assert midway.code == live.RUN_EXIT_CANCELLED, midway.run.stderr
    assert midway.daemon_alive, midway.processes  # the CLI is gone, the daemon carries on
    live.cancelled_midway(midway.envelopes, midway.run_id, PARTIAL)
    cancelled = _cancelled_by(midway)
    assert (cancelled["by"].split("[")[0], cancelled["reason"]) == ("busd-cancel", "enough")
    shown = "\n".join(midway.run.lines)
    assert PARTIAL in shown
    assert "cancelled by busd-cancel" in shown
    assert "error" not in shown.lower()
    assert midway.serve is not None
    assert "Traceback" not in midway.serve.stderr + midway.run.stderr
    assert standin.kinds() == ["answer"]
