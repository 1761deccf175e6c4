"""The Unix-socket server: accept, check the peer, serve; stop gracefully.

:class:`Server` accepts on a listening socket and runs one
:class:`~busd.daemon.connection.Connection` per client in a nursery of
connections, apart from the daemon's services. Peers are checked with
``SO_PEERCRED`` before a byte is read: only the daemon's uid and root get in;
a uid keeps a small number of sockets waiting for their hello, and its
connection limit counts those past it.

:func:`serve` is what ``busd serve`` runs: it binds (or adopts a systemd
socket), tells systemd when it is ready, and on SIGTERM or SIGINT flushes
every subscription, says goodbye to every client and returns within the
configured grace period.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
from collections.abc import Callable
from functools import partial
from pathlib import Path

import trio

from ..wire import FORBIDDEN, SHUTDOWN, Error, encode_frame
from ..wire.address import peer_allowed, peer_credentials
from . import systemd
from .connection import Connection
from .endpoint import Endpoint
from .hub import Daemon
from .outbox import close_gracefully

__all__ = ["Server", "serve"]

logger = logging.getLogger("busd.server")


class Server:
    """Serves a :class:`Daemon` on a listening ``AF_UNIX`` socket.

    The daemon's own services (journal, accounting, fan-out, plugins) run in
    one nursery and the connections in another inside it, as hypercorn
    splits its lifespan and server nurseries: each connection is served
    under its own guard, so no client's failure ever reaches the services.
    """

    def __init__(self, daemon: Daemon, sock: socket.socket, *, uid: int | None = None) -> None:
        self.daemon = daemon
        self._sock = sock
        self._uid = os.getuid() if uid is None else uid
        self._connections: set[Connection] = set()
        self._nursery: trio.Nursery | None = None
        self._listener: trio.SocketListener | None = None
        self._drained = trio.Event()
        self._told_send_cap = False

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the daemon and accept clients until cancelled (or :meth:`shutdown`)."""
        self._sock.setblocking(False)
        listener = trio.SocketListener(trio.socket.from_stdlib_socket(self._sock))
        self._listener = listener
        async with trio.open_nursery() as services:
            self._nursery = services
            await services.start(self.daemon.run)
            async with trio.open_nursery() as connections:
                connections.start_soon(self._accept_loop, listener, connections)
                task_status.started()

    async def _accept_loop(self, listener: trio.SocketListener, connections: trio.Nursery) -> None:
        while True:
            try:
                stream = await listener.accept()
            except trio.ClosedResourceError:
                return
            except OSError as exc:  # EMFILE and friends: back off, keep serving
                logger.warning("accept failed: %s", exc)
                await trio.sleep(0.1)
                continue
            connections.start_soon(self._serve_client, stream)

    async def _serve_client(self, stream: trio.SocketStream) -> None:
        """One client from accept to close; nothing it raises reaches the server's nursery."""
        try:
            await self._admit_and_serve(stream)
        except* Exception as failure:  # a connection contains its own: this is the backstop
            self.daemon.counters.internal_errors += 1
            logger.error("a connection failed; it is closed, the daemon goes on", exc_info=failure)
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)

    async def _admit_and_serve(self, stream: trio.SocketStream) -> None:
        creds = peer_credentials(stream.socket)
        if not peer_allowed(creds, server_uid=self._uid):
            refusal = Error(
                code=FORBIDDEN,
                message=f"uid {creds.uid} may not use this daemon (it serves uid {self._uid})",
                fatal=True,
            )
            self.daemon.counters.refused_peers += 1
            logger.warning("refused pid %d uid %d: %s", creds.pid, creds.uid, refusal.code)
            with trio.move_on_after(1.0):
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    await stream.send_all(encode_frame(refusal))
            await close_gracefully(stream)
            return
        self._size_send_buffer(stream.socket)
        self._make_room(creds.uid)
        connection = Connection(self.daemon, stream, uid=creds.uid, pid=creds.pid)
        self._connections.add(connection)
        try:
            await connection.serve()
        finally:
            self._connections.discard(connection)
            if not self._connections:
                self._drained.set()

    def _size_send_buffer(self, sock: trio.socket.SocketType) -> None:
        """A window's frame goes to the kernel in one write, not a partial one finished later.

        Linux's default (about 208 KiB) is less than a busy 16 ms window for
        many subscribers; each partial write then costs the writer task a
        round per subscriber. ``net.core.wmem_max`` caps what we ask: said
        once, at info level.
        """
        size = self.daemon.config.send_buffer
        if not size:
            return
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)
            got = sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) // 2  # Linux doubles it
        except OSError as exc:  # not worth refusing a client over
            logger.warning("could not size a client's send buffer: %s", exc)
            return
        if got < size and not self._told_send_cap:
            self._told_send_cap = True
            logger.info(
                "client send buffers are %d bytes, not %d: the kernel caps them "
                "(sysctl net.core.wmem_max)",
                got,
                size,
            )

    def _make_room(self, uid: int) -> None:
        """Keep fewer than ``max_handshakes_per_uid`` of a uid's sockets waiting for hello.

        The oldest waiting ones are closed for the newcomer: sockets that
        never say hello cannot lock out a client that does.
        """
        allowance = self.daemon.config.max_handshakes_per_uid
        waiting = sorted(
            (c for c in self._connections if c.uid == uid and c.in_handshake),
            key=lambda c: c.client_id,
        )
        for connection in waiting[: max(0, len(waiting) - allowance + 1)]:
            connection.evict(
                f"closed for a newer connection: uid {uid} has {allowance} sockets "
                "waiting to say hello"
            )

    @property
    def connections(self) -> int:
        return len(self._connections)

    async def shutdown(self, reason: str = SHUTDOWN) -> None:
        """Stop accepting, flush and say goodbye to everyone, then stop everything.

        Bounded by the daemon's ``shutdown_grace``: each goodbye flushes for
        a second at most, then waits for its client to read it; whoever is
        not done by the deadline is cut off.
        """
        deadline = trio.current_time() + self.daemon.config.shutdown_grace
        if self._listener is not None:
            await self._listener.aclose()
        async with trio.open_nursery() as nursery:  # each goodbye bounds its own flush
            for connection in list(self._connections):
                nursery.start_soon(partial(connection.goodbye, reason, deadline=deadline))
        with trio.move_on_at(deadline):
            if self._connections:  # each closes its stream on the way out
                self._drained = trio.Event()
                await self._drained.wait()
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()


async def serve(
    path: Path,
    daemon: Daemon | Callable[[], Daemon],
    *,
    on_ready: Callable[[str], None] = lambda where: None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Bind ``path`` (or adopt systemd's socket) and serve until SIGTERM or SIGINT.

    ``daemon`` may be a function that makes it once the socket is ours, so a
    second ``busd serve`` is told the socket is taken before it touches the
    first one's journal.
    """
    activated = systemd.listen_fds()
    for extra in activated[1:]:
        logger.warning("ignoring extra socket-activated fd %d: busd serves one", extra.fileno())
        extra.close()
    endpoint = Endpoint.adopt(activated[0]) if activated else Endpoint.bind(path)
    with endpoint, trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        if not isinstance(daemon, Daemon):
            daemon = daemon()
        where = str(endpoint.path) if endpoint.path is not None else "a systemd socket"
        daemon.socket_path = where
        server = Server(daemon, endpoint.socket)
        async with trio.open_nursery() as nursery:
            await nursery.start(server.run)
            systemd.notify(f"READY=1\nSTATUS=listening on {where}")
            on_ready(where)
            task_status.started()
            async for signum in signals:
                logger.info("got %s: shutting down", signal.Signals(signum).name)
                break
            systemd.notify("STOPPING=1")
            await server.shutdown()
            nursery.cancel_scope.cancel()
