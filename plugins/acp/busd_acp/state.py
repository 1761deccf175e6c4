"""What the ACP translator keeps per session, per part, per tool call and per request."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from busd import PermissionResolved, SessionContext

from .reading import REMEMBERED, JsonRpcId, get, is_id, string
from .usage import ModelBreakdown
from .usage import as_map as _map

__all__ = ["Part", "Pending", "Requests", "SessionState", "Tool"]


class Part:
    """The text or thinking part being streamed (at most one per session)."""

    __slots__ = ("chunks", "key", "kind", "part_id", "started")

    def __init__(self, kind: str, key: str | None, part_id: str, started: float) -> None:
        self.kind = kind
        self.key = key
        self.part_id = part_id
        self.chunks: list[str] = []
        self.started = started


class Tool:
    __slots__ = (
        "background",
        "call_id",
        "input",
        "kind",
        "last_partial",
        "parent",
        "raw_name",
        "running_since",
        "started",
        "title",
    )

    def __init__(self, call_id: str) -> None:
        self.call_id = call_id
        self.raw_name: str | None = None
        self.title: str | None = None
        self.kind: str | None = None
        self.input: dict[str, Any] = {}
        self.started = False
        self.running_since: float | None = None
        self.last_partial: str | None = None
        self.parent: str | None = None  # the Agent call whose sub-agent made this call
        self.background = False  # an Agent call whose sub-agent went on in the background

    @property
    def name(self) -> str:
        """The agent's own name for the tool, else its title, else its kind."""
        return self.raw_name or self.title or self.kind or "tool"


class SessionState:
    __slots__ = (
        "agents",
        "context",
        "cost",
        "cwd",
        "done_tools",
        "id",
        "idle",
        "loaded",
        "model",
        "models",
        "part",
        "parts_seen",
        "started",
        "tools",
        "turn_id",
        "unnamed_parts",
    )

    def __init__(self, session_id: str | None) -> None:
        self.id = session_id
        self.started = False
        self.idle = False
        self.loaded = False  # continued with session/load or session/resume in this stream
        self.model: str | None = None
        self.models = ModelBreakdown()  # per model, from the prompt responses' model_usage
        self.cwd: str | None = None
        self.cost: float | None = None
        self.context: SessionContext | None = None  # the agent's last usage_update
        self.turn_id: str | None = None
        self.part: Part | None = None
        self.parts_seen: dict[tuple[str, str], int] = {}
        self.unnamed_parts = 0
        self.tools: dict[str, Tool] = {}
        self.done_tools: dict[str, None] = {}
        self.agents: dict[str, str | None] = {}  # background sub-agents running -> parent call


class Pending:
    """A request still waiting for its response."""

    __slots__ = (
        "cwd",
        "method",
        "options",
        "order",
        "request_id",
        "resolved",
        "session",
        "turn_id",
    )

    def __init__(self, method: str, session: str | None, order: int) -> None:
        self.method = method
        self.session = session
        self.order = order
        self.turn_id: str | None = None
        self.request_id: str | None = None
        self.options: dict[str, str] = {}
        self.resolved = False
        self.cwd: str | None = None

    def resolution(
        self, result: Mapping[str, Any] | None, error: Mapping[str, Any] | None
    ) -> PermissionResolved | None:
        """How the client answered this permission request (``None``: an unknown outcome)."""
        request_id = self.request_id or ""
        outcome = None if result is None else _map(result.get("outcome"))
        chosen = None if outcome is None else outcome.get("outcome")
        if chosen == "selected" and outcome is not None:
            oid = string(get(outcome, "optionId", "option_id"))
            denied = self.options.get(oid or "", "").startswith("reject")
            return PermissionResolved(
                request_id=request_id, outcome="denied" if denied else "allowed", option_id=oid
            )
        if chosen == "cancelled" or error is not None:
            reason = None if error is None else string(error.get("message"))
            return PermissionResolved(request_id=request_id, outcome="cancelled", reason=reason)
        return None


class Requests:
    """The requests of one connection still waiting for a response, one map per side.

    Each side numbers its own requests, so a response's id may name a
    request of either side: :meth:`match` decides.
    """

    __slots__ = ("answered", "from_agent", "from_client", "order")

    def __init__(self) -> None:
        self.from_client: dict[JsonRpcId, Pending] = {}
        self.from_agent: dict[JsonRpcId, Pending] = {}
        self.answered: dict[JsonRpcId, None] = {}
        self.order = 0

    def match(self, rid: object, result: Mapping[str, Any] | None) -> tuple[Pending | None, bool]:
        """The pending request ``rid`` answers, and whether the agent sent it."""
        if not is_id(rid):
            return None, False
        ours = self.from_client.get(rid)
        theirs = self.from_agent.get(rid)
        if ours is not None and theirs is not None:
            if result is not None and get(result, "stopReason", "stop_reason") is not None:
                theirs = None
            elif result is not None and result.get("outcome") is not None:
                ours = None
            elif ours.order > theirs.order:
                theirs = None
            else:
                ours = None
        if theirs is not None:
            del self.from_agent[rid]
            found, from_agent = theirs, True
        elif ours is not None:
            del self.from_client[rid]
            found, from_agent = ours, False
        else:
            return None, False
        answered = self.answered
        answered[rid] = None
        if len(answered) > REMEMBERED:
            del answered[next(iter(answered))]
        return found, from_agent
