"""``busd schema``: the JSON Schema a client in another language can trust.

The schema is generated from the types; these tests hold the daemon to it
from the outside: a real daemon on a real socket plays a recorded run with
a permission request, answers every request command, and every byte it
sends, decoded as plain msgpack, must validate against ``ServerFrame``,
every result against its ``Result.<cmd>``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
from jsonschema import Draft202012Validator

from busd.wire import (
    PROTOCOL_VERSION,
    CancelRun,
    Frame,
    Hello,
    Outgoing,
    PermissionReply,
    Ping,
    Publish,
    Request,
    Runs,
    Sessions,
    Snapshot,
    StartRun,
    Stats,
    Status,
    Subscribe,
    encode_frame,
)
from busd.wire.frames import AnyCommand
from busd.wire.results import AckResult, RunSummary, StartedRun, StatusResult
from busd.wire.schema import protocol_schema

from .daemon_helpers import running_daemon
from .test_replay import plugins

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = protocol_schema()
NOT_AN_EVENT: Any = Status()  # a Struct that is no event: what a publish must not carry


def validator(entry: str) -> Draft202012Validator:
    return Draft202012Validator({"$ref": f"#/$defs/{entry}", "$defs": SCHEMA["$defs"]})


def test_the_published_schema_is_the_generated_one() -> None:
    committed = json.loads((ROOT / "docs" / "protocol.schema.json").read_text())
    assert committed == SCHEMA, "docs/protocol.schema.json is stale: `busd schema > ...`"
    Draft202012Validator.check_schema(SCHEMA)


def test_busd_schema_prints_it() -> None:
    busd = [sys.executable, "-c", "from busd.cli import main; main()"]
    result = subprocess.run([*busd, "schema"], capture_output=True, timeout=60, check=True)
    assert json.loads(result.stdout) == SCHEMA


@pytest.mark.parametrize(
    "frame",
    [
        Hello(protocol=1, client="tui", role="observer"),
        Subscribe(id=1, patterns=("stream.>",), sessions=("s1",), since_seq=4, deltas="raw"),
        Publish(events=[Outgoing(event=NOT_AN_EVENT)], ack=3),  # must fail below
        Request(id=2, command=StartRun(adapter="claude-code", prompt="hi", options={"a": 1})),
        Ping(nonce=7),
    ],
    ids=lambda f: type(f).__name__,
)
def test_client_frames_as_busd_writes_them_validate(frame: Frame) -> None:
    body = msgspec.msgpack.decode(encode_frame(frame)[4:])
    errors = list(validator("ClientFrame").iter_errors(body))
    if isinstance(frame, Publish):
        assert errors, "a publish of something that is no event must not validate"
    else:
        assert errors == [], body


class Recorder:
    """A raw client that keeps every frame the daemon sends, as plain maps."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = b""
        self.frames: list[dict[str, Any]] = []

    async def send(self, frame: Frame) -> None:
        await self.stream.send_all(encode_frame(frame))

    async def receive(self) -> dict[str, Any]:
        while len(self.buffer) < 4 or len(self.buffer) < 4 + int.from_bytes(self.buffer[:4]):
            data = await self.stream.receive_some(65536)
            if not data:
                raise EOFError("the daemon closed the connection")
            self.buffer += data
        size = int.from_bytes(self.buffer[:4])
        body, self.buffer = self.buffer[4 : 4 + size], self.buffer[4 + size :]
        frame: dict[str, Any] = msgspec.msgpack.decode(body)
        self.frames.append(frame)
        return frame

    async def ask(self, request_id: int, command: AnyCommand) -> dict[str, Any]:
        return await self.ask_ack(request_id, Request(id=request_id, command=command))

    async def ask_ack(self, request_id: int, frame: Frame) -> dict[str, Any]:
        """Send ``frame`` and return the reply with ``request_id`` (a request's, an ack's)."""
        await self.send(frame)
        while True:
            received = await self.receive()
            if received["op"] == "reply" and received["id"] == request_id:
                return received


async def test_every_frame_and_result_of_a_real_session_validates(tmp_path: Path) -> None:
    path = tmp_path / "bus.sock"
    results: dict[str, list[Any]] = {}
    async with running_daemon(path, plugins=plugins()):
        stream = await trio.open_unix_socket(os.fspath(path))
        raw = Recorder(stream)
        await raw.send(Hello(protocol=PROTOCOL_VERSION, client="schema", role="admin"))
        assert (await raw.receive())["op"] == "welcome"
        await raw.send(Subscribe(id=1, window_ms=0, deltas="raw"))
        start = StartRun(
            adapter="claude-code",
            prompt="replay it",
            driver="replay",
            options={"recording": "claude_code", "speed": 0},
        )
        started = await raw.ask(10, start)
        results["start_run"] = [started["result"]]
        run_id, session_id = started["result"]["run_id"], started["result"]["session_id"]
        with trio.fail_after(30):
            finished = False
            while not finished:
                frame = await raw.receive()
                for envelope in frame.get("events", []) if frame["op"] == "events" else []:
                    event = envelope["event"]
                    if event["type"] == "stream.permission.requested":
                        answer = PermissionReply(request_id=event["request_id"], allow=True)
                        answered = await raw.ask(11, answer)
                        results["permission_reply"] = [answered["result"]]
                    finished |= event["type"] == "busd.run.finished"
        commands: dict[str, AnyCommand] = {
            "status": Status(),
            "sessions": Sessions(),
            "snapshot": Snapshot(session_id=session_id),
            "stats": Stats(session_id=session_id),
            "stats.daemon": Stats(),
            "runs": Runs(),
        }
        for number, (name, command) in enumerate(commands.items(), start=20):
            reply = await raw.ask(number, command)
            assert reply["ok"], reply
            results[name] = [reply["result"]]
        refused = await raw.ask(30, CancelRun(run_id=run_id))  # it ended: a failed reply
        assert refused["error"]["code"] == "run_finished"
        acked = await raw.ask_ack(31, Publish(events=[], ack=31))
        results["ack"] = [acked["result"]]
        await raw.send(Publish(events=[Outgoing(event=NOT_AN_EVENT)]))  # an error frame
        await raw.send(Ping(nonce=5))
        with trio.fail_after(10):
            while (await raw.receive())["op"] != "pong":
                pass
        await stream.aclose()

    kinds = {frame["op"] for frame in raw.frames}
    assert kinds >= {"welcome", "events", "reply", "error", "pong"}, kinds
    server = validator("ServerFrame")
    for frame in raw.frames:
        errors = [f"{e.json_path}: {e.message}" for e in server.iter_errors(frame)]
        assert errors == [], (frame, errors[:3])
    assert set(results) == {*commands, "start_run", "permission_reply", "ack"}
    exact = {"status": StatusResult, "start_run": StartedRun, "ack": AckResult}
    for name, kind in exact.items():
        assert list(results[name][0]) == list(kind.__struct_fields__), name
    for run in results["runs"][0]:
        assert list(run) == list(RunSummary.__struct_fields__)
    for name, values in results.items():
        for value in values:
            errors = [e.message for e in validator(f"Result.{name}").iter_errors(value)]
            assert errors == [], (name, value, errors[:3])


def test_the_result_types_list_every_key_the_daemon_sends() -> None:
    """The schema is open (newer daemons add keys); this keeps its lists complete."""
    from busd.daemon.hub import Daemon

    status = msgspec.msgpack.decode(msgspec.msgpack.encode(Daemon().status()))  # as sent
    assert list(validator("Result.status").iter_errors(status)) == []
    assert list(status) == list(StatusResult.__struct_fields__)


def test_no_definition_is_only_a_reference_to_itself() -> None:
    for name, schema in SCHEMA["$defs"].items():
        assert schema != {"$ref": f"#/$defs/{name}"}, name


def test_tagged_unions_are_one_of_with_a_discriminator() -> None:
    def tagged_any_of(node: Any) -> int:
        if isinstance(node, dict):
            here = int("discriminator" in node and "anyOf" in node)
            return here + sum(tagged_any_of(v) for v in node.values())
        return sum(tagged_any_of(v) for v in node) if isinstance(node, list) else 0

    assert tagged_any_of(SCHEMA) == 0
    client = SCHEMA["$defs"]["ClientFrame"]
    assert client["discriminator"]["propertyName"] == "op"
    assert len(client["oneOf"]) == 8
