"""What the daemon knows of each session, for ``sessions``, ``snapshot`` and ``busd status``.

:class:`SessionRegistry` is fed every envelope, in ``seq`` order, and keeps
one :class:`SessionState` per session id: where it stands in the stream, its
model, title and working directory, its status, latest run, the latest
``busd.stats`` and ``busd.context`` the accountant derived for it, its
cumulative usage, and what is open right now (permission requests awaiting
an answer, running tool calls, sub-agents). Its answers are frozen msgspec
Structs (:class:`SessionSummary`, :class:`SessionSnapshot`) that go straight
into a ``reply.result``.

Status is ``active`` from the first sign of work (any ``stream.*`` event or
``busd.run.started``), ``idle`` after the main agent's
``stream.session.idle`` or when the session's latest run finishes, and
``error`` after the main agent's ``stream.session.error`` or a run that
finished with ``error``/``timed_out``, until the next sign of work. There is
no ``ended``: no event says a session is over, and an idle session can
always be resumed. Events that can trail the end of a turn (title changes,
usage, context reports, info and warnings, the daemon's own derived events)
and stale events (late output of an old run) never change the status. Going
idle (or the run finishing) also forgets running tool calls and pending
permission requests: nothing can still be waiting once the agent is done.

The session's own agent is the one with no ``agent_id``, or for a child
session (a sub-agent's conversation) the one whose ``agent_id`` is the
session id itself; only its idle, error, usage, stats and context describe
the session. Usage on the bus is cumulative per session and agent, so its
reports are merged with :func:`~busd.core.usage.merge_cumulative` (the later,
larger report wins; nothing is ever summed). Sub-agents' usage, stats and
context are left to the accountant.

Memory is bounded: at most ``max_sessions`` sessions, the least recently
active forgotten first, and at most ``max_open`` permission requests, tool
calls and sub-agents per session, the oldest forgotten first.
"""

from __future__ import annotations

import builtins
import itertools
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeAlias

import msgspec

from .events import (
    AgentComplete,
    AgentStart,
    AgentUpdate,
    ContextUsage,
    Envelope,
    Event,
    PermissionRequested,
    PermissionResolved,
    RunFinished,
    RunStarted,
    SessionError,
    SessionIdle,
    SessionStart,
    SessionTitleChanged,
    StreamingStats,
    TokenUsage,
    ToolComplete,
    ToolStart,
    Usage,
    UserPrompt,
)
from .usage import merge_cumulative

__all__ = [
    "SessionRegistry",
    "SessionRegistryStatistics",
    "SessionSnapshot",
    "SessionState",
    "SessionStatus",
    "SessionSummary",
    "SubAgent",
]

SessionStatus: TypeAlias = Literal["active", "idle", "error"]

_ACTIVE: Final = "active"
_IDLE: Final = "idle"
_ERROR: Final = "error"
MAX_MODELS: Final = 64
"""Models kept in a session's ``usage_by_model``; reports of more are left out of it."""


class SubAgent(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A sub-agent seen in a session: announced by ``stream.agent.start`` or by its events.

    ``status`` is ``running`` until ``stream.agent.update`` says otherwise
    or ``stream.agent.complete`` gives the outcome (``ok``, ``error``,
    ``cancelled``).
    """

    agent_id: str
    name: str = ""
    status: str = "running"


class SessionSummary(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One line of the ``sessions`` reply.

    ``first_ts``/``last_ts`` are the accept times (epoch seconds) of the
    first and last events seen; ``events`` counts every envelope of the
    session, derived ones included. ``usage`` is the main agent's cumulative
    usage, and ``usage_by_model`` its breakdown per model when the usage
    reports carry one (each model merged like ``usage``, field-wise max; at
    most 64 models). ``error`` is the message of the error behind ``status="error"``.
    ``adapter`` is the adapter of its latest run (``busd.run.started``), or
    for an ingested stream the SDK named in its events' source.
    """

    session_id: str
    status: SessionStatus
    first_seq: int
    last_seq: int
    first_ts: float
    last_ts: float
    events: int
    title: str | None = None
    model: str | None = None
    adapter: str | None = None
    cwd: str | None = None
    parent_session_id: str | None = None
    run_id: str | None = None
    error: str | None = None
    usage: TokenUsage | None = None
    usage_by_model: dict[str, TokenUsage] = {}
    pending_permissions: int = 0
    running_tools: int = 0
    sub_agents: int = 0


class SessionSnapshot(SessionSummary, frozen=True, kw_only=True, omit_defaults=True):
    """The ``snapshot`` reply: a summary plus what a UI needs to draw the session now.

    ``stats`` and ``context`` are the main agent's latest ``busd.stats`` and
    ``busd.context``; ``permissions`` are the requests still awaiting an
    answer, as published (reply by ``request_id``); ``tools`` maps running
    tool call ids to tool names; ``agents`` lists the sub-agents seen, in
    order of appearance.
    """

    stats: StreamingStats | None = None
    context: ContextUsage | None = None
    permissions: tuple[Envelope[PermissionRequested], ...] = ()
    tools: dict[str, str] = {}
    agents: tuple[SubAgent, ...] = ()


class SessionState:
    """The live record of one session; read it, never write it (the registry does)."""

    __slots__ = (
        "adapter",
        "agents",
        "context",
        "cwd",
        "error",
        "events",
        "first_seq",
        "first_ts",
        "last_seq",
        "last_ts",
        "model",
        "parent_session_id",
        "permissions",
        "run_id",
        "session_id",
        "stats",
        "status",
        "title",
        "tools",
        "usage",
        "usage_by_model",
    )

    def __init__(self, session_id: str, seq: int, ts: float) -> None:
        self.session_id = session_id
        self.first_seq = seq
        self.last_seq = seq
        self.first_ts = ts
        self.last_ts = ts
        self.events = 0
        self.status: SessionStatus = _IDLE
        self.error: str | None = None
        self.title: str | None = None
        self.model: str | None = None
        self.adapter: str | None = None
        self.cwd: str | None = None
        self.parent_session_id: str | None = None
        self.run_id: str | None = None
        self.usage: TokenUsage | None = None
        self.usage_by_model: dict[str, TokenUsage] = {}
        self.stats: StreamingStats | None = None
        self.context: ContextUsage | None = None
        self.permissions: dict[str, Envelope[PermissionRequested]] = {}
        self.tools: dict[str, str] = {}
        self.agents: dict[str, SubAgent] = {}

    def __repr__(self) -> str:
        return f"<SessionState {self.session_id!r} {self.status} seq={self.last_seq}>"

    def _summary_fields(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "status": self.status,
            "first_seq": self.first_seq,
            "last_seq": self.last_seq,
            "first_ts": self.first_ts,
            "last_ts": self.last_ts,
            "events": self.events,
            "title": self.title,
            "model": self.model,
            "adapter": self.adapter,
            "cwd": self.cwd,
            "parent_session_id": self.parent_session_id,
            "run_id": self.run_id,
            "error": self.error,
            "usage": self.usage,
            "usage_by_model": dict(self.usage_by_model),
            "pending_permissions": len(self.permissions),
            "running_tools": len(self.tools),
            "sub_agents": len(self.agents),
        }

    def summary(self) -> SessionSummary:
        return SessionSummary(**self._summary_fields())

    def snapshot(self, *, stats: StreamingStats | None = None) -> SessionSnapshot:
        """The snapshot; a ``stats`` given replaces the latest ``busd.stats`` seen."""
        return SessionSnapshot(
            **self._summary_fields(),
            stats=self.stats if stats is None else stats,
            context=self.context,
            permissions=tuple(self.permissions.values()),
            tools=dict(self.tools),
            agents=tuple(self.agents.values()),
        )


@dataclass(frozen=True, slots=True)
class SessionRegistryStatistics:
    sessions: int
    active: int
    idle: int
    error: int
    evicted: int
    """Sessions forgotten to stay under ``max_sessions``."""
    observed: int
    """Envelopes with a session id fed to :meth:`SessionRegistry.observe`."""


# -- per-type updates ----------------------------------------------------------
#
# Each event class maps to (is_activity, update). Activity (non-stale) makes
# the session active and its run the latest; the update, when there is one,
# runs for stale events too, because a late tool completion still closes the
# call and a late usage report is still a valid running total.

_Update: TypeAlias = Callable[
    [SessionState, Any, int], None
]  # Any: each takes its own envelope type
_Entry: TypeAlias = tuple[bool, _Update | None]


def _main(envelope: Envelope[Any]) -> bool:
    """From the session's own agent: no agent id, or a child session's own id."""
    agent_id = envelope.agent_id
    return agent_id is None or agent_id == envelope.session_id


def _cap(table: dict[str, Any], limit: int) -> None:
    if len(table) > limit:
        del table[next(iter(table))]


def _on_start(state: SessionState, envelope: Envelope[SessionStart], limit: int) -> None:
    event = envelope.event
    if event.model is not None:
        state.model = event.model
    if event.title is not None:
        state.title = event.title
    if event.cwd is not None:
        state.cwd = event.cwd
    if event.parent_session_id is not None:
        state.parent_session_id = event.parent_session_id


def _on_title(state: SessionState, envelope: Envelope[SessionTitleChanged], limit: int) -> None:
    event = envelope.event
    state.title = event.title


def _on_prompt(state: SessionState, envelope: Envelope[UserPrompt], limit: int) -> None:
    """A session without a title is named by its first prompt (as Claude Code's resume list)."""
    if state.title is None:
        first = envelope.event.text.strip().splitlines()
        if first:
            state.title = first[0] if len(first[0]) <= 80 else first[0][:79] + "…"


def _settle(state: SessionState, status: SessionStatus, error: str | None) -> None:
    """The agent stopped: nothing it started can still be running or waiting."""
    state.status = status
    state.error = error
    state.tools.clear()
    state.permissions.clear()


def _on_idle(state: SessionState, envelope: Envelope[SessionIdle], limit: int) -> None:
    if _main(envelope) and not envelope.stale:
        _settle(state, _IDLE, None)


def _on_error(state: SessionState, envelope: Envelope[SessionError], limit: int) -> None:
    if _main(envelope) and not envelope.stale:
        event = envelope.event
        state.status = _ERROR
        state.error = event.message


def _on_run_started(state: SessionState, envelope: Envelope[RunStarted], limit: int) -> None:
    event = envelope.event
    state.adapter = event.adapter
    if event.model is not None:
        state.model = event.model


def _on_run_finished(state: SessionState, envelope: Envelope[RunFinished], limit: int) -> None:
    # Only the session's latest run settles it: a superseded run finishing
    # late must not make its successor look idle.
    if envelope.run_id is None or envelope.run_id != state.run_id:
        return
    event = envelope.event
    if event.status in ("error", "timed_out"):
        _settle(state, _ERROR, event.error or event.status)
    else:
        _settle(state, _IDLE, None)


def _on_tool_start(state: SessionState, envelope: Envelope[ToolStart], limit: int) -> None:
    event = envelope.event
    state.tools[event.tool_call_id] = event.name
    _cap(state.tools, limit)


def _on_tool_complete(state: SessionState, envelope: Envelope[ToolComplete], limit: int) -> None:
    event = envelope.event
    state.tools.pop(event.tool_call_id, None)


def _on_permission_requested(
    state: SessionState, envelope: Envelope[PermissionRequested], limit: int
) -> None:
    event = envelope.event
    state.permissions[event.request_id] = envelope
    _cap(state.permissions, limit)


def _on_permission_resolved(
    state: SessionState, envelope: Envelope[PermissionResolved], limit: int
) -> None:
    event = envelope.event
    state.permissions.pop(event.request_id, None)


def _on_agent_start(state: SessionState, envelope: Envelope[AgentStart], limit: int) -> None:
    event = envelope.event
    state.agents[event.agent_id] = SubAgent(agent_id=event.agent_id, name=event.name)
    _cap(state.agents, limit)


def _set_agent_status(state: SessionState, agent_id: str, status: str, limit: int) -> None:
    agent = state.agents.get(agent_id)
    name = "" if agent is None else agent.name
    state.agents[agent_id] = SubAgent(agent_id=agent_id, name=name, status=status)
    _cap(state.agents, limit)


def _on_agent_update(state: SessionState, envelope: Envelope[AgentUpdate], limit: int) -> None:
    event = envelope.event
    _set_agent_status(state, event.agent_id, event.status, limit)


def _on_agent_complete(state: SessionState, envelope: Envelope[AgentComplete], limit: int) -> None:
    event = envelope.event
    _set_agent_status(state, event.agent_id, event.status, limit)


def _on_usage(state: SessionState, envelope: Envelope[Usage], limit: int) -> None:
    if not _main(envelope):
        return
    event = envelope.event
    usage = state.usage
    state.usage = event.tokens if usage is None else merge_cumulative(usage, event.tokens)
    by_model = state.usage_by_model
    for model, tokens in event.models.items():
        before = by_model.get(model)
        if before is not None:
            by_model[model] = merge_cumulative(before, tokens)
        elif len(by_model) < MAX_MODELS:
            by_model[model] = tokens
    if event.model is not None:
        state.model = event.model


def _on_stats(state: SessionState, envelope: Envelope[StreamingStats], limit: int) -> None:
    if _main(envelope):
        state.stats = envelope.event


def _on_context(state: SessionState, envelope: Envelope[ContextUsage], limit: int) -> None:
    if _main(envelope):
        state.context = envelope.event


_PASSIVE_STREAM_TAGS: Final = frozenset(
    {
        "stream.session.idle",
        "stream.session.error",
        "stream.session.title_changed",
        "stream.session.info",
        "stream.session.warning",
        "stream.session.context",
        "stream.usage",
    }
)
"""``stream.*`` events that can trail the end of a turn, or set the status themselves."""

# Envelopes of a run that agree on these change a session's record only at the ends.
_STRETCH_OF = operator.attrgetter("session_id", "agent_id", "run_id", "source", "stale")
_UPDATES: Final[dict[type[Event], _Update]] = {
    SessionStart: _on_start,
    SessionTitleChanged: _on_title,
    UserPrompt: _on_prompt,
    SessionIdle: _on_idle,
    SessionError: _on_error,
    RunStarted: _on_run_started,
    RunFinished: _on_run_finished,
    ToolStart: _on_tool_start,
    ToolComplete: _on_tool_complete,
    PermissionRequested: _on_permission_requested,
    PermissionResolved: _on_permission_resolved,
    AgentStart: _on_agent_start,
    AgentUpdate: _on_agent_update,
    AgentComplete: _on_agent_complete,
    Usage: _on_usage,
    StreamingStats: _on_stats,
    ContextUsage: _on_context,
}


def _classify(cls: type[Event]) -> _Entry:
    tag = str(cls.__struct_config__.tag)
    activity = (tag.startswith("stream.") and tag not in _PASSIVE_STREAM_TAGS) or cls is RunStarted
    return activity, _UPDATES.get(cls)


class SessionRegistry:
    """Every session seen on the bus, bounded, least recently active forgotten first.

    :meth:`observe` costs one dict lookup and a few attribute writes for the
    common event (a delta); only the handful of types that change what a
    session *is* do more. Envelopes without a session id are ignored.

    :param max_sessions: sessions remembered (at least 1).
    :param max_open: pending permission requests, running tool calls and
        sub-agents remembered per session (at least 1).
    """

    __slots__ = (
        "_entries",
        "_evicted",
        "_last",
        "_max_open",
        "_max_sessions",
        "_observed",
        "_run_marks",
        "_sessions",
    )

    def __init__(self, *, max_sessions: int = 10_000, max_open: int = 1024) -> None:
        if max_sessions < 1 or max_open < 1:
            raise ValueError("max_sessions and max_open must be at least 1")
        self._max_sessions = max_sessions
        self._max_open = max_open
        self._sessions: dict[str, SessionState] = {}  # least recently active first
        self._entries: dict[type[Event], _Entry] = {}  # per event class, filled on first sight
        self._last: str | None = None  # the most recently active session (the dict's last)
        self._evicted = 0
        self._observed = 0
        self._run_marks = 0

    @property
    def max_sessions(self) -> int:
        return self._max_sessions

    @property
    def run_marks(self) -> int:
        """How often a session's ``run_id`` changed: a session a run had is the daemon's.

        :meth:`busd.daemon.runs.RunManager.authority_epoch` counts it, so that
        a client's cached verdict on a session (may it publish there?) is
        judged again once a run has had that session.
        """
        return self._run_marks

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._sessions

    def observe(self, envelope: Envelope[Event]) -> None:
        """Account for ``envelope``; call it for every accepted envelope, in ``seq`` order."""
        session_id = envelope.session_id
        if session_id is None:
            return
        self._observed += 1
        sessions = self._sessions
        state = sessions.get(session_id)
        if state is None:
            if len(sessions) >= self._max_sessions:
                del sessions[next(iter(sessions))]
                self._evicted += 1
            state = sessions[session_id] = SessionState(session_id, envelope.seq, envelope.ts)
        elif self._last != session_id:
            sessions[session_id] = sessions.pop(session_id)  # most recently active goes last
        self._last = session_id
        state.last_seq = envelope.seq
        state.last_ts = envelope.ts
        state.events += 1
        cls = type(envelope.event)
        entry = self._entries.get(cls)
        if entry is None:
            entry = self._entries[cls] = _classify(cls)
        activity, update = entry
        if activity and not envelope.stale:
            if state.status != _ACTIVE:
                state.status = _ACTIVE
                state.error = None
            run_id = envelope.run_id
            if run_id is not None and run_id != state.run_id:
                state.run_id = run_id
                self._run_marks += 1
            if state.adapter is None:  # ingest: "name[pid=…,uid=…]/sdk", a run: "run/sdk"
                _, slash, adapter = envelope.source.rpartition("/")
                if slash and not adapter.endswith("]"):
                    state.adapter = adapter
        agent_id = envelope.agent_id
        if agent_id is not None and agent_id not in state.agents and agent_id != session_id:
            state.agents[agent_id] = SubAgent(agent_id=agent_id)
            _cap(state.agents, self._max_open)
        if update is not None:
            update(state, envelope, self._max_open)

    def observe_many(self, envelopes: Sequence[Envelope[Event]]) -> None:
        """:meth:`observe` each of a run of one type that changes no session's record.

        The daemon's runs of deltas: within a stretch of the same session,
        agent, run, source and staleness, only the last envelope changes
        anything but the count, once the session is known (the first makes
        a new one, with its seq and time), so the rest are counted.
        """
        observe = self.observe
        if not envelopes or _UPDATES.get(type(envelopes[0].event)) is not None:
            for envelope in envelopes:
                observe(envelope)
            return
        sessions = self._sessions
        i = 0
        for (session_id, *_), same in itertools.groupby(map(_STRETCH_OF, envelopes)):
            j = i + len(list(same))
            if session_id is None:
                i = j
                continue
            if session_id not in sessions:
                observe(envelopes[i])
                i += 1
            if i < j:
                observe(envelopes[j - 1])
                if j - i > 1:
                    self._observed += j - i - 1
                    sessions[session_id].events += j - i - 1
            i = j

    def restore(
        self,
        summary: SessionSummary,
        *,
        stats: StreamingStats | None = None,
        context: ContextUsage | None = None,
    ) -> None:
        """Bring back a session an earlier daemon journaled, as the most recently active.

        Restore oldest first, before the first event. Nothing that was open
        (tool calls, permission requests, sub-agents) comes back, and an
        ``active`` session comes back ``idle``: its next event makes it
        active again. A session already known is left as it is.
        """
        sessions = self._sessions
        if summary.session_id in sessions:
            return
        if len(sessions) >= self._max_sessions:
            del sessions[next(iter(sessions))]
            self._evicted += 1
        state = SessionState(summary.session_id, summary.first_seq, summary.first_ts)
        state.last_seq = summary.last_seq
        state.last_ts = summary.last_ts
        state.events = summary.events
        state.status = _IDLE if summary.status == _ACTIVE else summary.status
        state.error = summary.error if state.status == _ERROR else None
        state.title = summary.title
        state.model = summary.model
        state.adapter = summary.adapter
        state.cwd = summary.cwd
        state.parent_session_id = summary.parent_session_id
        state.run_id = summary.run_id
        self._run_marks += summary.run_id is not None
        state.usage = summary.usage
        state.usage_by_model = dict(summary.usage_by_model)
        state.stats = stats
        state.context = context
        sessions[summary.session_id] = state
        self._last = summary.session_id

    def touched_since(self, seq: int) -> builtins.list[SessionState]:
        """The sessions with an event after ``seq``, most recently active first.

        Costs one step per session returned (plus one), however many are known.
        """
        out: builtins.list[SessionState] = []
        for state in reversed(self._sessions.values()):
            if state.last_seq <= seq:
                break
            out.append(state)
        return out

    def get(self, session_id: str) -> SessionState | None:
        """The live record of ``session_id``; treat it as read-only."""
        return self._sessions.get(session_id)

    def summary(self, session_id: str) -> SessionSummary | None:
        state = self._sessions.get(session_id)
        return None if state is None else state.summary()

    def snapshot(
        self, session_id: str, *, stats: StreamingStats | None = None
    ) -> SessionSnapshot | None:
        """The ``snapshot`` reply for ``session_id``, ``None`` for an unknown session.

        ``stats`` replaces the latest ``busd.stats`` seen; pass
        ``Accountant.session_stats(session_id, now)`` for a timer that is
        current to the moment of the request.
        """
        state = self._sessions.get(session_id)
        return None if state is None else state.snapshot(stats=stats)

    def statistics(self) -> SessionRegistryStatistics:
        counts = {_ACTIVE: 0, _IDLE: 0, _ERROR: 0}
        for state in self._sessions.values():
            counts[state.status] += 1
        return SessionRegistryStatistics(
            sessions=len(self._sessions),
            active=counts[_ACTIVE],
            idle=counts[_IDLE],
            error=counts[_ERROR],
            evicted=self._evicted,
            observed=self._observed,
        )

    def list(self, limit: int | None = None) -> builtins.list[SessionSummary]:
        """Summaries of the sessions, most recently active first, at most ``limit`` of them.

        Ten thousand summaries do not fit a 1 MiB frame: the server should
        pass a ``limit``.
        """
        out: builtins.list[SessionSummary] = []
        if limit is not None and limit <= 0:
            return out
        for state in reversed(self._sessions.values()):
            out.append(state.summary())
            if len(out) == limit:
                break
        return out
