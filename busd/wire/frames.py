"""The busd wire protocol's vocabulary, sans-I/O: frame types, error codes, limits.

A frame on the wire is a 4-byte big-endian unsigned length followed by that
many bytes of msgpack: one map tagged by its ``op`` key. This module says
what a frame may hold; :mod:`busd.wire.codec` turns frames into bytes and
back. The protocol itself is written down in ``docs/protocol.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import (
    Annotated,
    Any,
    Generic,
    Literal,
    TypeAlias,
    TypeVar,
)

import msgspec

from ..core.errors import BusdError
from ..core.events import Event, PermissionOption
from ..core.permissions import PermissionRule

__all__ = [
    "ALREADY_RESOLVED",
    "BAD_HANDSHAKE",
    "BYE",
    "CLIENT_FRAMES",
    "COMMANDS",
    "DEFAULT_MAX_FRAME",
    "ERROR_CODES",
    "FORBIDDEN",
    "FRAME_TOO_LARGE",
    "HANDSHAKE_TIMEOUT",
    "INTERNAL_ERROR",
    "INVALID_EVENT",
    "INVALID_OPTION",
    "INVALID_PATTERN",
    "MALFORMED_FRAME",
    "NOT_JOURNALED",
    "PROTOCOL_VERSION",
    "RUN_FINISHED",
    "SEQ_AHEAD",
    "SERVER_FRAMES",
    "SESSION_BUSY",
    "SHUTDOWN",
    "SLOW_CONSUMER",
    "TOO_MANY_CONNECTIONS",
    "TOO_MANY_REQUESTS",
    "TOO_MANY_SUBSCRIPTIONS",
    "UNKNOWN_ADAPTER",
    "UNKNOWN_COMMAND",
    "UNKNOWN_DRIVER",
    "UNKNOWN_FRAME",
    "UNKNOWN_REQUEST",
    "UNKNOWN_RUN",
    "UNKNOWN_SDK",
    "UNKNOWN_SESSION",
    "UNKNOWN_SUBSCRIPTION",
    "VERSION_MISMATCH",
    "AnyCommand",
    "AskPermission",
    "Bye",
    "CancelRun",
    "ClientFrame",
    "Command",
    "Error",
    "ErrorInfo",
    "Events",
    "Frame",
    "Gap",
    "Goodbye",
    "Hello",
    "Ingest",
    "Limits",
    "Outgoing",
    "PermissionReply",
    "Ping",
    "Pong",
    "ProtocolError",
    "Publish",
    "Reply",
    "Request",
    "Role",
    "Runs",
    "ServerFrame",
    "Sessions",
    "Snapshot",
    "StartRun",
    "Stats",
    "Status",
    "Subscribe",
    "Unsubscribe",
    "Welcome",
    "frame_op",
]

PROTOCOL_VERSION = 1
"""The version a client sends in ``hello``; any other version is refused."""

DEFAULT_MAX_FRAME = 1 << 20
"""Largest frame body (bytes, prefix excluded) a decoder accepts unless told otherwise."""


# -- error codes -------------------------------------------------------------

BAD_HANDSHAKE = "bad_handshake"
VERSION_MISMATCH = "version_mismatch"
FRAME_TOO_LARGE = "frame_too_large"
MALFORMED_FRAME = "malformed_frame"
UNKNOWN_FRAME = "unknown_frame"
INVALID_EVENT = "invalid_event"
INVALID_PATTERN = "invalid_pattern"
TOO_MANY_SUBSCRIPTIONS = "too_many_subscriptions"
TOO_MANY_REQUESTS = "too_many_requests"
UNKNOWN_SUBSCRIPTION = "unknown_subscription"
UNKNOWN_COMMAND = "unknown_command"
UNKNOWN_SDK = "unknown_sdk"
HANDSHAKE_TIMEOUT = "handshake_timeout"
FORBIDDEN = "forbidden"
TOO_MANY_CONNECTIONS = "too_many_connections"
UNKNOWN_SESSION = "unknown_session"
SEQ_AHEAD = "seq_ahead"
UNKNOWN_ADAPTER = "unknown_adapter"
UNKNOWN_DRIVER = "unknown_driver"
SESSION_BUSY = "session_busy"
UNKNOWN_RUN = "unknown_run"
RUN_FINISHED = "run_finished"
UNKNOWN_REQUEST = "unknown_request"
ALREADY_RESOLVED = "already_resolved"
INVALID_OPTION = "invalid_option"
SLOW_CONSUMER = "slow_consumer"
SHUTDOWN = "shutdown"
BYE = "bye"
INTERNAL_ERROR = "internal_error"
NOT_JOURNALED = "not_journaled"

ERROR_CODES: Mapping[str, str] = {
    BAD_HANDSHAKE: "the first frame was not a valid hello (fatal)",
    VERSION_MISMATCH: "hello.protocol is not a version this server speaks (fatal)",
    FRAME_TOO_LARGE: "a length prefix over the receiver's max_frame (fatal: the stream is lost)",
    MALFORMED_FRAME: "a body that is not msgpack, not a map, or does not fit its frame's schema",
    UNKNOWN_FRAME: "an op this side does not know",
    INVALID_EVENT: "an event that is not in the receiver's catalog or does not fit its type",
    INVALID_PATTERN: "a subscribe pattern that breaks the token rules (ref: subscription id)",
    TOO_MANY_SUBSCRIPTIONS: "subscribe over limits.max_subscriptions (ref: subscription id)",
    TOO_MANY_REQUESTS: "request over limits.max_inflight_requests (reply error)",
    UNKNOWN_SUBSCRIPTION: "unsubscribe of an id that is not live (ref: that id)",
    UNKNOWN_COMMAND: "request.command.cmd that the server does not know (reply error)",
    UNKNOWN_SDK: "ingest for an SDK no adapter handles",
    UNKNOWN_ADAPTER: "start_run names no loaded adapter, or no driver by its name (reply)",
    UNKNOWN_DRIVER: "start_run.driver names no loaded driver (reply; the message lists them)",
    SESSION_BUSY: "start_run on a session whose run is still in progress (reply)",
    UNKNOWN_RUN: "cancel_run of a run id this daemon never started (reply)",
    RUN_FINISHED: "cancel_run of a run that has already ended (reply, harmless)",
    UNKNOWN_REQUEST: "permission_reply to no pending request, or to one of an observed stream",
    ALREADY_RESOLVED: "permission_reply after another answer won (reply, says who)",
    INVALID_OPTION: "permission_reply with an option the request did not offer (reply)",
    SEQ_AHEAD: "subscribe.since_seq is past the head (the daemon restarted): replay starts over",
    UNKNOWN_SESSION: "a snapshot or stats request for a session the daemon does not know (reply)",
    HANDSHAKE_TIMEOUT: "no hello within the handshake timeout (fatal)",
    FORBIDDEN: "the peer's uid may not connect, or its role may not do this (fatal on connect)",
    TOO_MANY_CONNECTIONS: (
        "at hello, the uid's connections are at their limit; before it, the oldest of too "
        "many sockets still in their handshake (fatal)"
    ),
    SLOW_CONSUMER: "goodbye reason: queue full (limits.outbound_cap) and a buffer overflowed",
    SHUTDOWN: "goodbye reason: the daemon is stopping",
    BYE: "goodbye reason: the answer to the client's bye",
    INTERNAL_ERROR: (
        "the daemon failed serving this connection: a failed reply to a request, else the "
        "goodbye reason (the connection ends, the daemon and everyone else go on)"
    ),
    NOT_JOURNALED: "an acknowledged publish or ingest whose events are not (all) in the journal",
}
"""Every code busd sends in ``error.code``, ``reply.error.code`` or ``goodbye.reason``."""


class ProtocolError(BusdError, ValueError):
    """The peer broke the protocol.

    ``fatal`` means the byte stream itself is lost (or the handshake failed),
    so the connection must be closed after sending :meth:`to_frame`; a
    non-fatal error spoils one frame and the next one decodes normally.
    ``op`` is the op of the spoiled frame and ``ref`` its ``id`` (or ``sub``),
    when they could still be read: a server answers a spoiled ``request`` with
    a ``reply`` rather than an ``error``.
    """

    def __init__(
        self,
        code: str,
        message: str,
        *,
        fatal: bool = False,
        ref: int | None = None,
        op: str | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.fatal = fatal
        self.ref = ref
        self.op = op

    def __repr__(self) -> str:
        return (
            f"ProtocolError(code={self.code!r}, message={self.message!r}, "
            f"fatal={self.fatal!r}, ref={self.ref!r}, op={self.op!r})"
        )

    def to_frame(self) -> Error:
        """The ``error`` frame that tells the peer about this error."""
        return Error(code=self.code, message=self.message, fatal=self.fatal, ref=self.ref)


# -- frames ------------------------------------------------------------------

T = TypeVar("T")
EventT = TypeVar("EventT", bound=Event)
EventT_co = TypeVar("EventT_co", bound=Event, covariant=True)

NonNegative = Annotated[int, msgspec.Meta(ge=0)]
Positive = Annotated[int, msgspec.Meta(gt=0)]


class Frame(msgspec.Struct, frozen=True, kw_only=True, tag_field="op", omit_defaults=True):
    """Base class of every frame; subclasses set ``tag=`` to their ``op``."""


def frame_op(frame: Frame) -> str:
    """The ``op`` of ``frame`` (its wire tag)."""
    return frame.__struct_config__.tag  # type: ignore[return-value]


# client → server


Role = Literal["observer", "frontend", "responder", "agent", "admin"]
"""What a client is for; what each may do is in :mod:`busd.wire.roles`."""


class Hello(Frame, frozen=True, tag="hello"):
    """The first frame of every connection."""

    protocol: int
    client: str
    role: Role = "frontend"


class Subscribe(Frame, frozen=True, tag="subscribe"):
    """Ask for the events whose type matches one of ``patterns`` (NATS tokens).

    A live subscription with the same ``id`` is replaced.

    ``sessions`` restricts to those session ids (``None``: all);
    ``owned_only`` to the runs this client started; ``since_seq`` replays
    every retained event with a greater ``seq`` first (a ``gap`` says what
    was evicted). ``deltas="raw"`` turns off delta concatenation.
    """

    id: int
    patterns: tuple[str, ...] = (">",)
    sessions: tuple[str, ...] | None = None
    owned_only: bool = False
    window_ms: Annotated[int, msgspec.Meta(ge=0, le=60_000)] = 16
    deltas: Literal["merged", "raw"] = "merged"
    since_seq: NonNegative | None = None


class Unsubscribe(Frame, frozen=True, tag="unsubscribe"):
    """End subscription ``id``; events already batched for it are dropped."""

    id: int


class Outgoing(msgspec.Struct, Generic[EventT_co], frozen=True, kw_only=True, omit_defaults=True):
    """One event a client publishes, with the ids the daemon cannot infer."""

    event: EventT_co
    session_id: str | None = None
    run_id: str | None = None
    agent_id: str | None = None


class Publish(Frame, Generic[EventT], frozen=True, tag="publish"):
    """Events for the bus; the server validates and sequences each one on its own.

    ``ack``: an id chosen by the client; the server answers with a ``reply``
    of that id once every event this connection has published is journaled.
    """

    events: list[Outgoing[EventT]]
    ack: int | None = None


class Ingest(Frame, frozen=True, tag="ingest"):
    """Raw SDK payloads (JSON-like) for the adapter registered as ``sdk``.

    One translator per (connection, sdk, session_id) keeps the stream's
    state across frames; ``end`` finishes it (so does closing the connection).
    ``ack`` asks for a ``reply`` as on ``publish``.
    """

    sdk: str
    events: list[Any]
    session_id: str | None = None
    end: bool = False
    ack: int | None = None


class Command(msgspec.Struct, frozen=True, kw_only=True, tag_field="cmd", omit_defaults=True):
    """Base class of what a ``request`` asks for; subclasses set ``tag=`` to their ``cmd``."""


class Status(Command, frozen=True, tag="status"):
    """The daemon's status: version, uptime, head ``seq``, clients, adapters."""


class Sessions(Command, frozen=True, tag="sessions"):
    """Known sessions, most recently active first, at most ``limit`` of them."""

    limit: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 100


class Snapshot(Command, frozen=True, tag="snapshot"):
    """What a UI needs to draw ``session_id`` right now (state, stats, context)."""

    session_id: str


class Stats(Command, frozen=True, tag="stats"):
    """Accounting of one session, or of the whole daemon when ``session_id`` is ``None``."""

    session_id: str | None = None


class StartRun(Command, frozen=True, tag="start_run"):
    """Run a prompt with a driver; the reply carries ``run_id`` and ``session_id`` at once.

    ``driver`` defaults to the driver named like ``adapter``; ``replay`` plays
    a recording of that adapter's SDK instead (docs/runs.md).
    ``permission_rules`` bind the run's requests before any frontend is asked.
    """

    adapter: str
    prompt: str
    driver: str | None = None
    session_id: str | None = None
    model: str | None = None
    system_prompt: str | None = None
    cwd: str | None = None
    permission_mode: str | None = None
    max_turns: int | None = None
    options: dict[str, Any] = {}
    request_id: str | None = None
    """The frontend's own id for the run, echoed on every ``busd.run.*`` event of it."""
    permission_rules: tuple[PermissionRule, ...] = ()
    """The starter's rules for this run's permission requests, first match wins; checked
    after plugin policy and the daemon's rules, before any frontend is asked. A rule
    that decides is published with ``by`` the starter's identity and its ``reason``."""
    env: dict[str, str] | None = None
    """The environment the agent runs with: the whole of it, not added to the daemon's
    (``busd run`` sends its own). ``None``: the daemon's. Never published or logged."""
    context_window: Positive | None = None
    """The context window of the run's session, in tokens: it wins over the model table
    and the config's ``[context.windows]``, for this run and the session's later ones
    (until another run gives its own). ``None``: the table's."""
    output_reserve: NonNegative | None = None
    """Tokens kept for the model's output (``free`` leaves them out); only with
    ``context_window`` and below it. ``None``: the table's reserve for the model,
    when that is below the window."""

    def __post_init__(self) -> None:
        reserve, window = self.output_reserve, self.context_window
        if reserve is not None and (window is None or reserve >= window):
            raise ValueError(
                "output_reserve needs a context_window above it "
                f"(output_reserve={reserve}, context_window={window})"
            )


class CancelRun(Command, frozen=True, tag="cancel_run"):
    """Stop a run; it ends with ``busd.run.finished`` status ``cancelled``."""

    run_id: str
    reason: str | None = None


class PermissionReply(Command, frozen=True, tag="permission_reply"):
    """Answer a driven run's permission request; the first valid answer wins."""

    request_id: str
    option_id: str | None = None
    allow: bool | None = None
    reason: str | None = None


class AskPermission(Command, frozen=True, tag="ask_permission"):
    """Ask busd's permission broker, for an agent busd does not drive (a hook).

    The daemon publishes the request (``source``: the asking connection) and
    replies with the decision once policy, a rule or a frontend gives one,
    or ``unanswered`` after ``timeout`` seconds (docs/protocol.md).
    """

    session_id: str
    tool: str
    input: dict[str, Any] = {}
    request_id: str | None = None
    tool_call_id: str | None = None
    agent_id: str | None = None
    title: str | None = None
    category: str | None = None
    options: list[PermissionOption] = []
    timeout: Annotated[float, msgspec.Meta(gt=0, le=86_400)] = 60.0


class Runs(Command, frozen=True, tag="runs"):
    """The runs this daemon started, with their status."""


# To add a command: define a ``Command`` subclass with its ``tag`` and add it
# here; decoders, the unknown_command check and the docs test pick it up.
AnyCommand: TypeAlias = (
    Status
    | Sessions
    | Snapshot
    | Stats
    | StartRun
    | CancelRun
    | PermissionReply
    | AskPermission
    | Runs
)
COMMANDS: tuple[type[Command], ...] = (
    Status,
    Sessions,
    Snapshot,
    Stats,
    StartRun,
    CancelRun,
    PermissionReply,
    AskPermission,
    Runs,
)


class Request(Frame, frozen=True, tag="request"):
    """A command; the server answers with a ``reply`` carrying the same ``id``."""

    id: int
    command: AnyCommand


class Ping(Frame, frozen=True, tag="ping"):
    """Ask for a ``pong`` with the same ``nonce``."""

    nonce: int = 0


class Bye(Frame, frozen=True, tag="bye"):
    """The client is leaving; the server answers ``goodbye`` and closes."""


# server → client


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    """What the server enforces on this connection; always sent in full."""

    max_frame: int = DEFAULT_MAX_FRAME
    max_subscriptions: int = 64
    max_inflight_requests: int = 16
    outbound_cap: int = 8 << 20
    window_ms_default: int = 16
    replay_capacity: int = 100_000


class Welcome(Frame, frozen=True, tag="welcome"):
    """The answer to a good ``hello``: who the client is and where the stream stands."""

    server: str
    protocol: int
    client_id: int
    head_seq: int
    limits: Limits
    identity: str = ""
    """How the daemon labels this connection in ``source`` and ``by`` (wire.roles)."""
    rights: tuple[str, ...] = ()
    """What this connection's role may change, beyond reading (wire.roles)."""


class Events(Frame, Generic[T], frozen=True, tag="events"):
    """One batch for subscription ``sub``, in ``seq`` order.

    The server builds ``Events[msgspec.Raw]`` from envelopes encoded once by
    :func:`encode_envelope`; clients decode ``Events[Envelope[...]]``.
    """

    sub: int
    events: list[T]


class ErrorInfo(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Why a request failed."""

    code: str
    message: str


class Reply(Frame, frozen=True, tag="reply"):
    """The answer to request ``id``: ``result`` when ``ok``, else ``error``."""

    id: int
    ok: bool
    result: Any = None
    error: ErrorInfo | None = None


class Error(Frame, frozen=True, tag="error"):
    """A protocol error; after a ``fatal`` one the server closes the connection."""

    code: str
    message: str
    fatal: bool = False
    ref: int | None = None


class Gap(Frame, frozen=True, tag="gap"):
    """Events ``from_seq`` to ``to_seq`` (inclusive) of ``sub`` are lost for good."""

    sub: int
    from_seq: int
    to_seq: int


class Goodbye(Frame, frozen=True, tag="goodbye"):
    """The server is closing the connection; resubscribe with ``since_seq=resume_seq``.

    ``reason`` is ``bye``, ``shutdown``, ``slow_consumer``, or the code of the
    fatal error just sent. Every event a subscription of this connection
    matched, up to ``resume_seq``, was sent before this frame: resuming from it
    misses nothing.
    """

    reason: str
    resume_seq: int | None = None


class Pong(Frame, frozen=True, tag="pong"):
    """The answer to ``ping``."""

    nonce: int = 0


ClientFrame: TypeAlias = (
    Hello | Subscribe | Unsubscribe | Publish[Any] | Ingest | Request | Ping | Bye
)
ServerFrame: TypeAlias = Welcome | Events[Any] | Reply | Error | Gap | Goodbye | Pong

CLIENT_FRAMES: tuple[type[Frame], ...] = (
    Hello,
    Subscribe,
    Unsubscribe,
    Publish,
    Ingest,
    Request,
    Ping,
    Bye,
)
SERVER_FRAMES: tuple[type[Frame], ...] = (Welcome, Events, Reply, Error, Gap, Goodbye, Pong)
