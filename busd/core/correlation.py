"""Correlation: which run, and which sub-agent, each event belongs to.

The daemon asks :meth:`Correlator.route` about every event just before it is
published, and the bus stamps the answer on the envelope (``run_id``,
``agent_id``, ``stale``). The correlator learns while it answers: a session
start binds a session to a run, an agent start registers a sub-agent and the
tool call that spawned it, a tool start remembers which agent called the tool
so that its progress and completion (which SDKs often send without any agent
information) land in the same place.

The envelope's ``agent_id`` names the transcript an event belongs to: unset is
the main chat. For ``stream.agent.*`` events that is the agent *that spawned*
the sub-agent in the payload, so "started a sub-agent" shows where it
happened.

Pure and synchronous: no clocks, no I/O. Memory is bounded: a tool call is
forgotten when it completes, and a run with all it learned is forgotten once
``max_ended_runs`` runs have ended after it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final, Literal

import msgspec

from .errors import BusdError
from .events import (
    AgentComplete,
    AgentStart,
    AgentUpdate,
    Envelope,
    Event,
    PermissionRequested,
    RunFinished,
    RunStarted,
    SessionStart,
    ToolComplete,
    ToolPartialResult,
    ToolStart,
)

__all__ = [
    "CorrelationStatistics",
    "Correlator",
    "DuplicateRun",
    "EndStatus",
    "Route",
    "Run",
    "RunStatus",
    "UnknownRun",
]

RunStatus = Literal["active", "ok", "error", "cancelled", "timed_out", "superseded"]
"""``active`` until the run ends; ``superseded`` when a newer run took its session."""

EndStatus = Literal["ok", "error", "cancelled", "timed_out"]
"""How a run can be ended by its owner (the same values as ``busd.run.finished``)."""

_END_STATUSES: Final = frozenset(("ok", "error", "cancelled", "timed_out"))


class UnknownRun(BusdError, LookupError):
    """A run id the correlator never started, or has already forgotten."""


class DuplicateRun(BusdError, ValueError):
    """A run id that is already known (active or still remembered)."""


class Route(msgspec.Struct, frozen=True, gc=False):
    """Where an event belongs: what the bus stamps on its envelope.

    ``run_id`` is unset for events outside any run this daemon knows;
    ``agent_id`` is unset for the main agent; ``stale`` is true for events of
    a run that is no longer active (or a run id nobody started).
    """

    run_id: str | None = None
    agent_id: str | None = None
    stale: bool = False


class CorrelationStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """A snapshot of what the correlator holds, to check that memory stays bounded."""

    active_runs: int
    ended_runs: int
    """Ended runs still remembered (at most ``max_ended_runs``)."""
    owned_sessions: int
    agents: int
    open_tool_calls: int
    stale_events: int
    """Events routed as stale since the correlator was created."""


_UNOWNED: Final = Route()


class Run:
    """One agent run and what it owns.

    Only the :class:`Correlator` changes a run; treat every attribute as
    read-only. ``session_ids`` lists the sessions the run claimed, in order
    (a session later taken over by a newer run stays listed here).
    ``agents`` maps each sub-agent id to its parent agent id (``None`` when
    the main agent spawned it).
    """

    __slots__ = (
        "_agents",
        "_children",
        "_routes",
        "_spawns",
        "_tools",
        "agents",
        "request_id",
        "run_id",
        "session_ids",
        "status",
    )

    run_id: str
    request_id: str | None
    status: RunStatus
    session_ids: tuple[str, ...]
    agents: Mapping[str, str | None]

    def __init__(self, run_id: str, request_id: str | None = None) -> None:
        self.run_id = run_id
        self.request_id = request_id
        self.status = "active"
        self.session_ids = ()
        self._agents: dict[str, str | None] = {}
        self.agents = MappingProxyType(self._agents)
        # tool call id -> the sub-agent it spawned (announced or implicit)
        self._spawns: dict[str, str] = {}
        # open tool call id -> the agent that called it (None: main agent)
        self._tools: dict[str, str | None] = {}
        # child sessions, each an implicit sub-agent named by its session id
        self._children: set[str] = set()
        # agent id -> its Route while the status does not change
        self._routes: dict[str | None, Route] = {}

    @property
    def active(self) -> bool:
        return self.status == "active"

    def __repr__(self) -> str:
        return (
            f"<Run {self.run_id!r} {self.status} sessions={list(self.session_ids)!r}"
            f" agents={len(self._agents)} open_tool_calls={len(self._tools)}>"
        )


class Correlator:
    """Runs, the sessions and sub-agents they own, and stale-event detection.

    Only a run started here (or announced by a ``busd.run.started`` event
    carrying its run id) can own sessions; events of other sessions pass
    through with the agent information they carry and are never stale.
    """

    __slots__ = (
        "_active",
        "_by_request",
        "_by_session",
        "_ended",
        "_max_ended",
        "_runs",
        "_stale_events",
        "_waiting",
    )

    def __init__(self, *, max_ended_runs: int = 4096) -> None:
        if max_ended_runs < 0:
            raise ValueError(f"max_ended_runs must be >= 0, not {max_ended_runs}")
        self._max_ended = max_ended_runs
        self._runs: dict[str, Run] = {}  # active and remembered runs
        self._active: dict[str, Run] = {}  # in start order
        self._waiting: dict[str, Run] = {}  # active runs that have no session yet
        self._ended: deque[Run] = deque()  # oldest end first
        self._by_session: dict[str, Run] = {}  # session -> its latest run
        self._by_request: dict[str, Run] = {}
        self._stale_events = 0

    # -- runs ----------------------------------------------------------------

    def start_run(
        self, run_id: str, *, session_id: str | None = None, request_id: str | None = None
    ) -> Run:
        """Make ``run_id`` active, taking over ``session_id`` if given.

        A run still active on that session is superseded: from now on its
        events are stale. Without a session id the run waits for the first
        ``stream.session.start`` to name one.
        """
        if run_id in self._runs:
            raise DuplicateRun(f"run {run_id!r} is already known")
        run = Run(run_id, request_id)
        self._runs[run_id] = run
        self._active[run_id] = run
        if request_id is not None:
            self._by_request[request_id] = run
        if session_id is None:
            self._waiting[run_id] = run
        else:
            self._bind(run, session_id)
        return run

    def end_run(self, run_id: str, status: EndStatus = "ok") -> Run:
        """The run is no longer active; its later events are stale.

        Ending an ended (or superseded) run changes nothing: the first end
        wins. The run is remembered until ``max_ended_runs`` newer ends.
        """
        if status not in _END_STATUSES:
            raise ValueError(f"a run ends with one of {sorted(_END_STATUSES)}, not {status!r}")
        run = self._runs.get(run_id)
        if run is None:
            raise UnknownRun(f"no run {run_id!r} (never started, or forgotten)")
        if run.status == "active":
            self._end(run, status)
        return run

    def get_run(self, run_id: str) -> Run | None:
        """The run, active or ended and still remembered."""
        return self._runs.get(run_id)

    def run_for_request(self, request_id: str) -> Run | None:
        """The latest run started for a frontend's request id."""
        return self._by_request.get(request_id)

    def active_run(self, session_id: str) -> Run | None:
        """The run currently active on ``session_id``, if any."""
        run = self._by_session.get(session_id)
        return run if run is not None and run.status == "active" else None

    def runs(self) -> list[Run]:
        """The active runs, oldest first."""
        return list(self._active.values())

    def statistics(self) -> CorrelationStatistics:
        runs = self._runs.values()
        return CorrelationStatistics(
            active_runs=len(self._active),
            ended_runs=len(self._ended),
            owned_sessions=len(self._by_session),
            agents=sum(len(run._agents) for run in runs),
            open_tool_calls=sum(len(run._tools) for run in runs),
            stale_events=self._stale_events,
        )

    # -- envelopes -----------------------------------------------------------

    @staticmethod
    def is_owned(envelope: Envelope[Any]) -> bool:
        """The event belongs to an active run of this daemon.

        Decided from the stamped envelope alone, so a replayed envelope gets
        the answer it had when it was published.
        """
        return envelope.run_id is not None and not envelope.stale

    @staticmethod
    def for_main_chat(envelope: Envelope[Any]) -> bool:
        """The event belongs in the main transcript: the main agent's, and not stale."""
        return envelope.agent_id is None and not envelope.stale

    # -- routing -------------------------------------------------------------

    def route(
        self,
        event: Event,
        *,
        session_id: str | None = None,
        run_id: str | None = None,
        agent_id: str | None = None,
        parent_tool_call_id: str | None = None,
    ) -> Route:
        """Where ``event`` belongs; learns sessions, agents and tool calls from it.

        ``run_id`` and ``agent_id`` are what the source knows (an adapter the
        daemon runs passes its run id); ``parent_tool_call_id`` is the tool
        call that spawned the sub-agent emitting the event (Claude's
        ``parent_tool_use_id``). Never raises on odd input: an unknown run id
        is stale, an unknown session is not owned.
        """
        if type(event) in _LEARN_FROM:
            return self._learn(event, session_id, run_id, agent_id, parent_tool_call_id)
        # The hot path: text, thinking, usage, turns. Two dict lookups when
        # nothing changes, and the cached Route is returned as is.
        if run_id is not None:
            run = self._runs.get(run_id)
            if run is None:
                return self._unknown_run(run_id, agent_id, parent_tool_call_id)
            if session_id is not None and session_id not in run.session_ids:
                self._bind(run, session_id)
        elif session_id is not None:
            run = self._by_session.get(session_id)
            if run is None:
                return self._unowned(agent_id, parent_tool_call_id)
        else:
            return self._unowned(agent_id, parent_tool_call_id)
        if agent_id is None:
            if parent_tool_call_id is not None:
                agent_id = self._spawned(run, parent_tool_call_id)
            elif session_id in run._children:
                agent_id = session_id
        route = run._routes.get(agent_id)
        if route is None:
            route = self._new_route(run, agent_id)
        if route.stale:
            self._stale_events += 1
        return route

    def route_again(self, route: Route, times: int = 1) -> Route:
        """:meth:`route` ``times`` more for deltas from the place just routed, nothing between.

        The answer cannot have changed (deltas teach nothing): only the count
        of stale events moves. A publish frame's deltas ask once per place.
        """
        if route.stale:
            self._stale_events += times
        return route

    def _learn(
        self,
        event: Event,
        session_id: str | None,
        run_id: str | None,
        agent_id: str | None,
        parent_tool_call_id: str | None,
    ) -> Route:
        """``route`` for the few event types that teach the correlator something."""
        if parent_tool_call_id is None and isinstance(event, ToolStart):
            parent_tool_call_id = event.parent_tool_call_id
        informed = agent_id is not None or parent_tool_call_id is not None
        if isinstance(event, SessionStart):
            run = self._claim_session(event, session_id, run_id)
        else:
            if isinstance(event, RunStarted) and run_id is not None and run_id not in self._runs:
                self.start_run(run_id, session_id=session_id, request_id=event.request_id)
            run = self._resolve(session_id, run_id)
        if run is None:
            if run_id is not None:
                return self._unknown_run(run_id, agent_id, parent_tool_call_id)
            return self._unowned(agent_id, parent_tool_call_id)

        if agent_id is None:
            if parent_tool_call_id is not None:
                agent_id = self._spawned(run, parent_tool_call_id)
            elif session_id in run._children:
                agent_id = session_id

        tools = run._tools
        if isinstance(event, ToolStart):
            tools[event.tool_call_id] = agent_id
        elif isinstance(event, ToolComplete):
            if event.tool_call_id in tools:
                caller = tools.pop(event.tool_call_id)
                if not informed:
                    agent_id = caller
        elif isinstance(event, ToolPartialResult | PermissionRequested):
            call = event.tool_call_id
            if not informed and call is not None and call in tools:
                agent_id = tools[call]
        elif isinstance(event, AgentStart):
            agent_id = self._register_agent(run, event, agent_id)
        elif isinstance(event, AgentUpdate | AgentComplete):
            about = event.agent_id
            if about in run._agents:
                agent_id = run._agents[about]
            elif agent_id == about:
                agent_id = None
        elif isinstance(event, RunFinished) and run_id is not None:
            # The run's closing record is never stale: it is how frontends
            # learn the run ended, whoever recorded the end first.
            closing = Route(run.run_id, agent_id, False)
            if run.status == "active":
                self._end(run, event.status)
            return closing

        route = run._routes.get(agent_id)
        if route is None:
            route = self._new_route(run, agent_id)
        if route.stale:
            self._stale_events += 1
        return route

    # -- internals -----------------------------------------------------------

    def _resolve(self, session_id: str | None, run_id: str | None) -> Run | None:
        if run_id is not None:
            run = self._runs.get(run_id)
            if run is not None and session_id is not None and session_id not in run.session_ids:
                self._bind(run, session_id)
            return run
        if session_id is not None:
            return self._by_session.get(session_id)
        return None

    def _claim_session(
        self, event: SessionStart, session_id: str | None, run_id: str | None
    ) -> Run | None:
        """The run a ``stream.session.start`` belongs to, binding the session to it."""
        parent_session = event.parent_session_id
        if run_id is not None:
            run = self._runs.get(run_id)
            if run is not None and session_id is not None and session_id not in run.session_ids:
                child = parent_session is not None and parent_session in run.session_ids
                self._bind(run, session_id, parent_session if child else None)
            return run
        if session_id is None:
            return None
        owner = self._by_session.get(session_id)
        if owner is not None and owner.status == "active":
            return owner
        parent = self._by_session.get(parent_session) if parent_session is not None else None
        if parent is not None:
            self._bind(parent, session_id, parent_session)
        elif len(self._waiting) == 1:
            self._bind(next(iter(self._waiting.values())), session_id)
        return self._by_session.get(session_id)

    def _bind(self, run: Run, session_id: str, parent_session: str | None = None) -> None:
        """Give ``session_id`` to ``run``; a child session becomes an implicit sub-agent.

        An active run takes the session from anyone (superseding an active
        owner); an ended run only takes a session nobody owns, so that its
        late events are still recognized as stale.
        """
        owner = self._by_session.get(session_id)
        if owner is run:
            return
        if run.status != "active":
            if owner is not None:
                return
        elif owner is not None and owner.status == "active":
            self._end(owner, "superseded")
        self._by_session[session_id] = run
        run.session_ids += (session_id,)
        self._waiting.pop(run.run_id, None)
        if parent_session is not None:
            run._children.add(session_id)
            parent_agent = parent_session if parent_session in run._children else None
            run._agents.setdefault(session_id, parent_agent)

    def _end(self, run: Run, status: RunStatus) -> None:
        run.status = status
        run._routes.clear()
        del self._active[run.run_id]
        self._waiting.pop(run.run_id, None)
        self._ended.append(run)
        while len(self._ended) > self._max_ended:
            self._forget(self._ended.popleft())

    def _forget(self, run: Run) -> None:
        del self._runs[run.run_id]
        for session_id in run.session_ids:
            if self._by_session.get(session_id) is run:
                del self._by_session[session_id]
        request_id = run.request_id
        if request_id is not None and self._by_request.get(request_id) is run:
            del self._by_request[request_id]

    def _spawned(self, run: Run, tool_call_id: str) -> str:
        """The sub-agent spawned by ``tool_call_id``; an implicit one if none was announced."""
        agent = run._spawns.get(tool_call_id)
        if agent is None:
            agent = run._spawns[tool_call_id] = tool_call_id
            if agent not in run._agents:
                # Its parent is whoever called the spawning tool, if we saw that.
                run._agents[agent] = run._tools.get(tool_call_id)
        return agent

    def _register_agent(self, run: Run, event: AgentStart, emitter: str | None) -> str | None:
        """Register the announced sub-agent; returns its parent (where the event belongs)."""
        about = event.agent_id
        parent = event.parent_agent_id
        if parent is None:
            parent = emitter
            if parent is None and event.tool_call_id is not None:
                parent = run._tools.get(event.tool_call_id)
        if parent == about:
            parent = None
        run._agents[about] = parent
        if parent is not None and parent not in run._agents:
            run._agents[parent] = None
        if event.tool_call_id is not None:
            # An announcement wins over an implicit agent from then on.
            run._spawns[event.tool_call_id] = about
        return parent

    def _new_route(self, run: Run, agent_id: str | None) -> Route:
        if agent_id is not None and agent_id not in run._agents:
            run._agents[agent_id] = None
        route = run._routes[agent_id] = Route(run.run_id, agent_id, run.status != "active")
        return route

    def _unknown_run(
        self, run_id: str, agent_id: str | None, parent_tool_call_id: str | None
    ) -> Route:
        self._stale_events += 1
        return Route(run_id, agent_id if agent_id is not None else parent_tool_call_id, True)

    @staticmethod
    def _unowned(agent_id: str | None, parent_tool_call_id: str | None) -> Route:
        if agent_id is None:
            if parent_tool_call_id is None:
                return _UNOWNED
            agent_id = parent_tool_call_id
        return Route(None, agent_id, False)


_LEARN_FROM: Final[frozenset[type[Event]]] = frozenset(
    (
        SessionStart,
        ToolStart,
        ToolPartialResult,
        ToolComplete,
        PermissionRequested,
        AgentStart,
        AgentUpdate,
        AgentComplete,
        RunStarted,
        RunFinished,
    )
)
