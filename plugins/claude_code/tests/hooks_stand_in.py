"""A stand-in Anthropic Messages API whose model calls a tool that needs permission.

Run: ``python hooks_stand_in.py PORT`` (or import it and serve
:class:`Handler`), and point the bundled ``claude`` at it with
``ANTHROPIC_BASE_URL=http://127.0.0.1:PORT``. A turn's first call (one
that offers tools) gets a ``Bash`` tool use, ``echo hooked > hooked.txt``,
which Claude Code asks permission for (it writes a file); the call after the
tool's result gets a short answer that says what the result was. Calls
without tools (the CLI's side calls: titles, summaries) get a short text.
Each request is logged to stderr; :data:`SERVED` lists what was answered.
"""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

COMMAND = "echo hooked > hooked.txt"
"""What the model asks ``Bash`` to run (in the session's working directory)."""

TOOL_USE_ID = "toolu_hooked_1"

USAGE = {"input_tokens": 12, "cache_creation_input_tokens": 3_000, "cache_read_input_tokens": 0}

_lock = threading.Lock()
SERVED: list[str] = []
"""The kind of every answer, in order: ``tool_call``, ``answer`` or ``side``."""


def _sse(model: str, ident: str, blocks: list[dict[str, Any]], stop: str) -> bytes:
    start: dict[str, Any] = {
        "id": ident,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {**USAGE, "output_tokens": 1},
    }
    events: list[dict[str, Any]] = [{"type": "message_start", "message": start}]
    for index, block in enumerate(blocks):
        first: dict[str, Any]
        if block["type"] == "text":
            first = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": block["text"]}
        else:
            first = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        events.append({"type": "content_block_start", "index": index, "content_block": first})
        events.append({"type": "content_block_delta", "index": index, "delta": delta})
        events.append({"type": "content_block_stop", "index": index})
    final = {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None}}
    events.append({**final, "usage": {**USAGE, "output_tokens": 20}})
    events.append({"type": "message_stop"})
    return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)


def _result_text(messages: list[Any]) -> str | None:
    """The text of the last message's tool result, if it is one."""
    last = messages[-1] if messages else {}
    content = last.get("content") if isinstance(last, dict) else None
    for block in content if isinstance(content, list) else []:
        if isinstance(block, dict) and block.get("type") == "tool_result":
            inner = block.get("content")
            if isinstance(inner, list):
                inner = " ".join(str(b.get("text", "")) for b in inner if isinstance(b, dict))
            error = " (error)" if block.get("is_error") else ""
            return f"{inner}{error}"
    return None


def answer(body: dict[str, Any]) -> bytes:
    """The SSE stream that answers one Messages API request."""
    with _lock:
        n = len(SERVED) + 1
        model = str(body.get("model", ""))
        messages = body.get("messages") or []
        if not body.get("tools"):
            SERVED.append("side")
            return _sse(model, f"msg_{n}", [{"type": "text", "text": "Hook test"}], "end_turn")
        result = _result_text(messages)
        if result is not None:
            SERVED.append("answer")
            text = f"The tool said: {result}"
            return _sse(model, f"msg_{n}", [{"type": "text", "text": text}], "end_turn")
        SERVED.append("tool_call")
        tool = {
            "type": "tool_use",
            "id": TOOL_USE_ID,
            "name": "Bash",
            "input": {"command": COMMAND, "description": "Write hooked.txt"},
        }
        return _sse(model, f"msg_{n}", [tool], "tool_use")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        sys.stderr.write(f"POST {self.path} tools={len(body.get('tools') or [])}\n")
        if "count_tokens" in self.path:
            self._send(b'{"input_tokens": 10}', "application/json")
            return
        self._send(answer(body), "text/event-stream")

    def do_GET(self) -> None:
        self._send(b"{}", "application/json", status=404)

    def _send(self, data: bytes, kind: str, status: int = 200) -> None:
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(data)))
        self.send_header("request-id", "req_hooks_stand_in")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
