"""What a running OpenCode server says, as the ``/event`` payloads the adapter reads (pure).

The attacher (:mod:`busd_opencode.attach`) does the I/O; this module decides
what to send. A session that existed before busd attached is read from the
server's HTTP API (``GET /session``, ``GET /session/{id}/message``,
``GET /session/status``, ``GET /permission``) and told as the events that
would have built it (:func:`backlog`): the session, then each message as it
is announced, its parts, and the message again once finished, then its
status. The adapter's translator keeps each finished message's tokens once
(per message id) and skips finished parts it has seen, so the live stream
repeating what the backlog said counts nothing twice.

Sessions are routed by family (:class:`Families`): a sub-agent's session
(``parentID``) goes to its root's translator, as the driver feeds one
translator the session and its sub-agents. :func:`fingerprint` says whether
a session changed since it was last delivered (resume points).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from ._wire import ended, field, ident, mapping, session_of

__all__ = [
    "Families",
    "SSEDecoder",
    "backlog",
    "dump_points",
    "event_session",
    "fingerprint",
    "load_points",
    "unfinished",
]

MAX_EVENT: Final = 16 << 20
"""Bytes one server-sent event may hold before the stream is given up as broken."""

_OPENING: Final = frozenset(
    {"id", "role", "sessionID", "parentID", "modelID", "providerID", "mode", "agent", "path"}
)
"""The fields of an assistant message as OpenCode first announces it (no usage, no finish)."""


class SSEDecoder:
    """Server-sent events from the bytes of a stream: each event's ``data``.

    Lines end with ``\\n`` (an ``\\r`` before it is dropped), as OpenCode
    writes them; ``event``, ``id`` and ``retry`` fields and comments are
    read past: OpenCode's events say everything in their ``data``.
    """

    __slots__ = ("_buffer", "_data", "_size")

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[str] = []
        self._size = 0

    def feed(self, chunk: bytes) -> list[str]:
        """The events ``chunk`` completes, in order.

        :raises ValueError: an event (or a line) grew past :data:`MAX_EVENT`.
        """
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        if len(self._buffer) > MAX_EVENT:
            raise ValueError(f"a server-sent event over {MAX_EVENT} bytes")
        found: list[str] = []
        for raw in lines:
            data = self._line(raw.removesuffix(b"\r").decode("utf-8", "replace"))
            if data is not None:
                found.append(data)
        return found

    def _line(self, line: str) -> str | None:
        if not line:
            if not self._data:
                return None
            data, self._data, self._size = "\n".join(self._data), [], 0
            return data
        if line.startswith(":"):
            return None  # a comment (a keep-alive)
        name, _, value = line.partition(":")
        if name == "data":
            value = value[1:] if value.startswith(" ") else value
            self._size += len(value)
            if self._size > MAX_EVENT:
                raise ValueError(f"a server-sent event over {MAX_EVENT} bytes")
            self._data.append(value)
        return None


def event_session(raw: Mapping[str, Any]) -> str | None:
    """The OpenCode session an ``/event`` payload is about (None: the server's own news)."""
    props = mapping(raw.get("properties"))
    info = mapping(props.get("info"))
    kind = raw.get("type")
    if isinstance(kind, str) and kind.startswith("session.") and ident(info.get("id")):
        return ident(info.get("id"))
    return session_of(props, info, mapping(props.get("part")))


class Families:
    """Which session is whose sub-agent: every session is routed to its root's translator."""

    __slots__ = ("_parents",)

    def __init__(self) -> None:
        self._parents: dict[str, str] = {}

    def learn(self, info: Mapping[str, Any]) -> None:
        """Remember ``info``'s parent (a session's ``info`` from the API or the stream)."""
        sid = ident(info.get("id"))
        parent = ident(field(info, "parentID", "parent_id"))
        if sid is not None and parent is not None and parent != sid:
            self._parents[sid] = parent

    def forget(self, sid: str) -> None:
        self._parents.pop(sid, None)

    def root(self, sid: str) -> str:
        """The session at the top of ``sid``'s family (``sid`` itself if it has no parent)."""
        seen = {sid}
        while (parent := self._parents.get(sid)) is not None and parent not in seen:
            seen.add(parent)
            sid = parent
        return sid


def _opening(info: Mapping[str, Any]) -> dict[str, Any]:
    """An assistant message as OpenCode first announces it: no finish, zero usage."""
    time = mapping(info.get("time"))
    opened = {key: value for key, value in info.items() if key in _OPENING}
    zero = {"input": 0, "output": 0, "reasoning": 0, "cache": {"read": 0, "write": 0}}
    opened.update(cost=0, tokens=zero)
    if "created" in time:
        opened["time"] = {"created": time["created"]}
    return opened


CUT: Final = {
    "name": "MessageCutError",
    "data": {"message": "the OpenCode server stopped while this answer was being written"},
}
"""The error a backlog gives an answer its server left open for good (it reads as ``error``)."""


def backlog(
    info: Mapping[str, Any],
    messages: Sequence[Mapping[str, Any]],
    *,
    status: Mapping[str, Any] | None = None,
    permissions: Iterable[Mapping[str, Any]] = (),
    cut: str | None = None,
) -> list[dict[str, Any]]:
    """The ``/event`` payloads that tell session ``info`` as the API shows it now.

    ``messages`` is ``GET /session/{id}/message`` (``{"info", "parts"}`` each,
    oldest first); ``status`` the session's entry in ``GET /session/status``
    (absent means idle); ``permissions`` its pending requests from
    ``GET /permission``. An assistant message is announced before its parts
    and told whole after them, as OpenCode streams it, so a finished one is
    a finished turn and an unfinished one stays open for the live stream.
    ``cut`` names an answer that will never finish (OpenCode restarted while
    writing it: it stays open, the session idle): it ends with :data:`CUT`.
    """
    sid = ident(info.get("id"))
    out: list[dict[str, Any]] = [
        {"type": "session.updated", "properties": {"sessionID": sid, "info": dict(info)}}
    ]
    for message in messages:
        minfo = mapping(message.get("info"))
        assistant = minfo.get("role") == "assistant"
        first = _opening(minfo) if assistant else dict(minfo)
        out.append({"type": "message.updated", "properties": {"sessionID": sid, "info": first}})
        parts = message.get("parts")
        for part in parts if isinstance(parts, list) else ():
            if isinstance(part, Mapping):
                props = {"sessionID": sid, "part": dict(part)}
                out.append({"type": "message.part.updated", "properties": props})
        if assistant:
            last = dict(minfo)
            if cut is not None and last.get("id") == cut:
                last["error"] = CUT
            out.append({"type": "message.updated", "properties": {"sessionID": sid, "info": last}})
    for request in permissions:
        out.append({"type": "permission.asked", "properties": dict(request)})
    kind = mapping(status).get("type")
    if kind is None or kind == "idle":
        out.append({"type": "session.idle", "properties": {"sessionID": sid}})
    else:
        props = {"sessionID": sid, "status": dict(mapping(status))}
        out.append({"type": "session.status", "properties": props})
    return out


def unfinished(messages: object) -> str | None:
    """The id of the last assistant message in ``messages`` not yet ended (None: all are).

    Ended as the translator reads it: :func:`~._wire.ended`, or an error.
    """
    found = None
    for message in messages if isinstance(messages, list) else ():
        info = mapping(mapping(message).get("info"))
        if info.get("role") == "assistant":
            over = ended(info) or mapping(info.get("error"))
            found = None if over else ident(info.get("id"))
    return found


def fingerprint(info: Mapping[str, Any]) -> str:
    """What changes whenever a session does: its update time, totals and title."""
    time = mapping(info.get("time"))
    said = [time.get("updated"), info.get("tokens"), info.get("cost"), info.get("title")]
    return json.dumps(said, sort_keys=True, separators=(",", ":"))


def load_points(text: str) -> dict[str, str]:
    """Resume points as :func:`dump_points` wrote them; anything else reads as none."""
    try:
        data = json.loads(text)
    except ValueError:
        return {}
    sessions = mapping(data).get("sessions") if isinstance(data, dict) else None
    if not isinstance(sessions, dict):
        return {}
    return {k: v for k, v in sessions.items() if isinstance(k, str) and isinstance(v, str)}


def dump_points(points: Mapping[str, str]) -> str:
    """``{"version": 1, "sessions": {session id: fingerprint}}``."""
    return json.dumps({"version": 1, "sessions": dict(sorted(points.items()))}, indent=1) + "\n"
