"""``busd demo``: a real daemon, four recorded runs, a watcher, as a person runs it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from functools import partial
from importlib import resources
from pathlib import Path

import trio

from busd.frontends.demo import BUNDLED, bundled_recordings

BUSD = [sys.executable, "-m", "busd"]
DEADLINE = 60.0
UNTIL_FINISHED = ("--until", "busd.run.finished", "--timeout", "30")

# What each recorded run ends with: the provider's exact output count
# (tests/fixtures/sdk/README.md); ACP reports no output tokens, so its run keeps
# busd's estimate of them, marked `~`.
SUMMARIES = {
    "claude_code": "↓ 231 tokens",
    "copilot": "↓ 110 tokens",
    "opencode": "↓ 161 tokens",
    "acp": "· ↓ ~",
}


def run_demo(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*BUSD, "demo", *args],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        env={**os.environ, **(env or {})},
        check=False,
    )


def test_the_demo_plays_every_recording_to_its_exact_summary() -> None:
    result = run_demo("--speed", "0", "--plain")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("busd demo: a daemon on ")
    assert lines[0].endswith(", replaying 4 recorded agent runs.")
    assert any(re.fullmatch(r"  BUSD_SOCKET=\S+/bus\.sock busd web", line) for line in lines)
    for name, summary in SUMMARIES.items():
        tag = f"[demo-{name}] "
        mine = [line.removeprefix(tag) for line in lines if line.startswith(tag)]
        assert mine, f"nothing shown for {name}"
        finals = [line for line in mine if line.startswith("✻ Worked for")]
        assert len(finals) == 1, mine
        assert summary in finals[0], mine
    # Nobody was at the terminal: the demo's own responder answered, and said so.
    approvals = [line for line in lines if "✓ allowed by busd-demo (auto-approve)" in line]
    assert {line.split("]")[0] + "]" for line in approvals} == {f"[demo-{n}]" for n in BUNDLED}


def test_one_recording_only() -> None:
    result = run_demo("--speed", "0", "--plain", "--only", "copilot")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].endswith(", replaying 1 recorded agent run.")
    tags = {line.split("]")[0] for line in lines if line.startswith("[")}
    assert tags == {"[demo-copilot"}


def test_without_the_adapter_plugins_the_demo_says_what_to_install() -> None:
    result = run_demo("--speed", "0", env={"BUSD_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert result.returncode == 1
    assert "no adapter plugin for" in result.stdout
    assert "pip install -r requirements.txt" in result.stdout


async def test_other_frontends_attach_to_the_demo_daemon() -> None:
    """The printed instructions work: a `busd tail` sees the runs, then Ctrl-C ends it."""
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            demo = await nursery.start(
                partial(
                    trio.run_process,
                    [*BUSD, "demo", "--speed", "0", "--plain", "--keep", "--only", "claude_code"],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    check=False,
                )
            )
            assert demo.stdout is not None
            seen = b""
            async for chunk in demo.stdout:
                seen += chunk
                if b"still serving on" in seen:
                    break
            text = seen.decode()
            socket = re.search(r"BUSD_SOCKET=(\S+) busd tail", text)
            assert socket is not None, text
            tail = await trio.run_process(
                [*BUSD, "tail", "--socket", socket[1], "--since", "0", "--json", *UNTIL_FINISHED],
                capture_stdout=True,
            )
            events = [json.loads(line) for line in tail.stdout.decode().splitlines()]
            finished = events[-1]["event"]
            assert finished["type"] == "busd.run.finished"
            assert finished["usage"]["output_tokens"] == 231
            assert events[-1]["session_id"] == "demo-claude_code"
            demo.send_signal(signal.SIGINT)
            assert await demo.wait() == 0


def test_the_bundled_recordings_name_their_adapters_and_prompts() -> None:
    runs = bundled_recordings()
    assert [run.name for run in runs] == list(BUNDLED)
    assert {run.adapter for run in runs} == {"claude-code", "copilot", "opencode", "acp"}
    assert all(run.prompt for run in runs)
    folder = resources.files("busd") / "data" / "recordings"
    for name in BUNDLED:
        assert Path(str(folder / f"{name}.jsonl")).stat().st_size > 0


def test_a_reader_that_stops_early_ends_the_demo_quietly() -> None:
    """`busd demo | head -1`: no traceback, exit 0."""
    with subprocess.Popen(
        [*BUSD, "demo", "--speed", "4", "--plain", "--only", "opencode"],  # writes come later
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as demo:
        assert demo.stdout is not None
        assert demo.stderr is not None
        assert demo.stdout.readline().startswith(b"busd demo: a daemon on ")
        demo.stdout.close()
        assert demo.wait(timeout=DEADLINE) == 0
        assert demo.stderr.read() == b""
