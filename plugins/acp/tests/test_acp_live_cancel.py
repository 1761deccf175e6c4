"""``opencode acp`` cancelled mid-answer, by Ctrl-C and by ``busd cancel`` (issue 17).

The model is the scripted stand-in in slow mode
(``plugins/claude_code/tests/messages_stand_in.py``): the answer streams
word by word, then its request stays open; the run is cancelled then. busd
cancels the ACP way (``session/cancel``, the prompt answered ``cancelled``)
and ends the agent's process group: ``busd run`` exits 130, no OpenCode
process is left, the partial text is ``stopped``, the turn ``cancelled``,
and nothing is shown or published as an error.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_helpers import load_module

HERE = Path(__file__).resolve().parent
HELPERS = HERE.parents[1] / "claude_code" / "tests"
standin_module = load_module(HELPERS / "messages_stand_in.py", "acp_cancel_messages_stand_in")
live = load_module(HELPERS / "live_processes.py", "acp_cancel_live_processes")
opencode = load_module(
    HERE.parents[1] / "opencode" / "tests" / "opencode_standin.py", "acp_cancel_opencode_standin"
)
OPENCODE: Path = opencode.OPENCODE
PROMPT = "Count slowly to three."
PARTIAL = "".join(standin_module.SLOW_WORDS)

pytestmark = pytest.mark.skipif(
    not OPENCODE.exists(),
    reason=f"no opencode at {OPENCODE} (install it: cd contrib/agents && npm install)",
)


def run_args(root: Path, model_url: str) -> list[Any]:
    """``busd run`` arguments for ``opencode acp`` in ``root/project``, at the stand-in."""
    project = root / "project"
    project.mkdir(exist_ok=True)
    config = opencode.opencode_config(model_url)
    (project / "opencode.json").write_text(json.dumps(config))
    options = {"command": [str(OPENCODE), "acp"], "env": opencode.opencode_env(root / "agent")}
    args: list[Any] = ["--adapter", "acp", "--cwd", project]
    for key, value in options.items():
        args += ["--option", f"{key}={json.dumps(value)}"]
    return [*args, PROMPT]


def assert_stopped_cleanly(midway: Any) -> None:
    midway.assert_stopped_cleanly(PARTIAL)
    assert "error" not in midway.run.stderr.lower(), midway.run.stderr


async def test_ctrl_c_on_busd_run_stops_opencode_acp_mid_answer(tmp_path: Path) -> None:
    """The SIGINT goes to the whole job, as a terminal sends it; only busd hears it."""
    with standin_module.StandIn(slow=True) as standin:
        midway = await live.ctrl_c_midway(
            tmp_path,
            standin,
            run_args(tmp_path, standin.url),
            env=live.busd_env(tmp_path),
            agent="opencode",
            last=standin_module.SLOW_WORDS[-1],
            job=True,
        )
    assert_stopped_cleanly(midway)


async def test_busd_cancel_stops_opencode_acp_mid_answer_through_busd_serve(
    tmp_path: Path,
) -> None:
    with standin_module.StandIn(slow=True) as standin:
        midway = await live.busd_cancel_midway(
            tmp_path,
            standin,
            run_args(tmp_path, standin.url),
            env=live.busd_env(tmp_path),
            agent="opencode",
            last=standin_module.SLOW_WORDS[-1],
        )
    assert midway.daemon_alive  # the daemon lives on; the agent's processes do not
    assert_stopped_cleanly(midway)
