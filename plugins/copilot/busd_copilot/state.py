"""What the translator holds between events: the event being read and what is open.

One raw event (:class:`RawEvent`), an open text or thinking part
(:class:`Part`), a conversation with its open model call (:class:`Lane`),
a call's usage report held for its message (:class:`Report`) and a running
tool (:class:`Tool`): plain slotted records that
:class:`~busd_copilot.translator.CopilotTranslator` owns and changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from busd import Usage

from .payloads import Stamp, as_text, timestamp_of


class RawEvent:
    """One raw event, read once: kind, payload, envelope fields and the feed time."""

    __slots__ = ("data", "id", "kind", "now", "top")

    def __init__(
        self, kind: str, data: Mapping[str, Any], top: Mapping[str, Any], now: float
    ) -> None:
        self.kind = kind
        self.data = data
        self.top = top
        self.now = now
        self.id = as_text(top.get("id"))

    def stamp(self) -> Stamp:
        return (timestamp_of(self.top.get("timestamp")), self.now)


class Part:
    """An open text or thinking part: its deltas so far and when it began."""

    __slots__ = ("chunks", "id", "start", "thinking")

    def __init__(self, part_id: str, *, thinking: bool, start: Stamp | None) -> None:
        self.id = part_id
        self.thinking = thinking
        self.start = start
        self.chunks: list[str] = []


class Report:
    """A model call's ``assistant.usage``, held until the call's ``assistant.message``.

    The CLI (1.0.102) reports a call's usage before it sends the call's
    message (its text, reasoning and tool requests), so the call ends, with
    its usage told last, once that message has arrived.
    """

    __slots__ = ("api_call_id", "finish", "usage")

    def __init__(self, api_call_id: str | None, finish: str | None, usage: Usage | None) -> None:
        self.api_call_id = api_call_id
        self.finish = finish
        self.usage = usage  # None: the report changed no total

    def waits_for(self, api_call_id: str | None) -> bool:
        """Whether a message naming ``api_call_id`` is this call's (ids match, or one is unsaid)."""
        return api_call_id is None or self.api_call_id in (None, api_call_id)


class Lane:
    """One conversation in the stream (the main agent or a sub-agent) and its open call."""

    __slots__ = (
        "agent_id",
        "call",
        "call_message",
        "call_thinking",
        "call_tools",
        "calls_in_turn",
        "key",
        "parent_tool_call_id",
        "parts",
        "report",
        "retries",
        "told_reasoning",
        "turn",
    )

    def __init__(self, agent_id: str | None, parent_tool_call_id: str | None) -> None:
        self.agent_id = agent_id
        self.parent_tool_call_id = parent_tool_call_id
        self.key = f"{agent_id or ''}\x1f{parent_tool_call_id or ''}"
        self.turn: str | None = None  # Copilot's turnId, between turn_start and turn_end
        self.calls_in_turn = 0
        self.call: str | None = None  # the open model call's turn id
        self.call_tools = False  # the open call requested tools
        self.call_thinking = False  # the open call streamed reasoning
        self.call_message = False  # the open call's assistant.message arrived
        self.report: Report | None = None  # the open call's usage, come before its message
        self.told_reasoning: str | None = None  # told by a message, not yet by its own event
        self.retries = 0
        self.parts: dict[str, Part] = {}


class Tool:
    """A tool call that started and has not completed."""

    __slots__ = ("input", "lane", "name", "output", "source", "started")

    def __init__(self, name: str, tool_input: dict[str, Any], lane: Lane) -> None:
        self.name = name
        self.input = tool_input
        self.lane = lane
        self.started: Stamp | None = None
        self.output = ""
        self.source: Literal["", "partial", "shell"] = ""
