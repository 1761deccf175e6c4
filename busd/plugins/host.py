"""What a plugin may ask of the daemon that runs it: a Protocol, not the daemon class.

Hooks that receive the daemon (``busd_services``, ``busd_startup``,
``busd_shutdown``) are typed against :class:`PluginHost`, so the plugin layer
never imports the daemon and a plugin depends on this short list only. The
daemon (:class:`busd.daemon.hub.Daemon`) satisfies it structurally; a test
may hand a plugin anything else that does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import msgspec

from ..core.bus import Bus
from ..core.catalog import Catalog
from ..core.correlation import Correlator
from ..core.events import Envelope, Event
from ..core.sessions import SessionRegistry

__all__ = ["HostConfig", "PluginHost"]


class HostConfig(Protocol):
    """The part of the daemon's configuration a plugin reads."""

    @property
    def plugin_options(self) -> Mapping[str, Mapping[str, Any]]:
        """Each plugin's ``[plugins.<name>]`` table from the config file, by name."""
        ...


class PluginHost(Protocol):
    """The daemon as a plugin sees it: its config, catalog, bus, correlation and publish."""

    @property
    def config(self) -> HostConfig: ...

    @property
    def socket_path(self) -> str | None:
        """The socket it serves (``None`` for a daemon that serves none, as in tests)."""
        ...

    @property
    def catalog(self) -> Catalog:
        """Every event type the daemon accepts (built-ins and plugins')."""
        ...

    @property
    def bus(self) -> Bus:
        """For ``on``/``on_all`` handlers; publish through :meth:`publish`, not the bus."""
        ...

    @property
    def correlator(self) -> Correlator: ...

    @property
    def sessions(self) -> SessionRegistry: ...

    def publish(
        self,
        event: Event,
        *,
        session_id: str | None = None,
        run_id: str | None = None,
        agent_id: str | None = None,
        source: str = "",
        parent_tool_call_id: str | None = None,
        event_id: str | None = None,
    ) -> Envelope[Event]:
        """Correlate, sequence and fan out one event, as the daemon does for clients."""
        ...

    def raw(self, envelope: Envelope[Event]) -> msgspec.Raw:
        """``envelope`` as the msgpack bytes subscribers get (encoded once)."""
        ...
