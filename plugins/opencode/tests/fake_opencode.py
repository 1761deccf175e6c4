"""A local stand-in for an OpenCode server: the endpoints the ``opencode-ai`` SDK calls.

It speaks plain HTTP/1.1 (h11, one request per connection) on 127.0.0.1 and
records every request. ``GET /event`` is an SSE stream that sends the
script's first line at once (``server.connected``: the subscription is live),
waits for a prompt, then replays the rest with the fixture's session id
rewritten to the prompted one. After a permission request it waits for the
driver's reply (on either endpoint); a ``reject`` switches to ``rejected``
(the rest of the run as OpenCode tells a rejection). ``POST /session/{id}/message`` answers, like
OpenCode, only when the replay is over; an abort ends the replay the way
OpenCode ends an aborted prompt.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import h11
import trio

FIXTURE = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "sdk" / "opencode.jsonl"
FIXTURE_SESSION = "ses_43ad8482affef0ocxqD4UJi3Ym"
PERMISSION_KINDS = frozenset({"permission.asked", "permission.updated"})

Raw = dict[str, Any]


def fixture() -> list[Raw]:
    return [json.loads(line) for line in FIXTURE.read_text().splitlines() if line.strip()]


def rejection(script: Sequence[Raw]) -> list[Raw]:
    """What follows a rejected permission in ``script``: the tool fails, the message ends, idle."""
    asked = next(r for r in script if r["type"] in PERMISSION_KINDS)["properties"]
    ref = asked.get("tool") or asked  # the older generation names the call on the request
    call, message = ref["callID"], ref["messageID"]
    tool = next(
        r
        for r in script
        if r["type"] == "message.part.updated" and r["properties"]["part"].get("callID") == call
    )
    failed = json.loads(json.dumps(tool))
    failed["id"] += "-rejected"
    state = failed["properties"]["part"]["state"]
    state.update(
        status="error",
        error="The user rejected permission to use this specific tool call.",
        time={"start": 1768539293000, "end": 1768539293100},
    )
    ended = next(
        r
        for r in script
        if r["type"] == "message.updated"
        and r["properties"]["info"]["id"] == message
        and "completed" in r["properties"]["info"]["time"]
    )
    replied = {
        "id": "evt_rejected_reply",
        "type": "permission.replied",
        "properties": {
            "sessionID": asked["sessionID"],
            "requestID": asked["id"],
            "reply": "reject",
        },
    }
    idle = [r for r in script if r["type"] in ("session.status", "session.idle")][-2:]
    return [replied, failed, ended, *idle]


def aborted_tail(sid: str) -> list[Raw]:
    """What OpenCode says when a prompt is aborted: the abort error, then idle."""
    error = {"name": "MessageAbortedError", "data": {"message": "Aborted"}}
    return [
        {"type": "session.error", "properties": {"sessionID": sid, "error": error}},
        {"type": "session.status", "properties": {"sessionID": sid, "status": {"type": "idle"}}},
        {"type": "session.idle", "properties": {"sessionID": sid}},
    ]


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, str]
    body: Any


@dataclass
class FakeOpenCode:
    script: list[Raw] = field(default_factory=fixture)
    rejected: list[Raw] | None = None
    fail_prompt: int | None = None
    """Answer the prompt with this HTTP status (and replay nothing)."""
    hang_up: bool = False
    """End the event stream when the script is done (OpenCode keeps it open)."""
    stall: bool = False
    """When the script is done, say nothing more until the session is aborted."""
    pause_on_permission: bool = True
    """Wait for the driver's reply after a permission request (else: it was answered elsewhere)."""

    requests: list[Recorded] = field(default_factory=list)
    prompted: trio.Event = field(default_factory=trio.Event)
    replayed: trio.Event = field(default_factory=trio.Event)
    aborted: trio.Event = field(default_factory=trio.Event)
    subscribed: trio.Event = field(default_factory=trio.Event)
    unsubscribed: trio.Event = field(default_factory=trio.Event)
    _replied: trio.Event = field(default_factory=trio.Event)
    _session: str = ""
    _sessions: int = 0

    # -- what tests read ------------------------------------------------------------

    def calls(self, method: str, prefix: str, suffix: str = "") -> list[Recorded]:
        return [
            r
            for r in self.requests
            if r.method == method and r.path.startswith(prefix) and r.path.endswith(suffix)
        ]

    @property
    def permission_replies(self) -> list[Recorded]:
        """Replies on either endpoint: ``/permission/{id}/reply`` (current servers) or
        ``/session/{id}/permissions/{id}`` (the older one)."""
        return [
            r
            for r in self.requests
            if r.method == "POST"
            and (r.path.startswith("/permission/") or "/permissions/" in r.path)
        ]

    @property
    def aborts(self) -> list[Recorded]:
        return self.calls("POST", "/session/", "/abort")

    # -- serving --------------------------------------------------------------------

    async def serve(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        task_status.started(f"http://127.0.0.1:{port}")
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        async with stream:
            try:
                request, body = await _read_request(conn, stream)
            except (h11.RemoteProtocolError, trio.BrokenResourceError):
                return
            url = urlsplit(request.target.decode())
            recorded = Recorded(
                method=request.method.decode(),
                path=url.path,
                query=dict(parse_qsl(url.query)),
                body=json.loads(body) if body else None,
            )
            self.requests.append(recorded)
            if recorded.method == "GET" and recorded.path == "/event":
                await self._events(conn, stream)
                return
            status, answer = await self._route(recorded)
            with contextlib.suppress(trio.BrokenResourceError):  # the client gave up
                await _respond(conn, stream, status, answer)

    async def _route(self, r: Recorded) -> tuple[int, object]:
        parts = r.path.strip("/").split("/")
        if r.method == "POST" and len(parts) == 3 and parts[0] == "permission":
            self._replied.set()
            return 200, True
        if r.method != "POST" or parts[0] != "session":
            return 404, {"error": f"no route {r.method} {r.path}"}
        if len(parts) == 1:
            self._sessions += 1
            sid = f"ses_fake{self._sessions:04d}"
            now = 1768539289000
            return 200, {
                "id": sid,
                "title": "New session",
                "version": "0.0.0",
                "time": {"created": now, "updated": now},
            }
        if len(parts) == 3 and parts[2] == "message":
            return await self._prompt(parts[1])
        if len(parts) == 3 and parts[2] == "abort":
            self.aborted.set()
            return 200, True
        if len(parts) == 4 and parts[2] == "permissions":
            self._replied.set()
            return 200, True
        return 404, {"error": f"no route {r.path}"}

    async def _prompt(self, sid: str) -> tuple[int, object]:
        if self.fail_prompt is not None:
            return self.fail_prompt, {"name": "UnknownError", "data": {"message": "provider down"}}
        self._session = sid
        self.prompted.set()
        await _first(self.replayed, self.aborted)
        infos = [r["properties"]["info"] for r in self.script if r["type"] == "message.updated"]
        return 200, json.loads(json.dumps(infos[-1]).replace(FIXTURE_SESSION, sid)) if infos else {}

    async def _events(self, conn: h11.Connection, stream: trio.SocketStream) -> None:
        """Replay the script as SSE, then hold the stream until the client leaves (or hang up)."""
        headers = [("content-type", "text/event-stream"), ("connection", "close")]
        try:
            await stream.send_all(conn.send(h11.Response(status_code=200, headers=headers)))
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_until_hang_up, stream, nursery.cancel_scope)
                await self._replay(conn, stream)
                if self.hang_up:
                    await stream.send_all(conn.send(h11.EndOfMessage()))
                    nursery.cancel_scope.cancel()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self.unsubscribed.set()

    async def _replay(self, conn: h11.Connection, stream: trio.SocketStream) -> None:
        first, *rest = self.script

        async def send(raw: Raw) -> None:
            text = json.dumps(raw).replace(FIXTURE_SESSION, self._session or FIXTURE_SESSION)
            await stream.send_all(conn.send(h11.Data(data=f"data: {text}\n\n".encode())))

        await send(first)
        self.subscribed.set()
        await self.prompted.wait()
        queue = list(rest)
        while queue and not self.aborted.is_set():
            raw = queue.pop(0)
            await send(raw)
            if raw["type"] in PERMISSION_KINDS and self.pause_on_permission:
                await _first(self._replied, self.aborted)
                if self.aborted.is_set():
                    break
                self._replied = trio.Event()
                reply = self.permission_replies[-1].body or {}
                if "reject" in (reply.get("reply"), reply.get("response")):
                    queue = rejection(self.script) if self.rejected is None else list(self.rejected)
        if self.stall:
            await self.aborted.wait()
        if self.aborted.is_set():  # as OpenCode ends an aborted prompt
            for raw in aborted_tail(self._session):
                await send(raw)
        self.replayed.set()


async def _until_hang_up(stream: trio.SocketStream, scope: trio.CancelScope) -> None:
    """Until the client hangs up: ``b""``, or a reset (it closed with our events unread)."""
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        while await stream.receive_some():
            pass
    scope.cancel()


async def _set_then_cancel(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


async def _first(*events: trio.Event) -> None:
    """Wait until one of ``events`` is set."""
    async with trio.open_nursery() as nursery:
        for event in events:
            nursery.start_soon(_set_then_cancel, event, nursery.cancel_scope)


async def _read_request(
    conn: h11.Connection, stream: trio.SocketStream
) -> tuple[h11.Request, bytes]:
    request: h11.Request | None = None
    body = bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await stream.receive_some())
        elif isinstance(event, h11.Request):
            request = event
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage) and request is not None:
            return request, bytes(body)
        else:
            raise h11.RemoteProtocolError(f"unexpected {event!r}")


async def _respond(
    conn: h11.Connection, stream: trio.SocketStream, status: int, answer: object
) -> None:
    data = json.dumps(answer).encode()
    headers = [
        ("content-type", "application/json"),
        ("content-length", str(len(data))),
        ("connection", "close"),
    ]
    await stream.send_all(conn.send(h11.Response(status_code=status, headers=headers)))
    await stream.send_all(conn.send(h11.Data(data=data)))
    await stream.send_all(conn.send(h11.EndOfMessage()))
