"""Starting an ACP agent in a process group of its own, and ending every process of it.

The ACP SDK's ``spawn_agent_process`` starts the agent in busd's own process
group. Two things then go wrong with agents that start programs of their own
(claude-agent-acp starts Claude Code): Ctrl-C in the terminal of ``busd run``
reaches the agent too, which dies on it mid-conversation instead of being
cancelled the ACP way (``session/cancel``); and once the agent has exited,
what it started may still be running (its Claude Code outlived it, orphaned,
for a moment after ``busd run`` had exited).

So :func:`spawn_agent` is the SDK's, but the agent leads a new session (and
process group): only busd hears the terminal's Ctrl-C and stops the agent in
order. After the agent has exited (stdin closed, ``shutdown_timeout`` to
exit, then ``terminate``, then ``kill``: what the SDK does), whatever is left
of its process group gets SIGTERM, and SIGKILL after ``shutdown_timeout``: a
run leaves no process behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from asyncio import subprocess as aio_subprocess
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from .sdk_gaps import accept_newer_updates

if TYPE_CHECKING:
    from acp.client.connection import ClientSideConnection
    from acp.connection import StreamObserver
    from acp.interfaces import Agent, Client

__all__ = ["group_members", "spawn_agent"]

_POLL = 0.05


@asynccontextmanager
async def spawn_agent(
    to_client: Callable[[Agent], Client] | Client,
    command: str,
    *args: str,
    env: Mapping[str, str] | None,
    cwd: str | None,
    shutdown_timeout: float,
    observers: Sequence[StreamObserver] = (),
    base_env: Mapping[str, str] | None = None,
) -> AsyncIterator[tuple[ClientSideConnection, aio_subprocess.Process]]:
    """The agent as a process group of its own, and an ACP connection to it.

    Its environment is ``env`` over ``base_env`` (the run's starter's, whole),
    or over the SDK's trimmed copy of the daemon's when there is none.
    """
    from acp.client.connection import ClientSideConnection
    from acp.transports import default_environment

    process = await asyncio.create_subprocess_exec(
        command,
        *args,
        stdin=aio_subprocess.PIPE,
        stdout=aio_subprocess.PIPE,
        stderr=aio_subprocess.PIPE,
        env={**(default_environment() if base_env is None else base_env), **(env or {})},
        cwd=cwd,
        start_new_session=True,
    )
    try:
        conn = ClientSideConnection(
            to_client, process.stdin, process.stdout, observers=list(observers)
        )
        accept_newer_updates(conn)
        try:
            yield conn, process
        finally:
            await conn.close()
    finally:
        await _stop(process, shutdown_timeout)
        await _end_group(process.pid, shutdown_timeout)
        await _drain(process.stdout, shutdown_timeout)


async def _stop(process: aio_subprocess.Process, grace: float) -> None:
    """End of input, then ``grace`` seconds to exit, then terminate, then kill (the SDK's order)."""
    stdin = process.stdin
    if stdin is not None:
        with contextlib.suppress(Exception):
            stdin.write_eof()
        with contextlib.suppress(Exception):
            stdin.close()
            await stdin.wait_closed()
    for stop in (process.terminate, process.kill):
        try:
            await asyncio.wait_for(process.wait(), grace)
            return
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                stop()
    await process.wait()


async def _drain(stdout: asyncio.StreamReader | None, grace: float) -> None:
    """Read the agent's stdout to its end (up to ``grace`` seconds), so the pipe is closed.

    The agent's exit is seen apart from its pipes' ends: when the connection
    stopped reading first, the end of stdout may still wait in the event loop,
    which the run's thread then closes with the pipe open (a ``ResourceWarning``
    when it is collected; seen under load after a killed grandchild).
    """
    if stdout is None:
        return
    with contextlib.suppress(TimeoutError, OSError):
        async with asyncio.timeout(grace):
            while await stdout.read(1 << 16):
                pass  # the conversation is over: nothing left to feed


async def _end_group(group: int, grace: float) -> None:
    """SIGTERM to what is left of the agent's process group; SIGKILL after ``grace`` seconds.

    Then up to ``grace`` seconds more until the killed are gone: a SIGKILL is
    not an exit, and on a loaded machine the process lingers a moment after it.
    """
    if not group_members(group):
        return
    for signum in (signal.SIGTERM, signal.SIGKILL):
        _signal_group(group, signum)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        while group_members(group) and loop.time() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(_POLL)  # orphans: no exit to wait for, only their absence
        if not group_members(group):
            return


def _signal_group(group: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signum)


def group_members(group: int) -> list[int]:
    """The live processes of process group ``group`` (zombies are not: they have exited)."""
    proc = Path("/proc")
    if not (proc / "self").exists():  # no /proc: ask the kernel whether any is left
        try:
            os.killpg(group, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [group]
    members: list[int] = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue  # it ended meanwhile
        if int(fields[2]) == group and fields[0] != "Z":
            members.append(int(entry.name))
    return members
