"""``busd web`` in a real headless Chromium, against real ``busd`` processes.

``busd serve``, ``busd web`` and ``busd watch --plain`` run as processes; a
replayed Claude Code run (the bundled recording, at its recorded speed) asks
for permission to use ``Write``; the permission is clicked in the page, and
the terminal watcher must see it answered by the web. The page's screenshot
is kept in ``$BUSD_TEST_ARTIFACTS`` (default ``tests/artifacts/``).

Then the attack: a page on another origin (another port of 127.0.0.1, the
same site, and of ``localhost``, another site), knowing the token, posts an
answer the ways a page can (no-cors and simple fetches, a fetch with JSON and
the token header, a form) in the browser that holds the session cookie: busd
web refuses every one and the permission stays pending in the daemon until
the real page answers it. And a ``--read-only`` page shows the request with
no button to answer it.

Playwright drives Debian's ``chromium`` (never a browser build of its own);
the test skips, saying why, when either is missing.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import msgspec
import pytest
import trio

from busd.client import connect
from busd.wire import Snapshot

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


def answered_by(outcome: str, name: str) -> re.Pattern[str]:
    """``allowed by web@host:pid (pid N)``: the name, and the pid the daemon saw."""
    return re.compile(rf"{outcome} by {re.escape(name)} \(pid \d+\)")


def drive(page: Any, expect: Callable[..., Any], url: str, socket: Path, watcher: Process) -> None:
    timeout = DEADLINE * 1000
    page.goto(url)
    # The token bought a cookie and left the address bar.
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/", page.url), page.url
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
    expect(resolution).to_have_text(answered_by("allowed", name), timeout=timeout)
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


# -- a page on another origin ----------------------------------------------------------

ATTACK = """<!doctype html>
<html><head><meta charset="utf-8"><title>cute cats</title></head><body>
<form method="POST" enctype="text/plain" action="{target}">
  <input type="hidden" name='{{"request_id": "{request_id}", "option_id": "{option_id}", "x": "'
         value='"}}'>
</form>
<script>
(async () => {{
  const target = {target_json};
  const body = JSON.stringify({{request_id: {request_id_json}, option_id: {option_id_json}}});
  const results = {{}};
  const attempt = async (name, init) => {{
    try {{
      const options = {{method: "POST", credentials: "include", body, ...init}};
      const response = await fetch(target, options);
      results[name] = `answered ${{response.type}} ${{response.status}}`;
    }} catch (error) {{
      results[name] = `failed: ${{error}}`;
    }}
  }};
  // The request of the issue: a simple text/plain POST, no CORS needed to send it.
  await attempt("no-cors", {{mode: "no-cors", headers: {{"content-type": "text/plain"}}}});
  await attempt("simple-cors", {{headers: {{"content-type": "text/plain"}}}});
  // What the page itself sends: JSON and the token header, so a preflight that fails.
  await attempt("json-cors", {{headers: {{"content-type": "application/json",
                                          "x-busd-token": {token_json}}}}});
  document.body.dataset.done = JSON.stringify(results);
}})();
</script></body></html>
"""


class AttackerSite:
    """Another origin's web server on loopback, serving one page that tries to answer."""

    def __init__(self) -> None:
        self.page = b""
        site = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/html; charset=utf-8")
                self.send_header("content-length", str(len(site.page)))
                self.end_headers()
                self.wfile.write(site.page)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def wait_for_permission(socket: Path) -> tuple[dict[str, str], dict[str, Any]]:
    """Start a replay (as fast as it goes) and return it with the permission it waits on."""

    async def start() -> tuple[dict[str, str], dict[str, Any]]:
        async with (
            connect(socket, client="browser-test") as client,
            client.subscribe(["stream.permission.requested"]) as requested,
        ):
            run = await client.start_run(
                "claude-code",
                "Create tmp/hello-allow.txt containing hello",
                driver="replay",
                options={"recording": "claude_code", "speed": 0},
            )
            with trio.fail_after(DEADLINE):
                async for batch in requested:
                    for envelope in batch.events:
                        if envelope.session_id == run["session_id"]:
                            return run, msgspec.to_builtins(envelope.event)
        raise AssertionError("the subscription ended")

    return trio.run(start)


def pending_in_daemon(socket: Path, session_id: str) -> list[str]:
    async def ask() -> list[str]:
        async with connect(socket, client="browser-test") as client:
            snapshot = await client.request(Snapshot(session_id=session_id))
        return [p["event"]["request_id"] for p in snapshot.get("permissions", [])]

    return trio.run(ask)


def attack(other: Any, url: str, expect: Callable[..., Any]) -> None:
    """Open the other origin's page: its three fetches, then its form."""
    other.goto(url)
    body = other.locator("body")
    expect(body).to_have_attribute("data-done", re.compile("."), timeout=DEADLINE * 1000)
    results = json.loads(body.get_attribute("data-done") or "")
    # Not one answer can the other page read (CORS; CORP for the no-cors one).
    assert all(r.startswith("failed") for r in results.values()), results
    with other.expect_navigation(timeout=DEADLINE * 1000):
        other.evaluate("document.forms[0].submit()")
    assert "bad_origin" in other.content()
    other.close()


def test_a_page_on_another_origin_cannot_answer_a_permission(workdir: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    expect = sync_api.expect
    timeout = DEADLINE * 1000
    socket = workdir / "bus.sock"
    processes: list[Process] = []
    attacker = AttackerSite()
    try:
        processes.append(daemon := Process("serve", "--socket", str(socket), log=workdir / "s.log"))
        daemon.wait_for(r"listening on")
        processes.append(web := Process("web", "--socket", str(socket), log=workdir / "w.log"))
        url = web.wait_for(r"(http://127\.0\.0\.1:(\d+)/\?token=(\S+))")
        port, token = int(url.group(2)), url.group(3)
        run, request = wait_for_permission(socket)
        deny = next(o["id"] for o in request["options"] if o["kind"].startswith("reject"))
        target = f"http://127.0.0.1:{port}/api/permission?token={token}"
        attacker.page = ATTACK.format(
            target=target,
            target_json=json.dumps(target),
            request_id=request["request_id"],
            request_id_json=json.dumps(request["request_id"]),
            option_id=deny,
            option_id_json=json.dumps(deny),
            token_json=json.dumps(token),
        ).encode()
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                context = browser.new_context()
                # The real page first: the browser holds the session cookie from here on.
                page = context.new_page()
                page.goto(url.group(1))
                view = page.locator(f"[data-session-id='{run['session_id']}']")
                card = view.get_by_test_id("permission")
                expect(card).to_have_attribute("data-state", "pending", timeout=timeout)
                assert re.fullmatch(r"http://127\.0\.0\.1:\d+/", page.url), page.url
                assert page.evaluate("document.cookie") == ""  # HttpOnly: no script reads it
                # 127.0.0.1:other is the same site (the SameSite=Strict cookie goes along);
                # localhost:other is another site.
                for host in ("127.0.0.1", "localhost"):
                    attack(context.new_page(), f"http://{host}:{attacker.port}/", expect)
                    assert pending_in_daemon(socket, run["session_id"]) == [request["request_id"]]
                # What reached busd web, as it logged it: refused, every one, for its origin
                # (the fetch with JSON and the token header never got past its preflight).
                refused = re.findall(r"refused (\w+) '/api/permission' \((\w+)\)", web.describe())
                expected = [("OPTIONS", "bad_origin")] * 2 + [("POST", "bad_origin")] * 6
                assert sorted(refused) == expected, web.describe()
                # The card is still there to answer, and its own page answers it.
                expect(card).to_have_attribute("data-state", "pending")
                card.locator("[data-testid=permission-option][data-kind^=allow]").first.click()
                resolution = card.get_by_test_id("permission-resolution")
                expect(resolution).to_have_text(re.compile(r"^allowed by web@"), timeout=timeout)
                assert pending_in_daemon(socket, run["session_id"]) == []
            finally:
                browser.close()
    finally:
        attacker.close()
        for process in reversed(processes):
            process.stop()


def test_a_read_only_page_shows_the_request_and_no_buttons(workdir: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    expect = sync_api.expect
    socket = workdir / "bus.sock"
    processes: list[Process] = []
    try:
        processes.append(daemon := Process("serve", "--socket", str(socket), log=workdir / "s.log"))
        daemon.wait_for(r"listening on")
        args = ("web", "--socket", str(socket), "--read-only")
        processes.append(web := Process(*args, log=workdir / "w.log"))
        url = web.wait_for(r"http://127\.0\.0\.1:\d+/\?token=\S+").group(0)
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page()
                page.goto(url)
                expect(page.get_by_test_id("answering-as")).to_have_text(
                    re.compile(r"^read-only: web@"), timeout=DEADLINE * 1000
                )
                run, _ = wait_for_permission(socket)
                view = page.locator(f"[data-session-id='{run['session_id']}']")
                card = view.get_by_test_id("permission")
                expect(card).to_have_attribute("data-state", "pending", timeout=DEADLINE * 1000)
                expect(card.get_by_test_id("permission-read-only")).to_be_visible()
                expect(card.locator("button")).to_have_count(0)
                tab = page.locator(
                    f"[data-testid=session-tab][data-session-id='{run['session_id']}']"
                )
                expect(tab.get_by_test_id("tab-state")).to_have_text("waiting for an answer")
                expect(view.get_by_test_id("run-status")).to_have_text("running")
                expect(view.get_by_test_id("cancel-run")).to_have_count(0)
            finally:
                browser.close()
    finally:
        for process in reversed(processes):
            process.stop()


RECORD_LIVE = """
window.namesWhenLive = [];
new MutationObserver((records) => {
  for (const record of records) {
    if (record.target.id === "connection" && record.target.dataset.state === "live") {
      const name = document.getElementById("answering-as");
      window.namesWhenLive.push(name === null ? "" : name.textContent);
    }
  }
}).observe(document, { attributes: true, attributeFilter: ["data-state"], subtree: true });
"""
"""Records what "answering as" said each time the badge turned "live".

It watches the whole document from before the page's own script runs: the
snapshot can arrive, and the badge turn live, before ``DOMContentLoaded``
(a busy machine once made an observer installed then miss it).
"""


def test_the_page_says_when_busd_web_has_lost_the_daemon(workdir: Path) -> None:
    """ "live" means the page reaches the daemon, not only busd web (issue 19)."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    expect = sync_api.expect
    socket = workdir / "bus.sock"
    processes: list[Process] = []
    try:
        processes.append(daemon := Process("serve", "--socket", str(socket), log=workdir / "s.log"))
        daemon.wait_for(r"listening on")
        processes.append(web := Process("web", "--socket", str(socket), log=workdir / "w.log"))
        url = web.wait_for(r"http://127\.0\.0\.1:\d+/\?token=\S+").group(0)
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page()
                page.add_init_script(RECORD_LIVE)
                page.goto(url)
                badge = page.get_by_test_id("connection")
                expect(badge).to_have_attribute("data-state", "live", timeout=DEADLINE * 1000)
                # "live" is never shown before the snapshot: the name is there with it.
                names = page.evaluate("window.namesWhenLive")
                assert names, "the badge never turned live"
                assert all(name.startswith("answering as web@") for name in names), names
                live_colour = badge.evaluate("node => getComputedStyle(node).color")
                daemon.stop()
                expect(badge).to_have_attribute(
                    "data-state", "daemon-gone", timeout=DEADLINE * 1000
                )
                expect(badge).to_have_text(re.compile(r"^daemon gone \(shutdown.*reconnecting…$"))
                gone_colour = badge.evaluate("node => getComputedStyle(node).color")
                assert gone_colour != live_colour  # not the green of "live"
                ARTIFACTS.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(ARTIFACTS / "busd-web-daemon-gone.png"), full_page=True)
                page.reload()  # a page opened while the daemon is away learns it at once
                expect(badge).to_have_attribute(
                    "data-state", "daemon-gone", timeout=DEADLINE * 1000
                )
                processes.append(Process("serve", "--socket", str(socket), log=workdir / "s2.log"))
                processes[-1].wait_for(r"listening on")
                expect(badge).to_have_attribute("data-state", "live", timeout=DEADLINE * 1000)
                names = page.evaluate("window.namesWhenLive")
                assert names, "the badge never turned live"
                assert all(name.startswith("answering as web@") for name in names), names
            finally:
                browser.close()
    finally:
        for process in reversed(processes):
            process.stop()
