"""The busd wire protocol, sans-I/O: frame types, an incremental decoder and an encoder.

A frame on the wire is a 4-byte big-endian unsigned length followed by that
many bytes of msgpack: one map tagged by its ``op`` key. Nothing here touches
a socket or a clock; the Trio server and client feed bytes in and write the
bytes they get back, so every rule of the protocol is tested without I/O.

Frames that carry events are generic over the event type, because the event
catalog grows at startup (plugins) and msgspec decodes a tagged union only
over the classes it is given: decoders are built at run time from a
:class:`~busd.catalog.Catalog` by :func:`client_frame_decoder` and
:func:`server_frame_decoder`. The server encodes each envelope once
(:func:`encode_envelope`) and sends the same bytes to every subscriber inside
``Events[msgspec.Raw]``; the client decodes ``Events[Envelope[...]]``.

The protocol itself is written down in ``docs/protocol.md``.
"""

from __future__ import annotations

import struct
import types
from collections.abc import Iterator, Mapping
from typing import (
    Annotated,
    Any,
    Generic,
    Literal,
    TypeAlias,
    TypeVar,
    Union,
    get_args,
    get_origin,
)

import msgspec

from ..core.catalog import Catalog
from ..core.errors import BusdError
from ..core.events import Envelope, Event

__all__ = [
    "ALREADY_RESOLVED",
    "BAD_HANDSHAKE",
    "BYE",
    "COMMANDS",
    "DEFAULT_MAX_FRAME",
    "ERROR_CODES",
    "FORBIDDEN",
    "FRAME_TOO_LARGE",
    "HANDSHAKE_TIMEOUT",
    "INTERNAL",
    "INVALID_EVENT",
    "INVALID_OPTION",
    "INVALID_PATTERN",
    "MALFORMED_FRAME",
    "PROTOCOL_VERSION",
    "RUN_FINISHED",
    "SEQ_AHEAD",
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
    "Bye",
    "CancelRun",
    "ClientFrame",
    "Command",
    "Encoder",
    "Error",
    "ErrorInfo",
    "Events",
    "Frame",
    "FrameDecoder",
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
    "Runs",
    "ServerFrame",
    "ServerFrameDecoder",
    "ServerHandshake",
    "Sessions",
    "Snapshot",
    "StartRun",
    "Stats",
    "Status",
    "Subscribe",
    "Unsubscribe",
    "Welcome",
    "client_frame_decoder",
    "encode_envelope",
    "encode_frame",
    "frame_op",
    "server_frame_decoder",
]

PROTOCOL_VERSION = 1
"""The version a client sends in ``hello``; any other version is refused."""

DEFAULT_MAX_FRAME = 1 << 20
"""Largest frame body (bytes, prefix excluded) a decoder accepts unless told otherwise."""

_MAX_LENGTH = 0xFFFF_FFFF  # what a 4-byte prefix can say
_PREFIX = struct.Struct(">I")
_unpack_from = _PREFIX.unpack_from
_COMPACT_AT = 1 << 16  # consumed bytes worth a memmove of the unconsumed tail

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
INTERNAL = "internal"

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
    TOO_MANY_CONNECTIONS: "the peer's uid already has the most connections allowed (fatal)",
    SLOW_CONSUMER: "goodbye reason: queue full (limits.outbound_cap) and a buffer overflowed",
    SHUTDOWN: "goodbye reason: the daemon is stopping",
    BYE: "goodbye reason: the answer to the client's bye",
    INTERNAL: "the server failed while handling a frame; the daemon stays up",
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


class Frame(msgspec.Struct, frozen=True, kw_only=True, tag_field="op", omit_defaults=True):
    """Base class of every frame; subclasses set ``tag=`` to their ``op``."""


def frame_op(frame: Frame) -> str:
    """The ``op`` of ``frame`` (its wire tag)."""
    return frame.__struct_config__.tag  # type: ignore[return-value]


# client → server


class Hello(Frame, frozen=True, tag="hello"):
    """The first frame of every connection."""

    protocol: int
    client: str
    role: Literal["frontend", "agent", "responder", "admin"] = "frontend"


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
    """Events for the bus; the server validates and sequences each one on its own."""

    events: list[Outgoing[EventT]]


class Ingest(Frame, frozen=True, tag="ingest"):
    """Raw SDK payloads (JSON-like) for the adapter registered as ``sdk``.

    One translator per (connection, sdk, session_id) keeps the stream's
    state across frames; ``end`` finishes it (so does closing the connection).
    """

    sdk: str
    events: list[Any]
    session_id: str | None = None
    end: bool = False


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


class Runs(Command, frozen=True, tag="runs"):
    """The runs this daemon started, with their status."""


# To add a command: define a ``Command`` subclass with its ``tag`` and add it
# here; decoders, the unknown_command check and the docs test pick it up.
AnyCommand: TypeAlias = (
    Status | Sessions | Snapshot | Stats | StartRun | CancelRun | PermissionReply | Runs
)
COMMANDS: tuple[type[Command], ...] = (
    Status,
    Sessions,
    Snapshot,
    Stats,
    StartRun,
    CancelRun,
    PermissionReply,
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
    """The server is closing the connection; resubscribe with ``since_seq=resume_seq``."""

    reason: str
    resume_seq: int | None = None


class Pong(Frame, frozen=True, tag="pong"):
    """The answer to ``ping``."""

    nonce: int = 0


ClientFrame: TypeAlias = (
    Hello | Subscribe | Unsubscribe | Publish[Any] | Ingest | Request | Ping | Bye
)
ServerFrame: TypeAlias = Welcome | Events[Any] | Reply | Error | Gap | Goodbye | Pong

_CLIENT_FRAMES: tuple[type[Frame], ...] = (
    Hello,
    Subscribe,
    Unsubscribe,
    Publish,
    Ingest,
    Request,
    Ping,
    Bye,
)
_SERVER_FRAMES: tuple[type[Frame], ...] = (Welcome, Events, Reply, Error, Gap, Goodbye, Pong)

# -- encoding ----------------------------------------------------------------

_ENCODER = msgspec.msgpack.Encoder()


def encode_frame(frame: Frame) -> bytes:
    """``frame`` with its length prefix, ready to write."""
    buffer = bytearray()
    _ENCODER.encode_into(frame, buffer, 4)
    _PREFIX.pack_into(buffer, 0, len(buffer) - 4)
    return bytes(buffer)


def encode_envelope(envelope: Envelope[Any]) -> msgspec.Raw:
    """``envelope`` as msgpack, encoded once to be embedded in many ``Events`` frames."""
    return msgspec.Raw(_ENCODER.encode(envelope))


class Encoder:
    """Frames to bytes, reusing one msgspec encoder and one buffer (the hot path).

    A frame whose body is over ``max_frame`` raises a non-fatal
    :class:`ProtocolError` (``frame_too_large``) before anything is written,
    so a client can split a ``publish`` to fit the server's ``limits``.
    """

    __slots__ = ("_buffer", "_encoder", "max_frame")

    def __init__(self, *, max_frame: int = _MAX_LENGTH) -> None:
        if not 0 <= max_frame <= _MAX_LENGTH:
            raise ValueError(f"max_frame must be in [0, 2**32 - 1], not {max_frame}")
        self.max_frame = max_frame
        self._encoder = msgspec.msgpack.Encoder()
        self._buffer = bytearray()

    def encode(self, frame: Frame) -> bytes:
        """``frame`` with its length prefix."""
        buffer = self._buffer
        self._encoder.encode_into(frame, buffer, 4)
        self._seal(buffer, 0)
        return bytes(buffer)

    def encode_into(self, frame: Frame, out: bytearray) -> None:
        """Append ``frame`` with its length prefix to ``out`` (to coalesce writes)."""
        start = len(out)
        try:
            self._encoder.encode_into(frame, out, start + 4)
            self._seal(out, start)
        except BaseException:
            del out[start:]  # never leave half a frame behind
            raise

    def _seal(self, buffer: bytearray, start: int) -> None:
        length = len(buffer) - start - 4
        if length > self.max_frame:
            raise ProtocolError(
                FRAME_TOO_LARGE, f"frame of {length} bytes is over max_frame={self.max_frame}"
            )
        _PREFIX.pack_into(buffer, start, length)


# -- decoding ----------------------------------------------------------------

F = TypeVar("F")


class _Probe(msgspec.Struct):
    """What an invalid frame still tells us, to pick an error code and a ``ref``."""

    op: Any = None
    id: Any = None
    sub: Any = None
    command: Any = None


_PROBE = msgspec.msgpack.Decoder(_Probe)
_DECODE_ERRORS = (msgspec.DecodeError, ValueError, RecursionError)  # what hostile bytes raise
_COMMAND_TAGS = frozenset(str(cls.__struct_config__.tag) for cls in COMMANDS)


def _int_or_none(value: object) -> int | None:
    return value if type(value) is int else None


class FrameDecoder(Generic[F]):
    """Bytes in arbitrary chunks → frames of ``frame_type``, in order.

    :meth:`feed` buffers bytes and never raises; :meth:`next_frame` returns
    the next frame, ``None`` when it needs more bytes, or raises
    :class:`ProtocolError`. A frame that does not decode raises a non-fatal
    error and is skipped, so the caller may go on. A length prefix over
    ``max_frame`` is caught when the prefix arrives: the body is never
    buffered, the frames before it are still returned, and then every call
    raises the fatal ``frame_too_large`` error. The outcome depends only on
    the bytes, never on how they were chunked.
    """

    __slots__ = ("_buffer", "_decoder", "_fatal", "_next_prefix", "_ops", "_pos", "max_frame")

    def __init__(self, frame_type: Any, *, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        if not 0 <= max_frame <= _MAX_LENGTH:
            raise ValueError(f"max_frame must be in [0, 2**32 - 1], not {max_frame}")
        self.max_frame = max_frame
        self._decoder: msgspec.msgpack.Decoder[F] = msgspec.msgpack.Decoder(frame_type)
        self._ops = _tags_of(frame_type)
        self._buffer = bytearray()
        self._pos = 0  # start of the first unconsumed frame in _buffer
        self._next_prefix = 0  # offset in _buffer of the first prefix feed has not checked
        self._fatal: ProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes received and not yet returned as frames."""
        return len(self._buffer) - self._pos

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Buffer ``data``; after a fatal error, ignore it (the stream is lost)."""
        if self._fatal is not None:
            return
        buffer = self._buffer
        base = len(buffer)
        end = base + len(data)
        prefix = self._next_prefix
        # Check every length prefix that completes in this chunk before buffering its body.
        while prefix + 4 <= end:
            if prefix >= base:
                (length,) = _unpack_from(data, prefix - base)
            else:  # the prefix straddles the buffer and this chunk
                (length,) = _PREFIX.unpack(
                    bytes(buffer[prefix:]) + bytes(data[: prefix + 4 - base])
                )
            if length > self.max_frame:
                if prefix >= base:
                    buffer += data[: prefix - base]
                else:
                    del buffer[prefix:]
                self._next_prefix = prefix
                self._fatal = ProtocolError(
                    FRAME_TOO_LARGE,
                    f"frame of {length} bytes is over max_frame={self.max_frame}",
                    fatal=True,
                )
                return
            prefix += 4 + length
        buffer += data
        self._next_prefix = prefix

    def next_frame(self) -> F | None:
        """The next decoded frame, or ``None`` until more bytes are fed."""
        buffer = self._buffer
        pos = self._pos
        size = len(buffer)
        if size - pos < 4:
            if self._fatal is not None and pos == size:
                fatal = self._fatal
                raise ProtocolError(fatal.code, fatal.message, fatal=True)
            return None
        (length,) = _unpack_from(buffer, pos)
        end = pos + 4 + length
        if end > size:
            return None
        # A copy of one frame: decoding a view would pin the buffer (msgspec.Raw keeps it).
        body = buffer[pos + 4 : end]
        if end == size:
            buffer.clear()
            self._shift(end)
        elif end >= _COMPACT_AT and end * 2 >= size:
            del buffer[:end]
            self._shift(end)
        else:
            self._pos = end
        try:
            return self._decoder.decode(body)
        except _DECODE_ERRORS as exc:
            failure = exc
        return self._recover(body, failure)

    def __iter__(self) -> Iterator[F]:
        return self

    def __next__(self) -> F:
        frame = self.next_frame()
        if frame is None:
            raise StopIteration
        return frame

    def _shift(self, consumed: int) -> None:
        self._pos = 0
        self._next_prefix -= consumed

    def _recover(self, body: bytearray, exc: Exception) -> F:
        """Make what can be made of a body that did not decode; by default, nothing."""
        raise self._explain(body, exc)

    def _explain(self, body: bytearray, exc: Exception) -> ProtocolError:
        """Turn a msgspec failure into the most specific error code we can justify."""
        if isinstance(exc, RecursionError):
            return ProtocolError(MALFORMED_FRAME, "malformed frame: nested too deeply")
        if isinstance(exc, UnicodeDecodeError):
            return ProtocolError(MALFORMED_FRAME, f"malformed frame: a string is not UTF-8 ({exc})")
        if not isinstance(exc, msgspec.ValidationError):
            return ProtocolError(MALFORMED_FRAME, f"malformed frame: {exc}")
        try:
            probe = _PROBE.decode(body)
        except _DECODE_ERRORS:
            return ProtocolError(MALFORMED_FRAME, f"malformed frame: {exc}")
        op = probe.op
        if not isinstance(op, str):
            return ProtocolError(MALFORMED_FRAME, f"malformed frame: {exc}")
        if op not in self._ops:
            return ProtocolError(UNKNOWN_FRAME, f"unknown frame op {op!r}", op=op)
        ref = _int_or_none(probe.sub if op in ("events", "gap") else probe.id)
        if op == "request" and isinstance(probe.command, dict):
            cmd = probe.command.get("cmd")
            if isinstance(cmd, str) and cmd not in _COMMAND_TAGS:
                return ProtocolError(UNKNOWN_COMMAND, f"unknown command {cmd!r}", ref=ref, op=op)
        if " - at `$.events[" in str(exc):
            message = f"invalid event in {op} frame: {exc}"
            return ProtocolError(INVALID_EVENT, message, ref=ref, op=op)
        return ProtocolError(MALFORMED_FRAME, f"invalid {op} frame: {exc}", ref=ref, op=op)


def _tags_of(frame_type: Any) -> frozenset[str]:
    """The ``op`` tags a (union of) frame type(s) can decode."""
    union = get_origin(frame_type) in (Union, types.UnionType)
    tags = set()
    for member in get_args(frame_type) if union else (frame_type,):
        cls = get_origin(member) or member  # Events[X] → Events
        if isinstance(cls, type) and issubclass(cls, Frame):
            tags.add(str(cls.__struct_config__.tag))
    return frozenset(tags)


def client_frame_decoder(
    catalog: Catalog, *, max_frame: int = DEFAULT_MAX_FRAME
) -> FrameDecoder[ClientFrame]:
    """A decoder of client → server frames (the server's side of a connection)."""
    frame_type = _parametrized(_CLIENT_FRAMES, Publish, catalog.union())
    return FrameDecoder(frame_type, max_frame=max_frame)


def server_frame_decoder(
    catalog: Catalog, *, max_frame: int = DEFAULT_MAX_FRAME
) -> ServerFrameDecoder:
    """A decoder of server → client frames (the client's side of a connection)."""
    return ServerFrameDecoder(catalog, max_frame=max_frame)


class _EventProbe(msgspec.Struct):
    type: Any = None


_EVENT_PROBE = msgspec.msgpack.Decoder(_EventProbe)
_RAW_ENVELOPE: Any = Envelope[msgspec.Raw]  # type: ignore[type-var] # the event left undecoded


class ServerFrameDecoder(FrameDecoder[ServerFrame]):
    """Server → client frames; skips envelopes of event types ``catalog`` lacks.

    The daemon may load plugins that add event types this client does not
    know. Like unknown keys, those envelopes are skipped (and counted in
    ``skipped_events``) instead of spoiling the whole batch; an envelope of
    a known type that does not fit it still makes the frame ``invalid_event``.
    """

    __slots__ = ("_envelope", "_known", "_lenient", "_raw_envelope", "skipped_events")

    def __init__(self, catalog: Catalog, *, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        envelope = catalog.envelope_type()
        super().__init__(_parametrized(_SERVER_FRAMES, Events, envelope), max_frame=max_frame)
        self._envelope: msgspec.msgpack.Decoder[Envelope[Any]] = msgspec.msgpack.Decoder(envelope)
        self._lenient = msgspec.msgpack.Decoder(Events[msgspec.Raw])
        self._raw_envelope: msgspec.msgpack.Decoder[Any] = msgspec.msgpack.Decoder(_RAW_ENVELOPE)
        self._known = frozenset(catalog.names())
        self.skipped_events = 0

    def _recover(self, body: bytearray, exc: Exception) -> ServerFrame:
        error = self._explain(body, exc)
        if error.code != INVALID_EVENT:
            raise error
        try:
            frame = self._lenient.decode(body)
        except _DECODE_ERRORS:
            raise error from None
        kept: list[Envelope[Any]] = []
        skipped = 0
        for raw in frame.events:
            try:
                kept.append(self._envelope.decode(raw))
            except _DECODE_ERRORS:
                if not self._unknown_type(raw):
                    raise error from None
                skipped += 1
        self.skipped_events += skipped
        return Events(sub=frame.sub, events=kept)

    def _unknown_type(self, raw: msgspec.Raw) -> bool:
        """Whether ``raw`` is a sound envelope whose only fault is an unknown event type."""
        try:
            tag = _EVENT_PROBE.decode(self._raw_envelope.decode(raw).event).type
        except _DECODE_ERRORS:
            return False
        return isinstance(tag, str) and tag not in self._known


def _parametrized(frames: tuple[Any, ...], generic: Any, item: Any) -> Any:
    """The union of ``frames`` with ``generic`` parametrized over ``item``."""
    return Union[tuple(generic[item] if cls is generic else cls for cls in frames)]  # noqa: UP007


# -- handshake ---------------------------------------------------------------


class ServerHandshake:
    """The server's side of ``hello`` → ``welcome``, without I/O.

    Give it the first decoded frame (or the error decoding it raised); it
    returns the frame to send. Anything but a ``welcome`` is fatal: send it
    and close. The Trio shell owns the clock and calls :meth:`timed_out`.
    """

    __slots__ = ("client_id", "hello", "limits", "server", "state")

    def __init__(self, *, server: str, client_id: int, limits: Limits | None = None) -> None:
        self.server = server
        self.client_id = client_id
        self.limits = limits if limits is not None else Limits()
        self.state: Literal["waiting", "done", "failed"] = "waiting"
        self.hello: Hello | None = None

    def receive(self, frame: object, *, head_seq: int) -> Welcome | Error:
        """Answer the first frame: ``welcome`` for a good hello, else a fatal error."""
        self._expect_waiting()
        if not isinstance(frame, Hello):
            op = frame_op(frame) if isinstance(frame, Frame) else type(frame).__name__
            return self._fail(BAD_HANDSHAKE, f"the first frame must be 'hello', not {op!r}")
        if frame.protocol != PROTOCOL_VERSION:
            return self._fail(
                VERSION_MISMATCH,
                f"client speaks protocol {frame.protocol}, "
                f"this server speaks protocol {PROTOCOL_VERSION}",
            )
        self.state = "done"
        self.hello = frame
        return Welcome(
            server=self.server,
            protocol=PROTOCOL_VERSION,
            client_id=self.client_id,
            head_seq=head_seq,
            limits=self.limits,
        )

    def receive_error(self, error: ProtocolError) -> Error:
        """Answer a first frame that did not decode (always fatal)."""
        self._expect_waiting()
        if error.code == FRAME_TOO_LARGE:
            return self._fail(FRAME_TOO_LARGE, error.message)
        return self._fail(BAD_HANDSHAKE, f"the first frame must be a valid hello: {error.message}")

    def timed_out(self) -> Error:
        """No hello in time."""
        self._expect_waiting()
        return self._fail(HANDSHAKE_TIMEOUT, "no hello received in time")

    def _expect_waiting(self) -> None:
        if self.state != "waiting":
            raise RuntimeError(f"the handshake is already {self.state}")

    def _fail(self, code: str, message: str) -> Error:
        self.state = "failed"
        return Error(code=code, message=message, fatal=True)
