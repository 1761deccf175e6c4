"""``busd watch`` as a person uses it: real processes, real terminals (tmux), a recorded run.

The daemon is a ``busd serve`` process; the recorded run is the bundled
Claude Code recording played by the replay driver, whose permission request
waits for a frontend. Two watchers run in panes of a private tmux server;
keys go in with ``send-keys`` and the screens are read with ``capture-pane``,
polled against a condition until a deadline (the failure shows the last
screen). ``--plain`` and the failure paths run as plain subprocesses.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from busd.client import Client
from busd.client import connect as busd_connect
from busd.core.events import PermissionRequested, SessionInfo

BUSD = [sys.executable, "-m", "busd"]
RECORDING = {"recording": "claude_code"}
PROMPT = "Create tmp/hello-allow.txt containing hello"
SUMMARY = re.compile(r"✻ Worked for \d+s · ↓ 231 tokens")
"""The claude_code recording's exact output count (tests/fixtures/sdk/README.md)."""
TTY_STATE = (
    "import termios; a = termios.tcgetattr(0); "
    "print('[tty cooked]' if a[3] & termios.ICANON and a[3] & termios.ECHO else '[tty raw]')"
)


@pytest.fixture
def sock_path() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="busd-watch-", dir="/tmp"))
    yield directory / "bus.sock"
    shutil.rmtree(directory, ignore_errors=True)


async def _read_until(stream: trio.abc.ReceiveStream, needle: bytes, seen: bytearray) -> None:
    while needle not in seen:
        chunk = await stream.receive_some(4096)
        if not chunk:
            raise AssertionError(f"stream ended before {needle!r}; got {bytes(seen)!r}")
        seen += chunk


@asynccontextmanager
async def serving(path: Path) -> AsyncIterator[trio.Process]:
    """``busd serve`` in a subprocess, yielded once it listens."""
    process = await trio.lowlevel.open_process(
        [*BUSD, "serve", "--socket", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert process.stdout is not None
        with trio.fail_after(30):
            await _read_until(process.stdout, b"listening on", bytearray())
        yield process
    finally:
        if process.returncode is None:
            process.kill()
        with trio.fail_after(30):
            await process.wait()
        if process.stdout is not None:
            await process.stdout.aclose()


async def start_replay(client: Client, speed: float) -> dict[str, str]:
    return await client.start_run(
        adapter="claude-code",
        prompt=PROMPT,
        driver="replay",
        options={**RECORDING, "speed": speed},
    )


# -- two watchers in tmux -------------------------------------------------------------


class Tmux:
    """A private tmux server (its own socket, no config) with fixed-size panes."""

    def __init__(self) -> None:
        self.name = f"busd-test-{uuid.uuid4().hex[:10]}"

    async def run(self, *args: str) -> str:
        result = await trio.run_process(
            ["tmux", "-L", self.name, "-f", "/dev/null", *args],
            capture_stdout=True,
            capture_stderr=True,
        )
        return result.stdout.decode()

    async def start(
        self, session: str, argv: list[str], *, width: int = 120, height: int = 40
    ) -> None:
        """Run ``argv`` in a pane of this size; when it exits, say how and keep the pane."""
        command = (  # COLUMNS and LINES from the test run would win over the pane's size
            f"env -u COLUMNS -u LINES TERM=xterm-256color {shlex.join(argv)}; "
            f'echo "[exited $?]"; {shlex.join([sys.executable, "-c", TTY_STATE])}; '
            "exec sleep 3600"
        )
        size = ["-x", str(width), "-y", str(height)]
        await self.run("new-session", "-d", "-s", session, *size, command)

    async def screen(self, session: str) -> str:
        return await self.run("capture-pane", "-p", "-t", session)

    async def keys(self, session: str, *keys: str) -> None:
        await self.run("send-keys", "-t", session, *keys)

    async def wait_for(
        self, session: str, what: str, ok: Callable[[str], bool], within: float = 30.0
    ) -> str:
        """Poll the pane until ``ok(screen)``; fail with the last screen at the deadline."""
        screen = ""
        with trio.move_on_after(within):
            while True:
                screen = await self.screen(session)
                if ok(screen):
                    return screen
                await trio.sleep(0.1)
        raise AssertionError(f"{session}: no {what} within {within}s; last screen:\n{screen}")

    async def kill(self) -> None:
        await self.run("kill-server")


@pytest.fixture
async def tmux() -> AsyncIterator[Tmux]:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (CI installs it): the terminal tests need it")
    server = Tmux()
    yield server
    with trio.CancelScope(shield=True):
        await server.kill()


async def test_two_watchers_see_one_answer_and_the_same_exact_summary(
    sock_path: Path, tmux: Tmux
) -> None:
    both = ("A", "B")
    async with serving(sock_path), busd_connect(sock_path, client="test") as client:
        for name in both:
            await tmux.start(name, [*BUSD, "watch", "--socket", str(sock_path), "--name", name])
        for name in both:
            await tmux.wait_for(name, "screen", lambda s: "busd watch · 0 sessions" in s)
        run = await start_replay(client, speed=2.0)

        for name in both:
            screen = await tmux.wait_for(
                name, "permission prompt", lambda s: "[y] allow  [a] allow always  [n] deny" in s
            )
            assert "Permission requested" in screen
            assert "Write · tmp/hello-allow.txt" in screen
            assert "/home/u/proj/tmp/hello-allow.txt" in screen  # the input summary
            assert f"▸ {run['session_id']}" in screen
            assert "∴ Thought for" in screen
            assert "⏺ Write(/home/u/proj/tmp/hello-allow.txt)  ⋯ waiting for permission" in screen
        await tmux.keys("A", "y")
        for name in both:
            screen = await tmux.wait_for(
                name, "resolution", lambda s: "✓ allowed by A" in s and "[y] allow" not in s
            )
            assert "⚑ Write · tmp/hello-allow.txt  ✓ allowed by A" in screen
            assert "Permission requested" not in screen
        for name in both:
            screen = await tmux.wait_for(name, "summary", lambda s: SUMMARY.search(s) is not None)
            assert "✓ Write(/home/u/proj/tmp/hello-allow.txt)" in screen
            assert "✶" not in screen
        await tmux.keys("B", "y")
        await tmux.wait_for(
            "B", "refusal", lambda s: "no permission request waiting in this session" in s
        )

        # A second run: B's focus follows it; A answered, so its focus stays where A is
        # until A moves it. B's `c` cancels the run for everyone.
        second = await start_replay(client, speed=1.0)
        await tmux.wait_for(
            "B", "second run", lambda s: f"▸ {second['session_id']}" in s and "✶" in s
        )
        screen = await tmux.wait_for("A", "second run", lambda s: second["session_id"] in s)
        assert f"▸ {run['session_id']}" in screen
        await tmux.keys("A", "Tab")
        await tmux.wait_for("A", "the switch", lambda s: f"▸ {second['session_id']}" in s)
        await tmux.keys("B", "c")  # it asks first
        await tmux.wait_for("B", "question", lambda s: f"cancel {second['run_id']}? c or y" in s)
        await tmux.keys("B", "y")
        for name in both:
            await tmux.wait_for(name, "cancellation", lambda s: "⊘ cancelled by B" in s)
        await tmux.wait_for("B", "the note gone", lambda s: "cancelling" not in s)

        for name in both:
            await tmux.keys(name, "q")
            screen = await tmux.wait_for(name, "exit", lambda s: "[tty cooked]" in s)
            assert "[exited 0]" in screen


# -- plain output and failures, without a terminal ------------------------------------


async def answer_permissions(client: Client, task_status: trio.TaskStatus[None]) -> None:
    async with client.subscribe(["stream.permission.requested"]) as sub:
        task_status.started()
        async for envelope in sub.events():
            assert isinstance(envelope.event, PermissionRequested)
            await client.reply_permission(envelope.event.request_id, allow=True)


async def test_plain_watchers_log_the_run_whether_asked_or_piped(sock_path: Path) -> None:
    results: dict[str, subprocess.CompletedProcess[bytes]] = {}

    async def watch(name: str, *args: str) -> None:
        with trio.fail_after(60):
            results[name] = await trio.run_process(
                [*BUSD, "watch", "--socket", str(sock_path), "--exit-when-idle", *args],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )

    async with (
        serving(sock_path),
        busd_connect(sock_path, client="tester") as client,
        trio.open_nursery() as answering,
    ):
        await answering.start(answer_permissions, client)
        async with trio.open_nursery() as watchers:
            watchers.start_soon(watch, "plain", "--plain")
            watchers.start_soon(watch, "piped")  # stdout is a pipe: plain as well
            run = await start_replay(client, speed=0)
        answering.cancel_scope.cancel()

    session = run["session_id"]
    for name, result in results.items():
        assert result.returncode == 0, (name, result.stderr.decode())
        lines = result.stdout.decode().splitlines()
        assert all(line.startswith(f"[{session}] ") for line in lines), (name, lines)
        body = [line.removeprefix(f"[{session}] ") for line in lines]
        expected = [
            f"❯ {PROMPT}",
            "⏺ Write(/home/u/proj/tmp/hello-allow.txt)",
            "⚠ permission requested: Write · tmp/hello-allow.txt"
            " · /home/u/proj/tmp/hello-allow.txt",
            f"⚑ Write: ✓ allowed by tester (pid {os.getpid()})",  # the answering client
        ]
        positions = [body.index(line) for line in expected]
        positions.append(next(i for i, line in enumerate(body) if line.startswith("✓ Write ")))
        assert positions == sorted(positions), (name, body)  # in the events' order
        assert SUMMARY.fullmatch(body[-2]), (name, body)
        assert re.fullmatch(r"tools: Write 1 call, last \d+\.\ds", body[-1]), (name, body)


async def test_watch_says_clearly_when_there_is_no_daemon_and_waits_out_a_restart(
    sock_path: Path,
) -> None:
    with trio.fail_after(30):
        absent = await trio.run_process(
            [*BUSD, "watch", "--socket", str(sock_path), "--plain"],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert absent.returncode == 1
    assert b"no busd daemon at" in absent.stderr

    watcher: trio.Process | None = None
    out, err = bytearray(), bytearray()
    try:
        async with serving(sock_path) as daemon:
            watcher = await trio.lowlevel.open_process(
                [*BUSD, "watch", "--socket", str(sock_path), "--plain"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            assert watcher.stdout is not None
            assert watcher.stderr is not None
            async with busd_connect(sock_path, client="tester", role="agent") as client:
                await client.publish(SessionInfo(message="hello"), session_id="s1")
            with trio.fail_after(30):
                await _read_until(watcher.stdout, "[s1] ℹ hello\n".encode(), out)
            daemon.send_signal(signal.SIGTERM)
            with trio.fail_after(30):
                await _read_until(watcher.stderr, b"reconnecting", err)
        assert watcher.returncode is None  # it waits for the daemon to come back
        async with serving(sock_path):  # a new daemon (no journal): it numbers afresh
            async with busd_connect(sock_path, client="tester", role="agent") as client:
                await client.publish(SessionInfo(message="again"), session_id="s2")
            with trio.fail_after(30):
                await _read_until(watcher.stderr, b"the daemon is back\n", err)
                await _read_until(watcher.stdout, "[s2] ℹ again\n".encode(), out)
            watcher.send_signal(signal.SIGTERM)
            with trio.fail_after(30):
                code = await watcher.wait()
    finally:
        if watcher is not None:
            if watcher.returncode is None:
                watcher.kill()
                await watcher.wait()
            for pipe in (watcher.stdout, watcher.stderr):
                if pipe is not None:
                    await pipe.aclose()
    assert code == 143
    said = err.decode()
    assert said.startswith("busd: lost the daemon (shutdown"), said
    assert "Traceback" not in said
