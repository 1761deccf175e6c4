"""A local stand-in for the Messages API, for driving the real ``anthropic`` SDK in tests.

:class:`FakeMessagesAPI` is a small HTTP/1.1 server on 127.0.0.1 (a random
port) that answers ``POST /v1/messages`` with a recorded stream, replayed
as server-sent events (``event: <type>`` / ``data: <json>``, one chunk each,
chunked like the real API), and keeps every request it was sent. It can
answer with an HTTP error instead, and pause before event ``pause_at``
until :attr:`~FakeMessagesAPI.resume` is set or the client hangs up.
Connections stay open between requests, so :attr:`~FakeMessagesAPI.hung_up`
shows that the client closed its side (cancelled, or done with its pool).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import trio

__all__ = ["FakeMessagesAPI", "Request"]

_REASONS = {200: "OK", 404: "Not Found", 500: "Internal Server Error"}


@dataclass(frozen=True)
class Request:
    """One request the stand-in received."""

    method: str
    path: str
    headers: Mapping[str, str]
    """Header names lower-cased."""
    body: Any


class FakeMessagesAPI:
    """Replays ``events`` as the answer to each ``POST /v1/messages``.

    ``status`` other than 200 answers with that status and ``error_body``
    instead; ``pause_at`` is the index of the event to wait before.
    """

    def __init__(
        self,
        events: Sequence[Mapping[str, Any]],
        *,
        status: int = 200,
        error_body: Mapping[str, Any] | None = None,
        pause_at: int | None = None,
        input_tokens: int | None = None,
    ) -> None:
        self.events = events
        self.input_tokens = input_tokens
        """``POST /v1/messages/count_tokens`` answers this (``None``: 404, a proxy without it)."""
        self.status = status
        self.error_body = error_body
        self.pause_at = pause_at
        self.requests: list[Request] = []
        self.base_url = ""
        self.paused = trio.Event()
        """Set when the response has stopped before event ``pause_at``."""
        self.resume = trio.Event()
        """Set it to send the rest of the events."""
        self.hung_up = trio.Event()
        """Set when a client closed its connection."""

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; ``base_url`` is set when started."""
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{port}"
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, self._connection, listeners)
            task_status.started()

    async def _connection(self, stream: trio.SocketStream) -> None:
        with contextlib.suppress(trio.BrokenResourceError):  # reset: closed with bytes unread
            await self._exchange(stream)
        self.hung_up.set()

    async def _exchange(self, stream: trio.SocketStream) -> None:
        """Answer requests until the client hangs up."""
        buffer = bytearray()
        while (request := await _read_request(stream, buffer)) is not None:
            self.requests.append(request)
            if request.path == "/v1/messages/count_tokens" and self.input_tokens is not None:
                await _send_json(stream, 200, {"input_tokens": self.input_tokens})
            elif request.method != "POST" or request.path != "/v1/messages":
                await _send_json(stream, 404, {"type": "error", "error": {"type": "not_found"}})
            elif self.status != 200:
                await _send_json(stream, self.status, self.error_body or {})
            elif not await self._stream_events(stream):
                return

    async def _stream_events(self, stream: trio.SocketStream) -> bool:
        """Send the events as SSE; False if the client hung up during a pause."""
        await stream.send_all(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
            b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        for index, event in enumerate(self.events):
            if index == self.pause_at and not await self._pause(stream):
                return False
            data = f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()
            await stream.send_all(b"%x\r\n%s\r\n" % (len(data), data))
        await stream.send_all(b"0\r\n\r\n")
        return True

    async def _pause(self, stream: trio.SocketStream) -> bool:
        """Wait for :attr:`resume` or the client hanging up, whichever comes first."""
        self.paused.set()
        hung_up = False

        async def watch(cancel_scope: trio.CancelScope) -> None:
            nonlocal hung_up
            hung_up = not await stream.receive_some()
            cancel_scope.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch, nursery.cancel_scope)
            await self.resume.wait()
            nursery.cancel_scope.cancel()
        return not hung_up


async def _read_request(stream: trio.SocketStream, buffer: bytearray) -> Request | None:
    """The next request on the connection, or None when the client closed it."""
    while (end := buffer.find(b"\r\n\r\n")) < 0:
        chunk = await stream.receive_some()
        if not chunk:
            return None
        buffer += chunk
    head = bytes(buffer[:end]).decode("latin-1").split("\r\n")
    del buffer[: end + 4]
    method, path, _ = head[0].split(" ", 2)
    headers = {}
    for line in head[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    while len(buffer) < length:
        chunk = await stream.receive_some()
        if not chunk:
            return None
        buffer += chunk
    body = bytes(buffer[:length])
    del buffer[:length]
    return Request(method, path, headers, json.loads(body) if body else None)


async def _send_json(stream: trio.SocketStream, status: int, body: Mapping[str, Any]) -> None:
    data = json.dumps(body).encode()
    reason = _REASONS.get(status, "Error")
    await stream.send_all(
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(data)}\r\n\r\n".encode()
        + data
    )
