"""What the client library raises and returns, apart from the connection itself."""

from __future__ import annotations

from dataclasses import dataclass

from ..core.errors import BusdError
from ..core.events import Envelope, Event

__all__ = [
    "Acked",
    "Batch",
    "ClientStatistics",
    "ConnectionLost",
    "DaemonNotRunning",
    "NotJournaled",
    "RequestFailed",
    "SubscribeFailed",
    "connect_error",
]


class DaemonNotRunning(BusdError, ConnectionError):
    """No daemon listens at the socket path."""


class ConnectionLost(BusdError, ConnectionError):
    """The daemon closed the connection (``reason`` and ``resume_seq`` from its goodbye)."""

    def __init__(self, reason: str, message: str = "", resume_seq: int | None = None) -> None:
        super().__init__(f"{reason}: {message}" if message else reason)
        self.reason = reason
        self.resume_seq = resume_seq


class RequestFailed(BusdError):
    """The daemon answered a request with an error."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


class SubscribeFailed(RequestFailed):
    """The daemon refused a subscription (bad pattern, too many subscriptions)."""


class NotJournaled(RequestFailed):
    """Events this connection published are not in the daemon's journal (the message says which)."""


@dataclass(frozen=True, slots=True)
class Acked:
    """Every event published so far is journaled (``journaled`` false: the daemon has none)."""

    first_seq: int | None
    last_seq: int | None
    journaled: bool


@dataclass(frozen=True, slots=True)
class ClientStatistics:
    """What :meth:`Client.statistics` reports: is the daemon there, and how often was it lost."""

    connected: bool
    reconnects: int
    last_lost: str | None  # why the last connection ended, as the daemon or the socket said
    subscriptions: int


@dataclass(frozen=True, slots=True)
class Batch:
    """What one subscription received in one frame: events in ``seq`` order, or a gap notice."""

    events: list[Envelope[Event]]
    gap: tuple[int, int] | None = None


def connect_error(path: str, exc: OSError) -> ConnectionError:
    """What a failed ``connect`` means to a client: nobody listens, it is busy, or we may not."""
    if isinstance(exc, BlockingIOError):
        return ConnectionLost("busy", f"the daemon at {path} accepts no more connections")
    if isinstance(exc, PermissionError):
        return ConnectionLost("forbidden", f"may not connect to {path}: {exc.strerror}")
    return DaemonNotRunning(f"no busd daemon at {path} ({exc.strerror}; start one: `busd serve`)")
