"""The permission broker: decides the requests of the runs busd drives, policy first.

A driver's request is decided in a fixed, documented order:

1. plugins (``busd_permission_policy``, first non-``None`` answer);
2. the daemon's rules, first match wins (tool-name glob, category,
   annotations, command pattern → ``allow`` / ``deny`` / ``ask``);
3. the run's rules, given by whoever started it (``start_run``'s
   ``permission_rules``, :meth:`PermissionBroker.bind_run`), first match
   wins: published ``by`` the starter's identity with the rule's
   ``reason``. They decide as the request is published, before any
   frontend sees it, so ``busd run --deny Write`` binds even with a
   frontend that answers at once. A run's rule never overrides a daemon
   rule that decided; a daemon ``ask`` leaves the request to the run's
   rules, then people (the starter may answer it anyway: the right to
   ``start_run`` comes with ``permission_reply``);
4. the attached frontends: the first valid ``permission_reply`` wins, later
   ones get ``already_resolved``;
5. nobody answered within the timeout: denied, ``by: "timeout"``, with the
   reason on the bus. ``busd serve`` waits :data:`DEFAULT_PERMISSION_TIMEOUT`
   (its flag and config file say otherwise; ``None`` waits for ever): an
   unattended run is not left waiting for a person who is not there, since
   the run watchdog pauses while one is asked.

An agent busd does not drive (a Claude Code hook) asks the same broker with
``ask_permission`` (:meth:`PermissionBroker.ask`): policy, rules, then
frontends decide as above (it has no run, so no run rules), but nobody
answering in time leaves the decision to the agent (``None``: the reply
says ``unanswered``), and an asker that goes away withdraws its request
(resolved ``cancelled``).

Every request is published as ``stream.permission.requested`` (once, even if
the adapter already published it from the raw stream) and every decision as
``stream.permission.resolved``, saying who decided.

The rules and the decision type are pure (:mod:`busd.core.permissions`);
the broker waits for people, so it lives in the daemon.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Final, Literal

import trio

from ..core.events import Envelope, Event, PermissionRequested, PermissionResolved
from ..core.permissions import (
    PermissionDecision,
    PermissionRejected,
    PermissionRule,
    decision_for,
    match_rule,
)

__all__ = ["DEFAULT_PERMISSION_TIMEOUT", "Asked", "PermissionBroker"]

DEFAULT_PERMISSION_TIMEOUT: Final = 300.0
"""Seconds a driven run's request waits for a person before it is denied (``busd serve``).

As long as the run watchdog's default: time for someone at a screen to read
the card and decide, and a bound for a run nobody watches.
"""


class _Pending:
    __slots__ = ("decision", "done", "request", "run_id", "session_id")

    def __init__(self, request: PermissionRequested, session_id: str, run_id: str | None) -> None:
        self.request = request
        self.session_id = session_id
        self.run_id = run_id
        self.done = trio.Event()
        self.decision: PermissionDecision | None = None


Publish = Callable[..., Envelope[Event]]
Policy = Callable[[PermissionRequested, Envelope[Event]], str | None]


class PermissionBroker:
    """Decides the permission requests of driven runs and publishes every decision."""

    def __init__(
        self,
        publish: Publish,
        *,
        policy: Policy | None = None,
        rules: Sequence[PermissionRule] = (),
        timeout: float | None = None,
        remember: int = 4096,
    ) -> None:
        self._publish = publish
        self._policy = policy
        self.rules = list(rules)
        self.timeout = timeout
        self._pending: dict[str, _Pending] = {}
        self._run_rules: dict[str, tuple[str, tuple[PermissionRule, ...]]] = {}
        self._published: OrderedDict[str, None] = OrderedDict()  # request ids seen on the bus
        self._resolved: OrderedDict[str, PermissionDecision] = OrderedDict()
        self._remember = remember

    # -- the runs' own rules ------------------------------------------------------------

    def bind_run(self, run_id: str, rules: Sequence[PermissionRule], *, by: str) -> None:
        """Decide ``run_id``'s requests by ``rules`` (after policy and the daemon's rules).

        ``by`` is the identity of the client that started the run: its rules
        decide in its name.
        """
        if rules:
            self._run_rules[run_id] = (by, tuple(rules))

    def release_run(self, run_id: str) -> None:
        """The run ended: forget its rules."""
        self._run_rules.pop(run_id, None)

    # -- seen on the bus (the daemon calls this for every requested event) ------

    def saw_request(self, request_id: str) -> None:
        self._remember_id(self._published, request_id, None)

    # -- the driver's side ----------------------------------------------------------

    def expect(self, envelope: Envelope[Any]) -> None:
        """A driven run's request is on the bus: decide it by policy and rules, or let people.

        Called as the run publishes it, before its driver asks (some SDKs
        announce a request on their event stream before they call back for
        the answer): an answer given as soon as a frontend shows the card is
        taken, not refused. :meth:`request` then returns the decision, or
        waits for it.
        """
        request, session_id, run_id = envelope.event, envelope.session_id, envelope.run_id
        assert isinstance(request, PermissionRequested)
        assert session_id is not None
        assert run_id is not None
        request_id = request.request_id
        if request_id in self._pending or request_id in self._resolved:
            return
        pending = _Pending(request, session_id, run_id)
        self._pending[request_id] = pending
        decision = self._decide_by_policy(request, envelope)
        if decision is not None:
            self._resolve(pending, decision)

    async def request(
        self,
        request: PermissionRequested,
        *,
        session_id: str,
        run_id: str,
        agent_id: str | None = None,
    ) -> PermissionDecision:
        """Decide ``request`` for a driven run: policy, rules, then people."""
        request_id = request.request_id
        if request_id in self._resolved:
            self._pending.pop(request_id, None)
            return self._resolved[request_id]
        if request_id not in self._pending:
            envelope: Envelope[Any]
            if request_id in self._published:
                envelope = Envelope(0, 0.0, request, session_id, run_id, agent_id)
            else:
                envelope = self._publish(
                    request, session_id=session_id, run_id=run_id, agent_id=agent_id
                )
            self.expect(envelope)
        pending = self._pending[request_id]
        try:
            if pending.decision is None:
                with trio.move_on_after(self.timeout if self.timeout is not None else float("inf")):
                    await pending.done.wait()
            if pending.decision is None:
                self._resolve(
                    pending,
                    decision_for(
                        request,
                        allow=False,
                        by="timeout",
                        reason=f"nobody answered within {self.timeout}s",
                    ),
                )
        finally:
            self._pending.pop(request_id, None)
        assert pending.decision is not None
        return pending.decision

    def _decide_by_policy(
        self, request: PermissionRequested, envelope: Envelope[Event]
    ) -> PermissionDecision | None:
        if self._policy is not None:
            verdict = self._policy(request, envelope)
            if verdict in ("allow", "deny"):
                return decision_for(request, allow=verdict == "allow", by="policy")
        found = match_rule(self.rules, request)
        if found is not None:
            index, rule = found
            if rule.action != "ask":
                return decision_for(
                    request, allow=rule.action == "allow", by=f"rule:{index}", reason=rule.reason
                )
        bound = self._run_rules.get(envelope.run_id or "")
        if bound is not None:
            starter, rules = bound
            found = match_rule(rules, request)
            if found is not None:
                index, rule = found
                if rule.action != "ask":
                    reason = rule.reason or f"rule {index} of the run: {rule.action}"
                    return decision_for(
                        request, allow=rule.action == "allow", by=starter, reason=reason
                    )
        return None

    # -- an agent busd does not drive (ask_permission) ----------------------------------

    def ask(
        self,
        request: PermissionRequested,
        *,
        session_id: str,
        agent_id: str | None,
        source: str,
        people: bool = True,
    ) -> Asked:
        """Publish ``request`` for an agent's hook; policy and rules may decide it at once.

        Without a decision, it waits for the frontends (:meth:`Asked.wait`),
        or, with ``people=False`` (no connection that may answer is there),
        it is left to the agent at once. The caller makes sure
        ``request.request_id`` is new (daemon/authority.py).
        """
        pending = _Pending(request, session_id, None)
        self._pending[request.request_id] = pending
        asked = Asked(self, pending)
        try:
            envelope = self._publish(
                request, session_id=session_id, agent_id=agent_id, source=source
            )
            decision = self._decide_by_policy(request, envelope)
        except BaseException:
            asked.withdraw()
            raise
        if decision is not None:
            self._resolve(pending, decision)
        elif not people:
            asked.unanswered("busd", "no frontend is connected to answer: the agent decides")
        return asked

    # -- the frontends' side ----------------------------------------------------------

    def reply(
        self,
        request_id: str,
        *,
        by: str,
        option_id: str | None = None,
        allow: bool | None = None,
        reason: str | None = None,
    ) -> PermissionDecision:
        """A frontend's answer; the first valid one wins.

        A request stays pending until its driver's task wakes up, so one
        decided a moment ago (two answers in one read) is told apart by its
        decision, not by where it is kept.
        """
        pending = self._pending.get(request_id)
        if pending is None or pending.decision is not None:
            if request_id in self._resolved:
                earlier = self._resolved[request_id]
                raise PermissionRejected(
                    "already_resolved",
                    f"{request_id!r} was already {earlier.outcome} by {earlier.by}",
                )
            if request_id in self._published:
                raise PermissionRejected(
                    "unknown_request",
                    f"{request_id!r} belongs to a stream busd observes; its SDK's host answers it",
                )
            raise PermissionRejected("unknown_request", f"no pending permission {request_id!r}")
        request = pending.request
        if option_id is not None:
            chosen = next((o for o in request.options if o.id == option_id), None)
            if chosen is None:
                offered = ", ".join(o.id for o in request.options) or "none"
                raise PermissionRejected(
                    "invalid_option", f"{option_id!r} is not offered (offered: {offered})"
                )
            outcome: Literal["allowed", "denied"] = (
                "allowed" if chosen.kind.startswith("allow") else "denied"
            )
            if chosen.kind == "other":
                outcome = "allowed" if allow is not False else "denied"
            decision = PermissionDecision(
                outcome=outcome, option_id=option_id, by=by, reason=reason
            )
        elif allow is not None:
            decision = decision_for(request, allow=allow, by=by, reason=reason)
        else:
            raise PermissionRejected("invalid_option", "give option_id or allow")
        self._resolve(pending, decision)
        return decision

    def cancel_run(self, run_id: str, reason: str = "the run was cancelled") -> None:
        """Resolve every pending request of ``run_id`` as cancelled."""
        for pending in [p for p in self._pending.values() if p.run_id == run_id]:
            self._resolve(
                pending, PermissionDecision(outcome="cancelled", by="busd", reason=reason)
            )

    def is_resolved(self, request_id: str) -> bool:
        return request_id in self._resolved

    def knows(self, request_id: str) -> bool:
        """A request of a driven run: pending, or decided (as far as it remembers)."""
        return request_id in self._pending or request_id in self._resolved

    def pending(self) -> list[PermissionRequested]:
        return [p.request for p in self._pending.values()]

    # -- internals ----------------------------------------------------------------------

    def _resolve(self, pending: _Pending, decision: PermissionDecision) -> None:
        if pending.decision is not None:
            return
        pending.decision = decision
        self._remember_id(self._resolved, pending.request.request_id, decision)
        self._publish(
            PermissionResolved(
                request_id=pending.request.request_id,
                outcome=decision.outcome,
                option_id=decision.option_id,
                by=decision.by,
                reason=decision.reason,
            ),
            session_id=pending.session_id,
            run_id=pending.run_id,
        )
        pending.done.set()

    def _remember_id(self, store: OrderedDict[str, Any], key: str, value: Any) -> None:
        store[key] = value
        store.move_to_end(key)
        while len(store) > self._remember:
            store.popitem(last=False)


class Asked:
    """An agent's request (``ask_permission``), from its publication to its decision."""

    def __init__(self, broker: PermissionBroker, pending: _Pending) -> None:
        self._broker = broker
        self._pending = pending
        self.request_id = pending.request.request_id
        self._left_to_agent = False

    async def wait(self, patience: float) -> PermissionDecision | None:
        """The decision, or ``None`` when the agent decides (nobody answered in ``patience`` s).

        Cancelled (the asking connection went away), the request is
        withdrawn: resolved ``cancelled`` by ``busd``.
        """
        pending = self._pending
        try:
            if pending.decision is None:
                with trio.move_on_after(patience):
                    await pending.done.wait()
            if pending.decision is None:
                reason = f"nobody answered within {patience:g}s: the agent decides"
                self.unanswered("timeout", reason)
        finally:
            self.withdraw()
        return None if self._left_to_agent else pending.decision

    def unanswered(self, by: str, reason: str) -> None:
        """Nobody decided: resolved ``cancelled`` on the bus, the agent decides."""
        if self._pending.decision is None:
            self._left_to_agent = True
            decision = PermissionDecision(outcome="cancelled", by=by, reason=reason)
            self._broker._resolve(self._pending, decision)

    def withdraw(self) -> None:
        """The asker is gone: resolved ``cancelled`` if still open, and forgotten as pending."""
        if self._pending.decision is None:
            reason = "the asking agent went away"
            decision = PermissionDecision(outcome="cancelled", by="busd", reason=reason)
            self._broker._resolve(self._pending, decision)
        self._broker._pending.pop(self.request_id, None)
