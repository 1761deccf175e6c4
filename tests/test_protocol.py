from __future__ import annotations

import re
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest

from busd.core.catalog import Catalog
from busd.core.errors import BusdError
from busd.core.events import (
    Envelope,
    Event,
    PermissionOption,
    SessionIdle,
    TextDelta,
    TokenUsage,
    ToolStart,
    Usage,
)
from busd.wire import (
    BAD_HANDSHAKE,
    COMMANDS,
    DEFAULT_MAX_FRAME,
    ERROR_CODES,
    FRAME_TOO_LARGE,
    HANDSHAKE_TIMEOUT,
    INVALID_EVENT,
    MALFORMED_FRAME,
    PROTOCOL_VERSION,
    UNKNOWN_COMMAND,
    UNKNOWN_FRAME,
    VERSION_MISMATCH,
    AskPermission,
    Bye,
    CancelRun,
    Encoder,
    Error,
    ErrorInfo,
    Events,
    Frame,
    FrameDecoder,
    Gap,
    Goodbye,
    Hello,
    Ingest,
    Limits,
    Outgoing,
    PermissionReply,
    Ping,
    Pong,
    ProtocolError,
    Publish,
    Reply,
    Request,
    Runs,
    ServerHandshake,
    Sessions,
    Snapshot,
    StartRun,
    Stats,
    Status,
    Subscribe,
    Unsubscribe,
    Welcome,
    client_frame_decoder,
    encode_envelope,
    encode_frame,
    frame_op,
    server_frame_decoder,
)

DOC = (Path(__file__).resolve().parent.parent / "docs" / "protocol.md").read_text()


class Deployed(Event, frozen=True, tag="acme.deploy.done"):
    """A plugin event type, unknown to the built-in catalog."""

    target: str
    ok: bool = True


CATALOG = Catalog()
PLUGIN_CATALOG = Catalog()
PLUGIN_CATALOG.register(Deployed)

ENVELOPE = Envelope(
    seq=42,
    ts=1700000000.25,
    event=TextDelta(message_id="m1", text="Hi"),
    session_id="s1",
    source="claude",
    id="0190b2d6-7a3e-7c41-9f2e-3b4c5d6e7f80",
)

CLIENT_FRAMES: list[Frame] = [
    Hello(protocol=PROTOCOL_VERSION, client="tui"),
    Hello(protocol=PROTOCOL_VERSION, client="ci", role="responder"),
    Subscribe(id=1),
    Subscribe(
        id=2,
        patterns=("stream.text.*", "busd.>"),
        sessions=("s1", "s2"),
        owned_only=True,
        window_ms=0,
        deltas="raw",
        since_seq=100,
    ),
    Unsubscribe(id=2),
    Publish(events=[Outgoing(event=SessionIdle())]),
    Publish(
        events=[
            Outgoing(event=TextDelta(message_id="m", text="é✶"), session_id="s", run_id="r"),
            Outgoing(event=ToolStart(tool_call_id="t", name="bash", input={"cmd": "ls"})),
            Outgoing(event=Usage(tokens=TokenUsage(output_tokens=7)), agent_id="a"),
        ]
    ),
    Ingest(sdk="claude", events=[{"type": "message_start", "n": [1, 2.5, None, True]}]),
    Ingest(sdk="copilot", session_id="s", events=[]),
    Request(id=1, command=Status()),
    Request(id=2, command=Sessions()),
    Request(id=3, command=Snapshot(session_id="s")),
    Request(id=4, command=Stats()),
    Request(id=5, command=Stats(session_id="s")),
    Request(
        id=6,
        command=StartRun(
            adapter="claude-code",
            prompt="fix the tests",
            model="claude-sonnet-4-5",
            max_turns=3,
            options={"allowed_tools": ["Read"]},
        ),
    ),
    Request(id=7, command=CancelRun(run_id="run-1", reason="user")),
    Request(id=8, command=PermissionReply(request_id="perm-1", option_id="allow_once")),
    Request(id=9, command=PermissionReply(request_id="perm-2", allow=False, reason="no")),
    Request(id=12, command=AskPermission(session_id="cc-1", tool="Bash")),
    Request(
        id=13,
        command=AskPermission(
            session_id="cc-1",
            tool="Bash",
            input={"command": "rm -rf build"},
            request_id="mine-1",
            tool_call_id="toolu_1",
            agent_id="a1",
            title="Bash: rm -rf build",
            category="execute",
            options=[PermissionOption(id="allow", label="Allow", kind="allow_once")],
            timeout=5.5,
        ),
    ),
    Request(id=10, command=Runs()),
    Ping(),
    Ping(nonce=2**63),
    Bye(),
]

SERVER_FRAMES: list[Frame] = [
    Welcome(server="0.1.0", protocol=1, client_id=7, head_seq=0, limits=Limits()),
    Events(sub=1, events=[ENVELOPE, Envelope(seq=43, ts=1.0, event=SessionIdle(), stale=True)]),
    Events(sub=1, events=[]),
    Reply(id=1, ok=True, result={"sessions": ["a", "b"], "head_seq": 3}),
    Reply(id=2, ok=False, error=ErrorInfo(code=UNKNOWN_COMMAND, message="no")),
    Error(code=MALFORMED_FRAME, message="bad"),
    Error(code=BAD_HANDSHAKE, message="hello first", fatal=True, ref=3),
    Gap(sub=1, from_seq=5, to_seq=9),
    Goodbye(reason="shutdown"),
    Goodbye(reason="slow_consumer", resume_seq=1234),
    Pong(),
    Pong(nonce=5),
]


def drain(decoder: FrameDecoder[Any]) -> list[Any]:
    """Every outcome the decoder has ready: frames, and errors as (code, fatal)."""
    out: list[Any] = []
    while True:
        try:
            frame = decoder.next_frame()
        except ProtocolError as exc:
            out.append((exc.code, exc.fatal))
            if exc.fatal:
                return out
            continue
        if frame is None:
            return out
        out.append(frame)


def framed(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def body_of(frame: Frame) -> Any:
    return msgspec.msgpack.decode(encode_frame(frame)[4:])


# -- encoding ----------------------------------------------------------------


@pytest.mark.parametrize("frame", CLIENT_FRAMES, ids=repr)
def test_client_frames_round_trip(frame: Frame) -> None:
    decoder = client_frame_decoder(CATALOG)
    decoder.feed(encode_frame(frame))
    assert list(decoder) == [frame]
    assert decoder.buffered == 0


@pytest.mark.parametrize("frame", SERVER_FRAMES, ids=repr)
def test_server_frames_round_trip(frame: Frame) -> None:
    decoder = server_frame_decoder(CATALOG)
    decoder.feed(encode_frame(frame))
    assert list(decoder) == [frame]


def test_every_frame_type_is_covered_by_the_round_trips() -> None:
    ops = {frame_op(f) for f in CLIENT_FRAMES + SERVER_FRAMES}
    assert ops == {cls.__struct_config__.tag for cls in Frame.__subclasses__()}
    assert {type(f.command) for f in CLIENT_FRAMES if isinstance(f, Request)} == set(COMMANDS)


def test_the_length_prefix_is_big_endian_body_length() -> None:
    assert encode_frame(Ping()) == b"\x00\x00\x00\x09" + msgspec.msgpack.encode({"op": "ping"})
    frame = Ingest(sdk="x" * 300, events=[])
    body = msgspec.msgpack.encode(frame)
    assert encode_frame(frame) == b"\x00\x00" + len(body).to_bytes(2, "big") + body


def test_defaults_are_omitted_on_the_wire_and_restored_on_decode() -> None:
    assert body_of(Subscribe(id=1)) == {"op": "subscribe", "id": 1}
    assert body_of(Hello(protocol=1, client="x")) == {"op": "hello", "protocol": 1, "client": "x"}
    decoder = client_frame_decoder(CATALOG)
    decoder.feed(framed(msgspec.msgpack.encode({"op": "subscribe", "id": 1})))
    assert decoder.next_frame() == Subscribe(
        id=1, patterns=(">",), sessions=None, window_ms=16, deltas="merged", since_seq=None
    )


def test_limits_are_always_sent_in_full() -> None:
    welcome = Welcome(server="x", protocol=1, client_id=1, head_seq=0, limits=Limits())
    assert set(body_of(welcome)["limits"]) == set(Limits.__struct_fields__)


def test_wire_names_are_snake_case_field_names() -> None:
    frame = CLIENT_FRAMES[3]
    assert list(body_of(frame)) == ["op", *Subscribe.__struct_fields__]
    assert body_of(Request(id=1, command=Stats(session_id="s"))) == {
        "op": "request",
        "id": 1,
        "command": {"cmd": "stats", "session_id": "s"},
    }


def test_unknown_fields_are_ignored_for_forward_compatibility() -> None:
    decoder = client_frame_decoder(CATALOG)
    decoder.feed(framed(msgspec.msgpack.encode({"op": "ping", "nonce": 1, "future": [1]})))
    assert decoder.next_frame() == Ping(nonce=1)


def test_encoder_matches_encode_frame_and_returns_independent_bytes() -> None:
    encoder = Encoder()
    first = encoder.encode(SERVER_FRAMES[1])
    second = encoder.encode(Pong())
    assert first == encode_frame(SERVER_FRAMES[1])
    assert second == encode_frame(Pong())


def test_encode_into_appends_frames_for_one_write() -> None:
    encoder = Encoder()
    out = bytearray(b"xy")
    for frame in SERVER_FRAMES:
        encoder.encode_into(frame, out)
    assert bytes(out) == b"xy" + b"".join(encode_frame(f) for f in SERVER_FRAMES)


def test_encoder_refuses_a_frame_over_its_cap_without_writing_it() -> None:
    encoder = Encoder(max_frame=16)
    big = Publish(events=[Outgoing(event=TextDelta(message_id="m", text="x" * 100))])
    out = bytearray(encode_frame(Ping()))
    before = bytes(out)
    with pytest.raises(ProtocolError) as info:
        encoder.encode_into(big, out)
    assert (info.value.code, info.value.fatal) == (FRAME_TOO_LARGE, False)
    assert out == before
    with pytest.raises(ProtocolError):
        encoder.encode(big)
    assert encoder.encode(Ping()) == encode_frame(Ping())


def test_a_frame_that_cannot_be_encoded_leaves_the_output_untouched() -> None:
    out = bytearray(b"xy")
    with pytest.raises(TypeError):
        Encoder().encode_into(Reply(id=1, ok=True, result=object()), out)
    assert out == b"xy"


def test_raw_pre_encoded_events_frame_equals_the_typed_one_byte_for_byte() -> None:
    envelopes: list[Envelope[Any]] = [
        ENVELOPE,
        Envelope(seq=43, ts=2.5, event=Deployed(target="prod"), run_id="r"),
    ]
    typed = encode_frame(Events(sub=3, events=envelopes))
    raws = [encode_envelope(e) for e in envelopes]
    raw = Encoder().encode(Events(sub=3, events=raws))
    assert raw == typed
    decoder = server_frame_decoder(PLUGIN_CATALOG)
    decoder.feed(raw)
    assert decoder.next_frame() == Events(sub=3, events=envelopes)


def test_one_raw_envelope_can_go_to_many_subscribers() -> None:
    raw = encode_envelope(ENVELOPE)
    encoder = Encoder()
    decoder = server_frame_decoder(CATALOG)
    for sub in range(3):
        decoder.feed(encoder.encode(Events(sub=sub, events=[raw])))
    assert list(decoder) == [Events(sub=s, events=[ENVELOPE]) for s in range(3)]


# -- plugin event types -------------------------------------------------------


def test_plugin_events_decode_inside_publish_and_events_frames() -> None:
    publish = Publish(events=[Outgoing(event=Deployed(target="prod", ok=False), session_id="s")])
    events = Events(sub=1, events=[Envelope(seq=1, ts=1.0, event=Deployed(target="prod"))])
    client = client_frame_decoder(PLUGIN_CATALOG)
    server = server_frame_decoder(PLUGIN_CATALOG)
    client.feed(encode_frame(publish))
    server.feed(encode_frame(events))
    [decoded] = list(client)
    assert decoded == publish
    assert isinstance(decoded, Publish)
    assert isinstance(decoded.events[0].event, Deployed)
    assert list(server) == [events]


def test_publishing_an_event_outside_the_catalog_is_invalid_and_the_stream_goes_on() -> None:
    publish = Publish(events=[Outgoing(event=SessionIdle()), Outgoing(event=Deployed(target="p"))])
    decoder = client_frame_decoder(CATALOG)
    decoder.feed(encode_frame(publish) + encode_frame(Ping()))
    with pytest.raises(ProtocolError) as info:
        decoder.next_frame()
    assert (info.value.code, info.value.fatal, info.value.op) == (INVALID_EVENT, False, "publish")
    assert "acme.deploy.done" in info.value.message
    assert "$.events[1].event" in info.value.message
    assert decoder.next_frame() == Ping()


def test_clients_skip_envelopes_of_event_types_they_do_not_know() -> None:
    known = [ENVELOPE, Envelope(seq=44, ts=1.0, event=SessionIdle())]
    unknown = Envelope(seq=43, ts=1.0, event=Deployed(target="prod"))
    decoder = server_frame_decoder(CATALOG)
    decoder.feed(encode_frame(Events(sub=9, events=[known[0], unknown, known[1]])))
    decoder.feed(encode_frame(Events(sub=9, events=[unknown])))
    assert list(decoder) == [Events(sub=9, events=known), Events(sub=9, events=[])]
    assert decoder.skipped_events == 2


@pytest.mark.parametrize(
    "envelope",
    [
        {"seq": 1, "ts": 1.0, "event": {"type": "stream.text.delta", "text": 1}},
        {"seq": "1", "ts": 1.0, "event": {"type": "acme.deploy.done"}},
        {"seq": 1, "ts": 1.0, "event": ["stream.session.idle"]},
        {"seq": 1, "ts": 1.0},
        "stream.session.idle",
    ],
    ids=["bad-field", "bad-envelope-unknown-type", "event-not-a-map", "no-event", "not-a-map"],
)
def test_a_broken_envelope_of_a_known_type_spoils_its_events_frame(envelope: Any) -> None:
    body = {"op": "events", "sub": 9, "events": [ENVELOPE, envelope]}
    decoder = server_frame_decoder(CATALOG)
    decoder.feed(framed(msgspec.msgpack.encode(body)) + encode_frame(Pong()))
    with pytest.raises(ProtocolError) as info:
        decoder.next_frame()
    assert (info.value.code, info.value.ref, info.value.fatal) == (INVALID_EVENT, 9, False)
    assert decoder.next_frame() == Pong()
    assert decoder.skipped_events == 0


def test_skipping_unknown_envelopes_never_hides_a_broken_frame() -> None:
    unknown = {"seq": 1, "ts": 1.0, "event": {"type": "acme.deploy.done"}}
    body = msgspec.msgpack.encode({"op": "events", "events": [unknown], "sub": "nine"})
    decoder = server_frame_decoder(CATALOG)
    decoder.feed(framed(body))
    with pytest.raises(ProtocolError) as info:
        decoder.next_frame()
    assert info.value.code == INVALID_EVENT
    assert decoder.skipped_events == 0


def test_an_event_with_a_wrongly_typed_field_is_an_invalid_event() -> None:
    body = msgspec.msgpack.encode(
        {"op": "publish", "events": [{"event": {"type": "stream.text.delta", "text": 1}}]}
    )
    decoder = client_frame_decoder(CATALOG)
    decoder.feed(framed(body))
    with pytest.raises(ProtocolError, match="invalid event in publish frame") as info:
        decoder.next_frame()
    assert info.value.code == INVALID_EVENT


# -- incremental decoding -----------------------------------------------------


def stream_of(frames: Sequence[Frame]) -> bytes:
    return b"".join(encode_frame(f) for f in frames)


def test_one_byte_at_a_time_yields_each_frame_once_complete() -> None:
    frames = CLIENT_FRAMES[:6]
    decoder = client_frame_decoder(CATALOG)
    seen: list[Any] = []
    ends = set()
    offset = 0
    for frame in frames:
        offset += len(encode_frame(frame))
        ends.add(offset)
    for i, byte in enumerate(stream_of(frames), 1):
        decoder.feed(bytes([byte]))
        got = list(decoder)
        assert len(got) == (1 if i in ends else 0)
        seen += got
    assert seen == frames
    assert decoder.buffered == 0


def test_complete_says_whether_next_frame_has_something_at_every_byte() -> None:
    cap = max(len(encode_frame(f)) for f in CLIENT_FRAMES[:6])
    decoder = client_frame_decoder(CATALOG, max_frame=cap)
    data = stream_of(CLIENT_FRAMES[:6])
    data += struct.pack(">I", cap + 1)  # then a prefix over the cap: next_frame raises
    outcomes = 0
    for byte in data:
        decoder.feed(bytes([byte]))
        while True:
            complete = decoder.complete
            try:
                frame = decoder.next_frame()
            except ProtocolError:
                assert complete
                outcomes += 1
                break
            assert complete == (frame is not None)
            if frame is None:
                break
            outcomes += 1
    assert outcomes == 7


def test_every_two_way_split_of_a_stream_yields_the_same_frames() -> None:
    frames = [CLIENT_FRAMES[0], CLIENT_FRAMES[6], Ping(nonce=1), Bye()]
    data = stream_of(frames)
    for cut in range(len(data) + 1):
        decoder = client_frame_decoder(CATALOG)
        decoder.feed(data[:cut])
        got = list(decoder)
        decoder.feed(data[cut:])
        assert got + list(decoder) == frames, cut


def test_many_frames_in_one_chunk_come_out_in_order() -> None:
    frames = [Ping(nonce=i) for i in range(1000)]
    decoder = client_frame_decoder(CATALOG)
    decoder.feed(bytearray(stream_of(frames)))
    assert list(decoder) == frames


def test_feed_accepts_memoryview_and_bytearray_chunks() -> None:
    data = stream_of(CLIENT_FRAMES)
    decoder = client_frame_decoder(CATALOG)
    decoder.feed(memoryview(data)[:10])
    decoder.feed(bytearray(data[10:20]))
    decoder.feed(data[20:])
    assert list(decoder) == CLIENT_FRAMES


def test_long_streams_with_interleaved_draining_lose_nothing() -> None:
    # Enough bytes to make the decoder compact its buffer many times over.
    frames = [
        Publish(events=[Outgoing(event=TextDelta(message_id=str(i), text="x" * (i % 300)))])
        for i in range(2000)
    ]
    data = stream_of(frames)
    decoder = client_frame_decoder(CATALOG)
    got: list[Any] = []
    for start in range(0, len(data), 7001):
        decoder.feed(data[start : start + 7001])
        got.append(decoder.next_frame())  # drain lazily: leave a backlog
    got += list(decoder)
    assert [f for f in got if f is not None] == frames
    assert decoder.buffered == 0


def test_decoded_raw_fields_do_not_pin_the_decoder_buffer() -> None:
    # msgspec.Raw keeps a reference to its input; a view into the buffer would block resizing.
    decoder: FrameDecoder[Any] = FrameDecoder(Events[msgspec.Raw])
    raw = encode_envelope(ENVELOPE)
    data = encode_frame(Events(sub=1, events=[raw])) + encode_frame(Events(sub=2, events=[]))
    split = len(encode_frame(Events(sub=1, events=[raw]))) + 1
    decoder.feed(data[:split])
    first = decoder.next_frame()
    decoder.feed(data[split:])
    assert first == Events(sub=1, events=[raw])
    assert decoder.next_frame() == Events(sub=2, events=[])


@pytest.mark.parametrize(
    ("frame_type", "body", "code"),
    [
        (Events[msgspec.Raw], {"op": "pong"}, UNKNOWN_FRAME),
        (Events[msgspec.Raw], {"op": "events", "sub": "1", "events": []}, MALFORMED_FRAME),
        (Ping, {"op": "bye"}, UNKNOWN_FRAME),
        (Ping | Pong, {"op": "ping", "nonce": "x"}, MALFORMED_FRAME),
    ],
)
def test_decoders_of_any_frame_type_name_unknown_ops(frame_type: Any, body: Any, code: str) -> None:
    decoder: FrameDecoder[Any] = FrameDecoder(frame_type)
    decoder.feed(framed(msgspec.msgpack.encode(body)))
    with pytest.raises(ProtocolError) as info:
        decoder.next_frame()
    assert info.value.code == code


# -- the size cap ---------------------------------------------------------------


def test_a_frame_at_the_cap_is_accepted() -> None:
    frame = Ping(nonce=1)
    size = len(encode_frame(frame)) - 4
    decoder = client_frame_decoder(CATALOG, max_frame=size)
    decoder.feed(encode_frame(frame))
    assert decoder.buffered == 4 + size
    assert list(decoder) == [frame]


def test_an_oversized_prefix_is_rejected_before_its_body_is_buffered() -> None:
    cap = 64
    decoder = client_frame_decoder(CATALOG, max_frame=cap)
    before = encode_frame(Ping(nonce=1))
    decoder.feed(before + struct.pack(">I", 1 << 30) + b"\x00" * 1000)
    assert decoder.buffered <= 4 + cap
    for _ in range(100):
        decoder.feed(b"\x00" * 4096)
        assert decoder.buffered <= 4 + cap
    assert decoder.next_frame() == Ping(nonce=1)  # frames before it still arrive
    for _ in range(2):  # and then the stream is dead for good
        with pytest.raises(ProtocolError) as info:
            decoder.next_frame()
        assert (info.value.code, info.value.fatal) == (FRAME_TOO_LARGE, True)
        assert str(1 << 30) in info.value.message


def test_a_one_over_the_cap_prefix_fed_byte_by_byte_never_buffers_its_body() -> None:
    decoder = client_frame_decoder(CATALOG, max_frame=8)
    for byte in struct.pack(">I", 9) + b"\x90" * 20:
        decoder.feed(bytes([byte]))
        assert decoder.buffered <= 4
    with pytest.raises(ProtocolError, match="max_frame=8") as info:
        decoder.next_frame()
    assert info.value.fatal


def test_the_default_cap_is_one_mebibyte() -> None:
    assert client_frame_decoder(CATALOG).max_frame == DEFAULT_MAX_FRAME == 1 << 20
    decoder = server_frame_decoder(CATALOG)
    decoder.feed(struct.pack(">I", (1 << 20) + 1))
    with pytest.raises(ProtocolError):
        decoder.next_frame()


# -- bad bodies -------------------------------------------------------------------

DEEP = b"\x91" * 10_000 + b"\xc0"


@pytest.mark.parametrize(
    ("body", "code", "words"),
    [
        pytest.param(b"", MALFORMED_FRAME, "truncated", id="empty"),
        pytest.param(b"\xc1", MALFORMED_FRAME, "malformed", id="not-msgpack"),
        pytest.param(b"\x81\xa2op", MALFORMED_FRAME, "truncated", id="truncated"),
        pytest.param(msgspec.msgpack.encode([1, 2]), MALFORMED_FRAME, "array", id="not-a-map"),
        pytest.param(msgspec.msgpack.encode({"id": 1}), MALFORMED_FRAME, "`op`", id="no-op"),
        pytest.param(msgspec.msgpack.encode({"op": 3}), MALFORMED_FRAME, "op", id="int-op"),
        pytest.param(msgspec.msgpack.encode({"op": "warp"}), UNKNOWN_FRAME, "'warp'", id="op"),
        pytest.param(
            msgspec.msgpack.encode({"op": "welcome"}), UNKNOWN_FRAME, "welcome", id="wrong-side"
        ),
        pytest.param(
            b"\x82\xa2op\xa5hello\xa6client\xa2\xff\xfe", MALFORMED_FRAME, "UTF-8", id="utf8"
        ),
        pytest.param(b"\x81\xa2op\xa4\xff\xff\xff\xff", MALFORMED_FRAME, "UTF-8", id="utf8-op"),
        pytest.param(
            b"\x83\xa2op\xa6ingest\xa3sdk\xa1x\xa6events" + DEEP,
            MALFORMED_FRAME,
            "nested too deeply",
            id="deep-nesting",
        ),
        pytest.param(
            msgspec.msgpack.encode({"op": "hello", "protocol": "1", "client": "x"}),
            MALFORMED_FRAME,
            "$.protocol",
            id="schema",
        ),
        pytest.param(
            msgspec.msgpack.encode({"op": "subscribe", "id": 1, "window_ms": -1}),
            MALFORMED_FRAME,
            "$.window_ms",
            id="constraint",
        ),
        pytest.param(
            msgspec.msgpack.encode({"op": "ping"}) + b"\x00", MALFORMED_FRAME, "trailing", id="tail"
        ),
    ],
)
def test_a_bad_body_is_a_non_fatal_error_and_the_next_frame_decodes(
    body: bytes, code: str, words: str
) -> None:
    decoder = client_frame_decoder(CATALOG)
    decoder.feed(framed(body) + encode_frame(Ping(nonce=7)))
    with pytest.raises(ProtocolError) as info:
        decoder.next_frame()
    assert (info.value.code, info.value.fatal) == (code, False)
    assert words in info.value.message
    assert decoder.next_frame() == Ping(nonce=7)
    assert decoder.next_frame() is None


NOT_JSON = {
    "bin": b"\x00\x01",
    "ext": msgspec.msgpack.Ext(7, b"x"),
    "timestamp": msgspec.msgpack.Ext(-1, b"\x00\x00\x00\x01"),
    "bin-in-a-list": [1, [b"deep"]],
    "bin-key": {b"k": 1},
}


@pytest.mark.parametrize("value", list(NOT_JSON.values()), ids=list(NOT_JSON))
def test_binary_and_extension_values_are_refused_where_any_value_may_go(value: object) -> None:
    """The protocol's ``Any`` is JSON-like: what msgpack adds is refused at decode, not relayed."""
    tool = {"type": "stream.tool.start", "tool_call_id": "t", "name": "n", "input": {"v": value}}
    idle = {"type": "stream.session.idle"}
    publish = {"op": "publish", "events": [{"event": idle}, {"event": tool}]}
    start = {"cmd": "start_run", "adapter": "a", "prompt": "p", "options": {"o": value}}
    cases = [
        (publish, INVALID_EVENT, None, "$.events[1].event.input.v"),
        ({"op": "publish", "ack": 4, "events": [{"event": tool}]}, INVALID_EVENT, 4, "$.events"),
        ({"op": "request", "id": 9, "command": start}, MALFORMED_FRAME, 9, "$.command.options.o"),
        ({"op": "ingest", "sdk": "x", "events": [value]}, MALFORMED_FRAME, None, "$.events[0]"),
    ]
    decoder = client_frame_decoder(CATALOG)
    for body, code, ref, where in cases:
        decoder.feed(framed(msgspec.msgpack.encode(body)) + encode_frame(Ping(nonce=1)))
        with pytest.raises(ProtocolError) as info:
            decoder.next_frame()
        assert (info.value.code, info.value.ref, info.value.fatal) == (code, ref, False)
        assert where in info.value.message
        assert decoder.next_frame() == Ping(nonce=1)  # the stream goes on


def test_text_that_holds_the_bytes_of_binary_markers_is_plain_text() -> None:
    texts = ["Zażółć gęślą jaźń", "שלום", "Ճ", "مرحبا", "\u00c4\u00d4"]
    frame = Publish(events=[Outgoing(event=TextDelta(message_id="m", text=t)) for t in texts])
    decoder = client_frame_decoder(CATALOG)
    decoder.feed(encode_frame(frame))
    assert decoder.next_frame() == frame


def test_only_the_servers_decoder_is_strict() -> None:
    """A client still reads what an older daemon relayed (its journal may hold such events)."""
    event = ToolStart(tool_call_id="t", name="n", input={"v": "?"})
    raw = msgspec.msgpack.encode(Envelope(seq=1, ts=0.0, event=event))
    raw = raw.replace(b"\xa1?", b"\xc4\x01\x00")  # the string "?" becomes bin 00
    decoder = server_frame_decoder(CATALOG)
    decoder.feed(encode_frame(Events(sub=1, events=[msgspec.Raw(raw)])))
    frame = decoder.next_frame()
    assert isinstance(frame, Events)
    assert frame.events[0].event.input == {"v": b"\x00"}


def test_an_unknown_command_names_the_request_it_refuses() -> None:
    body = msgspec.msgpack.encode({"op": "request", "id": 12, "command": {"cmd": "reboot"}})
    decoder = client_frame_decoder(CATALOG)
    decoder.feed(framed(body))
    with pytest.raises(ProtocolError) as info:
        decoder.next_frame()
    assert (info.value.code, info.value.ref, info.value.fatal) == (UNKNOWN_COMMAND, 12, False)
    assert info.value.op == "request"
    assert "'reboot'" in info.value.message


def test_a_schema_error_carries_the_frame_id_as_ref() -> None:
    body = msgspec.msgpack.encode({"op": "subscribe", "id": 5, "patterns": "stream.>"})
    decoder = client_frame_decoder(CATALOG)
    decoder.feed(framed(body))
    with pytest.raises(ProtocolError) as info:
        decoder.next_frame()
    assert (info.value.code, info.value.ref, info.value.op) == (MALFORMED_FRAME, 5, "subscribe")
    assert info.value.message.startswith("invalid subscribe frame:")


def test_protocol_errors_are_busd_errors_and_become_error_frames() -> None:
    exc = ProtocolError(UNKNOWN_COMMAND, "nope", ref=3)
    assert isinstance(exc, BusdError)
    assert isinstance(exc, ValueError)
    assert str(exc) == "nope"
    assert exc.to_frame() == Error(code=UNKNOWN_COMMAND, message="nope", fatal=False, ref=3)


def test_every_error_code_is_documented_in_the_table() -> None:
    for code in ERROR_CODES:
        assert re.search(rf"^\| `{code}` \|", DOC, re.MULTILINE), code


# -- handshake ------------------------------------------------------------------------


def handshake(client_bytes: bytes, *, head_seq: int = 0) -> tuple[ServerHandshake, Any]:
    """Run the server side over bytes; return the handshake and the frame the client reads."""
    shake = ServerHandshake(server="0.1.0", client_id=4, limits=Limits(max_frame=512))
    decoder = client_frame_decoder(CATALOG, max_frame=512)
    decoder.feed(client_bytes)
    try:
        first = decoder.next_frame()
    except ProtocolError as exc:
        answer: Frame = shake.receive_error(exc)
    else:
        assert first is not None
        answer = shake.receive(first, head_seq=head_seq)
    client = server_frame_decoder(CATALOG)
    client.feed(encode_frame(answer))
    return shake, client.next_frame()


def test_a_good_hello_gets_a_welcome() -> None:
    hello = Hello(protocol=PROTOCOL_VERSION, client="tui", role="admin")
    shake, answer = handshake(encode_frame(hello), head_seq=99)
    assert answer == Welcome(
        server="0.1.0",
        protocol=PROTOCOL_VERSION,
        client_id=4,
        head_seq=99,
        limits=Limits(max_frame=512),
    )
    assert (shake.state, shake.hello) == ("done", hello)


@pytest.mark.parametrize(
    ("client_bytes", "code", "words"),
    [
        (encode_frame(Hello(protocol=2, client="x")), VERSION_MISMATCH, "protocol 2"),
        (encode_frame(Subscribe(id=1)), BAD_HANDSHAKE, "'subscribe'"),
        (framed(b"\xc1"), BAD_HANDSHAKE, "valid hello"),
        (framed(msgspec.msgpack.encode({"op": "hello"})), BAD_HANDSHAKE, "`protocol`"),
        (struct.pack(">I", 513), FRAME_TOO_LARGE, "513"),
    ],
    ids=["version", "not-hello", "malformed", "incomplete-hello", "too-large"],
)
def test_a_bad_first_frame_gets_a_fatal_error(client_bytes: bytes, code: str, words: str) -> None:
    shake, answer = handshake(client_bytes)
    assert isinstance(answer, Error)
    assert (answer.code, answer.fatal) == (code, True)
    assert words in answer.message
    assert (shake.state, shake.hello) == ("failed", None)


def test_a_handshake_answers_once() -> None:
    shake = ServerHandshake(server="0.1.0", client_id=1)
    assert shake.timed_out() == Error(
        code=HANDSHAKE_TIMEOUT, message="no hello received in time", fatal=True
    )
    with pytest.raises(RuntimeError, match="failed"):
        shake.receive(Hello(protocol=PROTOCOL_VERSION, client="x"), head_seq=0)
    shake = ServerHandshake(server="0.1.0", client_id=1)
    shake.receive(Hello(protocol=PROTOCOL_VERSION, client="x"), head_seq=0)
    with pytest.raises(RuntimeError, match="done"):
        shake.timed_out()


# -- docs/protocol.md stays true --------------------------------------------------------


def hexdump(data: bytes) -> str:
    """The hex layout docs/protocol.md uses: 16 bytes a line."""
    return "\n".join(data[i : i + 16].hex(" ") for i in range(0, len(data), 16))


DOC_EXAMPLES = {
    "hello": Hello(protocol=1, client="tui"),
    "welcome": Welcome(server="0.1.0", protocol=1, client_id=1, head_seq=41, limits=Limits()),
    "events": Events(sub=1, events=[encode_envelope(ENVELOPE)]),
}


@pytest.mark.parametrize("name", DOC_EXAMPLES)
def test_the_documented_hex_examples_are_what_the_encoder_writes(name: str) -> None:
    assert hexdump(encode_frame(DOC_EXAMPLES[name])) in DOC


DOCUMENTED = pytest.mark.parametrize(
    "cls",
    [*Frame.__subclasses__(), *COMMANDS, Outgoing, Limits, ErrorInfo],
    ids=lambda cls: cls.__name__,
)


def _doc_section(cls: type[msgspec.Struct]) -> tuple[str, str]:
    """``(heading, text)`` of the protocol.md section that documents ``cls``."""
    tag = cls.__struct_config__.tag
    heading = f"`{tag}`" if isinstance(tag, str) else cls.__name__
    match = re.search(rf"^#+ {re.escape(heading)}\n(.*?)(?=^#)", DOC, re.MULTILINE | re.DOTALL)
    assert match, f"no section for {heading}"
    return heading, match[1]


@DOCUMENTED
def test_every_frame_and_field_is_documented(cls: type[msgspec.Struct]) -> None:
    heading, text = _doc_section(cls)
    for field in cls.__struct_fields__:
        assert f"| `{field}` |" in text, f"{heading}.{field}"


@DOCUMENTED
def test_no_documented_field_is_missing_from_the_type(cls: type[msgspec.Struct]) -> None:
    """The other way round: the section's field table names fields the type has, no more."""
    heading, text = _doc_section(cls)
    table = re.search(r"^\| field \| type \| default \|\n\| --- .*?\n((?:\|.*\n)*)", text, re.M)
    if table is None:
        assert not cls.__struct_fields__, f"{heading} has fields but no field table"
        return
    documented = re.findall(r"^\| `(\w+)` \|", table[1], re.MULTILINE)
    assert documented == [f for f in cls.__struct_fields__ if f in documented], heading  # order
    assert set(documented) == set(cls.__struct_fields__), heading
