"""Reading ACP's JSON-RPC: which side calls which method, fields under both spellings.

Messages come as they crossed the wire (camelCase) or as the
``agent-client-protocol`` SDK dumps them (snake_case), so every field is
read under both spellings (:func:`get`). Also here: what a tool produced and
a plan, as people read them. Pure functions, for :mod:`busd_acp.translator`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal, TypeGuard

import msgspec

from .usage import as_map as _map

__all__ = [
    "AGENT_METHODS",
    "CLIENT_METHODS",
    "CLIENT_PREFIXES",
    "EMPTY",
    "FATAL_ERRORS",
    "OPTION_KINDS",
    "REMEMBERED",
    "SESSION_OPENERS",
    "JsonRpcId",
    "OptionKind",
    "agent_tool_name",
    "count",
    "get",
    "input_of",
    "is_id",
    "plan_summary",
    "plan_text",
    "string",
    "tool_output",
]

EMPTY: Final[Mapping[str, Any]] = {}

AGENT_METHODS: Final = frozenset(
    {
        "session/update",
        "session/request_permission",
        "fs/read_text_file",
        "fs/write_text_file",
        "terminal/create",
        "terminal/output",
        "terminal/release",
        "terminal/wait_for_exit",
        "terminal/kill",
        "mcp/connect",
        "mcp/disconnect",
        "elicitation/create",
        "elicitation/complete",
    }
)
"""Methods the agent calls (the client implements them); everything else is the client's."""

CLIENT_METHODS: Final = frozenset(
    {
        "initialize",
        "authenticate",
        "logout",
        "session/new",
        "session/load",
        "session/resume",
        "session/fork",
        "session/list",
        "session/delete",
        "session/close",
        "session/prompt",
        "session/cancel",
        "session/set_mode",
        "session/set_model",
        "session/set_config_option",
        "mcp/message",
        "$/cancel_request",
    }
)
CLIENT_PREFIXES: Final = ("providers/", "nes/", "document/", "_", "$/")
"""Known method families that say nothing a frontend shows (``_``: ACP's extension prefix)."""

SESSION_OPENERS: Final = frozenset(
    {"session/new", "session/load", "session/resume", "session/fork"}
)
FATAL_ERRORS: Final = SESSION_OPENERS | {"initialize", "authenticate", "session/prompt"}
"""Requests whose error is a ``stream.session.error`` (others, like a missing file, are routine)."""

PLAN_MARKS: Final = {"completed": "[x]", "in_progress": "[>]"}
REMEMBERED: Final = 256
"""Finished tool calls (per session) and answered request ids remembered, to spot repeats."""

OptionKind = Literal["allow_once", "allow_always", "reject_once", "reject_always", "other"]
OPTION_KINDS: Final[dict[str, OptionKind]] = {
    "allow_once": "allow_once",
    "allow_always": "allow_always",
    "reject_once": "reject_once",
    "reject_always": "reject_always",
}
JsonRpcId = int | str


# -- reading messages whose fields come camelCase (wire) or snake_case (SDK dumps) ----------


def get(m: Mapping[str, Any], camel: str, snake: str) -> Any:
    value = m.get(camel)
    return m.get(snake) if value is None else value


def is_id(value: object) -> TypeGuard[JsonRpcId]:
    return isinstance(value, int | str) and not isinstance(value, bool)


def string(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def agent_tool_name(call: Mapping[str, Any]) -> str | None:
    """The agent's own name for a tool (``Write``), beside ACP's title (``Write hello.txt``).

    ACP has no such field: claude-agent-acp sends ``name`` and
    ``_meta.claudeCode.toolName``.
    """
    meta = _map(call.get("_meta"))
    vendor = None if meta is None else _map(meta.get("claudeCode"))
    return string(call.get("name")) or (None if vendor is None else string(vendor.get("toolName")))


def count(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def input_of(raw: object) -> dict[str, Any]:
    """A tool's ``rawInput`` as a JSON object: mappings as they are, anything else wrapped."""
    if raw is None:
        return {}
    m = _map(raw)
    if m is not None:
        return dict(m)
    return {"input": raw}


def json_text(value: object) -> str:
    try:
        return msgspec.json.encode(value).decode()
    except (TypeError, msgspec.EncodeError):
        return str(value)


def tool_output(content: object, raw_output: object) -> str | None:
    """What a tool produced, for people: its text content, else ``rawOutput``, else its diffs."""
    texts: list[str] = []
    edits: list[str] = []
    if isinstance(content, list):
        for item in content:
            m = _map(item)
            if m is None:
                continue
            kind = m.get("type")
            if kind == "content":
                block = _map(m.get("content"))
                if block is not None and block.get("type") == "text":
                    text = block.get("text")
                    if isinstance(text, str):
                        texts.append(text)
            elif kind == "diff":
                path = string(m.get("path"))
                if path is not None:
                    old = get(m, "oldText", "old_text")
                    edits.append(f"{'Created' if old is None else 'Edited'} {path}")
    if texts:
        return "\n".join(texts)
    if raw_output is not None:
        if isinstance(raw_output, str):
            return raw_output
        m = _map(raw_output)
        if m is not None and isinstance(m.get("output"), str):
            return str(m["output"])
        return json_text(raw_output if m is None else dict(m))
    if edits:
        return "\n".join(edits)
    return None


def plan_summary(entries: object) -> str:
    """A plan as a checklist: ``Plan (1/2 done)`` then ``[x]``, ``[>]`` or ``[ ]`` per entry."""
    lines: list[str] = []
    done = 0
    if isinstance(entries, list):
        for entry in entries:
            m = _map(entry)
            if m is None:
                continue
            status = m.get("status")
            done += status == "completed"
            mark = PLAN_MARKS.get(status, "[ ]") if isinstance(status, str) else "[ ]"
            content = m.get("content")
            lines.append(f"{mark} {content if isinstance(content, str) else ''}")
    return "\n".join([f"Plan ({done}/{len(lines)} done)", *lines])


def plan_text(plan: Mapping[str, Any]) -> str | None:
    """A ``plan_update``'s plan for people (``None``: a type this reader does not know)."""
    kind = plan.get("type")
    if kind == "items":
        return plan_summary(plan.get("entries"))
    if kind == "markdown" and isinstance(plan.get("content"), str):
        return str(plan["content"])
    if kind == "file" and isinstance(plan.get("uri"), str):
        return f"Plan: {plan['uri']}"
    return None
