"""Laws of the frame decoder under hostile input: hypothesis picks the bytes and the chunking."""

from __future__ import annotations

import itertools
import struct
from typing import Any

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from busd.core.catalog import Catalog
from busd.core.events import Envelope, SessionIdle, TextDelta, ToolStart
from busd.wire import (
    ERROR_CODES,
    FRAME_TOO_LARGE,
    Bye,
    Events,
    Frame,
    FrameDecoder,
    Gap,
    Hello,
    Ingest,
    Outgoing,
    Ping,
    Pong,
    ProtocolError,
    Publish,
    Request,
    Snapshot,
    Subscribe,
    client_frame_decoder,
    encode_envelope,
    encode_frame,
    server_frame_decoder,
)

CATALOG = Catalog()
OPS = ["hello", "subscribe", "unsubscribe", "publish", "ingest", "request", "ping", "bye"]
OPS += ["welcome", "events", "reply", "error", "gap", "goodbye", "pong", "nope"]


def drain(decoder: FrameDecoder[Any]) -> list[Any]:
    """Every outcome ready: frames, and errors as (code, fatal); stops at a fatal error."""
    out: list[Any] = []
    while True:
        try:
            frame = decoder.next_frame()
        except ProtocolError as exc:
            out.append(outcome(exc))
            if exc.fatal:
                return out
            continue
        if frame is None:
            return out
        out.append(frame)


def outcome(error: ProtocolError) -> tuple[str, bool]:
    assert error.code in ERROR_CODES
    assert error.message
    return (error.code, error.fatal)


def feed_in_chunks(decoder: FrameDecoder[Any], data: bytes, cuts: list[int]) -> list[Any]:
    """Feed ``data`` split at ``cuts``, draining after each chunk, as a server loop would."""
    out: list[Any] = []
    bounds = [0, *sorted(c % (len(data) + 1) for c in cuts), len(data)]
    for start, end in itertools.pairwise(bounds):
        decoder.feed(data[start:end])
        out += drain(decoder)
        # Drained, only the start of one frame may be left: never an oversized body.
        assert decoder.buffered < 4 + decoder.max_frame
        if out and out[-1] == (FRAME_TOO_LARGE, True):
            break
    return out


texts = st.text(max_size=20)
ids = st.integers(min_value=-(2**63), max_value=2**64 - 1)

client_frames: st.SearchStrategy[Frame] = st.one_of(
    st.builds(Hello, protocol=ids, client=texts),
    st.builds(
        Subscribe,
        id=ids,
        patterns=st.lists(texts, max_size=3).map(tuple),
        sessions=st.none() | st.lists(texts, max_size=3).map(tuple),
        owned_only=st.booleans(),
        window_ms=st.integers(0, 60_000),
        deltas=st.sampled_from(["merged", "raw"]),
        since_seq=st.none() | st.integers(0, 2**63),
    ),
    st.builds(
        Publish,
        events=st.lists(
            st.builds(
                Outgoing,
                event=st.builds(TextDelta, message_id=texts, text=texts)
                | st.builds(SessionIdle, aborted=st.booleans())
                | st.builds(ToolStart, tool_call_id=texts, name=texts),
                session_id=st.none() | texts,
            ),
            max_size=4,
        ),
    ),
    st.builds(Request, id=ids, command=st.builds(Snapshot, session_id=texts)),
    st.builds(Ping, nonce=ids),
    st.just(Bye()),
)

json_like = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | texts,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=20,
)

# Maps that look like frames: a real op (mostly) and plausible or random fields.
frame_like = st.dictionaries(
    st.sampled_from(["id", "sub", "events", "patterns", "command", "protocol", "client", "x"]),
    json_like | st.builds(lambda cmd: {"cmd": cmd}, st.sampled_from(["status", "stats", "kill"])),
    max_size=4,
).flatmap(lambda fields: st.sampled_from(OPS).map(lambda op: {"op": op, **fields}))


def framed(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


# A piece of a stream: a valid frame, or a well-framed body of garbage.
pieces = st.one_of(
    client_frames.map(encode_frame),
    st.binary(max_size=40).map(framed),
    frame_like.map(lambda value: framed(msgspec.msgpack.encode(value))),
    json_like.map(lambda value: framed(msgspec.msgpack.encode(value))),
)


@given(frames=st.lists(client_frames, max_size=8), cuts=st.lists(st.integers(0, 10_000)))
def test_any_chunking_of_valid_frames_yields_the_frames(
    frames: list[Frame], cuts: list[int]
) -> None:
    data = b"".join(encode_frame(f) for f in frames)
    assert feed_in_chunks(client_frame_decoder(CATALOG), data, cuts) == frames


@given(
    stream=st.lists(pieces, max_size=8),
    tail=st.binary(max_size=12),
    cuts=st.lists(st.integers(0, 10_000), max_size=12),
)
def test_outcomes_depend_on_the_bytes_not_on_the_chunking(
    stream: list[bytes], tail: bytes, cuts: list[int]
) -> None:
    data = b"".join(stream) + tail
    whole = client_frame_decoder(CATALOG, max_frame=256)
    whole.feed(data)
    expected = drain(whole)
    assert feed_in_chunks(client_frame_decoder(CATALOG, max_frame=256), data, cuts) == expected
    one_by_one = client_frame_decoder(CATALOG, max_frame=256)
    assert feed_in_chunks(one_by_one, data, list(range(len(data)))) == expected


@given(stream=st.lists(pieces, max_size=8))
def test_a_well_framed_bad_body_never_costs_the_next_frame(stream: list[bytes]) -> None:
    sentinel = Ping(nonce=424242)
    data = b"".join(piece + encode_frame(sentinel) for piece in stream)
    decoder = client_frame_decoder(CATALOG)
    decoder.feed(data)
    outcomes = drain(decoder)
    assert len(outcomes) == 2 * len(stream)
    assert outcomes[1::2] == [sentinel] * len(stream)
    assert all(not (isinstance(o, tuple) and o[1]) for o in outcomes)


@given(data=st.binary(max_size=300), cuts=st.lists(st.integers(0, 10_000), max_size=20))
def test_random_bytes_only_ever_raise_protocol_errors(data: bytes, cuts: list[int]) -> None:
    for decoder in (
        client_frame_decoder(CATALOG, max_frame=64),
        server_frame_decoder(CATALOG, max_frame=64),
    ):
        outcomes = feed_in_chunks(decoder, data, cuts)
        if outcomes and outcomes[-1] == (FRAME_TOO_LARGE, True):
            # A lost stream stays lost, whatever comes next.
            decoder.feed(encode_frame(Ping()))
            assert drain(decoder) == [(FRAME_TOO_LARGE, True)]
            assert decoder.buffered <= 4 + 64


@given(value=frame_like | json_like)
def test_the_server_side_decoder_survives_frame_like_garbage(value: Any) -> None:
    decoder = server_frame_decoder(CATALOG)
    decoder.feed(framed(msgspec.msgpack.encode(value)) + encode_frame(Pong(nonce=1)))
    outcomes = drain(decoder)
    assert outcomes[-1] == Pong(nonce=1)
    assert len(outcomes) == 2


@given(
    envelopes=st.lists(
        st.builds(
            Envelope,
            seq=st.integers(0, 2**63),
            ts=st.floats(allow_nan=False),
            event=st.builds(TextDelta, message_id=texts, text=texts)
            | st.builds(SessionIdle, aborted=st.booleans()),
            session_id=st.none() | texts,
            stale=st.booleans(),
        ),
        max_size=5,
    ),
    sub=ids,
)
def test_raw_events_frames_decode_to_the_envelopes_they_were_made_from(
    envelopes: list[Envelope[Any]], sub: int
) -> None:
    raw = encode_frame(Events(sub=sub, events=[encode_envelope(e) for e in envelopes]))
    assert raw == encode_frame(Events(sub=sub, events=envelopes))
    decoder = server_frame_decoder(CATALOG)
    decoder.feed(raw + encode_frame(Gap(sub=sub, from_seq=1, to_seq=2)))
    assert drain(decoder) == [Events(sub=sub, events=envelopes), Gap(sub=sub, from_seq=1, to_seq=2)]


@given(events=st.lists(json_like, max_size=4))
def test_ingest_payloads_round_trip_as_json_like_values(events: list[Any]) -> None:
    frame = Ingest(sdk="claude", events=events)
    decoder = client_frame_decoder(CATALOG)
    decoder.feed(encode_frame(frame))
    [decoded] = drain(decoder)
    assert isinstance(decoded, Ingest)
    # NaN is not equal to itself: compare the encodings instead.
    assert msgspec.msgpack.encode(decoded) == msgspec.msgpack.encode(frame)


event_like = st.fixed_dictionaries(
    {"type": st.sampled_from(["stream.session.idle", "stream.text.delta", "acme.x.y", 3])},
    optional={"message_id": texts, "text": texts, "aborted": st.booleans() | json_like},
)
envelope_like = st.fixed_dictionaries(
    {"seq": st.integers(0, 10), "ts": st.floats(), "event": event_like},
    optional={"session_id": texts, "stale": st.booleans()},
)


@given(
    envelopes=st.lists(envelope_like | envelope_like | envelope_like | json_like, max_size=4),
    sub=st.integers(0, 9) | st.integers(0, 9) | json_like,
)
def test_clients_survive_any_envelopes_and_skip_only_unknown_types(
    envelopes: list[Any], sub: Any
) -> None:
    decoder = server_frame_decoder(CATALOG)
    body = msgspec.msgpack.encode({"op": "events", "sub": sub, "events": envelopes})
    decoder.feed(framed(body) + encode_frame(Pong(nonce=1)))
    first, pong = drain(decoder)
    assert pong == Pong(nonce=1)
    if isinstance(first, Events):  # then every envelope was sound, or skipped as unknown
        unknown = [e for e in envelopes if e["event"]["type"] == "acme.x.y"]
        assert decoder.skipped_events == len(unknown)
        assert len(first.events) == len(envelopes) - len(unknown)
    else:
        assert first[1] is False
