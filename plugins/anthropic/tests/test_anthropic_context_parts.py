"""The context breakdown's system and tools parts, from what the anthropic driver sends (issue 16).

Only the driver sees the request's ``system`` and ``tools`` (the API's
stream never repeats them): it publishes them as token counts in
``stream.session.context_parts`` before the call. The live tests run the
real ``anthropic`` SDK against the scripted Messages API stand-in of the
Claude Code tests (``plugins/claude_code/tests/messages_stand_in.py``),
once in a daemon on its Unix socket and once as a real ``busd run``
process with ``--context-window``. The stand-in's first answer has input
11, cache write 1000, output 21: the context after it is 1,032 tokens.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import busd_anthropic
import pytest
import trio
from busd_anthropic.driver import context_parts

from busd import (
    ContextUsage,
    Envelope,
    Event,
    RunFinished,
    SessionContextParts,
    connect,
    estimate_json_tokens,
    estimate_tokens,
)
from busd.daemon.hub import Daemon
from busd.plugins.manager import PluginManager
from tests.daemon_helpers import BUSD, load_module, running_daemon

STAND_IN = Path(__file__).resolve().parents[2] / "claude_code" / "tests" / "messages_stand_in.py"
SYSTEM = "You are a terse assistant for the busd test suite. Answer in one short sentence."
TOOLS = [
    {
        "name": "lookup",
        "description": "Look a word up in the project's glossary.",
        "input_schema": {
            "type": "object",
            "properties": {"word": {"type": "string", "description": "The word."}},
            "required": ["word"],
        },
    },
    {"name": "clock", "description": "The time now.", "input_schema": {"type": "object"}},
]
PROMPT = "What does busd mean?"
ARGS = ["--adapter", "anthropic", "--json", "--context-window", "4k"]
ARGS += ["--system-prompt", SYSTEM, "--option"]  # then the tools, then the prompt
AFTER_CALL = 11 + 1000 + 21  # the stand-in's first usage: input, cache write, output


def stand_in() -> Any:
    return load_module(STAND_IN, "anthropic_parts_messages_stand_in").StandIn()


# -- what the driver counts -------------------------------------------------------------


def test_the_parts_are_the_estimates_of_the_system_text_and_of_each_tool_as_sent() -> None:
    parts = context_parts({"system": SYSTEM, "tools": TOOLS})
    assert parts == SessionContextParts(
        system=estimate_tokens(SYSTEM),
        tools=sum(estimate_json_tokens(tool) for tool in TOOLS),
        tool_names=["lookup", "clock"],
    )
    assert parts.system is not None
    assert parts.system > 0
    assert parts.tools is not None
    assert parts.tools > 0


def test_system_blocks_count_their_text_and_a_bare_call_has_no_parts() -> None:
    blocks = [{"type": "text", "text": SYSTEM}, {"type": "text", "text": "Be kind."}]
    parts = context_parts({"system": blocks})
    assert parts == SessionContextParts(
        system=estimate_tokens(SYSTEM) + estimate_tokens("Be kind."), tools=0
    )
    assert context_parts({"messages": [], "model": "m"}) is None


# -- a daemon on its socket, the real SDK, the stand-in -----------------------------------


@pytest.fixture
def sock_path() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="busd-parts-", dir="/tmp"))
    yield directory / "bus.sock"
    shutil.rmtree(directory, ignore_errors=True)


def _breakdown_adds_up(context: ContextUsage) -> None:
    parts = context.breakdown
    assert parts.system + parts.tools + parts.messages == context.used, context
    assert parts.free == max(0, (context.window or 0) - context.used - 500), context


async def test_a_run_shows_system_and_tools_in_its_breakdown_on_its_own_window(
    sock_path: Path,
) -> None:
    plugins = PluginManager(environ={})
    plugins.register(busd_anthropic, name="anthropic")
    seen: list[Envelope[Event]] = []
    finished = trio.Event()

    def record(envelope: Envelope[Event]) -> None:
        seen.append(envelope)
        if isinstance(envelope.event, RunFinished):
            finished.set()

    with stand_in() as api:
        async with running_daemon(sock_path, plugins=plugins) as server:
            daemon: Daemon = server.daemon
            daemon.bus.on_all(record)
            async with connect(sock_path, client="parts-test") as client:
                started = await client.start_run(
                    "anthropic",
                    PROMPT,
                    system_prompt=SYSTEM,
                    options={"tools": TOOLS, "api_key": "sk-test", "base_url": api.url},
                    context_window=4_000,
                    output_reserve=500,
                )
                with trio.fail_after(30):
                    await finished.wait()
    ours = [e for e in seen if e.run_id == started["run_id"]]
    [summary] = [e.event for e in ours if isinstance(e.event, RunFinished)]
    assert summary.status == "ok", summary.error
    [parts] = [e.event for e in ours if isinstance(e.event, SessionContextParts)]
    assert parts.tool_names == ["lookup", "clock"]
    system, tools = estimate_tokens(SYSTEM), sum(estimate_json_tokens(t) for t in TOOLS)
    assert (parts.system, parts.tools) == (system, tools)

    contexts = [e.event for e in ours if isinstance(e.event, ContextUsage)]
    before, after = contexts[0], contexts[-1]
    # Before the call: a pure estimate, system + tools + the prompt.
    assert before.estimated
    assert (before.breakdown.system, before.breakdown.tools) == (system, tools)
    assert before.breakdown.messages == estimate_tokens(PROMPT)
    # After it: the API's count, the same system and tools inside it, on the run's window.
    assert not after.estimated
    assert after.used == AFTER_CALL
    assert (after.breakdown.system, after.breakdown.tools) == (system, tools)
    assert after.breakdown.messages == AFTER_CALL - system - tools > 0
    assert after.window == 4_000
    assert after.percent == pytest.approx(100 * AFTER_CALL / 4_000)
    for context in contexts:
        _breakdown_adds_up(context)
    assert summary.context is not None
    assert summary.context.window == 4_000
    assert summary.context.breakdown == after.breakdown
    [request] = api.requests  # what the API was sent is what was counted
    assert (request["system"], request["tools"]) == (SYSTEM, TOOLS)


# -- a real `busd run` process ----------------------------------------------------------------


async def test_busd_run_context_window_sets_the_window_its_percentages_use(tmp_path: Path) -> None:
    """``busd run --context-window 4k`` with its in-process daemon: 1,032 of 4,000 is 25.8%."""
    home = tmp_path / "home"
    home.mkdir()
    with stand_in() as api:
        env = {
            "PATH": os.environ["PATH"],
            "HOME": str(home),
            "TMPDIR": str(tmp_path),
            "XDG_RUNTIME_DIR": str(tmp_path),
            "ANTHROPIC_API_KEY": "sk-test",
            "ANTHROPIC_BASE_URL": api.url,
        }
        with trio.fail_after(60):
            result = await trio.run_process(
                [*BUSD, "run", *ARGS, f"tools={json.dumps(TOOLS)}", PROMPT],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
                env=env,
                cwd=tmp_path,
            )
    assert result.returncode == 0, result.stderr.decode()
    events = [json.loads(line)["event"] for line in result.stdout.decode().splitlines()]
    contexts = [e for e in events if e["type"] == "busd.context"]
    [finished] = [e for e in events if e["type"] == "busd.run.finished"]
    assert contexts, events
    for context in [*contexts, finished["context"]]:
        assert context["window"] == 4_000
        assert context["percent"] == pytest.approx(100 * context["used"] / 4_000)
        parts = context["breakdown"]
        assert parts["system"] + parts["tools"] + parts["messages"] == context["used"]
        assert parts["system"] > 0
        assert parts["tools"] > 0
    assert finished["context"]["used"] == AFTER_CALL
    assert finished["context"]["percent"] == pytest.approx(25.8)


@pytest.mark.parametrize("bad", ["0", "lots", "1.5", "-4k", "0.0001k"])
async def test_a_bad_context_window_is_one_line_and_exit_2(tmp_path: Path, bad: str) -> None:
    with trio.fail_after(30):
        result = await trio.run_process(
            [*BUSD, "run", "--adapter", "anthropic", "--context-window", bad, "hi"],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), "TMPDIR": str(tmp_path)},
            cwd=tmp_path,
        )
    assert result.returncode == 2
    [line] = result.stderr.decode().splitlines()
    assert line.startswith("busd: error: --context-window:"), line
    assert repr(bad) in line
    assert result.stdout == b""
