"""The plugin manager: a typed facade over pluggy, with isolation.

Plugins load from the ``busd`` entry-point group; the built-in adapters are
separate distributions registered through that same group. What ships inside
busd itself (:data:`BUILTIN_PLUGINS`: the ``replay`` driver) is registered by
every manager as it is made, first, as pytest registers its own plugins. Two
environment switches, as pytest and tox have them: ``BUSD_DISABLE_PLUGIN_AUTOLOAD``
(any non-empty value) loads no entry points (built-in plugins stay), and
``BUSD_BLOCK_PLUGINS=a,b`` skips those names, built-in ones included.

Every hook call goes through :meth:`PluginManager._call`, which calls each
implementation on its own: one that raises is logged, counted and reported
to ``on_error``, and the others still run; one that takes longer than
``slow_hook`` seconds is flagged (a synchronous hook cannot be interrupted,
so it is named and shamed). :func:`supervise` is the guard services run
under.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import os
import time
from collections.abc import Callable, Hashable, Iterator, Mapping
from typing import Any, Final

import msgspec
import pluggy
import trio

from .._version import __version__
from ..core.errors import PluginConfigError
from ..core.events import Envelope, Event, PermissionRequested
from ..core.reports import Reports
from . import hookspecs
from .adapters import Adapter
from .agenthooks import AgentHooks
from .attachers import Attacher
from .drivers import Driver
from .host import PluginHost

__all__ = [
    "BUILTIN_PLUGINS",
    "ENTRY_POINT_GROUP",
    "KEPT_FAILURES",
    "HookFailure",
    "PluginInfo",
    "PluginManager",
    "supervise",
]

logger = logging.getLogger("busd.plugins")

ENTRY_POINT_GROUP = "busd"
DISABLE_AUTOLOAD = "BUSD_DISABLE_PLUGIN_AUTOLOAD"
BLOCK = "BUSD_BLOCK_PLUGINS"

BUILTIN_PLUGINS: Final[Mapping[str, str]] = {"busd.replay": "busd.plugins.replay"}
"""Plugin name to module, for the plugins that are part of busd (distribution ``busd``)."""

KEPT_FAILURES: Final = 100
"""Failures (and slow calls) a manager keeps, the latest; ``failure_count`` has them all."""


class PluginInfo(msgspec.Struct, frozen=True, kw_only=True):
    """What ``busd plugins`` shows for one plugin."""

    name: str
    version: str | None
    distribution: str | None
    module: str
    hooks: list[str]


class HookFailure(msgspec.Struct, frozen=True, kw_only=True):
    """A hook implementation that raised (or a plugin that failed to load)."""

    plugin: str
    hook: str
    error: str


ErrorListener = Callable[[HookFailure], object]


class PluginManager:
    """Loads plugins and calls their hooks, one implementation at a time."""

    def __init__(
        self,
        *,
        environ: Mapping[str, str] = os.environ,
        slow_hook: float = 0.25,
        on_error: ErrorListener | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._pm = pluggy.PluginManager(hookspecs.PROJECT)
        self._pm.add_hookspecs(hookspecs)
        self._environ = environ
        self.slow_hook = slow_hook
        self.on_error = on_error
        self.failures: list[HookFailure] = []
        """The latest :data:`KEPT_FAILURES` failures."""
        self.failure_count = 0
        """Every failure since the manager was made."""
        self.slow_calls: list[tuple[str, str, float]] = []
        """The latest :data:`KEPT_FAILURES` calls over ``slow_hook``."""
        # A hook failing on every call (a keyer is asked for every keyed envelope of every
        # cohort): logged and on_error first, then now and then (core.reports).
        self._reports = Reports("hook", clock=clock)
        self._dists: dict[str, tuple[str | None, str | None]] = {}
        self._register_builtins()

    # -- loading -------------------------------------------------------------------

    @property
    def autoload_disabled(self) -> bool:
        return bool(self._environ.get(DISABLE_AUTOLOAD))

    @property
    def blocked(self) -> frozenset[str]:
        return frozenset(n.strip() for n in self._environ.get(BLOCK, "").split(",") if n.strip())

    def load_entry_points(self) -> None:
        """Register every plugin of the ``busd`` group, unless switched off or blocked."""
        if self.autoload_disabled:
            logger.info("%s is set: no plugins loaded from entry points", DISABLE_AUTOLOAD)
            return
        blocked = self.blocked
        for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            name = entry_point.name
            if name in blocked:
                logger.info("plugin %r blocked by %s", name, BLOCK)
                continue
            if self._pm.has_plugin(name):
                continue
            try:
                plugin = entry_point.load()
                self._pm.register(plugin, name=name)
            except Exception as exc:
                self._failed(name, "<load>", exc)
                continue
            dist = entry_point.dist
            self._dists[name] = (
                dist.metadata["Name"] if dist is not None else None,
                dist.version if dist is not None else None,
            )

    def _register_builtins(self) -> None:
        blocked = self.blocked
        for name, module in BUILTIN_PLUGINS.items():
            if name in blocked:
                logger.info("built-in plugin %r blocked by %s", name, BLOCK)
                continue
            try:
                self._pm.register(importlib.import_module(module), name=name)
            except Exception as exc:
                self._failed(name, "<load>", exc)
                continue
            self._dists[name] = ("busd", __version__)

    def register(self, plugin: object, name: str | None = None) -> str:
        """Register a plugin object or module directly (tests, embedding)."""
        registered = self._pm.register(plugin, name=name)
        if registered is None:
            raise ValueError(f"plugin {name!r} is blocked or already registered")
        return registered

    def unregister(self, name: str) -> None:
        self._pm.unregister(name=name)

    def plugins(self) -> list[PluginInfo]:
        infos = []
        for name, plugin in self._pm.list_name_plugin():
            if plugin is None:
                continue
            hooks = sorted(caller.name for caller in self._pm.get_hookcallers(plugin) or ())
            distribution, version = self._dists.get(name, (None, None))
            infos.append(
                PluginInfo(
                    name=name,
                    version=version,
                    distribution=distribution,
                    module=getattr(plugin, "__name__", type(plugin).__qualname__),
                    hooks=hooks,
                )
            )
        return sorted(infos, key=lambda info: info.name)

    # -- the typed facade ---------------------------------------------------------

    def event_types(self) -> list[tuple[str, type[Event]]]:
        """``(plugin name, event class)`` for every type plugins add."""
        return [
            (plugin, cls)
            for plugin, result in self._call("busd_event_types")
            for cls in result or ()
        ]

    def adapters(self) -> dict[str, Adapter]:
        """Adapters by name; when two plugins offer one name, the first registered wins."""
        return self._named("busd_adapters", Adapter)

    def drivers(self) -> dict[str, Driver]:
        """Drivers by name; when two plugins offer one name, the first registered wins."""
        return self._named("busd_drivers", Driver)

    def attachers(self) -> dict[str, Attacher]:
        """Attachers by name; when two plugins offer one name, the first registered wins."""
        return self._named("busd_attachers", Attacher)

    def agent_hooks(self) -> dict[str, AgentHooks]:
        """Agent hooks by name; when two plugins offer one name, the first registered wins."""
        return self._named("busd_agent_hooks", AgentHooks)

    def _named(self, hook: str, kind: type[Any]) -> dict[str, Any]:
        found: dict[str, tuple[str, Any]] = {}
        for plugin, result in reversed(list(self._call(hook))):  # registration order
            for item in result or ():
                if not isinstance(item, kind):
                    noun = kind.__name__.lower()
                    self._failed(plugin, hook, TypeError(f"{item!r} is no {noun}"))
                    continue
                name: str = getattr(item, "name")  # noqa: B009 - protocols are checked above
                if name in found:
                    owner = found[name][0]
                    self._failed(
                        plugin,
                        hook,
                        ValueError(f"{name!r} is already provided by {owner!r}"),
                    )
                else:
                    found[name] = (plugin, item)
        return {name: item for name, (_, item) in found.items()}

    def coalescing_key(self, envelope: Envelope[Event]) -> Hashable | None:
        for plugin, result in self._call("busd_coalescing_key", envelope=envelope):
            if result is None:
                continue
            try:
                hash(result)
            except TypeError as exc:  # a list, a dict: it would break every buffer it meets
                self._failed(plugin, "busd_coalescing_key", TypeError(f"unhashable key: {exc}"))
                continue
            return result  # type: ignore[no-any-return]
        return None

    def permission_policy(
        self, request: PermissionRequested, envelope: Envelope[Event]
    ) -> str | None:
        for plugin, result in self._call(
            "busd_permission_policy", request=request, envelope=envelope
        ):
            if result in ("allow", "deny"):
                return result  # type: ignore[no-any-return]
            if result is not None:
                self._failed(
                    plugin,
                    "busd_permission_policy",
                    ValueError(f"returned {result!r}, not 'allow', 'deny' or None"),
                )
        return None

    def services(self, daemon: PluginHost) -> list[tuple[str, hookspecs.Service]]:
        return [
            (plugin, service)
            for plugin, result in self._call("busd_services", daemon=daemon)
            for service in result or ()
        ]

    def startup(self, daemon: PluginHost) -> None:
        for _ in self._call("busd_startup", daemon=daemon):
            pass

    def shutdown(self, daemon: PluginHost) -> None:
        for _ in self._call("busd_shutdown", daemon=daemon):
            pass

    # -- isolation -----------------------------------------------------------------

    def _call(self, hook_name: str, **kwargs: Any) -> Iterator[tuple[str, Any]]:
        """Yield ``(plugin name, result)`` per implementation, in pluggy's call order."""
        caller = getattr(self._pm.hook, hook_name)
        for impl in reversed(caller.get_hookimpls()):
            args = {name: kwargs[name] for name in impl.argnames}
            started = time.perf_counter()
            try:
                result = impl.function(**args)
            except PluginConfigError:
                raise  # the operator's configuration: stop, say why (see its docs)
            except Exception as exc:
                self._failed(impl.plugin_name, hook_name, exc)
                continue
            finally:
                elapsed = time.perf_counter() - started
                if elapsed > self.slow_hook:
                    self.slow_calls.append((impl.plugin_name, hook_name, elapsed))
                    del self.slow_calls[:-KEPT_FAILURES]
                    logger.warning(
                        "plugin %r blocked the daemon for %.2fs in %s: hooks must be quick",
                        impl.plugin_name,
                        elapsed,
                        hook_name,
                    )
            yield impl.plugin_name, result

    def _failed(self, plugin: str, hook: str, exc: BaseException) -> None:
        """Count and keep a failure; report it unless this hook's was reported lately."""
        failure = HookFailure(plugin=plugin, hook=hook, error=f"{type(exc).__name__}: {exc}")
        self.failure_count += 1
        self.failures.append(failure)
        del self.failures[:-KEPT_FAILURES]
        more = self._reports.due((plugin, hook))
        if more is None:
            return
        if more:
            failure = HookFailure(plugin=plugin, hook=hook, error=failure.error + more)
        logger.error("plugin %r failed in %s: %s", plugin, hook, failure.error, exc_info=exc)
        if self.on_error is not None:
            self.on_error(failure)


async def supervise(
    name: str,
    service: hookspecs.Service,
    *,
    on_failure: Callable[[str, BaseException, bool], object],
    max_failures: int = 5,
    backoff: float = 0.5,
    max_backoff: float = 30.0,
) -> None:
    """Run ``service``; restart it with exponential backoff when it raises.

    After ``max_failures`` failures in a row it is disabled. ``on_failure``
    is told each time (name, exception, disabled?). Returning normally ends
    the service for good; cancellation propagates.
    """
    failures = 0
    delay = backoff
    while True:
        started = trio.current_time()
        try:
            await service()
        except Exception as exc:
            # A service that ran for a while before failing starts its count afresh.
            if trio.current_time() - started > max_backoff:
                failures, delay = 0, backoff
            failures += 1
            disabled = failures >= max_failures
            logger.error(
                "service %s failed (%d/%d)%s",
                name,
                failures,
                max_failures,
                ": disabled" if disabled else f": restarting in {delay:.1f}s",
                exc_info=exc,
            )
            on_failure(name, exc, disabled)
            if disabled:
                return
            await trio.sleep(delay)
            delay = min(delay * 2, max_backoff)
            continue
        logger.info("service %s finished", name)
        return
