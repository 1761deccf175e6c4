"""``busd attach NAME``: follow an agent busd did not start (:mod:`busd.plugins.attachers`)."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Sequence
from pathlib import Path

import click
import msgspec
import trio

from ..client import Client, ConnectionLost, DaemonNotRunning, NotJournaled, RequestFailed
from ..client import connect as busd_connect
from ..core.errors import BusdError, lone_error
from ..plugins.attachers import Attacher, AttachOptions
from ..plugins.manager import PluginManager
from ..wire import Ingest
from ._common import fail, resolve_socket, run_client, socket_option

__all__ = ["ClientSink", "attach"]

_CHUNK = 256 << 10  # encoded bytes per ingest frame, well under the frame cap
_HEADROOM = 4 << 10  # the frame's own fields around the payloads


class ClientSink:
    """A :class:`~busd.plugins.attachers.Sink` over one client connection."""

    def __init__(self, client: Client, *, max_frame: int) -> None:
        self._client = client
        self._limit = max_frame - _HEADROOM
        self._chunk = min(_CHUNK, self._limit)
        self._encode = msgspec.msgpack.Encoder().encode
        self.events = 0
        self.sessions: set[str] = set()
        self.skipped = 0

    async def ingest(
        self, sdk: str, session_id: str | None, events: Sequence[object], *, end: bool = False
    ) -> None:
        batch: list[object] = []
        size = 0
        for event in events:
            try:
                length = len(self._encode(event))
            except (TypeError, ValueError, OverflowError) as exc:
                self.skipped += 1
                self.note(f"{sdk}: skipped a payload that is not JSON-like ({exc})")
                continue
            if length > self._limit:
                self.skipped += 1
                self.note(
                    f"{sdk}: skipped a payload of {length} bytes, over the daemon's frame cap"
                )
                continue
            if batch and size + length > self._chunk:
                await self._send(sdk, session_id, batch, end=False)
                batch, size = [], 0
            batch.append(event)
            size += length
        if batch or end:
            await self._send(sdk, session_id, batch, end=end)

    async def _send(
        self, sdk: str, session_id: str | None, batch: list[object], *, end: bool
    ) -> None:
        await self._client.send_frame(Ingest(sdk=sdk, events=batch, session_id=session_id, end=end))
        self.events += len(batch)
        if session_id is not None:
            self.sessions.add(session_id)

    async def checkpoint(self) -> bool:
        try:
            return (await self._client.acknowledge()).journaled
        except NotJournaled as exc:  # raised, not exited: it crosses the attacher's nursery
            raise BusdError(f"sent, but not journaled: {exc}") from None
        except RequestFailed as exc:
            raise BusdError(f"the daemon refused what was sent: {exc}") from None

    def note(self, message: str) -> None:
        click.echo(f"busd: {message}", err=True)


def default_state_dir(name: str) -> Path:
    """``$XDG_STATE_HOME/busd/attach/NAME`` (``~/.local/state`` when unset)."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(state) / "busd" / "attach" / name


def _attachers() -> dict[str, Attacher]:
    manager = PluginManager()
    manager.load_entry_points()
    return manager.attachers()


class _AttachCommand(click.Command):
    """Lists the installed attachers in ``--help``: they come from plugins."""

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        found = _attachers()
        with formatter.section("Attachers (from plugins)"):
            formatter.write_dl(
                [(n, a.description) for n, a in sorted(found.items())] or [("", "none")]
            )


@click.command(cls=_AttachCommand)
@socket_option
@click.argument("name")
@click.option("--once", is_flag=True, help="Send what is there now, then exit.")
@click.option("--url", default=None, help="The server to attach to (opencode).")
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where the agent keeps its sessions, when not its default (claude-code: the config dir).",
)
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where resume points are kept (default: $XDG_STATE_HOME/busd/attach/NAME).",
)
def attach(
    socket_path: Path | None,
    name: str,
    once: bool,
    url: str | None,
    directory: Path | None,
    state_dir: Path | None,
) -> None:
    """Follow the sessions of an agent busd did not start (NAME: `busd plugins` lists them).

    \b
    busd attach claude-code            every Claude Code session as it happens
    busd attach opencode --url URL     a running OpenCode server (its TUI runs one)
    """
    attachers = _attachers()
    attacher = attachers.get(name)
    if attacher is None:
        known = ", ".join(sorted(attachers)) or "none"
        fail(f"no attacher {name!r} is installed (installed: {known})", 2)
    state = state_dir or default_state_dir(name)
    try:
        state.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        fail(f"cannot use {state} for resume points: {exc.strerror or exc}", 2)
    path = resolve_socket(socket_path)
    options = AttachOptions(state_dir=state, once=once, url=url, directory=directory)

    async def run() -> int:
        link = _Link()
        while True:
            try:
                return await _attach_once(path, attacher, options, on_connect=link.connected)
            except (ConnectionLost, DaemonNotRunning) as exc:
                forbidden = isinstance(exc, ConnectionLost) and exc.reason == "forbidden"
                if once or forbidden or not link.ever:
                    raise
                link.lost(exc)
            except BusdError as exc:  # the attacher cannot go on: no such directory...
                fail(str(exc), 2)
            await trio.sleep(link.backoff)  # the daemon restarting: resume points say where
            link.backoff = min(link.backoff * 2, 10.0)

    run_client(run)


class _Link:
    """The daemon connection across restarts: said once when lost, once when back."""

    def __init__(self) -> None:
        self.ever = False  # a daemon that was never reached is an error, not a wait
        self.away = False
        self.backoff = 0.5

    def lost(self, exc: Exception) -> None:
        if not self.away:
            click.echo(f"busd: lost the daemon ({exc}); reconnecting", err=True)
        self.away = True

    def connected(self) -> None:
        if self.away:
            click.echo("busd: the daemon is back; resuming", err=True)
        self.ever, self.away, self.backoff = True, False, 0.5


async def _attach_once(
    path: Path,
    attacher: Attacher,
    options: AttachOptions,
    *,
    on_connect: Callable[[], None] = lambda: None,
) -> int:
    """One connection's worth of attaching; returns the exit code when done or stopped.

    A lone error out of the attacher's nursery is raised as itself, so the
    caller can tell a lost daemon from an attacher that cannot go on.
    """
    try:
        return await _attach_connected(path, attacher, options, on_connect)
    except BaseExceptionGroup as group:
        lone = lone_error(group)
        if isinstance(lone, Exception):
            raise lone from None
        raise


async def _attach_connected(
    path: Path, attacher: Attacher, options: AttachOptions, on_connect: Callable[[], None]
) -> int:
    async with busd_connect(path, client=f"busd-attach-{attacher.name}", role="agent") as client:
        sink = ClientSink(client, max_frame=client.limits.max_frame)
        stopped = False
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            on_connect()  # said once a signal would stop it cleanly, not before
            async with trio.open_nursery() as nursery:

                async def stop_on_signal() -> None:
                    nonlocal stopped
                    async for _ in signals:
                        stopped = True
                        nursery.cancel_scope.cancel()
                        return

                async def end_with_the_connection() -> None:
                    """An idle attacher sends nothing: notice a daemon that went away anyway."""
                    while (stats := await client.wait_connection_change()).connected:
                        pass
                    raise ConnectionLost("closed", stats.last_lost or "the daemon went away")

                nursery.start_soon(stop_on_signal)
                nursery.start_soon(end_with_the_connection)
                await attacher.attach(sink, options)
                nursery.cancel_scope.cancel()
        journaled = await sink.checkpoint()
        said = "stopped" if stopped else "done"
        sessions = len(sink.sessions)
        click.echo(
            f"busd: attach {attacher.name} {said}: {sink.events} payload(s)"
            f" from {sessions} session(s)"
            + (f", {sink.skipped} skipped" if sink.skipped else "")
            + ("" if journaled else " (the daemon keeps no journal: not durable)"),
            err=True,
        )
    return 0
