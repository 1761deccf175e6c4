"""GitHub Copilot SDK session events → busd catalog events.

Input is what the Copilot SDK hands a ``session.on(...)`` handler: the wire
JSON ``{"type", "data", "id", "timestamp", "parentId", "agentId"?,
"ephemeral"?}``, or the Python SDK's ``SessionEvent``. SDK objects are read
through their own ``to_dict()`` (the exact wire form): ``dataclasses.asdict``
would drop the ``kind`` discriminators the SDK keeps as class variables, and
with them whether a permission was approved. Other objects go through
:func:`busd.as_mapping`, and every field is also looked up in
snake_case for them.

Copilot's shapes, and what they become:

- ``assistant.turn_start`` / ``turn_end`` bracket one agent *turn*, which may
  hold several model calls; ``assistant.usage`` ends one call. busd's
  ``stream.turn.*`` is one model call, so a call opens at ``turn_start`` or
  at the first output after the previous call ended, and ends at its
  ``assistant.usage`` (or at ``turn_end``, abort, error, idle). The first
  call of Copilot turn ``"0"`` is turn ``"0"``, later ones ``"0.1"``, ``"0.2"``.
- ``assistant.usage`` is one call's own counts, so the ledger adds them
  (``cumulative=False``) under the call's ``apiCallId``; its ``cost`` is a
  premium-request multiplier, not money, so cost stays unknown.
- ``session.usage_info`` is the context window's state, reported as
  ``stream.session.context``, never as usage.
- Thinking duration is measured between the events' own ``timestamp``\\ s
  (the first reasoning delta to ``assistant.reasoning``), else between the
  ``now`` values they were fed at.
- A tool starts when the assistant message that requests it arrives (its
  input is known then, before any permission prompt); ``tool.execution_start``
  only starts the clock for its duration.
- Events carrying a top-level ``agentId`` (or the older ``parentToolCallId``
  in ``data``) come from a sub-agent, which is named by the tool call that
  spawned it (``subagent.started``'s ``toolCallId``).
- Events seen before (same ``id``) are dropped, and so is a second usage
  report for the same ``apiCallId``.
- When the session goes idle, or the stream ends (:meth:`~CopilotTranslator.finish`),
  whatever is still open ends: parts complete (``stopped`` when cut short), an
  open call ends, unanswered permissions resolve ``cancelled`` and running
  tools complete ``cancelled``. The end of the stream adds
  ``stream.session.idle`` unless the session went idle already or its last
  word was an error.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from enum import Enum
from typing import Any, Final, Literal
from uuid import UUID

from busd import (
    AgentComplete,
    AgentStart,
    Emitted,
    Event,
    PermissionOption,
    PermissionRequested,
    PermissionResolved,
    SessionCompaction,
    SessionContext,
    SessionError,
    SessionIdle,
    SessionInfo,
    SessionRetry,
    SessionStart,
    SessionTitleChanged,
    SessionTruncation,
    SessionWarning,
    TextComplete,
    TextDelta,
    ThinkingComplete,
    ThinkingDelta,
    ToolComplete,
    ToolPartialResult,
    ToolStart,
    Translator,
    TurnEnd,
    TurnStart,
    Usage,
    UsageLedger,
    as_mapping,
    normalize_usage,
)

__all__ = ["CopilotAdapter", "CopilotTranslator"]

_REMEMBER: Final = 4096
"""Ids remembered for dropping duplicates (events, finished parts and tools, calls)."""

_MAX_LANES: Final = 1024
"""Sub-agent conversations tracked at once; the oldest is forgotten first."""

# -- reading untrusted payloads ----------------------------------------------

_UPPER = re.compile(r"(?<!^)(?=[A-Z])")


@functools.cache
def _snake(key: str) -> str:
    return _UPPER.sub("_", key).lower()


def _get(d: Mapping[str, Any], key: str) -> Any:
    """``d[key]`` by its wire (camelCase) name, else by its Python (snake_case) one."""
    value = d.get(key)
    if value is None:
        value = d.get(_snake(key))
    return value


def _text(value: object) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, Enum):
        return _text(value.value)
    if isinstance(value, UUID):
        return str(value)
    return None


def _str(d: Mapping[str, Any] | None, key: str) -> str | None:
    return None if d is None else _text(_get(d, key))


def _int(d: Mapping[str, Any] | None, key: str) -> int | None:
    value = None if d is None else _get(d, key)
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _sub(d: Mapping[str, Any] | None, key: str) -> Mapping[str, Any] | None:
    value = None if d is None else _get(d, key)
    return value if isinstance(value, Mapping) else None


def _mapping(raw: object) -> Mapping[str, Any]:
    """A raw event as a mapping; the Copilot SDK's objects by their own ``to_dict()``."""
    if isinstance(raw, Mapping):
        return raw
    to_dict = getattr(raw, "to_dict", None)
    if callable(to_dict):
        result = to_dict()
        if isinstance(result, Mapping):
            return result
    return as_mapping(raw)


def _when(value: object) -> datetime | None:
    """An event's ``timestamp`` (ISO 8601 on the wire, ``datetime`` in the SDK), tz-aware."""
    if isinstance(value, str):
        try:
            when = datetime.fromisoformat(value)
        except ValueError:
            return None
    elif isinstance(value, datetime):
        when = value
    else:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


_Stamp = tuple[datetime | None, float]
"""When something happened: the SDK's timestamp (if any) and the ``now`` it was fed at."""


def _elapsed(start: _Stamp, end: _Stamp) -> float:
    """Seconds between two stamps: by the SDK's timestamps when both have one."""
    if start[0] is not None and end[0] is not None:
        seconds = (end[0] - start[0]).total_seconds()
    else:
        seconds = end[1] - start[1]
    return seconds if seconds > 0 else 0.0


def _tool_input(value: object) -> dict[str, Any]:
    """Tool arguments as a JSON object: ``{}`` when none, a free-form input under ``input``."""
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, str):
        if not value.strip():
            return {}
        try:
            parsed = json.loads(value)
        except ValueError:
            return {"input": value}
        return dict(parsed) if isinstance(parsed, dict) else {"input": parsed}
    return {"input": value}


def _remember(seen: dict[str, None], key: str) -> None:
    seen[key] = None
    if len(seen) > _REMEMBER:
        del seen[next(iter(seen))]


# -- the vocabulary ------------------------------------------------------------

_FINISH: Final[Mapping[str, str]] = {
    "stop": "end_turn",
    "end_turn": "end_turn",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "tool_use": "tool_use",
    "length": "max_tokens",
    "max_tokens": "max_tokens",
    "stop_sequence": "stop_sequence",
    "content_filter": "refusal",
    "refusal": "refusal",
    "cancelled": "cancelled",
    "canceled": "cancelled",
    "aborted": "cancelled",
    "error": "error",
}
"""Copilot's ``finishReason`` (OpenAI's words, mostly) onto the catalog's."""

_ALLOW_ONCE: Final = "approve-once"
_ALLOW_SESSION: Final = "approve-for-session"
_REJECT: Final = "reject"
"""Option ids: the SDK's own permission decision kinds, so a reply maps straight back."""

_RESULT_OPTION: Final[Mapping[str, str]] = {
    "approved": _ALLOW_ONCE,
    "approve-once": _ALLOW_ONCE,
    "approved-for-session": _ALLOW_SESSION,
    "approve-for-session": _ALLOW_SESSION,
    "denied-interactively-by-user": _REJECT,
    "reject": _REJECT,
}

_CANCEL_CODES: Final = frozenset({"cancelled", "canceled", "aborted", "abort"})
_RETRYABLE_STATUS: Final = frozenset({408, 429, 500, 502, 503, 504, 529})

_IGNORED: Final = frozenset(
    {
        # Known, and nothing in them for the catalog (telemetry, UI state, echoes).
        "pending_messages.modified",
        "assistant.intent",
        "assistant.idle",
        "assistant.streaming_delta",
        "assistant.tool_call_delta",
        "assistant.server_tool_progress",
        "model.call_start",
        "model.call_finished",
        "model.call_final_result",
        "model.call_failure",
        "prompt_cache_break",
        "session.compaction_start",
        "session.context_changed",
        "session.mode_changed",
        "session.plan_changed",
        "session.todos_changed",
        "session.workspace_file_changed",
        "session.usage_checkpoint",
        "session.shutdown",
        "session.skills_loaded",
        "session.custom_agents_updated",
        "session.mcp_servers_loaded",
        "session.mcp_server_status_changed",
        "session.mcp_server_tools_loaded",
        "session.tools_updated",
        "session.extensions_loaded",
        "session.remote_steerable_changed",
        "session.background_tasks_changed",
        "session.task_complete",
        # The CLI's own model-loop tracing and policy decisions (seen with CLI 1.0.102):
        # the calls, messages and tool runs they trace arrive as the events above.
        "session.managed_settings_resolved",
        "sandbox.decision",
        "session.indexed_search",
        "model.turn_started",
        "model.log",
        "model.model_call_started",
        "model.model_call_success",
        "model.message",
        "model.tool_execution",
        "model.turn_ended",
        "model.response",
        "model.messages_snapshot",
        # ...and on an abort: the abort event and the turn's end say it for the catalog.
        "agent.interrupted",
        "model.telemetry",
        "model.turn_failed",
        "subagent.selected",
        "subagent.deselected",
        "subagent.configured",
        "tool.user_requested",
        "tool_search.activated",
        "skill.invoked",
        "hook.start",
        "hook.end",
        "hook.progress",
        "system.message",
        "system.notification",
        "instruction.update",
        "commands.changed",
        "capabilities.changed",
    }
)


# -- state ---------------------------------------------------------------------


class _Event:
    """One raw event, read once: kind, payload, envelope fields and the feed time."""

    __slots__ = ("data", "id", "kind", "now", "top")

    def __init__(
        self, kind: str, data: Mapping[str, Any], top: Mapping[str, Any], now: float
    ) -> None:
        self.kind = kind
        self.data = data
        self.top = top
        self.now = now
        self.id = _text(top.get("id"))

    def stamp(self) -> _Stamp:
        return (_when(self.top.get("timestamp")), self.now)


class _Part:
    """An open text or thinking part: its deltas so far and when it began."""

    __slots__ = ("chunks", "id", "start", "thinking")

    def __init__(self, part_id: str, *, thinking: bool, start: _Stamp | None) -> None:
        self.id = part_id
        self.thinking = thinking
        self.start = start
        self.chunks: list[str] = []


class _Lane:
    """One conversation in the stream (the main agent or a sub-agent) and its open call."""

    __slots__ = (
        "agent_id",
        "call",
        "call_thinking",
        "call_tools",
        "calls_in_turn",
        "key",
        "parent_tool_call_id",
        "parts",
        "retries",
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
        self.retries = 0
        self.parts: dict[str, _Part] = {}


class _Tool:
    """A tool call that started and has not completed."""

    __slots__ = ("input", "lane", "name", "output", "source", "started")

    def __init__(self, name: str, tool_input: dict[str, Any], lane: _Lane) -> None:
        self.name = name
        self.input = tool_input
        self.lane = lane
        self.started: _Stamp | None = None
        self.output = ""
        self.source: Literal["", "partial", "shell"] = ""


_Handler = Callable[["CopilotTranslator", _Event, list[Emitted]], None]


class CopilotTranslator(Translator):
    """Translates one Copilot session's events; see the module docstring for the mapping."""

    def __init__(self, *, session_id: str | None = None) -> None:
        super().__init__(session_id=session_id, adapter="copilot")
        self._ledger = UsageLedger()
        self._main = _Lane(None, None)
        self._lanes: dict[tuple[str | None, str | None], _Lane] = {}
        self._tools: dict[str, _Tool] = {}
        self._permissions: dict[str, _Lane] = {}
        self._seen: dict[str, None] = {}
        self._done_parts: dict[str, None] = {}
        self._done_tools: dict[str, None] = {}
        self._done_permissions: dict[str, None] = {}
        self._usage_calls: dict[str, None] = {}
        self._model: str | None = None
        self._started = False
        self._busy = False
        self._aborted = False
        self._errored = False
        self._calls = 0
        self._reports = 0

    # -- the Translator contract ----------------------------------------------------

    def translate(self, raw: object, now: float) -> list[Emitted]:
        top = _mapping(raw)
        kind = _text(top.get("type"))
        if kind is None:
            self.malformed("<no type>", "the event has no string 'type'")
            return []
        handler = _HANDLERS.get(kind)
        if handler is None:
            if kind not in _IGNORED:
                self.unknown(kind)
            return []
        raw_data = top.get("data")
        if raw_data is None:
            data: Mapping[str, Any] = {}
        elif isinstance(raw_data, Mapping):
            data = raw_data
        else:
            self.malformed(kind, "'data' is not an object")
            return []
        event = _Event(kind, data, top, now)
        if event.id is not None:
            if event.id in self._seen:
                self.duplicate()
                return []
            _remember(self._seen, event.id)
        out: list[Emitted] = []
        handler(self, event, out)
        return out

    def close(self, now: float) -> list[Emitted]:
        out: list[Emitted] = []
        self._settle((None, now), out, finish="cancelled")
        if self._busy and not self._errored:
            out.append(self.emit(SessionIdle(aborted=self._aborted)))
        self._busy = False
        return out

    # -- plumbing -------------------------------------------------------------------

    def _put(self, out: list[Emitted], event: Event, lane: _Lane) -> None:
        out.append(
            self.emit(event, agent_id=lane.agent_id, parent_tool_call_id=lane.parent_tool_call_id)
        )

    def _lane(self, ev: _Event) -> _Lane:
        agent = _text(ev.top.get("agentId")) or _text(ev.top.get("agent_id"))
        parent = None if agent else _str(ev.data, "parentToolCallId")
        if agent is None and parent is None:
            return self._main
        key = (agent, parent)
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = _Lane(agent, parent)
            if len(self._lanes) > _MAX_LANES:
                del self._lanes[next(iter(self._lanes))]
        return lane

    def _all_lanes(self) -> list[_Lane]:
        return [self._main, *self._lanes.values()]

    def _open_call(self, lane: _Lane, out: list[Emitted]) -> None:
        """Make sure a model call is open in ``lane`` (output means one is running)."""
        self._busy = True
        self._errored = False  # work goes on, so an earlier error did not end the stream
        if lane.call is not None:
            return
        n = lane.calls_in_turn
        lane.calls_in_turn = n + 1
        if lane.turn is None:
            self._calls += 1
            call = f"call-{self._calls}"
        else:
            call = lane.turn if n == 0 else f"{lane.turn}.{n}"
        lane.call = call
        lane.call_tools = False
        lane.call_thinking = False
        self._put(out, TurnStart(turn_id=call), lane)

    def _close_call(
        self, lane: _Lane, finish: str | None, stamp: _Stamp, out: list[Emitted]
    ) -> None:
        """End ``lane``'s open call: its unfinished parts first, then ``stream.turn.end``."""
        stopped = finish in ("cancelled", "error")
        for part in list(lane.parts.values()):
            self._complete_part(lane, part, stamp, out, stopped=stopped)
        if lane.call is None:
            return
        reason = finish or ("tool_use" if lane.call_tools else "end_turn")
        self._put(out, TurnEnd(turn_id=lane.call, finish_reason=reason), lane)
        lane.call = None

    def _complete_part(
        self,
        lane: _Lane,
        part: _Part,
        stamp: _Stamp,
        out: list[Emitted],
        *,
        text: str | None = None,
        stopped: bool = False,
    ) -> None:
        del lane.parts[part.id]
        _remember(self._done_parts, part.id)
        full = text if text else "".join(part.chunks)
        if not full:
            return  # nothing was shown, so nothing completes
        if part.thinking:
            duration = None if part.start is None else _elapsed(part.start, stamp)
            event: Event = ThinkingComplete(
                message_id=part.id, text=full, duration_s=duration, stopped=stopped
            )
        else:
            event = TextComplete(message_id=part.id, text=full, stopped=stopped)
        self._put(out, event, lane)

    def _delta(self, ev: _Event, out: list[Emitted], *, thinking: bool) -> None:
        key = "reasoningId" if thinking else "messageId"
        part_id = _str(ev.data, key)
        text = _str(ev.data, "deltaContent")
        if part_id is None or text is None:
            self.malformed(ev.kind, f"needs string '{key}' and 'deltaContent'")
            return
        if part_id in self._done_parts:
            self.malformed(ev.kind, "a delta after its part completed")
            return
        lane = self._lane(ev)
        part = lane.parts.get(part_id)
        if part is None:
            self._open_call(lane, out)
            part = lane.parts[part_id] = _Part(part_id, thinking=thinking, start=ev.stamp())
        if thinking:
            lane.call_thinking = True
        if not text:
            return
        part.chunks.append(text)
        delta: Event = (
            ThinkingDelta(message_id=part_id, text=text)
            if thinking
            else TextDelta(message_id=part_id, text=text)
        )
        self._put(out, delta, lane)

    def _start_tool(
        self,
        lane: _Lane,
        tool_call_id: str,
        name: str,
        tool_input: dict[str, Any],
        out: list[Emitted],
    ) -> _Tool:
        tool = self._tools[tool_call_id] = _Tool(name, tool_input, lane)
        self._busy = True
        self._put(
            out,
            ToolStart(
                tool_call_id=tool_call_id,
                name=name,
                input=tool_input,
                parent_tool_call_id=lane.parent_tool_call_id,
            ),
            lane,
        )
        return tool

    def _settle(self, stamp: _Stamp, out: list[Emitted], *, finish: str | None) -> None:
        """The agent stopped: end every open part and call, then what still waits or runs."""
        for lane in self._all_lanes():
            self._close_call(lane, finish, stamp, out)
            lane.turn = None
        for request_id, lane in self._permissions.items():
            _remember(self._done_permissions, request_id)
            self._put(out, PermissionResolved(request_id=request_id, outcome="cancelled"), lane)
        self._permissions.clear()
        for tool_call_id, tool in self._tools.items():
            _remember(self._done_tools, tool_call_id)
            duration = None if tool.started is None else _elapsed(tool.started, stamp)
            complete = ToolComplete(
                tool_call_id=tool_call_id, name=tool.name, status="cancelled", duration_s=duration
            )
            self._put(out, complete, tool.lane)
        self._tools.clear()

    # -- session lifecycle ------------------------------------------------------------

    def _on_session_start(self, ev: _Event, out: list[Emitted]) -> None:
        model = _str(ev.data, "selectedModel")
        if model:
            self._model = model
        if self._started:
            return
        self._started = True
        session_id = _str(ev.data, "sessionId")
        if session_id:
            self.session_id = session_id  # the SDK's id wins over the one we were given
        cwd = _str(_sub(ev.data, "context"), "cwd")
        out.append(self.emit(SessionStart(model=self._model, cwd=cwd)))

    def _on_model_change(self, ev: _Event, out: list[Emitted]) -> None:
        model = _str(ev.data, "newModel")
        if model:
            self._model = model

    def _on_user_message(self, ev: _Event, out: list[Emitted]) -> None:
        self._busy = True
        self._aborted = False
        self._errored = False

    def _on_idle(self, ev: _Event, out: list[Emitted]) -> None:
        flag = _get(ev.data, "aborted")
        aborted = flag if isinstance(flag, bool) else self._aborted
        finish = "cancelled" if aborted else None
        lane = self._lane(ev)
        if lane is not self._main:  # a sub-agent went idle; the session did not
            self._close_call(lane, finish, ev.stamp(), out)
            lane.turn = None
            self._put(out, SessionIdle(aborted=aborted), lane)
            return
        self._settle(ev.stamp(), out, finish=finish)
        out.append(self.emit(SessionIdle(aborted=aborted)))
        self._busy = False
        self._aborted = False
        self._errored = False

    def _on_abort(self, ev: _Event, out: list[Emitted]) -> None:
        self._aborted = True
        stamp = ev.stamp()
        for lane in self._all_lanes():
            self._close_call(lane, "cancelled", stamp, out)

    def _on_error(self, ev: _Event, out: list[Emitted]) -> None:
        message = _str(ev.data, "message") or _str(ev.data, "errorType") or "unknown error"
        code = _str(ev.data, "errorCode") or _str(ev.data, "errorType")
        status = _int(ev.data, "statusCode")
        stamp = ev.stamp()
        lane = self._lane(ev)
        for each in self._all_lanes() if lane is self._main else [lane]:
            self._close_call(each, "error", stamp, out)
        error = SessionError(message=message, code=code, retryable=status in _RETRYABLE_STATUS)
        self._put(out, error, lane)
        if lane is self._main:
            self._errored = True

    def _on_title(self, ev: _Event, out: list[Emitted]) -> None:
        title = _str(ev.data, "title")
        if title is None:
            self.malformed(ev.kind, "no string 'title'")
            return
        out.append(self.emit(SessionTitleChanged(title=title)))

    def _on_info(self, ev: _Event, out: list[Emitted]) -> None:
        message = _str(ev.data, "message")
        if message is None:
            self.malformed(ev.kind, "no string 'message'")
            return
        if ev.kind == "session.info":
            self._put(out, SessionInfo(message=message), self._lane(ev))
        else:
            self._put(out, SessionWarning(message=message), self._lane(ev))

    def _on_truncation(self, ev: _Event, out: list[Emitted]) -> None:
        event = SessionTruncation(
            tokens_removed=_int(ev.data, "tokensRemovedDuringTruncation"),
            messages_removed=_int(ev.data, "messagesRemovedDuringTruncation"),
        )
        self._put(out, event, self._lane(ev))

    def _on_compaction(self, ev: _Event, out: list[Emitted]) -> None:
        if _get(ev.data, "success") is False:
            why = _str(ev.data, "error") or _str(ev.data, "failureReason") or "unknown reason"
            self._put(out, SessionWarning(message=f"compaction failed: {why}"), self._lane(ev))
            return
        event = SessionCompaction(
            tokens_before=_int(ev.data, "preCompactionTokens"),
            tokens_after=_int(ev.data, "postCompactionTokens"),
        )
        self._put(out, event, self._lane(ev))

    def _on_usage_info(self, ev: _Event, out: list[Emitted]) -> None:
        used = _int(ev.data, "currentTokens")
        if used is None or used < 0:
            self.malformed(ev.kind, "no count in 'currentTokens'")
            return
        window = _int(ev.data, "tokenLimit")
        event = SessionContext(used=used, window=window if window and window > 0 else None)
        self._put(out, event, self._lane(ev))

    # -- model calls --------------------------------------------------------------

    def _on_turn_start(self, ev: _Event, out: list[Emitted]) -> None:
        lane = self._lane(ev)
        self._close_call(lane, None, ev.stamp(), out)
        lane.turn = _str(ev.data, "turnId") or None
        lane.calls_in_turn = 0
        lane.retries = 0
        self._open_call(lane, out)

    def _on_turn_end(self, ev: _Event, out: list[Emitted]) -> None:
        lane = self._lane(ev)
        self._close_call(lane, None, ev.stamp(), out)
        lane.turn = None

    def _on_turn_retry(self, ev: _Event, out: list[Emitted]) -> None:
        lane = self._lane(ev)
        self._close_call(lane, "error", ev.stamp(), out)
        lane.retries += 1
        retry = SessionRetry(attempt=lane.retries, message=_str(ev.data, "reason") or "")
        self._put(out, retry, lane)

    def _on_reasoning_delta(self, ev: _Event, out: list[Emitted]) -> None:
        self._delta(ev, out, thinking=True)

    def _on_message_delta(self, ev: _Event, out: list[Emitted]) -> None:
        self._delta(ev, out, thinking=False)

    def _on_message_start(self, ev: _Event, out: list[Emitted]) -> None:
        message_id = _str(ev.data, "messageId")
        if message_id is None:
            self.malformed(ev.kind, "no string 'messageId'")
            return
        lane = self._lane(ev)
        if message_id in self._done_parts or message_id in lane.parts:
            return
        self._open_call(lane, out)
        lane.parts[message_id] = _Part(message_id, thinking=False, start=ev.stamp())

    def _on_reasoning(self, ev: _Event, out: list[Emitted]) -> None:
        reasoning_id = _str(ev.data, "reasoningId")
        content = _str(ev.data, "content")
        if reasoning_id is None:
            self.malformed(ev.kind, "no string 'reasoningId'")
            return
        if reasoning_id in self._done_parts:
            self.duplicate()
            return
        lane = self._lane(ev)
        part = lane.parts.get(reasoning_id)
        if part is None:
            if not content:
                return  # nothing streamed and nothing to show (e.g. encrypted reasoning)
            self._open_call(lane, out)
            part = lane.parts[reasoning_id] = _Part(reasoning_id, thinking=True, start=None)
        lane.call_thinking = True
        self._complete_part(lane, part, ev.stamp(), out, text=content)

    def _on_message(self, ev: _Event, out: list[Emitted]) -> None:
        data = ev.data
        message_id = _str(data, "messageId")
        if message_id is None:
            self.malformed(ev.kind, "no string 'messageId'")
            return
        content = _str(data, "content") or ""
        requests = _get(data, "toolRequests")
        if requests is not None and not isinstance(requests, list):
            self.malformed(ev.kind, "'toolRequests' is not a list")
            requests = None
        reasoning = _str(data, "reasoningText")
        lane = self._lane(ev)
        part = lane.parts.get(message_id)
        done = message_id in self._done_parts
        if not (part or (content and not done) or requests or reasoning):
            return
        self._open_call(lane, out)
        stamp = ev.stamp()
        if reasoning and not lane.call_thinking:
            # Reasoning that came only with the message (no streamed reasoning events).
            lane.call_thinking = True
            thinking = ThinkingComplete(
                message_id=f"{message_id}:reasoning",
                text=reasoning,
                signature=_str(data, "reasoningOpaque"),
            )
            self._put(out, thinking, lane)
        if part is not None:
            self._complete_part(lane, part, stamp, out, text=content)
        elif content and not done:
            _remember(self._done_parts, message_id)
            self._put(out, TextComplete(message_id=message_id, text=content), lane)
        for request in requests or ():
            tool_call_id = _str(request, "toolCallId") if isinstance(request, Mapping) else None
            if tool_call_id is None or not isinstance(request, Mapping):
                self.malformed(ev.kind, "a tool request without a 'toolCallId'")
                continue
            lane.call_tools = True
            if tool_call_id in self._tools or tool_call_id in self._done_tools:
                continue
            name = _str(request, "name") or "unknown"
            self._start_tool(lane, tool_call_id, name, _tool_input(_get(request, "arguments")), out)

    def _on_usage(self, ev: _Event, out: list[Emitted]) -> None:
        data = ev.data
        lane = self._lane(ev)
        call_id = _str(data, "apiCallId") or _str(data, "providerCallId")
        if call_id is not None:
            if call_id in self._usage_calls:
                self.duplicate()
                return
            _remember(self._usage_calls, call_id)
        else:
            self._reports += 1
            call_id = ev.id or f"usage-{self._reports}"
        usage = normalize_usage(data, provider="copilot")
        changed = self._ledger.record(
            session_id=lane.key, run_id=None, turn_id=call_id, usage=usage, cumulative=False
        )
        if changed:
            model = _str(data, "model") or self._model
            self._put(out, Usage(tokens=self._ledger.session_total(lane.key), model=model), lane)
        said = _str(data, "finishReason")
        finish = None if not said else _FINISH.get(said, said)
        self._close_call(lane, finish, ev.stamp(), out)

    # -- tools --------------------------------------------------------------------------

    def _on_tool_start(self, ev: _Event, out: list[Emitted]) -> None:
        tool_call_id = _str(ev.data, "toolCallId")
        if tool_call_id is None:
            self.malformed(ev.kind, "no string 'toolCallId'")
            return
        if tool_call_id in self._done_tools:
            return
        tool = self._tools.get(tool_call_id)
        if tool is None:
            name = _str(ev.data, "toolName") or "unknown"
            tool_input = _tool_input(_get(ev.data, "arguments"))
            tool = self._start_tool(self._lane(ev), tool_call_id, name, tool_input, out)
        tool.started = ev.stamp()
        self._busy = True

    def _progress(self, ev: _Event, key: str) -> tuple[str, _Tool, str] | None:
        tool_call_id = _str(ev.data, "toolCallId")
        text = _str(ev.data, key)
        if tool_call_id is None or text is None:
            self.malformed(ev.kind, f"needs string 'toolCallId' and '{key}'")
            return None
        tool = self._tools.get(tool_call_id)
        if tool is None:
            if tool_call_id not in self._done_tools:
                self.malformed(ev.kind, "progress of a tool call that never started")
            return None
        return tool_call_id, tool, text

    def _on_tool_partial(self, ev: _Event, out: list[Emitted]) -> None:
        found = self._progress(ev, "partialOutput")
        if found is None:
            return
        tool_call_id, tool, text = found
        if tool.source == "shell":
            return  # the append-only stream tells the same output
        tool.source = "partial"
        tool.output = text
        self._put(out, ToolPartialResult(tool_call_id=tool_call_id, output=text), tool.lane)

    def _on_shell_output(self, ev: _Event, out: list[Emitted]) -> None:
        found = self._progress(ev, "text")
        if found is None:
            return
        tool_call_id, tool, text = found
        if tool.source == "partial":
            return  # the snapshots tell the same output
        tool.source = "shell"
        tool.output += text
        self._put(out, ToolPartialResult(tool_call_id=tool_call_id, output=tool.output), tool.lane)

    def _on_tool_progress(self, ev: _Event, out: list[Emitted]) -> None:
        found = self._progress(ev, "progressMessage")
        if found is None:
            return
        tool_call_id, tool, text = found
        if tool.source:
            return  # real output is showing: a status line must not replace it
        self._put(out, ToolPartialResult(tool_call_id=tool_call_id, output=text), tool.lane)

    def _on_tool_complete(self, ev: _Event, out: list[Emitted]) -> None:
        data = ev.data
        tool_call_id = _str(data, "toolCallId")
        if tool_call_id is None:
            self.malformed(ev.kind, "no string 'toolCallId'")
            return
        if tool_call_id in self._done_tools:
            self.duplicate()
            return
        _remember(self._done_tools, tool_call_id)
        tool = self._tools.pop(tool_call_id, None)
        error = _sub(data, "error")
        flag = _get(data, "success")
        success = flag if isinstance(flag, bool) else error is None
        result = _sub(data, "result")
        output = _str(result, "content") or _str(result, "detailedContent")
        status: Literal["ok", "error", "cancelled"] = "ok"
        message = None
        if not success:
            message = _str(error, "message")
            code = _str(error, "code")
            cancelled = self._aborted or (code is not None and code.lower() in _CANCEL_CODES)
            status = "cancelled" if cancelled else "error"
        duration = None
        if tool is not None and tool.started is not None:
            duration = _elapsed(tool.started, ev.stamp())
        complete = ToolComplete(
            tool_call_id=tool_call_id,
            name=None if tool is None else tool.name,
            status=status,
            output=output,
            error=message,
            duration_s=duration,
        )
        self._put(out, complete, self._lane(ev) if tool is None else tool.lane)

    # -- permissions --------------------------------------------------------------------

    def _on_permission_requested(self, ev: _Event, out: list[Emitted]) -> None:
        request_id = _str(ev.data, "requestId")
        request = _sub(ev.data, "permissionRequest")
        if request_id is None or request is None:
            self.malformed(ev.kind, "needs string 'requestId' and object 'permissionRequest'")
            return
        if request_id in self._permissions or request_id in self._done_permissions:
            self.duplicate()
            return
        kind = _str(request, "kind")
        tool_call_id = _str(request, "toolCallId")
        tool = None if tool_call_id is None else self._tools.get(tool_call_id)
        details = {
            k: v
            for k, v in request.items()
            if v is not None and k not in ("kind", "toolCallId", "tool_call_id")
        }
        if tool is not None:
            name, tool_input, lane = tool.name, tool.input, tool.lane
        else:
            name = _str(request, "toolName") or kind or "unknown"
            args = _get(request, "args")
            if args is None:
                args = _get(request, "toolArgs")
            tool_input = details if args is None else _tool_input(args)
            lane = self._lane(ev)
        title = (
            _str(request, "intention")
            or _str(request, "toolTitle")
            or _str(request, "hookMessage")
            or _str(request, "toolDescription")
        )
        options = [PermissionOption(id=_ALLOW_ONCE, label="Allow once", kind="allow_once")]
        if _get(request, "canOfferSessionApproval") is not False:
            options.append(
                PermissionOption(
                    id=_ALLOW_SESSION, label="Allow for this session", kind="allow_always"
                )
            )
        options.append(PermissionOption(id=_REJECT, label="Deny", kind="reject_once"))
        self._permissions[request_id] = lane
        self._busy = True
        requested = PermissionRequested(
            request_id=request_id,
            tool=name,
            input=tool_input,
            tool_call_id=tool_call_id,
            title=title,
            category=kind,
            annotations=details,
            options=options,
        )
        self._put(out, requested, lane)

    def _on_permission_completed(self, ev: _Event, out: list[Emitted]) -> None:
        request_id = _str(ev.data, "requestId")
        result = _sub(ev.data, "result")
        kind = _str(result, "kind")
        if request_id is None or result is None or kind is None:
            self.malformed(ev.kind, "needs string 'requestId' and a 'result' with a 'kind'")
            return
        if request_id in self._done_permissions:
            self.duplicate()
            return
        outcome: Literal["allowed", "denied", "cancelled"]
        reason = None
        if kind == "cancelled":
            outcome = "cancelled"
            reason = _str(result, "reason")
        elif kind.startswith("approve"):
            outcome = "allowed"
        elif kind.startswith(("denied", "deny", "reject")) or kind == "user-not-available":
            outcome = "denied"
            reason = _str(result, "feedback") or _str(result, "message")
            if reason is None and kind not in _RESULT_OPTION:
                reason = kind  # who denied it: rules, a hook, a policy, nobody to ask
        else:
            self.malformed(ev.kind, f"unknown result kind {kind!r}")
            return
        _remember(self._done_permissions, request_id)
        lane = self._permissions.pop(request_id, None) or self._lane(ev)
        option = _RESULT_OPTION.get(kind, kind if outcome == "allowed" else None)
        resolved = PermissionResolved(
            request_id=request_id,
            outcome=outcome,
            option_id=option,
            by=_str(ev.data, "decisionSource"),
            reason=reason,
        )
        self._put(out, resolved, lane)

    # -- sub-agents -----------------------------------------------------------------------

    def _spawner(self, ev: _Event, tool_call_id: str) -> _Lane:
        """The lane a ``subagent.*`` event is told in: the agent that spawned it."""
        agent = _text(ev.top.get("agentId"))
        return self._main if agent == tool_call_id else self._lane(ev)

    def _on_subagent_started(self, ev: _Event, out: list[Emitted]) -> None:
        tool_call_id = _str(ev.data, "toolCallId")
        if tool_call_id is None:
            self.malformed(ev.kind, "no string 'toolCallId'")
            return
        name = _str(ev.data, "agentName") or _str(ev.data, "agentDisplayName") or ""
        start = AgentStart(
            agent_id=tool_call_id,
            name=name,
            description=_str(ev.data, "agentDescription"),
            tool_call_id=tool_call_id,
        )
        self._put(out, start, self._spawner(ev, tool_call_id))

    def _on_subagent_ended(self, ev: _Event, out: list[Emitted]) -> None:
        tool_call_id = _str(ev.data, "toolCallId")
        if tool_call_id is None:
            self.malformed(ev.kind, "no string 'toolCallId'")
            return
        if ev.kind == "subagent.failed":
            complete = AgentComplete(
                agent_id=tool_call_id, status="error", result=_str(ev.data, "error")
            )
        else:
            cancelled = _get(ev.data, "cancelled") is True
            complete = AgentComplete(
                agent_id=tool_call_id, status="cancelled" if cancelled else "ok"
            )
        self._put(out, complete, self._spawner(ev, tool_call_id))


_HANDLERS: Final[dict[str, _Handler]] = {
    "session.start": CopilotTranslator._on_session_start,
    "session.resume": CopilotTranslator._on_session_start,
    "session.model_change": CopilotTranslator._on_model_change,
    "session.idle": CopilotTranslator._on_idle,
    "session.error": CopilotTranslator._on_error,
    "session.title_changed": CopilotTranslator._on_title,
    "session.info": CopilotTranslator._on_info,
    "session.warning": CopilotTranslator._on_info,
    "session.truncation": CopilotTranslator._on_truncation,
    "session.compaction_complete": CopilotTranslator._on_compaction,
    "session.usage_info": CopilotTranslator._on_usage_info,
    "user.message": CopilotTranslator._on_user_message,
    "abort": CopilotTranslator._on_abort,
    "assistant.turn_start": CopilotTranslator._on_turn_start,
    "assistant.turn_end": CopilotTranslator._on_turn_end,
    "assistant.turn_retry": CopilotTranslator._on_turn_retry,
    "assistant.reasoning_delta": CopilotTranslator._on_reasoning_delta,
    "assistant.reasoning": CopilotTranslator._on_reasoning,
    "assistant.message_start": CopilotTranslator._on_message_start,
    "assistant.message_delta": CopilotTranslator._on_message_delta,
    "assistant.message": CopilotTranslator._on_message,
    "assistant.usage": CopilotTranslator._on_usage,
    "tool.execution_start": CopilotTranslator._on_tool_start,
    "tool.execution_partial_result": CopilotTranslator._on_tool_partial,
    "tool.shell_output": CopilotTranslator._on_shell_output,
    "tool.execution_progress": CopilotTranslator._on_tool_progress,
    "tool.execution_complete": CopilotTranslator._on_tool_complete,
    "permission.requested": CopilotTranslator._on_permission_requested,
    "permission.completed": CopilotTranslator._on_permission_completed,
    "subagent.started": CopilotTranslator._on_subagent_started,
    "subagent.completed": CopilotTranslator._on_subagent_ended,
    "subagent.failed": CopilotTranslator._on_subagent_ended,
}


class CopilotAdapter:
    """The ``copilot`` adapter: a :class:`CopilotTranslator` per session."""

    name = "copilot"

    def translator(self, *, session_id: str | None = None) -> CopilotTranslator:
        return CopilotTranslator(session_id=session_id)
