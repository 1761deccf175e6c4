"""The daemon's socket on a real filesystem: placement, permissions, one instance, peers."""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trio

from busd.core.errors import BusdError
from busd.daemon.endpoint import AlreadyRunning, Endpoint, lock_path_for
from busd.wire.address import (
    MAX_SOCKET_PATH,
    EndpointError,
    PeerCredentials,
    default_socket_path,
    peer_allowed,
    peer_credentials,
    resolve_socket_path,
)

NOBODY = 65534
needs_root = pytest.mark.skipif(os.getuid() != 0, reason="changing uid needs root")


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A private directory short enough for AF_UNIX paths (pytest's tmp_path may not be)."""
    path = Path(tempfile.mkdtemp(prefix="busd-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def sock_path(short_dir: Path) -> Path:
    return short_dir / "busd" / "bus.sock"


def assert_serves(path: Path, listener: socket.socket) -> None:
    """A client connecting to ``path`` reaches ``listener``, both ways."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(5)
        client.connect(os.fspath(path))
        listener.settimeout(5)
        conn, _ = listener.accept()
        with conn:
            client.sendall(b"ping")
            assert conn.recv(4) == b"ping"


def plain_listener(path: Path) -> socket.socket:
    """A listening socket bound without busd's help (as systemd or a foreign program would)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(os.fspath(path))
    sock.listen()
    return sock


def run_python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60
    )


# -- where the socket lives ---------------------------------------------------------------------


def test_default_socket_is_under_xdg_runtime_dir() -> None:
    env = {"XDG_RUNTIME_DIR": "/run/user/1000"}
    assert default_socket_path(env) == Path("/run/user/1000/busd/bus.sock")


def test_explicit_path_beats_busd_socket_which_beats_the_default() -> None:
    env = {"XDG_RUNTIME_DIR": "/run/user/7", "BUSD_SOCKET": "/srv/b.sock"}
    assert resolve_socket_path("/e/s.sock", env) == Path("/e/s.sock")
    assert resolve_socket_path(Path("/e/s.sock"), env) == Path("/e/s.sock")
    assert resolve_socket_path(None, env) == Path("/srv/b.sock")
    assert resolve_socket_path(None, {**env, "BUSD_SOCKET": ""}) == Path(
        "/run/user/7/busd/bus.sock"
    )


def test_relative_paths_are_made_absolute(short_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(short_dir)
    assert resolve_socket_path("b.sock", {}) == short_dir / "b.sock"
    assert resolve_socket_path(None, {"BUSD_SOCKET": "x/b.sock"}) == short_dir / "x" / "b.sock"


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ({}, "is not set"),
        ({"XDG_RUNTIME_DIR": ""}, "is not set"),
        ({"XDG_RUNTIME_DIR": "run/user/1"}, "not an absolute path"),
    ],
)
def test_no_usable_runtime_dir_says_how_to_choose_a_socket(
    env: dict[str, str], problem: str
) -> None:
    with pytest.raises(EndpointError, match=problem) as info:
        resolve_socket_path(None, env)
    for hint in ("--socket PATH", "BUSD_SOCKET", "XDG_RUNTIME_DIR"):
        assert hint in str(info.value)
    assert isinstance(info.value, BusdError)
    assert isinstance(info.value, OSError)


def test_empty_explicit_path_is_an_error() -> None:
    with pytest.raises(EndpointError, match="empty"):
        resolve_socket_path("", {"XDG_RUNTIME_DIR": "/run/user/1"})


def test_path_length_limit_is_exactly_what_the_kernel_binds(short_dir: Path) -> None:
    longest = short_dir / ("s" * (MAX_SOCKET_PATH - len(os.fsencode(short_dir)) - 1))
    too_long = Path(f"{longest}x")
    assert resolve_socket_path(longest, {}) == longest
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(os.fspath(longest))
    with socket.socket(socket.AF_UNIX) as sock, pytest.raises(OSError, match="too long"):
        sock.bind(os.fspath(too_long))
    with pytest.raises(EndpointError, match=f"108 bytes, over the {MAX_SOCKET_PATH}-byte limit"):
        resolve_socket_path(too_long, {})
    with pytest.raises(EndpointError, match="limit"):
        resolve_socket_path(None, {"XDG_RUNTIME_DIR": "/" + "r" * 100})


# -- permissions --------------------------------------------------------------------------------


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o277])
def test_directory_is_0700_and_socket_is_born_0600_whatever_the_umask(
    sock_path: Path, umask: int
) -> None:
    previous = os.umask(umask)
    try:
        with Endpoint.bind(sock_path) as endpoint:
            assert os.umask(umask) == umask  # restored after bind
            assert stat.S_IMODE(os.stat(sock_path.parent).st_mode) == 0o700
            mode = os.lstat(sock_path).st_mode
            assert stat.S_ISSOCK(mode)
            assert stat.S_IMODE(mode) == 0o600
            assert endpoint.path == sock_path
            assert_serves(sock_path, endpoint.socket)
    finally:
        os.umask(previous)


def test_existing_private_directory_is_used_as_it_is(short_dir: Path) -> None:
    os.chmod(short_dir, 0o755)
    with Endpoint.bind(short_dir / "bus.sock"):
        assert stat.S_IMODE(os.stat(short_dir).st_mode) == 0o755


def test_sticky_world_writable_directory_is_accepted(short_dir: Path) -> None:
    os.chmod(short_dir, 0o1777)
    with Endpoint.bind(short_dir / "bus.sock") as endpoint:
        assert_serves(short_dir / "bus.sock", endpoint.socket)


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o722])
def test_directory_others_can_write_is_refused(short_dir: Path, mode: int) -> None:
    os.chmod(short_dir, mode)
    with pytest.raises(EndpointError, match="writable by other users"):
        Endpoint.bind(short_dir / "bus.sock")
    assert list(short_dir.iterdir()) == []


@needs_root
def test_directory_owned_by_another_user_is_refused(short_dir: Path) -> None:
    os.chown(short_dir, NOBODY, NOBODY)
    with pytest.raises(EndpointError, match=f"belongs to uid {NOBODY}"):
        Endpoint.bind(short_dir / "bus.sock")
    assert list(short_dir.iterdir()) == []


def test_missing_grandparent_is_not_created(short_dir: Path) -> None:
    with pytest.raises(EndpointError, match="does not exist"):
        Endpoint.bind(short_dir / "nope" / "busd" / "bus.sock")
    assert not (short_dir / "nope").exists()


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_a_directory_the_file_system_cannot_have_is_not_called_missing_its_parent() -> None:
    """``mkdir`` in /proc fails with ENOENT although /proc is there."""
    with pytest.raises(EndpointError) as caught:
        Endpoint.bind(Path("/proc/busd-nope/bus.sock"))
    assert str(caught.value) == "cannot create /proc/busd-nope: No such file or directory"


def test_umask_is_restored_when_bind_fails(
    sock_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Refusing(socket.socket):
        def bind(self, address: object, /) -> None:
            raise OSError(errno.EADDRINUSE, os.strerror(errno.EADDRINUSE))

    monkeypatch.setattr(socket, "socket", Refusing)
    previous = os.umask(0o022)
    try:
        with pytest.raises(EndpointError, match="cannot listen on"):
            Endpoint.bind(sock_path)
        assert os.umask(0o022) == 0o022
    finally:
        os.umask(previous)
    monkeypatch.undo()
    assert list(sock_path.parent.iterdir()) == []  # the lock is released and removed
    with Endpoint.bind(sock_path) as endpoint:
        assert_serves(sock_path, endpoint.socket)


# -- one instance -------------------------------------------------------------------------------


def test_lock_file_beside_the_socket_holds_our_pid(sock_path: Path) -> None:
    with Endpoint.bind(sock_path):
        lock = lock_path_for(sock_path)
        assert lock == sock_path.with_name("bus.sock.lock")
        assert lock.read_text() == f"{os.getpid()}\n"


def test_second_instance_fails_naming_the_pid_and_the_first_keeps_serving(
    sock_path: Path,
) -> None:
    with Endpoint.bind(sock_path) as first:
        before = os.lstat(sock_path)
        with pytest.raises(AlreadyRunning) as info:
            Endpoint.bind(sock_path)
        assert info.value.pid == os.getpid()
        assert info.value.path == sock_path
        assert f"{sock_path}" in str(info.value)
        assert f"pid {os.getpid()}" in str(info.value)
        after = os.lstat(sock_path)
        assert (after.st_dev, after.st_ino) == (before.st_dev, before.st_ino)
        assert lock_path_for(sock_path).read_text() == f"{os.getpid()}\n"
        assert_serves(sock_path, first.socket)


SECOND_INSTANCE = """
import json, sys
from busd.daemon.endpoint import AlreadyRunning, Endpoint
try:
    Endpoint.bind(sys.argv[1])
except AlreadyRunning as exc:
    print(json.dumps({"pid": exc.pid, "message": str(exc)}))
    sys.exit(3)
"""


def test_second_instance_in_another_process_fails(sock_path: Path) -> None:
    with Endpoint.bind(sock_path) as first:
        child = run_python(SECOND_INSTANCE, os.fspath(sock_path))
        assert child.returncode == 3, child.stderr
        report = json.loads(child.stdout)
        assert report["pid"] == os.getpid()
        assert os.fspath(sock_path) in report["message"]
        assert_serves(sock_path, first.socket)


def test_listener_without_the_lock_is_not_evicted(sock_path: Path) -> None:
    sock_path.parent.mkdir(mode=0o700)
    with plain_listener(sock_path) as foreign:
        with pytest.raises(AlreadyRunning, match="listens on it") as info:
            Endpoint.bind(sock_path)
        assert info.value.pid == os.getpid()  # SO_PEERCRED names who called listen()
        assert not lock_path_for(sock_path).exists()
        probe, _ = foreign.accept()  # the probe that found it alive: connected, then hung up
        with probe:
            assert probe.recv(1) == b""
        assert_serves(sock_path, foreign)


HOLD_UNTIL_KILLED = """
import sys
from busd.daemon.endpoint import Endpoint
endpoint = Endpoint.bind(sys.argv[1])
print("ready", flush=True)
sys.stdin.read()
"""


def test_socket_left_by_kill_9_is_reclaimed(sock_path: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", HOLD_UNTIL_KILLED, os.fspath(sock_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    with child:
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n"
        child.kill()
        child.wait()
    assert stat.S_ISSOCK(os.lstat(sock_path).st_mode)
    assert lock_path_for(sock_path).read_text() == f"{child.pid}\n"
    with Endpoint.bind(sock_path) as endpoint:
        assert lock_path_for(sock_path).read_text() == f"{os.getpid()}\n"
        assert_serves(sock_path, endpoint.socket)


def test_closed_socket_file_is_reclaimed(sock_path: Path) -> None:
    sock_path.parent.mkdir(mode=0o700)
    plain_listener(sock_path).close()
    with Endpoint.bind(sock_path) as endpoint:
        assert_serves(sock_path, endpoint.socket)


def _regular_file(path: Path) -> None:
    path.write_text("precious")


def _directory(path: Path) -> None:
    path.mkdir()
    (path / "inside").write_text("precious")


def _symlink(path: Path) -> None:
    (path.parent / "target").write_text("precious")
    path.symlink_to(path.parent / "target")


@pytest.mark.parametrize(
    ("make", "kind"),
    [(_regular_file, "a regular file"), (_directory, "a directory"), (_symlink, "a symlink")],
)
def test_non_socket_at_the_path_is_refused_and_left_alone(
    sock_path: Path, make: Callable[[Path], None], kind: str
) -> None:
    sock_path.parent.mkdir(mode=0o700)
    make(sock_path)
    before = _snapshot(sock_path)
    with pytest.raises(EndpointError, match=f"is {kind}, not a socket"):
        Endpoint.bind(sock_path)
    assert _snapshot(sock_path) == before
    assert not lock_path_for(sock_path).exists()


def _snapshot(path: Path) -> tuple[int, str]:
    if path.is_symlink():
        content = os.readlink(path) + (path.parent / "target").read_text()
    elif path.is_dir():
        content = (path / "inside").read_text()
    else:
        content = path.read_text()
    return os.lstat(path).st_ino, content


def test_symlinked_lock_file_is_refused(sock_path: Path) -> None:
    sock_path.parent.mkdir(mode=0o700)
    target = sock_path.parent / "elsewhere"
    lock_path_for(sock_path).symlink_to(target)
    with pytest.raises(EndpointError, match="symlink"):
        Endpoint.bind(sock_path)
    assert not target.exists()


# -- the listen queue ---------------------------------------------------------------------------


def system_backlog() -> int:
    try:
        return int(Path("/proc/sys/net/core/somaxconn").read_text())
    except (OSError, ValueError):
        return socket.SOMAXCONN


def test_the_listen_queue_is_as_long_as_the_system_allows(sock_path: Path) -> None:
    """A burst of connections the daemon has not accepted yet waits instead of failing."""
    burst = min(system_backlog(), 400)
    with Endpoint.bind(sock_path):
        waiting = []
        try:
            for _ in range(burst):
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                waiting.append(sock)
                sock.setblocking(False)
                sock.connect(os.fspath(sock_path))  # BlockingIOError once the queue is full
        finally:
            for sock in waiting:
                sock.close()
    assert burst > 128 or burst == system_backlog()


# -- shutdown -----------------------------------------------------------------------------------


def test_exit_closes_and_removes_socket_and_lock(sock_path: Path) -> None:
    with Endpoint.bind(sock_path) as endpoint:
        assert endpoint.owns_path
    assert endpoint.socket.fileno() == -1
    assert list(sock_path.parent.iterdir()) == []
    endpoint.close()  # twice is harmless


def test_exit_leaves_a_socket_that_replaced_ours(sock_path: Path) -> None:
    with Endpoint.bind(sock_path):
        os.unlink(sock_path)
        newer = plain_listener(sock_path)
    with newer:
        assert stat.S_ISSOCK(os.lstat(sock_path).st_mode)
        assert_serves(sock_path, newer)
    assert not lock_path_for(sock_path).exists()


def test_adopted_socket_is_closed_but_its_file_is_kept(sock_path: Path) -> None:
    sock_path.parent.mkdir(mode=0o700)
    sock = plain_listener(sock_path)
    with Endpoint.adopt(sock) as endpoint:
        assert endpoint.path == sock_path
        assert not endpoint.owns_path
        assert_serves(sock_path, endpoint.socket)
    assert sock.fileno() == -1
    assert stat.S_ISSOCK(os.lstat(sock_path).st_mode)
    assert not lock_path_for(sock_path).exists()


def test_adopting_an_abstract_socket_has_no_path() -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(f"\0busd-test-{os.getpid()}")
        sock.listen()
        assert Endpoint.adopt(sock).path is None
        assert Endpoint.adopt(sock, "/run/x.sock").path == Path("/run/x.sock")


def test_adopt_refuses_what_busd_cannot_serve_on(short_dir: Path) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as idle:
        idle.bind(os.fspath(short_dir / "idle.sock"))
        with pytest.raises(EndpointError, match="not listening"):
            Endpoint.adopt(idle)
    with (
        socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as dgram,
        pytest.raises(EndpointError, match="Unix stream socket"),
    ):
        Endpoint.adopt(dgram)


# -- peers --------------------------------------------------------------------------------------


def test_peer_credentials_of_a_socketpair_are_ours() -> None:
    a, b = socket.socketpair()
    with a, b:
        assert peer_credentials(a) == PeerCredentials(os.getpid(), os.getuid(), os.getgid())


def test_peer_credentials_accept_a_trio_socket() -> None:
    a, b = socket.socketpair()
    with trio.socket.from_stdlib_socket(a) as ta, b:
        assert peer_credentials(ta) == (os.getpid(), os.getuid(), os.getgid())


def test_peer_credentials_over_an_endpoint_connection(sock_path: Path) -> None:
    with (
        Endpoint.bind(sock_path) as endpoint,
        socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client,
    ):
        client.connect(os.fspath(sock_path))
        conn, _ = endpoint.socket.accept()
        with conn:
            creds = peer_credentials(conn)
            assert creds == PeerCredentials(os.getpid(), os.getuid(), os.getgid())
            assert peer_allowed(creds)


@pytest.mark.parametrize(
    ("peer_uid", "server_uid", "allowed"),
    [(1000, 1000, True), (0, 1000, True), (1001, 1000, False), (1000, 0, False), (0, 0, True)],
)
def test_peer_allowed_is_same_uid_or_root(peer_uid: int, server_uid: int, allowed: bool) -> None:
    creds = PeerCredentials(pid=42, uid=peer_uid, gid=peer_uid)
    assert peer_allowed(creds, server_uid=server_uid) is allowed


def test_peer_allowed_defaults_to_our_uid() -> None:
    other = 1 if os.getuid() == 0 else os.getuid() + 1
    assert peer_allowed(PeerCredentials(1, os.getuid(), 1))
    assert peer_allowed(PeerCredentials(1, other, 1)) is (other == 0)


def _connect_as_nobody(path: Path) -> int:
    """Fork a child that drops to uid/gid 65534 and connects; return its pid.

    The child's exit status is 0 after the server closes, or the errno of a failed connect.
    """
    pid = os.fork()
    if pid:
        return pid
    status = 1
    try:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(10)
            sock.connect(os.fspath(path))
            sock.recv(1)
        status = 0
    except OSError as exc:
        status = exc.errno or 1
    finally:
        os._exit(status)


@needs_root
def test_server_sees_the_uid_of_a_peer_that_dropped_privileges(short_dir: Path) -> None:
    os.chmod(short_dir, 0o755)
    path = short_dir / "open.sock"
    with plain_listener(path) as listener:
        os.chmod(path, 0o666)
        child = _connect_as_nobody(path)
        listener.settimeout(10)
        conn, _ = listener.accept()
        with conn:
            creds = peer_credentials(conn)
        _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert creds == PeerCredentials(child, NOBODY, NOBODY)
    assert not peer_allowed(creds)


@needs_root
def test_another_user_cannot_even_connect_to_the_endpoint(sock_path: Path) -> None:
    with Endpoint.bind(sock_path):
        os.chmod(sock_path.parent, 0o755)  # so only the socket's own 0600 stands in the way
        _, status = os.waitpid(_connect_as_nobody(sock_path), 0)
    assert os.waitstatus_to_exitcode(status) == errno.EACCES
