"""One connection's ``ask_permission`` requests: published at once, replied to when decided.

An agent busd does not drive (a Claude Code hook) asks the daemon's
permission broker (:meth:`~busd.daemon.broker.PermissionBroker.ask`). The
request is published while the frame is handled, so it keeps its place
among the connection's frames; the wait for a decision is a task in the
connection's nursery, so when the connection ends the task is cancelled and
the request withdrawn (resolved ``cancelled``). docs/protocol.md,
``ask_permission``.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable, Set

import msgspec

from ..core.events import PermissionRequested
from ..wire import TOO_MANY_REQUESTS, AskPermission, ErrorInfo, Reply, Right, Role
from ..wire.results import AskPermissionResult
from .hub import Daemon
from .outbox import ignore, start_nothing

__all__ = ["Asks"]


class Asks:
    """The permission requests one connection has asked and waits for."""

    def __init__(
        self,
        daemon: Daemon,
        queue: Callable[..., None],
        start: Callable[[Callable[[], Awaitable[object]], str], bool],
    ) -> None:
        self._daemon = daemon
        self._queue = queue  # the connection's: queue(frame, reply=True)
        self._start = start  # the connection's: a guarded task in its scope; False if none
        self.open = 0
        """Requests waiting for their decision (at most ``max_requests``)."""

    def detach(self) -> None:
        """The connection is over: keep none of its methods (a cycle left to the collector)."""
        self._queue = ignore
        self._start = start_nothing

    def ask(self, request_id: int, ask: AskPermission, *, source: str, rights: Set[Right]) -> None:
        """Publish ``ask`` as a request of connection ``source``; reply when it is decided."""
        limit = self._daemon.config.max_requests
        if self.open >= limit:
            message = f"more than {limit} permission requests of this connection are open"
            error = ErrorInfo(code=TOO_MANY_REQUESTS, message=message)
            self._queue(Reply(id=request_id, ok=False, error=error), reply=True)
            return
        request = PermissionRequested(
            request_id=ask.request_id or f"ask-{secrets.token_hex(8)}",
            tool=ask.tool,
            input=ask.input,
            tool_call_id=ask.tool_call_id,
            title=ask.title,
            category=ask.category,
            options=ask.options,
        )
        others = self._answerers() - ("permission_reply" in rights)
        asked = self._daemon.broker.ask(
            request,
            session_id=ask.session_id,
            agent_id=ask.agent_id,
            source=source,
            people=others > 0,
        )
        self.open += 1

        async def wait() -> None:
            try:
                decision = await asked.wait(ask.timeout)
            finally:
                self.open -= 1
            result = AskPermissionResult(request_id=asked.request_id, outcome="unanswered")
            if decision is not None and decision.outcome != "cancelled":
                result = AskPermissionResult(
                    request_id=asked.request_id,
                    outcome=decision.outcome,
                    option_id=decision.option_id,
                    by=decision.by,
                    reason=decision.reason,
                )
            reply = Reply(id=request_id, ok=True, result=msgspec.to_builtins(result))
            self._queue(reply, reply=True)

        if not self._start(wait, f"asking permission {asked.request_id}"):
            self.open -= 1
            asked.withdraw()

    def _answerers(self) -> int:
        """Connections whose role may answer a permission request (the asker's included)."""
        grants = self._daemon.config.grants
        by_role: dict[Role, int] = self._daemon.status()["clients_by_role"]
        return sum(n for role, n in by_role.items() if "permission_reply" in grants[role])
