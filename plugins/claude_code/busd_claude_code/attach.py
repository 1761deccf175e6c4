"""``busd attach claude-code``: Claude Code's own sessions, followed from its transcripts.

The thin Trio half: find the configuration directories, scan and read the
transcript files (in worker threads: plain file I/O), send what
:class:`~.follow.Follower` decides, and write the resume points once the
daemon has taken it. Polling, once a second: a transcript is appended to
line by line, and a poll sees a rename, a truncation or a deletion as
surely as a notification would, on every filesystem.

Where it looks (ccusage's rules): ``--dir`` if given, else each directory
of ``$CLAUDE_CONFIG_DIR`` (a comma-separated list), else
``$XDG_CONFIG_HOME/claude`` (``~/.config/claude``) and ``~/.claude``: those
that have a ``projects`` directory.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

import msgspec
import trio

from busd import AttachOptions, BusdError, Sink

from .follow import SDK, Follower, Place, Read, Stat, State, place_of

__all__ = [
    "FOLLOW_WINDOW_S",
    "POLL_S",
    "STATE_FILE",
    "ClaudeCodeAttacher",
    "TranscriptsNotFound",
    "config_dirs",
    "load_state",
    "read_new",
    "save_state",
    "scan",
]

POLL_S: Final = 1.0
"""Seconds between two looks at the transcripts when following."""
FOLLOW_WINDOW_S: Final = 5 * 3600.0
"""A session is followed once one of its files changed within this many seconds (5 hours)."""
STATE_FILE: Final = "claude-code.json"
"""The resume points' file in the attacher's state directory."""


class TranscriptsNotFound(BusdError, FileNotFoundError):
    """No Claude Code configuration directory with a ``projects`` directory in it."""


def config_dirs(directory: Path | None, environ: Mapping[str, str], home: Path) -> list[Path]:
    """The configuration directories to read, in order (those with ``projects``; ccusage's rules).

    Raises :class:`TranscriptsNotFound` naming where it looked when there is none.
    """
    if directory is not None:
        asked = [directory]
    elif environ.get("CLAUDE_CONFIG_DIR", "").strip():
        asked = [Path(p.strip()) for p in environ["CLAUDE_CONFIG_DIR"].split(",") if p.strip()]
    else:
        config = environ.get("XDG_CONFIG_HOME") or str(home / ".config")
        asked = [Path(config) / "claude", home / ".claude"]
    found: list[Path] = []
    for path in asked:
        resolved = path.expanduser().resolve()
        if (resolved / "projects").is_dir() and resolved not in found:
            found.append(resolved)
    if not found:
        where = ", ".join(str(p / "projects") for p in asked)
        raise TranscriptsNotFound(f"no Claude Code transcripts: none of {where} is a directory")
    return found


def scan(roots: list[Path]) -> dict[str, tuple[Stat, Place]]:
    """Every transcript file under the roots' ``projects`` now, with its stat and session."""
    found: dict[str, tuple[Stat, Place]] = {}
    for root in roots:
        projects = root / "projects"
        for folder, _, names in os.walk(projects):
            parts = Path(folder).relative_to(projects).parts
            for name in names:
                place = place_of((*parts, name))
                if place is None:
                    continue
                path = os.path.join(folder, name)
                try:
                    st = os.stat(path)
                except OSError:
                    continue  # gone between the listing and the stat: next round says so
                found[path] = (Stat(st.st_ino, st.st_size, st.st_mtime), place)
    return found


def read_new(read: Read) -> tuple[bytes, dict[str, Any] | None] | None:
    """The bytes of ``read.path`` from ``read.offset`` (``None`` if it went away), and its meta."""
    try:
        with open(read.path, "rb") as f:
            f.seek(read.offset)
            data = f.read()
    except OSError:
        return None
    meta: dict[str, Any] | None = None
    if read.meta:
        try:
            with open(read.path.removesuffix(".jsonl") + ".meta.json", "rb") as f:
                loaded = json.load(f)
            meta = loaded if isinstance(loaded, dict) else None
        except (OSError, ValueError):
            meta = None  # an older Claude Code, or not written yet: the translator copes
    return data, meta


def load_state(path: Path, note: Callable[[str], None]) -> State:
    """The resume points in ``path`` (none yet: empty; unreadable: said, and empty)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return State()
    except OSError as exc:
        note(f"cannot read resume points {path}: {exc.strerror or exc}; starting afresh")
        return State()
    try:
        return msgspec.json.decode(data, type=State)
    except msgspec.DecodeError as exc:
        note(f"resume points {path} are damaged ({exc}); starting afresh")
        return State()


def save_state(path: Path, state: State) -> None:
    """Replace ``path`` with ``state`` atomically (a reader sees the old file or the new one)."""
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(msgspec.json.encode(state))
    os.replace(partial, path)


class ClaudeCodeAttacher:
    """``busd attach claude-code``: every Claude Code session, from its transcripts."""

    name = "claude-code"
    description = "Claude Code's sessions, from the transcripts it writes (~/.claude)"

    def __init__(
        self, *, poll_s: float = POLL_S, window_s: float = FOLLOW_WINDOW_S, home: Path | None = None
    ) -> None:
        self._poll_s = poll_s
        self._window_s = window_s
        self._home = home

    async def attach(self, sink: Sink, options: AttachOptions) -> None:
        home = self._home or Path.home()
        roots = config_dirs(options.directory, os.environ, home)
        state_path = options.state_dir / STATE_FILE
        follower = Follower(
            load_state(state_path, sink.note), once=options.once, window=self._window_s
        )
        while True:
            if await self._round(sink, follower, roots):
                await sink.checkpoint()
                await trio.to_thread.run_sync(save_state, state_path, follower.state())
            if options.once:
                return
            await trio.sleep(self._poll_s)

    async def _round(self, sink: Sink, follower: Follower, roots: list[Path]) -> bool:
        """Read what is new and send it; whether anything was sent."""
        found = await trio.to_thread.run_sync(scan, roots)
        for read in follower.plan(found, time.time()):
            got = await trio.to_thread.run_sync(read_new, read)
            if got is not None:
                follower.take(read, *got)
        batches = follower.batches()
        for message in follower.drain_notes():
            sink.note(message)
        for batch in batches:
            await sink.ingest(SDK, batch.session, batch.payloads, end=batch.end)
        return bool(batches)
