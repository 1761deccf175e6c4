"""Runs: busd driving an SDK itself, one run per session at a time.

``start_run`` picks the driver it names, or the one named like the adapter
(the built-in ``replay`` driver pairs with any adapter), gives the run an id
and a session (a new one, or the session to continue), answers at once and
runs the driver in the daemon's nursery. Every raw event the driver feeds is
translated by the paired adapter and published with the run's id and busd's
session id. A run ends one of four ways, always with ``busd.run.finished``
and its summary (status, duration, usage, cost, thinking time, tool metrics,
context window): ``ok``; ``error`` (the driver raised: a
``stream.session.error`` says why); ``cancelled`` (``cancel_run``: Trio
cancellation plus the SDK's own interrupt; partial text is kept, marked
stopped; pending permissions are resolved cancelled); ``timed_out`` (the
watchdog saw no event for ``watchdog`` seconds).

A run may carry its starter's permission rules (``permission_rules``): the
broker decides the run's requests by them right after the daemon's own
rules and before any frontend is asked (:mod:`busd.daemon.broker`).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import msgspec
import trio

from ..core.accounting import Accountant
from ..core.errors import BusdError
from ..core.events import (
    Envelope,
    Event,
    PermissionRequested,
    PermissionResolved,
    RunCancelled,
    RunFinished,
    RunStarted,
    SessionError,
    TextDelta,
    ThinkingDelta,
    TokenUsage,
    Usage,
)
from ..core.permissions import PermissionRule
from ..core.toolmetrics import ToolTracker
from ..core.usage import add_usage, tokens_minus
from ..plugins.adapters import Adapter, Emitted, Translator
from ..plugins.drivers import Driver, PermissionDecision, RunRequest
from ..plugins.host import PluginHost
from .broker import PermissionBroker

__all__ = ["RunHost", "RunManager", "RunRejected", "RunState", "scoped_request_id"]


class RunHost(PluginHost, Protocol):
    """What a run may ask of the daemon: a plugin's view, plus adapters, accounting, a nursery.

    A Protocol so that runs never import the hub that creates them.
    """

    @property
    def adapters(self) -> Mapping[str, Adapter]: ...

    @property
    def accountant(self) -> Accountant: ...

    @property
    def nursery(self) -> trio.Nursery: ...

    def publish_emitted(
        self, emitted: Emitted, *, source: str, run_id: str | None = None
    ) -> Envelope[Event] | None: ...


def scoped_request_id(run_id: str, request_id: str) -> str:
    """SDKs number permission requests per session or connection; busd's ids are per run."""
    return f"{run_id}/{request_id}"


logger = logging.getLogger("busd.runs")
_NOTHING_FOR_TOOLS: frozenset[type[Event]] = frozenset({TextDelta, ThinkingDelta})
"""Event types :meth:`ToolTracker.observe` ignores: a run of them is passed over whole."""

Status = Literal["running", "ok", "error", "cancelled", "timed_out"]


class RunRejected(BusdError):
    """A run command the daemon refuses (``code`` says why, for the reply)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(eq=False)
class RunState:
    """One run: what was asked, how it is going, how to stop it."""

    run_id: str
    request: RunRequest
    driver: Driver
    translator: Translator
    started_by: str
    started_at: float
    request_id: str | None = None
    """The frontend's own id for the run (``start_run``), echoed on every ``busd.run.*``."""
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    status: Status = "running"
    cancelled_by: str | None = None
    last_activity: float = 0.0
    usage_before: TokenUsage = field(default_factory=TokenUsage)
    models_before: dict[str, TokenUsage] = field(default_factory=dict)
    cost_reported: bool = False  # a stream.usage of the run's main agent carried a cost
    tools: ToolTracker = field(default_factory=ToolTracker)
    sdk_session: str | None = None
    waiting_for_people: int = 0
    """Permission requests in flight: the agent is not silent, a person is."""
    reported_error: bool = False
    """The stream already said what went wrong (no second session error)."""
    done: trio.Event = field(default_factory=trio.Event)
    permission_rules: tuple[PermissionRule, ...] = ()
    """The starter's rules for this run's permission requests (``start_run``)."""

    def summary(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "session_id": self.request.session_id,
            "adapter": self.request.adapter,
            "driver": self.driver.name,
            "status": self.status,
            "started_by": self.started_by,
        }


class _Context:
    """The RunContext a driver gets (see busd.drivers)."""

    def __init__(self, manager: RunManager, state: RunState) -> None:
        self._manager = manager
        self._state = state
        self.request = state.request
        self.run_id = state.run_id

    def feed(self, raw: object) -> list[Event]:
        state = self._state
        return self._manager._feed(state, state.translator.feed(raw, trio.current_time()))

    async def request_permission(self, request: PermissionRequested) -> PermissionDecision:
        state = self._state
        state.last_activity = trio.current_time()
        scoped = request
        if not request.request_id.startswith(f"{state.run_id}/"):  # not as feed() returned it
            scoped = msgspec.structs.replace(
                request, request_id=scoped_request_id(state.run_id, request.request_id)
            )
        state.waiting_for_people += 1
        try:
            decision = await self._manager.broker.request(
                scoped, session_id=state.request.session_id, run_id=state.run_id
            )
        finally:
            state.waiting_for_people -= 1
            state.last_activity = trio.current_time()
        await trio.lowlevel.checkpoint_if_cancelled()  # a cancelled run's driver stops here
        return decision

    def publish(self, event: Event) -> None:
        self._manager._feed(self._state, [Emitted(event)])

    def set_sdk_session(self, sdk_session_id: str) -> None:
        self._state.sdk_session = sdk_session_id
        self._manager._sdk_sessions[self._state.request.session_id] = sdk_session_id


class RunManager:
    """Starts, watches, cancels and sums up driven runs."""

    def __init__(
        self,
        daemon: RunHost,
        drivers: dict[str, Driver],
        broker: PermissionBroker,
        *,
        watchdog: float = 300.0,
    ) -> None:
        self.daemon = daemon
        self.drivers = drivers
        self.broker = broker
        self.watchdog = watchdog
        self._runs: dict[str, RunState] = {}
        self._active_by_session: dict[str, str] = {}
        self._sdk_sessions: dict[str, str] = {}
        self._driven: set[str] = set()  # every session a run of ours has had
        self._taken = 0  # runs started and sessions taken: see authority_epoch
        self._started: dict[str, set[str]] = {}  # who started them: identity -> run ids
        daemon.bus.on_all(self._observe, many=self._observe_many)

    # -- commands -------------------------------------------------------------------

    def start(
        self,
        *,
        adapter: str,
        prompt: str,
        started_by: str,
        session_id: str | None = None,
        request_id: str | None = None,
        model: str | None = None,
        system_prompt: str | None = None,
        cwd: str | None = None,
        permission_mode: str | None = None,
        max_turns: int | None = None,
        options: dict[str, Any] | None = None,
        driver: str | None = None,
        permission_rules: Sequence[PermissionRule] = (),
        env: Mapping[str, str] | None = None,
    ) -> RunState:
        """Validate and launch a run; returns at once (events follow on the bus).

        ``driver`` names the driver; by default it is the one named like the adapter.
        ``permission_rules`` decide the run's requests in ``started_by``'s name,
        before any frontend is asked (already valid: they are
        :class:`PermissionRule` structs, checked as they were decoded).
        """
        loaded = ", ".join(sorted(self.drivers)) or "none"
        if driver is not None:
            chosen = self.drivers.get(driver)
            if chosen is None:
                raise RunRejected("unknown_driver", f"no driver {driver!r} (loaded: {loaded})")
        else:
            chosen = self.drivers.get(adapter)
            if chosen is None:
                if adapter in self.daemon.adapters:
                    why = f"adapter {adapter!r} has no driver: busd translates its streams only"
                else:
                    adapters = ", ".join(sorted(self.daemon.adapters)) or "none"
                    why = f"no adapter {adapter!r} (adapters loaded: {adapters})"
                raise RunRejected("unknown_adapter", f"{why}; drivers loaded: {loaded}")
        paired: Adapter | None = self.daemon.adapters.get(adapter)
        if paired is None:
            adapters = ", ".join(sorted(self.daemon.adapters)) or "none"
            raise RunRejected(
                "unknown_adapter",
                f"no adapter {adapter!r} to translate driver {chosen.name!r} (loaded: {adapters})",
            )
        if session_id is not None and session_id in self._active_by_session:
            busy = self._active_by_session[session_id]
            raise RunRejected(
                "session_busy", f"session {session_id!r} already has run {busy!r} in progress"
            )
        run_id = f"run-{uuid.uuid4().hex[:12]}"
        session = session_id or f"sess-{uuid.uuid4().hex[:12]}"
        request = RunRequest(
            adapter=adapter,
            prompt=prompt,
            session_id=session,
            resume=self._sdk_sessions.get(session),
            model=model or chosen.default_model or None,
            system_prompt=system_prompt,
            cwd=cwd,
            permission_mode=permission_mode,
            max_turns=max_turns,
            options=options or {},
            env=None if env is None else dict(env),
        )
        now = trio.current_time()
        snapshot = self.daemon.sessions.snapshot(session)
        state = RunState(
            run_id=run_id,
            request=request,
            driver=chosen,
            translator=paired.translator(session_id=session),
            started_by=started_by,
            started_at=now,
            request_id=request_id,
            last_activity=now,
            usage_before=(snapshot.usage if snapshot is not None else None) or TokenUsage(),
            models_before=dict(snapshot.usage_by_model) if snapshot is not None else {},
            permission_rules=tuple(permission_rules),
        )
        self.broker.bind_run(run_id, state.permission_rules, by=started_by)
        self._runs[run_id] = state
        self._active_by_session[session] = run_id
        self._driven.add(session)
        self._taken += 1
        self.started_by(started_by).add(run_id)
        self.daemon.correlator.start_run(run_id, session_id=session, request_id=request_id)
        self.daemon.publish(
            RunStarted(adapter=adapter, model=request.model, request_id=request_id, prompt=prompt),
            session_id=session,
            run_id=run_id,
            source=f"run/{adapter}",
        )
        self.daemon.nursery.start_soon(self._run, state)
        return state

    def cancel(self, run_id: str, *, by: str, reason: str | None = None) -> RunState:
        state = self._runs.get(run_id)
        if state is None:
            raise RunRejected("unknown_run", f"no run {run_id!r}")
        if state.status != "running":
            raise RunRejected("run_finished", f"run {run_id!r} already ended ({state.status})")
        if state.cancelled_by is None:
            state.cancelled_by = by
            self.daemon.publish(
                RunCancelled(by=by, reason=reason, request_id=state.request_id),
                session_id=state.request.session_id,
                run_id=run_id,
                source=f"run/{state.request.adapter}",
            )
            self.broker.cancel_run(run_id)  # before the driver hears of it
            state.scope.cancel()
        return state

    def runs(self) -> list[dict[str, Any]]:
        return [state.summary() for state in self._runs.values()]

    def started_by(self, identity: str) -> set[str]:
        """The ids of the runs ``identity`` started, a set that grows as it starts more.

        ``owned_only`` subscriptions hold it: a client that reconnects (same
        name, same process) still owns its runs.
        """
        return self._started.setdefault(identity, set())

    def _had_run(self, session_id: str) -> bool:
        state = self.daemon.sessions.get(session_id)
        return state is not None and state.run_id is not None

    @property
    def authority_epoch(self) -> int:
        """Changes whenever :meth:`authority` may refuse a place it allowed before.

        A place (session, run) becomes the daemon's when a run of ours starts
        there or when a session gets a run id; nothing ever gives one back
        while the daemon runs. A connection may keep the places it was
        allowed while this is unchanged (:class:`busd.daemon.authority.Vetted`).
        """
        return self._taken + self.daemon.sessions.run_marks

    def authority(
        self, event: Event | None, *, session_id: str | None, run_id: str | None
    ) -> str | None:
        """Why a client may not publish ``event`` there (``None``: it may).

        The daemon is the only publisher of the runs it drives: their runs,
        their sessions (for good: a continued session is driven again) and
        their permission requests, wherever a forger would put them. A
        session that has had a run is one (only the daemon, or a bridged
        daemon, publishes ``busd.run.*``), so this holds across restarts.
        """
        if run_id is not None and run_id in self._runs:
            return f"run {run_id!r} is driven by busd: only the daemon publishes its events"
        if session_id is not None and (session_id in self._driven or self._had_run(session_id)):
            return f"session {session_id!r} is driven by busd: only the daemon publishes into it"
        if isinstance(event, PermissionRequested | PermissionResolved):
            owner = event.request_id.partition("/")[0]
            if owner in self._runs or self.broker.knows(event.request_id):
                return (
                    f"permission request {event.request_id!r} belongs to a run busd drives: "
                    "answer it with permission_reply"
                )
        return None

    def get(self, run_id: str) -> RunState | None:
        return self._runs.get(run_id)

    # -- the run itself -------------------------------------------------------------

    async def _run(self, state: RunState) -> None:
        context = _Context(self, state)
        error: str | None = None
        with state.scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watchdog, state, nursery.cancel_scope)
                try:
                    await state.driver.run(context)
                    state.status = "cancelled" if state.cancelled_by else "ok"
                except Exception as exc:  # the agent failed; the daemon carries on
                    error = failure(exc)
                    # One line: the run's own events say why; the traceback is for debugging.
                    logger.warning("run %s failed: %s", state.run_id, error.partition("\n")[0])
                    logger.debug("run %s failed", state.run_id, exc_info=exc)
                    state.status = "error"
                nursery.cancel_scope.cancel()
        if state.status == "running":
            state.status = "cancelled"
        elif state.status == "timed_out":
            error = f"no event from the agent for {self.watchdog:g}s: stopped by the watchdog"
        self._finish(state, error)

    async def _watchdog(self, state: RunState, run_scope: trio.CancelScope) -> None:
        while True:
            deadline = state.last_activity + self.watchdog
            await trio.sleep_until(deadline)
            if state.waiting_for_people:
                state.last_activity = trio.current_time()  # waiting on a person, not the agent
                continue
            if trio.current_time() >= state.last_activity + self.watchdog:
                state.status = "timed_out"
                state.scope.cancel()
                return

    def _feed(self, state: RunState, emitted: list[Any]) -> list[Event]:
        """Publish what the adapter made of one raw event; returns the events published."""
        state.last_activity = trio.current_time()
        source = f"run/{state.request.adapter}"
        published: list[Event] = []
        for item in emitted:
            event = item.event
            if isinstance(event, PermissionRequested | PermissionResolved):
                request_id = scoped_request_id(state.run_id, event.request_id)
                if type(event) is PermissionResolved and self.broker.is_resolved(request_id):
                    continue  # the broker already published who decided
                event = msgspec.structs.replace(event, request_id=request_id)
            elif type(event) is Usage and not item.agent_id:
                if event.tokens.cost_usd is not None:
                    state.cost_reported = True
                if not state.translator.usage_spans_runs:
                    event = _continued(event, state, cost_spans=state.translator.cost_spans_runs)
            envelope = self.daemon.publish_emitted(
                msgspec.structs.replace(item, event=event, session_id=state.request.session_id),
                source=source,
                run_id=state.run_id,
            )
            if envelope is not None:
                published.append(envelope.event)
                if type(envelope.event) is PermissionRequested:
                    self.broker.expect(envelope)  # answerable from now, before the driver asks
        return published

    def _finish(self, state: RunState, error: str | None) -> None:
        session = state.request.session_id
        source = f"run/{state.request.adapter}"
        now = trio.current_time()
        if error is not None and (state.status == "timed_out" or not state.reported_error):
            self.daemon.publish(
                SessionError(message=error), session_id=session, run_id=state.run_id, source=source
            )
        self._feed(state, state.translator.finish(now))  # stopped text, idle, ...
        self.broker.cancel_run(state.run_id)
        self.broker.release_run(state.run_id)
        stats = self.daemon.accountant.stats.run_stats(state.run_id, now)
        snapshot = self.daemon.sessions.snapshot(session)
        context = self.daemon.accountant.context.get(session)
        usage = _minus(
            (snapshot.usage if snapshot is not None else None) or TokenUsage(), state.usage_before
        )
        if not state.cost_reported:  # the run said nothing of cost: unknown, not free
            usage = msgspec.structs.replace(usage, cost_usd=None)
        cut = _cut_estimate(self.daemon.accountant, state)
        if cut:
            usage = msgspec.structs.replace(usage, output_tokens=usage.output_tokens + cut)
        self.daemon.publish(
            RunFinished(
                status=state.status,  # type: ignore[arg-type]
                duration_s=round(now - state.started_at, 6),
                usage=usage,
                output_estimated=cut > 0,
                models=_per_model(
                    snapshot.usage_by_model if snapshot is not None else {}, state.models_before
                ),
                thinking_s=stats.thinking_s if stats is not None else 0.0,
                tools=state.tools.metrics(),
                context=context.snapshot() if context is not None else None,
                error=error,
                request_id=state.request_id,
            ),
            session_id=session,
            run_id=state.run_id,
            source=source,
        )
        self.daemon.correlator.end_run(
            state.run_id,
            "ok" if state.status == "ok" else state.status,  # type: ignore[arg-type]
        )
        if self._active_by_session.get(session) == state.run_id:
            del self._active_by_session[session]
        state.done.set()

    def _observe_many(self, envelopes: list[Envelope[Event]]) -> None:
        """:meth:`_observe` of each of a run of one type: deltas tell a run's tools nothing."""
        if type(envelopes[0].event) not in _NOTHING_FOR_TOOLS:
            for envelope in envelopes:
                self._observe(envelope)

    def _observe(self, envelope: Envelope[Event]) -> None:
        run_id = envelope.run_id
        if run_id is None:
            return
        state = self._runs.get(run_id)
        if state is not None:
            state.tools.observe(envelope, trio.current_time())
            if type(envelope.event) is SessionError:
                state.reported_error = True


def _cut_estimate(accountant: Accountant, state: RunState) -> int:
    """The output of a run cut short that no count covers: the live estimate of it.

    A run that did not end ``ok`` (cancelled mid-answer, timed out) may have
    streamed output after the last count its agent reported, and no count
    will ever come for it: the summary adds the accountant's estimate of it,
    as the live line showed it. A run that ended ``ok`` takes its agents'
    counts as they are (what a live estimate still holds then is output
    those counts cover), and a run with no count at all keeps an empty usage,
    for frontends to show the live figure. The run's own tracker counts from
    the session's figure when the run began: an earlier run's estimate stays
    that run's.
    """
    tracker = accountant.stats.run(state.run_id)
    if state.status == "ok" or tracker is None or tracker.statistics().reports == 0:
        return 0
    return max(0, tracker.output_tokens - tracker.authoritative_output_tokens)


def _per_model(
    after: dict[str, TokenUsage], before: dict[str, TokenUsage]
) -> dict[str, TokenUsage]:
    """This run's share per model: each model's gain; the models that gained nothing left out."""
    share = {
        model: _minus(tokens, before.get(model, TokenUsage())) for model, tokens in after.items()
    }
    return {model: tokens for model, tokens in share.items() if _gained(tokens)}


def _gained(usage: TokenUsage) -> bool:
    return bool(
        usage.input_tokens
        or usage.output_tokens
        or usage.reasoning_tokens
        or usage.cache_read_tokens
        or usage.cache_write_tokens
        or usage.cost_usd
    )


def _continued(usage: Usage, state: RunState, *, cost_spans: bool = False) -> Usage:
    """The session's running total: what the session had before this run, plus the run's.

    Every run starts a new translator (and often a new SDK process), which
    counts from zero; ``stream.usage`` is the session's total, so a continued
    session's second run must not read as less than its first. ``cost_spans``:
    the reported cost is the session's already (:attr:`Translator.cost_spans_runs`).
    """
    if state.usage_before == TokenUsage() and not state.models_before:
        return usage
    total = add_usage(state.usage_before, usage.tokens)
    if cost_spans and usage.tokens.cost_usd is not None:
        total = msgspec.structs.replace(total, cost_usd=usage.tokens.cost_usd)
    models = {
        model: add_usage(state.models_before.get(model, TokenUsage()), tokens)
        for model, tokens in usage.models.items()
    }
    for model, before in state.models_before.items():
        models.setdefault(model, before)
    return msgspec.structs.replace(usage, tokens=total, models=models)


def _minus(after: TokenUsage, before: TokenUsage) -> TokenUsage:
    """This run's share of a session's running totals."""
    cost: float | None = None
    if after.cost_usd is not None:
        cost = max(0.0, after.cost_usd - (before.cost_usd or 0.0))
    return msgspec.structs.replace(tokens_minus(after, before), cost_usd=cost)


def failure(exc: BaseException) -> str:
    """``Type: message`` of why a run failed, through groups of one (a driver's nursery)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"
