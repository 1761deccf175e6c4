"""The client checks who listens on the socket before it says a word (issue 15).

In a directory others can write to (``/tmp``), another user can bind the
socket path first. The client reads the server's credentials with
``SO_PEERCRED`` right after ``connect`` and talks only to a server run by its
own uid or by root; a stranger gets nothing, not even the hello.
"""

from __future__ import annotations

import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio

from busd.client import ConnectionLost, connect
from busd.core.events import SessionInfo
from busd.wire.address import PeerCredentials, server_allowed, untrusted_server

from .daemon_helpers import BUSD, running_daemon

NOBODY = 65534
needs_root = pytest.mark.skipif(
    os.getuid() != 0, reason="a listener run by another uid needs root to start it"
)

# Drops to nobody *before* it binds, so the kernel records uid 65534 as the
# server; then takes one connection and reports, as hex, every byte it got.
_FOREIGN_LISTENER = """
import os, socket, sys
os.setgroups([])
os.setgid(65534)
os.setuid(65534)
with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
    server.bind(sys.argv[1])
    server.listen(1)
    print("ready", flush=True)
    server.settimeout(30)
    conn, _ = server.accept()
    with conn:
        conn.settimeout(30)
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
print("received " + data.hex(), flush=True)
"""


@dataclass
class ForeignListener:
    """A socket in a shared sticky directory, bound and listened on by uid 65534."""

    path: Path
    process: subprocess.Popen[str]

    def received(self) -> bytes:
        """Every byte the one connection carried (waits for it to close)."""
        out, err = self.process.communicate(timeout=60)
        assert self.process.returncode == 0, err
        (line,) = out.splitlines()
        assert line.startswith("received "), out
        return bytes.fromhex(line.removeprefix("received "))

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.communicate()


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """Like ``/tmp``: world-writable and sticky (short enough for ``AF_UNIX``)."""
    path = Path(tempfile.mkdtemp(prefix="busd-", dir="/tmp"))
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def start_foreign(path: Path) -> ForeignListener:
    """Start a listener run by uid 65534 on ``path``; returns once it listens."""
    process = subprocess.Popen(
        [sys.executable, "-c", _FOREIGN_LISTENER, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    if process.stdout.readline() != "ready\n":
        process.kill()
        pytest.fail(f"the foreign listener did not start: {process.communicate()[1]}")
    assert path.stat().st_uid == NOBODY
    return ForeignListener(path, process)


@pytest.fixture
def foreign(shared_dir: Path) -> Iterator[ForeignListener]:
    listener = start_foreign(shared_dir / "bus.sock")
    yield listener
    listener.stop()


# -- the decision ----------------------------------------------------------------


def test_a_server_of_the_clients_own_uid_is_trusted() -> None:
    assert server_allowed(PeerCredentials(pid=10, uid=1000, gid=1000), client_uid=1000)


def test_a_server_run_by_root_is_trusted() -> None:
    assert server_allowed(PeerCredentials(pid=1, uid=0, gid=0), client_uid=1000)


def test_a_server_of_another_uid_is_not_trusted() -> None:
    assert not server_allowed(PeerCredentials(pid=10, uid=1001, gid=1000), client_uid=1000)
    assert not server_allowed(PeerCredentials(pid=10, uid=NOBODY, gid=NOBODY), client_uid=0)


def test_the_default_client_uid_is_ours() -> None:
    mine = PeerCredentials(pid=10, uid=os.getuid(), gid=os.getgid())
    assert server_allowed(mine)


class _FakeSocket:
    """Answers ``SO_PEERCRED`` as the kernel would for a server run by ``creds``."""

    def __init__(self, creds: PeerCredentials) -> None:
        self.creds = creds

    def getsockopt(self, level: int, optname: int, buflen: int, /) -> bytes:
        assert (level, optname) == (socket.SOL_SOCKET, socket.SO_PEERCRED)
        return struct.pack("3i", *self.creds)


def test_the_refusal_names_the_path_the_server_and_us() -> None:
    stranger = _FakeSocket(PeerCredentials(pid=123, uid=NOBODY, gid=NOBODY))
    message = untrusted_server(stranger, "/tmp/x.sock", client_uid=1000)
    assert message == (
        "busd at /tmp/x.sock is run by uid 65534 (pid 123), "
        "not by you (uid 1000) or root: refusing to talk to it"
    )
    assert "\n" not in message


def test_a_trusted_server_gets_no_refusal() -> None:
    own = _FakeSocket(PeerCredentials(pid=123, uid=1000, gid=1000))
    root = _FakeSocket(PeerCredentials(pid=1, uid=0, gid=0))
    assert untrusted_server(own, "/tmp/x.sock", client_uid=1000) is None
    assert untrusted_server(root, "/tmp/x.sock", client_uid=1000) is None


# -- over real sockets -------------------------------------------------------------


@needs_root
async def test_a_server_of_another_uid_is_refused_before_the_hello(
    foreign: ForeignListener,
) -> None:
    with trio.fail_after(10), pytest.raises(ConnectionLost) as caught:
        async with connect(foreign.path, client="secret-name"):
            pytest.fail("connected to a stranger")
    assert caught.value.reason == "forbidden"
    message = str(caught.value)
    assert f"busd at {foreign.path} is run by uid {NOBODY} (pid {foreign.process.pid})" in message
    assert f"not by you (uid {os.getuid()}) or root" in message
    assert await trio.to_thread.run_sync(foreign.received) == b""  # not a byte of the hello


@needs_root
async def test_a_reconnecting_client_is_refused_at_once(foreign: ForeignListener) -> None:
    with trio.fail_after(10), pytest.raises(ConnectionLost) as caught:
        async with connect(foreign.path, reconnect=True):
            pytest.fail("connected to a stranger")
    assert caught.value.reason == "forbidden"
    assert await trio.to_thread.run_sync(foreign.received) == b""


@needs_root
async def test_a_stranger_who_takes_the_path_while_we_reconnect_gets_nothing(
    shared_dir: Path,
) -> None:
    """The daemon goes away, another user binds its path: queued publishes stay with us."""
    path = shared_dir / "bus.sock"
    daemon_scope = trio.CancelScope()
    daemon_gone = trio.Event()

    async def serve(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with daemon_scope:
            async with running_daemon(path):
                task_status.started()
                await trio.sleep_forever()
        daemon_gone.set()  # its socket file is removed

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(serve)
            async with connect(path, client="ui", reconnect=True) as client:
                await client.flush()
                daemon_scope.cancel()
                await daemon_gone.wait()
                client.publish_nowait(SessionInfo(message="secret"), session_id="s1")
                listener = await trio.to_thread.run_sync(start_foreign, path)
                try:
                    received = await trio.to_thread.run_sync(listener.received)
                finally:
                    listener.stop()
    assert received == b""


async def test_a_daemon_of_our_own_uid_is_trusted(shared_dir: Path) -> None:
    path = shared_dir / "bus.sock"
    async with running_daemon(path), connect(path, role="agent") as client:
        acked = await client.publish(SessionInfo(message="hi"), session_id="s1", ack=True)
    assert acked is not None


@needs_root
@pytest.mark.parametrize(
    "command",
    [
        ("status",),
        ("publish", "stream.session.info", "--field", "message=secret", "--session", "s1"),
    ],
)
def test_the_cli_refuses_a_stranger_with_one_line(
    foreign: ForeignListener, command: tuple[str, ...]
) -> None:
    result = subprocess.run(
        [*BUSD, *command, "--socket", str(foreign.path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith("busd: ")
    assert "forbidden" in line
    assert "lost the daemon" not in line  # refused at the door, not lost
    assert f"is run by uid {NOBODY}" in line
    assert "Traceback" not in result.stderr
    assert foreign.received() == b""
