"""Copilot's sub-agents starting and ending, as the catalog tells them (pure).

A sub-agent is named by the tool call that spawned it (``toolCallId``), so
its ``subagent.*`` events need nothing but their own payload; which
conversation they are told in (the spawner's) is the translator's business.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from busd import AgentComplete, AgentStart

from .payloads import field, field_str


def agent_event(
    kind: str, tool_call_id: str, data: Mapping[str, Any]
) -> AgentStart | AgentComplete:
    """``subagent.started``, ``subagent.failed`` or ``subagent.completed`` (any other kind)."""
    match kind:
        case "subagent.started":
            name = field_str(data, "agentName") or field_str(data, "agentDisplayName") or ""
            return AgentStart(
                agent_id=tool_call_id,
                name=name,
                description=field_str(data, "agentDescription"),
                tool_call_id=tool_call_id,
            )
        case "subagent.failed":
            return AgentComplete(
                agent_id=tool_call_id, status="error", result=field_str(data, "error")
            )
        case _:
            cancelled = field(data, "cancelled") is True
            return AgentComplete(agent_id=tool_call_id, status="cancelled" if cancelled else "ok")
