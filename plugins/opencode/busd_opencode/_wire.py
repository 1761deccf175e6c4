"""What OpenCode's ``/event`` payloads (and ``opencode run --format json`` lines) say.

The vocabularies (finish reasons, permission replies, kinds worth no event)
and small readers that return ``None`` or an empty value instead of raising,
whatever a field holds. Ids are read under both spellings: the wire's
(``sessionID``) and the ``opencode-ai`` SDK models' Python names
(``session_id``), which is what ``model_dump()`` of an SDK event gives.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final, Literal

from busd import PermissionOption

EMPTY: Final[Mapping[str, Any]] = MappingProxyType({})

FINISH: Final = {
    "stop": "end_turn",
    "end_turn": "end_turn",
    "tool-calls": "tool_use",
    "tool_calls": "tool_use",
    "tool_use": "tool_use",
    "length": "max_tokens",
    "max_tokens": "max_tokens",
    "content-filter": "refusal",
    "content_filter": "refusal",
    "refusal": "refusal",
    "stop_sequence": "stop_sequence",
    "error": "error",
    "aborted": "cancelled",
    "cancelled": "cancelled",
}
"""OpenCode's (AI SDK's) finish reasons onto the catalog's; others are kept as they are."""

MESSAGE_ERRORS: Final = {
    "MessageAbortedError": "cancelled",
    "MessageOutputLengthError": "max_tokens",
}
"""``info.error.name`` on an assistant message onto a finish reason (otherwise ``error``)."""

OPTIONS: Final = [
    PermissionOption(id="once", label="Allow once", kind="allow_once"),
    PermissionOption(id="always", label="Always allow", kind="allow_always"),
    PermissionOption(id="reject", label="Reject", kind="reject_once"),
]
"""The answers OpenCode accepts for every permission request."""

KINDS: Final = {
    "bash": "execute",
    "shell": "execute",
    "webfetch": "fetch",
    "edit": "edit",
    "apply_patch": "edit",
    "patch": "edit",
    "write": "edit",
    "grep": "search",
    "glob": "search",
    "context": "search",
    "context7_resolve_library_id": "search",
    "context7_get_library_docs": "search",
    "read": "read",
    "task": "think",
}
"""A permission's kind (a request's ``category``), as ``opencode acp`` 1.18 names it: a
rule on ``execute`` matches OpenCode's shell whether busd drives ``opencode serve`` or
``opencode acp``. Anything else is ``other``."""

REPLIES: Final[dict[str, Literal["allowed", "denied"]]] = {
    "once": "allowed",
    "always": "allowed",
    "reject": "denied",
}

QUIET_KINDS: Final = frozenset(
    {
        "server.connected",
        "server.heartbeat",
        "server.instance.disposed",
        "installation.updated",
        "installation.update-available",
        "lsp.client.diagnostics",
        "lsp.updated",
        "message.removed",
        "message.part.removed",
        "session.deleted",
        "session.diff",
        "file.edited",
        "file.watcher.updated",
        "storage.write",
        "ide.installed",
        "todo.updated",
        "command.executed",
        "project.updated",
        "vcs.branch.updated",
        "mcp.tools.changed",
        "pty.created",
        "pty.updated",
        "pty.exited",
        "pty.deleted",
        "tui.prompt.append",
        "tui.command.execute",
        "tui.toast.show",
        # 1.18: the server's registries changing (plugin.added, ~45 per instance start)
        "plugin.added",
        "catalog.updated",
        "reference.updated",
        "integration.updated",
    }
)
"""Kinds OpenCode sends that say nothing the catalog carries: skipped without a warning."""

RUN_KINDS: Final = frozenset(
    {"step_start", "step_finish", "text", "reasoning", "tool_use", "error"}
)
"""``opencode run --format json`` lines: ``{"type", "timestamp", "sessionID", "part"}``.

The CLI prints a part only once it is finished (text and reasoning when
``time.end`` is set, tools when completed or failed), and ``error`` carries
the session error.
"""

QUIET_PARTS: Final = frozenset(
    {"file", "snapshot", "patch", "agent", "subtask", "compaction", "retry"}
)
"""Part types with nothing for the catalog (attachments, snapshots, markers)."""


RECENT_IDS: Final = 4096
"""How many finished ids (events, parts, turns, user messages) are remembered."""


class Recent:
    """An insertion-ordered set of ids that forgets the oldest beyond ``cap``."""

    __slots__ = ("_cap", "_ids")

    def __init__(self, cap: int = RECENT_IDS) -> None:
        self._cap = cap
        self._ids: dict[str, None] = {}

    def __contains__(self, key: str) -> bool:
        return key in self._ids

    def add(self, key: str) -> None:
        self._ids[key] = None
        if len(self._ids) > self._cap:
            del self._ids[next(iter(self._ids))]


# -- reading untrusted payloads ---------------------------------------------------


def mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else EMPTY


def ident(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def ended(info: Mapping[str, Any]) -> bool:
    """An assistant message OpenCode has ended: it has a ``finish`` or a completion time."""
    time = info.get("time")
    completed = time.get("completed") if isinstance(time, Mapping) else None
    return ident(info.get("finish")) is not None or completed is not None


def field(obj: Mapping[str, Any], wire: str, python: str) -> Any:
    """``obj[wire]``, else the SDK model's Python name for it (``sessionID`` → ``session_id``)."""
    value = obj.get(wire)
    return obj.get(python) if value is None else value


def session_of(*objs: Mapping[str, Any]) -> str | None:
    for obj in objs:
        sid = ident(field(obj, "sessionID", "session_id"))
        if sid is not None:
            return sid
    return None


def number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def span(time: Mapping[str, Any]) -> float | None:
    """Seconds between OpenCode's ``time.start`` and ``time.end`` (epoch milliseconds)."""
    start, end = number(time.get("start")), number(time.get("end"))
    if start is None or end is None or end < start:
        return None
    return (end - start) / 1000.0


def strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list | tuple):
        return [v for v in value if isinstance(v, str)]
    return []


def signature(part: Mapping[str, Any]) -> str | None:
    """A reasoning part's signature, kept under its provider's name in ``metadata``."""
    metadata = mapping(part.get("metadata"))
    sig = ident(metadata.get("signature"))
    if sig is not None:
        return sig
    for value in metadata.values():
        sig = ident(mapping(value).get("signature"))
        if sig is not None:
            return sig
    return None


def kind_of(permission: str) -> str:
    """The ACP kind of an OpenCode permission (``bash`` → ``execute``; see :data:`KINDS`)."""
    return KINDS.get(permission.lower(), "other")


def finish_reason(reason: str) -> str:
    return FINISH.get(reason, reason)


def from_run(event: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """An ``opencode run --format json`` line as the ``/event`` payloads that say the same.

    A part becomes its ``message.part.updated``; ``step_finish`` also ends its
    message (one assistant message per model call, as the ``/event`` stream
    shows), and ``error`` is the ``session.error``.
    """
    sid = event.get("sessionID")
    if event.get("type") == "error":
        return [
            {"type": "session.error", "properties": {"sessionID": sid, "error": event.get("error")}}
        ]
    part = mapping(event.get("part"))
    out: list[Mapping[str, Any]] = [
        {"type": "message.part.updated", "properties": {"sessionID": sid, "part": part}}
    ]
    mid = field(part, "messageID", "message_id")
    if event.get("type") == "step_finish" and mid is not None:
        info = {"id": mid, "role": "assistant", "sessionID": sid, "finish": part.get("reason")}
        info.update((k, part[k]) for k in ("tokens", "cost") if k in part)  # the call's own
        out.append({"type": "message.updated", "properties": {"info": info}})
    return out
