"""The real Claude Code CLI cancelled mid-answer: the live estimate gives way to the CLI's count.

As in ``test_claude_code_live_cancel.py``: ``busd run --json`` with its
in-process daemon drives the CLI bundled in the claude-agent-sdk wheel
against ``messages_stand_in.py`` in slow mode (a side call, then an answer
that streams five words and stalls), and gets SIGINT once every word is out.
The answer's ``message_start`` said output 1 and no final count came from
the API, so while it streams the live line (``busd.stats``) is busd's
estimate. The CLI's interrupted ``result`` counts the cut answer itself (its
``modelUsage``: the side call's output plus its own figure for the words),
and that count replaces the estimate (issue 16): the run's summary equals
the live line's last figure, exact, and ``busd run`` prints it without ``~``.
(The ``anthropic`` driver, whose API never counts a cut answer, ends such a
run flagged estimated: ``plugins/anthropic/tests/test_anthropic_run_estimates.py``.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import claude_agent_sdk
import pytest

from busd.frontends.humanize import format_tokens
from tests.daemon_helpers import load_module

CLI = Path(claude_agent_sdk.__file__).parent / "_bundled" / "claude"
HERE = Path(__file__).resolve().parent
MODEL = "claude-sonnet-4-5-20250929"

pytestmark = pytest.mark.skipif(not CLI.exists(), reason=f"no bundled Claude Code CLI at {CLI}")

standin_module = load_module(HERE / "messages_stand_in.py", "cc_estimate_messages_stand_in")
live = load_module(HERE / "live_processes.py", "cc_estimate_live_processes")


@pytest.fixture
def standin() -> Any:
    with standin_module.StandIn(slow=True) as served:
        yield served


async def test_a_cancelled_claude_code_run_ends_at_the_clis_count_of_its_cut_answer(
    tmp_path: Path, standin: Any
) -> None:
    env = live.busd_env(tmp_path, ANTHROPIC_BASE_URL=standin.url, ANTHROPIC_API_KEY="sk-ant-x")
    args = ["--adapter", "claude-code", "--model", MODEL, "--cwd", tmp_path]
    midway = await live.ctrl_c_midway(
        tmp_path,
        standin,
        [*args, "Count slowly to three."],
        env=env,
        agent="claude",
        last=standin_module.SLOW_WORDS[-1],
    )
    assert midway.code == live.RUN_EXIT_CANCELLED, midway.run.stderr
    ours = [e for e in midway.envelopes if e.get("run_id") == midway.run_id]
    stats = [e["event"] for e in ours if e["event"]["type"] == "busd.stats"]
    [finished] = [e["event"] for e in ours if e["event"]["type"] == "busd.run.finished"]
    figures = [(s.get("output_tokens", 0), s.get("output_estimated", False)) for s in stats]
    assert any(estimated for _, estimated in figures)  # the words, while they streamed
    side, _answer = standin.served
    output, estimated = figures[-1]
    assert not estimated
    assert output > side.usage["output_tokens"]  # the side call's, and the cut answer's
    assert finished["status"] == "cancelled"
    assert finished["usage"]["output_tokens"] == output
    assert finished.get("output_estimated", False) is False
    shown = format_tokens(output)
    assert f"↓ {shown} tokens" in midway.run.stderr
    assert f" {shown} out" in midway.run.stderr
    assert "~" not in midway.run.stderr
