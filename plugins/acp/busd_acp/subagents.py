"""Sub-agents as claude-agent-acp reports them to a plain ACP client.

ACP itself has no sub-agents. claude-agent-acp (0.101.0) runs Claude Code's
``Agent`` (formerly ``Task``) tool like any other tool call, and stamps the
tool calls of the sub-agent it started with
``_meta.claudeCode.parentToolUseId`` (the ``Agent`` call's id). A client
that declares neither ``subagents`` nor AIR's sub-agent sessions gets no
other sign of it: the sub-agent's text and thinking are left out, and no
update says when it ends. What it does say:

- a foreground sub-agent ends with its ``Agent`` call, whose result is the
  sub-agent's answer;
- a background one's call ends at once, with a result that only says it was
  launched (``_meta.claudeCode.toolResponse``: ``isAsync``,
  ``status: "async_launched"``); the agent holds the prompt's response
  until the background sub-agents its turn started settle (unless the client
  declared ``backgroundSubagents``), so the end of the turn ends them. That
  ``toolResponse`` comes from a PostToolUse hook, which can fire after the
  call's ``completed`` update; the result's text, Claude Code's launch
  notice, says it too, in the update that completes the call.

Pure readers, for :mod:`busd_acp.translator`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from busd import AgentStart

from .usage import as_map as _map

__all__ = [
    "TASK_TOOLS",
    "agent_start",
    "launch_notice",
    "launched_in_background",
    "parent_of",
]

TASK_TOOLS: Final = frozenset({"Agent", "Task"})
"""Claude Code's tools that start a sub-agent (``Agent`` is the newer name of ``Task``)."""


def _claude_code(update: Mapping[str, Any]) -> Mapping[str, Any] | None:
    meta = _map(update.get("_meta"))
    return None if meta is None else _map(meta.get("claudeCode"))


def parent_of(update: Mapping[str, Any]) -> str | None:
    """The ``Agent`` call whose sub-agent made this tool call, if one did."""
    vendor = _claude_code(update)
    parent = None if vendor is None else vendor.get("parentToolUseId")
    return parent if isinstance(parent, str) and parent else None


def launched_in_background(update: Mapping[str, Any]) -> bool:
    """Whether an ``Agent`` call's result says only that its sub-agent went on in the background."""
    vendor = _claude_code(update)
    response = None if vendor is None else _map(vendor.get("toolResponse"))
    if response is None:
        return False
    return response.get("isAsync") is True or response.get("status") == "async_launched"


_LAUNCH_NOTICE: Final = "Async agent launched"
"""How Claude Code's result for a background ``Agent`` call begins."""


def launch_notice(output: str | None) -> bool:
    """Whether an ``Agent`` call's result is Claude Code's notice that it went to the background.

    For when the ``completed`` update beats the hook's ``toolResponse`` (a
    race in claude-agent-acp): without it, the sub-agent would end with the
    launch, before its own tools ran.
    """
    return output is not None and output.startswith(_LAUNCH_NOTICE)


def agent_start(call_id: str, tool_input: Mapping[str, Any], parent: str | None) -> AgentStart:
    """The sub-agent an ``Agent`` call starts: named by its ``subagent_type``."""
    kind = tool_input.get("subagent_type")
    description = tool_input.get("description")
    return AgentStart(
        agent_id=call_id,
        name=kind if isinstance(kind, str) and kind else "task",
        description=description if isinstance(description, str) and description else None,
        parent_agent_id=parent,
        tool_call_id=call_id,
    )
