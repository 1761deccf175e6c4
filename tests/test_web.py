"""``busd web`` in-process: a real daemon and the web bridge on real sockets, spoken to over HTTP.

The runs are replays of the bundled Claude Code recording (``driver="replay"``)
through the real ``claude-code`` adapter, so what the browser would draw comes
from exactly what a live run gives the daemon. The page itself is exercised in
a real Chromium by ``test_web_browser.py``; what the bridge refuses (other
hosts, other origins, simple requests, the URL's token after the exchange)
is ``test_web_security.py``.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import h11
import pytest
import trio

from busd.client import Client, connect
from busd.core.events import (
    Envelope,
    Event,
    PermissionRequested,
    PermissionResolved,
    RunFinished,
    RunStarted,
    SessionIdle,
    SessionTitleChanged,
    StreamingStats,
    TextDelta,
    ToolStart,
)
from busd.daemon.hub import DaemonConfig
from busd.frontends.tui import PlainLog
from busd.frontends.view import Views
from busd.frontends.web import Browser, WebBridge, page_view, serve_web
from busd.plugins.manager import PluginManager

from .daemon_helpers import running_daemon

WEB_NAME = "web@test"
DEADLINE = 20.0


@pytest.fixture
def sock_path() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="busd-web-", dir="/tmp"))
    yield directory / "bus.sock"
    shutil.rmtree(directory, ignore_errors=True)


def plugins() -> PluginManager:
    manager = PluginManager(environ={})
    manager.load_entry_points()  # the claude-code adapter the recording plays through
    return manager


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode()

    def json(self) -> Any:
        return json.loads(self.body)


Headers = dict[str, str | None]
"""Request headers by lowercase name; ``None`` leaves out one sent by default."""


class Http:
    """HTTP/1.1 with h11 (hypercorn's own parser) over a trio socket per request."""

    def __init__(self, port: int, address: str = "127.0.0.1") -> None:
        self.port = port
        self.address = address

    async def open(
        self, method: str, target: str, body: bytes = b"", headers: Headers | None = None
    ) -> tuple[trio.SocketStream, h11.Connection, h11.Response]:
        stream = await trio.open_tcp_stream(self.address, self.port)
        conn = h11.Connection(h11.CLIENT)
        given: Headers = {"host": f"{self.address}:{self.port}", "connection": "close"}
        given.update(headers or {})
        fields = [(name, value) for name, value in given.items() if value is not None]
        if method == "POST":
            fields.append(("content-length", str(len(body))))
        data = conn.send(h11.Request(method=method, target=target, headers=fields)) or b""
        if body:
            data += conn.send(h11.Data(data=body)) or b""
        data += conn.send(h11.EndOfMessage()) or b""
        await stream.send_all(data)
        response = await self.next_event(stream, conn)
        assert isinstance(response, h11.Response), response
        return stream, conn, response

    @staticmethod
    async def next_event(stream: trio.SocketStream, conn: h11.Connection) -> object:
        while True:
            event = conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            conn.receive_data(await stream.receive_some(1 << 16))

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        body: bytes = b"",
        headers: Headers | None = None,
    ) -> Reply:
        target = path + (f"?{urlencode(params)}" if params else "")
        stream, conn, response = await self.open(method, target, body, headers)
        content = bytearray()
        async with stream:
            while not isinstance(event := await self.next_event(stream, conn), h11.EndOfMessage):
                assert isinstance(event, h11.Data), event
                content += event.data
        fields = {k.decode(): v.decode() for k, v in response.headers}
        return Reply(response.status_code, fields, bytes(content))

    async def get(self, path: str, **kwargs: Any) -> Reply:
        return await self.request("GET", path, **kwargs)

    async def post(self, path: str, **kwargs: Any) -> Reply:
        return await self.request("POST", path, **kwargs)


@dataclass
class Web:
    bridge: WebBridge
    http: Http
    client: Client  # another frontend, to start runs and watch the bus
    agent: Client  # an agent, to publish what a run would

    @property
    def token(self) -> dict[str, str]:
        """The printed URL's query: it buys the cookie on ``/``, and nothing else."""
        return {"token": self.bridge.token}

    @property
    def auth(self) -> Headers:
        """What a script sends instead of the cookie."""
        return {"x-busd-token": self.bridge.token}

    @property
    def origin(self) -> str:
        return f"http://{self.http.address}:{self.bridge.port}"

    def page(self, **headers: str | None) -> Headers:
        """The headers of a POST from the bridge's own page, changed by ``headers``."""
        sent: Headers = {"origin": self.origin, "content-type": "application/json", **self.auth}
        sent.update((name.replace("_", "-"), value) for name, value in headers.items())
        return sent

    async def post(self, path: str, body: object, **headers: str | None) -> Reply:
        data = json.dumps(body).encode()
        return await self.http.post(path, body=data, headers=self.page(**headers))


@asynccontextmanager
async def web_server(
    sock_path: Path,
    *,
    read_only: bool = False,
    host: str = "127.0.0.1",
    config: DaemonConfig | None = None,
) -> AsyncIterator[Web]:
    async with (
        running_daemon(sock_path, config, plugins=plugins()),
        trio.open_nursery() as nursery,
    ):
        bridge: WebBridge = await nursery.start(
            partial(serve_web, sock_path, name=WEB_NAME, read_only=read_only, host=host)
        )
        async with (
            connect(sock_path, client="other-frontend") as client,
            connect(sock_path, client="an-agent", role="agent") as agent,
        ):
            yield Web(bridge, Http(bridge.port, host), client, agent)
        bridge.stop()


IDENTITY = r"(\[pid=\d+,uid=\d+\]| \(pid \d+(, uid \d+)?\))"
"""What follows a client's name in ``by``: the daemon's label, or the views' ``(pid N)``."""


def by_web(by: str | None) -> bool:
    """Whether ``by`` names the bridge: ``web@test[pid=…,uid=…]``, or ``web@test (pid …)``."""
    return by is not None and re.fullmatch(re.escape(WEB_NAME) + IDENTITY, by) is not None


async def folded(bridge: WebBridge, session_id: str) -> None:
    """Return once the bridge has folded an event of ``session_id`` (told as browsers are)."""
    watcher = Browser()
    bridge.browsers.add(watcher)
    try:
        with trio.fail_after(DEADLINE):
            while session_id not in bridge.views.sessions:
                await watcher.wake.wait()
                watcher.take()
    finally:
        bridge.browsers.discard(watcher)


@dataclass
class EventStream:
    """A browser's view of ``/events``: the sessions as the last events left them."""

    stream: trio.SocketStream
    conn: h11.Connection
    buffer: bytes = b""
    sessions: dict[str, dict[str, Any]] = field(default_factory=dict)
    events: list[tuple[str, Any]] = field(default_factory=list)

    async def next(self) -> tuple[str, Any]:
        while True:
            head, sep, rest = self.buffer.partition(b"\n\n")
            if not sep:
                event = await Http.next_event(self.stream, self.conn)
                assert isinstance(event, h11.Data), f"the event stream ended: {event}"
                self.buffer += event.data
                continue
            self.buffer = rest
            fields = dict(line.split(b": ", 1) for line in head.split(b"\n") if b": " in line)
            if b"data" in fields:
                break
        event = (fields.get(b"event", b"message").decode(), json.loads(fields[b"data"]))
        self.events.append(event)
        self._apply(*event)
        return event

    def _apply(self, name: str, data: Any) -> None:
        if name == "snapshot":
            self.sessions = {view["session_id"]: view for view in data["sessions"]}
        elif name == "session":
            self.sessions[data["session_id"]] = data
        elif name == "status" and data["session_id"] in self.sessions:
            self.sessions[data["session_id"]].update(
                {key: data[key] for key in ("busy", "status_line", "summary_line")}
            )

    async def wait_for(self, what: str, check: Callable[[dict[str, dict[str, Any]]], Any]) -> Any:
        """The first truthy ``check(sessions)``; fails with the last state seen."""
        try:
            with trio.fail_after(DEADLINE):
                while not (found := check(self.sessions)):
                    await self.next()
                return found
        except trio.TooSlowError:
            raise AssertionError(f"no {what} within {DEADLINE}s; last: {self.sessions}") from None


@asynccontextmanager
async def event_stream(web: Web, headers: Headers | None = None) -> AsyncIterator[EventStream]:
    stream, conn, response = await web.http.open("GET", "/events", headers=headers or web.auth)
    async with stream:
        assert response.status_code == 200
        assert dict(response.headers)[b"content-type"] == b"text/event-stream"
        yield EventStream(stream, conn)


def blocks(view: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [block for block in view["main"]["blocks"] if block["kind"] == kind]


def pending_permission(sessions: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    for view in sessions.values():
        for block in blocks(view, "permission"):
            if block["state"] == "pending":
                return block
    return None


async def start_replay(web: Web, speed: float = 0) -> dict[str, str]:
    return await web.client.start_run(
        "claude-code",
        "Create tmp/hello-allow.txt containing hello",
        driver="replay",
        options={"recording": "claude_code", "speed": speed},
    )


# -- access ------------------------------------------------------------------------


async def test_every_route_with_data_wants_the_cookie_or_the_token_header(
    sock_path: Path,
) -> None:
    async with web_server(sock_path) as web:
        http = web.http
        for path in ("/", "/events", "/api/sessions"):
            for headers in ({}, {"x-busd-token": "wrong"}, {"x-busd-token": web.bridge.token[:-1]}):
                response = await http.get(path, headers=headers)
                assert response.status == 403, (path, headers)
                assert response.json()["error"] == "unauthorized"
        for path in ("/api/permission", "/api/cancel"):
            body = b'{"run_id": "r", "request_id": "q"}'
            response = await http.post(path, body=body, headers=web.page(x_busd_token=None))
            assert (response.status, response.json()["error"]) == (403, "unauthorized")
        assert web.bridge.url.endswith(f"/?token={web.bridge.token}")
        assert web.bridge.url.startswith("http://127.0.0.1:")
        # The printed URL's token buys the cookie, then the page loads by the cookie.
        exchange = await http.get("/", params=web.token)
        assert (exchange.status, exchange.headers["location"]) == (303, "/")
        cookie = exchange.headers["set-cookie"].partition(";")[0]
        page = await http.get("/", headers={"cookie": cookie})
        assert page.status == 200
        assert "/static/app.js" in page.text
        assert page.headers["referrer-policy"] == "no-referrer"
        by_header = await http.get("/api/sessions", headers=web.auth)
        assert by_header.status == 200
        # The page's own code and style carry no data: they load without it.
        script = await http.get("/static/app.js")
        assert script.status == 200
        assert script.headers["content-type"].startswith("text/javascript")


# -- the stream ----------------------------------------------------------------------


async def test_a_late_page_gets_the_history_then_the_updates(sock_path: Path) -> None:
    async with web_server(sock_path) as web:
        await web.agent.publish(TextDelta(message_id="m1", text="hello "), session_id="early")
        await web.agent.flush()
        # The bridge has folded it before the page connects: the first event has it.
        await folded(web.bridge, "early")
        async with event_stream(web) as stream:
            name, data = await stream.next()
            assert name == "snapshot"
            assert data["name"] == WEB_NAME
            (early,) = data["sessions"]
            assert blocks(early, "text")[0]["text"] == "hello "
            await web.agent.publish(TextDelta(message_id="m1", text="world"), session_id="early")
            text = await stream.wait_for(
                "the second delta",
                lambda s: blocks(s["early"], "text")[0]["text"] == "hello world",
            )
            assert text


async def test_a_replayed_run_streams_and_ends_with_its_summary(sock_path: Path) -> None:
    async with web_server(sock_path) as web, event_stream(web) as stream:
        run = await start_replay(web)
        session = run["session_id"]
        request = await stream.wait_for("the permission request", pending_permission)
        assert request["tool"] == "Write"
        assert [o["id"] for o in request["options"]]
        view = stream.sessions[session]
        assert view["adapter"] == "claude-code"
        assert view["run_status"] == "running"
        assert blocks(view, "prompt")[0]["text"].startswith("Create tmp/hello-allow.txt")
        assert blocks(view, "thinking"), "the recording thinks first"
        allow = next(o for o in request["options"] if o["kind"].startswith("allow"))
        reply = await web.post(
            "/api/permission",
            {"session_id": session, "request_id": request["request_id"], "option_id": allow["id"]},
        )
        assert reply.status == 200, reply.text
        view = await stream.wait_for(
            "the summary", lambda s: s[session]["summary_line"] and s[session]
        )
        assert view["run_status"] == "ok"
        assert view["status_line"] is None
        assert "↓ 231 tokens" in view["summary_line"]  # the result line's exact count
        (tool,) = blocks(view, "tool")
        assert (tool["name"], tool["status"]) == ("Write", "ok")
        (permission,) = blocks(view, "permission")
        assert permission["state"] == "allowed"
        assert by_web(permission["by"]), permission
        assert view["context"]["used"] > 0
        assert view["context_line"].startswith("context ")
        assert "Created hello-allow.txt" in "".join(b["text"] for b in blocks(view, "text"))


async def test_the_status_line_ticks_while_busy(sock_path: Path) -> None:
    async with web_server(sock_path) as web, event_stream(web) as stream:
        run = await start_replay(web)  # waits at its permission request, busy
        session = run["session_id"]
        await stream.wait_for("the permission request", pending_permission)
        line = await stream.wait_for("a status line", lambda s: s[session]["status_line"])
        assert line.startswith("✶ ")
        # The run waits for its answer, and the line keeps coming (once a second at least).
        _, data = await stream.wait_for(
            "a status event",
            lambda s: stream.events[-1][0] == "status" and stream.events[-1],
        )
        assert data["session_id"] == session
        assert data["status_line"].startswith("✶ ")
        await web.client.cancel_run(run["run_id"])


# -- answering from the web ----------------------------------------------------------


async def test_a_permission_answered_on_the_web_is_resolved_for_everyone(sock_path: Path) -> None:
    async with (
        web_server(sock_path) as web,
        web.client.subscribe(["stream.permission.resolved"]) as resolved,
        event_stream(web) as stream,
    ):
        await start_replay(web)
        request = await stream.wait_for("the permission request", pending_permission)
        body = {"request_id": request["request_id"], "option_id": request["options"][0]["id"]}
        reply = await web.post("/api/permission", body)
        assert reply.status == 200, reply.text
        assert reply.json()["ok"] is True
        assert by_web(reply.json()["decision"]["by"]), reply.json()
        with trio.fail_after(DEADLINE):
            batch = await resolved.__anext__()
        event = batch.events[0].event
        assert isinstance(event, PermissionResolved)
        assert event.request_id == request["request_id"]
        assert by_web(event.by), event
        again = await web.post("/api/permission", body)
        assert again.status == 409
        error = again.json()
        assert error["ok"] is False
        assert error["error"] == "already_resolved"
        assert WEB_NAME in error["message"]


async def test_cancel_from_the_web(sock_path: Path) -> None:
    async with web_server(sock_path) as web, event_stream(web) as stream:
        run = await start_replay(web)
        await stream.wait_for("the permission request", pending_permission)
        reply = await web.post("/api/cancel", {"run_id": run["run_id"]})
        assert reply.status == 200, reply.text
        assert reply.json() == {"ok": True, "run_id": run["run_id"]}
        view = await stream.wait_for(
            "the cancelled run",
            lambda s: s[run["session_id"]]["run_status"] == "cancelled" and s[run["session_id"]],
        )
        assert by_web(view["cancelled_by"]), view
        assert blocks(view, "permission")[0]["state"] == "cancelled"
        again = await web.post("/api/cancel", {"run_id": run["run_id"]})
        assert (again.status, again.json()["error"]) == (409, "run_finished")
        unknown = await web.post("/api/cancel", {"run_id": "nope"})
        assert (unknown.status, unknown.json()["error"]) == (404, "unknown_run")


async def test_bad_requests_get_a_clear_error_and_nothing_else_is_lost(sock_path: Path) -> None:
    async with web_server(sock_path) as web:
        http = web.http
        cases: list[tuple[str, bytes, int, str]] = [
            ("/api/permission", b"not json", 400, "not JSON"),
            ("/api/permission", b"[1, 2]", 400, "invalid body"),
            ("/api/permission", b"{}", 400, "request_id"),
            ("/api/permission", b'{"request_id": 7, "allow": true}', 400, "request_id"),
            ("/api/permission", b'{"request_id": "r"}', 400, "option_id or allow"),
            ("/api/permission", b'{"request_id": "r/1", "allow": true}', 404, "no pending"),
            ("/api/cancel", b'{"reason": "x"}', 400, "run_id"),
            ("/api/cancel", b"x" * (70 << 10), 413, "over"),
        ]
        for path, body, status, words in cases:
            response = await http.post(path, body=body, headers=web.page())
            assert response.status == status, (path, body[:40], response.text)
            error = response.json()
            assert error["ok"] is False
            assert words in error["message"], error
        wrong_method = await http.get("/api/permission", headers=web.auth)
        assert wrong_method.status == 405
        missing = await http.get("/nope", headers=web.auth)
        assert missing.status == 404
        # Still serving, still connected to the daemon.
        async with event_stream(web) as stream:
            await web.agent.publish(TextDelta(message_id="m", text="still here"), session_id="s")
            await stream.wait_for("the event", lambda s: "s" in s)


# -- slow browsers -------------------------------------------------------------------


async def test_a_browser_that_does_not_read_holds_up_nobody(sock_path: Path) -> None:
    async with web_server(sock_path) as web:
        stuck = await trio.open_tcp_stream("127.0.0.1", web.bridge.port)
        request = (
            f"GET /events HTTP/1.1\r\nHost: 127.0.0.1:{web.bridge.port}\r\n"
            f"X-Busd-Token: {web.bridge.token}\r\n\r\n"
        )
        await stuck.send_all(request.encode())  # and never reads a byte
        async with event_stream(web) as stream:
            await stream.next()  # the first snapshot: this browser is registered
            chunk = "x" * 200_000
            for _ in range(40):  # snapshots of up to 8 MB: far more than socket buffers hold
                await web.agent.publish(TextDelta(message_id="m", text=chunk), session_id="big")
                await web.agent.flush()
            size = len(chunk) * 40
            await stream.wait_for(
                "the whole text",
                lambda s: "big" in s and len(blocks(s["big"], "text")[0]["text"]) == size,
            )
            # Both browsers were there all along; what the stuck one still has to
            # receive is one entry, not 40 states.
            assert len(web.bridge.browsers) == 2
            assert all(len(browser.dirty) <= 1 for browser in web.bridge.browsers)
        await stuck.aclose()


# -- the bridge on its own -----------------------------------------------------------


def envelope(seq: int, session: str, text: str) -> Envelope[Event]:
    return Envelope(
        seq=seq, ts=1000.0 + seq, session_id=session, event=TextDelta(message_id="m", text=text)
    )


def test_a_browser_keeps_what_it_owes_not_every_state() -> None:
    from busd.client import Batch

    bridge = WebBridge(token="t", name="web", clock=lambda: 2000.0)
    browser = Browser()
    bridge.browsers.add(browser)
    for seq in range(1, 1001):
        bridge.fold(Batch([envelope(seq, f"s{seq % 3}", "x")]))
    assert browser.dirty == {"s1": True, "s2": True, "s0": True}
    data, covered = bridge.frame(browser)
    assert covered == {"s0", "s1", "s2"}
    assert data.count(b"event: session\n") == 3
    assert browser.dirty == {}
    assert not browser.wake.is_set()


def test_a_restarted_daemon_starts_the_views_afresh() -> None:
    from busd.client import Batch

    bridge = WebBridge(token="t", name="web", clock=lambda: 2000.0)
    browser = Browser()
    bridge.browsers.add(browser)
    bridge.fold(Batch([envelope(5, "old", "a"), envelope(6, "old", "b")]))
    bridge.fold(Batch([envelope(1, "new", "c")]))  # seq went back: a new daemon
    assert list(bridge.views.sessions) == ["new"]
    data, _ = bridge.frame(browser)
    assert data.startswith(b"event: snapshot\n")


# -- what the page shows of a view -----------------------------------------------------


def fold(*events: Event, run_id: str | None = "run-1") -> Views:
    views = Views()
    for seq, event in enumerate(events, 1):
        views.apply(Envelope(seq=seq, ts=1000.0 + seq, session_id="s", run_id=run_id, event=event))
    return views


WRITE = {"content": "okra", "filePath": "/tmp/p4/p4-check.txt"}
RUN = RunStarted(adapter="acp", prompt="Write okra\nto /tmp/p4/p4-check.txt")
ASKING = [
    RUN,
    ToolStart(tool_call_id="t1", name="write", input=WRITE),
    PermissionRequested(request_id="run-1/p1", tool="write", input=WRITE),
]


def test_a_tool_call_reads_as_in_the_terminal_not_as_json() -> None:
    views = fold(*ASKING)
    data = page_view(views.sessions["s"], 2000.0)
    (tool,) = blocks(data, "tool")
    (permission,) = blocks(data, "permission")
    assert tool["summary"] == permission["summary"] == "/tmp/p4/p4-check.txt"
    # What busd watch prints for the same call is the page's `name(summary)`.
    lines = PlainLog().lines(views, ["s"], 2000.0)
    assert f"[s] ⏺ {tool['name']}({tool['summary']})" in lines
    assert "[s] ⏺ write(/tmp/p4/p4-check.txt)" in lines
    # Inputs without a path or command: the terminal's key=value, never raw JSON.
    views = fold(ToolStart(tool_call_id="t2", name="bash", input={"cwd": "/tmp/x", "n": 2}))
    (tool,) = blocks(page_view(views.sessions["s"], 2000.0), "tool")
    assert tool["summary"] == "cwd=/tmp/x, n=2"


STATS = StreamingStats(elapsed_s=3.0, output_tokens=12)


@pytest.mark.parametrize(
    ("events", "state"),
    [
        ([RUN], "running"),
        (ASKING, "waiting"),
        ([RUN, RunFinished(status="ok", duration_s=2.0)], "done"),
        ([*ASKING, RunFinished(status="cancelled", duration_s=2.0)], "cancelled"),
        ([RUN, RunFinished(status="error", duration_s=2.0, error="boom")], "failed"),
        ([RUN, RunFinished(status="timed_out", duration_s=2.0)], "failed"),
        ([TextDelta(message_id="m", text="hi")], "running"),  # ingested: no run
        ([TextDelta(message_id="m", text="hi"), STATS, SessionIdle()], "done"),
        ([SessionTitleChanged(title="t")], "idle"),
    ],
    ids=[
        "running",
        "waiting",
        "done",
        "cancelled",
        "failed",
        "timed-out",
        "busy",
        "ingested-done",
        "idle",
    ],
)
def test_a_tab_says_what_its_session_is_doing(events: list[Event], state: str) -> None:
    run_id = "run-1" if events and events[0] is RUN else None
    view = fold(*events, run_id=run_id).sessions["s"]
    assert page_view(view, 2000.0)["state"] == state


def test_a_tab_is_named_by_the_title_else_the_first_line_of_the_prompt() -> None:
    assert page_view(fold(RUN).sessions["s"], 2000.0)["label"] == "Write okra"
    titled = fold(RUN, SessionTitleChanged(title="Okra file")).sessions["s"]
    assert page_view(titled, 2000.0)["label"] == "Okra file"
    ingested = fold(TextDelta(message_id="m", text="hi"), run_id=None).sessions["s"]
    assert page_view(ingested, 2000.0)["label"] is None  # the page shows the id


# -- the command ---------------------------------------------------------------------


@pytest.mark.parametrize("read_only", [False, True], ids=["answering", "read-only"])
async def test_the_command_prints_its_url_and_stops_on_sigterm(
    sock_path: Path, read_only: bool
) -> None:
    command = [sys.executable, "-m", "busd", "web", "--socket", str(sock_path), "--name", "web@cli"]
    async with running_daemon(sock_path):
        process = await trio.lowlevel.open_process(
            command + ["--read-only"] * read_only,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert process.stdout is not None
        assert process.stderr is not None
        try:
            printed = b""
            with trio.fail_after(DEADLINE):
                while b"\n" not in printed:
                    chunk = await process.stdout.receive_some()
                    assert chunk, "busd web exited before printing its URL"
                    printed += chunk
            found = re.search(r"http://127\.0\.0\.1:(\d+)/\?token=(\S+)", printed.decode())
            assert found is not None, printed
            port, token = int(found.group(1)), found.group(2)
            http = Http(port)
            assert (await http.get("/")).status == 403
            page = await http.get("/", params={"token": token})
            assert (page.status, page.headers["location"]) == (303, "/")
            sessions = await http.get("/api/sessions", headers={"x-busd-token": token})
            assert sessions.json()["name"] == "web@cli"
            assert sessions.json()["read_only"] is read_only
            cancel = await http.post(
                "/api/cancel",
                body=b'{"run_id": "nope"}',
                headers={
                    "x-busd-token": token,
                    "origin": f"http://127.0.0.1:{port}",
                    "content-type": "application/json",
                },
            )
            expected = (403, "read_only") if read_only else (404, "unknown_run")
            assert (cancel.status, cancel.json()["error"]) == expected
            process.send_signal(signal.SIGTERM)
            with trio.fail_after(DEADLINE):
                assert await process.wait() == 0, await process.stderr.receive_some()
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
            await process.stdout.aclose()
            await process.stderr.aclose()
