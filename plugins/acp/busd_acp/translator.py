"""Agent Client Protocol (ACP) JSON-RPC, read in both directions, as catalog events.

ACP is a JSON-RPC 2.0 conversation between a client (an editor) and an agent.
The translator sees both sides of one connection, one message per ``feed``:
the client's ``session/prompt`` opens a turn, the agent's ``session/update``
notifications stream it, the agent's ``session/request_permission`` asks, and
the *responses* close things: the client's answer resolves the permission,
the agent's answer to ``session/prompt`` ends the turn. Responses carry only
the id of their request, and each side numbers its own requests, so pending
requests are kept in two maps, one per direction (the method says which side
sent it); a response is matched against the other side's map, and when both
hold its id the result's shape decides (``stopReason`` or ``outcome``), then
the latest request.

Input is a JSON-RPC message as a dict, or the ``agent-client-protocol``
package's pydantic objects (``ClientRequest``, ``AgentNotification``,
``ClientResponse``, ...; a bare ``SessionNotification`` or a bare update such
as ``AgentMessageChunk`` too). Those dump their fields in snake_case, so every
field is read under both spellings.

Choices the protocol leaves open:

- A turn is one ``session/prompt``; ``turn_id`` is ``f"acp-prompt-{id}"``
  and ``stopReason`` is the finish reason as ACP says it (``max_turn_requests``
  is kept: it is a cap on model calls, not on tokens). ``stream.session.idle``
  follows every prompt response (``aborted`` when the turn was cancelled).
- Text and thinking parts are identified by the chunk's ``messageId``; a part
  ends at the next chunk of another kind or id, a new tool call, a user
  message chunk, or the end of the turn. A message id that comes back after
  its part ended gets a ``:n`` suffix, so each part completes exactly once.
- Tools are named by the agent's own name for them when it gives one
  (claude-agent-acp: ``Write``, in ``name`` and ``_meta.claudeCode.toolName``),
  else by their ``title`` (what ACP shows people: ``Write hello.txt``), so
  rules and ``--allow`` match the tool, not one call of it; the title stays
  the permission request's ``title``, and the ``kind`` becomes its
  ``category``. ``stream.tool.start`` waits until the input is known: a
  non-empty ``rawInput``, a permission request for the call, or a status past
  ``pending``. ``duration_s`` is measured from ``in_progress``, so time spent
  waiting for a permission is not counted. ``failed`` is ``status="error"``,
  also in a cancelled turn; a tool still open when its turn (or the stream)
  ends is ``cancelled``.
- Sub-agents (claude-agent-acp's, :mod:`busd_acp.subagents`): an ``Agent`` call starts
  one; tool calls stamped with its id are published under it; it ends with its call,
  or, launched in the background, with the turn (``cancelled`` if the turn was cut).
- ``notice`` (and an answer chunk the agent marks as a notice) becomes
  ``stream.session.warning`` or ``stream.session.info``
  (:mod:`busd_acp.notices`), never answer text.
- ``plan`` (and ``plan_update``/``plan_removed``) becomes
  ``stream.session.info`` with a checklist; ``current_mode_update`` too.
  ``available_commands_update`` and ``config_option_update`` emit nothing.
- ``usage_update`` is context-window state: ``stream.session.context``. Its
  cost is the session's cumulative cost; ACP's stable protocol reports no
  token counts, so ``stream.usage`` is emitted only when a prompt response
  carries counts (:mod:`busd_acp.usage`: ``_meta.quota`` or the unstable
  ``usage``), with that cost attached. Those sum the turn's calls, so the
  last ``usage_update`` is said again after them: the agent's context wins.
  In a session continued with ``session/load`` (or ``resume``) that cost
  also holds the runs before the load, which this stream never saw (both
  agents restore it), while the counts are this stream's own: the
  translator says so (``cost_spans_runs``), and the daemon takes the cost
  as the session's and adds only the counts.
- Permission request ids are ``f"acp-{id}"`` of the agent's JSON-RPC id. An
  answer is ``allowed`` or ``denied`` by the selected option's kind,
  ``cancelled`` for ACP's cancelled outcome or an error response; a request
  still unanswered when its turn ends is resolved ``cancelled``.
- Duplicates: a request whose id is still pending on its side, an answer to
  an id already answered, and a tool update after the call ended.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import msgspec

from busd import (
    AgentComplete,
    AgentUpdate,
    Emitted,
    Event,
    PermissionOption,
    PermissionRequested,
    PermissionResolved,
    SessionContext,
    SessionError,
    SessionIdle,
    SessionInfo,
    SessionStart,
    SessionTitleChanged,
    TextComplete,
    TextDelta,
    ThinkingComplete,
    ThinkingDelta,
    TokenUsage,
    ToolComplete,
    ToolPartialResult,
    ToolStart,
    Translator,
    TurnEnd,
    TurnStart,
    Usage,
    UsageLedger,
    as_mapping,
)

from .notices import notice_event, transcript_notice
from .reading import (
    AGENT_METHODS,
    CLIENT_METHODS,
    CLIENT_PREFIXES,
    EMPTY,
    FATAL_ERRORS,
    OPTION_KINDS,
    REMEMBERED,
    SESSION_OPENERS,
    JsonRpcId,
    agent_tool_name,
    count,
    get,
    input_of,
    is_id,
    plan_summary,
    plan_text,
    string,
    tool_output,
)
from .state import Part, Pending, Requests, SessionState, Tool
from .subagents import TASK_TOOLS, agent_start, launch_notice, launched_in_background, parent_of
from .usage import as_map as _map
from .usage import turn_models, turn_usage, update_cost

__all__ = ["AcpTranslator"]

# -- the translator ------------------------------------------------------------


class AcpTranslator(Translator):
    """One ACP connection (any number of sessions on it) as catalog events."""

    def __init__(self, *, session_id: str | None = None) -> None:
        super().__init__(session_id=session_id, adapter="acp")
        self._sessions: dict[str | None, SessionState] = {}
        self._last: str | None = None
        self._requests = Requests()
        self._ledger = UsageLedger()

    # -- dispatch ------------------------------------------------------------------

    def translate(self, raw: object, now: float) -> list[Emitted]:
        m = as_mapping(raw)
        out: list[Emitted] = []
        try:
            self._dispatch(m, out, now)
        except Exception as exc:
            # A shape nobody foresaw. Return what was said before it: the state already
            # reflects those events (a tool marked started must have its start emitted).
            method = m.get("method")
            kind = method if isinstance(method, str) else "<response>"
            self.malformed(kind, f"{type(exc).__name__}: {exc}")
        return out

    def _dispatch(self, m: Mapping[str, Any], out: list[Emitted], now: float) -> None:
        method = m.get("method")
        if isinstance(method, str):
            params = _map(m.get("params")) or EMPTY
            rid = m.get("id")
            if rid is None:
                self._notification(method, params, out, now)
            elif is_id(rid):
                self._request(rid, method, params, out, now)
            else:
                self.malformed(method, f"id must be a number or a string, not {rid!r}")
        elif "result" in m or "error" in m:
            self._response(m, out, now)
        elif "update" in m:  # a bare SessionNotification
            self._update(m, out, now)
        elif get(m, "sessionUpdate", "session_update") is not None:  # a bare update
            self._update({"update": m}, out, now)
        else:
            self.unknown("<not JSON-RPC>")

    def _notification(
        self, method: str, params: Mapping[str, Any], out: list[Emitted], now: float
    ) -> None:
        if method == "session/update":
            self._update(params, out, now)
        elif method in CLIENT_METHODS or method in AGENT_METHODS:
            pass  # session/cancel: the prompt's response says how the turn ended
        elif not method.startswith(CLIENT_PREFIXES):
            self.unknown(method)

    def _request(
        self,
        rid: JsonRpcId,
        method: str,
        params: Mapping[str, Any],
        out: list[Emitted],
        now: float,
    ) -> None:
        from_agent = method in AGENT_METHODS
        pending_map = self._requests.from_agent if from_agent else self._requests.from_client
        if rid in pending_map:
            self.duplicate()
            return
        sid = self._sid(params)
        self._requests.order += 1
        entry = pending_map[rid] = Pending(method, sid, self._requests.order)
        if method == "session/prompt":
            s = self._session(sid, out)
            self._close_part(s, out, now, stopped=False)
            entry.turn_id = s.turn_id = f"acp-prompt-{rid}"
            s.idle = False
            out.append(self.emit(TurnStart(turn_id=s.turn_id), session_id=s.id))
        elif method == "session/request_permission":
            self._permission(rid, entry, params, out, now)
        elif method == "session/new":
            entry.cwd = string(params.get("cwd"))
        elif method in ("session/load", "session/resume"):
            self._session(sid, out, cwd=string(params.get("cwd"))).loaded = True
            self.cost_spans_runs = True  # the agent's cost now holds the earlier runs too
        elif method == "session/set_model":
            model = string(get(params, "modelId", "model_id"))
            if model is not None:
                self._session(sid, out).model = model
        elif not (from_agent or method in CLIENT_METHODS or method.startswith(CLIENT_PREFIXES)):
            self.unknown(method)

    def _response(self, m: Mapping[str, Any], out: list[Emitted], now: float) -> None:
        rid = m.get("id")
        result = _map(m.get("result"))
        error = _map(m.get("error"))
        entry, from_agent = self._requests.match(rid, result)
        if entry is None:
            if is_id(rid) and rid in self._requests.answered:
                self.duplicate()
            elif result is not None and get(result, "stopReason", "stop_reason") is not None:
                # The prompt was sent before we were listening: still end the turn.
                self._end_turn(self._session(self._sid(EMPTY), out), None, result, out, now)
            else:
                self.unknown("response to an unseen request")
            return
        method = entry.method
        if from_agent:
            if method == "session/request_permission" and not entry.resolved:
                self._resolved(entry, result, error, out)
            return
        if error is not None:
            if method in FATAL_ERRORS:
                self._error(entry, error, out, now)
            return
        if method == "session/prompt":
            s = self._session(entry.session, out)
            self._end_turn(s, entry.turn_id, result or EMPTY, out, now)
        elif method in ("session/new", "session/fork") and result is not None:
            sid = string(get(result, "sessionId", "session_id"))
            if sid is not None:
                self._last = sid
                models = _map(result.get("models"))
                model = (
                    None if models is None else get(models, "currentModelId", "current_model_id")
                )
                self._session(sid, out, cwd=entry.cwd, model=string(model))
        elif method in SESSION_OPENERS:
            s = self._session(entry.session, out)
            self._close_part(s, out, now, stopped=False)  # the replayed history is complete

    # -- sessions ------------------------------------------------------------------

    def _sid(self, params: Mapping[str, Any]) -> str | None:
        sid = string(get(params, "sessionId", "session_id"))
        if sid is not None:
            self._last = sid
            return sid
        return self._last if self._last is not None else self.session_id

    def _session(
        self,
        sid: str | None,
        out: list[Emitted],
        *,
        cwd: str | None = None,
        model: str | None = None,
    ) -> SessionState:
        s = self._sessions.get(sid)
        if s is None:
            s = self._sessions[sid] = SessionState(sid)
        if model is not None:
            s.model = model
        if cwd is not None:
            s.cwd = cwd
        if not s.started:
            s.started = True
            out.append(self.emit(SessionStart(model=s.model, cwd=s.cwd), session_id=sid))
        return s

    # -- session/update ------------------------------------------------------------

    def _update(self, params: Mapping[str, Any], out: list[Emitted], now: float) -> None:
        update = _map(params.get("update"))
        kind = None if update is None else get(update, "sessionUpdate", "session_update")
        if update is None or not isinstance(kind, str):
            self.malformed("session/update", "no update with a sessionUpdate kind")
            return
        s = self._session(self._sid(params), out)
        if kind == "agent_message_chunk":
            if (notice := transcript_notice(update)) is not None:
                out.append(self.emit(notice, session_id=s.id))
            else:
                self._chunk(s, "text", kind, update, out, now)
        elif kind == "agent_thought_chunk":
            self._chunk(s, "thinking", kind, update, out, now)
        elif kind == "tool_call":
            self._close_part(s, out, now, stopped=False)
            self._tool(s, kind, update, out, now, force_start=False)
        elif kind == "tool_call_update":
            self._tool(s, kind, update, out, now, force_start=False)
        elif kind == "usage_update":
            self._usage_update(s, update, out)
        elif kind == "plan":
            self._info(s, plan_summary(update.get("entries")), out)
        elif kind == "plan_update":
            plan = _map(update.get("plan")) or EMPTY
            if (text := plan_text(plan)) is None:
                self.malformed(f"session/update:{kind}", f"unknown plan type {plan.get('type')!r}")
            else:
                self._info(s, text, out)
        elif kind == "plan_removed":
            self._info(s, "Plan removed", out)
        elif kind == "user_message_chunk":
            self._close_part(s, out, now, stopped=False)
        elif kind == "current_mode_update":
            mode = string(get(update, "currentModeId", "current_mode_id"))
            if mode is not None:
                self._info(s, f"Mode: {mode}", out)
        elif kind == "session_info_update":
            title = string(update.get("title"))
            if title is not None:
                out.append(self.emit(SessionTitleChanged(title=title), session_id=s.id))
        elif kind == "notice":
            if (notice := notice_event(update)) is not None:
                out.append(self.emit(notice, session_id=s.id))
        elif kind not in ("available_commands_update", "config_option_update"):
            self.unknown(f"session/update:{kind}")

    def _info(self, s: SessionState, message: str, out: list[Emitted]) -> None:
        out.append(self.emit(SessionInfo(message=message), session_id=s.id))

    # -- text and thinking -------------------------------------------------------------

    def _chunk(
        self,
        s: SessionState,
        kind: str,
        update_kind: str,
        update: Mapping[str, Any],
        out: list[Emitted],
        now: float,
    ) -> None:
        content = _map(update.get("content"))
        if content is None:
            self.malformed(f"session/update:{update_kind}", "no content")
            return
        if content.get("type") != "text":
            return  # images, audio, resources: nothing the catalog streams
        text = content.get("text")
        if not isinstance(text, str):
            self.malformed(f"session/update:{update_kind}", "text content without text")
            return
        key = string(get(update, "messageId", "message_id"))
        part = s.part
        if part is not None and (part.kind != kind or (key is not None and part.key != key)):
            self._close_part(s, out, now, stopped=False)
            part = None
        if part is None:
            part = s.part = Part(kind, key, self._part_id(s, kind, key), now)
        part.chunks.append(text)
        delta = TextDelta if kind == "text" else ThinkingDelta
        out.append(self.emit(delta(message_id=part.part_id, text=text), session_id=s.id))

    def _part_id(self, s: SessionState, kind: str, key: str | None) -> str:
        if key is None:
            s.unnamed_parts += 1
            return f"{s.turn_id or s.id or 'acp'}:{kind}:{s.unnamed_parts}"
        seen = s.parts_seen.get((kind, key), 0)
        s.parts_seen[(kind, key)] = seen + 1
        return key if not seen else f"{key}:{seen}"

    def _close_part(
        self, s: SessionState, out: list[Emitted], now: float, *, stopped: bool
    ) -> None:
        part = s.part
        if part is None:
            return
        s.part = None
        text = "".join(part.chunks)
        if part.kind == "text":
            event: TextComplete | ThinkingComplete = TextComplete(
                message_id=part.part_id, text=text, stopped=stopped
            )
        else:
            event = ThinkingComplete(
                message_id=part.part_id, text=text, duration_s=now - part.started, stopped=stopped
            )
        out.append(self.emit(event, session_id=s.id))

    # -- tools ---------------------------------------------------------------------

    def _tool(
        self,
        s: SessionState,
        update_kind: str,
        update: Mapping[str, Any],
        out: list[Emitted],
        now: float,
        *,
        force_start: bool,
    ) -> Tool | None:
        call_id = string(get(update, "toolCallId", "tool_call_id"))
        if call_id is None:
            self.malformed(f"session/update:{update_kind}", "no toolCallId")
            return None
        if call_id in s.done_tools:
            self.duplicate()  # an update repeated after the call ended
            return None
        tool = s.tools.get(call_id)
        if tool is None:
            tool = s.tools[call_id] = Tool(call_id)
        if tool.parent is None and (parent := parent_of(update)) != call_id:
            tool.parent = parent  # later updates may lose it
        tool.background = tool.background or launched_in_background(update)
        if not tool.started:
            title = string(update.get("title"))
            if title is not None:
                tool.title = title
            tool.raw_name = agent_tool_name(update) or tool.raw_name
            kind = string(update.get("kind"))
            if kind is not None:
                tool.kind = kind
            raw_input = get(update, "rawInput", "raw_input")
            if raw_input is not None:
                tool.input = input_of(raw_input)
        status = update.get("status")
        if not tool.started and (
            force_start or tool.input or status in ("in_progress", "completed", "failed")
        ):
            tool.started = True
            self._say(
                s, tool, ToolStart(tool_call_id=call_id, name=tool.name, input=tool.input), out
            )
            if tool.raw_name in TASK_TOOLS:
                self._say(s, tool, agent_start(call_id, tool.input, tool.parent), out)
        if status == "in_progress" and tool.running_since is None:
            tool.running_since = now
        if status in ("completed", "failed"):
            output = tool_output(update.get("content"), get(update, "rawOutput", "raw_output"))
            ok = status == "completed"
            self._tool_done(s, tool, "ok" if ok else "error", output, out, now)
        elif tool.started:
            output = tool_output(update.get("content"), get(update, "rawOutput", "raw_output"))
            if output and output != tool.last_partial:
                tool.last_partial = output
                self._say(s, tool, ToolPartialResult(tool_call_id=call_id, output=output), out)
        return tool

    def _tool_done(
        self,
        s: SessionState,
        tool: Tool,
        status: Literal["ok", "error", "cancelled"],
        output: str | None,
        out: list[Emitted],
        now: float,
    ) -> None:
        del s.tools[tool.call_id]
        done = s.done_tools
        done[tool.call_id] = None
        if len(done) > REMEMBERED:
            del done[next(iter(done))]
        duration = None if tool.running_since is None else now - tool.running_since
        event = ToolComplete(
            tool_call_id=tool.call_id,
            name=tool.name,
            status=status,
            output=output if status == "ok" else None,
            error=output if status == "error" else None,
            duration_s=duration,
        )
        self._say(s, tool, event, out)
        if tool.raw_name not in TASK_TOOLS:
            return
        agent: Event = AgentComplete(agent_id=tool.call_id, status=status, result=output)
        if status == "ok" and (tool.background or launch_notice(output)):
            # Launched only: the end of the turn ends it.
            s.agents[tool.call_id] = tool.parent
            agent = AgentUpdate(agent_id=tool.call_id, status="running", message="background")
        self._say(s, tool, agent, out)

    def _say(self, s: SessionState, tool: Tool, event: Event, out: list[Emitted]) -> None:
        """An event of ``tool``, under the ``Agent`` call whose sub-agent made it, if one did."""
        out.append(self.emit(event, session_id=s.id, parent_tool_call_id=tool.parent))

    def _end_calls(self, s: SessionState, cut: bool, out: list[Emitted], now: float) -> None:
        """The turn ended: its tools still running are cancelled, and its sub-agents end."""
        for tool in list(s.tools.values()):
            if tool.started:
                self._tool_done(s, tool, "cancelled", None, out, now)
        s.tools.clear()
        for call, parent in s.agents.items():
            done = AgentComplete(agent_id=call, status="cancelled" if cut else "ok")
            out.append(self.emit(done, session_id=s.id, parent_tool_call_id=parent))
        s.agents.clear()

    # -- permissions ---------------------------------------------------------------

    def _permission(
        self,
        rid: JsonRpcId,
        entry: Pending,
        params: Mapping[str, Any],
        out: list[Emitted],
        now: float,
    ) -> None:
        entry.request_id = f"acp-{rid}"
        s = self._session(entry.session, out)
        call = _map(get(params, "toolCall", "tool_call")) or EMPTY
        call_id = string(get(call, "toolCallId", "tool_call_id"))
        tool = None
        if call_id is not None and call_id not in s.done_tools:
            # The agent asks to run the call with this input: the tool starts now at the latest.
            tool = self._tool(s, "tool_call_update", call, out, now, force_start=True)
        options: list[PermissionOption] = []
        raw_options = params.get("options")
        for raw in raw_options if isinstance(raw_options, list) else ():
            option = _map(raw)
            oid = None if option is None else string(get(option, "optionId", "option_id"))
            if option is None or oid is None:
                continue
            kind = option.get("kind")
            known = OPTION_KINDS.get(kind, "other") if isinstance(kind, str) else "other"
            entry.options[oid] = known
            label = option.get("name")
            options.append(
                PermissionOption(id=oid, label=label if isinstance(label, str) else "", kind=known)
            )
        title = string(call.get("title"))
        if tool is not None:  # named as its stream.tool.start named it
            name, raw_name, tool_input, category = tool.name, tool.raw_name, tool.input, tool.kind
            title = title or tool.title
            # ...but asked with the input it will run (opencode's call said only its cwd).
            tool_input = input_of(get(call, "rawInput", "raw_input")) or tool_input
        else:
            raw_name, category = agent_tool_name(call), string(call.get("kind"))
            name = raw_name or title or category or "tool"
            tool_input = input_of(get(call, "rawInput", "raw_input"))
        event = PermissionRequested(  # named as rules name tools: the agent's name, its kind
            request_id=f"acp-{rid}",
            tool=name,
            input=tool_input,
            tool_call_id=call_id,
            title=title if raw_name else None,
            category=category,
            options=options,
        )
        parent = parent_of(call) if tool is None else tool.parent
        out.append(self.emit(event, session_id=s.id, parent_tool_call_id=parent))

    def _resolved(
        self,
        entry: Pending,
        result: Mapping[str, Any] | None,
        error: Mapping[str, Any] | None,
        out: list[Emitted],
    ) -> None:
        event = entry.resolution(result, error)
        if event is None:
            self.malformed("session/request_permission", "unknown outcome")
        else:
            out.append(self.emit(event, session_id=entry.session))

    # -- usage and context ---------------------------------------------------------

    def _usage_update(self, s: SessionState, update: Mapping[str, Any], out: list[Emitted]) -> None:
        used = count(update.get("used"))
        if used is None:
            self.malformed("session/update:usage_update", "used is not a token count")
            return
        window = count(update.get("size")) or None
        s.context = SessionContext(used=used, window=window)
        out.append(self.emit(s.context, session_id=s.id))
        cost = update_cost(update)
        if cost is not None and cost != s.cost:
            s.cost = cost
            total = self._ledger.session_total(s.id or "")
            if total.input_tokens or total.output_tokens:
                self._report_usage(s, total, out)

    def _turn_usage(
        self,
        s: SessionState,
        turn_id: str | None,
        tokens: TokenUsage,
        models: dict[str, TokenUsage],
        out: list[Emitted],
    ) -> None:
        turn_id = turn_id or f"acp-turn-{self._requests.order}"
        if models:
            s.models.record(turn_id, models)
        changed = self._ledger.record(
            session_id=s.id or "", run_id=None, turn_id=turn_id, usage=tokens, cumulative=True
        )
        if changed:
            self._report_usage(s, self._ledger.session_total(s.id or ""), out)
            if s.context is not None:
                # The turn's usage sums its calls; the agent's own context figure wins.
                out.append(self.emit(s.context, session_id=s.id))

    def _report_usage(self, s: SessionState, total: TokenUsage, out: list[Emitted]) -> None:
        if s.cost is not None:
            total = msgspec.structs.replace(total, cost_usd=s.cost)
        usage = Usage(tokens=total, model=s.model, models=s.models.totals())
        out.append(self.emit(usage, session_id=s.id))

    # -- end of a turn -------------------------------------------------------------

    def _end_turn(
        self,
        s: SessionState,
        turn_id: str | None,
        result: Mapping[str, Any],
        out: list[Emitted],
        now: float,
        *,
        error: SessionError | None = None,
    ) -> None:
        reason = get(result, "stopReason", "stop_reason")
        finish = reason if isinstance(reason, str) else "error" if error else "end_turn"
        if turn_id is None:
            turn_id = s.turn_id
        elif s.turn_id != turn_id:  # an older prompt, answered after a newer one began
            out.append(self.emit(TurnEnd(turn_id=turn_id, finish_reason=finish), session_id=s.id))
            return
        cut = finish in ("cancelled", "error")
        self._close_part(s, out, now, stopped=cut)
        self._end_calls(s, cut, out, now)
        for pending in self._requests.from_agent.values():
            if pending.session == s.id and pending.request_id and not pending.resolved:
                pending.resolved = True  # its late answer is consumed silently
                event = PermissionResolved(
                    request_id=pending.request_id, outcome="cancelled", reason="the turn ended"
                )
                out.append(self.emit(event, session_id=s.id))
        tokens = turn_usage(result)
        if tokens is not None:
            self._turn_usage(s, turn_id, tokens, turn_models(result), out)
        out.append(self.emit(TurnEnd(turn_id=turn_id, finish_reason=finish), session_id=s.id))
        if error is not None:
            out.append(self.emit(error, session_id=s.id))
        s.turn_id = None
        s.idle = True
        out.append(self.emit(SessionIdle(aborted=finish == "cancelled"), session_id=s.id))

    def _error(
        self, entry: Pending, error: Mapping[str, Any], out: list[Emitted], now: float
    ) -> None:
        message = string(error.get("message")) or f"{entry.method} failed"
        code = error.get("code")
        event = SessionError(
            message=message, code=None if code is None or isinstance(code, bool) else str(code)
        )
        if entry.method == "session/prompt":
            s = self._session(entry.session, out)
            self._end_turn(s, entry.turn_id, EMPTY, out, now, error=event)
        else:
            out.append(self.emit(event, session_id=entry.session))

    # -- end of the stream -----------------------------------------------------------

    def close(self, now: float) -> list[Emitted]:
        out: list[Emitted] = []
        for s in self._sessions.values():
            in_turn = s.turn_id is not None
            self._close_part(s, out, now, stopped=in_turn)
            self._end_calls(s, True, out, now)
            if not in_turn and not s.idle and s.started:
                s.idle = True
                out.append(self.emit(SessionIdle(), session_id=s.id))
        return out
