"""``busd web`` in a real headless Chromium, against real ``busd`` processes.

``busd serve``, ``busd web`` and ``busd watch --plain`` run as processes; a
replayed Claude Code run (the bundled recording, at its recorded speed) asks
for permission to use ``Write``; the permission is clicked in the page, and
the terminal watcher must see it answered by the web. The page's screenshot
is kept in ``$BUSD_TEST_ARTIFACTS`` (default ``tests/artifacts/``).

Playwright drives Debian's ``chromium`` (never a browser build of its own);
the test skips, saying why, when either is missing.
"""

from __future__ import annotations

import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import pytest
import trio

from busd.client import connect

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
DEADLINE = 30.0
ARTIFACTS = Path(os.environ.get("BUSD_TEST_ARTIFACTS") or ROOT / "tests" / "artifacts")

pytestmark = pytest.mark.skipif(
    not os.access(CHROMIUM, os.X_OK), reason=f"no chromium at {CHROMIUM} (apt-get install chromium)"
)


@pytest.fixture
def workdir() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="busd-webui-", dir="/tmp"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


class Process:
    """A ``busd`` subcommand whose output is read line by line, with deadlines."""

    def __init__(self, *args: str, log: Path) -> None:
        self.log = log
        self.out = log.open("w+b")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "busd", *args],
            stdout=subprocess.PIPE,
            stderr=self.out,
            cwd=ROOT,
        )
        assert self.proc.stdout is not None
        self.stdout: IO[bytes] = self.proc.stdout
        self.text = ""

    def wait_for(self, pattern: str) -> re.Match[str]:
        """The first match of ``pattern`` in stdout; fails with what it printed."""
        found = re.search(pattern, self.text)
        deadline = time.monotonic() + DEADLINE
        with selectors.DefaultSelector() as selector:
            selector.register(self.stdout, selectors.EVENT_READ)
            while found is None:
                left = deadline - time.monotonic()
                if left <= 0 or not selector.select(left):
                    raise AssertionError(f"no {pattern!r} within {DEADLINE}s: {self.describe()}")
                chunk = os.read(self.stdout.fileno(), 65536)
                if not chunk:
                    raise AssertionError(f"exited before {pattern!r}: {self.describe()}")
                self.text += chunk.decode()
                found = re.search(pattern, self.text)
        return found

    def describe(self) -> str:
        self.out.flush()
        return f"stdout:\n{self.text}\nstderr:\n{self.log.read_text()}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.stdout.close()
        self.out.close()


def start_replay(socket: Path) -> dict[str, str]:
    async def start() -> dict[str, str]:
        async with connect(socket, client="browser-test") as client:
            return await client.start_run(
                "claude-code",
                "Create tmp/hello-allow.txt containing hello",
                driver="replay",
                options={"recording": "claude_code", "speed": 1.0},
            )

    return trio.run(start)


def test_a_run_in_the_browser_with_a_permission_clicked(workdir: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    socket = workdir / "bus.sock"
    processes: list[Process] = []

    def spawn(*args: str, log: str) -> Process:
        process = Process(*args, log=workdir / log)
        processes.append(process)
        return process

    try:
        daemon = spawn("serve", "--socket", str(socket), log="serve.log")
        daemon.wait_for(r"listening on")
        web = spawn("web", "--socket", str(socket), "--port", "0", log="web.log")
        url = web.wait_for(r"(http://127\.0\.0\.1:\d+/\?token=\S+)").group(1)
        watcher = spawn("watch", "--plain", "--socket", str(socket), log="watch.log")
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1200, "height": 900})
                errors: list[str] = []
                page.on("pageerror", lambda error: errors.append(str(error)))
                drive(page, sync_api.expect, url, socket, watcher)
                assert not errors, errors
            finally:
                browser.close()
    finally:
        for process in reversed(processes):
            process.stop()


def drive(page: Any, expect: Callable[..., Any], url: str, socket: Path, watcher: Process) -> None:
    timeout = DEADLINE * 1000
    page.goto(url)
    expect(page.get_by_test_id("connection")).to_have_attribute(
        "data-state", "live", timeout=timeout
    )
    name = page.get_by_test_id("answering-as").inner_text().removeprefix("answering as ")
    assert name.startswith("web@"), name

    run = start_replay(socket)
    view = page.locator(f"[data-testid=session-view][data-session-id='{run['session_id']}']")
    expect(view).to_be_visible(timeout=timeout)
    expect(view.get_by_test_id("session-adapter")).to_have_text("claude-code")
    expect(view.get_by_test_id("block-prompt")).to_contain_text("Create tmp/hello-allow.txt")

    # The recording streams its thinking and text, then waits on a Write permission.
    permission = view.get_by_test_id("permission")
    expect(permission).to_have_attribute("data-state", "pending", timeout=timeout)
    expect(view.get_by_test_id("block-thinking").first).to_be_visible()
    expect(view.get_by_test_id("status-line")).to_contain_text("✶", timeout=timeout)
    expect(view.get_by_test_id("run-status")).to_have_text("running")
    expect(view.get_by_test_id("cancel-run")).to_be_visible()
    expect(page.get_by_test_id("pending-count")).to_have_text("1")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "busd-web-permission.png"), full_page=True)
    allow = permission.locator("[data-testid=permission-option][data-kind^=allow]").first
    allow.click()

    resolution = permission.get_by_test_id("permission-resolution")
    expect(resolution).to_have_text(f"allowed by {name}", timeout=timeout)
    # The terminal watcher hears of the same answer, by the same name.
    watcher.wait_for(rf"⚑ Write: .*allowed by {re.escape(name)}")

    tool = view.locator("[data-testid=block-tool]").filter(has_text="Write")
    expect(tool).to_have_attribute("data-status", "ok", timeout=timeout)
    expect(view.get_by_test_id("block-text").last).to_contain_text("Created hello-allow.txt")
    summary = view.get_by_test_id("summary-line")
    expect(summary).to_contain_text("↓ 231 tokens", timeout=timeout)  # the result's exact count
    expect(summary).to_contain_text("✻ Worked for")
    expect(view.get_by_test_id("status-line")).to_be_hidden()
    expect(view.get_by_test_id("run-status")).to_have_text("ok")
    expect(view.get_by_test_id("cancel-run")).to_have_count(0)

    context = view.get_by_test_id("context-line")
    expect(context).to_contain_text("context ")
    bar = view.get_by_test_id("context-bar")
    expect(bar).to_be_visible()
    used = int(bar.get_attribute("data-used") or 0)
    assert used > 0
    for part in ("system", "tools", "messages"):
        segment = bar.get_by_test_id(f"context-{part}")
        if segment.count():
            assert int(segment.get_attribute("data-tokens") or 0) > 0

    shot = ARTIFACTS / "busd-web.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 0
