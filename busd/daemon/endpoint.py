"""Where the daemon listens: binding the socket, one instance per path, cleanup.

Plain blocking code on purpose: it runs once at startup and once at shutdown.
The server wraps :attr:`Endpoint.socket` with ``trio.socket.from_stdlib_socket``.

The rules (written for users in ``docs/operations.md``):

- **Path.** ``--socket PATH``, else ``$BUSD_SOCKET``, else
  ``$XDG_RUNTIME_DIR/busd/bus.sock``
  (:func:`busd.wire.address.resolve_socket_path`, shared with clients).
- **Directory.** Created 0700 when missing (its parent must exist). An
  existing one must be owned by us or root, and must not be writable by
  group or others unless it is sticky (like ``/tmp``): whoever can write it
  can swap the socket for their own and read what clients send.
- **One instance.** ``bus.sock.lock`` beside the socket is held with
  ``flock`` for the daemon's life and holds its pid. A second instance gets
  :class:`AlreadyRunning` and touches nothing.
- **Stale sockets.** Holding the lock proves no other busd runs, so a socket
  file left by ``kill -9`` is unlinked before bind, after a connect probe
  shows nobody listens on it (a systemd-activated socket has a listener but
  no lock). Anything that is not a socket is refused and left alone.
- **Permissions at birth.** ``bind`` runs under ``umask 0177``, so the socket
  is 0600 from its first instant.
- **Listen queue.** As long as the kernel allows (``net.core.somaxconn``),
  so a burst of clients waits to be accepted instead of being refused.
- **Cleanup.** On exit the socket file is removed only if it is still the
  one we bound (same ``st_dev``/``st_ino``), then the lock file is removed
  while still held.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import socket
import stat
from pathlib import Path
from types import TracebackType
from typing import Self, TypeAlias

from ..wire.address import EndpointError, peer_credentials, resolve_socket_path

__all__ = ["AlreadyRunning", "Endpoint", "lock_path_for", "system_backlog"]

logger = logging.getLogger("busd.endpoint")

_Socket: TypeAlias = socket.socket  # the class below has a ``socket`` property


class AlreadyRunning(EndpointError):
    """Another live process already serves this socket path."""

    def __init__(self, path: Path, pid: int | None, *, detail: str = "holds the lock") -> None:
        who = f"pid {pid}" if pid is not None else "a process of unknown pid"
        super().__init__(f"busd is already running on {path}: {who} {detail}")
        self.path = path
        self.pid = pid


def system_backlog() -> int:
    """The longest listen queue the kernel grants (``net.core.somaxconn``)."""
    try:
        return int(Path("/proc/sys/net/core/somaxconn").read_text())
    except (OSError, ValueError):
        return socket.SOMAXCONN


def lock_path_for(path: Path) -> Path:
    """The single-instance lock file beside the socket: ``bus.sock`` → ``bus.sock.lock``."""
    return path.with_name(path.name + ".lock")


class Endpoint:
    """The daemon's listening socket and everything that must outlive it with it.

    Make one with :meth:`bind` (a socket busd owns: lock, stale reclaim,
    cleanup) or :meth:`adopt` (a socket systemd handed over: busd only closes
    it). Use it as a context manager, or call :meth:`close`.
    """

    __slots__ = ("_lock_fd", "_lock_id", "_sock", "_sock_id", "path")

    def __init__(self, sock: _Socket, path: Path | None) -> None:
        """Prefer :meth:`bind` or :meth:`adopt`: this owns ``sock`` and nothing else."""
        self._sock = sock
        self.path = path
        """Where the socket lives, or ``None`` for an unnamed or abstract adopted socket."""
        self._sock_id: tuple[int, int] | None = None
        self._lock_fd: int | None = None
        self._lock_id: tuple[int, int] | None = None

    @property
    def socket(self) -> _Socket:
        """The listening ``AF_UNIX`` stream socket (blocking until the server wraps it)."""
        return self._sock

    @property
    def owns_path(self) -> bool:
        """Whether closing will remove the socket file (true for :meth:`bind`)."""
        return self._sock_id is not None

    @classmethod
    def bind(cls, path: str | os.PathLike[str], *, backlog: int | None = None) -> Self:
        """Become the one instance serving ``path`` and listen on it.

        The listen queue is as long as the system allows (``backlog=None``):
        connections that arrive in a burst wait there to be accepted instead
        of failing with ``EAGAIN``.

        :raises AlreadyRunning: another process holds the lock or listens on
            ``path``; nothing was changed.
        :raises EndpointError: the directory is unsafe, ``path`` is taken by a
            non-socket, or the OS refused; the message names the file.
        """
        path = resolve_socket_path(path, {})
        _prepare_directory(path.parent)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        endpoint = cls(sock, path)
        try:
            endpoint._lock_fd, endpoint._lock_id = _acquire_lock(path, lock_path_for(path))
            _clear_stale_socket(path)
            old_umask = os.umask(0o177)
            try:
                sock.bind(os.fspath(path))
            finally:
                os.umask(old_umask)
            st = os.stat(path, follow_symlinks=False)
            endpoint._sock_id = (st.st_dev, st.st_ino)
            sock.listen(system_backlog() if backlog is None else backlog)
        except BaseException as exc:
            endpoint.close()
            if isinstance(exc, OSError) and not isinstance(exc, EndpointError):
                raise EndpointError(f"cannot listen on {path}: {exc.strerror or exc}") from exc
            raise
        return endpoint

    @classmethod
    def adopt(cls, sock: _Socket, path: str | os.PathLike[str] | None = None) -> Self:
        """Serve on a socket that is already bound and listening (systemd socket activation).

        No lock and no unlinking: whoever bound the socket owns its file.
        ``path`` defaults to the socket's own address.

        :raises EndpointError: ``sock`` is not a listening ``AF_UNIX`` stream socket.
        """
        if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
            raise EndpointError(
                f"busd serves on a Unix stream socket; was given {sock.family.name} "
                f"{sock.type.name}"
            )
        if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            raise EndpointError("the socket handed to busd is not listening")
        if path is None:
            name = sock.getsockname()
            path = name if isinstance(name, str) and name else None
        return cls(sock, None if path is None else Path(path))

    def close(self) -> None:
        """Stop listening and remove what :meth:`bind` created; safe to call twice.

        Cleanup never raises: a shutdown must finish. A socket file that is no
        longer ours (replaced by a newer instance) is left alone.
        """
        self._sock.close()
        if self._sock_id is not None:
            assert self.path is not None
            _unlink_if_same(self.path, self._sock_id)
            self._sock_id = None
        if self._lock_fd is not None:
            assert self.path is not None
            assert self._lock_id is not None
            _unlink_if_same(lock_path_for(self.path), self._lock_id)
            os.close(self._lock_fd)  # releases the flock, after the unlink
            self._lock_fd = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._sock.fileno() == -1 else "listening"
        return f"<Endpoint {state} on {self.path}>"


def _prepare_directory(directory: Path) -> None:
    """Create ``directory`` 0700, or check that nobody else can swap files in it."""
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    except FileNotFoundError as exc:
        if directory.parent.is_dir():  # a file system that has no such directories (/proc)
            raise EndpointError(f"cannot create {directory}: {exc.strerror}") from None
        raise EndpointError(
            f"cannot create {directory}: {directory.parent} does not exist"
        ) from None
    except OSError as exc:
        raise EndpointError(f"cannot create {directory}: {exc.strerror}") from exc
    else:
        os.chmod(directory, 0o700)  # the umask may have taken bits away; never adds any
        return
    st = os.stat(directory)
    if not stat.S_ISDIR(st.st_mode):
        raise EndpointError(f"{directory} exists and is not a directory")
    if st.st_uid not in (os.getuid(), 0):
        raise EndpointError(
            f"{directory} belongs to uid {st.st_uid}; busd places its socket only in a "
            "directory owned by its own user or root"
        )
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise EndpointError(
            f"{directory} is writable by other users (mode {stat.S_IMODE(st.st_mode):04o}) "
            "and not sticky, so anyone could replace the socket; use a private directory"
        )


def _acquire_lock(path: Path, lock_path: Path) -> tuple[int, tuple[int, int]]:
    """Hold ``lock_path`` exclusively and write our pid into it.

    Loops if the file we locked was unlinked meanwhile (its holder was
    exiting): a lock on a file no longer at ``lock_path`` excludes nobody.
    """
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    while True:
        try:
            fd = os.open(lock_path, flags, 0o600)
        except OSError as exc:
            why = "it is a symlink" if exc.errno == errno.ELOOP else exc.strerror
            raise EndpointError(f"cannot open lock file {lock_path}: {why}") from exc
        try:
            fst = os.fstat(fd)
            if not stat.S_ISREG(fst.st_mode) or fst.st_uid != os.getuid():
                raise EndpointError(
                    f"lock file {lock_path} is not a regular file of uid {os.getuid()}"
                )
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise AlreadyRunning(path, _read_pid(fd)) from None
            try:
                st = os.stat(lock_path, follow_symlinks=False)
            except FileNotFoundError:
                st = None
            if st is None or (st.st_dev, st.st_ino) != (fst.st_dev, fst.st_ino):
                os.close(fd)
                continue
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        return fd, (fst.st_dev, fst.st_ino)


def _read_pid(fd: int) -> int | None:
    """The pid a lock holder wrote, or ``None`` if it has not written it yet."""
    try:
        return int(os.pread(fd, 32, 0))
    except ValueError:
        return None


def _clear_stale_socket(path: Path) -> None:
    """Unlink a socket file nobody listens on; refuse anything else at ``path``."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise EndpointError(
            f"{path} exists and is {_describe(st.st_mode)}, not a socket; not touching it"
        )
    if st.st_uid != os.getuid():
        raise EndpointError(f"{path} is a socket of uid {st.st_uid}; not removing it")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.setblocking(False)
        try:
            probe.connect(os.fspath(path))
        except (ConnectionRefusedError, FileNotFoundError):
            pass  # stale: the listener is gone
        except BlockingIOError:
            raise AlreadyRunning(path, None, detail="listens on it (backlog full)") from None
        else:
            pid = peer_credentials(probe).pid  # whoever called listen(), e.g. systemd
            raise AlreadyRunning(path, pid or None, detail="listens on it without the lock")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    logger.info("removed stale socket %s", path)


def _describe(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISREG(mode):
        return "a regular file"
    return "a special file"


def _unlink_if_same(path: Path, ident: tuple[int, int]) -> None:
    """Remove ``path`` only if it is still the file ``ident`` names."""
    try:
        st = os.stat(path, follow_symlinks=False)
        if (st.st_dev, st.st_ino) == ident:
            os.unlink(path)
        else:
            logger.info("%s was replaced by another file; leaving it", path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        logger.warning("cannot remove %s: %s", path, exc.strerror)
