"""A daemon served on a private socket for one block: ``busd run`` and ``busd demo``.

When nobody listens at the usual socket, ``busd run`` starts its own daemon
for the run; ``busd demo`` always does. Both get it from here, so the
frontends that drive them never import the daemon: the CLI hands them
:func:`serve_private` (it satisfies :class:`busd.frontends.local.StartLocal`).
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from ..plugins.manager import PluginManager
from .endpoint import Endpoint
from .hub import Daemon, DaemonConfig
from .server import Server

__all__ = ["PrivateDaemon", "serve_private"]


class PrivateDaemon:
    """A daemon with the entry-point plugins, serving ``path`` for the caller's block."""

    def __init__(self, daemon: Daemon, server: Server, path: Path) -> None:
        self._server = server
        self.path = path
        self.adapters = frozenset(daemon.adapters)

    async def shutdown(self, reason: str) -> None:
        """Say goodbye (with ``reason``) to every attached client."""
        await self._server.shutdown(reason)


@asynccontextmanager
async def serve_private(
    config: DaemonConfig | None = None,
    *,
    watchdog: float | None = None,
    directory: Path | None = None,
    prefix: str = "busd-",
) -> AsyncIterator[PrivateDaemon]:
    """Serve a new daemon on ``bus.sock`` in a fresh temporary directory, for this block only.

    ``watchdog`` overrides the config's run watchdog. The directory is made
    with ``tempfile.mkdtemp`` (in ``directory`` if given) and removed, socket,
    lock and all, on the way out. An exception from the block comes out as
    it was, not wrapped in the nursery's group.

    :raises busd.EndpointError: the socket cannot be bound there.
    """
    config = config if config is not None else DaemonConfig()
    if watchdog is not None:
        config = dataclasses.replace(config, watchdog=watchdog)
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=directory))
    raised: BaseException | None = None
    try:
        path = folder / "bus.sock"
        plugins = PluginManager()
        plugins.load_entry_points()
        daemon = Daemon(config, plugins=plugins, socket_path=str(path))
        with Endpoint.bind(path) as endpoint:
            server = Server(daemon, endpoint.socket)
            async with trio.open_nursery() as nursery:
                await nursery.start(server.run)
                try:
                    yield PrivateDaemon(daemon, server, path)
                except BaseException as exc:
                    if isinstance(exc, trio.Cancelled):
                        raise
                    raised = exc  # re-raised below, not wrapped in the nursery's group
                finally:
                    nursery.cancel_scope.cancel()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if raised is not None:
        raise raised
