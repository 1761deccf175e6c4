"""How a client and the daemon find each other: the socket path rule and peer credentials.

Both ends follow the same rule, so it lives with the protocol rather than in
the daemon: ``--socket PATH``, else ``$BUSD_SOCKET``, else
``$XDG_RUNTIME_DIR/busd/bus.sock``, made absolute and checked against the
``sun_path`` limit of 107 bytes. ``SO_PEERCRED`` tells either end who is on
the other side of a Unix socket, and each end trusts the same peers: its own
uid and root (:func:`peer_allowed` for the daemon, :func:`server_allowed`
and :func:`untrusted_server` for a client).
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Final, NamedTuple, Protocol

from ..core.errors import BusdError

__all__ = [
    "MAX_SOCKET_PATH",
    "EndpointError",
    "PeerCredentials",
    "default_socket_path",
    "peer_allowed",
    "peer_credentials",
    "resolve_socket_path",
    "server_allowed",
    "untrusted_server",
]

MAX_SOCKET_PATH: Final = 107
"""Longest ``AF_UNIX`` path in bytes on Linux: ``sun_path`` is 108 bytes, NUL included."""

_PEERCRED: Final = struct.Struct("3i")


class EndpointError(BusdError, OSError):
    """The daemon's socket cannot be placed, bound or checked; the message says what to do."""


def default_socket_path(environ: Mapping[str, str] = os.environ) -> Path:
    """``$XDG_RUNTIME_DIR/busd/bus.sock``: per user, on tmpfs, gone at logout."""
    runtime = environ.get("XDG_RUNTIME_DIR", "")
    if not runtime or not os.path.isabs(runtime):
        problem = "is not set" if not runtime else f"is not an absolute path ({runtime!r})"
        raise EndpointError(
            f"XDG_RUNTIME_DIR {problem}, so busd has no default socket path; "
            "pass --socket PATH, or set BUSD_SOCKET or XDG_RUNTIME_DIR"
        )
    return Path(runtime, "busd", "bus.sock")


def resolve_socket_path(
    explicit: str | os.PathLike[str] | None, environ: Mapping[str, str] = os.environ
) -> Path:
    """The one rule the server and every client use: ``--socket``, ``$BUSD_SOCKET``, default.

    The result is absolute (so a message names the same file whatever the
    working directory) and short enough to bind or connect to.
    """
    if explicit is not None:
        raw = os.fspath(explicit)
        if not raw:
            raise EndpointError("--socket was given an empty path")
        path = Path(raw)
    elif environ.get("BUSD_SOCKET"):
        path = Path(environ["BUSD_SOCKET"])
    else:
        path = default_socket_path(environ)
    path = Path(os.path.abspath(path))
    size = len(os.fsencode(path))
    if size > MAX_SOCKET_PATH:
        raise EndpointError(
            f"socket path is {size} bytes, over the {MAX_SOCKET_PATH}-byte limit of Unix "
            f"sockets: {path}; choose a shorter --socket PATH"
        )
    return path


class _HasGetsockopt(Protocol):
    """A stdlib or Trio socket: all :func:`peer_credentials` needs."""

    def getsockopt(self, level: int, optname: int, buflen: int, /) -> int | bytes: ...


class PeerCredentials(NamedTuple):
    """Who is at the other end of a Unix socket, as the kernel saw it at ``connect``."""

    pid: int
    uid: int
    gid: int


def peer_credentials(sock: _HasGetsockopt) -> PeerCredentials:
    """The peer's pid, uid and gid via ``SO_PEERCRED`` (Linux); cannot be forged by the peer."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    assert isinstance(raw, bytes)
    return PeerCredentials._make(_PEERCRED.unpack(raw))


def peer_allowed(creds: PeerCredentials, *, server_uid: int | None = None) -> bool:
    """Whether a peer may use the daemon: the daemon's own uid (default: ours), or root."""
    if server_uid is None:
        server_uid = os.getuid()
    return creds.uid == server_uid or creds.uid == 0


def server_allowed(creds: PeerCredentials, *, client_uid: int | None = None) -> bool:
    """Whether a client may talk to a server: one run by the client's uid (default: ours), or root.

    The mirror of :func:`peer_allowed`. It matters where others can write to
    the socket's directory (``/tmp``): whoever binds the path first gets the
    connections, so a client checks before it sends a byte, its hello included.
    """
    if client_uid is None:
        client_uid = os.getuid()
    return creds.uid == client_uid or creds.uid == 0


def untrusted_server(
    sock: _HasGetsockopt, path: str | os.PathLike[str], *, client_uid: int | None = None
) -> str | None:
    """Why a client must not talk to the server at the other end of ``sock``; None if it may.

    ``sock`` is connected to ``path`` (named in the message only). The answer
    is one line naming the server's uid and pid, and the client's uid.
    """
    if client_uid is None:
        client_uid = os.getuid()
    creds = peer_credentials(sock)
    if server_allowed(creds, client_uid=client_uid):
        return None
    return (
        f"busd at {os.fspath(path)} is run by uid {creds.uid} (pid {creds.pid}), "
        f"not by you (uid {client_uid}) or root: refusing to talk to it"
    )
