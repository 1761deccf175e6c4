"""A stand-in ACP agent: speaks JSON-RPC on stdio and replays ``acp.jsonl``'s agent side.

Run as ``python fake_acp_agent.py FIXTURE RECORD [FLAGS]``. It is plain
JSON-RPC (one message per line), not the SDK's agent side, on purpose:
importing ``acp`` costs about 0.8 s per process, and writing the fixture's
lines as they are keeps the agent's messages byte-for-byte the recorded ones.

- ``initialize`` offers ``loadSession``; ``session/new`` answers the fixture's
  session id with a ``model`` config option and two modes; ``session/load``
  first replays a scrap of history (``session/update`` notifications a driver
  must not feed again), then answers.
- ``session/prompt`` looks up the fixture's prompt with the same text and
  replays the agent's messages up to that prompt's answer, with the ids
  rewritten to this connection's: the answer carries the real prompt's id,
  and ``session/request_permission`` is a real request this agent waits for.
  If the client selects a ``reject`` option, the tool fails and the turn ends
  ``end_turn``; otherwise the replay goes on (the fixture's cancelled prompt
  continues with the failed tool and ``stopReason: "cancelled"``).
- Every message the client sends, and the process's own pid, cwd and
  ``BUSD_FAKE_MARK`` environment variable, are appended to RECORD as JSON
  lines, so tests can check what reached the agent.
- ``--crash``: on ``session/prompt``, say one thing, print to stderr and exit 3.
- ``--stuck``: once a permission request is answered, never answer the prompt
  (ignores ``session/cancel``); exits at EOF on stdin or on SIGTERM.
- ``--hold-mode``: never answer ``session/set_mode`` (a client waits there,
  before its prompt).
- ``--fs PATH``: on ``session/prompt``, first write PATH through the client's
  ``fs/write_text_file``, read its second line back, and read a missing file.
- ``--notice``: on ``session/prompt``, first a warning as claude-agent-acp
  0.101.0 sends one: a ``notice`` update when the client advertised
  ``clientCapabilities.session.notices``, else a bold-label answer chunk.
- ``--orphan``: start a program of its own that outlives it (a minute's
  sleep, which ignores SIGTERM), as an agent's CLI can; its pid is recorded.

The first record also says the agent's session and process group ids.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

SESSION = "sess_abc123def456"
CONFIG_OPTIONS = [
    {
        "id": "model",
        "name": "Model",
        "category": "model",
        "type": "select",
        "currentValue": "fake-small",
        "options": [
            {"value": "fake-small", "name": "Small"},
            {"value": "fake-large", "name": "Large"},
        ],
    }
]
MODES = {
    "currentModeId": "default",
    "availableModes": [
        {"id": "default", "name": "Ask before edits"},
        {"id": "acceptEdits", "name": "Accept edits"},
    ],
}
HISTORY = [
    {"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": "earlier"}},
    {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "replayed"}},
]

NOTICE = {
    "sessionUpdate": "notice",
    "severity": "warning",
    "title": "Auto mode unavailable",
    "description": "The selected model does not support Auto mode; using Accept edits instead.",
}
NOTICE_AS_TEXT = {
    "sessionUpdate": "agent_message_chunk",
    "content": {"type": "text", "text": "**Auto mode unavailable:** the selected model ..."},
}


class Agent:
    def __init__(self, fixture: Path, record: Path, flags: list[str]) -> None:
        self.lines = [json.loads(line) for line in fixture.read_text().splitlines() if line]
        self.record_file = record.open("a", buffering=1)
        self.crash = "--crash" in flags
        self.stuck = "--stuck" in flags
        self.hold_mode = "--hold-mode" in flags
        self.orphan = "--orphan" in flags
        self.notice = "--notice" in flags
        self.notices_wanted = False
        fs_path = flags[flags.index("--fs") + 1] if "--fs" in flags else None
        self.fs_path = fs_path
        self.next_id = 0
        self.cancelled = False

    # -- wire -----------------------------------------------------------------

    def send(self, message: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()

    def receive(self) -> dict[str, Any] | None:
        line = sys.stdin.readline()
        if not line:
            return None
        message: dict[str, Any] = json.loads(line)
        self.record({"from_client": message})
        return message

    def record(self, entry: dict[str, Any]) -> None:
        self.record_file.write(json.dumps(entry) + "\n")

    def answer(self, rid: Any, result: Any) -> None:
        self.send({"jsonrpc": "2.0", "id": rid, "result": result})

    # -- the client's requests --------------------------------------------------

    def serve(self) -> None:
        self.record(
            {
                "pid": os.getpid(),
                "cwd": os.getcwd(),
                "mark": os.environ.get("BUSD_FAKE_MARK"),
                "sid": os.getsid(0),
                "pgid": os.getpgrp(),
            }
        )
        if self.orphan:
            hold = (
                "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
            )
            child = subprocess.Popen([sys.executable, "-c", hold], stdin=subprocess.DEVNULL)
            self.record({"orphan": child.pid})
        while (message := self.receive()) is not None:
            self.dispatch(message)

    def dispatch(self, message: dict[str, Any]) -> None:
        method, rid, params = message.get("method"), message.get("id"), message.get("params") or {}
        if method == "initialize":
            session_caps = params.get("clientCapabilities", {}).get("session") or {}
            self.notices_wanted = isinstance(session_caps.get("notices"), dict)
            self.answer(rid, {"protocolVersion": 1, "agentCapabilities": {"loadSession": True}})
        elif method == "session/new":
            self.answer(
                rid, {"sessionId": SESSION, "configOptions": CONFIG_OPTIONS, "modes": MODES}
            )
        elif method == "session/load":
            for update in HISTORY:
                self.notify(params["sessionId"], update)
            self.answer(rid, {"configOptions": CONFIG_OPTIONS, "modes": MODES})
        elif method == "session/set_config_option":
            self.answer(rid, {"configOptions": CONFIG_OPTIONS})
        elif method == "session/set_mode":
            if not self.hold_mode:
                self.answer(rid, {})
        elif method == "session/prompt":
            self.prompt(rid, params)
        elif method == "session/cancel":
            self.cancelled = True
        elif rid is not None and method is not None:
            self.send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": method}})

    def notify(self, session: str, update: dict[str, Any]) -> None:
        params = {"sessionId": session, "update": update}
        self.send({"jsonrpc": "2.0", "method": "session/update", "params": params})

    # -- a prompt, replayed from the fixture ------------------------------------------

    def prompt(self, rid: Any, params: dict[str, Any]) -> None:
        text = params["prompt"][0]["text"]
        start = next(
            i
            for i, line in enumerate(self.lines)
            if line.get("method") == "session/prompt"
            and line["params"]["prompt"][0]["text"] == text
        )
        fixture_id = self.lines[start]["id"]
        if self.fs_path is not None:
            self.use_fs(params["sessionId"], self.fs_path)
        if self.notice:
            self.notify(params["sessionId"], NOTICE if self.notices_wanted else NOTICE_AS_TEXT)
        if self.crash:
            self.send(self.lines[start + 1])
            print("fake agent: the model provider is unreachable", file=sys.stderr, flush=True)
            os._exit(3)
        for line in self.lines[start + 1 :]:
            if "method" not in line:  # a response: the prompt's answer, or the client's
                if line["id"] == fixture_id and "stopReason" in line.get("result", {}):
                    self.answer(rid, line["result"])
                    return
                continue  # the client's answer: the real one is awaited below
            if line["method"] == "session/cancel":
                continue  # the client's, if it sends one
            if "id" not in line:
                self.send(line)
            elif not self.ask(line):
                call = line["params"]["toolCall"]["toolCallId"]
                update = {
                    "sessionUpdate": "tool_call_update",
                    "toolCallId": call,
                    "status": "failed",
                }
                self.notify(line["params"]["sessionId"], update)
                self.answer(rid, {"stopReason": "end_turn"})
                return

    def ask(self, request: dict[str, Any]) -> bool:
        """Ask for permission and wait; ``False`` if the client selected a reject option."""
        answer = self.call(request["method"], request["params"])
        self.record({"permission_answer": answer, "cancel_seen_first": self.cancelled})
        if self.stuck:
            while self.receive() is not None:
                pass  # never answers the prompt; ends at EOF (or SIGTERM)
            sys.exit(0)
        outcome = answer.get("result", {}).get("outcome", {})
        return not str(outcome.get("optionId", "")).startswith("reject")

    def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """Send a request with this connection's next id; serve the client until it answers."""
        rid, self.next_id = self.next_id, self.next_id + 1
        self.send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        while (message := self.receive()) is not None:
            if "method" in message:
                self.dispatch(message)
            elif message.get("id") == rid:
                return message
        sys.exit(0)

    def use_fs(self, session: str, path: str) -> None:
        """Write a file through the client, then read its second line back."""
        write = {"sessionId": session, "path": path, "content": "okra\nfig\n"}
        self.record({"fs_write": self.call("fs/write_text_file", write)})
        read = {"sessionId": session, "path": path, "line": 2, "limit": 1}
        self.record({"fs_read": self.call("fs/read_text_file", read)})
        missing = {"sessionId": session, "path": path + ".missing"}
        self.record({"fs_missing": self.call("fs/read_text_file", missing)})


def main() -> None:
    Agent(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]).serve()


if __name__ == "__main__":
    main()
