"""``busd web``: the daemon's sessions in a browser, over Server-Sent Events.

One daemon connection folds every event into :class:`~busd.frontends.view.Views`, the
model ``busd watch`` renders too, and each browser receives JSON snapshots of
the sessions that changed: the page draws them and does no arithmetic of its
own, so the browser and the terminal cannot disagree. Permission answers and
cancels go back over the same daemon connection, so ``by`` names this bridge.

A browser that reads slowly holds up nobody: what it still has to receive is
a set of session ids, and each snapshot is taken when it is sent, so it skips
the states it was too slow for instead of queueing them. Frames are
throttled per browser (:data:`MIN_INTERVAL`), so a burst of deltas costs one
snapshot per session.

The server binds to loopback, where every other user's programs (browsers
included) can reach it too, and the browser showing the page runs other
sites' pages too: :mod:`busd.frontends.webguard` checks the Host, the
origin of what changes anything, and who asks (the printed URL's token is
exchanged for a session cookie). ``read_only`` makes a bridge that only
shows: it connects as an ``observer`` and refuses every answer. The wire
format is in docs/frontends.md.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager
from functools import partial
from importlib import resources
from typing import Any, Literal, TypeVar, cast
from urllib.parse import quote

import msgspec
import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from hypercorn.typing import ASGIFramework

from ..client import Batch, Client, ClientSubscription, ConnectionLost, RequestFailed, connect
from ..core.errors import lone_error
from ..core.events import StreamingStats
from .humanize import input_summary
from .view import PromptBlock, SessionView, Views
from .webguard import (
    SECURITY_HEADERS,
    Access,
    Refused,
    check_fetch_site,
    check_host,
    check_state_change,
)

__all__ = ["Browser", "WebBridge", "default_name", "page_view", "run_web", "serve_web"]

logger = logging.getLogger("busd.web")

MIN_INTERVAL = 0.1
"""Seconds between two frames to one browser: at most 10 snapshots a second per session."""

TICK = 1.0
"""Seconds between status-line refreshes of busy sessions (the line ticks between events)."""

KEEPALIVE = 15.0
"""Seconds of silence after which a browser gets a comment line (proxies, dead peers)."""

MAX_BODY = 64 << 10
"""Bytes a POST body may have."""

REQUEST_TIMEOUT = 10.0
"""Seconds a POST waits for the daemon's answer."""

STATIC = {
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
}

# How a daemon error code reads as an HTTP status.
_STATUS = {
    "already_resolved": 409,
    "run_finished": 409,
    "unknown_request": 404,
    "unknown_run": 404,
    "invalid_option": 400,
    "forbidden": 403,  # the daemon: this connection's role may not do that
}

_T = TypeVar("_T")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class PermissionBody(msgspec.Struct, kw_only=True):
    request_id: str
    session_id: str | None = None
    option_id: str | None = None
    allow: bool | None = None
    reason: str | None = None


class CancelBody(msgspec.Struct, kw_only=True):
    run_id: str
    reason: str | None = None


def default_name() -> str:
    """What ``by`` says for answers given in a browser: ``web@host:pid``."""
    return f"web@{socket.gethostname()}:{os.getpid()}"


def sse(event: str, data: object) -> bytes:
    """One Server-Sent Event (msgspec's JSON has no newlines, so one data line)."""
    return b"event: " + event.encode() + b"\ndata: " + msgspec.json.encode(data) + b"\n\n"


class Browser:
    """One event stream: the sessions it has yet to receive, not the states.

    ``dirty`` maps a session id to True when its snapshot is due, False when
    only its figures moved (a ``busd.stats`` report: a ``status`` event does).
    """

    def __init__(self) -> None:
        self.dirty: dict[str, bool] = {}  # ordered: sessions in the order they changed
        self.reset = False
        self.daemon = False  # the daemon connection's state is due
        self.wake = trio.Event()

    def mark(self, changes: dict[str, bool]) -> None:
        for session_id, full in changes.items():
            self.dirty[session_id] = full or self.dirty.get(session_id, False)
        if self.dirty:
            self.wake.set()

    def mark_reset(self) -> None:
        self.reset = True
        self.dirty.clear()
        self.wake.set()

    def mark_daemon(self) -> None:
        self.daemon = True
        self.wake.set()

    def take(self) -> tuple[bool, dict[str, bool]]:
        reset, dirty = self.reset, self.dirty
        self.reset = False
        self.dirty = {}
        self.wake = trio.Event()
        return reset, dirty


class WebBridge:
    """The folded views, the browsers watching them, and the ASGI app serving both."""

    def __init__(
        self,
        *,
        token: str,
        name: str,
        read_only: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.token = token
        self.access = Access(token)
        self.name = name
        self.read_only = read_only
        self.clock = clock
        self.views = Views()
        self.browsers: set[Browser] = set()
        self.client: Client | None = None
        self.head = 0
        self.url = ""
        self.port = 0
        self.lost: ConnectionLost | None = None
        self.daemon: dict[str, Any] = {"connected": True, "lost": None}
        """What the page shows beside "live": the page may reach us while we lost the daemon."""
        self.closing = trio.Event()
        self.served = trio.Event()
        self.done = trio.Event()

    # -- the daemon's side -------------------------------------------------------

    def fold(self, batch: Batch) -> None:
        """Fold one batch and tell every browser which sessions changed."""
        if batch.gap is not None:
            logger.warning("events %d..%d are lost; the views may miss them", *batch.gap)
        changed: dict[str, bool] = {}
        reset = False
        for envelope in batch.events:
            if envelope.seq <= self.head:  # the daemon restarted and numbers afresh
                self.views = Views()
                changed.clear()
                reset = True
            self.head = envelope.seq
            known = envelope.session_id in self.views.sessions
            view = self.views.apply(envelope)
            if view is not None:
                full = not known or not isinstance(envelope.event, StreamingStats)
                changed[view.session_id] = full or changed.get(view.session_id, False)
        for browser in self.browsers:
            if reset:
                browser.mark_reset()
            else:
                browser.mark(changed)

    async def pump(self, subscription: ClientSubscription) -> None:
        try:
            async for batch in subscription:
                self.fold(batch)
        except ConnectionLost as exc:  # refused for good: reconnecting would not help
            logger.error("lost the daemon: %s", exc)
            self.lost = exc
            self.stop()

    async def watch_daemon(self, client: Client) -> None:
        """Tell every browser when the daemon goes away and when it is back."""
        while True:
            stats = await client.wait_connection_change()
            self.daemon = {"connected": stats.connected, "lost": stats.last_lost}
            if stats.connected:
                logger.warning("the daemon is back")
            else:
                logger.warning("lost the daemon (%s); reconnecting", stats.last_lost)
            for browser in self.browsers:
                browser.mark_daemon()

    def stop(self) -> None:
        """End every event stream, then the server (``serve_web`` returns)."""
        self.closing.set()

    # -- what browsers receive ---------------------------------------------------

    def full(self, now: float) -> dict[str, Any]:
        return {
            "now": now,
            "name": self.name,
            "read_only": self.read_only,
            "daemon": self.daemon,
            "sessions": [page_view(view, now) for view in self.views.sessions.values()],
        }

    def frame(self, browser: Browser) -> tuple[bytes, set[str]]:
        """What ``browser`` has yet to receive, as SSE bytes, and the sessions it covers."""
        now = self.clock()
        daemon, browser.daemon = browser.daemon, False
        reset, dirty = browser.take()
        if reset:
            return sse("snapshot", self.full(now)), set(self.views.sessions)
        out = bytearray(sse("daemon", self.daemon) if daemon else b"")
        for session_id, full in dirty.items():
            view = self.views.sessions.get(session_id)
            if view is not None:
                out += sse("session", page_view(view, now)) if full else _status(view, now)
        return bytes(out), set(dirty)

    def status_frame(self, skip: set[str]) -> bytes:
        """The live status line of every busy session (it ticks between events)."""
        now = self.clock()
        out = bytearray()
        for view in self.views.sessions.values():
            if view.busy and view.session_id not in skip:
                out += _status(view, now)
        return bytes(out)

    async def stream(self, browser: Browser, send: Send) -> None:
        """Feed one browser until cancelled: the full state first, then what changes."""

        async def emit(data: bytes) -> None:
            await send({"type": "http.response.body", "body": data, "more_body": True})

        await emit(b"retry: 2000\n\n" + sse("snapshot", self.full(self.clock())))
        last_tick = last_sent = trio.current_time()
        while True:
            with trio.move_on_after(TICK):
                await browser.wake.wait()
            data, sent = self.frame(browser)
            now = trio.current_time()
            if now - last_tick >= TICK:
                data += self.status_frame(skip=sent)
                last_tick = now
            if not data and now - last_sent >= KEEPALIVE:
                data = b": keepalive\n\n"
            if data:
                await emit(data)
                last_sent = now
                await trio.sleep(MIN_INTERVAL)  # what changes meanwhile goes in the next frame

    # -- the ASGI app ------------------------------------------------------------

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return  # websockets: hypercorn closes them
        try:
            await self._route(scope, receive, send)
        except Refused as refused:
            if refused.status in (403, 421):  # someone without the right to: worth a line
                method, path = scope["method"], scope["path"]
                logger.warning(
                    "refused %s %r (%s): %s", method, path, refused.code, refused.message
                )
            await _json(
                send,
                refused.status,
                {"ok": False, "error": refused.code, "message": refused.message},
            )

    async def _route(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The checks in the order docs/frontends.md gives them, then the route."""
        method, path = scope["method"], scope["path"]
        host = check_host(scope)  # before anything else: a rebound name learns nothing
        if path.startswith("/static/") and path[8:] in STATIC:
            _allow(method, "GET", "HEAD")
            await _static(send, path[8:])
            return
        if method not in ("GET", "HEAD"):
            check_state_change(scope, host)
        if path in ("/", "/index.html") and self.access.exchanges(scope):
            _allow(method, "GET", "HEAD")
            # The token bought a cookie: a URL without it, out of the address bar and history.
            cookie = (b"set-cookie", self.access.set_cookie(scope))
            await _respond(send, 303, b"", headers=[(b"location", b"/"), cookie])
            return
        if not self.access.authorized(scope):
            raise Refused(403, "unauthorized", "open the URL busd web printed (it has the token)")
        if path in ("/", "/index.html"):
            _allow(method, "GET", "HEAD")
            await _static(send, "index.html")
            return
        check_fetch_site(scope, "same-origin", "none")  # data for this page only
        if path == "/events":
            _allow(method, "GET")
            await self._events(receive, send)
        elif path == "/api/sessions":
            _allow(method, "GET")
            await _json(send, 200, self.full(self.clock()))
        elif path in ("/api/permission", "/api/cancel"):
            _allow(method, "POST")
            if self.read_only:
                raise Refused(403, "read_only", "this busd web only shows (--read-only)")
            if path == "/api/permission":
                await _json(send, 200, await self._permission(receive))
            else:
                await _json(send, 200, await self._cancel(receive))
        else:
            raise Refused(404, "not_found", f"no such page: {path}")

    async def _events(self, receive: Receive, send: Send) -> None:
        browser = Browser()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream"), *SECURITY_HEADERS],
            }
        )
        self.browsers.add(browser)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_cancel_when, _disconnected(receive), nursery.cancel_scope)
                nursery.start_soon(_cancel_when, self.closing.wait(), nursery.cancel_scope)
                await self.stream(browser, send)
        finally:
            self.browsers.discard(browser)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _permission(self, receive: Receive) -> dict[str, Any]:
        body = _decode(await _body(receive), PermissionBody)
        if body.option_id is None and body.allow is None:
            raise Refused(400, "bad_request", "give option_id or allow")
        decision = await self._ask(
            lambda client: client.reply_permission(
                body.request_id, option_id=body.option_id, allow=body.allow, reason=body.reason
            )
        )
        return {"ok": True, "decision": decision}

    async def _cancel(self, receive: Receive) -> dict[str, Any]:
        body = _decode(await _body(receive), CancelBody)
        await self._ask(lambda client: client.cancel_run(body.run_id, reason=body.reason))
        return {"ok": True, "run_id": body.run_id}

    async def _ask(self, call: Callable[[Client], Awaitable[Any]]) -> Any:
        client = self.client
        if client is None:
            raise Refused(503, "daemon_unavailable", "not connected to the daemon")
        try:
            with trio.fail_after(REQUEST_TIMEOUT):
                return await call(client)
        except RequestFailed as exc:
            message = str(exc).partition(": ")[2] or exc.code
            raise Refused(_STATUS.get(exc.code, 502), exc.code, message) from None
        except (ConnectionLost, trio.ClosedResourceError) as exc:
            raise Refused(503, "daemon_unavailable", f"lost the daemon: {exc}") from None
        except trio.TooSlowError:
            raise Refused(504, "daemon_timeout", "the daemon did not answer in time") from None


def session_label(view: SessionView) -> str | None:
    """What a tab is called: the session's title, else the first line of its first prompt."""
    if view.title:
        return view.title
    for block in view.main.blocks:
        if isinstance(block, PromptBlock) and block.text.strip():
            return block.text.strip().splitlines()[0][:200]
    return None


def session_state(view: SessionView) -> str:
    """What a session is doing, in a word: ``waiting`` (for an answer), ``running``,
    ``done``, ``cancelled``, ``failed`` or ``idle`` (nothing to show yet)."""
    if view.pending_permissions():
        return "waiting"
    if view.busy or view.run_status == "running":
        return "running"
    if view.run_status == "cancelled":
        return "cancelled"
    if view.run_status in ("error", "timed_out"):
        return "failed"
    if view.run_status == "ok" or view.main.blocks:
        return "done"  # an ingested session has no run: it worked, and is at rest
    return "idle"


def page_view(view: SessionView, now: float) -> dict[str, Any]:
    """``view.snapshot(now)`` with what the page shows as ``busd watch`` does.

    ``label`` and ``state`` for its tab, and each tool call's and request's
    input ``summary``: the terminal's ``Write(path)`` (:func:`input_summary`).
    """
    data = view.snapshot(now)
    data["label"], data["state"] = session_label(view), session_state(view)
    for agent in (data["main"], *data["agents"].values()):
        for block in agent["blocks"]:
            if block["kind"] in ("tool", "permission"):
                limit = 80 if block["kind"] == "tool" else 100  # as the terminal clips them
                summary = input_summary(block["input"], limit)
                repeats = block["kind"] == "tool" and summary == block["name"]
                block["summary"] = "" if repeats else summary  # ACP names a tool by its command
    return data


def _status(view: SessionView, now: float) -> bytes:
    data = {
        "session_id": view.session_id,
        "busy": view.busy,
        "status_line": view.status_line(now),
        "summary_line": view.summary_line(),
        "now": now,
    }
    return sse("status", data)


# -- HTTP plumbing -------------------------------------------------------------------


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def _allow(method: str, *allowed: str) -> None:
    if method not in allowed:
        raise Refused(405, "method_not_allowed", f"{method} is not allowed here (use {allowed[0]})")


async def _respond(
    send: Send,
    status: int,
    body: bytes,
    content_type: bytes = b"text/plain; charset=utf-8",
    headers: Iterable[tuple[bytes, bytes]] = (),
) -> None:
    fields = [
        (b"content-type", content_type),
        (b"content-length", str(len(body)).encode()),
        *SECURITY_HEADERS,
        *headers,
    ]
    await send({"type": "http.response.start", "status": status, "headers": fields})
    await send({"type": "http.response.body", "body": body})


async def _json(send: Send, status: int, data: object) -> None:
    await _respond(send, status, msgspec.json.encode(data), b"application/json")


async def _static(send: Send, name: str) -> None:
    data = (resources.files("busd.frontends") / "webui" / name).read_bytes()
    content_type = STATIC.get(name, "text/html; charset=utf-8")
    await _respond(send, 200, data, content_type.encode())


async def _body(receive: Receive) -> bytes:
    chunks = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Refused(400, "bad_request", "the request ended early")
        chunks += message.get("body", b"")
        if len(chunks) > MAX_BODY:
            raise Refused(413, "too_large", f"the body is over {MAX_BODY} bytes")
        if not message.get("more_body", False):
            return bytes(chunks)


def _decode(data: bytes, kind: type[_T]) -> _T:
    try:
        return msgspec.json.decode(data, type=kind)
    except msgspec.ValidationError as exc:
        raise Refused(400, "bad_request", f"invalid body: {exc}") from None
    except msgspec.DecodeError as exc:
        raise Refused(400, "bad_request", f"the body is not JSON: {exc}") from None


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _cancel_when(awaitable: Awaitable[object], scope: trio.CancelScope) -> None:
    await awaitable
    scope.cancel()


# -- running it ----------------------------------------------------------------------


async def serve_web(
    socket_path: str | os.PathLike[str] | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    name: str | None = None,
    token: str | None = None,
    read_only: bool = False,
    task_status: trio.TaskStatus[WebBridge] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Connect to the daemon, fold its stream and serve browsers until ``stop()``.

    ``task_status.started`` hands over the bridge once the port is bound
    (``bridge.url`` carries the token); port 0 picks a free one. A lost
    daemon connection is re-established (the views resume where they were);
    if the daemon refuses it for good, the server stops and ``bridge.lost``
    says why. ``read_only`` connects as an ``observer`` and refuses every
    answer and cancel itself.
    """
    bridge = WebBridge(
        token=token or secrets.token_urlsafe(24),
        name=name or default_name(),
        read_only=read_only,
    )
    role: Literal["observer", "frontend"] = "observer" if read_only else "frontend"
    try:
        async with (
            connect(socket_path, client=bridge.name, role=role, reconnect=True) as client,
            client.subscribe([">"], since_seq=0) as subscription,
        ):
            bridge.client = client
            with _unwrapped(OSError):
                await _serve(bridge, subscription, host, port, task_status)
    finally:
        bridge.client = None
        bridge.done.set()


async def _serve(
    bridge: WebBridge,
    subscription: ClientSubscription,
    host: str,
    port: int,
    task_status: trio.TaskStatus[WebBridge],
) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(bridge.pump, subscription)
        nursery.start_soon(bridge.watch_daemon, subscription.client)
        binds: list[str] = await nursery.start(_serve_http, bridge, _config(host, port))
        base = binds[0]
        bridge.port = int(base.rsplit(":", 1)[1])
        for anywhere, loopback in _UNSPECIFIED.items():  # bound to every address: print one
            base = base.replace(anywhere, loopback, 1)
        bridge.url = f"{base}/?token={quote(bridge.token)}"
        task_status.started(bridge)
        await bridge.served.wait()
        nursery.cancel_scope.cancel()  # the pump


_UNSPECIFIED = {"//0.0.0.0:": "//127.0.0.1:", "//[::]:": "//[::1]:"}


@contextmanager
def _unwrapped(*kinds: type[BaseException]) -> Iterator[None]:
    """Let a lone error of ``kinds`` (a port taken, a daemon gone) out of nurseries as itself."""
    try:
        yield
    except BaseExceptionGroup as group:
        lone = lone_error(group)
        if isinstance(lone, kinds):
            raise lone from None
        raise


def _config(host: str, port: int) -> Config:
    config = Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.errorlog = logging.getLogger("busd.web.http")
    config.graceful_timeout = 1.0
    return config


async def _serve_http(
    bridge: WebBridge,
    config: Config,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    try:
        app = cast(ASGIFramework, bridge.app)
        await serve(app, config, shutdown_trigger=bridge.closing.wait, task_status=task_status)
    finally:
        bridge.served.set()


async def run_web(
    socket_path: str | os.PathLike[str] | None,
    *,
    host: str,
    port: int,
    name: str | None,
    on_ready: Callable[[str], None],
    read_only: bool = False,
) -> int:
    """``busd web``: serve until SIGINT or SIGTERM, then end the streams and exit 0."""

    async def stop_on_signal(bridge: WebBridge) -> None:
        async for _ in signals:
            bridge.stop()
            return

    with (
        trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals,
        _unwrapped(OSError, ConnectionLost),
    ):
        async with trio.open_nursery() as nursery:
            bridge: WebBridge = await nursery.start(
                partial(
                    serve_web, socket_path, host=host, port=port, name=name, read_only=read_only
                )
            )
            on_ready(bridge.url)
            nursery.start_soon(stop_on_signal, bridge)
            await bridge.done.wait()
            nursery.cancel_scope.cancel()
    if bridge.lost is not None:
        raise bridge.lost
    return 0
