"""An ``opencode serve`` the driver starts itself when no OpenCode server answers.

A run whose base URL does not answer gets a server of its
own: :func:`serving` starts the ``opencode`` binary (the ``opencode_path``
option, else ``$BUSD_OPENCODE_PATH``, else ``opencode`` on ``PATH``:
:func:`find_opencode`) as ``opencode serve --port 0 --hostname 127.0.0.1``
in the run's working directory (so the project's ``opencode.json`` and the
user's OpenCode config apply), in a process group of its own, waits until
it prints its URL (:func:`listening_url`), and when the run ends or is
cancelled stops the whole group (``SIGTERM``, then ``SIGKILL``). When it
cannot (``start_server: false``, or no binary), :class:`NoServer` says
which URL was tried and how to get a server.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Final

import trio

from busd import BusdError

__all__ = [
    "NoServer",
    "ServerFailed",
    "find_opencode",
    "listening_url",
    "serving",
    "unreachable",
]

logger = logging.getLogger("busd.opencode")

PATH_ENV: Final = "BUSD_OPENCODE_PATH"
STARTUP_TIMEOUT: Final = 30.0
"""How long a started ``opencode serve`` has to say it listens."""
STOP_TIMEOUT: Final = 5.0
_TAIL: Final = 2000  # characters of the server's output kept for its error
_LISTENING: Final = re.compile(r"listening on (https?://\S+)")


class NoServer(BusdError, RuntimeError):
    """No OpenCode server answers at the URL, and busd may not or cannot start one."""


class ServerFailed(BusdError, RuntimeError):
    """The ``opencode serve`` busd started did not come up."""


# -- pure ------------------------------------------------------------------------------


def listening_url(output: str) -> str | None:
    """The URL ``opencode serve`` says it listens on (``None`` until it says so)."""
    found = _LISTENING.search(output)
    return found.group(1).rstrip("/") if found else None


def find_opencode(option: str | None, environ: Mapping[str, str]) -> str | None:
    """The ``opencode`` binary to start: the option, then ``$BUSD_OPENCODE_PATH``, then ``PATH``."""
    given = option or environ.get(PATH_ENV)
    if given:
        return given
    return shutil.which("opencode", path=environ.get("PATH"))


def unreachable(url: str, *, start_server: bool) -> NoServer:
    """The error for a URL nothing answers on, naming the ways to get a server."""
    start = "opencode serve --port 4096, then --option base_url=http://127.0.0.1:4096"
    if not start_server:
        return NoServer(
            f"no OpenCode server answers at {url}: start one ({start}), "
            "or drop start_server=false to let busd start it"
        )
    return NoServer(
        f"no OpenCode server answers at {url}, and busd cannot start one: "
        "no opencode on PATH (install it: npm install -g opencode-ai; "
        f"or --option opencode_path=/path/to/opencode, or ${PATH_ENV}), "
        f"or start one yourself ({start})"
    )


# -- I/O -------------------------------------------------------------------------------


@asynccontextmanager
async def serving(
    binary: str, *, cwd: str | None, env: Mapping[str, str] | None = None
) -> AsyncIterator[str]:
    """Run ``opencode serve`` on a free localhost port for the block; yields its URL.

    Its output goes to an unlinked temporary file (nothing has to keep
    reading it), which is polled for the URL: it is the only signal.
    """
    argv = [binary, "serve", "--port", "0", "--hostname", "127.0.0.1"]
    with tempfile.TemporaryFile() as log:
        try:
            process = await trio.lowlevel.open_process(
                argv,
                cwd=cwd,
                env=None if env is None else dict(env),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,  # its own group: what it starts is stopped with it
            )
        except OSError as exc:
            raise ServerFailed(f"cannot start {binary} serve: {exc}") from exc
        try:
            url = await _wait_listening(process, log.fileno(), binary)
            logger.info("opencode: started %s serve at %s (pid %d)", binary, url, process.pid)
            yield url
        finally:
            await _stop(process)


async def _wait_listening(process: trio.Process, fd: int, binary: str) -> str:
    """The URL the server prints, once it does; :class:`ServerFailed` if it exits or stalls."""
    with trio.move_on_after(STARTUP_TIMEOUT):
        while (url := listening_url(_head(fd))) is None:
            if process.returncode is not None:
                break
            await trio.sleep(0.05)  # an external program: its output is the only signal
        else:
            return url
    url = listening_url(_head(fd))
    if url is not None:
        return url
    why = "did not start in time" if process.returncode is None else "exited"
    tail = _head(fd)[-_TAIL:].strip()
    raise ServerFailed(f"{binary} serve {why}: {tail or 'it said nothing'}")


def _head(fd: int) -> str:
    """The start of the server's output (enough to hold its URL or its error)."""
    return os.pread(fd, 64 * _TAIL, 0).decode("utf-8", "replace")


async def _stop(process: trio.Process) -> None:
    """Stop the server's process group: ``SIGTERM``, a bounded wait, then ``SIGKILL``."""
    with trio.CancelScope(shield=True):
        _signal_group(process.pid, signal.SIGTERM)
        with trio.move_on_after(STOP_TIMEOUT):
            await process.wait()
        _signal_group(process.pid, signal.SIGKILL)  # whatever is left of the group
        await process.wait()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:  # pragma: no cover - the group's id was reused
        logger.warning("opencode: cannot signal process group %d", pgid)
