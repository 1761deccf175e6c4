"""Hand-made ACP JSON-RPC for the adapter's tests, and the shared fixture.

``acp.jsonl`` is copied from the project's shared/fixtures/sdk (see
tests/fixtures/sdk/README.md); the builders make the small exchanges the
tests compose. Loaded by path (``tests.daemon_helpers.load_module``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

from busd_acp import AcpTranslator

from busd import Emitted, Event

FIXTURE = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "sdk" / "acp.jsonl"
SESSION = "sess_abc123def456"
WRITE_CALL = "call_c95bdab20b584813b28ef777"
RM_CALL = "call_1d2e3f"

E = TypeVar("E", bound=Event)


def fixture() -> list[dict[str, Any]]:
    with FIXTURE.open() as lines:
        return [json.loads(line) for line in lines]


def run(messages: list[Any], translator: AcpTranslator | None = None) -> list[Emitted]:
    """Feed ``messages`` with a fake clock (line index * 0.1 s) and finish."""
    t = translator if translator is not None else AcpTranslator()
    out = [e for i, raw in enumerate(messages) for e in t.feed(raw, i * 0.1)]
    return out + t.finish(len(messages) * 0.1)


def of(out: list[Emitted], cls: type[E]) -> list[E]:
    return [e.event for e in out if isinstance(e.event, cls)]


def index(out: list[Emitted], predicate: Any) -> int:
    return next(i for i, e in enumerate(out) if predicate(e.event))


# -- small JSON-RPC builders for hand-made exchanges ---------------------------


def prompt(rid: int | str, session: str = "s1") -> dict[str, Any]:
    params = {"sessionId": session, "prompt": [{"type": "text", "text": "hi"}]}
    return {"jsonrpc": "2.0", "id": rid, "method": "session/prompt", "params": params}


def update(session_update: str, session: str = "s1", /, **fields: Any) -> dict[str, Any]:
    params = {"sessionId": session, "update": {"sessionUpdate": session_update, **fields}}
    return {"jsonrpc": "2.0", "method": "session/update", "params": params}


def chunk(text: str, message_id: str | None = None, kind: str = "agent_message_chunk") -> Any:
    fields: dict[str, Any] = {"content": {"type": "text", "text": text}}
    if message_id is not None:
        fields["messageId"] = message_id
    return update(kind, **fields)


def permission(rid: int | str, call_id: str, **tool_call: Any) -> dict[str, Any]:
    options = [
        {"optionId": "yes", "name": "Allow once", "kind": "allow_once"},
        {"optionId": "no", "name": "Reject", "kind": "reject_once"},
    ]
    params = {
        "sessionId": "s1",
        "toolCall": {"toolCallId": call_id, **tool_call},
        "options": options,
    }
    return {"jsonrpc": "2.0", "id": rid, "method": "session/request_permission", "params": params}


def answer(rid: int | str, **result: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "result": result}


def selected(rid: int | str, option: str) -> dict[str, Any]:
    return answer(rid, outcome={"outcome": "selected", "optionId": option})
