"""A small HTTP/1.1 client on Trio and h11: what the attacher needs of an OpenCode server.

One request per connection (``Connection: close``): JSON ``GET``\\ s, and
the long ``GET /event``, read chunk by chunk. Written for Trio rather than
taken from httpx, whose streaming is a chain of async generators that a
cancelled or finished follower leaves suspended (Trio warns about each when
it is collected, and the test suite turns warnings into errors). Here
nothing is left behind: a cancel ends the one ``receive_some`` in progress
and the connection is closed on the way out.
"""

from __future__ import annotations

import base64
import ssl
from collections.abc import Mapping
from types import TracebackType
from typing import Final
from urllib.parse import urlencode

import h11
import trio

__all__ = ["HTTPError", "Response", "Server", "fetch", "open_get"]

RECEIVE: Final = 65_536
MAX_BODY: Final = 256 << 20
"""Bytes of a JSON answer (a long session's messages) before it is refused."""


class HTTPError(Exception):
    """The server could not be reached, or broke off or garbled its answer (one line)."""


class Server:
    """Where to connect and what to say on every request (auth, default query)."""

    __slots__ = ("authorization", "base", "host", "port", "query", "tls")

    def __init__(
        self,
        *,
        host: str,
        port: int,
        tls: bool = False,
        base: str = "",
        user: str | None = None,
        password: str | None = None,
        query: Mapping[str, str] | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.tls = tls
        self.base = base.rstrip("/")
        self.query = dict(query or {})
        self.authorization: str | None = None
        if password is not None:
            token = base64.b64encode(f"{user or ''}:{password}".encode()).decode()
            self.authorization = f"Basic {token}"

    def target(self, path: str, params: Mapping[str, object] | None = None) -> str:
        query = {**self.query, **{k: str(v) for k, v in (params or {}).items()}}
        return self.base + path + (f"?{urlencode(query)}" if query else "")

    def headers(self) -> list[tuple[str, str]]:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.tls else 80
        said = [
            ("Host", host if self.port == default else f"{host}:{self.port}"),
            ("Connection", "close"),
            ("User-Agent", "busd-attach-opencode"),
        ]
        if self.authorization is not None:
            said.append(("Authorization", self.authorization))
        return said


class Response:
    """An answer whose body is read with :meth:`receive`; close it (``async with``)."""

    def __init__(
        self, stream: trio.abc.Stream, connection: h11.Connection, head: h11.Response
    ) -> None:
        self._stream = stream
        self._h11 = connection
        self.status: int = head.status_code
        self.headers = {k.decode().lower(): v.decode("latin-1") for k, v in head.headers}
        self._done = False

    async def receive(self) -> bytes:
        """The next piece of the body; ``b""`` once it is complete."""
        while not self._done:
            event = await _next_event(self._stream, self._h11)
            if isinstance(event, h11.Data):
                return bytes(event.data)
            if isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                self._done = True
        return b""

    async def read(self, limit: int = MAX_BODY) -> bytes:
        body = bytearray()
        while chunk := await self.receive():
            body += chunk
            if len(body) > limit:
                raise HTTPError(f"an answer over {limit} bytes")
        return bytes(body)

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self._stream)

    async def __aenter__(self) -> Response:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


async def _next_event(stream: trio.abc.Stream, connection: h11.Connection) -> object:
    while True:
        try:
            event = connection.next_event()
        except h11.RemoteProtocolError as exc:
            raise HTTPError(_closed(exc)) from None
        if event is not h11.NEED_DATA:
            return event
        try:
            data = await stream.receive_some(RECEIVE)
        except (trio.BrokenResourceError, OSError):
            raise HTTPError("the connection closed") from None
        try:
            connection.receive_data(bytes(data))
        except h11.RemoteProtocolError as exc:
            raise HTTPError(_closed(exc)) from None


def _closed(exc: h11.RemoteProtocolError) -> str:
    text = str(exc)
    return "the connection closed" if "peer closed" in text else f"not HTTP it speaks ({text})"


async def _connect(server: Server) -> trio.abc.Stream:
    try:
        if server.tls:
            context = ssl.create_default_context()
            tls = await trio.open_ssl_over_tcp_stream(server.host, server.port, ssl_context=context)
            await tls.do_handshake()
            return tls
        return await trio.open_tcp_stream(server.host, server.port)
    except OSError as exc:
        raise HTTPError(_why(exc)) from None
    except trio.BrokenResourceError as exc:  # the TLS handshake
        raise HTTPError(f"TLS failed ({exc.__cause__ or exc})") from None


def _why(exc: OSError) -> str:
    """``connection refused``, not trio's "all attempts to connect ... failed"."""
    causes = getattr(exc.__cause__, "exceptions", ())
    first = next((c for c in causes if isinstance(c, OSError) and c.strerror), None)
    found = first if first is not None else exc
    text = found.strerror or str(found) or type(found).__name__
    return text.rsplit(": ", 1)[-1].lower()  # trio's strerror: "Error connecting to (...): X"


async def open_get(
    server: Server,
    path: str,
    params: Mapping[str, object] | None = None,
    *,
    accept: str = "application/json",
) -> Response:
    """Send ``GET path`` and return once the answer's head is in (bound it with a deadline)."""
    stream = await _connect(server)
    try:
        connection = h11.Connection(h11.CLIENT)
        headers = [*server.headers(), ("Accept", accept)]
        request = h11.Request(method="GET", target=server.target(path, params), headers=headers)
        try:
            await stream.send_all(connection.send(request) + connection.send(h11.EndOfMessage()))
        except (trio.BrokenResourceError, OSError):
            raise HTTPError("the connection closed") from None
        while True:
            event = await _next_event(stream, connection)
            if isinstance(event, h11.Response):
                return Response(stream, connection, event)
            if isinstance(event, h11.ConnectionClosed):
                raise HTTPError("the connection closed")
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise


async def fetch(
    server: Server, path: str, params: Mapping[str, object] | None = None
) -> tuple[int, str, bytes]:
    """``GET path`` whole: ``(status, content type, body)`` (bound it with a deadline)."""
    async with await open_get(server, path, params) as response:
        body = await response.read()
        return response.status, response.headers.get("content-type", ""), body
