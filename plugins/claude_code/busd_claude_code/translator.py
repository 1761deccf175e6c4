"""The ``claude-code`` adapter: Claude Code's ``stream-json`` messages.

These are the lines the Claude Agent SDK reads from the ``claude`` CLI:
``system`` (``init`` starts the session), ``stream_event`` (an Anthropic
stream event, run through :class:`busd_anthropic.stream.MessageStream`),
``assistant`` (a snapshot of one content block), ``user`` (tool results),
``result`` (the end of a turn), and the ``control_request`` /
``control_response`` pair of a ``can_use_tool`` permission request.

Decisions a consumer should know:

- **Usage.** While streaming, ``stream.usage`` comes from the
  ``message_delta`` (and ``message_start``) events, summed over calls by a
  :class:`~busd.UsageLedger`; ``assistant`` snapshots carry a stale copy of
  the ``message_start`` usage and are never reported. A ``result`` raises a
  floor under the running total (a field-wise max): its ``usage`` is the
  turn's main-model calls only, so the floor is the sum of ``modelUsage``
  over every model (sub-agents, side calls), priced at ``total_cost_usd``,
  both running totals of the process; it goes out even unchanged, so a live
  estimate gives way. Then ``stream.session.context``: what
  the last main-model call left in the window, never the total (see
  :mod:`.usage`); docs/usage.md has the figures.
- **Sub-agents.** Lines with a ``parent_tool_use_id`` were produced by the
  sub-agent that ``Task`` call spawned: their events carry
  ``parent_tool_call_id``. A ``Task`` (or ``Agent``) tool call also gives
  ``stream.agent.start`` (agent id = the tool call id, name = its
  ``subagent_type``) and its tool result ``stream.agent.complete``, unless
  ``task_started`` said it runs in the background: then its
  ``task_notification`` (or a ``task_updated`` that stops it) ends it.
  ``task_*`` lines give ``stream.agent.update``.
- **Notes.** ``rate_limit_event`` (near or at a limit) is a warning with the
  reset time, ``hook_response`` an info (a warning when the hook failed);
  lines ignored on purpose are listed in docs/usage.md.
- **Snapshots only.** When Claude Code is not asked for partial messages
  (no ``stream_event`` lines, as sub-agents' output usually is), the
  ``assistant`` snapshots are the content: each block becomes a delta and a
  completion at once, and the turn ends at the next call, tool result or
  ``result``.
- **End of a turn.** ``result`` ends it: open calls settle, the final usage
  goes out, then ``stream.session.idle``. ``aborted=True`` when the result
  says the turn was interrupted (subtype ``error_during_execution``, which
  is what an interrupt produces, or a ``terminal_reason`` that says
  aborted); running tools and pending permission requests are then
  cancelled. Other error results (``error_max_turns``,
  ``error_max_budget_usd``, an API error under ``is_error``) ended the turn
  on the agent's own terms: a ``stream.session.error`` and a plain idle. An
  interrupt is not an error unless Claude Code lists ``errors`` besides its
  interrupt diagnostics (``[ede_diagnostic] ...``, "Request was aborted").
  Interrupted mid-answer, the CLI writes ``[Request interrupted by user]``
  as a user message, then closes the streamed block and message itself
  (stop reason null): the call ends there, its text ``stopped`` and its
  turn ``cancelled``, and those closing lines are dropped.
- **End of the stream.** Without a final ``result`` the CLI stopped
  mid-turn: :meth:`~busd.Translator.finish` settles what is open,
  cancels running tools and pending permissions, and says idle, aborted.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Final, Literal

from busd_anthropic.stream import MessageStream, result_text

from busd import (
    AgentComplete,
    AgentStart,
    AgentUpdate,
    Emitted,
    Event,
    PermissionRequested,
    PermissionResolved,
    SessionContext,
    SessionIdle,
    SessionStart,
    ToolComplete,
    ToolStart,
    Translator,
    Usage,
    UsageLedger,
    as_mapping,
    merge_cumulative,
    normalize_usage,
)

from .notices import (
    IGNORED_SYSTEM,
    TASK_END,
    compaction,
    hook_notice,
    interrupted,
    rate_limit_warning,
    result_error,
    retry,
)
from .permissions import category, permission_options, resolution
from .usage import ByModel, context_used, context_window, every_model

__all__ = ["TASK_TOOLS", "ClaudeCodeAdapter", "ClaudeCodeTranslator"]

TASK_TOOLS: Final = frozenset({"Task", "Agent"})
"""Tools that spawn a sub-agent (``Agent`` is the newer name of ``Task``)."""

_ABORTED: Final = frozenset({"aborted", "aborted_streaming", "aborted_tools", "interrupted"})
_CLOSING: Final = frozenset({"content_block_delta", "content_block_stop", "message_delta"})
_ANNOTATED: Final = (
    "display_name",
    "permission_suggestions",
    "blocked_path",
    "decision_reason",
    "agent_id",
)

_Lane = tuple[str | None, str | None]
"""(session id, parent tool call id): one agent's transcript."""


def _str(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _ledger_key(sid: str | None, parent: str | None) -> str:
    """The ledger's name for one agent's usage: each agent has its own running total."""
    return f"{sid or ''}\x1f{parent or ''}"


class _Tool:
    """A tool call that has started and not completed."""

    __slots__ = ("agent", "name", "parent", "session", "started")

    def __init__(
        self, name: str, session: str | None, parent: str | None, started: float, agent: bool
    ) -> None:
        self.name = name
        self.session = session
        self.parent = parent
        self.started = started
        self.agent = agent


class ClaudeCodeTranslator(Translator):
    """Claude Code ``stream-json`` lines to catalog events, for one CLI process.

    ``remember`` bounds the ids kept to drop duplicates (line uuids,
    completed tool calls, answered permission requests).
    """

    usage_spans_runs = True  # a resumed CLI restores modelUsage and total_cost_usd

    def __init__(self, *, session_id: str | None = None, remember: int = 4096) -> None:
        super().__init__(session_id=session_id, adapter="claude-code")
        self._remember = remember
        self._ledger = UsageLedger()
        self._by_model = ByModel()
        self._lanes: dict[_Lane, MessageStream] = {}
        self._sid = session_id
        self._announced: set[str | None] = set()
        self._model: str | None = None
        self._tools: dict[str, _Tool] = {}
        self._permissions: dict[str, tuple[str | None, str | None]] = {}  # -> (session, call)
        self._asking: dict[str, str] = {}  # tool call id -> its pending request id
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._done: OrderedDict[str, None] = OrderedDict()
        self._answered: OrderedDict[str, None] = OrderedDict()
        self._busy = False
        # The main agent's calls this turn (message ids) and the last one with its usage.
        self._turn_calls: dict[str | None, set[str]] = {}
        self._last_call: dict[str | None, tuple[str, Mapping[str, Any] | None]] = {}
        # Sub-agent tasks: task id -> agent (tool call) id; agents launched in the
        # background, whose tool result does not end them (-> session, parent);
        # and those a task_updated said ended, waiting for their notification.
        self._tasks: dict[str, str] = {}
        self._deferred: set[str] = set()
        self._background: dict[str, tuple[str | None, str | None]] = {}
        self._ending: dict[str, Literal["ok", "error", "cancelled"]] = {}
        # Lanes whose streamed call an interrupt cut: the CLI's own closing lines follow.
        self._cut: set[_Lane] = set()

    # -- dispatch ----------------------------------------------------------------

    def translate(self, raw: object, now: float) -> list[Emitted]:
        line = as_mapping(raw)
        kind = line.get("type")
        uuid = line.get("uuid")
        if isinstance(uuid, str):
            if uuid in self._seen:
                self.duplicate()
                return []
            self._keep(self._seen, uuid)
        out: list[Emitted] = []
        if kind == "stream_event":
            self._stream_event(line, now, out)
        elif kind == "assistant":
            self._assistant(line, now, out)
        elif kind == "user":
            self._user(line, now, out)
        elif kind == "system":
            self._system(line, now, out)
        elif kind == "result":
            self._result(line, now, out)
        elif kind == "control_request":
            self._control_request(line, out)
        elif kind == "control_response":
            self._control_response(line, out)
        elif kind == "control_cancel_request":
            request_id = _str(line.get("request_id"))
            if request_id is not None:
                self._resolve(request_id, "cancelled", None, None, out)
        elif kind == "rate_limit_event":
            warning = rate_limit_warning(line)
            if warning is not None:
                out.append(self.emit(warning, session_id=self._session(line)))
        elif kind == "keep_alive" or kind == "command_lifecycle":
            pass  # command_lifecycle: the queue state of our own input, nothing the agent did
        else:
            self.unknown(kind if isinstance(kind, str) else "<no type>")
        return out

    def close(self, now: float) -> list[Emitted]:
        out: list[Emitted] = []
        for (sid, parent), lane in self._lanes.items():
            self._deliver(out, lane.settle(now), sid, parent, now)
        self._cancel_open(None, now, out)
        for call, (sid, parent) in list(self._background.items()):
            self._agent_done(call, sid, parent, "cancelled", None, now, out)
        if self._busy:
            self._busy = False
            out.append(self.emit(SessionIdle(aborted=True), session_id=self._sid))
        return out

    # -- helpers -----------------------------------------------------------------

    def _keep(self, ids: OrderedDict[str, None], key: str) -> None:
        ids[key] = None
        if len(ids) > self._remember:
            ids.popitem(last=False)

    def _session(self, line: Mapping[str, Any]) -> str | None:
        sid = _str(line.get("session_id"))
        if sid is not None:
            self._sid = sid
        return self._sid

    def _start(
        self,
        sid: str | None,
        out: list[Emitted],
        *,
        model: str | None = None,
        cwd: str | None = None,
    ) -> None:
        if sid not in self._announced:
            self._announced.add(sid)
            out.append(self.emit(SessionStart(model=model, cwd=cwd), session_id=sid))

    def _lane(self, sid: str | None, parent: str | None) -> MessageStream:
        key = (sid, parent)
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = MessageStream(
                self,
                ledger=self._ledger,
                ledger_key=_ledger_key(sid, parent),
                parent_tool_call_id=parent,
                model=self._model,
            )
        return lane

    def _deliver(
        self,
        out: list[Emitted],
        events: list[Event],
        sid: str | None,
        parent: str | None,
        now: float,
    ) -> None:
        """Emit one lane's events; a tool start is remembered, a Task also starts an agent."""
        emit = self.emit
        if parent is None:  # the main agent's usage carries the session's breakdown
            events = self._by_model.stamp(sid, events)
        for event in events:
            out.append(emit(event, session_id=sid, parent_tool_call_id=parent))
            if type(event) is ToolStart:
                self._tool_started(event, sid, parent, now, out)

    def _tool_started(
        self, event: ToolStart, sid: str | None, parent: str | None, now: float, out: list[Emitted]
    ) -> None:
        call = event.tool_call_id
        if call in self._tools or call in self._done:
            return
        agent = event.name in TASK_TOOLS
        self._tools[call] = _Tool(event.name, sid, parent, now, agent)
        if agent:
            kind = _str(event.input.get("subagent_type"))
            start = AgentStart(
                agent_id=call,
                name=kind or "task",
                description=_str(event.input.get("description")),
                parent_agent_id=parent,
                tool_call_id=call,
            )
            out.append(self.emit(start, session_id=sid, parent_tool_call_id=parent))

    # -- lines -------------------------------------------------------------------

    def _stream_event(self, line: Mapping[str, Any], now: float, out: list[Emitted]) -> None:
        event = line.get("event")
        if not isinstance(event, Mapping):
            self.malformed("stream_event", "no event")
            return
        sid = self._session(line)
        parent = _str(line.get("parent_tool_use_id"))
        self._start(sid, out, model=self._model)
        self._busy = True
        kind = event.get("type")
        if (sid, parent) in self._cut:
            if kind in _CLOSING:
                return  # the CLI closing what the interrupt already cut
            self._cut.discard((sid, parent))
            if kind == "message_stop":
                return
        if parent is None and kind == "message_start":
            started = event.get("message")
            if isinstance(started, Mapping):
                self._note_call(sid, started.get("id"), None)
        self._deliver(out, self._lane(sid, parent).handle(event, now), sid, parent, now)

    def _assistant(self, line: Mapping[str, Any], now: float, out: list[Emitted]) -> None:
        message = line.get("message")
        if not isinstance(message, Mapping):
            self.malformed("assistant", "no message")
            return
        sid = self._session(line)
        parent = _str(line.get("parent_tool_use_id"))
        self._start(sid, out, model=self._model)
        self._busy = True
        if parent is None and message.get("model") != "<synthetic>":  # not an error text
            usage = message.get("usage")
            self._note_call(sid, message.get("id"), usage if isinstance(usage, Mapping) else None)
        lane = self._lane(sid, parent)
        # The usage on these snapshots is stale (message_start's): never report it.
        self._deliver(out, lane.snapshot(message, now, usage=False, final=False), sid, parent, now)

    def _user(self, line: Mapping[str, Any], now: float, out: list[Emitted]) -> None:
        message = line.get("message")
        content = message.get("content") if isinstance(message, Mapping) else None
        if not isinstance(content, list):
            return  # a prompt (or its replay): nothing the agent did
        sid = self._session(line)
        parent = _str(line.get("parent_tool_use_id"))
        lane = self._lanes.get((sid, parent))
        if lane is not None and lane.open and interrupted(content):
            # Mid-answer: what streamed so far is cut short, and the CLI closes the
            # block and the message itself next (stop reason null): not an end.
            if lane.cut:
                self._cut.add((sid, parent))
            self._deliver(out, lane.settle(now, cancelled=True), sid, parent, now)
        elif lane is not None and lane.open and not lane.streaming:
            self._deliver(out, lane.settle(now), sid, parent, now)  # results end a snapshot turn
        for block in content:
            if isinstance(block, Mapping) and block.get("type") == "tool_result":
                self._tool_result(block, sid, parent, now, out)

    def _tool_result(
        self,
        block: Mapping[str, Any],
        sid: str | None,
        parent: str | None,
        now: float,
        out: list[Emitted],
    ) -> None:
        call = _str(block.get("tool_use_id"))
        if call is None:
            self.malformed("tool_result", "no tool_use_id")
            return
        if call in self._done:
            self.duplicate()
            return
        self._keep(self._done, call)
        self._busy = True
        tool = self._tools.pop(call, None)
        failed = block.get("is_error") is True
        text = result_text(block.get("content"))
        status: Literal["ok", "error"] = "error" if failed else "ok"
        if tool is not None:
            parent = tool.parent
        if not failed and call in self._asking:  # it ran, so it was allowed
            self._resolve(self._asking[call], "allowed", None, None, out)
        complete = ToolComplete(
            tool_call_id=call,
            name=None if tool is None else tool.name,
            status=status,
            output=None if failed else text,
            error=text if failed else None,
            duration_s=None if tool is None else now - tool.started,
        )
        out.append(self.emit(complete, session_id=sid, parent_tool_call_id=parent))
        if tool is not None and tool.agent:
            if call in self._deferred and not failed:
                self._deferred.discard(call)
                self._background[call] = (sid, parent)  # launched: its task says when it ends
            else:
                self._agent_done(call, sid, parent, status, text, now, out)

    def _agent_done(
        self,
        call: str,
        sid: str | None,
        parent: str | None,
        status: Literal["ok", "error", "cancelled"],
        text: str | None,
        now: float,
        out: list[Emitted],
    ) -> None:
        self._background.pop(call, None)
        self._ending.pop(call, None)
        self._deferred.discard(call)
        for task in [task for task, agent in self._tasks.items() if agent == call]:
            del self._tasks[task]
        lane = self._lanes.pop((sid, call), None)
        if lane is not None:
            self._deliver(out, lane.settle(now, cancelled=status == "cancelled"), sid, call, now)
            self._ledger.forget_session(_ledger_key(sid, call))
        done = AgentComplete(agent_id=call, status=status, result=text)
        out.append(self.emit(done, session_id=sid, parent_tool_call_id=parent))

    def _system(self, line: Mapping[str, Any], now: float, out: list[Emitted]) -> None:
        subtype = line.get("subtype")
        match subtype:
            case "init":
                sid = self._session(line)
                model = _str(line.get("model"))
                if model is not None:
                    self._model = model
                self._start(sid, out, model=model, cwd=_str(line.get("cwd")))
            case "compact_boundary":
                out.append(self.emit(compaction(line), session_id=self._session(line)))
            case "api_retry":
                out.append(self.emit(retry(line), session_id=self._session(line)))
            case "hook_response":
                out.append(self.emit(hook_notice(line), session_id=self._session(line)))
            case "task_started" | "task_progress" | "task_updated" | "task_notification":
                self._task(subtype, line, now, out)
            case str() if subtype in IGNORED_SYSTEM:
                pass
            case _:
                self.unknown(f"system.{subtype}")

    # -- sub-agent tasks ---------------------------------------------------------

    def _task(self, subtype: str, line: Mapping[str, Any], now: float, out: list[Emitted]) -> None:
        """A ``task_*`` line about a sub-agent that an ``Agent`` (``Task``) call started.

        Tasks of other kinds (background shells...) have no agent here: ignored.
        """
        task = _str(line.get("task_id"))
        call = _str(line.get("tool_use_id")) or (None if task is None else self._tasks.get(task))
        if call is None:
            return
        tool = self._tools.get(call)
        if subtype == "task_started":
            if tool is None or not tool.agent:
                return
            if task is not None:
                self._tasks[task] = call
            if line.get("is_backgrounded") is True:
                self._deferred.add(call)
            self._agent_update(call, tool.session, tool.parent, "running", line, out)
            return
        where = self._background.get(call)
        background = where is not None
        if where is None:
            if tool is None or not tool.agent:
                return  # ended already, or not an agent
            where = (tool.session, tool.parent)
        sid, parent = where
        if subtype == "task_progress":
            self._agent_update(call, sid, parent, "running", line, out)
            return
        patch = line.get("patch")
        raw = (
            line.get("status")
            if subtype == "task_notification"
            else (patch.get("status") if isinstance(patch, Mapping) else None)
        )
        status = TASK_END.get(raw) if isinstance(raw, str) else None
        if not background:  # its tool result ends it
            if status is not None:
                self._deferred.discard(call)  # ended before its launch was even reported
            elif isinstance(raw, str):
                self._agent_update(call, sid, parent, raw, line, out)
            return
        if status is None:
            if isinstance(raw, str):
                self._agent_update(call, sid, parent, raw, line, out)
        elif subtype == "task_notification" or status == "cancelled":
            summary = _str(line.get("summary"))
            self._agent_done(call, sid, parent, status, summary, now, out)
        else:
            self._ending[call] = status  # the notification, with the summary, follows

    def _agent_update(
        self,
        call: str,
        sid: str | None,
        parent: str | None,
        status: str,
        line: Mapping[str, Any],
        out: list[Emitted],
    ) -> None:
        message = _str(line.get("description"))
        last_tool = _str(line.get("last_tool_name"))
        if last_tool is not None:
            message = f"{message}: {last_tool}" if message else last_tool
        update = AgentUpdate(agent_id=call, status=status, message=message)
        out.append(self.emit(update, session_id=sid, parent_tool_call_id=parent))

    # -- the end of a turn -------------------------------------------------------

    def _note_call(
        self, sid: str | None, message_id: object, usage: Mapping[str, Any] | None
    ) -> None:
        """A main-agent model call was seen (streamed or as a snapshot)."""
        if isinstance(message_id, str) and message_id:
            self._turn_calls.setdefault(sid, set()).add(message_id)
            self._last_call[sid] = (message_id, usage)

    def _result(self, line: Mapping[str, Any], now: float, out: list[Emitted]) -> None:
        sid = self._session(line)
        self._start(sid, out, model=self._model)
        subtype = _str(line.get("subtype")) or ""
        reason = _str(line.get("terminal_reason"))
        aborted = subtype == "error_during_execution" or reason in _ABORTED
        for (lane_sid, parent), lane in self._lanes.items():
            if lane_sid == sid:
                self._deliver(out, lane.settle(now, cancelled=aborted), sid, parent, now)
        if aborted:
            self._cancel_open(sid, now, out)
        else:
            self._settle_permissions(sid, line.get("permission_denials"), out)
        for call, status in list(self._ending.items()):
            session, parent = self._background.get(call, (sid, None))
            if session == sid:  # ended, and its notification never came
                self._agent_done(call, session, parent, status, None, now, out)
        # result.usage is this turn's main model only; modelUsage is every model's.
        final = normalize_usage(line, provider="anthropic")
        models = every_model(line)
        if models is not None:
            final = merge_cumulative(final, models)
        grew = self._by_model.record(sid, line)
        main = self._lane(sid, None)
        # It counts every call of the turn, even one an interrupt cut (the CLI's own figure).
        events = main.raise_floor(final, final=True)
        if grew and not any(type(e) is Usage for e in events):  # same total, new breakdown
            events.append(Usage(tokens=main.total(), model=main.model))
        self._deliver(out, events, sid, None, now)
        used = self._context_used(sid, line)
        if used:  # 0: no call reached the model
            window = context_window(line, main.model or self._model)
            out.append(self.emit(SessionContext(used=used, window=window), session_id=sid))
        self._turn_calls.pop(sid, None)
        error = result_error(line, subtype)
        if error is not None:
            out.append(self.emit(error, session_id=sid))
        out.append(self.emit(SessionIdle(aborted=aborted), session_id=sid))
        self._busy = False

    def _context_used(self, sid: str | None, line: Mapping[str, Any]) -> int | None:
        """What the window held after the turn's last main-model call (:func:`context_used`)."""
        call = self._last_call.get(sid)
        if call is None:
            return context_used(line, None)
        message_id, snapshot = call
        streamed = self._ledger.turn(_ledger_key(sid, None), message_id)
        return context_used(line, (streamed, snapshot, self._turn_calls.get(sid) == {message_id}))

    def _cancel_open(self, sid: str | None, now: float, out: list[Emitted]) -> None:
        """Cancel the running tools and pending permissions of ``sid`` (``None``: all)."""
        for call, tool in list(self._tools.items()):
            if sid is not None and tool.session != sid:
                continue
            del self._tools[call]
            self._keep(self._done, call)
            cancelled = ToolComplete(
                tool_call_id=call, name=tool.name, status="cancelled", duration_s=now - tool.started
            )
            out.append(
                self.emit(cancelled, session_id=tool.session, parent_tool_call_id=tool.parent)
            )
            if tool.agent:
                self._agent_done(call, tool.session, tool.parent, "cancelled", None, now, out)
        for request_id, (session, _) in list(self._permissions.items()):
            if sid is None or session == sid:
                self._resolve(request_id, "cancelled", None, None, out)

    def _settle_permissions(self, sid: str | None, denials: object, out: list[Emitted]) -> None:
        """Requests still pending when a turn ended normally: the result says how they went.

        A call in ``permission_denials`` was denied; one that completed (with
        an error, or the result would have said) was allowed; one that never
        ran was cancelled.
        """
        denied = set()
        if isinstance(denials, list):
            for denial in denials:
                if isinstance(denial, Mapping) and isinstance(denial.get("tool_use_id"), str):
                    denied.add(denial["tool_use_id"])
        for request_id, (session, call) in list(self._permissions.items()):
            if session != sid:
                continue
            if call is not None and call in denied:
                self._resolve(request_id, "denied", None, None, out)
            elif call is not None and call in self._done:
                self._resolve(request_id, "allowed", None, None, out)
            else:
                self._resolve(request_id, "cancelled", None, None, out)

    # -- permissions -------------------------------------------------------------

    def _control_request(self, line: Mapping[str, Any], out: list[Emitted]) -> None:
        request_id = _str(line.get("request_id"))
        request = line.get("request")
        if request_id is None or not isinstance(request, Mapping):
            self.malformed("control_request", "no request_id or request")
            return
        subtype = request.get("subtype")
        if subtype != "can_use_tool":
            self.unknown(f"control_request.{subtype}")
            return
        if request_id in self._permissions or request_id in self._answered:
            self.duplicate()
            return
        tool = _str(request.get("tool_name"))
        if tool is None:
            self.malformed("control_request", "no tool_name")
            return
        raw_input = request.get("input")
        call = _str(request.get("tool_use_id"))
        running = None if call is None else self._tools.get(call)
        sid = self._sid if running is None else running.session
        asked = PermissionRequested(
            request_id=request_id,
            tool=tool,
            input=dict(raw_input) if isinstance(raw_input, Mapping) else {},
            tool_call_id=call,
            title=_str(request.get("description")) or _str(request.get("title")),
            category=category(tool),
            annotations={k: request[k] for k in _ANNOTATED if request.get(k) is not None},
            options=permission_options(request.get("permission_suggestions")),
        )
        self._permissions[request_id] = (sid, call)
        if call is not None:
            self._asking[call] = request_id
        self._busy = True
        parent = None if running is None else running.parent
        out.append(self.emit(asked, session_id=sid, parent_tool_call_id=parent))

    def _control_response(self, line: Mapping[str, Any], out: list[Emitted]) -> None:
        response = line.get("response")
        if not isinstance(response, Mapping):
            self.malformed("control_response", "no response")
            return
        request_id = _str(response.get("request_id"))
        if request_id is None or request_id not in self._permissions:
            return  # the answer to another control request (initialize, interrupt...)
        outcome, option_id, reason = resolution(response)
        self._resolve(request_id, outcome, option_id, reason, out)

    def _resolve(
        self,
        request_id: str,
        outcome: Literal["allowed", "denied", "cancelled"],
        option_id: str | None,
        reason: str | None,
        out: list[Emitted],
    ) -> None:
        if request_id not in self._permissions:
            return
        sid, call = self._permissions.pop(request_id)
        if call is not None:
            self._asking.pop(call, None)
        self._keep(self._answered, request_id)
        resolved = PermissionResolved(
            request_id=request_id, outcome=outcome, option_id=option_id, reason=reason
        )
        out.append(self.emit(resolved, session_id=sid))


class ClaudeCodeAdapter:
    """The ``claude-code`` adapter: a fresh :class:`ClaudeCodeTranslator` per CLI stream."""

    name = "claude-code"

    def translator(self, *, session_id: str | None = None) -> Translator:
        return ClaudeCodeTranslator(session_id=session_id)
