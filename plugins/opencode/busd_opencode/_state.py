"""What the OpenCode translator remembers of a stream: sessions, open turns, parts, tools."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["Part", "Session", "Tool", "Turn"]


class Session:
    __slots__ = (
        "aborted",
        "agent_id",
        "cwd",
        "errored",
        "id",
        "idle",
        "key",
        "model",
        "parent",
        "started",
        "title",
    )

    def __init__(self, sid: str | None, key: str) -> None:
        self.id = sid
        self.key = key
        self.started = False
        self.idle = False
        self.aborted = False
        self.errored = False
        self.model: str | None = None
        self.cwd: str | None = None
        self.title: str | None = None
        self.parent: str | None = None
        self.agent_id: str | None = None


class Turn:
    __slots__ = ("done", "id", "reason", "session", "stepped")

    def __init__(self, mid: str, session: Session) -> None:
        self.id = mid
        self.session = session
        self.reason: str | None = None
        self.stepped = False  # its ``step-finish`` part came
        self.done: Mapping[str, Any] | None = None  # its end, said before its parts


class Part:
    """An open text or reasoning part."""

    __slots__ = ("chunks", "echo", "first_now", "id", "kind", "session", "size", "turn_id")

    def __init__(self, pid: str, kind: str, session: Session, turn_id: str) -> None:
        self.id = pid
        self.kind = kind
        self.session = session
        self.turn_id = turn_id
        self.chunks: list[str] = []
        self.size = 0
        self.first_now: float | None = None
        self.echo = 0  # characters the coming deltas repeat (the stream behind a backlog)


class Tool:
    """A tool call (tool part) that has not finished."""

    __slots__ = ("agent", "call_id", "input", "name", "partial", "session", "started")

    def __init__(self, call_id: str, name: str, session: Session) -> None:
        self.call_id = call_id
        self.name = name
        self.session = session
        self.started = False
        self.input: dict[str, Any] = {}
        self.partial: str | None = None
        self.agent: str | None = None
