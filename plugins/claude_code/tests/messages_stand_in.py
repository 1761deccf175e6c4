"""A scripted Anthropic Messages API for real agents, with a slow mode for cancel tests.

Live tests point a real agent program (the Claude Code CLI, the Copilot CLI
with a bring-your-own-key provider, ``claude-agent-acp``) at :class:`StandIn`
on 127.0.0.1. ``POST /v1/messages`` is answered by rule (SSE when the request
streams, JSON otherwise):

- a request offering no tools (a title or other side call) gets ``TITLE``;
- a request offering the scripted ``tool`` (matched without regard to case)
  whose conversation has not called it yet gets ``SAID`` and that tool
  call, with the scripted input (a side call that carries the conversation
  on, such as Claude Code's prompt suggestion, gets the answer);
- anything else (the answer, or the answer after the tool) gets ``ANSWER``.

In **slow mode** an answer (not a side call, not a tool call) streams
``SLOW_WORDS`` one delta at a time, ``delay`` seconds apart, then stalls
(:attr:`StandIn.stalled` is set) until :meth:`StandIn.release` or the
server stops, and only then ends: an agent cancelled meanwhile has a partial
answer and an open request, as a person pressing Ctrl-C mid-answer leaves it.

Every answer has its own usage (the n-th: input ``10 + n``, cache write
``1000 * n``, cache read ``500 * (n - 1)``, output ``20 + n``) and
:attr:`StandIn.served` keeps them in order, so a test knows exact totals;
:attr:`StandIn.requests` keeps every request body. ``count_tokens`` answers
100.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final

TITLE: Final = "Stand-in title"
SAID: Final = "Let me run it."
ANSWER: Final = "The command printed hello."
SLOW_WORDS: Final = ("Counting ", "slowly: ", "one, ", "two, ", "three")
STALL_LIMIT: Final = 60.0
"""A stalled answer ends by itself after this long, whatever the test does."""


@dataclass(frozen=True, slots=True)
class Served:
    """One answer: its number, model, kind (``side``, ``tool``, ``answer``) and usage."""

    n: int
    model: str
    kind: str
    usage: Mapping[str, int]


def usage_of(n: int) -> dict[str, int]:
    return {
        "input_tokens": 10 + n,
        "cache_creation_input_tokens": 1000 * n,
        "cache_read_input_tokens": 500 * (n - 1),
        "output_tokens": 20 + n,
    }


def _called(messages: list[Any], name: str) -> bool:
    """Whether an assistant message of the conversation called ``name``."""
    for message in messages:
        if not isinstance(message, Mapping) or message.get("role") != "assistant":
            continue
        content = message.get("content")
        for block in content if isinstance(content, list) else ():
            if isinstance(block, Mapping) and (block.get("type"), block.get("name")) == (
                "tool_use",
                name,
            ):
                return True
    return False


def _sse(data: Mapping[str, Any]) -> bytes:
    return f"event: {data['type']}\ndata: {json.dumps(data)}\n\n".encode()


class StandIn:
    """The scripted model on a free port of 127.0.0.1, served by a thread of this process.

    ``tool`` is ``(name, input)`` of the tool call to make when the request
    offers a tool of that name; ``slow`` turns the slow mode on.
    """

    def __init__(
        self,
        *,
        tool: tuple[str, Mapping[str, Any]] | None = None,
        slow: bool = False,
        delay: float = 0.05,
    ) -> None:
        self.tool = tool
        self.slow = slow
        self.delay = delay
        self.served: list[Served] = []
        self.requests: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self.stalled = threading.Event()
        """Set once a slow answer has streamed its words and waits."""
        self._release = threading.Event()
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def release(self) -> None:
        """Let every stalled answer end."""
        self._release.set()

    def kinds(self) -> list[str]:
        return [served.kind for served in self.served]

    def __enter__(self) -> StandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    # -- the script ---------------------------------------------------------------------

    def script(self, body: Mapping[str, Any]) -> tuple[str, list[dict[str, Any]], str]:
        """``(kind, content blocks, stop reason)`` for a request (see the module docstring)."""
        offered = [t.get("name") for t in body.get("tools") or [] if isinstance(t, Mapping)]
        if not offered:
            return "side", [{"type": "text", "text": TITLE}], "end_turn"
        messages = body.get("messages") or [{}]
        name = self._offered(offered)
        if name is not None and self.tool is not None and not _called(messages, name):
            call = {
                "type": "tool_use",
                "id": f"toolu_standin_{len(messages)}",
                "name": name,
                "input": dict(self.tool[1]),
            }
            return "tool", [{"type": "text", "text": SAID}, call], "tool_use"
        text = "".join(SLOW_WORDS) if self.slow else ANSWER
        return "answer", [{"type": "text", "text": text}], "end_turn"

    def _offered(self, offered: list[Any]) -> str | None:
        if self.tool is None:
            return None
        wanted = self.tool[0].lower()
        return next((n for n in offered if isinstance(n, str) and n.lower() == wanted), None)

    def _serve(self, body: Mapping[str, Any]) -> tuple[Served, list[dict[str, Any]], str]:
        kind, blocks, stop = self.script(body)
        model = str(body.get("model") or "claude-sonnet-4-5")
        with self._lock:
            n = len(self.served) + 1
            served = Served(n, model, kind, usage_of(n))
            self.served.append(served)
            self.requests.append(dict(body))
        return served, blocks, stop

    def events(self, served: Served, blocks: list[dict[str, Any]], stop: str) -> Iterator[bytes]:
        """The SSE of one answer; a slow answer's words one by one (the stall is the caller's)."""
        usage = served.usage
        start: dict[str, Any] = {
            "id": f"msg_standin_{served.n}",
            "type": "message",
            "role": "assistant",
            "model": served.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {**usage, "output_tokens": 1},
        }
        yield _sse({"type": "message_start", "message": start})
        for i, block in enumerate(blocks):
            if block["type"] == "text":
                opened: dict[str, Any] = {"type": "text", "text": ""}
                words = SLOW_WORDS if self.slow and served.kind == "answer" else (block["text"],)
                deltas = [{"type": "text_delta", "text": word} for word in words]
            else:
                opened = {**block, "input": {}}
                deltas = [{"type": "input_json_delta", "partial_json": json.dumps(block["input"])}]
            yield _sse({"type": "content_block_start", "index": i, "content_block": opened})
            for delta in deltas:
                yield _sse({"type": "content_block_delta", "index": i, "delta": delta})
            yield _sse({"type": "content_block_stop", "index": i})
        final = {"stop_reason": stop, "stop_sequence": None}
        yield _sse({"type": "message_delta", "delta": final, "usage": usage})
        yield _sse({"type": "message_stop"})

    def _stalls(self, served: Served, chunk: bytes) -> bool:
        """Whether the slow answer waits before ``chunk`` (its text block's end)."""
        return self.slow and served.kind == "answer" and b'"content_block_stop"' in chunk

    # -- HTTP -----------------------------------------------------------------------------

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                standin.paths.append(f"GET {self.path}")
                self._send(404, b'{"type": "error"}', "application/json")

            def do_POST(self) -> None:
                standin.paths.append(f"POST {self.path}")
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                if not self.path.startswith("/v1/messages"):
                    self._send(404, b'{"type": "error"}', "application/json")
                elif self.path.startswith("/v1/messages/count_tokens"):
                    self._send(200, b'{"input_tokens": 100}', "application/json")
                elif not body.get("stream"):
                    served, blocks, stop = standin._serve(body)
                    message = {
                        "id": f"msg_standin_{served.n}",
                        "type": "message",
                        "role": "assistant",
                        "model": served.model,
                        "content": blocks,
                        "stop_reason": stop,
                        "stop_sequence": None,
                        "usage": dict(served.usage),
                    }
                    self._send(200, json.dumps(message).encode(), "application/json")
                else:
                    self._stream(*standin._serve(body))

            def _stream(self, served: Served, blocks: list[dict[str, Any]], stop: str) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("connection", "close")
                self.end_headers()
                self.close_connection = True
                try:
                    for chunk in standin.events(served, blocks, stop):
                        if standin._stalls(served, chunk):
                            standin.stalled.set()
                            standin._release.wait(STALL_LIMIT)
                        self.wfile.write(chunk)
                        self.wfile.flush()
                        if standin.slow and served.kind == "answer":
                            standin._release.wait(standin.delay)
                except OSError:
                    pass  # the agent hung up (cancelled): nothing more to say

            def _send(self, status: int, data: bytes, kind: str) -> None:
                self.send_response(status)
                self.send_header("content-type", kind)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler
