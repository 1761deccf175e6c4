"""The driver contract: how busd runs a prompt with an agent SDK itself.

A :class:`Driver` (provided by a plugin through ``busd_drivers``, usually the
same plugin as the adapter it pairs with) runs one prompt with the SDK's own
Python package and hands every raw SDK event to :meth:`RunContext.feed`,
which translates it with the paired adapter and publishes it, stamped with
the run's id and busd's session id. When the SDK asks for permission, the
driver awaits :meth:`RunContext.request_permission`: the daemon asks plugin
policy, then its rules, then the attached frontends, and the first answer
comes back as a :class:`PermissionDecision` for the driver to give the SDK.

Cancellation is Trio cancellation: ``cancel_run`` cancels the scope the
driver runs in. A driver whose SDK has an interrupt or abort call makes it
in a shielded, bounded ``finally``/``except trio.Cancelled`` block, so the
agent stops too. A driver for an asyncio-only SDK bridges it (a worker
thread running its own event loop, or trio-asyncio) and says which in its
docstring.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import msgspec

from ..core.events import Event, PermissionRequested
from ..core.permissions import PermissionDecision as PermissionDecision

__all__ = ["Driver", "PermissionDecision", "RunContext", "RunRequest"]


class RunRequest(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What to run: the ``start_run`` command's fields, with defaults filled in."""

    adapter: str
    prompt: str
    session_id: str
    """busd's session id for this conversation (every event of the run carries it)."""
    resume: str | None = None
    """The SDK's own session id to continue, when the session had earlier runs."""
    model: str | None = None
    system_prompt: str | None = None
    cwd: str | None = None
    permission_mode: str | None = None
    max_turns: int | None = None
    options: dict[str, Any] = {}
    """Passed through to the SDK as they are (driver-specific keys)."""
    env: dict[str, str] | None = None
    """The starter's environment, the agent's whole environment (``None``: the daemon's).

    A driver reads the agent's variables (API keys, CLI paths) from
    :meth:`environ` and hands it to the process or SDK client it starts, so a
    run behaves as if its starter ran the agent. Never publish or log it.
    """

    def environ(self) -> Mapping[str, str]:
        """The environment the agent gets: :attr:`env`, else the daemon's own."""
        return os.environ if self.env is None else self.env


@runtime_checkable
class RunContext(Protocol):
    """What the daemon gives a driver for one run."""

    request: RunRequest
    run_id: str

    def feed(self, raw: object) -> list[Event]:
        """Translate one raw SDK event with the paired adapter and publish the result.

        Returns the events published, as published: a permission event's
        ``request_id`` is scoped to the run (``<run_id>/<the SDK's id>``), and
        a resolution the daemon already published for its answer is left out.
        A driver that needs to know what its SDK said (the replay driver
        asks for the permissions it fed) reads them here; others ignore it.
        """
        ...

    async def request_permission(self, request: PermissionRequested) -> PermissionDecision:
        """Publish the request (unless its id was already published) and wait for its answer.

        The request's id is the SDK's own, or already scoped as :meth:`feed` returns it.
        """
        ...

    def publish(self, event: Event) -> None:
        """Publish a catalog event of this run that no SDK event carries.

        For what a driver learns beside the stream: a token count taken
        before the call (``stream.session.context``), a notice. It goes where
        :meth:`feed`'s events go: this run, its session, ``source`` the run.
        """
        ...

    def set_sdk_session(self, sdk_session_id: str) -> None:
        """Remember the SDK's own session id, so a later run can ``resume`` it."""
        ...


@runtime_checkable
class Driver(Protocol):
    """Runs prompts with one SDK; pairs with the adapter of the same ``name``."""

    name: str
    default_model: str
    """Used when ``start_run`` names no model (documented per driver)."""

    async def run(self, context: RunContext) -> None:
        """Run ``context.request`` to its end; raise on an agent error."""
        ...
