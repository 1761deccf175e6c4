"""The daemon's commands as typed methods: :class:`Client` has them all, over ``request``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..core.permissions import PermissionRule
from ..wire import CancelRun, Command, PermissionReply, StartRun

__all__ = ["Commands"]


class Commands:
    """Runs and permissions, each a ``request`` with the command's typed arguments."""

    async def request(self, command: Command) -> Any:
        """Send a command and return its result (the connection implements it)."""
        raise NotImplementedError

    async def start_run(
        self,
        adapter: str,
        prompt: str,
        *,
        session_id: str | None = None,
        model: str | None = None,
        system_prompt: str | None = None,
        cwd: str | None = None,
        permission_mode: str | None = None,
        max_turns: int | None = None,
        options: dict[str, Any] | None = None,
        driver: str | None = None,
        request_id: str | None = None,
        permission_rules: Sequence[PermissionRule] = (),
        env: Mapping[str, str] | None = None,
        context_window: int | None = None,
        output_reserve: int | None = None,
    ) -> dict[str, str]:
        """Start a run; returns ``{"run_id", "session_id"}`` at once, events follow.

        ``driver`` defaults to the one named like ``adapter``; ``"replay"``
        plays a recording (``options={"recording": ..., "speed": ...}``).
        ``request_id`` is an id of the caller's choosing that every
        ``busd.run.*`` event of the run repeats. ``permission_rules`` decide
        the run's permission requests in this client's name, after the
        daemon's policy and rules and before any frontend is asked. ``env``
        is the agent's whole environment (``busd run`` sends its own,
        ``dict(os.environ)``); without it the agent gets the daemon's.
        ``context_window`` (tokens) is the session's window from this run on,
        over the model table and the daemon's config; ``output_reserve``, below
        it, the room kept for the model's output (default: the table's).
        """
        result: dict[str, str] = await self.request(
            StartRun(
                adapter=adapter,
                prompt=prompt,
                driver=driver,
                session_id=session_id,
                model=model,
                system_prompt=system_prompt,
                cwd=cwd,
                permission_mode=permission_mode,
                max_turns=max_turns,
                options=options or {},
                request_id=request_id,
                permission_rules=tuple(permission_rules),
                env=None if env is None else dict(env),
                context_window=context_window,
                output_reserve=output_reserve,
            )
        )
        return result

    async def cancel_run(self, run_id: str, *, reason: str | None = None) -> None:
        """Cancel a run; :class:`RequestFailed` (``unknown_run``, ``run_finished``) otherwise."""
        await self.request(CancelRun(run_id=run_id, reason=reason))

    async def reply_permission(
        self,
        request_id: str,
        *,
        option_id: str | None = None,
        allow: bool | None = None,
        reason: str | None = None,
    ) -> dict[str, Any]:
        """Answer a permission request; :class:`RequestFailed` if another answer won."""
        decision: dict[str, Any] = await self.request(
            PermissionReply(request_id=request_id, option_id=option_id, allow=allow, reason=reason)
        )
        return decision
