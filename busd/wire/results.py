"""What each ``request`` command answers: the ``result`` of its ``reply``, as types.

The daemon builds some of these results as plain maps; these Structs are
their contract, for the JSON Schema (``busd schema``) and the docs, and
tests check the daemon's maps against them key for key. The schema leaves
them open (a newer daemon may add keys, clients ignore what they do not
know); the tests are what keeps the lists complete.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from ..core.events import StreamingStats
from ..core.permissions import PermissionDecision
from ..core.sessions import SessionSnapshot, SessionSummary
from .frames import Role

__all__ = [
    "RESULTS",
    "AckResult",
    "AskPermissionResult",
    "GcStatistics",
    "RunSummary",
    "StartedRun",
    "StatusResult",
]


class _Result(msgspec.Struct, frozen=True, kw_only=True):
    """A result map: every key the daemon sends is listed (tests hold it to that)."""


class GcStatistics(_Result, frozen=True):
    """What Python's cyclic garbage collector did since the daemon started.

    A collection stops the whole daemon; docs/operations.md, "Garbage collection".
    """

    collections: tuple[int, int, int]
    """Per generation: young, middle, full."""
    pause_ms_total: tuple[float, float, float]
    pause_ms_longest: tuple[float, float, float]
    frozen: int
    """Objects no collection walks (``busd serve`` freezes its startup heap)."""


class StatusResult(_Result, frozen=True):
    """The ``status`` reply: what the daemon is, who is connected, what went wrong."""

    server: str
    socket: str | None
    uptime_s: float
    head_seq: int
    events_per_s: float
    """Accepted events per second over the last ten seconds."""
    clients: int
    """Connections past their ``hello``."""
    handshakes: int
    """Sockets still waiting to say ``hello``."""
    clients_by_role: dict[Role, int]
    subscriptions: int
    sessions: int
    connections_total: int
    slow_consumer_disconnects: int
    dropped_events: int
    rejected_events: int
    protocol_errors: int
    internal_errors: int
    refused_peers: int
    handshake_timeouts: int
    forbidden: int
    repeated_hellos: int
    roles: dict[Role, list[str]]
    """Each role's rights in this daemon (docs/operations.md, "Trust model")."""
    handler_errors: int
    history: dict[str, Any]
    """The replay ring's statistics (held, capacity, appended, evicted, ...)."""
    gc: GcStatistics
    journal: dict[str, Any] | None
    """``null`` without a journal; else docs/journal.md, "Status"."""
    adapters: list[str]
    drivers: list[str]
    runs_active: int
    runs_total: int
    plugins: list[str]
    plugin_failures: int


class StartedRun(_Result, frozen=True):
    """The ``start_run`` reply, at once: the run's events follow on the bus."""

    run_id: str
    session_id: str


class RunSummary(_Result, frozen=True):
    """One run, as ``runs`` lists it and ``cancel_run`` answers it.

    As of the answer: ``cancel_run``'s still says ``running``, since the run
    ends on the bus, with ``busd.run.finished`` status ``cancelled``.
    """

    run_id: str
    session_id: str
    adapter: str
    driver: str
    status: Literal["running", "ok", "error", "cancelled", "timed_out"]
    started_by: str
    """The identity of the connection that started it (``name[pid=…,uid=…]``)."""


class AckResult(_Result, frozen=True):
    """The ``reply`` to a ``publish`` or ``ingest`` with ``ack``: what is in the journal.

    ``first_seq`` and ``last_seq`` span every event this connection has
    published (since it connected; ``null`` before its first), derived
    events in between included; ``journaled`` is false without a journal.
    """

    first_seq: int | None
    last_seq: int | None
    journaled: bool


class AskPermissionResult(_Result, frozen=True):
    """The ``ask_permission`` reply: the decision, or ``unanswered`` when nobody gave one.

    ``unanswered``: no policy, rule or frontend decided within the request's
    ``timeout`` (or no connection that may answer was there): the asking
    agent decides by itself. ``by`` and ``reason`` are those of
    ``stream.permission.resolved``.
    """

    request_id: str
    outcome: Literal["allowed", "denied", "unanswered"]
    option_id: str | None = None
    by: str | None = None
    reason: str | None = None


RESULTS: dict[str, Any] = {
    "status": StatusResult,
    "sessions": list[SessionSummary],
    "snapshot": SessionSnapshot,
    "stats": StreamingStats,  # with a session_id
    "stats.daemon": dict[str, dict[str, Any]],  # without: per component, its statistics
    "start_run": StartedRun,
    "cancel_run": RunSummary,
    "permission_reply": PermissionDecision,
    "ask_permission": AskPermissionResult,
    "runs": list[RunSummary],
    "ack": AckResult,  # not a command: the reply to a publish or ingest with ack
}
"""Per ``cmd``, the type of a successful reply's ``result`` (``stats`` has two forms)."""
