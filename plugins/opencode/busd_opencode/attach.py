"""``busd attach opencode --url URL``: a running OpenCode server's sessions on the bus.

OpenCode's TUI runs an HTTP server, and so does ``opencode serve``. Its
``GET /event`` stream (server-sent events) says everything its sessions do;
the attacher subscribes to it, waits for ``server.connected`` (the
subscription is live from then on), reads the sessions that already exist
from the HTTP API and sends them as their :func:`~busd_opencode._server.backlog`,
then forwards every event. Everything goes through the daemon's ``opencode``
adapter (``ingest`` frames, one translator per session family), so an
attached session looks exactly like one the driver ran: the same turns,
tools and usage, whose totals are the ones OpenCode reports for the session
(the sum of its messages' tokens and cost).

When the server goes away (it was stopped, restarted, the TUI quit) the
attacher says so in one line, retries every few seconds, and when it
answers again reads the API again: the translators skip what they already
have, so nothing is counted twice. ``--once`` reads the sessions and
returns. Resume points (in ``--state-dir``, one file per server, kept only
when the daemon journals) remember each idle session's state as delivered,
so attaching again sends a session only once it changed, and then whole:
a fresh translator must see every message to report the session's total.

HTTP is a small client on Trio and h11 (:mod:`busd_opencode._http`; h11 comes
with busd's hypercorn), not httpx: see that module for why. ``--dir DIR`` is
OpenCode's ``directory`` parameter (which project of the server); the
server's password, if it has one, is the URL's
(``http://opencode:PW@host:port``) or ``$OPENCODE_SERVER_PASSWORD`` (user
``$OPENCODE_SERVER_USERNAME``, default ``opencode``), as OpenCode's own
client takes it.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import urlsplit

import msgspec
import trio

from busd import AttachOptions, BusdError, Sink

from ._http import HTTPError, Response, Server, fetch, open_get
from ._server import (
    Families,
    SSEDecoder,
    backlog,
    dump_points,
    event_session,
    fingerprint,
    load_points,
    unfinished,
)
from ._wire import ident, mapping

__all__ = ["DEFAULT_URL", "OpenCodeAttachError", "OpenCodeAttacher"]

DEFAULT_URL: Final = "http://127.0.0.1:4096"
"""Where ``opencode serve`` listens unless told otherwise."""
SDK: Final = "opencode"
CONNECT_TIMEOUT: Final = 5.0
REQUEST_TIMEOUT: Final = 30.0
SILENCE: Final = 60.0
"""Seconds without a byte on ``/event`` before it counts as lost (OpenCode beats every 10 s)."""
GREETING: Final = 2.0
"""Seconds the first subscription may take to say its first event (then 4, 8, ... 30)."""
GREETING_ONCE: Final = 10.0
"""The same for ``--once``, which does not retry."""
GREETING_MAX: Final = 30.0
SESSIONS: Final = 100
"""Sessions read at start, the most recently updated first (OpenCode's own default)."""
RETRY_FIRST: Final = 0.25
RETRY_MAX: Final = 2.0


class OpenCodeAttachError(BusdError, RuntimeError):
    """The server cannot be attached to: not OpenCode, a wrong password, a bad URL."""


class _Unavailable(Exception):
    """The server answered, but not usefully now (a 5xx, a body that is not JSON)."""


class OpenCodeAttacher:
    """Follows one OpenCode server's sessions (see the module docstring)."""

    name = "opencode"
    description = "A running OpenCode server's sessions (opencode serve, the TUI): --url URL"

    async def attach(self, sink: Sink, options: AttachOptions) -> None:
        given = options.url or os.environ.get("OPENCODE_BASE_URL") or DEFAULT_URL
        url, auth = server_url(given)
        parts = urlsplit(url)
        directory = str(options.directory.resolve()) if options.directory else None
        server = Server(
            host=parts.hostname or "",
            port=parts.port or (443 if parts.scheme == "https" else 80),
            tls=parts.scheme == "https",
            base=parts.path,
            user=auth[0] if auth else None,
            password=auth[1] if auth else None,
            query={"directory": directory} if directory else None,
        )
        points = trio.Path(options.state_dir) / points_file(url, directory)
        await _Follower(server, sink, options, url, points).run()


def server_url(given: str) -> tuple[str, tuple[str, str] | None]:
    """``(the URL without credentials, basic auth or None)``; a clear error if it is no URL."""
    shown = re.sub(r"//([^/@:]*):[^/@]*@", r"//\1:***@", given)  # never print a password
    try:
        parts = urlsplit(given)
        port = parts.port
    except ValueError as exc:
        raise OpenCodeAttachError(f"--url {shown!r} is not a URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise OpenCodeAttachError(
            f"--url {shown!r} is not an http:// URL of an OpenCode server (e.g. {DEFAULT_URL})"
        )
    password = parts.password or os.environ.get("OPENCODE_SERVER_PASSWORD")
    user = parts.username or os.environ.get("OPENCODE_SERVER_USERNAME") or "opencode"
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    bare = f"{parts.scheme}://{host}" + (f":{port}" if port is not None else "")
    bare += parts.path.rstrip("/")
    return bare, ((user, password) if password else None)


def points_file(url: str, directory: str | None) -> str:
    """The resume points' file name for one server (and project): readable, and unique."""
    key = url if directory is None else f"{url} {directory}"
    readable = re.sub(r"[^A-Za-z0-9.-]+", "_", key.split("://", 1)[-1]).strip("_")[:60]
    return f"{readable}-{hashlib.sha256(key.encode()).hexdigest()[:10]}.json"


def _reason(exc: Exception) -> str:
    """One line saying why the server was not reached (no traceback, no exception repr)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:200]


class _Follower:
    """One ``busd attach opencode``: the stream, the API, what was sent."""

    def __init__(
        self,
        server: Server,
        sink: Sink,
        options: AttachOptions,
        url: str,
        points: trio.Path,
    ) -> None:
        self._server = server
        self._sink = sink
        self._once = options.once
        self._url = url
        self._points_path = points
        self._families = Families()
        self._infos: dict[str, Mapping[str, Any]] = {}  # the latest info of each session
        self._busy: set[str] = set()  # sessions not idle, as last said
        self._known: set[str] = set()  # sessions this connection has sent whole, or seen begin
        self._delivered: dict[str, str] = {}  # session id -> fingerprint the daemon has
        self._cut: set[str] = set()  # answers told as cut off (said once)
        self._journaled = False
        self._live = False  # the current subscription said its first event
        self._reached = False  # some subscription did
        self._outage: str | None = None  # why the server went away, once said
        self._greeting = GREETING_ONCE if options.once else GREETING
        self._decode = msgspec.json.Decoder().decode

    # -- the connection ---------------------------------------------------------------

    async def run(self) -> None:
        self._journaled = await self._sink.checkpoint()
        if self._journaled:
            await self._load_points()
        backoff = RETRY_FIRST
        while True:
            reason = await self._subscription()
            if reason is None:
                return
            if self._once:
                raise OpenCodeAttachError(f"no OpenCode server at {self._url} ({reason})")
            if self._live:
                self._live, backoff = False, RETRY_FIRST
            if self._outage is None:
                self._outage = reason
                said = "lost" if self._reached else "nothing answers at"
                self._sink.note(f"opencode: {said} {self._url} ({reason}); retrying")
            await trio.sleep(backoff)
            backoff = min(backoff * 2, RETRY_MAX)

    async def _subscription(self) -> str | None:
        """Follow one ``GET /event``: why it ended, or None once ``--once`` is done.

        OpenCode says ``server.connected`` at once; a subscription that says
        nothing for :attr:`_greeting` seconds is given up (1.18 never answers
        one that arrives while it is starting), the next one waits twice as long.
        """
        greeting = trio.CancelScope(deadline=trio.current_time() + self._greeting)
        reason: str | None = None
        try:
            with greeting:
                with trio.fail_after(CONNECT_TIMEOUT):
                    response = await open_get(self._server, "/event", accept="text/event-stream")
                async with response:
                    self._check(response.status, response.headers.get("content-type"), "/event")
                    reason = await self._follow(response, greeting)
        except trio.TooSlowError:
            return "it did not answer in time"
        except (HTTPError, _Unavailable, ValueError) as exc:
            return _reason(exc)
        if greeting.cancelled_caught:
            waited, self._greeting = self._greeting, min(self._greeting * 2, GREETING_MAX)
            return f"no event within {waited:g} s"
        return reason

    async def _follow(self, response: Response, greeting: trio.CancelScope) -> str | None:
        decoder = SSEDecoder()
        while True:
            with trio.move_on_after(SILENCE) as silent:
                chunk = await response.receive()
            if silent.cancelled_caught:
                return f"no word from it for {SILENCE:g} s"
            if not chunk:
                return "it closed the event stream"
            for data in decoder.feed(chunk):
                raw = self._payload(data)
                if raw is None:
                    continue
                if not self._live:  # the first event: the subscription is live
                    greeting.deadline = math.inf
                    await self._greeted()
                    if self._once:
                        await self._save_points()
                        return None
                await self._on_event(raw)

    async def _greeted(self) -> None:
        self._live = self._reached = True
        self._greeting = GREETING_ONCE if self._once else GREETING
        if self._outage is not None:
            self._sink.note(f"opencode: {self._url} is back; catching up")
            self._outage = None
        await self._sync()

    def _check(self, status: int, kind: str | None, path: str) -> None:
        if status in (401, 403):
            raise OpenCodeAttachError(
                f"{self._url} wants a password (HTTP {status}): put it in the URL"
                " (http://opencode:PASSWORD@host:port) or in $OPENCODE_SERVER_PASSWORD"
            )
        if status >= 500:
            raise _Unavailable(f"GET {path} answered HTTP {status}")
        wanted = "text/event-stream" if path == "/event" else "application/json"
        if status != 200 or not (kind or "").startswith(wanted):
            raise OpenCodeAttachError(
                f"{self._url} is not an OpenCode server"
                f" (GET {path}: HTTP {status}, {kind or 'no content type'})"
            )

    def _payload(self, data: str) -> Mapping[str, Any] | None:
        try:
            raw = self._decode(data)
        except msgspec.DecodeError:
            self._sink.note(f"opencode: skipped an event that is not JSON: {data[:80]!r}")
            return None
        if not isinstance(raw, dict):
            self._sink.note(f"opencode: skipped an event that is not an object: {data[:80]!r}")
            return None
        return raw

    async def _get(
        self, path: str, *, missing_ok: bool = False, params: Mapping[str, int] | None = None
    ) -> Any:
        """``GET path`` as JSON; None for a 404 when ``missing_ok`` (a session just deleted)."""
        try:
            with trio.fail_after(REQUEST_TIMEOUT):
                status, kind, body = await fetch(self._server, path, params)
        except trio.TooSlowError:
            raise HTTPError(f"GET {path} was not answered in {REQUEST_TIMEOUT:g} s") from None
        if missing_ok and status == 404:
            return None
        self._check(status, kind, path)
        try:
            return self._decode(body)
        except msgspec.DecodeError:
            raise _Unavailable(f"GET {path} answered with a body that is not JSON") from None

    # -- what exists: the API ---------------------------------------------------------

    async def _sync(self) -> None:
        """Send every session the API lists that the daemon does not have as it is now."""
        listed = await self._get("/session", params={"limit": SESSIONS})
        statuses = mapping(await self._get("/session/status"))
        pending: dict[str, list[Mapping[str, Any]]] = {}
        for request in await self._get("/permission") or ():
            sid = ident(mapping(request).get("sessionID"))
            if sid is not None:
                pending.setdefault(sid, []).append(request)
        if not isinstance(listed, list):
            raise _Unavailable("GET /session did not answer a list")
        infos = [mapping(i) for i in listed if ident(mapping(i).get("id"))]
        infos.sort(key=lambda i: mapping(i.get("time")).get("created") or 0)  # parents first
        for info in infos:
            self._families.learn(info)
            self._infos[info["id"]] = info
        for info in infos:
            sid = info["id"]
            status = mapping(statuses.get(sid))
            idle = status.get("type") in (None, "idle")
            if idle:
                self._busy.discard(sid)
            else:
                self._busy.add(sid)
            if idle and sid not in pending and self._delivered.get(sid) == fingerprint(info):
                continue  # the daemon has it as it is; sent whole once it stirs (_wake)
            await self._send_history(info, pending.get(sid, ()))
        listed_ids = {info["id"] for info in infos}
        for sid in [s for s in self._delivered if s not in listed_ids]:
            del self._delivered[sid]  # deleted, or no longer among the recent: forget it

    async def _send_history(self, info: Mapping[str, Any], permissions: Any = ()) -> bool:
        """Send one session as the API has it; False if it is gone.

        The status is read after the messages: read before, it can say idle
        for a prompt that started in between, and that idle would end the
        answer the messages show half written (the stream's rest of it then
        belongs to a finished turn). Idle after messages with an open answer
        means the run ended since (the subscription holds its end: the
        status is left to the stream) or was lost with the server (the
        answer is still open when read again: it ends there, as an error).
        """
        sid: str = info["id"]
        path = f"/session/{sid}/message"
        messages = await self._get(path, missing_ok=True)
        if messages is None:
            return False
        status = mapping(mapping(await self._get("/session/status")).get(sid))
        idle = status.get("type") in (None, "idle")
        cut = None
        if idle and (open_answer := unfinished(messages)) is not None:
            again = await self._get(path, missing_ok=True)
            if again is None:
                return False
            if unfinished(again) != open_answer:
                status, idle = {"type": "busy"}, False
            else:  # told every time (a translator ends it once), noted once
                cut = open_answer
                if cut not in self._cut:
                    self._cut.add(cut)
                    self._sink.note(
                        f"opencode: session {sid}: the server stopped while an answer was"
                        " being written; it ends there"
                    )
        if idle:
            self._busy.discard(sid)
        else:
            self._busy.add(sid)
        events = backlog(info, messages, status=status, permissions=permissions, cut=cut)
        await self._sink.ingest(SDK, self._families.root(sid), events)
        self._known.add(sid)
        if idle:
            self._delivered[sid] = fingerprint(info)
        return True

    async def _wake(self, sid: str) -> None:
        """A session this connection has not sent stirs: first everything it had.

        Left out as unchanged, or older than the sessions listed: the daemon's
        translator must see every message to report the session's total.
        """
        info = await self._get(f"/session/{sid}", missing_ok=True)
        if info is None:
            return
        await self._send_history(mapping(info))

    # -- what happens: the stream -----------------------------------------------------

    async def _on_event(self, raw: Mapping[str, Any]) -> None:
        kind = raw.get("type")
        props = mapping(raw.get("properties"))
        sid = event_session(raw)
        if sid is None:
            if kind == "server.heartbeat":
                await self._save_points()
            elif kind == "session.error":  # not about one session: say it, the bus has no place
                error = mapping(props.get("error"))
                message = ident(mapping(error.get("data")).get("message")) or error.get("name")
                self._sink.note(f"opencode: the server reported an error: {message}")
            return
        match kind:
            case "session.created" | "session.updated":
                info = mapping(props.get("info"))
                self._families.learn(info)
                self._infos[sid] = info
            case "session.status":
                if mapping(props.get("status")).get("type") == "idle":
                    self._busy.discard(sid)
                else:
                    self._busy.add(sid)
            case "session.idle":
                self._busy.discard(sid)
        if sid not in self._known and kind != "session.created":
            await self._wake(sid)
        root = self._families.root(sid)
        await self._sink.ingest(SDK, root, [raw])
        self._known.add(sid)
        if kind == "session.deleted":
            if root == sid:
                await self._sink.ingest(SDK, sid, [], end=True)
            self._forget(sid)

    def _forget(self, sid: str) -> None:
        self._families.forget(sid)
        for place in (self._infos, self._delivered):
            place.pop(sid, None)
        for group in (self._busy, self._known):
            group.discard(sid)

    # -- resume points ----------------------------------------------------------------

    async def _load_points(self) -> None:
        try:
            text = await self._points_path.read_text()
        except FileNotFoundError:
            return
        except OSError as exc:
            self._sink.note(f"opencode: cannot read resume points {self._points_path}: {exc}")
            return
        self._delivered = load_points(text)

    async def _save_points(self) -> None:
        """Once the daemon has journaled everything sent, remember each idle session's state."""
        if not self._journaled or not await self._sink.checkpoint():
            return
        for sid in self._known:
            info = self._infos.get(sid)
            if info is not None and sid not in self._busy:
                self._delivered[sid] = fingerprint(info)
        partial = self._points_path.with_suffix(".partial")
        try:
            await partial.write_text(dump_points(self._delivered))
            await partial.replace(self._points_path)
        except OSError as exc:
            self._sink.note(f"opencode: cannot write resume points {self._points_path}: {exc}")
