"""``busd hook``, ``busd hooks``, ``busd statusline`` and ``busd status --line``, as programs.

Each command runs as the agent (or tmux) would run it: a subprocess, its
payload on stdin, against a daemon on a real socket in this test (or none).
The Claude Code CLI itself is driven in
plugins/claude_code/tests/test_claude_code_hooks_live.py.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from busd.cli.info import daemon_line, session_line
from busd.client import connect
from busd.core.events import (
    ContextUsage,
    Envelope,
    Event,
    PermissionRequested,
    StreamingStats,
    TokenUsage,
    ToolComplete,
    ToolStart,
    UserPrompt,
)
from busd.core.sessions import SessionSnapshot, SessionSummary
from busd.daemon.hub import Daemon
from busd.daemon.ingests import ToolCallsSeen
from busd.plugins.adapters import Emitted
from busd.plugins.manager import PluginManager
from busd.wire import Ingest

from .daemon_helpers import running_daemon

BUSD = str(Path(sys.executable).parent / "busd")
SESSION = "fd60a077-36d7-469c-bde4-b31fd50546e9"
PRE = {
    "session_id": SESSION,
    "cwd": "/w",
    "hook_event_name": "PreToolUse",
    "tool_name": "Bash",
    "tool_input": {"command": "echo hooked > hooked.txt"},
    "tool_use_id": "toolu_1",
}
POST = {**PRE, "hook_event_name": "PostToolUse", "tool_response": {"stdout": "", "stderr": ""}}
PERMISSION = {
    "session_id": SESSION,
    "hook_event_name": "PermissionRequest",
    "tool_name": "Bash",
    "tool_input": {"command": "echo hooked > hooked.txt"},
}


@pytest.fixture
def place() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="busd-h-", dir="/tmp"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def plugins() -> PluginManager:
    manager = PluginManager(environ={})
    manager.load_entry_points()
    return manager


@asynccontextmanager
async def bus(path: Path) -> AsyncIterator[tuple[Daemon, list[Envelope[Event]]]]:
    """A daemon with the installed plugins, and what it publishes."""
    async with running_daemon(path, plugins=plugins()) as server:
        seen: list[Envelope[Event]] = []
        server.daemon.bus.on_all(seen.append)
        yield server.daemon, seen


async def busd(
    *args: str, stdin: bytes = b"", env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    """Run ``busd ARGS`` with ``stdin``; (exit code, stdout, stderr)."""
    with trio.fail_after(30):
        done = await trio.run_process(
            [BUSD, *args],
            stdin=stdin,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env={**os.environ, **(env or {})},
        )
    return done.returncode, done.stdout.decode(), done.stderr.decode()


def payload(data: dict[str, Any]) -> bytes:
    return json.dumps(data).encode()


# -- one tool call shows once, however many streams report it -----------------------------

ASSISTANT = {
    "type": "assistant",
    "session_id": SESSION,
    "parent_tool_use_id": None,
    "message": {
        "id": "msg_1",
        "role": "assistant",
        "model": "claude-sonnet-4-5-20250929",
        "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": PRE["tool_input"]}
        ],
    },
}
RESULT = {
    "type": "user",
    "session_id": SESSION,
    "parent_tool_use_id": None,
    "message": {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "", "is_error": False}
        ],
    },
}


async def test_a_tool_call_reported_by_hooks_and_a_transcript_shows_once(place: Path) -> None:
    path = place / "bus.sock"
    async with (
        bus(path) as (_, seen),
        connect(path, client="hooks", role="agent") as hooks,
        connect(path, client="lines", role="agent") as lines,
    ):
        await hooks.send_frame(Ingest(sdk="claude-code-hooks", events=[PRE], session_id=SESSION))
        await hooks.ping()
        await lines.send_frame(Ingest(sdk="claude-code", events=[ASSISTANT, RESULT]))
        await lines.ping()
        await hooks.send_frame(Ingest(sdk="claude-code-hooks", events=[POST], session_id=SESSION))
        await hooks.ping()
        other = {**PRE, "session_id": "another"}  # the same tool id elsewhere is another call
        await hooks.send_frame(
            Ingest(sdk="claude-code-hooks", events=[other], session_id="another")
        )
        await hooks.ping()
    starts = [(e.session_id, e.source) for e in seen if isinstance(e.event, ToolStart)]
    completes = [(e.session_id, e.source) for e in seen if isinstance(e.event, ToolComplete)]
    assert [s for s, _ in starts] == [SESSION, "another"]
    assert starts[0][1].endswith("/claude-code-hooks")  # the first to report it had it
    assert [s for s, _ in completes] == [SESSION]
    assert completes[0][1].endswith("/claude-code")  # the transcript's came first


def test_the_memory_of_tool_calls_is_bounded() -> None:
    seen = ToolCallsSeen(capacity=2)
    start = [Emitted(ToolStart(tool_call_id=f"t{n}", name="Bash"), "s") for n in range(3)]
    assert all(seen.first(e) for e in start)
    assert not seen.first(start[2])
    assert seen.first(start[0])  # forgotten: the oldest went first
    assert seen.first(Emitted(ToolComplete(tool_call_id="t2"), "s"))  # another type
    assert seen.dropped == 1


def test_a_prompt_seen_by_hooks_and_by_a_transcript_goes_out_once() -> None:
    """Both carry Claude Code's prompt id; a prompt without one is never taken for another."""
    seen = ToolCallsSeen()
    hooked = Emitted(UserPrompt(text="Go.", prompt_id="p1"), "s")
    written = Emitted(UserPrompt(text="Go.", prompt_id="p1"), "s")
    assert seen.first(hooked)
    assert not seen.first(written)
    assert seen.first(Emitted(UserPrompt(text="Go.", prompt_id="p1"), "another session"))
    anonymous = Emitted(UserPrompt(text="Go."), "s")
    assert seen.first(anonymous)
    assert seen.first(anonymous)


# -- busd hook never breaks the agent ----------------------------------------------------


async def test_a_hook_without_a_daemon_says_why_and_lets_the_agent_go_on(place: Path) -> None:
    env = {"BUSD_SOCKET": str(place / "none.sock")}
    for data in (PRE, PERMISSION):
        code, out, err = await busd("hook", "claude-code", stdin=payload(data), env=env)
        assert (code, out) == (0, "")
        assert err.startswith("busd: hook claude-code: no busd daemon at"), err
        assert err.count("\n") == 1


async def test_a_refused_connection_bad_input_or_an_unknown_agent_exit_0(place: Path) -> None:
    refusing = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    refusing.bind(str(place / "bus.sock"))  # bound, never listening: connections are refused
    env = {"BUSD_SOCKET": str(place / "bus.sock")}
    try:
        cases = [
            ("claude-code", payload(PERMISSION), "no busd daemon at"),
            ("claude-code", b"not json", "the payload on stdin is not JSON"),
            ("claude-code", b"[1]", "not a JSON object but list"),
            ("claude-code", payload({"x": 1}), "not a Claude Code hook payload"),
            ("nobody", payload(PRE), "no agent hooks named 'nobody'"),
        ]
        for name, data, said in cases:
            code, out, err = await busd("hook", name, "--unknown-option", stdin=data, env=env)
            assert (code, out) == (0, ""), err
            assert said in err, err
            assert "Traceback" not in err
        code, out, err = await busd("hook", stdin=payload(PRE), env=env)  # no name: not exit 2
        assert (code, out) == (0, "")
        assert "no agent named" in err
        code, out, err = await busd("hook", "claude-code", "--timeout", "soon", stdin=b"", env=env)
        assert (code, out) == (0, "")
        assert "--timeout 'soon' is not 0.1 to 86400 seconds" in err
    finally:
        refusing.close()


async def test_a_hook_reports_and_a_permission_gets_a_frontends_answer(place: Path) -> None:
    path = place / "bus.sock"
    env = {"BUSD_SOCKET": str(path)}
    async with (
        bus(path) as (_, seen),
        connect(path, client="web", role="frontend") as web,
        web.subscribe(["stream.permission.requested"], window_ms=0) as sub,
    ):
        code, out, err = await busd("hook", "claude-code", stdin=payload(PRE), env=env)
        assert (code, out, err) == (0, "", "")
        [tool] = [e for e in seen if isinstance(e.event, ToolStart)]
        assert tool.source.startswith("busd-hook-claude-code[pid=")
        assert tool.source.endswith("]/claude-code-hooks")
        answers: list[tuple[int, str, str]] = []

        async def hook() -> None:
            data = payload(PERMISSION)
            answers.append(
                await busd("hook", "claude-code", "--timeout", "20", stdin=data, env=env)
            )

        async with trio.open_nursery() as nursery:
            nursery.start_soon(hook)
            batch = await sub.__anext__()
            request = batch.events[0].event
            assert isinstance(request, PermissionRequested)
            await web.reply_permission(request.request_id, option_id="deny", reason="no")
    [(code, out, err)] = answers
    assert (code, err) == (0, "")
    decision = json.loads(out)["hookSpecificOutput"]
    assert decision == {
        "hookEventName": "PermissionRequest",
        "decision": {"behavior": "deny", "message": "no"},
    }


# -- busd hooks: the settings -------------------------------------------------------------


async def test_hooks_prints_the_settings_with_this_busds_absolute_path() -> None:
    code, out, _ = await busd("hooks", "claude-code", "--timeout", "30")
    assert code == 0
    settings = json.loads(out)
    [permission] = settings["hooks"]["PermissionRequest"][0]["hooks"]
    assert permission["command"] == f"{Path(BUSD).resolve()} hook claude-code --timeout 30"
    assert permission["timeout"] == 35
    assert settings["statusLine"]["command"] == f"{Path(BUSD).resolve()} statusline claude-code"


async def test_install_merges_backs_up_is_idempotent_and_uninstall_restores(place: Path) -> None:
    target = place / "claude" / "settings.json"
    target.parent.mkdir()
    stop = [{"hooks": [{"type": "command", "command": "x"}]}]
    original: dict[str, Any] = {"model": "opus", "hooks": {"Stop": stop}}
    target.write_text(json.dumps(original))
    code, out, _ = await busd("hooks", "claude-code", "--install", "--settings", str(target))
    assert code == 0
    assert f"installed into {target}" in out
    installed = json.loads(target.read_text())
    assert installed["model"] == "opus"
    assert installed["hooks"]["Stop"][0] == stop[0]
    [backup] = place.glob("claude/settings.json.busd-*.bak")
    assert json.loads(backup.read_text()) == original
    code, out, _ = await busd("hooks", "claude-code", "--install", "--settings", str(target))
    assert (code, "already installed" in out) == (0, True)
    assert json.loads(target.read_text()) == installed
    assert len(list(place.glob("claude/settings.json.busd-*.bak"))) == 1  # nothing written
    code, out, _ = await busd("hooks", "claude-code", "--uninstall", "--settings", str(target))
    assert (code, f"removed from {target}" in out) == (0, True)
    assert json.loads(target.read_text()) == original


async def test_install_into_claude_config_dir_and_a_broken_file_is_left_alone(
    place: Path,
) -> None:
    env = {"CLAUDE_CONFIG_DIR": str(place / "cfg")}
    code, _, _ = await busd("hooks", "claude-code", "--install", env=env)
    assert code == 0
    assert "PermissionRequest" in json.loads((place / "cfg/settings.json").read_text())["hooks"]
    broken = place / "broken.json"
    broken.write_text("{not json")
    code, _, err = await busd("hooks", "claude-code", "--install", "--settings", str(broken))
    assert code == 1
    assert err.startswith(f"busd: {broken} is not valid JSON (line 1)"), err
    assert broken.read_text() == "{not json"


# -- the one-line status --------------------------------------------------------------------


def _snapshot(**fields: Any) -> SessionSnapshot:
    base: dict[str, Any] = {
        "session_id": SESSION,
        "status": "idle",
        "first_seq": 1,
        "last_seq": 9,
        "first_ts": 0.0,
        "last_ts": 1.0,
        "events": 9,
    }
    return SessionSnapshot(**{**base, **fields})


def test_the_line_says_what_a_session_does_costs_and_waits_for() -> None:
    busy = _snapshot(
        status="active",
        title="fix-login",
        stats=StreamingStats(elapsed_s=12.4, output_tokens=1234),
        tools={"toolu_1": "Bash"},
        usage=TokenUsage(output_tokens=1234, cost_usd=0.4213),
        context=ContextUsage(used=46_000, window=200_000, percent=23.0),
        permissions=(Envelope(1, 0.0, PermissionRequested(request_id="r", tool="Bash"), SESSION),),
    )
    assert session_line(busy) == (
        "fix-login ✶ Working… (12s · ↓ 1.2k tokens) · Bash · $0.42 · ctx 23% · "
        "⚠ 1 permission (Bash)"
    )
    done = _snapshot(stats=StreamingStats(elapsed_s=18, output_tokens=5), usage=TokenUsage())
    assert session_line(done) == "fd60a077 ✻ Worked for 18s · ↓ 5 tokens"
    failed = _snapshot(status="error", error="overloaded", usage=TokenUsage(cost_usd=0.0123))
    assert session_line(failed) == "fd60a077 ✗ overloaded · $0.012"
    assert session_line(_snapshot()) == "fd60a077 idle"
    summary = SessionSummary(**{k: getattr(done, k) for k in SessionSummary.__struct_fields__})
    assert daemon_line([summary]) == "busd: no active session (1 known)"
    assert daemon_line([]) == "busd: no sessions"


async def test_status_line_and_statusline_print_the_same_line(place: Path) -> None:
    path = place / "bus.sock"
    env = {"BUSD_SOCKET": str(path)}
    async with bus(path), connect(path, client="hooks", role="agent") as agent:
        code, out, _ = await busd("status", "--line", env=env)
        assert (code, out) == (0, "busd: no sessions\n")
        await agent.send_frame(Ingest(sdk="claude-code-hooks", events=[PRE], session_id=SESSION))
        await agent.ping()
        code, line, _ = await busd("status", "--line", env=env)
        assert code == 0
        assert line.startswith("fd60a077 ✶ Working…"), line
        assert " · Bash" in line
        code, same, _ = await busd("statusline", "claude-code", stdin=payload(PRE), env=env)
        assert (code, same.split(" (")[0]) == (0, line.split(" (")[0])
        code, unknown, _ = await busd("status", "--line", "--session", "nope", env=env)
        assert (code, unknown) == (1, "busd: unknown_session\n")
        other = payload({**PRE, "session_id": "nope"})
        code, waiting, _ = await busd("statusline", "claude-code", stdin=other, env=env)
        assert (code, waiting) == (0, "busd: …\n")


async def test_no_daemon_is_one_short_line(place: Path) -> None:
    env = {"BUSD_SOCKET": str(place / "none.sock")}
    assert await busd("status", "--line", env=env) == (1, "busd: not running\n", "")
    code, out, _ = await busd("statusline", "claude-code", stdin=payload(PRE), env=env)
    assert (code, out) == (0, "busd: not running\n")
    code, out, _ = await busd("statusline", "claude-code", stdin=b"junk", env=env)
    assert code == 0
    assert out.startswith("busd: the payload on stdin is not JSON")
