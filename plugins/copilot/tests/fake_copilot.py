"""A stand-in for the Copilot CLI: the SDK's JSON-RPC over stdio, a recorded session.

The real SDK starts it as its runtime (``python fake_copilot.py --fixture F
--record R [--scenario S]`` followed by the SDK's own ``--headless ...
--stdio`` flags) and talks to it exactly as to ``copilot --stdio``: LSP-style
``Content-Length`` frames, the ``connect`` handshake (protocol 3),
``session.create``, ``session.send``, ``session.abort``, ``session.detach``,
``runtime.shutdown``. It answers with the recorded ``session.event``
notifications of ``copilot.jsonl``: the events before ``user.message`` while
the session is created (as the CLI does), the rest after ``session.send``.

For the recorded ``permission.requested`` it does what the CLI does in
protocol 3: it broadcasts the event, waits for the SDK's
``session.permissions.handlePendingPermissionRequest`` and says what was
decided in ``permission.completed`` (a denied tool then fails instead of
running). Every request it gets is appended to the ``--record`` file as one
JSON line, so tests see what reached the CLI.

Scenarios: ``full`` (the recording), ``hang`` (stops after the first text
delta until aborted), ``error`` (a ``session.error`` after the turn starts),
``crash`` (exits with status 3 and a message on stderr after the turn starts).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any, BinaryIO

_DECIDED = {
    "approve-once": "approved",
    "approve-for-session": "approved-for-session",
    "reject": "denied-interactively-by-user",
    "user-not-available": "denied-no-approval-rule-and-could-not-request-from-user",
}
"""How the CLI reports a client's decision in ``permission.completed``."""


class FakeCopilot:
    def __init__(self, events: list[dict[str, Any]], record: Path, scenario: str) -> None:
        self.events = events
        self.record_path = record
        self.scenario = scenario
        self.out: BinaryIO = sys.stdout.buffer
        self.write_lock = threading.Lock()
        self.session_id = ""
        self.aborted = threading.Event()
        self.answered = threading.Event()
        self.answer: dict[str, Any] = {}
        self.replayer: threading.Thread | None = None
        self.sent = 0  # events of self.events already sent

    # -- wire ------------------------------------------------------------------------

    def write(self, message: dict[str, Any]) -> None:
        body = json.dumps(message).encode()
        with self.write_lock:
            self.out.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
            self.out.flush()

    def read(self, stream: BinaryIO) -> dict[str, Any] | None:
        length = None
        while True:
            line = stream.readline()
            if not line:
                return None
            line = line.strip()
            if not line:
                break
            name, _, value = line.partition(b":")
            if name.lower() == b"content-length":
                length = int(value)
        if length is None:
            return None
        message: dict[str, Any] = json.loads(stream.read(length))
        return message

    def record(self, entry: dict[str, Any]) -> None:
        with self.record_path.open("a") as f:
            f.write(json.dumps(entry) + "\n")

    def notify(self, event: dict[str, Any]) -> None:
        params = {"sessionId": self.session_id, "event": event}
        self.write({"jsonrpc": "2.0", "method": "session.event", "params": params})

    # -- requests --------------------------------------------------------------------

    def serve(self) -> None:
        self.record({"pid": os.getpid(), "sid": os.getsid(0)})
        while (message := self.read(sys.stdin.buffer)) is not None:
            if "method" not in message:
                continue  # a response: this CLI asks the SDK nothing
            method, params = message["method"], message.get("params") or {}
            self.record({"method": method, "params": params})
            if "id" in message:
                self.handle(message["id"], method, params)
        self.record({"exit": "stdin closed"})

    def reply(self, request_id: object, result: object) -> None:
        self.write({"jsonrpc": "2.0", "id": request_id, "result": result})

    def handle(self, request_id: object, method: str, params: dict[str, Any]) -> None:
        if method == "connect":
            self.reply(request_id, {"ok": True, "protocolVersion": 3, "version": "0.0.0-fake"})
        elif method == "ping":
            self.reply(request_id, {"message": "pong", "timestamp": 0, "protocolVersion": 3})
        elif method in ("session.create", "session.resume"):
            self.session_id = params["sessionId"]
            while self.sent < len(self.events) and self.events[self.sent]["type"] != "user.message":
                self.notify(self.events[self.sent])
                self.sent += 1
            self.reply(request_id, {"sessionId": self.session_id, "workspacePath": None})
        elif method == "session.send":
            self.reply(request_id, {"messageId": "msg-1"})
            self.replayer = threading.Thread(target=self.replay, daemon=True)
            self.replayer.start()
        elif method == "session.abort":
            self.aborted.set()
            self.answered.set()
            if self.replayer is not None:
                self.replayer.join()
            self.notify(_event("abort", {"reason": "remote_command"}))
            self.notify(_event("session.idle", {"aborted": True}, ephemeral=True))
            self.reply(request_id, {})
        elif method == "session.permissions.handlePendingPermissionRequest":
            self.answer = params.get("result") or {}
            self.answered.set()
            self.reply(request_id, {"success": True})
        elif method == "session.detach":
            self.reply(request_id, {"success": True})
        elif method == "runtime.shutdown":
            self.reply(request_id, {})
        else:
            error = {"code": -32601, "message": f"Unhandled method {method}"}
            self.write({"jsonrpc": "2.0", "id": request_id, "error": error})

    # -- the recorded session ------------------------------------------------------------

    def replay(self) -> None:
        denied: set[str] = set()
        for event in self.events[self.sent :]:
            if self.aborted.is_set():
                return
            kind, data = event["type"], event["data"]
            if kind == "permission.completed":
                decided = self.answer.get("kind", "")
                result: dict[str, Any] = {"kind": _DECIDED.get(decided, decided)}
                for key in ("feedback", "approval"):
                    if key in self.answer:
                        result[key] = self.answer[key]
                if not result["kind"].startswith("approve"):
                    denied.add(data.get("toolCallId", ""))
                event = {**event, "data": {**data, "result": result}}
            elif kind.startswith("tool.") and data.get("toolCallId") in denied:
                if kind != "tool.execution_complete":
                    continue
                failure = {"message": "The user rejected this tool call.", "code": "denied"}
                event = {**event, "data": {"toolCallId": data["toolCallId"], "success": False,
                                           "error": failure}}  # fmt: skip
            self.notify(event)
            if kind == "permission.requested":
                self.answered.wait()
                if self.aborted.is_set():
                    return
                self.record({"answer": self.answer})
            elif kind == "assistant.turn_start" and self.scenario == "error":
                error = {"errorType": "model", "message": "rate limited", "statusCode": 429}
                self.notify(_event("session.error", error))
                self.notify(_event("session.idle", {}, ephemeral=True))
                return
            elif kind == "assistant.turn_start" and self.scenario == "crash":
                sys.stderr.write("fatal: the fake CLI crashed\n")
                sys.stderr.flush()
                os._exit(3)
            elif kind == "assistant.message_delta" and self.scenario == "hang":
                self.aborted.wait()
                return


_serial = 0


def _event(kind: str, data: dict[str, Any], *, ephemeral: bool = False) -> dict[str, Any]:
    global _serial
    _serial += 1
    event: dict[str, Any] = {
        "type": kind,
        "data": data,
        "id": f"ffffffff-0000-4000-8000-{_serial:012d}",
        "timestamp": "2026-08-27T17:00:10.000Z",
        "parentId": None,
    }
    if ephemeral:
        event["ephemeral"] = True
    return event


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fixture", type=Path, required=True)
    parser.add_argument("--record", type=Path, required=True)
    parser.add_argument("--scenario", default="full")
    args, sdk_flags = parser.parse_known_args()
    events = [json.loads(line) for line in args.fixture.read_text().splitlines() if line]
    fake = FakeCopilot(events, args.record, args.scenario)
    fake.record({"argv": sdk_flags})
    fake.serve()


if __name__ == "__main__":
    main()
