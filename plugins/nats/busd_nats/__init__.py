"""busd-nats: bridge daemons through NATS JetStream, so several machines share sessions.

Off unless the ``nats`` plugin options name a server (``busd serve --nats
nats://host:4222`` or ``url`` in ``[plugins.nats]``). Then every local event
goes to the JetStream subject ``busd.<daemon>.<session>.<type>`` and the
events of the other daemons come back in, each exactly once and in order per
session; see ``docs/scaling.md``. :mod:`busd_nats.bridge` explains how
nats-py's asyncio runs beside the daemon's Trio.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING

from busd import Service, hookimpl

from .bridge import AsyncioThread, Bridge, BridgeStatistics
from .errors import NameTaken, NatsBridgeError
from .ingest import LOCAL_ONLY, IngestStatistics
from .options import BridgeOptions, NatsOptionsError, check_keys, default_name, parse_options
from .subjects import IngestFilter, consumer_name, escape_token, subject_for

if TYPE_CHECKING:
    from busd import PluginHost

__all__ = [
    "LOCAL_ONLY",
    "AsyncioThread",
    "Bridge",
    "BridgeOptions",
    "BridgeStatistics",
    "IngestFilter",
    "IngestStatistics",
    "NameTaken",
    "NatsBridgeError",
    "NatsOptionsError",
    "bridge_of",
    "busd_services",
    "busd_shutdown",
    "consumer_name",
    "default_name",
    "escape_token",
    "parse_options",
    "subject_for",
]

logger = logging.getLogger("busd.nats")

_BRIDGES: weakref.WeakKeyDictionary[PluginHost, Bridge] = weakref.WeakKeyDictionary()


def bridge_of(daemon: PluginHost) -> Bridge | None:
    """The bridge this plugin made for ``daemon`` (for its statistics), if it is on."""
    return _BRIDGES.get(daemon)


@hookimpl
def busd_services(daemon: PluginHost) -> Sequence[Service]:
    """The bridge, when the options name a server; bad options raise :class:`NatsOptionsError`.

    A :class:`busd.PluginConfigError`: the daemon refuses to start and says why
    (``busd serve`` exits 2), rather than run without the bridge it was asked for.
    """
    raw = daemon.config.plugin_options.get("nats", {})
    if not raw.get("url"):
        check_keys(raw)  # off, but a typo such as 'ulr' is still an error
        if raw:
            logger.info("nats: options given but no url: the bridge is off")
        return []
    socket_path = _socket_path(daemon)
    bridge = Bridge(daemon, parse_options(raw, socket_path=socket_path), socket_path=socket_path)
    _BRIDGES[daemon] = bridge
    return [bridge.run]


def _socket_path(daemon: PluginHost) -> str | None:
    """The daemon's socket, for the default name and the claim on it (``None``: it has none)."""
    return daemon.socket_path


@hookimpl
def busd_shutdown(daemon: PluginHost) -> None:
    """The daemon is stopping: its bridge takes no more events."""
    bridge = _BRIDGES.pop(daemon, None)
    if bridge is not None:
        bridge.close()
