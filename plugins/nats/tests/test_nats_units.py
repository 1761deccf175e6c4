"""The bridge's sans-I/O parts: subjects, options, the ingest decisions, the outbox and lanes."""

from __future__ import annotations

import logging
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
from busd_nats import (
    BridgeOptions,
    IngestFilter,
    NatsOptionsError,
    consumer_name,
    default_name,
    escape_token,
    parse_options,
    subject_for,
)
from busd_nats.ingest import Incoming, Ingestor
from busd_nats.outbox import Lanes, Outbox, Outgoing
from busd_nats.subjects import origin_of

from busd import Catalog
from busd.core.events import BUILTIN_EVENTS, Envelope, Event, SessionInfo, StreamingStats, TextDelta

# -- subjects ---------------------------------------------------------------------------


def test_subject_layout_keeps_the_type_dots_as_tokens() -> None:
    assert subject_for("laptop", "s1", "stream.text.delta") == "busd.laptop.s1.stream.text.delta"
    assert subject_for("laptop", None, "busd.internal.error") == "busd.laptop._.busd.internal.error"


@pytest.mark.parametrize(
    ("session", "token"),
    [
        ("0190b2d6-7a3e-7c41", "0190b2d6-7a3e-7c41"),  # ids pass unchanged
        ("a.b", "a%2Eb"),  # a dot would split the token
        ("*", "%2A"),
        (">", "%3E"),
        ("with space", "with%20space"),
        ("100%", "100%25"),  # the escape character itself
        ("é", "%C3%A9"),  # UTF-8 bytes
        ("_", "%5F"),  # a bare _ means "no session"
        ("", "%"),
    ],
)
def test_session_tokens_are_escaped_one_to_one(session: str, token: str) -> None:
    assert escape_token(session) == token
    assert subject_for("d", session, "x.y") == f"busd.d.{token}.x.y"


def test_escaping_never_maps_two_sessions_to_one_subject() -> None:
    sessions = ["a.b", "a%2Eb", "a_b", "_", "%5F", "", "%", "a b", "a%20b", "é", "%C3%A9"]
    assert len({escape_token(s) for s in sessions}) == len(sessions)


def test_origin_and_consumer() -> None:
    assert origin_of("busd.laptop.s1.stream.text.delta") == "laptop"
    assert origin_of("other.laptop.s1.x") is None
    assert origin_of("busd.laptop") is None
    assert consumer_name("laptop") == "busd-laptop"


def test_ingest_filter_default_takes_everyone_but_itself() -> None:
    wanted = IngestFilter("alpha", None)
    assert wanted.server_filter == "busd.>"
    assert wanted.wants("busd.beta.s1.stream.text.delta")
    assert not wanted.wants("busd.alpha.s1.stream.text.delta")


def test_one_subject_filters_on_the_server_several_here() -> None:
    one = IngestFilter("alpha", ["busd.*.*.stream.>"])
    assert one.server_filter == "busd.*.*.stream.>"
    several = IngestFilter("alpha", ["busd.beta.>", "busd.*.*.busd.run.>"])
    assert several.server_filter == "busd.>"
    assert several.wants("busd.beta.s1.stream.text.delta")
    assert several.wants("busd.gamma.s1.busd.run.started")
    assert not several.wants("busd.gamma.s1.stream.text.delta")
    assert not several.wants("busd.alpha.s1.busd.run.started")  # never its own


# -- options ----------------------------------------------------------------------------


def test_options_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: "build-01.example.org")
    options = parse_options({"url": "nats://127.0.0.1:4222"})
    assert options == BridgeOptions(url="nats://127.0.0.1:4222", name="build-01")
    assert (options.stream, options.subjects, options.buffer) == ("BUSD", None, 100_000)


@pytest.mark.parametrize(
    ("host", "name"), [("My Host!", "My-Host"), ("...", "busd"), ("ü-box", "box")]
)
def test_default_name_is_subject_safe(
    monkeypatch: pytest.MonkeyPatch, host: str, name: str
) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: host)
    assert default_name() == name


def test_the_default_name_is_the_host_and_its_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two daemons on one host (two users, or a second socket) get two names, each the
    same at every start; a daemon without a socket (embedded in a test) is the host."""
    monkeypatch.setattr(socket, "gethostname", lambda: "build-01.example.org")
    first = default_name("/run/user/1000/busd/bus.sock")
    assert re.fullmatch(r"build-01-[0-9a-f]{6}", first)
    assert default_name("/run/user/1000/busd/bus.sock") == first
    assert default_name("/run/user/1001/busd/bus.sock") != first
    assert default_name() == "build-01"
    options = parse_options({"url": "nats://h:4222"}, socket_path="/run/user/1000/busd/bus.sock")
    assert options.name == first
    explicit = {"url": "nats://h:4222", "name": "laptop"}
    assert parse_options(explicit, socket_path="/run/user/1000/busd/bus.sock").name == "laptop"
    monkeypatch.setattr(socket, "gethostname", lambda: "x" * 80)
    assert len(default_name("/tmp/bus.sock")) == 64


def test_options_as_the_flags_give_them(tmp_path: Path) -> None:
    creds = tmp_path / "user.creds"
    creds.write_text("-----BEGIN NATS USER JWT-----\n")
    options = parse_options(
        {
            "url": "nats://a:4222, tls://b:4222",
            "stream": "AGENTS",
            "subjects": ["busd.*.*.stream.>"],
            "creds": str(creds),
            "name": "ci_runner-3",
        }
    )
    assert options.subjects == ["busd.*.*.stream.>"]
    assert options.name == "ci_runner-3"


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ({"url": "nats://h", "ulr": "x"}, "unknown option 'ulr' (known: buffer, creds,"),
        ({"stream": "X"}, "'url' is required"),
        ({"url": "http://h:4222"}, "url 'http://h:4222' is not a NATS server address"),
        ({"url": "nats://:4222"}, "is not a NATS server address"),
        ({"url": "nats://h:port"}, "is not a NATS server address"),
        ({"url": "nats://a:4222,b:4222"}, "url 'b:4222'"),
        ({"url": 4222}, "Expected `str`, got `int` - at `$.url`"),
        ({"url": "nats://h", "name": "a.b"}, "name 'a.b' may only hold"),
        ({"url": "nats://h", "stream": "BUSD.X"}, "stream 'BUSD.X' may only hold"),
        ({"url": "nats://h", "subjects": ["stream.>"]}, "must be a subject under busd."),
        ({"url": "nats://h", "subjects": ["busd.>.x"]}, "'>' may only be the last token"),
        ({"url": "nats://h", "subjects": []}, "subjects is empty"),
        ({"url": "nats://h", "subjects": "busd.>"}, "Expected `array | null`, got `str`"),
        ({"url": "nats://h", "creds": "/nonexistent/x.creds"}, "credentials file"),
        ({"url": "nats://h", "buffer": 0}, "buffer and seen must be at least 1"),
        ({"url": "nats://h", "duplicate_window": 0}, "duplicate_window must be positive"),
        ({"url": "nats://h", "max_age": -1}, "max_age must be 0 (for ever) or seconds"),
        ({"url": "nats://h", "max_age": 60}, "max_age must not be below duplicate_window"),
    ],
)
def test_bad_options_say_which_and_why(raw: dict[str, Any], says: str) -> None:
    with pytest.raises(NatsOptionsError, match=r"^\[plugins\.nats\]: ") as caught:
        parse_options(raw)
    assert says in str(caught.value)


# -- ingest -----------------------------------------------------------------------------


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[Event, dict[str, Any]]] = []

    def __call__(self, event: Event, **fields: Any) -> Envelope[Event]:
        self.calls.append((event, fields))
        return Envelope(seq=len(self.calls), ts=0.0, event=event)


def wire(event: Event, event_id: str, session: str | None = "s1", **fields: Any) -> bytes:
    envelope = Envelope(seq=7, ts=1.0, event=event, session_id=session, id=event_id, **fields)
    return msgspec.msgpack.encode(envelope)


def make_ingestor(catalog: Catalog | None = None) -> tuple[Ingestor, Recorder]:
    recorder = Recorder()
    ingestor = Ingestor(recorder, catalog or Catalog(), IngestFilter("alpha", None), seen=3)
    return ingestor, recorder


def test_ingest_publishes_with_the_original_id_and_fields() -> None:
    ingestor, recorder = make_ingestor()
    data = wire(TextDelta(message_id="m", text="hi"), "id-1", run_id="r1", agent_id="a1")
    assert ingestor.ingest(Incoming("busd.beta.s1.stream.text.delta", data)) == "published"
    [(event, fields)] = recorder.calls
    assert event == TextDelta(message_id="m", text="hi")
    assert fields == {
        "session_id": "s1",
        "run_id": "r1",
        "agent_id": "a1",
        "source": "nats:beta",
        "event_id": "id-1",
    }
    assert ingestor.seen("id-1")


def test_ingest_skips_copies_own_and_derived_events() -> None:
    ingestor, recorder = make_ingestor()
    info = wire(SessionInfo(message="x"), "id-1")
    assert ingestor.ingest(Incoming("busd.beta.s1.stream.session.info", info)) == "published"
    assert ingestor.ingest(Incoming("busd.beta.s1.stream.session.info", info)) == "duplicate"
    own = wire(SessionInfo(message="x"), "id-2")
    assert ingestor.ingest(Incoming("busd.alpha.s1.stream.session.info", own)) == "own"
    stats = wire(StreamingStats(elapsed_s=1.0), "id-3")
    assert ingestor.ingest(Incoming("busd.beta.s1.busd.stats", stats)) == "local_only"
    assert len(recorder.calls) == 1
    counts = ingestor.statistics()
    assert (counts.published, counts.duplicate, counts.own, counts.local_only) == (1, 1, 1, 1)


def test_the_memory_of_ids_is_bounded() -> None:
    ingestor, _ = make_ingestor()  # remembers 3
    for n in range(5):
        data = wire(SessionInfo(message=str(n)), f"id-{n}")
        ingestor.ingest(Incoming("busd.beta.s1.stream.session.info", data))
    assert [ingestor.seen(f"id-{n}") for n in range(5)] == [False, False, True, True, True]


def test_unknown_types_are_counted_and_warned_about_once(caplog: pytest.LogCaptureFixture) -> None:
    class BuildFinished(Event, frozen=True, tag="acme.build.finished"):
        target: str

    ingestor, recorder = make_ingestor(Catalog(BUILTIN_EVENTS))
    caplog.set_level(logging.WARNING, logger="busd.nats")
    for n in range(3):
        data = wire(BuildFinished(target="x"), f"id-{n}")
        assert ingestor.ingest(Incoming("busd.beta.s1.acme.build.finished", data)) == "unknown"
    assert recorder.calls == []
    assert ingestor.statistics().unknown_types == ["acme.build.finished"]
    [record] = caplog.records
    assert "'acme.build.finished'" in record.getMessage()
    assert "install the plugin" in record.getMessage()


def test_garbage_is_counted_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    ingestor, recorder = make_ingestor()
    caplog.set_level(logging.WARNING, logger="busd.nats")
    for data in (b"\xc1", b"not msgpack at all", msgspec.msgpack.encode({"seq": 1})):
        assert ingestor.ingest(Incoming("busd.beta.s1.x.y", data)) == "malformed"
    bad_field = wire(SessionInfo(message="x"), "id-9").replace(b"message", b"massage")
    assert ingestor.ingest(Incoming("busd.beta.s1.x.y", bad_field)) == "rejected"
    assert recorder.calls == []
    assert ingestor.statistics().malformed == 3
    assert len(caplog.records) == 2  # once per kind and origin


# -- outbox and lanes -------------------------------------------------------------------


def item(n: int, lane: str | None = "s1") -> Outgoing:
    return Outgoing(f"id-{n}", f"busd.a.{lane}.x.y", b"", lane)


def test_outbox_drops_the_oldest_past_its_bound() -> None:
    outbox = Outbox(3)
    for n in range(5):
        outbox.put(item(n))
    assert outbox.take_dropped() == 2
    assert outbox.take_dropped() == 0
    assert outbox.dropped_total == 2
    first = outbox.take(2)
    assert [i.id for i in first] == ["id-2", "id-3"]
    outbox.restore(first)
    assert [i.id for i in outbox.take(10)] == ["id-2", "id-3", "id-4"]


def test_lanes_keep_one_in_flight_per_session_in_order() -> None:
    lanes = Lanes()
    lanes.add([item(0, "s1"), item(1, "s1"), item(2, "s2"), item(3, None)])
    first, second, third = lanes.next(), lanes.next(), lanes.next()
    assert [i.id for i in (first, second, third) if i] == ["id-0", "id-2", "id-3"]
    assert lanes.next() is None  # s1's next waits for id-0
    assert first is not None
    lanes.done(first)
    follow = lanes.next()
    assert follow is not None
    assert follow.id == "id-1"
    assert len(lanes) == 3
    for done in (second, third, follow):
        assert done is not None
        lanes.done(done)
    assert len(lanes) == 0
    assert lanes.next() is None


def test_busd_serve_refuses_to_start_with_bad_nats_options(tmp_path: Path) -> None:
    sock = tmp_path / "bus.sock"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "busd",
            "serve",
            "--socket",
            str(sock),
            "--no-journal",
            "--nats",
            "http://example",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "busd: [plugins.nats]: url 'http://example' is not a NATS server address" in (
        result.stderr
    )
    assert "Traceback" not in result.stderr
    assert not sock.exists()
