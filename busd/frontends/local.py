"""The one thing frontends ask of a daemon they do not reach over a socket: to start one.

``busd run`` falls back to a private daemon when none is running, and
``busd demo`` always starts one. Frontends talk to daemons only through the
client library, so the way to start one is handed in by the CLI
(:func:`busd.daemon.embedded.serve_private`), typed by the Protocols here.
"""

from __future__ import annotations

from collections.abc import Set
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Protocol

__all__ = ["LocalDaemon", "StartLocal"]


class LocalDaemon(Protocol):
    """A daemon this process serves on a private socket while a block runs."""

    @property
    def path(self) -> Path:
        """Its socket: connect to it with :func:`busd.connect`."""
        ...

    @property
    def adapters(self) -> Set[str]:
        """The names of the adapters it loaded."""
        ...

    async def shutdown(self, reason: str) -> None:
        """Say goodbye (with ``reason``) to every attached client."""
        ...


class StartLocal(Protocol):
    """Serves a private daemon for the ``async with`` block (``watchdog``: its run watchdog)."""

    def __call__(
        self, *, watchdog: float | None = None, directory: Path | None = None
    ) -> AbstractAsyncContextManager[LocalDaemon]: ...
