"""Permission requests of the runs busd drives: policy first, then people.

A driver's request is decided in a fixed, documented order:

1. plugins (``busd_permission_policy``, first non-``None`` answer);
2. the daemon's rules, first match wins (tool-name glob, category,
   annotations, command pattern → ``allow`` / ``deny`` / ``ask``);
3. the attached frontends: the first valid ``permission_reply`` wins, later
   ones get ``already_resolved``;
4. nobody answered within the timeout (default: wait for ever): denied.

Every request is published as ``stream.permission.requested`` (once, even if
the adapter already published it from the raw stream) and every decision as
``stream.permission.resolved``, saying who decided.
"""

from __future__ import annotations

import fnmatch
import re
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import msgspec
import trio

from ..plugins.drivers import PermissionDecision
from .errors import BusdError
from .events import Envelope, Event, PermissionOption, PermissionRequested, PermissionResolved

__all__ = [
    "PermissionBroker",
    "PermissionRejected",
    "PermissionRule",
    "decision_for",
    "match_rule",
]


class PermissionRule(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, forbid_unknown_fields=True
):
    """One rule of the daemon's permission policy; every given condition must match."""

    action: Literal["allow", "deny", "ask"]
    tool: str = "*"
    """A glob over the tool name (``Bash``, ``mcp__*``)."""
    category: str | None = None
    """The request's category, exactly (``edit``, ``execute``, ``read``...)."""
    annotations: dict[str, Any] = {}
    """Each key must be present with this value (``{"readOnlyHint": true}``)."""
    command: str | None = None
    """A regular expression searched in the input's ``command`` (shell tools)."""

    def matches(self, request: PermissionRequested) -> bool:
        if not fnmatch.fnmatchcase(request.tool, self.tool):
            return False
        if self.category is not None and request.category != self.category:
            return False
        for key, value in self.annotations.items():
            if request.annotations.get(key) != value:
                return False
        if self.command is not None:
            command = request.input.get("command")
            if isinstance(command, list):
                command = " ".join(map(str, command))
            if not isinstance(command, str) or re.search(self.command, command) is None:
                return False
        return True


def match_rule(
    rules: Sequence[PermissionRule], request: PermissionRequested
) -> tuple[int, PermissionRule] | None:
    """The first rule that matches, with its index."""
    for index, rule in enumerate(rules):
        if rule.matches(request):
            return index, rule
    return None


def _option(options: Sequence[PermissionOption], prefix: str) -> str | None:
    for option in options:
        if option.kind.startswith(prefix):
            return option.id
    return None


def decision_for(
    request: PermissionRequested,
    *,
    allow: bool,
    by: str,
    reason: str | None = None,
) -> PermissionDecision:
    """An allow/deny decision, with the SDK's matching one-time option picked."""
    option = _option(request.options, "allow_once" if allow else "reject_once") or _option(
        request.options, "allow" if allow else "reject"
    )
    return PermissionDecision(
        outcome="allowed" if allow else "denied", option_id=option, by=by, reason=reason
    )


class PermissionRejected(BusdError):
    """A reply the broker refuses (``code``: unknown_request, already_resolved, invalid_option)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class _Pending:
    __slots__ = ("decision", "done", "request", "run_id", "session_id")

    def __init__(self, request: PermissionRequested, session_id: str, run_id: str) -> None:
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
        self._published: OrderedDict[str, None] = OrderedDict()  # request ids seen on the bus
        self._resolved: OrderedDict[str, PermissionDecision] = OrderedDict()
        self._remember = remember

    # -- seen on the bus (the daemon calls this for every requested event) ------

    def saw_request(self, request_id: str) -> None:
        self._remember_id(self._published, request_id, None)

    # -- the driver's side ----------------------------------------------------------

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
            return self._resolved[request_id]
        envelope: Envelope[Event]
        if request_id not in self._published:
            envelope = self._publish(
                request, session_id=session_id, run_id=run_id, agent_id=agent_id
            )
        else:
            envelope = Envelope(0, 0.0, request, session_id, run_id, agent_id)
        pending = _Pending(request, session_id, run_id)
        self._pending[request_id] = pending
        try:
            decision = self._decide_by_policy(request, envelope)
            if decision is not None:
                self._resolve(pending, decision)
            else:
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
                return decision_for(request, allow=rule.action == "allow", by=f"rule:{index}")
        return None

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
        """A frontend's answer; the first valid one wins."""
        pending = self._pending.get(request_id)
        if pending is None:
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


def rules_from_config(raw: Sequence[Mapping[str, Any]]) -> list[PermissionRule]:
    """Rules from a config file's list of tables (validated; a bad rule is a clear error)."""
    return [msgspec.convert(dict(item), PermissionRule) for item in raw]
