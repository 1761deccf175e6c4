"""The busd wire protocol's codec, sans-I/O: an incremental decoder and an encoder.

Nothing here touches a socket or a clock; the Trio server and client feed
bytes in and write the bytes they get back, so every rule of the protocol is
tested without I/O.

Frames that carry events are generic over the event type, because the event
catalog grows at startup (plugins) and msgspec decodes a tagged union only
over the classes it is given: decoders are built at run time from a
:class:`~busd.core.catalog.Catalog` by :func:`client_frame_decoder` and
:func:`server_frame_decoder`. The server encodes each envelope once
(:func:`encode_envelope`) and sends the same bytes to every subscriber inside
``Events[msgspec.Raw]``; the client decodes ``Events[Envelope[...]]``.
"""

from __future__ import annotations

import struct
import types
from collections.abc import Iterator, Sequence
from typing import Any, Generic, Literal, TypeVar, Union, get_args, get_origin

import msgspec
import msgspec.inspect as mi

from ..core.catalog import Catalog
from ..core.events import Envelope
from .frames import (
    BAD_HANDSHAKE,
    CLIENT_FRAMES,
    COMMANDS,
    DEFAULT_MAX_FRAME,
    FRAME_TOO_LARGE,
    HANDSHAKE_TIMEOUT,
    INVALID_EVENT,
    MALFORMED_FRAME,
    PROTOCOL_VERSION,
    SERVER_FRAMES,
    UNKNOWN_COMMAND,
    UNKNOWN_FRAME,
    VERSION_MISMATCH,
    ClientFrame,
    Error,
    Events,
    Frame,
    Hello,
    Limits,
    ProtocolError,
    Publish,
    ServerFrame,
    Welcome,
    frame_op,
)
from .roles import name_refusal

__all__ = [
    "Encoder",
    "FrameDecoder",
    "ServerFrameDecoder",
    "ServerHandshake",
    "client_frame_decoder",
    "encode_envelope",
    "encode_envelopes",
    "encode_frame",
    "pack_events",
    "server_frame_decoder",
]

_MAX_LENGTH = 0xFFFF_FFFF  # what a 4-byte prefix can say
_PREFIX = struct.Struct(">I")
_unpack_from = _PREFIX.unpack_from
_COMPACT_AT = 1 << 16  # consumed bytes worth a memmove of the unconsumed tail

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


def encode_envelopes(envelopes: Sequence[Envelope[Any]]) -> list[msgspec.Raw]:
    """:func:`encode_envelope` of each, without a Python call per envelope (a run of deltas)."""
    return list(map(msgspec.Raw, map(_ENCODER.encode, envelopes)))


_NOTHING = msgspec.Raw(b"")


def pack_events(raws: list[msgspec.Raw]) -> bytes:
    """The ``events`` array of an ``events`` frame, built once for every subscriber sharing it."""
    return _ENCODER.encode(raws)


class _EventsHead(Frame, frozen=True, tag="events"):
    """An ``events`` frame up to its array: ``events`` is empty raw bytes, the array follows."""

    sub: int
    events: msgspec.Raw


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

    def events_head(self, sub: int, packed: bytes) -> bytes:
        """The bytes that, followed by ``packed`` (:func:`pack_events`), make an ``events`` frame.

        The array is shared: subscribers of one batch send the same array
        behind their own few bytes of head, and nothing big is copied per
        subscriber before the kernel.
        """
        buffer = self._buffer
        self._encoder.encode_into(_EventsHead(sub=sub, events=_NOTHING), buffer, 4)
        length = len(buffer) - 4 + len(packed)
        if length > self.max_frame:
            raise ProtocolError(
                FRAME_TOO_LARGE, f"frame of {length} bytes is over max_frame={self.max_frame}"
            )
        _PREFIX.pack_into(buffer, 0, length)
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
    ack: Any = None
    command: Any = None


_PROBE = msgspec.msgpack.Decoder(_Probe)
_DECODE_ERRORS = (msgspec.DecodeError, ValueError, RecursionError)  # what hostile bytes raise
_COMMAND_TAGS = frozenset(str(cls.__struct_config__.tag) for cls in COMMANDS)

# The first byte of every msgpack bin (c4-c6), ext (c7-c9) and fixext (d4-d8)
# value: a body without any of them holds none, and needs no walk. (Deleting
# them and comparing lengths is a C loop; a regex search is ten times slower.)
_NOT_JSON_MARKERS = bytes([*range(0xC4, 0xCA), *range(0xD4, 0xD9)])
_JSON_SCALARS = frozenset({str, int, float, bool, type(None)})


_OPEN_FIELDS: dict[type, tuple[str, ...]] = {}


def _open_fields(cls: type) -> tuple[str, ...]:
    """The fields of struct ``cls`` that may hold an ``Any`` value (or a struct that may)."""
    fields = _OPEN_FIELDS.get(cls)
    if fields is None:
        info = mi.type_info(cls)
        assert isinstance(info, mi.StructType)
        fields = _OPEN_FIELDS[cls] = tuple(f.name for f in info.fields if _may_hold_any(f.type))
    return fields


def _may_hold_any(t: mi.Type) -> bool:
    match t:
        case mi.AnyType() | mi.StructType() | mi.CustomType():
            return True
        case mi.UnionType(types=members) | mi.TupleType(item_types=members):
            return any(_may_hold_any(m) for m in members)
        case mi.CollectionType(item_type=item):
            return _may_hold_any(item)
        case (
            mi.DictType(key_type=key, value_type=value)
            | mi.FrozenDictType(key_type=key, value_type=value)
        ):
            return _may_hold_any(key) or _may_hold_any(value)
    return False


def _json_like(frame: object) -> bool:
    """Whether ``frame`` holds no value msgpack has and JSON lacks (binary, extension, timestamp).

    Only the ``Any`` parts of a frame can hold one (the typed fields were
    validated by the decoder), so only those are walked; :func:`_not_json_path`
    then says where, the rare time it matters.
    """
    stack = [frame]
    pop, push, known = stack.pop, stack.append, _OPEN_FIELDS.get
    while stack:
        value = pop()
        kind = type(value)
        if kind in _JSON_SCALARS:
            continue
        fields = known(kind)
        if fields is None and isinstance(value, msgspec.Struct):
            fields = _open_fields(kind)
        if fields is not None:
            for name in fields:
                push(getattr(value, name))
        elif kind is dict:
            assert isinstance(value, dict)
            if any(type(key) not in _JSON_SCALARS for key in value):
                return False
            stack.extend(value.values())
        elif kind is list or kind is tuple:
            assert isinstance(value, list | tuple)
            stack.extend(value)
        else:
            return False  # bytes, msgspec.msgpack.Ext, datetime
    return True


def _not_json_path(frame: object) -> str:
    """Where :func:`_json_like` found a value JSON lacks (a JSON path)."""
    stack: list[tuple[object, str]] = [(frame, "$")]
    while stack:
        value, path = stack.pop()
        kind = type(value)
        if kind in _JSON_SCALARS:
            continue
        if kind is dict:
            assert isinstance(value, dict)
            for key, item in value.items():
                if type(key) not in _JSON_SCALARS:
                    return f"{path} (a key)"
                stack.append((item, f"{path}.{key}"))
        elif kind is list or kind is tuple:
            assert isinstance(value, list | tuple)
            stack.extend((item, f"{path}[{i}]") for i, item in enumerate(value))
        elif isinstance(value, msgspec.Struct):
            stack.extend((getattr(value, n), f"{path}.{n}") for n in _open_fields(type(value)))
        else:
            return path  # bytes, msgspec.msgpack.Ext, datetime
    return "$"


def _refuse_not_json(frame: object, path: str) -> ProtocolError:
    op = frame_op(frame) if isinstance(frame, Frame) else type(frame).__name__
    ref = _int_or_none(getattr(frame, "ack" if op in _ACKED else "id", None))
    why = f"a binary or extension value at `{path}` (only JSON-like values are allowed)"
    if op == "publish":
        message = f"invalid event in publish frame: {why}"
        return ProtocolError(INVALID_EVENT, message, ref=ref, op=op)
    return ProtocolError(MALFORMED_FRAME, f"invalid {op} frame: {why}", ref=ref, op=op)


_ACKED = frozenset({"publish", "ingest"})  # their ref is the ack id they asked for


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

    ``json_like`` (the server's side): a frame whose ``Any`` values hold
    msgpack's binary, extension or timestamp values, which the protocol
    excludes, is refused like one that does not fit its schema
    (``invalid_event`` in a ``publish``, else ``malformed_frame``).
    """

    __slots__ = (
        "_buffer",
        "_decoder",
        "_fatal",
        "_json_like",
        "_next_prefix",
        "_ops",
        "_pos",
        "max_frame",
    )

    def __init__(
        self, frame_type: Any, *, max_frame: int = DEFAULT_MAX_FRAME, json_like: bool = False
    ) -> None:
        if not 0 <= max_frame <= _MAX_LENGTH:
            raise ValueError(f"max_frame must be in [0, 2**32 - 1], not {max_frame}")
        self.max_frame = max_frame
        self._json_like = json_like
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

    @property
    def complete(self) -> bool:
        """Whether a whole frame is buffered: :meth:`next_frame` would not return ``None``."""
        pos = self._pos
        size = len(self._buffer)
        if size - pos < 4:
            return self._fatal is not None and pos == size  # it raises
        (length,) = _unpack_from(self._buffer, pos)
        return bool(pos + 4 + length <= size)

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
            frame = self._decoder.decode(body)
        except _DECODE_ERRORS as exc:
            return self._recover(body, exc)
        json_like = not self._json_like or len(body.translate(None, _NOT_JSON_MARKERS)) == len(body)
        if not json_like and not _json_like(frame):
            raise _refuse_not_json(frame, _not_json_path(frame))
        return frame

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
        ref = _int_or_none(
            probe.sub if op in ("events", "gap") else probe.ack if op in _ACKED else probe.id
        )
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
    """A decoder of client → server frames (the server's side of a connection), JSON-like."""
    frame_type = _parametrized(CLIENT_FRAMES, Publish, catalog.union())
    return FrameDecoder(frame_type, max_frame=max_frame, json_like=True)


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
        super().__init__(_parametrized(SERVER_FRAMES, Events, envelope), max_frame=max_frame)
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
        refusal = name_refusal(frame.client)
        if refusal is not None:
            return self._fail(*refusal)
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
