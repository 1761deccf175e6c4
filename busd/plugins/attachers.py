"""Attachers: agents busd did not start, followed from where they leave their traces.

Most people run their agents by hand (``claude`` in a terminal, the OpenCode
TUI). An attacher finds such an agent's sessions (transcript files, a
server's event stream) and sends its raw payloads to the daemon through
``ingest`` frames, where the adapter of the same SDK translates them as it
would a recording. ``busd attach NAME`` runs one in the CLI process, not in
the daemon: what it reads belongs to the user who runs it.

The contract is small on purpose. An attacher owns its sources and its
resume points (in :attr:`AttachOptions.state_dir`); the :class:`Sink` owns
the connection: framing under the daemon's limits, acknowledgement, and the
user's terminal. Resume points are written only after
:meth:`Sink.checkpoint`, so an attacher that is stopped and started again
sends nothing twice that the daemon had already taken.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import msgspec

__all__ = ["AttachOptions", "Attacher", "Sink"]


class AttachOptions(msgspec.Struct, frozen=True, kw_only=True):
    """What ``busd attach`` was told; each attacher uses what applies to it."""

    state_dir: Path
    """A directory this attacher owns for its resume points (it exists)."""
    once: bool = False
    """Read what is there now, then return (scripts and tests); else follow until cancelled."""
    url: str | None = None
    """A server to attach to (OpenCode's)."""
    directory: Path | None = None
    """Where to look, when not the agent's default (Claude Code's config directory)."""


@runtime_checkable
class Sink(Protocol):
    """The daemon, as an attacher sees it."""

    async def ingest(
        self, sdk: str, session_id: str | None, events: Sequence[object], *, end: bool = False
    ) -> None:
        """Send raw payloads (JSON-like objects) to the daemon's adapter ``sdk``.

        One translator per ``(sdk, session_id)`` lives as long as the
        connection; ``end`` finishes it (its ``finish`` events are published).
        A payload too large for one frame is skipped with a note.
        """
        ...

    async def checkpoint(self) -> bool:
        """Return once the daemon has taken everything sent so far.

        ``True`` when it is in the daemon's journal, ``False`` when the daemon
        keeps no journal. Write resume points after this, never before.
        """
        ...

    def note(self, message: str) -> None:
        """Tell the user one line (a skipped line, a file that went away)."""
        ...


@runtime_checkable
class Attacher(Protocol):
    """Follows one kind of agent's sessions; returned by ``busd_attachers``."""

    name: str
    """What ``busd attach NAME`` selects (usually the adapter's name)."""
    description: str
    """One line for ``busd attach --help``."""

    async def attach(self, sink: Sink, options: AttachOptions) -> None:
        """Send what there is; with ``options.once`` return, else follow until cancelled."""
        ...
