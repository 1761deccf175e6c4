"""A stand-in for the ``claude`` CLI that speaks its ``stream-json`` on stdio.

The Claude Agent SDK runs it (through ``cli_path``) exactly as it runs the
real CLI: it answers the SDK's ``initialize`` control request, reads the
user prompt, then replays ``tests/fixtures/sdk/claude_code.jsonl`` to stdout.
The recorded ``control_request`` line is sent for real: the stand-in waits
for the SDK's ``control_response`` and records it; on a deny it reports the
tool as refused and ends the turn (as Claude Code does, without the second
model call). An ``interrupt`` control request is answered, a pending
permission request is withdrawn with ``control_cancel_request``, and the
turn ends with an ``error_during_execution`` result, as the CLI does.

Everything it sees is appended as JSON lines to ``$FAKE_CLAUDE_RECORD``:
``{"argv": [...], "cwd": ..., "pid": ...}``, ``{"init": request}``,
``{"user": message}``, ``{"permission": response}``, ``{"interrupt": request}``,
``{"withdrawn": request_id}``, ``{"exit": code}``.

Switches (environment):

- ``FAKE_CLAUDE_HOLD_AT=<n>``: before fixture line ``n``, wait for an
  interrupt (or the end of stdin), so a test can cancel mid-stream.
- ``FAKE_CLAUDE_FAIL=crash``: after reading the prompt, write to stderr and
  exit 3 without a result.
- ``FAKE_CLAUDE_FAIL=result``: after the ``init`` line, report an API error in
  the result and exit 1, as the CLI does.
- ``FAKE_CLAUDE_FAIL=silent``: after the ``init`` line, exit 0 without a result.
"""

from __future__ import annotations

import json
import os
import queue
import sys
import threading
from pathlib import Path
from typing import Any

FIXTURE = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "sdk" / "claude_code.jsonl"
SESSION = "febcaa44-9f0f-4ae7-ad70-748009748653"

_EOF = None


class Interrupted(Exception):
    """The SDK asked for an interrupt (already answered)."""


class EndOfInput(Exception):
    """The SDK closed stdin."""


class Fake:
    def __init__(self, record: Path) -> None:
        self.record_path = record
        self.inbox: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.pending_permission: str | None = None
        threading.Thread(target=self._read_stdin, daemon=True).start()

    # -- I/O -----------------------------------------------------------------------

    def _read_stdin(self) -> None:
        for line in sys.stdin:
            if line.strip():
                self.inbox.put(json.loads(line))
        self.inbox.put(_EOF)

    def record(self, **entry: Any) -> None:
        with self.record_path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")

    def send(self, message: dict[str, Any]) -> None:
        self.send_line(json.dumps(message))

    def send_line(self, line: str) -> None:
        sys.stdout.write(line.rstrip("\n") + "\n")
        sys.stdout.flush()

    def respond(self, request_id: str, response: dict[str, Any] | None = None) -> None:
        self.send(
            {
                "type": "control_response",
                "response": {
                    "subtype": "success",
                    "request_id": request_id,
                    "response": response or {},
                },
            }
        )

    def receive(self, *, block: bool = True) -> dict[str, Any] | None:
        """The next message from the SDK; interrupts are handled here, EOF raises."""
        try:
            message = self.inbox.get(block=block)
        except queue.Empty:
            return None
        if message is _EOF:
            raise EndOfInput
        request = message.get("request") or {}
        if message.get("type") == "control_request" and request.get("subtype") == "interrupt":
            self.record(interrupt=message)
            self.respond(message["request_id"])
            raise Interrupted
        return message

    # -- the session ---------------------------------------------------------------

    def handshake(self) -> None:
        while True:
            message = self.receive()
            assert message is not None
            if message.get("type") == "control_request":
                assert message["request"]["subtype"] == "initialize", message
                self.record(init=message["request"])
                self.respond(message["request_id"], {"commands": [], "output_style": "default"})
            elif message.get("type") == "user":
                self.record(user=message)
                return

    def replay(self) -> None:
        hold_at = int(os.environ.get("FAKE_CLAUDE_HOLD_AT", "-1"))
        fail = os.environ.get("FAKE_CLAUDE_FAIL")
        if fail == "crash":
            sys.stderr.write("fake claude: cannot reach the API\n")
            sys.stderr.flush()
            raise SystemExit(3)
        lines = FIXTURE.read_text(encoding="utf-8").splitlines()
        for index, text in enumerate(lines):
            if index == hold_at:
                while True:
                    self.receive()  # until an interrupt (or EOF) raises
            while self.receive(block=False) is not None:
                pass  # only interrupts matter between lines
            line = json.loads(text)
            if line["type"] == "control_request":
                if not self.ask(line):
                    self.refused(line["request"])
                    return
                continue
            self.send_line(text)
            if fail == "result" and line.get("subtype") == "init":
                self.send(_result("success", is_error=True, result="API Error: 401 invalid key"))
                raise SystemExit(1)
            if fail == "silent" and line.get("subtype") == "init":
                raise SystemExit(0)

    def ask(self, line: dict[str, Any]) -> bool:
        """Send a real ``can_use_tool`` request and wait for the SDK's answer."""
        request_id = line["request_id"]
        self.pending_permission = request_id
        self.send(line)
        while True:
            message = self.receive()
            if message is None or message.get("type") != "control_response":
                continue
            response = message["response"]
            if response.get("request_id") != request_id:
                continue
            self.pending_permission = None
            self.record(permission=response)
            answer = response.get("response") or {}
            return response.get("subtype") == "success" and answer.get("behavior") == "allow"

    def refused(self, request: dict[str, Any]) -> None:
        call = request["tool_use_id"]
        self.send(
            {
                "type": "user",
                "message": {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": call,
                            "content": "The user doesn't want to proceed with this tool use.",
                            "is_error": True,
                        }
                    ],
                },
                "parent_tool_use_id": None,
                "session_id": SESSION,
                "uuid": "5f0e8d3c-0000-4000-8000-00000000de01",
            }
        )
        denial = {"tool_name": request["tool_name"], "tool_use_id": call, "tool_input": {}}
        self.send(_result("success", permission_denials=[denial], result="Not written."))

    def interrupted(self) -> None:
        if self.pending_permission is not None:
            self.send({"type": "control_cancel_request", "request_id": self.pending_permission})
            self.record(withdrawn=self.pending_permission)
        reason = "aborted_tools" if self.pending_permission else "aborted_streaming"
        self.send(_result("error_during_execution", terminal_reason=reason))

    def idle(self) -> None:
        """Wait for the next prompt (none comes) until stdin closes; answer interrupts."""
        while True:
            try:
                self.receive()
            except Interrupted:
                continue


def _result(subtype: str, *, is_error: bool = False, **fields: Any) -> dict[str, Any]:
    return {
        "type": "result",
        "subtype": subtype,
        "is_error": is_error,
        "duration_ms": 10,
        "duration_api_ms": 5,
        "num_turns": 1,
        "session_id": SESSION,
        "total_cost_usd": 0.001,
        "usage": {"input_tokens": 10, "output_tokens": 143},
        "permission_denials": [],
        **fields,
    }


def main() -> None:
    fake = Fake(Path(os.environ["FAKE_CLAUDE_RECORD"]))
    fake.record(argv=sys.argv[1:], cwd=os.getcwd(), pid=os.getpid())
    code = 0
    try:
        fake.handshake()
        try:
            fake.replay()
        except Interrupted:
            fake.interrupted()
        fake.idle()
    except EndOfInput:
        pass
    except SystemExit as exit:
        code = int(exit.code or 0)
    fake.record(exit=code)
    raise SystemExit(code)


if __name__ == "__main__":
    main()
