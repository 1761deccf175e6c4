"""The real Claude Code CLI with busd's hooks installed: a frontend answers its permission.

The CLI is the one bundled in the claude-agent-sdk wheel, run in ``-p`` mode
in its own HOME; its model is ``hooks_stand_in.py``, which asks for ``Bash``
``echo hooked > hooked.txt`` (a write, so Claude Code asks permission).
``busd hooks claude-code --install`` writes the settings, exactly as a user
would; the daemon runs in this test, and a frontend (a busd client here)
answers the permission request the hook raises on the bus.

What Claude Code 2.1.332 does, seen here: its ``PermissionRequest`` hook
runs in ``-p`` mode too, before it would decide by itself; a hook decision
``allow`` runs the tool, ``deny`` makes the tool's result an error carrying
the hook's message. A hook that prints nothing leaves it to the CLI, which
in ``-p`` mode (nobody to prompt) denies: the file is not written.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import sys
import tempfile
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from functools import partial
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import claude_agent_sdk
import pytest
import trio

from busd.client import Client, ClientSubscription, connect
from busd.core.events import (
    Envelope,
    Event,
    PermissionRequested,
    PermissionResolved,
    SessionIdle,
    SessionStart,
    ToolComplete,
    ToolStart,
    TurnStart,
)
from busd.daemon.endpoint import Endpoint
from busd.daemon.hub import Daemon, DaemonConfig
from busd.daemon.server import Server
from busd.plugins.manager import PluginManager

CLI = Path(claude_agent_sdk.__file__).parent / "_bundled" / "claude"
BUSD = Path(sys.executable).parent / "busd"
MODEL = "claude-sonnet-4-5-20250929"

pytestmark = pytest.mark.skipif(not CLI.exists(), reason=f"no bundled Claude Code CLI at {CLI}")


def _stand_in() -> Any:
    path = Path(__file__).with_name("hooks_stand_in.py")
    spec = importlib.util.spec_from_file_location("hooks_stand_in", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def stand_in() -> Iterator[str]:
    """The stand-in Messages API on a free port: its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _stand_in().Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def place() -> Iterator[Path]:
    """A short directory (a Unix socket path is at most 107 bytes) with home/ and work/."""
    directory = Path(tempfile.mkdtemp(prefix="busd-cch-", dir="/tmp"))
    (directory / "home").mkdir()
    (directory / "work").mkdir()
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


class Bus:
    """A daemon with the installed plugins on a real socket, recording what it publishes."""

    def __init__(self, socket: Path) -> None:
        plugins = PluginManager(environ={})
        plugins.load_entry_points()
        self.socket = socket
        self.daemon = Daemon(DaemonConfig(), socket_path=str(socket), plugins=plugins)
        self.seen: list[Envelope[Event]] = []
        self.started = trio.Event()
        self.daemon.bus.on_all(self._record)

    def _record(self, envelope: Envelope[Event]) -> None:
        self.seen.append(envelope)
        if isinstance(envelope.event, SessionStart):
            self.started.set()

    def of(self, kind: type[Any]) -> list[Envelope[Any]]:
        return [e for e in self.seen if isinstance(e.event, kind)]


@asynccontextmanager
async def serving(socket: Path) -> AsyncIterator[Bus]:
    bus = Bus(socket)
    with Endpoint.bind(socket) as endpoint:
        async with trio.open_nursery() as nursery:
            await nursery.start(Server(bus.daemon, endpoint.socket).run)
            yield bus
            nursery.cancel_scope.cancel()


def _env(place: Path, base_url: str) -> dict[str, str]:
    home = place / "home"
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": str(home),
        "CLAUDE_CONFIG_DIR": str(home / ".claude"),
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": "sk-ant-stand-in",
        # No telemetry: its flush outlives the CLI and writes into HOME after the test.
        "DISABLE_TELEMETRY": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }


async def _install(place: Path, base_url: str, wait: float) -> dict[str, Any]:
    """``busd hooks claude-code --install``, as a user runs it; the settings it wrote."""
    command = [str(BUSD), "hooks", "claude-code", "--install", "--timeout", str(wait)]
    command += ["--socket", str(place / "bus.sock")]
    done = await trio.run_process(command, env=_env(place, base_url), capture_stdout=True)
    assert b"installed into" in done.stdout, done.stdout
    settings: dict[str, Any] = json.loads((place / "home/.claude/settings.json").read_text())
    return settings


async def _claude(place: Path, base_url: str) -> list[dict[str, Any]]:
    """One ``claude -p`` turn in place/work; its stream-json lines."""
    command = [str(CLI), "-p", "Write the file.", "--output-format", "stream-json", "--verbose"]
    command += ["--model", MODEL]
    with trio.fail_after(90):
        done = await trio.run_process(
            command,
            cwd=place / "work",
            env=_env(place, base_url),
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert done.returncode == 0, done.stderr.decode()
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


async def _answer(web: Client, sub: ClientSubscription, **answer: Any) -> None:
    """Answer the first permission request the bus carries, as a frontend."""
    batch = await sub.__anext__()
    request = batch.events[0].event
    assert isinstance(request, PermissionRequested)
    await web.reply_permission(request.request_id, **answer)


def _tool_result(lines: list[dict[str, Any]]) -> dict[str, Any]:
    for line in lines:
        content = line.get("message", {}).get("content") if line.get("type") == "user" else None
        for block in content if isinstance(content, list) else []:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                return block
    raise AssertionError("no tool_result in the CLI's output")


async def _turn(
    place: Path, base_url: str, *, wait: float = 20, **answer: Any
) -> tuple[Bus, list[dict[str, Any]]]:
    """Install, serve, run one turn while a frontend answers with ``answer`` (or stays silent)."""
    settings = await _install(place, base_url, wait)
    assert "PermissionRequest" in settings["hooks"]
    async with (
        serving(place / "bus.sock") as bus,
        connect(place / "bus.sock", client="web", role="frontend") as web,
        web.subscribe(["stream.permission.requested"], window_ms=0) as sub,
        trio.open_nursery() as nursery,
    ):
        if answer:
            nursery.start_soon(partial(_answer, web, sub, **answer))
        lines = await _claude(place, base_url)
        nursery.cancel_scope.cancel()
    return bus, lines


async def test_a_frontend_allows_and_the_tool_runs(place: Path, stand_in: str) -> None:
    bus, lines = await _turn(place, stand_in, option_id="allow")
    assert (place / "work/hooked.txt").read_text() == "hooked\n"
    assert _tool_result(lines).get("is_error") is not True
    session = next(line["session_id"] for line in lines if line.get("session_id"))
    [requested] = bus.of(PermissionRequested)
    assert requested.session_id == session  # Claude Code's own session id
    assert requested.source.startswith("busd-hook-claude-code[pid=")
    assert requested.event.tool == "Bash"
    assert requested.event.input["command"] == "echo hooked > hooked.txt"
    [resolved] = bus.of(PermissionResolved)
    assert (resolved.event.outcome, resolved.event.option_id) == ("allowed", "allow")
    assert resolved.event.by.startswith("web[pid=")
    # The session, live from the hooks: started, a turn, the tool once, idle.
    [start] = bus.of(SessionStart)
    assert start.event.cwd == str(place / "work")
    assert bus.of(TurnStart)
    [tool] = bus.of(ToolStart)
    assert (tool.event.tool_call_id, tool.event.name) == ("toolu_hooked_1", "Bash")
    [complete] = bus.of(ToolComplete)
    assert (complete.event.tool_call_id, complete.event.status) == ("toolu_hooked_1", "ok")
    assert bus.of(SessionIdle)
    assert {e.session_id for e in bus.seen if e.session_id} == {session}
    order = [type(e.event) for e in bus.seen if type(e.event) in (ToolStart, PermissionRequested)]
    assert order == [ToolStart, PermissionRequested]


async def test_a_frontend_denies_and_the_tool_does_not_run(place: Path, stand_in: str) -> None:
    bus, lines = await _turn(place, stand_in, option_id="deny", reason="not from busd")
    assert not (place / "work/hooked.txt").exists()
    result = _tool_result(lines)
    assert result["is_error"] is True
    assert "not from busd" in str(result["content"])
    [resolved] = bus.of(PermissionResolved)
    assert resolved.event.outcome == "denied"
    assert not bus.of(ToolComplete) or bus.of(ToolComplete)[0].event.status != "ok"


async def test_without_an_answer_claude_code_decides(place: Path, stand_in: str) -> None:
    """Nobody answers within the hook's wait: the CLI's own decision (in -p: denied) stands."""
    bus, lines = await _turn(place, stand_in, wait=1)
    assert not (place / "work/hooked.txt").exists()
    assert any(line.get("subtype") == "permission_denied" for line in lines)
    [resolved] = bus.of(PermissionResolved)
    assert (resolved.event.outcome, resolved.event.by) == ("cancelled", "timeout")


class Tmux:
    """A private tmux server (its own socket, no config): Claude Code in a real terminal."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def run(self, *args: str) -> str:
        command = ["tmux", "-L", self.name, "-f", "/dev/null", *args]
        done = await trio.run_process(command, capture_stdout=True, capture_stderr=True)
        return done.stdout.decode()

    async def wait_for(self, what: str, ok: Callable[[str], bool]) -> str:
        """Poll the pane (an external program) until ``ok(screen)``, for 60 s at most."""
        screen = ""
        with trio.move_on_after(60):
            while True:
                screen = await self.run("capture-pane", "-p", "-t", "cc")
                if ok(screen):
                    return screen
                await trio.sleep(0.1)
        raise AssertionError(f"no {what} within 60s; last screen:\n{screen}")


async def test_in_a_terminal_busds_status_line_shows_and_a_frontend_answers(
    place: Path, stand_in: str
) -> None:
    """Interactive Claude Code in tmux: its status line is busd's; another screen allows."""
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (CI installs it): the terminal test needs it")
    await _install(place, stand_in, 30)
    home = place / "home"
    trusted = {
        "hasCompletedOnboarding": True,
        "projects": {str(place / "work"): {"hasTrustDialogAccepted": True}},
        "customApiKeyResponses": {"approved": ["sk-ant-stand-in"[-20:]], "rejected": []},
    }
    for config in (home / ".claude.json", home / ".claude" / ".claude.json"):
        config.write_text(json.dumps(trusted))
    env = [f"{k}={v}" for k, v in {**_env(place, stand_in), "TERM": "xterm-256color"}.items()]
    claude = shlex.join(["env", "-i", *env, str(CLI), "--model", MODEL])
    tmux = Tmux(f"busd-cch-{place.name}")
    line_env = {**os.environ, "BUSD_SOCKET": str(place / "bus.sock")}
    async with (
        serving(place / "bus.sock") as bus,
        connect(place / "bus.sock", client="web", role="frontend") as web,
        web.subscribe(["stream.permission.requested"], window_ms=0) as sub,
    ):
        try:
            size = ["-x", "120", "-y", "30"]
            await tmux.run(
                "new-session",
                "-d",
                "-s",
                "cc",
                *size,
                f"cd {shlex.quote(str(place / 'work'))}; {claude}",
            )
            with trio.fail_after(60):
                await bus.started.wait()
            session = bus.of(SessionStart)[0].session_id
            assert session is not None
            await tmux.wait_for("status line", lambda s: f"{session[:8]} idle" in s)
            await tmux.run("send-keys", "-t", "cc", "-l", "Write the file.")
            await tmux.wait_for("prompt", lambda s: "Write the file." in s)
            await tmux.run("send-keys", "-t", "cc", "Enter")
            with trio.fail_after(60):
                batch = await sub.__anext__()
            request = batch.events[0].event
            assert isinstance(request, PermissionRequested)
            status = await trio.run_process(
                [str(BUSD), "status", "--line"], capture_stdout=True, env=line_env
            )
            assert "⚠ 1 permission (Bash)" in status.stdout.decode(), status.stdout
            await web.reply_permission(request.request_id, option_id="allow")
            await tmux.wait_for("the answer", lambda s: "The tool said" in s)  # the tool ran
            assert (place / "work/hooked.txt").exists()
            # Named by its first prompt now (as Claude Code's resume list names it); under 1 s: idle
            done = ("Write the file. ✻ Worked for", "Write the file. idle")
            await tmux.wait_for("idle again", lambda s: any(line in s for line in done))
        finally:
            with trio.CancelScope(shield=True):
                await tmux.run("kill-server")
    assert (place / "work/hooked.txt").read_text() == "hooked\n"
    [resolved] = bus.of(PermissionResolved)
    assert (resolved.event.outcome, resolved.event.by.split("[")[0]) == ("allowed", "web")


def test_the_test_env_has_busd() -> None:
    assert os.access(BUSD, os.X_OK), BUSD
