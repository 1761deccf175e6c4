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
- The CLI (1.0.102) sends a call's usage *before* its ``assistant.message``
  (same ``apiCallId``; the ``assistant.reasoning`` comes after both): the
  call then ends once that message is told, its usage last, so that no
  output of the call follows its count. The late reasoning repeats nothing.
- ``assistant.usage`` is one call's own counts, so the ledger adds them
  (``cumulative=False``) under the call's ``apiCallId``; its ``cost`` is a
  premium-request multiplier, not money, so cost stays unknown.
- ``session.usage_info`` is the context window's state, reported as
  ``stream.session.context``, never as usage.
- Thinking duration is measured between the events' own ``timestamp``\\ s
  (the first reasoning delta to ``assistant.reasoning``, or to the end of
  its call if that comes first), else between the ``now`` values they were
  fed at.
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

from collections.abc import Callable, Mapping
from typing import Any, Final

from busd import (
    Emitted,
    Event,
    PermissionResolved,
    SessionError,
    SessionIdle,
    SessionRetry,
    SessionStart,
    SessionTitleChanged,
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
    normalize_usage,
)

from .notices import session_notice
from .payloads import (
    Stamp,
    as_text,
    as_tool_input,
    elapsed,
    field,
    field_int,
    field_map,
    field_str,
    remember,
    wire_mapping,
)
from .permissions import permission_requested, permission_resolved
from .state import Lane, Part, RawEvent, Report, Tool
from .subagents import agent_event
from .tools import PROGRESS_KEYS, tool_complete, tool_output
from .vocabulary import FINISH, IGNORED, RETRYABLE_STATUS

__all__ = ["CopilotAdapter", "CopilotTranslator"]

_MAX_LANES: Final = 1024
"""Sub-agent conversations tracked at once; the oldest is forgotten first."""


_Handler = Callable[["CopilotTranslator", RawEvent, list[Emitted]], None]


class CopilotTranslator(Translator):
    """Translates one Copilot session's events; see the module docstring for the mapping."""

    def __init__(self, *, session_id: str | None = None) -> None:
        super().__init__(session_id=session_id, adapter="copilot")
        self._ledger = UsageLedger()
        self._main = Lane(None, None)
        self._lanes: dict[tuple[str | None, str | None], Lane] = {}
        self._tools: dict[str, Tool] = {}
        self._permissions: dict[str, Lane] = {}
        self._seen: dict[str, None] = {}
        self._done_parts: dict[str, None] = {}
        self._ended_parts: dict[str, None] = {}  # completed before their own event came
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
        top = wire_mapping(raw)
        kind = as_text(top.get("type"))
        if kind is None:
            self.malformed("<no type>", "the event has no string 'type'")
            return []
        handler = _HANDLERS.get(kind)
        if handler is None:
            if kind not in IGNORED:
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
        event = RawEvent(kind, data, top, now)
        if event.id is not None:
            if event.id in self._seen:
                self.duplicate()
                return []
            remember(self._seen, event.id)
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

    def _put(self, out: list[Emitted], event: Event, lane: Lane) -> None:
        out.append(
            self.emit(event, agent_id=lane.agent_id, parent_tool_call_id=lane.parent_tool_call_id)
        )

    def _lane(self, ev: RawEvent) -> Lane:
        agent = as_text(ev.top.get("agentId")) or as_text(ev.top.get("agent_id"))
        parent = None if agent else field_str(ev.data, "parentToolCallId")
        if agent is None and parent is None:
            return self._main
        key = (agent, parent)
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = Lane(agent, parent)
            if len(self._lanes) > _MAX_LANES:
                del self._lanes[next(iter(self._lanes))]
        return lane

    def _all_lanes(self) -> list[Lane]:
        return [self._main, *self._lanes.values()]

    def _open_call(self, lane: Lane, stamp: Stamp, out: list[Emitted]) -> None:
        """Make sure a model call is open in ``lane`` (output means one is running).

        A call that already reported its usage (and waits for its message) has
        streamed all it will: new output is the next call's.
        """
        self._busy = True
        self._errored = False  # work goes on, so an earlier error did not end the stream
        if lane.call is not None:
            if lane.report is None:
                return
            self._close_call(lane, None, stamp, out)
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
        lane.call_message = False
        self._put(out, TurnStart(turn_id=call), lane)

    def _close_call(self, lane: Lane, finish: str | None, stamp: Stamp, out: list[Emitted]) -> None:
        """End ``lane``'s open call: its unfinished parts, its usage, ``stream.turn.end``.

        A call with a usage report ended as that report says, whatever ends it
        now (its message, the turn's end, an abort).
        """
        report, lane.report = lane.report, None
        usage = None if report is None else report.usage
        if report is not None:
            finish = report.finish
        stopped = finish in ("cancelled", "error")
        for part in list(lane.parts.values()):
            self._complete_part(lane, part, stamp, out, stopped=stopped)
            remember(self._ended_parts, part.id)
        if usage is not None:
            self._put(out, usage, lane)  # after the output it counts, so none is estimated
        if lane.call is None:
            return
        reason = finish or ("tool_use" if lane.call_tools else "end_turn")
        self._put(out, TurnEnd(turn_id=lane.call, finish_reason=reason), lane)
        lane.call = None

    def _complete_part(
        self,
        lane: Lane,
        part: Part,
        stamp: Stamp,
        out: list[Emitted],
        *,
        text: str | None = None,
        stopped: bool = False,
    ) -> None:
        del lane.parts[part.id]
        remember(self._done_parts, part.id)
        full = text if text else "".join(part.chunks)
        if not full:
            return  # nothing was shown, so nothing completes
        if part.thinking:
            duration = None if part.start is None else elapsed(part.start, stamp)
            event: Event = ThinkingComplete(
                message_id=part.id, text=full, duration_s=duration, stopped=stopped
            )
        else:
            event = TextComplete(message_id=part.id, text=full, stopped=stopped)
        self._put(out, event, lane)

    def _delta(self, ev: RawEvent, out: list[Emitted], *, thinking: bool) -> None:
        key = "reasoningId" if thinking else "messageId"
        part_id = field_str(ev.data, key)
        text = field_str(ev.data, "deltaContent")
        if part_id is None or text is None:
            self.malformed(ev.kind, f"needs string '{key}' and 'deltaContent'")
            return
        if part_id in self._done_parts:
            self.malformed(ev.kind, "a delta after its part completed")
            return
        lane = self._lane(ev)
        part = lane.parts.get(part_id)
        if part is None:
            self._open_call(lane, ev.stamp(), out)
            part = lane.parts[part_id] = Part(part_id, thinking=thinking, start=ev.stamp())
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
        lane: Lane,
        tool_call_id: str,
        name: str,
        tool_input: dict[str, Any],
        out: list[Emitted],
    ) -> Tool:
        tool = self._tools[tool_call_id] = Tool(name, tool_input, lane)
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

    def _settle(self, stamp: Stamp, out: list[Emitted], *, finish: str | None) -> None:
        """The agent stopped: end every open part and call, then what still waits or runs."""
        for lane in self._all_lanes():
            self._close_call(lane, finish, stamp, out)
            lane.turn = None
        for request_id, lane in self._permissions.items():
            remember(self._done_permissions, request_id)
            self._put(out, PermissionResolved(request_id=request_id, outcome="cancelled"), lane)
        self._permissions.clear()
        for tool_call_id, tool in self._tools.items():
            remember(self._done_tools, tool_call_id)
            duration = None if tool.started is None else elapsed(tool.started, stamp)
            complete = ToolComplete(
                tool_call_id=tool_call_id, name=tool.name, status="cancelled", duration_s=duration
            )
            self._put(out, complete, tool.lane)
        self._tools.clear()

    # -- session lifecycle ------------------------------------------------------------

    def _on_session_start(self, ev: RawEvent, out: list[Emitted]) -> None:
        model = field_str(ev.data, "selectedModel")
        if model:
            self._model = model
        if self._started:
            return
        self._started = True
        session_id = field_str(ev.data, "sessionId")
        if session_id:
            self.session_id = session_id  # the SDK's id wins over the one we were given
        cwd = field_str(field_map(ev.data, "context"), "cwd")
        out.append(self.emit(SessionStart(model=self._model, cwd=cwd)))

    def _on_model_change(self, ev: RawEvent, out: list[Emitted]) -> None:
        model = field_str(ev.data, "newModel")
        if model:
            self._model = model

    def _on_user_message(self, ev: RawEvent, out: list[Emitted]) -> None:
        self._busy = True
        self._aborted = False
        self._errored = False

    def _on_idle(self, ev: RawEvent, out: list[Emitted]) -> None:
        flag = field(ev.data, "aborted")
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

    def _on_abort(self, ev: RawEvent, out: list[Emitted]) -> None:
        self._aborted = True
        stamp = ev.stamp()
        for lane in self._all_lanes():
            self._close_call(lane, "cancelled", stamp, out)

    def _on_error(self, ev: RawEvent, out: list[Emitted]) -> None:
        message = (
            field_str(ev.data, "message") or field_str(ev.data, "errorType") or "unknown error"
        )
        code = field_str(ev.data, "errorCode") or field_str(ev.data, "errorType")
        status = field_int(ev.data, "statusCode")
        stamp = ev.stamp()
        lane = self._lane(ev)
        for each in self._all_lanes() if lane is self._main else [lane]:
            self._close_call(each, "error", stamp, out)
        error = SessionError(message=message, code=code, retryable=status in RETRYABLE_STATUS)
        self._put(out, error, lane)
        if lane is self._main:
            self._errored = True

    def _on_notice(self, ev: RawEvent, out: list[Emitted]) -> None:
        match session_notice(ev.kind, ev.data):
            case str() as problem:
                self.malformed(ev.kind, problem)
            case SessionTitleChanged() as title:
                out.append(self.emit(title))  # the session's title: told without an agent
            case event:
                self._put(out, event, self._lane(ev))

    # -- model calls --------------------------------------------------------------

    def _on_turn_start(self, ev: RawEvent, out: list[Emitted]) -> None:
        lane = self._lane(ev)
        self._close_call(lane, None, ev.stamp(), out)
        lane.turn = field_str(ev.data, "turnId") or None
        lane.calls_in_turn = 0
        lane.retries = 0
        self._open_call(lane, ev.stamp(), out)

    def _on_turn_end(self, ev: RawEvent, out: list[Emitted]) -> None:
        lane = self._lane(ev)
        self._close_call(lane, None, ev.stamp(), out)
        lane.turn = None

    def _on_turn_retry(self, ev: RawEvent, out: list[Emitted]) -> None:
        lane = self._lane(ev)
        self._close_call(lane, "error", ev.stamp(), out)
        lane.retries += 1
        retry = SessionRetry(attempt=lane.retries, message=field_str(ev.data, "reason") or "")
        self._put(out, retry, lane)

    def _on_reasoning_delta(self, ev: RawEvent, out: list[Emitted]) -> None:
        self._delta(ev, out, thinking=True)

    def _on_message_delta(self, ev: RawEvent, out: list[Emitted]) -> None:
        self._delta(ev, out, thinking=False)

    def _on_message_start(self, ev: RawEvent, out: list[Emitted]) -> None:
        message_id = field_str(ev.data, "messageId")
        if message_id is None:
            self.malformed(ev.kind, "no string 'messageId'")
            return
        lane = self._lane(ev)
        if message_id in self._done_parts or message_id in lane.parts:
            return
        self._open_call(lane, ev.stamp(), out)
        lane.parts[message_id] = Part(message_id, thinking=False, start=ev.stamp())

    def _on_reasoning(self, ev: RawEvent, out: list[Emitted]) -> None:
        reasoning_id = field_str(ev.data, "reasoningId")
        content = field_str(ev.data, "content")
        if reasoning_id is None:
            self.malformed(ev.kind, "no string 'reasoningId'")
            return
        if reasoning_id in self._done_parts:
            if reasoning_id in self._ended_parts:
                del self._ended_parts[reasoning_id]  # its message came first (CLI 1.0.102)
            else:
                self.duplicate()
            return
        lane = self._lane(ev)
        part = lane.parts.get(reasoning_id)
        if part is None:
            if not content:
                return  # nothing streamed and nothing to show (e.g. encrypted reasoning)
            if content == lane.told_reasoning:
                # Its message told it already (not streaming, CLI 1.0.102: the message first).
                lane.told_reasoning = None
                remember(self._done_parts, reasoning_id)
                return
            self._open_call(lane, ev.stamp(), out)
            part = lane.parts[reasoning_id] = Part(reasoning_id, thinking=True, start=None)
        lane.call_thinking = True
        self._complete_part(lane, part, ev.stamp(), out, text=content)

    def _on_message(self, ev: RawEvent, out: list[Emitted]) -> None:
        data = ev.data
        message_id = field_str(data, "messageId")
        if message_id is None:
            self.malformed(ev.kind, "no string 'messageId'")
            return
        content = field_str(data, "content") or ""
        requests = field(data, "toolRequests")
        if requests is not None and not isinstance(requests, list):
            self.malformed(ev.kind, "'toolRequests' is not a list")
            requests = None
        reasoning = field_str(data, "reasoningText")
        lane = self._lane(ev)
        stamp = ev.stamp()
        report = lane.report
        if report is not None and not report.waits_for(field_str(data, "apiCallId")):
            self._close_call(lane, None, stamp, out)  # not the message its usage waits for
            report = None
        part = lane.parts.get(message_id)
        done = message_id in self._done_parts
        if not (part or (content and not done) or requests or reasoning):
            if report is not None:
                self._close_call(lane, None, stamp, out)
            return
        if report is None:
            self._open_call(lane, stamp, out)
        lane.call_message = True
        for thought in [p for p in lane.parts.values() if p.thinking]:
            # The message is the call's last word: its thinking is over, whether or
            # not its assistant.reasoning came yet (CLI 1.0.102 sends it after).
            self._complete_part(lane, thought, stamp, out)
            remember(self._ended_parts, thought.id)
        if reasoning and not lane.call_thinking:
            # Reasoning that came only with the message (no streamed reasoning events).
            lane.call_thinking = True
            lane.told_reasoning = reasoning
            thinking = ThinkingComplete(
                message_id=f"{message_id}:reasoning",
                text=reasoning,
                signature=field_str(data, "reasoningOpaque"),
            )
            self._put(out, thinking, lane)
        if part is not None:
            self._complete_part(lane, part, stamp, out, text=content)
        elif content and not done:
            remember(self._done_parts, message_id)
            self._put(out, TextComplete(message_id=message_id, text=content), lane)
        for request in requests or ():
            tool_call_id = (
                field_str(request, "toolCallId") if isinstance(request, Mapping) else None
            )
            if tool_call_id is None or not isinstance(request, Mapping):
                self.malformed(ev.kind, "a tool request without a 'toolCallId'")
                continue
            lane.call_tools = True
            if tool_call_id in self._tools or tool_call_id in self._done_tools:
                continue
            name = field_str(request, "name") or "unknown"
            tool_input = as_tool_input(field(request, "arguments"))
            self._start_tool(lane, tool_call_id, name, tool_input, out)
        if report is not None:
            self._close_call(lane, None, stamp, out)  # the call's usage came first

    def _on_usage(self, ev: RawEvent, out: list[Emitted]) -> None:
        data = ev.data
        lane = self._lane(ev)
        call_id = field_str(data, "apiCallId") or field_str(data, "providerCallId")
        if call_id is not None:
            if call_id in self._usage_calls:
                self.duplicate()
                return
            remember(self._usage_calls, call_id)
        else:
            self._reports += 1
            call_id = ev.id or f"usage-{self._reports}"
        stamp = ev.stamp()
        if lane.report is not None:
            self._close_call(lane, None, stamp, out)  # a call whose message never came
        counts = normalize_usage(data, provider="copilot")
        changed = self._ledger.record(
            session_id=lane.key, run_id=None, turn_id=call_id, usage=counts, cumulative=False
        )
        usage = None
        if changed:
            model = field_str(data, "model") or self._model
            usage = Usage(tokens=self._ledger.session_total(lane.key), model=model)
        said = field_str(data, "finishReason")
        finish = None if not said else FINISH.get(said, said)
        lane.report = Report(field_str(data, "apiCallId"), finish, usage)
        if lane.call is None or lane.call_message:  # else the call's message is still to come
            self._close_call(lane, None, stamp, out)

    # -- tools --------------------------------------------------------------------------

    def _on_tool_start(self, ev: RawEvent, out: list[Emitted]) -> None:
        tool_call_id = field_str(ev.data, "toolCallId")
        if tool_call_id is None:
            self.malformed(ev.kind, "no string 'toolCallId'")
            return
        if tool_call_id in self._done_tools:
            return
        tool = self._tools.get(tool_call_id)
        if tool is None:
            name = field_str(ev.data, "toolName") or "unknown"
            tool_input = as_tool_input(field(ev.data, "arguments"))
            tool = self._start_tool(self._lane(ev), tool_call_id, name, tool_input, out)
        tool.started = ev.stamp()
        self._busy = True

    def _on_tool_output(self, ev: RawEvent, out: list[Emitted]) -> None:
        key = PROGRESS_KEYS[ev.kind]
        tool_call_id = field_str(ev.data, "toolCallId")
        text = field_str(ev.data, key)
        if tool_call_id is None or text is None:
            self.malformed(ev.kind, f"needs string 'toolCallId' and '{key}'")
            return
        tool = self._tools.get(tool_call_id)
        if tool is None:
            if tool_call_id not in self._done_tools:
                self.malformed(ev.kind, "progress of a tool call that never started")
            return
        shown = tool_output(ev.kind, tool, text)
        if shown is not None:
            self._put(out, ToolPartialResult(tool_call_id=tool_call_id, output=shown), tool.lane)

    def _on_tool_complete(self, ev: RawEvent, out: list[Emitted]) -> None:
        data = ev.data
        tool_call_id = field_str(data, "toolCallId")
        if tool_call_id is None:
            self.malformed(ev.kind, "no string 'toolCallId'")
            return
        if tool_call_id in self._done_tools:
            self.duplicate()
            return
        remember(self._done_tools, tool_call_id)
        tool = self._tools.pop(tool_call_id, None)
        complete = tool_complete(tool_call_id, data, tool, ev.stamp(), aborted=self._aborted)
        self._put(out, complete, self._lane(ev) if tool is None else tool.lane)

    # -- permissions --------------------------------------------------------------------

    def _on_permission_requested(self, ev: RawEvent, out: list[Emitted]) -> None:
        request_id = field_str(ev.data, "requestId")
        request = field_map(ev.data, "permissionRequest")
        if request_id is None or request is None:
            self.malformed(ev.kind, "needs string 'requestId' and object 'permissionRequest'")
            return
        if request_id in self._permissions or request_id in self._done_permissions:
            self.duplicate()
            return
        tool_call_id = field_str(request, "toolCallId")
        tool = None if tool_call_id is None else self._tools.get(tool_call_id)
        lane = self._lane(ev) if tool is None else tool.lane
        self._permissions[request_id] = lane
        self._busy = True
        self._put(out, permission_requested(request_id, request, tool), lane)

    def _on_permission_completed(self, ev: RawEvent, out: list[Emitted]) -> None:
        request_id = field_str(ev.data, "requestId")
        result = field_map(ev.data, "result")
        kind = field_str(result, "kind")
        if request_id is None or result is None or kind is None:
            self.malformed(ev.kind, "needs string 'requestId' and a 'result' with a 'kind'")
            return
        if request_id in self._done_permissions:
            self.duplicate()
            return
        by = field_str(ev.data, "decisionSource")
        resolved = permission_resolved(request_id, kind, result, by=by)
        if resolved is None:
            self.malformed(ev.kind, f"unknown result kind {kind!r}")
            return
        remember(self._done_permissions, request_id)
        lane = self._permissions.pop(request_id, None) or self._lane(ev)
        self._put(out, resolved, lane)

    # -- sub-agents -----------------------------------------------------------------------

    def _on_subagent(self, ev: RawEvent, out: list[Emitted]) -> None:
        tool_call_id = field_str(ev.data, "toolCallId")
        if tool_call_id is None:
            self.malformed(ev.kind, "no string 'toolCallId'")
            return
        # Told in the lane of the agent that spawned it.
        agent = as_text(ev.top.get("agentId"))
        lane = self._main if agent == tool_call_id else self._lane(ev)
        self._put(out, agent_event(ev.kind, tool_call_id, ev.data), lane)


_HANDLERS: Final[dict[str, _Handler]] = {
    "session.start": CopilotTranslator._on_session_start,
    "session.resume": CopilotTranslator._on_session_start,
    "session.model_change": CopilotTranslator._on_model_change,
    "session.idle": CopilotTranslator._on_idle,
    "session.error": CopilotTranslator._on_error,
    "session.title_changed": CopilotTranslator._on_notice,
    "session.info": CopilotTranslator._on_notice,
    "session.warning": CopilotTranslator._on_notice,
    "session.truncation": CopilotTranslator._on_notice,
    "session.compaction_complete": CopilotTranslator._on_notice,
    "session.usage_info": CopilotTranslator._on_notice,
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
    "tool.execution_partial_result": CopilotTranslator._on_tool_output,
    "tool.shell_output": CopilotTranslator._on_tool_output,
    "tool.execution_progress": CopilotTranslator._on_tool_output,
    "tool.execution_complete": CopilotTranslator._on_tool_complete,
    "permission.requested": CopilotTranslator._on_permission_requested,
    "permission.completed": CopilotTranslator._on_permission_completed,
    "subagent.started": CopilotTranslator._on_subagent,
    "subagent.completed": CopilotTranslator._on_subagent,
    "subagent.failed": CopilotTranslator._on_subagent,
}


class CopilotAdapter:
    """The ``copilot`` adapter: a :class:`CopilotTranslator` per session."""

    name = "copilot"

    def translator(self, *, session_id: str | None = None) -> CopilotTranslator:
        return CopilotTranslator(session_id=session_id)
