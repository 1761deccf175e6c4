"""A scripted Anthropic Messages API for the real ``opencode serve``, and the server itself.

The model stand-in answers ``POST /v1/messages`` (SSE, as OpenCode always
streams) by rule, so one prompt goes through thinking, a tool call and an
answer:

- a request that offers no tools (OpenCode's title call) gets a short title;
- a request offering ``bash`` whose last message holds no ``tool_result``
  gets thinking, a sentence and a ``bash`` call (``echo hello``);
- anything else (the answer after the tool) gets thinking and the answer.

Every answer has its own usage (the n-th call: input ``10 + n``, cache
write ``1000 * n``, cache read ``500 * (n - 1)``, output ``20 + n``), and
:attr:`StandIn.served` keeps what was served, so a test knows the exact
totals. ``python opencode_standin.py`` serves it alone and prints its URL.

:class:`OpenCodeServer` runs the real ``opencode serve`` (the npm package
pinned in contrib/agents) isolated: its own ``HOME`` and XDG directories,
an ``env -i``-like environment, no network (``OPENCODE_DISABLE_*``), a
project ``opencode.json`` with the ``anthropic`` provider's ``baseURL`` at
the stand-in and ``bash`` allowed without asking (or asking, for a test of
permissions).
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Final, Self

import trio

OPENCODE: Final = Path(__file__).resolve().parents[3] / "contrib/agents/node_modules/.bin/opencode"
MODEL: Final = "claude-sonnet-4-5"
TITLE: Final = "Echo hello"
THOUGHT: Final = "The user wants the shell; bash it is."
SAID: Final = "Let me run it."
ANSWER: Final = "The command printed hello."


@dataclass(frozen=True, slots=True)
class Served:
    """One answer: its number, model, kind (``title``, ``tool``, ``answer``) and usage."""

    n: int
    model: str
    kind: str
    usage: Mapping[str, int]

    @property
    def counted(self) -> bool:
        """OpenCode counts the agent's own calls in a session, not the title call."""
        return self.kind != "title"


def usage_of(n: int) -> dict[str, int]:
    return {
        "input_tokens": 10 + n,
        "cache_creation_input_tokens": 1000 * n,
        "cache_read_input_tokens": 500 * (n - 1),
        "output_tokens": 20 + n,
    }


def answer(body: Mapping[str, Any]) -> tuple[str, list[dict[str, Any]], str]:
    """``(kind, content blocks, stop reason)`` for a request (see the module docstring)."""
    tools = [t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)]
    if not tools:
        return "title", [{"type": "text", "text": TITLE}], "end_turn"
    messages = body.get("messages") or [{}]
    last = messages[-1].get("content")
    after_tool = isinstance(last, list) and any(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in last
    )
    thinking = {"type": "thinking", "thinking": THOUGHT, "signature": "sig-standin"}
    if "bash" in tools and not after_tool:
        call = {
            "type": "tool_use",
            "id": f"toolu_standin_{len(messages)}",
            "name": "bash",
            "input": {"command": "echo hello", "description": "Print hello"},
        }
        return "tool", [thinking, {"type": "text", "text": SAID}, call], "tool_use"
    return "answer", [thinking, {"type": "text", "text": ANSWER}], "end_turn"


def _sse(data: Mapping[str, Any]) -> bytes:
    return f"event: {data['type']}\ndata: {json.dumps(data)}\n\n".encode()


def stream(n: int, model: str, blocks: list[dict[str, Any]], stop: str) -> bytes:
    """The Messages API's SSE for one answer (each block in one delta)."""
    usage = usage_of(n)
    start: dict[str, Any] = {
        "id": f"msg_standin_{n}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {**usage, "output_tokens": 1},
    }
    out = [_sse({"type": "message_start", "message": start})]
    for i, block in enumerate(blocks):
        deltas: list[dict[str, Any]]
        match block["type"]:
            case "thinking":
                opened: dict[str, Any] = {"type": "thinking", "thinking": "", "signature": ""}
                deltas = [
                    {"type": "thinking_delta", "thinking": block["thinking"]},
                    {"type": "signature_delta", "signature": block["signature"]},
                ]
            case "text":
                opened = {"type": "text", "text": ""}
                deltas = [{"type": "text_delta", "text": block["text"]}]
            case _:
                opened = {**block, "input": {}}
                deltas = [{"type": "input_json_delta", "partial_json": json.dumps(block["input"])}]
        out.append(_sse({"type": "content_block_start", "index": i, "content_block": opened}))
        out += [_sse({"type": "content_block_delta", "index": i, "delta": d}) for d in deltas]
        out.append(_sse({"type": "content_block_stop", "index": i}))
    final = {"stop_reason": stop, "stop_sequence": None}
    out.append(_sse({"type": "message_delta", "delta": final, "usage": usage}))
    out.append(_sse({"type": "message_stop"}))
    return b"".join(out)


class StandIn:
    """The model stand-in on 127.0.0.1 (a thread of this process); ``served`` in order."""

    def __init__(self) -> None:
        self.served: list[Served] = []
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                if not self.path.startswith("/v1/messages"):
                    self._send(404, b'{"type": "error"}', "application/json")
                elif self.path.startswith("/v1/messages/count_tokens"):
                    self._send(200, b'{"input_tokens": 100}', "application/json")
                else:
                    self._send(200, standin.respond(body), "text/event-stream")

            def _send(self, status: int, data: bytes, kind: str) -> None:
                self.send_response(status)
                self.send_header("content-type", kind)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def respond(self, body: Mapping[str, Any]) -> bytes:
        kind, blocks, stop = answer(body)
        model = str(body.get("model") or MODEL)
        with self._lock:
            n = len(self.served) + 1
            self.served.append(Served(n, model, kind, usage_of(n)))
            self.requests.append(dict(body))
        return stream(n, model, blocks, stop)

    def counted(self) -> dict[str, int]:
        """The sum of the usage of every call OpenCode counts in its sessions."""
        total: dict[str, int] = {}
        for served in self.served:
            if served.counted:
                for key, value in served.usage.items():
                    total[key] = total.get(key, 0) + value
        return total

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def opencode_config(model_url: str, *, bash: str = "allow") -> dict[str, Any]:
    """A project ``opencode.json``: the stand-in as ``anthropic``, ``bash`` allowed (or ``ask``)."""
    return {
        "$schema": "https://opencode.ai/config.json",
        "model": f"anthropic/{MODEL}",
        "small_model": f"anthropic/{MODEL}",
        "autoupdate": False,
        "share": "disabled",
        "provider": {
            "anthropic": {"options": {"baseURL": f"{model_url}/v1", "apiKey": "sk-standin"}}
        },
        "permission": {"bash": bash, "edit": "allow"},
    }


def opencode_env(home: Path) -> dict[str, str]:
    """An ``env -i``-like environment for ``opencode`` with everything under ``home``."""
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_DATA_HOME": str(home / ".local/share"),
        "XDG_STATE_HOME": str(home / ".local/state"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
        "OPENCODE_DISABLE_SHARE": "1",
        "ANTHROPIC_API_KEY": "sk-standin",
    }
    for name in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME"):
        Path(env[name]).mkdir(parents=True, exist_ok=True)
    return env


class OpenCodeServer:
    """The real ``opencode serve`` in ``home`` (its own everything), working in ``home/project``.

    :meth:`start` returns its URL once it listens; it can be stopped and
    started again on the same port (its sessions persist in ``home``).
    Output goes to ``home/serve-N.log``, kept for a failing test to show.
    """

    STARTUP: Final = 30.0

    def __init__(
        self,
        home: Path,
        model_url: str,
        *,
        bash: str = "allow",
        extra_env: Mapping[str, str] | None = None,
    ) -> None:
        self.home = home
        self.project = home / "project"
        self.project.mkdir(parents=True, exist_ok=True)
        config = opencode_config(model_url, bash=bash)
        (self.project / "opencode.json").write_text(json.dumps(config))
        self.env = {**opencode_env(home), **(extra_env or {})}
        self.url: str | None = None
        self.startup: list[float] = []  # seconds each start took
        self._process: trio.Process | None = None
        self._starts = 0

    async def start(self, port: int = 0) -> str:
        self._starts += 1
        log = self.home / f"serve-{self._starts}.log"
        began = trio.current_time()
        with log.open("wb") as out:
            self._process = await trio.lowlevel.open_process(
                [str(OPENCODE), "serve", "--port", str(port), "--hostname", "127.0.0.1"],
                cwd=self.project,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
            )
        with trio.fail_after(self.STARTUP):
            while (found := re.search(r"listening on (http://\S+)", log.read_text())) is None:
                if self._process.returncode is not None:
                    raise RuntimeError(f"opencode serve exited: {log.read_text()[-2000:]}")
                await trio.sleep(0.05)  # an external program: its log is the only signal
        self.startup.append(trio.current_time() - began)
        self.url = found.group(1).rstrip("/")
        return self.url

    @property
    def port(self) -> int:
        assert self.url is not None
        return int(self.url.rsplit(":", 1)[1])

    async def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        with trio.CancelScope(shield=True):
            process.terminate()
            with trio.move_on_after(5):
                await process.wait()
                return
            process.kill()
            await process.wait()


def main() -> None:
    with StandIn() as standin:
        print(standin.url, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()
        for served in standin.served:
            print(json.dumps([served.n, served.model, served.kind, served.usage]), file=sys.stderr)


if __name__ == "__main__":
    main()
