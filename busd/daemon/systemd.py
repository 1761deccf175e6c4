"""The two systemd protocols busd speaks, without libsystemd: readiness and socket activation.

Both are a few lines of socket code (see ``sd_notify(3)`` and
``sd_listen_fds(3)``), so busd implements them rather than depend on a C
binding. Outside systemd both are no-ops: :func:`notify` returns ``False`` and
:func:`listen_fds` returns ``[]``.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping, MutableMapping
from typing import Final

__all__ = ["LISTEN_FDS_START", "listen_fds", "notify"]

logger = logging.getLogger("busd.systemd")

LISTEN_FDS_START: Final = 3
"""The first file descriptor systemd passes (``SD_LISTEN_FDS_START``)."""

_LISTEN_VARS: Final = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")

_warned: set[str] = set()


def notify(state: str, environ: Mapping[str, str] = os.environ) -> bool:
    """Send ``state`` to systemd: ``"READY=1"``, ``"STOPPING=1"``, ``"STATUS=..."``, one per line.

    Best effort: returns whether the datagram was sent, and never raises for
    a missing, unsupported or broken ``$NOTIFY_SOCKET`` (a failure is logged
    once per address), because a daemon must not die for lack of a supervisor.
    """
    address = environ.get("NOTIFY_SOCKET", "")
    if not address:
        return False
    if address[0] == "@":
        target = "\0" + address[1:]  # abstract namespace
    elif address[0] == "/":
        target = address
    else:
        _warn_once(address, "unsupported address (only Unix sockets are)")
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(target)
            sock.sendall(state.encode())
    except OSError as exc:
        _warn_once(address, exc.strerror or str(exc))
        return False
    return True


def _warn_once(address: str, why: str) -> None:
    if address not in _warned:
        _warned.add(address)
        logger.warning("cannot notify systemd at NOTIFY_SOCKET=%s: %s", address, why)


def listen_fds(
    environ: MutableMapping[str, str] = os.environ, *, unset: bool = True
) -> list[socket.socket]:
    """The sockets systemd passed to this process (socket activation), in order; ``[]`` if none.

    They are fds ``3 .. 3+LISTEN_FDS-1`` when ``$LISTEN_PID`` is our pid
    (otherwise the variables were meant for an ancestor and leaked to us).
    The sockets are made close-on-exec. With ``unset`` (the default) the
    ``LISTEN_*`` variables are removed whatever their value, so processes busd
    spawns do not mistake the fds for theirs.
    """
    pid, count = environ.get("LISTEN_PID"), environ.get("LISTEN_FDS")
    if unset:
        for name in _LISTEN_VARS:
            environ.pop(name, None)
    if pid is None or count is None:
        return []
    try:
        if int(pid) != os.getpid():
            return []
        n = int(count)
    except ValueError:
        logger.warning("ignoring malformed LISTEN_PID=%r LISTEN_FDS=%r", pid, count)
        return []
    sockets = []
    for fd in range(LISTEN_FDS_START, LISTEN_FDS_START + n):
        sock = socket.socket(fileno=fd)
        sock.set_inheritable(False)
        sockets.append(sock)
    return sockets
