"""What the ``busd web`` page shows a new user, in a real headless Chromium (issue 19).

``busd serve`` and ``busd web`` run as processes; the sessions come from the
bundled recordings played by the replay driver and from the SDK fixtures fed
through ``busd ingest``, so the page draws exactly what real adapters give the
daemon. Each test is one thing a user meets: the context of a model whose
window busd does not know (no bar, "window unknown": the screenshot is
checked pixel by pixel), the sidebar (a label, a state and the agent and
model of each session, on lines that never wrap), which session the page
opens (the one that needs the user, else the latest; then the user's
choice), and tool calls written as ``busd watch`` writes them. Screenshots
go to ``$BUSD_TEST_ARTIFACTS`` (default ``tests/artifacts/``).
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio

from busd.client import Client, connect
from busd.core.events import (
    PermissionRequested,
    RunFinished,
    SessionStart,
    TextDelta,
)

from .test_web_browser import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, DEADLINE, Process

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "sdk"
TIMEOUT = DEADLINE * 1000  # playwright's milliseconds

# Session ids in the SDK fixtures (the raw events carry them).
COPILOT = "4db6a695-04ee-466f-b26b-74dae52ad74c"
OPENCODE = "ses_43ad8482affef0ocxqD4UJi3Ym"
ACP = "sess_abc123def456"
OPENCODE_ACP = "ses_de9e1abe4ffezIlFenFTQCB6bP"
RECORDINGS = ("acp", "claude_code", "copilot", "opencode")

pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason=f"no chromium at {CHROMIUM} (apt-get install chromium)"
)


@dataclass
class Bus:
    """A ``busd serve`` and a ``busd web`` on it, and the browser pages opened on the web."""

    workdir: Path
    expect: Callable[..., Any]
    browser: Any = None
    url: str = ""
    processes: list[Process] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    """Script errors of every page opened: none is expected."""

    @property
    def socket(self) -> Path:
        return self.workdir / "bus.sock"

    def spawn(self, *args: str) -> Process:
        process = Process(*args, log=self.workdir / f"{args[0]}-{len(self.processes)}.log")
        self.processes.append(process)
        return process

    def ingest(self, sdk: str, path: Path) -> None:
        """``busd ingest``: returns once the daemon has every event."""
        command = [sys.executable, "-m", "busd", "ingest", "--socket", str(self.socket)]
        done = subprocess.run(
            [*command, "--sdk", sdk, str(path)], capture_output=True, text=True, timeout=DEADLINE
        )
        assert done.returncode == 0, done.stderr
        assert "ingested" in done.stderr, done.stderr

    def shown(self, session_id: str, state: str) -> None:
        """Wait until busd web holds ``session_id`` in ``state`` (what a new page would get)."""
        url = urllib.parse.urlsplit(self.url)
        token = urllib.parse.parse_qs(url.query)["token"][0]
        request = urllib.request.Request(
            f"http://{url.netloc}/api/sessions", headers={"x-busd-token": token}
        )
        deadline = time.monotonic() + DEADLINE
        while True:
            with urllib.request.urlopen(request, timeout=DEADLINE) as response:
                views = {view["session_id"]: view for view in json.load(response)["sessions"]}
            if views.get(session_id, {}).get("state") == state:
                return
            assert time.monotonic() < deadline, f"{session_id} is not {state}: {views}"
            time.sleep(0.05)  # polling an external program, with a deadline

    def page(self) -> Any:
        """A new page on the printed URL, once it is live."""
        page = self.browser.new_page(viewport={"width": 1200, "height": 800})
        page.on("pageerror", lambda error: self.errors.append(str(error)))
        page.goto(self.url)
        self.expect(page.get_by_test_id("connection")).to_have_attribute(
            "data-state", "live", timeout=TIMEOUT
        )
        return page

    def run(self, func: Callable[[Client], Any]) -> Any:
        """``func(client)`` on a connection of its own, from this (synchronous) test."""

        async def main() -> Any:
            async with connect(self.socket, client="page-test") as client:
                return await func(client)

        return trio.run(main)


@pytest.fixture
def bus() -> Iterator[Bus]:
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    workdir = Path(tempfile.mkdtemp(prefix="busd-webpage-", dir="/tmp"))
    bus = Bus(workdir, sync_api.expect)
    try:
        bus.spawn("serve", "--socket", str(bus.socket)).wait_for(r"listening on")
        web = bus.spawn("web", "--socket", str(bus.socket))
        bus.url = web.wait_for(r"http://127\.0\.0\.1:\d+/\?token=\S+").group(0)
        with sync_api.sync_playwright() as playwright:
            bus.browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                yield bus
            finally:
                bus.browser.close()
        assert not bus.errors, bus.errors
    finally:
        for process in reversed(bus.processes):
            process.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def shot(target: Any, name: str) -> bytes:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return bytes(target.screenshot(path=str(ARTIFACTS / name)))


def tab(page: Any, session_id: str) -> Any:
    return page.locator(f"[data-testid=session-tab][data-session-id='{session_id}']")


def view_of(page: Any, session_id: str) -> Any:
    return page.locator(f"[data-testid=session-view][data-session-id='{session_id}']")


def selected(page: Any) -> str:
    """The session the page shows (once it shows one)."""
    view = page.get_by_test_id("session-view")
    view.wait_for(state="visible", timeout=TIMEOUT)
    return str(view.get_attribute("data-session-id"))


def recording(name: str) -> dict[str, Any]:
    """A bundled recording's header: its adapter and the prompt that produced it."""
    path = ROOT / "busd" / "data" / "recordings" / f"{name}.jsonl"
    header: dict[str, Any] = json.loads(path.read_text().partition("\n")[0])
    return header


async def replay(client: Client, name: str, *, then: str = "wait") -> dict[str, str]:
    """Play a bundled recording as fast as it goes, up to its first permission request:
    ``then`` is ``wait`` (leave it pending), ``allow`` (every request, to the end) or
    ``cancel`` (the run). A run that fails first returns then too."""
    header = recording(name) if name in RECORDINGS else {"adapter": "acp", "prompt": name}
    async with client.subscribe(["stream.permission.requested", "busd.run.finished"]) as events:
        run = await client.start_run(
            header["adapter"],
            header["prompt"],
            driver="replay",
            options={"recording": name, "speed": 0},
        )
        with trio.fail_after(DEADLINE):
            async for batch in events:
                for envelope in batch.events:
                    event = envelope.event
                    if envelope.run_id != run["run_id"]:
                        continue
                    if isinstance(event, RunFinished) or then == "wait":
                        return run
                    if then == "cancel":
                        await client.cancel_run(run["run_id"])
                    elif isinstance(event, PermissionRequested):
                        await client.reply_permission(event.request_id, allow=True)
    raise AssertionError("the subscription ended")


# -- the context of a model whose window busd does not know ---------------------------


def png_rows(data: bytes) -> tuple[int, list[bytes]]:
    """Bytes per pixel and the rows of an 8-bit, non-interlaced RGB(A) PNG (Chromium's)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, bytearray(), None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        chunk = data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat += chunk
    assert header is not None
    width, height, depth, colour, _, _, interlace = header
    assert (depth, interlace) == (8, 0), header
    assert colour in (2, 6), header
    bpp = 3 if colour == 2 else 4
    raw, stride = zlib.decompress(bytes(idat)), width * bpp
    rows, prev = [], bytearray(stride)
    for y in range(height):
        kind, line = (
            raw[y * (stride + 1)],
            bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)]),
        )
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return bpp, rows


BAR_COLOURS = {  # app.css: --system, --tools, --messages, --other
    "system": (0xC6, 0x78, 0xDD),
    "tools": (0x61, 0xAF, 0xEF),
    "messages": (0x98, 0xC3, 0x79),
    "other": (0xAB, 0xB2, 0xBF),
}


def bar_pixels(png: bytes) -> dict[str, int]:
    """How many pixels of each context-bar colour a screenshot has."""
    bpp, rows = png_rows(png)
    counts = dict.fromkeys(BAR_COLOURS, 0)
    for row in rows:
        for x in range(0, len(row), bpp):
            r, g, b = row[x], row[x + 1], row[x + 2]
            for name, (cr, cg, cb) in BAR_COLOURS.items():
                if abs(r - cr) <= 8 and abs(g - cg) <= 8 and abs(b - cb) <= 8:
                    counts[name] += 1
    return counts


def test_a_model_without_a_known_window_gets_no_bar_but_its_count(bus: Bus) -> None:
    """The bar was drawn 100% full when busd did not know the window (issue 19)."""
    unknown = bus.workdir / "opencode-mystery.jsonl"
    text = (FIXTURES / "opencode.jsonl").read_text()
    unknown.write_text(
        text.replace("claude-sonnet-4-5", "mystery-model-7").replace(OPENCODE, "ses_mystery")
    )
    bus.ingest("opencode", FIXTURES / "opencode.jsonl")  # the same run, on a model busd knows
    bus.ingest("opencode", unknown)
    page = bus.page()
    expect = bus.expect

    tab(page, "ses_mystery").click()
    view = view_of(page, "ses_mystery")
    context = view.get_by_test_id("context")
    line = context.get_by_test_id("context-line")
    expect(line).to_contain_text("window unknown", timeout=TIMEOUT)
    words = line.inner_text().split(" · ")
    assert words[0] == "context 21.7k", words  # what it holds, and of nothing known
    assert words[1:3] == ["window unknown", "messages 21.7k"], words  # then cache and estimates
    expect(context.get_by_test_id("context-bar")).to_have_count(0)
    assert "[context.windows]" in (
        context.get_by_test_id("window-unknown").get_attribute("title") or ""
    )
    shot(page, "busd-web-window-unknown.png")
    assert bar_pixels(bytes(context.screenshot())) == dict.fromkeys(BAR_COLOURS, 0)

    # The same session on a known model: its bar, which the pixel count does see.
    tab(page, OPENCODE).click()
    known = view_of(page, OPENCODE)
    expect(known.get_by_test_id("context-line")).to_have_text(
        re.compile(r"^context 21\.7k / 200\.0k \(10%\)")
    )
    bar = known.get_by_test_id("context-bar")
    width = bar.bounding_box()["width"]
    messages = bar_pixels(bytes(known.get_by_test_id("context").screenshot()))["messages"]
    assert messages >= 0.08 * width * 8, messages  # about a tenth of the bar, 8+ pixels high


# -- the sidebar -------------------------------------------------------------------------

LONG_MODEL = "anthropic/claude-sonnet-4-5-20250929-with-a-very-long-deployment-name"


def test_each_tab_says_what_the_session_is_which_agent_and_what_it_is_doing(bus: Bus) -> None:
    """Tabs showed a dot and a badge: no title, no done or cancelled (issue 19)."""
    waiting = bus.run(lambda c: replay(c, "claude_code"))
    done = bus.run(lambda c: replay(c, "copilot", then="allow"))
    cancelled = bus.run(lambda c: replay(c, "opencode", then="cancel"))
    failed = bus.run(lambda c: replay(c, "no-such-recording"))

    async def agent_at_work(client: Client) -> None:  # an agent busd did not start, working
        async with connect(bus.socket, client="an-agent", role="agent") as agent:
            await agent.publish(SessionStart(model=LONG_MODEL), session_id="agent-at-work")
            await agent.publish(TextDelta(message_id="m", text="on it"), session_id="agent-at-work")
            await agent.publish(SessionStart(cwd="/tmp"), session_id="quiet")  # no model, no work
            await agent.flush()

    bus.run(agent_at_work)
    page = bus.page()
    expect = bus.expect

    expected = [  # session, label, state, agent · model
        (
            waiting,
            recording("claude_code")["prompt"],
            "waiting for you",
            "claude-code · claude-haiku-4-5-20251001",
        ),
        (done, recording("copilot")["prompt"], "done", "copilot · claude-sonnet-4.5"),
        (cancelled, recording("opencode")["prompt"], "cancelled", "opencode · claude-sonnet-4-5"),
        (failed, "no-such-recording", "failed", "acp"),
        ({"session_id": "agent-at-work"}, "agent-at-work", "running", LONG_MODEL),
        ({"session_id": "quiet"}, "quiet", "idle", "no agent or model reported"),
    ]
    for run, label, state, agent in expected:
        entry = tab(page, run["session_id"])
        expect(entry.get_by_test_id("tab-state")).to_have_text(state, timeout=TIMEOUT)
        expect(entry.get_by_test_id("tab-title")).to_have_text(label)
        expect(entry.get_by_test_id("tab-model")).to_have_text(agent)
        if state != "idle":
            expect(entry.get_by_test_id("tab-model")).to_have_attribute("title", agent)
    expect(tab(page, waiting["session_id"]).get_by_test_id("pending-count")).to_have_text("1")
    # Opened: the session that waits for you, its tool call not yet started (no timer).
    assert selected(page) == waiting["session_id"]
    call = view_of(page, waiting["session_id"]).get_by_test_id("block-tool")
    expect(call.get_by_test_id("tool-status")).to_have_text("waiting for an answer")
    expect(call.get_by_test_id("timer")).to_have_count(0)
    error = tab(page, failed["session_id"]).get_by_test_id("tab-state").get_attribute("title") or ""
    assert error.startswith("ReplayError: "), error

    # One line each, cut with an ellipsis where too long, in tabs of one height.
    lines = page.eval_on_selector_all(
        "[data-testid=session-tab] > span:not(.tab-dot)",
        """spans => spans.map(span => ({
            text: span.textContent,
            lines: Math.round(span.getBoundingClientRect().height
                              / parseFloat(getComputedStyle(span).lineHeight)),
            cut: span.scrollWidth > span.clientWidth,
            ellipsis: getComputedStyle(span).textOverflow,
        }))""",
    )
    assert {line["lines"] for line in lines} == {1}, lines
    cut = {line["text"] for line in lines if line["cut"]}
    assert "claude-code · claude-haiku-4-5-20251001" in cut, lines
    assert LONG_MODEL in cut, lines
    assert all(line["ellipsis"] == "ellipsis" for line in lines if line["cut"]), lines
    heights = {round(tab(page, run["session_id"]).bounding_box()["height"]) for run, *_ in expected}
    assert len(heights) == 1, heights
    shot(page.locator("#sessions"), "busd-web-sidebar.png")
    shot(page, "busd-web-sessions.png")


# -- which session the page opens ----------------------------------------------------------


def test_the_page_opens_the_session_that_needs_you_and_keeps_your_choice(bus: Bus) -> None:
    """The session opened first varied with the events' timing (issue 19)."""
    expect = bus.expect
    bus.ingest("copilot", FIXTURES / "copilot.jsonl")
    bus.ingest("opencode", FIXTURES / "opencode.jsonl")
    bus.shown(OPENCODE, "done")
    first = bus.page()
    assert selected(first) == OPENCODE  # nobody waits: the latest active
    for _ in range(3):
        first.reload()
        assert selected(first) == OPENCODE

    asking = bus.run(lambda c: replay(c, "claude_code"))["session_id"]
    following = view_of(first, asking)
    expect(following).to_be_visible(timeout=TIMEOUT)  # it asks: the page goes there
    bus.ingest("acp", FIXTURES / "acp.jsonl")  # later, but wants nothing
    expect(tab(first, ACP)).to_be_visible(timeout=TIMEOUT)
    second = bus.page()
    assert selected(second) == asking == selected(first)

    # Answering in a session is choosing it: the next request elsewhere does not move it,
    # where the page that did not choose follows the work as busd watch does.
    card = second.get_by_test_id("permission")
    card.locator("[data-testid=permission-option][data-kind^=allow]").first.click()
    expect(card).to_have_attribute("data-state", "allowed", timeout=TIMEOUT)
    assert second.url.endswith(f"#{asking}")
    other = bus.run(lambda c: replay(c, "copilot"))["session_id"]
    expect(view_of(first, other)).to_be_visible(timeout=TIMEOUT)
    new_tab = tab(second, other)
    expect(new_tab).to_have_attribute("data-state", "waiting", timeout=TIMEOUT)
    assert selected(second) == asking

    # A tab clicked stays open, through a reload too (the address keeps it).
    tab(second, COPILOT).click()
    expect(view_of(second, COPILOT)).to_be_visible()
    second.reload()
    expect(view_of(second, COPILOT)).to_be_visible(timeout=TIMEOUT)
    expect(tab(second, COPILOT)).to_have_attribute("aria-current", "true")
    # A new page, without the address: the one that waits.
    assert selected(bus.page()) == other


# -- tool calls ----------------------------------------------------------------------------


def test_tool_calls_read_as_busd_watch_writes_them(bus: Bus) -> None:
    """An ACP tool call's input was raw JSON where the terminal shows write(path) (issue 19)."""
    watcher = bus.spawn("watch", "--plain", "--socket", str(bus.socket))
    run = bus.run(lambda c: replay(c, "acp", then="allow"))  # what busd demo plays
    bus.ingest("acp", FIXTURES / "acp-opencode-acp.jsonl")  # an input without a path
    page = bus.page()
    expect = bus.expect
    for session_id in (run["session_id"], OPENCODE_ACP):
        watcher.wait_for(rf"\[{re.escape(session_id)}\] ✻ ")  # the summary: every tool printed
        terminal = re.findall(rf"^\[{re.escape(session_id)}\] ⏺ (.*)$", watcher.text, re.M)
        tab(page, session_id).click()
        view = view_of(page, session_id)
        calls = view.get_by_test_id("tool-call")
        expect(calls).to_have_count(len(terminal), timeout=TIMEOUT)
        assert calls.all_text_contents() == terminal
        assert not any("{" in call for call in terminal), terminal
    assert terminal == ["bash(cwd=/tmp/rec/ocproj)"]

    tab(page, run["session_id"]).click()
    view = view_of(page, run["session_id"])
    expect(view.get_by_test_id("tool-call").first).to_have_text("write(/tmp/p4/p4-check.txt)")
    request = view.get_by_test_id("permission").first
    expect(request.get_by_test_id("permission-input")).to_have_text("/tmp/p4/p4-check.txt")
    shot(page, "busd-web-acp-tools.png")
