"""OpenCode's ``/event`` stream, or ``opencode run --format json`` output, as catalog events.

OpenCode publishes the state of things rather than a stream of tokens:
``message.updated`` carries a whole message (role, model, cumulative tokens,
cost, finish), ``message.part.updated`` a whole part (text, reasoning, tool
call with its state, step start/finish), and only ``message.part.delta``
carries increments. Text and reasoning deltas look the same
(``field: "text"``), so a part's type is remembered from the
``message.part.updated`` that announced it.

One assistant message is one model call, hence one turn (``turn_id`` = the
message id). Its ``tokens`` and ``cost`` are cumulative within the message
and restart at the next one, which is exactly what
:class:`busd.UsageLedger` with ``cumulative=True`` adds up. OpenCode
serializes a message when it sends the event, so on a busy machine the
``message.updated`` announcing a message can already say it is done (its
finish, its tokens) ahead of its parts: such a turn ends, and its usage is
counted, at its ``step-finish`` part (or the idle), after its text.

Sessions keep OpenCode's own ids. A child session (a ``task`` tool's
sub-agent) is also a sub-agent: its events carry ``agent_id`` = its session
id, and the ``task`` call that spawned it emits ``stream.agent.start`` /
``stream.agent.complete`` in the parent session.

A permission request (``permission.asked``) names the tool call's tool
(``bash``, ``write``) as its ``tool``, and its ``category`` is the kind
``opencode acp`` gives the permission (``bash`` → ``execute``, ``edit`` →
``edit``: ``_wire.KINDS``), so one rule matches OpenCode however busd drives
it; OpenCode's own permission name is the ``permission`` annotation.

``opencode run --format json`` lines are read as the ``/event`` payloads
that say the same (``_wire.from_run``). Both generations of the stream are
read: the current one (``permission.asked``, ``message.part.delta``,
``session.status``) and the older one the
``opencode-ai`` Python SDK models (``permission.updated``, ``delta`` on
``message.part.updated``). SDK objects are dumped with Python field names
(``session_id`` for ``sessionID``), so every id is read under both spellings.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

from busd import (
    AgentComplete,
    AgentStart,
    Emitted,
    Event,
    PermissionRequested,
    PermissionResolved,
    SessionCompaction,
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
    as_mapping,
    normalize_usage,
)

from ._state import Part, Session, Tool, Turn
from ._wire import (
    MESSAGE_ERRORS,
    OPTIONS,
    QUIET_KINDS,
    QUIET_PARTS,
    REPLIES,
    RUN_KINDS,
    Recent,
    ended,
    field,
    finish_reason,
    from_run,
    ident,
    kind_of,
    mapping,
    number,
    session_of,
    signature,
    span,
    strings,
)

__all__ = ["OpenCodeTranslator"]

_Handler = Callable[[Mapping[str, Any], float, list[Emitted]], None]


class OpenCodeTranslator(Translator):
    """One OpenCode ``/event`` stream (every session it carries) to catalog events."""

    def __init__(self, *, session_id: str | None = None, adapter: str = "opencode") -> None:
        super().__init__(session_id=session_id, adapter=adapter)
        self._ledger = UsageLedger()
        self._sessions: dict[str, Session] = {}
        self._turns: dict[str, Turn] = {}  # open assistant messages
        self._parts: dict[str, Part] = {}  # open text and reasoning parts
        self._tools: dict[str, Tool] = {}  # unfinished tool parts, by part id
        self._permissions: dict[str, Session] = {}  # unanswered requests
        self._users = Recent()  # user message ids: their parts are the prompt
        self._closed = Recent()  # finished turn, part and request ids
        self._seen = Recent()  # raw event ids
        self._handlers: dict[str, _Handler] = {
            "message.updated": self._on_message,
            "message.part.updated": self._on_part,
            "message.part.delta": self._on_delta,
            "permission.asked": self._on_permission,
            "permission.updated": self._on_permission,
            "permission.replied": self._on_reply,
            "session.created": self._on_session,
            "session.updated": self._on_session,
            "session.status": self._on_status,
            "session.idle": self._on_idle,
            "session.error": self._on_error,
            "session.compacted": self._on_compacted,
        }

    # -- the stream ---------------------------------------------------------------

    def translate(self, raw: object, now: float) -> list[Emitted]:
        event = as_mapping(raw)
        kind = event.get("type")
        if not isinstance(kind, str):
            # ``/global/event`` wraps each event: {"directory": ..., "payload": {...}}
            event = mapping(event.get("payload"))
            kind = event.get("type")
            if not isinstance(kind, str):
                self.malformed("<no type>", "no 'type' field")
                return []
        eid = event.get("id")
        if isinstance(eid, str) and eid:
            if eid in self._seen:
                self.duplicate()
                return []
            self._seen.add(eid)
        out: list[Emitted] = []
        if kind in RUN_KINDS and "properties" not in event:  # ``opencode run --format json``
            for said in from_run(event):
                self._handlers[said["type"]](said["properties"], now, out)
            return out
        handler = self._handlers.get(kind)
        if handler is None:
            if kind not in QUIET_KINDS:
                self.unknown(kind)
            return []
        props = event.get("properties")
        if not isinstance(props, Mapping):
            self.malformed(kind, "'properties' is not an object")
            return []
        handler(props, now, out)
        return out

    def close(self, now: float) -> list[Emitted]:
        out: list[Emitted] = []
        for rid, session in list(self._permissions.items()):
            self._emit(out, session, PermissionResolved(request_id=rid, outcome="cancelled"))
        self._permissions.clear()
        for session in self._sessions.values():
            if not session.started:
                continue
            self._settle(session, now, out, stopped=True)
            if not session.idle and not session.errored:
                session.idle = True
                self._emit(out, session, SessionIdle(aborted=session.aborted))
        return out

    # -- sessions -----------------------------------------------------------------

    def _emit(self, out: list[Emitted], session: Session, event: Event) -> None:
        out.append(self.emit(event, session_id=session.id, agent_id=session.agent_id))

    def _session(self, sid: str | None) -> Session:
        key = sid or self.session_id or ""
        session = self._sessions.get(key)
        if session is None:
            session = self._sessions[key] = Session(sid, key)
        return session

    def _begin(self, sid: str | None, out: list[Emitted]) -> Session:
        """The session, announced with ``stream.session.start`` the first time it says something."""
        session = self._session(sid)
        if not session.started:
            session.started = True
            start = SessionStart(
                model=session.model,
                title=session.title,
                cwd=session.cwd,
                parent_session_id=session.parent,
            )
            self._emit(out, session, start)
        return session

    def _on_session(self, props: Mapping[str, Any], now: float, out: list[Emitted]) -> None:
        info = mapping(props.get("info"))
        sid = ident(info.get("id")) or session_of(props)
        if sid is None:
            self.malformed("session.updated", "no session id")
            return
        session = self._session(sid)
        title = ident(info.get("title"))
        if not session.started:
            session.title = title
            session.cwd = ident(info.get("directory")) or session.cwd
            parent = ident(field(info, "parentID", "parent_id"))
            if parent is not None:
                session.parent = parent
                session.agent_id = sid
            self._begin(sid, out)
        elif title is not None and title != session.title:
            session.title = title
            self._emit(out, session, SessionTitleChanged(title=title))

    def _on_status(self, props: Mapping[str, Any], now: float, out: list[Emitted]) -> None:
        raw = props.get("status")
        status = raw if isinstance(raw, str) else mapping(raw).get("type")
        session = self._session(session_of(props))
        if status == "busy":
            session.idle = session.aborted = session.errored = False
        elif status == "idle":
            self._idle(session, now, out)
        elif status == "retry":
            info = mapping(raw)
            attempt = number(info.get("attempt"))
            message = info.get("message")
            session.idle = False
            self._begin(session.id, out)
            retry = SessionRetry(
                attempt=int(attempt) if attempt is not None else 0,
                message=message if isinstance(message, str) else "",
            )
            self._emit(out, session, retry)
        else:
            self.malformed("session.status", f"status {status!r}")

    def _on_idle(self, props: Mapping[str, Any], now: float, out: list[Emitted]) -> None:
        self._idle(self._session(session_of(props)), now, out)

    def _idle(self, session: Session, now: float, out: list[Emitted]) -> None:
        """Idle once (OpenCode says it twice: ``session.status`` idle, then ``session.idle``)."""
        if session.idle:
            return
        self._begin(session.id, out)
        self._settle(session, now, out, stopped=session.aborted)
        session.idle = True
        self._emit(out, session, SessionIdle(aborted=session.aborted))

    def _on_error(self, props: Mapping[str, Any], now: float, out: list[Emitted]) -> None:
        error = mapping(props.get("error"))
        name = ident(error.get("name")) or "UnknownError"
        session = self._session(session_of(props))
        if name == "MessageAbortedError":  # a cancel, not a failure: the idle says aborted
            session.aborted = True
            return
        data = mapping(error.get("data"))
        message = ident(data.get("message")) or ident(error.get("message")) or name
        self._begin(session.id, out)
        session.errored = True
        retryable = field(data, "isRetryable", "is_retryable") is True
        self._emit(out, session, SessionError(message=message, code=name, retryable=retryable))

    def _on_compacted(self, props: Mapping[str, Any], now: float, out: list[Emitted]) -> None:
        session = self._begin(session_of(props), out)
        self._emit(out, session, SessionCompaction())

    # -- turns and usage ------------------------------------------------------------

    def _turn(self, session: Session, mid: str, out: list[Emitted]) -> Turn | None:
        """The open turn of assistant message ``mid``, started now if new; None once ended."""
        turn = self._turns.get(mid)
        if turn is None:
            if mid in self._closed:
                return None
            turn = self._turns[mid] = Turn(mid, session)
            session.idle = False
            self._emit(out, session, TurnStart(turn_id=mid))
        return turn

    def _end_turn(self, turn: Turn, now: float, out: list[Emitted], *, stopped: bool) -> None:
        if turn.done is not None:  # the usage its early end carried, now that its text is in
            self._usage(turn.session, turn.id, turn.done, out)
        del self._turns[turn.id]
        self._closed.add(turn.id)
        reason = turn.reason or ("cancelled" if stopped else "end_turn")
        stopped = stopped or reason in ("cancelled", "error")
        for part in [p for p in self._parts.values() if p.turn_id == turn.id]:
            self._complete(part, now, out, stopped=stopped)
        self._emit(out, turn.session, TurnEnd(turn_id=turn.id, finish_reason=reason))

    def _usage(
        self, session: Session, mid: str, payload: Mapping[str, Any], out: list[Emitted]
    ) -> None:
        usage = normalize_usage(payload, provider="opencode")
        if not (
            usage.input_tokens
            or usage.output_tokens
            or usage.reasoning_tokens
            or usage.cache_read_tokens
            or usage.cache_write_tokens
            or usage.cost_usd
        ):
            return  # a new message's placeholder zeros say nothing yet
        if self._ledger.record(
            session_id=session.key, run_id=None, turn_id=mid, usage=usage, cumulative=True
        ):
            total = self._ledger.session_total(session.key)
            self._emit(out, session, Usage(tokens=total, model=session.model))

    def _on_message(self, props: Mapping[str, Any], now: float, out: list[Emitted]) -> None:
        info = mapping(props.get("info"))
        mid = ident(info.get("id"))
        role = info.get("role")
        if mid is None:
            self.malformed("message.updated", "no message id")
            return
        if role == "user":
            self._users.add(mid)
            return
        if role != "assistant":
            self.malformed("message.updated", f"role {role!r}")
            return
        session = self._session(session_of(info, props))
        model = ident(field(info, "modelID", "api_model_id")) or ident(info.get("model_id"))
        if model is not None:
            session.model = model
        if not session.started:
            session.cwd = ident(mapping(info.get("path")).get("cwd")) or session.cwd
            self._begin(session.id, out)
        turn = self._turn(session, mid, out)
        error = mapping(info.get("error"))
        finish = ident(info.get("finish"))
        done = ended(info)
        if turn is not None and done and not error and not turn.stepped:
            # Said before its parts (OpenCode serializes the message late, when it sends
            # the event): the turn ends, with this usage, at its step-finish or the idle.
            turn.reason = finish_reason(finish) if finish is not None else turn.reason
            turn.done = info
            return
        self._usage(session, mid, info, out)
        if turn is None:
            return
        if error:
            name = ident(error.get("name")) or ""
            turn.reason = MESSAGE_ERRORS.get(name, "error")
            if name == "MessageAbortedError":
                session.aborted = True
        elif finish is not None:
            turn.reason = finish_reason(finish)
        if error or done:
            self._end_turn(turn, now, out, stopped=False)

    # -- parts ----------------------------------------------------------------------

    def _on_part(self, props: Mapping[str, Any], now: float, out: list[Emitted]) -> None:
        part = mapping(props.get("part"))
        pid = ident(part.get("id"))
        mid = ident(field(part, "messageID", "message_id"))
        kind = part.get("type")
        if pid is None or mid is None or not isinstance(kind, str):
            self.malformed("message.part.updated", "part without id, messageID or type")
            return
        if mid in self._users or pid in self._closed:
            return
        if kind in QUIET_PARTS:
            return
        session = self._begin(session_of(part, props), out)
        self._turn(session, mid, out)
        if kind == "text" or kind == "reasoning":
            self._on_text(session, mid, pid, kind, part, props.get("delta"), now, out)
        elif kind == "tool":
            self._on_tool(session, pid, part, out)
        elif kind == "step-finish":
            turn = self._turns.get(mid)
            reason = ident(part.get("reason"))
            if turn is not None:
                turn.stepped = True
                if reason is not None:
                    turn.reason = finish_reason(reason)
            self._usage(session, mid, part, out)
            if turn is not None and turn.done is not None:
                self._end_turn(turn, now, out, stopped=False)
        elif kind != "step-start":
            self.unknown(f"message.part.updated:{kind}")

    def _on_text(
        self,
        session: Session,
        mid: str,
        pid: str,
        kind: str,
        part: Mapping[str, Any],
        delta: object,
        now: float,
        out: list[Emitted],
    ) -> None:
        p = self._parts.get(pid)
        if p is None:
            p = self._parts[pid] = Part(pid, kind, session, mid)
        text = part.get("text")
        snapshot = text if isinstance(text, str) else None
        if isinstance(delta, str):  # the older stream sends deltas on the update itself
            if delta:
                self._delta(p, delta, now, out)
        elif snapshot is not None and len(snapshot) > p.size:
            known = "".join(p.chunks)
            if snapshot.startswith(known):  # a snapshot that ran ahead of the deltas
                self._delta(p, snapshot[p.size :], now, out)
        elif (
            snapshot is not None
            and len(snapshot) < p.size
            and (known := "".join(p.chunks)).startswith(snapshot)
        ):
            p.chunks = [known]  # one string: the replay reads it delta by delta
            p.echo = p.size - len(snapshot)  # behind: the deltas will repeat the rest
        time = mapping(part.get("time"))
        if time.get("end") is not None:
            duration = span(time) if kind == "reasoning" else None
            self._complete(
                p,
                now,
                out,
                text=snapshot,
                duration=duration,
                signature=signature(part),
                stopped=session.aborted,  # ended by the abort, after its session.error
            )

    def _on_delta(self, props: Mapping[str, Any], now: float, out: list[Emitted]) -> None:
        pid = ident(field(props, "partID", "part_id"))
        mid = ident(field(props, "messageID", "message_id")) or ""
        delta = props.get("delta")
        target = props.get("field")
        if pid is None or not isinstance(delta, str):
            self.malformed("message.part.delta", "no partID or no string delta")
            return
        if target != "text":
            self.unknown(f"message.part.delta:{target}")
            return
        if pid in self._closed or mid in self._users:
            return
        p = self._parts.get(pid)
        if p is None:  # OpenCode announces a part before its deltas; unannounced means text
            session = self._begin(session_of(props), out)
            if mid:
                self._turn(session, mid, out)
            p = self._parts[pid] = Part(pid, "text", session, mid)
        if p.echo:
            delta = self._echoed(p, delta)
        if delta:
            self._delta(p, delta, now, out)

    @staticmethod
    def _echoed(p: Part, delta: str) -> str:
        """What ``delta`` adds to a part that a backlog told ahead of the stream.

        The attacher's subscription started before its read of the API, so
        the stream replays the part from where it stood then; the replay is
        checked against what was told, and stops being skipped if it differs.
        """
        at = p.size - p.echo
        told = "".join(p.chunks)[at : at + len(delta)]
        if not delta.startswith(told):
            p.echo = 0
            return delta
        p.echo -= len(told)
        return delta[len(told) :]

    def _delta(self, p: Part, text: str, now: float, out: list[Emitted]) -> None:
        p.chunks.append(text)
        p.size += len(text)
        if p.kind == "reasoning":
            if p.first_now is None:
                p.first_now = now
            self._emit(out, p.session, ThinkingDelta(message_id=p.id, text=text))
        else:
            self._emit(out, p.session, TextDelta(message_id=p.id, text=text))

    def _complete(
        self,
        p: Part,
        now: float,
        out: list[Emitted],
        *,
        text: str | None = None,
        duration: float | None = None,
        signature: str | None = None,
        stopped: bool = False,
    ) -> None:
        del self._parts[p.id]
        self._closed.add(p.id)
        full = text if text is not None else "".join(p.chunks)
        if p.kind == "reasoning":
            if duration is None and p.first_now is not None:
                duration = max(0.0, now - p.first_now)
            done: Event = ThinkingComplete(
                message_id=p.id,
                text=full,
                duration_s=duration,
                signature=signature,
                stopped=stopped,
            )
        else:
            done = TextComplete(message_id=p.id, text=full, stopped=stopped)
        self._emit(out, p.session, done)

    # -- tools ----------------------------------------------------------------------

    def _on_tool(
        self, session: Session, pid: str, part: Mapping[str, Any], out: list[Emitted]
    ) -> None:
        state = mapping(part.get("state"))
        status = state.get("status")
        tool = self._tools.get(pid)
        if tool is None:
            call_id = ident(field(part, "callID", "call_id")) or pid
            tool = self._tools[pid] = Tool(call_id, ident(part.get("tool")) or "unknown", session)
        if status == "pending":  # the input is still streaming (``raw``): nothing to say yet
            return
        if status not in ("running", "completed", "error"):
            self.malformed("message.part.updated", f"tool status {status!r}")
            return
        if not tool.started:
            tool.started = True
            tool.input = dict(mapping(state.get("input")))
            start = ToolStart(tool_call_id=tool.call_id, name=tool.name, input=tool.input)
            self._emit(out, session, start)
        metadata = mapping(state.get("metadata"))
        if tool.name == "task" and tool.agent is None:
            self._spawn(tool, metadata, out)
        if status == "running":
            output = metadata.get("output")
            if isinstance(output, str) and output != tool.partial:
                tool.partial = output
                self._emit(
                    out, session, ToolPartialResult(tool_call_id=tool.call_id, output=output)
                )
            return
        del self._tools[pid]
        self._closed.add(pid)
        duration = span(mapping(state.get("time")))
        if status == "completed":
            output = state.get("output")
            text = output if isinstance(output, str) else None
            done = ToolComplete(
                tool_call_id=tool.call_id, name=tool.name, output=text, duration_s=duration
            )
            self._emit(out, session, done)
            if tool.agent is not None:
                self._emit(out, session, AgentComplete(agent_id=tool.agent, result=text))
            return
        error = ident(state.get("error")) or "tool failed"
        outcome: Literal["error", "cancelled"] = (
            "cancelled" if session.aborted or "aborted" in error.lower() else "error"
        )
        failed = ToolComplete(
            tool_call_id=tool.call_id,
            name=tool.name,
            status=outcome,
            error=error,
            duration_s=duration,
        )
        self._emit(out, session, failed)
        if tool.agent is not None:
            self._emit(out, session, AgentComplete(agent_id=tool.agent, status=outcome))

    def _spawn(self, tool: Tool, metadata: Mapping[str, Any], out: list[Emitted]) -> None:
        """A ``task`` call names its child session once it runs: that session is a sub-agent."""
        child = ident(field(metadata, "sessionId", "sessionID"))
        if child is None:
            return
        tool.agent = child
        sub = self._session(child)
        sub.agent_id = child
        sub.parent = sub.parent or tool.session.id
        kind = tool.input.get("subagent_type")
        description = tool.input.get("description")
        start = AgentStart(
            agent_id=child,
            name=kind if isinstance(kind, str) else "",
            description=description if isinstance(description, str) else None,
            tool_call_id=tool.call_id,
        )
        self._emit(out, tool.session, start)

    # -- permissions ----------------------------------------------------------------

    def _on_permission(self, props: Mapping[str, Any], now: float, out: list[Emitted]) -> None:
        rid = ident(props.get("id"))
        if rid is None:
            self.malformed("permission.asked", "no request id")
            return
        if rid in self._closed or rid in self._permissions:
            return
        session = self._begin(session_of(props), out)
        permission = ident(props.get("permission")) or ident(props.get("type")) or "unknown"
        ref = mapping(props.get("tool"))
        call_id = ident(field(ref, "callID", "call_id")) or ident(field(props, "callID", "call_id"))
        tool = None
        if call_id is not None:
            tool = next((t for t in self._tools.values() if t.call_id == call_id), None)
        patterns = strings(props.get("patterns")) or strings(props.get("pattern"))
        annotations = {
            key: value
            for key, value in (
                ("permission", permission),
                ("patterns", patterns),
                ("always", strings(props.get("always"))),
                ("metadata", dict(mapping(props.get("metadata")))),
            )
            if value
        }
        title = ident(props.get("title"))
        if title is None and patterns:
            title = f"{permission}: {', '.join(patterns)}"
        request = PermissionRequested(
            request_id=rid,
            tool=tool.name if tool is not None else permission,
            input=dict(tool.input) if tool is not None else {},
            tool_call_id=call_id,
            title=title,
            category=kind_of(permission),
            annotations=annotations,
            options=OPTIONS,
        )
        self._permissions[rid] = session
        self._emit(out, session, request)

    def _on_reply(self, props: Mapping[str, Any], now: float, out: list[Emitted]) -> None:
        rid = ident(field(props, "requestID", "request_id")) or ident(
            field(props, "permissionID", "permission_id")
        )
        reply = props.get("reply")
        if reply is None:
            reply = props.get("response")  # the older stream's name
        outcome = REPLIES.get(reply) if isinstance(reply, str) else None
        if rid is None or outcome is None:
            self.malformed("permission.replied", f"request {rid!r}, reply {reply!r}")
            return
        if rid in self._closed:
            return
        self._closed.add(rid)
        session = self._permissions.pop(rid, None) or self._begin(session_of(props), out)
        self._emit(
            out, session, PermissionResolved(request_id=rid, outcome=outcome, option_id=reply)
        )

    # -- the end of a busy period ---------------------------------------------------

    def _settle(self, session: Session, now: float, out: list[Emitted], *, stopped: bool) -> None:
        """Close what a session left open: parts, tool calls, then turns."""
        for p in [p for p in self._parts.values() if p.session is session]:
            self._complete(p, now, out, stopped=stopped)
        for pid, tool in [(k, t) for k, t in self._tools.items() if t.session is session]:
            del self._tools[pid]
            self._closed.add(pid)
            if not tool.started:
                continue
            cancelled = ToolComplete(tool_call_id=tool.call_id, name=tool.name, status="cancelled")
            self._emit(out, session, cancelled)
            if tool.agent is not None:
                self._emit(out, session, AgentComplete(agent_id=tool.agent, status="cancelled"))
        for turn in [t for t in self._turns.values() if t.session is session]:
            self._end_turn(turn, now, out, stopped=stopped)
