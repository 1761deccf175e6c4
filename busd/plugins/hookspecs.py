"""Every hook a busd plugin can implement, in one place, grouped by when it runs.

Plugins are modules or objects with functions marked ``@busd.hookimpl`` and
named like the specs below; they load from the ``busd`` entry-point group
(the built-in adapters in ``plugins/`` load exactly the same way). busd calls
each implementation on its own, so one that raises is logged and skipped and
the others still run; for that reason hook wrappers are not supported.
Hooks are synchronous: anything long-running belongs in a service
(:func:`busd_services`), which the daemon runs in its own nursery.

``docs/plugins.md`` documents each hook with this exact signature; a test
keeps the two in step.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Literal

import pluggy

from ..core.events import Envelope, Event, PermissionRequested
from .adapters import Adapter
from .agenthooks import AgentHooks
from .attachers import Attacher
from .drivers import Driver
from .host import PluginHost

__all__ = [
    "PROJECT",
    "Service",
    "busd_adapters",
    "busd_agent_hooks",
    "busd_attachers",
    "busd_coalescing_key",
    "busd_drivers",
    "busd_event_types",
    "busd_permission_policy",
    "busd_services",
    "busd_shutdown",
    "busd_startup",
    "hookimpl",
    "hookspec",
]

PROJECT = "busd"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

Service = Callable[[], Awaitable[None]]
"""A long-running async callable; returning means done, raising means restart."""


# -- registration: once, at startup, before the wire decoders are built ------


@hookspec
def busd_event_types() -> Sequence[type[Event]]:
    """Event types this plugin adds to the catalog.

    Each is a frozen ``busd.Event`` subclass with a dotted ``tag`` (use your
    own prefix, e.g. ``acme.build.finished``). They are registered before the
    daemon builds its decoders, so clients may publish them and subscribers
    receive them like built-in ones.

    :return: the classes; a name that clashes with another type is refused.
    """
    raise NotImplementedError


@hookspec
def busd_adapters() -> Sequence[Adapter]:
    """SDK adapters this plugin provides.

    An adapter has a ``name`` (what ``ingest`` frames and ``busd ingest
    --sdk`` select) and a ``translator(*, session_id=None)`` factory; see
    :mod:`busd.plugins.adapters`. When two plugins offer the same name, the one
    registered first wins and the other is reported as a plugin failure.

    :return: the adapters.
    """
    raise NotImplementedError


@hookspec
def busd_drivers() -> Sequence[Driver]:
    """Drivers that run prompts with an SDK themselves (for ``start_run``).

    A driver's ``name`` pairs it with the adapter of the same name, which
    translates the raw events it feeds; see :mod:`busd.plugins.drivers`. When two
    plugins offer the same name, the one registered first wins.

    :return: the drivers.
    """
    raise NotImplementedError


@hookspec
def busd_attachers() -> Sequence[Attacher]:
    """Attachers that follow agents busd did not start (``busd attach NAME``).

    An attacher runs in the ``busd attach`` process, reads an agent's own
    traces (transcript files, a server's event stream) and sends them to the
    daemon's adapters as ``ingest`` frames; see :mod:`busd.plugins.attachers`.
    When two plugins offer the same name, the one registered first wins.

    :return: the attachers.
    """
    raise NotImplementedError


@hookspec
def busd_agent_hooks() -> Sequence[AgentHooks]:
    """Hook commands for agents that run commands at points of their life (Claude Code's hooks).

    ``busd hooks NAME --install`` puts ``busd hook NAME`` into the agent's
    settings; each call reads the agent's payload and reports events or asks
    the permission broker, in the CLI process. The agent-specific part (its
    payloads, answers and settings file) is the plugin's; see
    :mod:`busd.plugins.agenthooks`. When two plugins offer the same name, the
    one registered first wins.

    :return: the agent hooks.
    """
    raise NotImplementedError


@hookspec(firstresult=True)
def busd_coalescing_key(envelope: Envelope[Event]) -> Hashable | None:
    """The coalescing key of an event of a plugin-registered type.

    Within one batch window, an event with a key supersedes the earlier event
    with the same key (the survivor keeps its later position). Asked only for
    types that are not built in; built-in rules cannot be overridden, and
    deltas and lifecycle events are never keyed. Include the type name in
    the key so different types never collide.

    Stops at the first non-``None`` result.

    :param envelope: the event with its session, run and agent.
    :return: a hashable key, or ``None`` to never coalesce it.
    """
    raise NotImplementedError


# -- decisions: per event, synchronous, fast ----------------------------------


@hookspec(firstresult=True)
def busd_permission_policy(
    request: PermissionRequested, envelope: Envelope[Event]
) -> Literal["allow", "deny"] | None:
    """Decide a permission request before any frontend is asked.

    Plugins are asked before the daemon's configured rules. Return ``None``
    for "no opinion" to let the next plugin, then the rules, then people
    decide.

    Stops at the first non-``None`` result.

    :param request: the request: tool, input, category, annotations, options.
    :param envelope: the envelope it arrived in (session, run, agent).
    :return: ``"allow"``, ``"deny"`` or ``None``.
    """
    raise NotImplementedError


# -- lifecycle ---------------------------------------------------------------


@hookspec
def busd_services(daemon: PluginHost) -> Sequence[Service]:
    """Long-running services to run inside the daemon (bridges, exporters).

    Each is an async callable started in the daemon's nursery under a guard:
    if it raises it is restarted with exponential backoff, and after
    repeated failures it is disabled and a ``busd.internal.error`` event
    says so. Cancellation at shutdown is how it is told to stop. Options
    that cannot be used: raise :class:`busd.core.errors.PluginConfigError` from
    the hook itself, and the daemon refuses to start.

    :param daemon: the daemon as a :class:`~busd.plugins.host.PluginHost` (its config, catalog,
        bus, correlator, sessions and publish()).
    :return: the services.
    """
    raise NotImplementedError


@hookspec
def busd_startup(daemon: PluginHost) -> None:
    """The daemon is about to accept clients.

    :param daemon: the daemon as a :class:`~busd.plugins.host.PluginHost`.
    """
    raise NotImplementedError


@hookspec
def busd_shutdown(daemon: PluginHost) -> None:
    """The daemon has said goodbye to its clients and is stopping.

    :param daemon: the daemon as a :class:`~busd.plugins.host.PluginHost`.
    """
    raise NotImplementedError
