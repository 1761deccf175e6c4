"""sd_notify and socket activation against real sockets and a real child process."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from busd.daemon.systemd import listen_fds, notify


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="busd-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def datagram_socket(address: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    sock.settimeout(5)
    return sock


# -- notify -------------------------------------------------------------------------------------


def test_notify_sends_the_state_as_one_datagram(short_dir: Path) -> None:
    address = os.fspath(short_dir / "notify")
    state = "READY=1\nSTATUS=listening on /run/user/1000/busd/bus.sock"
    with datagram_socket(address) as receiver:
        assert notify(state, {"NOTIFY_SOCKET": address}) is True
        assert notify("STOPPING=1", {"NOTIFY_SOCKET": address}) is True
        assert receiver.recv(4096) == state.encode()
        assert receiver.recv(4096) == b"STOPPING=1"


def test_notify_reaches_an_abstract_namespace_socket() -> None:
    name = f"busd-test-{os.getpid()}-{id(object())}"
    with datagram_socket("\0" + name) as receiver:
        assert notify("READY=1", {"NOTIFY_SOCKET": "@" + name}) is True
        assert receiver.recv(4096) == b"READY=1"


def test_notify_uses_the_process_environment_by_default(
    short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    address = os.fspath(short_dir / "notify")
    with datagram_socket(address) as receiver:
        monkeypatch.setenv("NOTIFY_SOCKET", address)
        assert notify("READY=1") is True
        assert receiver.recv(4096) == b"READY=1"


@pytest.mark.parametrize("env", [{}, {"NOTIFY_SOCKET": ""}])
def test_notify_without_systemd_sends_nothing(env: dict[str, str]) -> None:
    assert notify("READY=1", env) is False


@pytest.mark.parametrize("unusable", ["missing", "vsock"])
def test_broken_notify_socket_returns_false_and_warns_once(
    short_dir: Path, unusable: str, caplog: pytest.LogCaptureFixture
) -> None:
    # unique per run: the warning is once per address per process
    missing = os.fspath(short_dir / "gone")
    address = missing if unusable == "missing" else f"vsock:2:{short_dir.name}"
    with caplog.at_level(logging.WARNING, logger="busd.systemd"):
        assert notify("READY=1", {"NOTIFY_SOCKET": address}) is False
        assert notify("STOPPING=1", {"NOTIFY_SOCKET": address}) is False
    assert len(caplog.records) == 1
    assert address in caplog.records[0].getMessage()


# -- listen_fds ---------------------------------------------------------------------------------


def test_listen_fds_without_systemd_is_empty() -> None:
    assert listen_fds({}) == []


def test_listen_fds_meant_for_another_process_are_ignored_and_unset() -> None:
    env = {"LISTEN_PID": str(os.getpid() + 1), "LISTEN_FDS": "2", "LISTEN_FDNAMES": "a:b", "X": "1"}
    kept = dict(env)
    assert listen_fds(kept, unset=False) == []
    assert kept == env
    assert listen_fds(env) == []
    assert env == {"X": "1"}


def test_malformed_listen_variables_are_ignored_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = {"LISTEN_PID": "self", "LISTEN_FDS": "1"}
    with caplog.at_level(logging.WARNING, logger="busd.systemd"):
        assert listen_fds(env) == []
    assert "LISTEN_PID='self'" in caplog.text
    assert env == {}


ACTIVATED_CHILD = """
import fcntl, json, os, sys
passed = [fcntl.fcntl(int(fd), fcntl.F_DUPFD, 10) for fd in sys.argv[1:]]
for target, fd in enumerate(passed, start=3):  # where systemd would have put them
    os.dup2(fd, target)
    os.close(fd)
os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS=str(len(passed)), LISTEN_FDNAMES="a:b")
from busd.daemon.systemd import listen_fds
socks = listen_fds()
print(json.dumps({
    "fds": [s.fileno() for s in socks],
    "names": [s.getsockname() for s in socks],
    "stream": [s.type == s.type.SOCK_STREAM for s in socks],
    "inheritable": [s.get_inheritable() for s in socks],
    "env": sorted(k for k in os.environ if k.startswith("LISTEN_")),
}), flush=True)
for s in socks:
    conn, _ = s.accept()
    with conn:
        conn.sendall(conn.recv(16).upper())
"""


def test_activated_child_serves_on_the_sockets_it_was_passed(short_dir: Path) -> None:
    paths = [os.fspath(short_dir / "a.sock"), os.fspath(short_dir / "b.sock")]
    listeners = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in paths]
    for listener, path in zip(listeners, paths, strict=True):
        listener.bind(path)
        listener.listen()
    fds = [listener.fileno() for listener in listeners]
    child = subprocess.Popen(
        [sys.executable, "-c", ACTIVATED_CHILD, *map(str, fds)],
        pass_fds=fds,
        stdout=subprocess.PIPE,
        text=True,
    )
    with child:
        for listener in listeners:
            listener.close()  # the child's copies are the only ones left
        assert child.stdout is not None
        report = json.loads(child.stdout.readline())
        assert report == {
            "fds": [3, 4],
            "names": paths,
            "stream": [True, True],
            "inheritable": [False, False],
            "env": [],
        }
        for path, word in zip(paths, [b"hello", b"again"], strict=True):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
                client.settimeout(10)
                client.connect(path)
                client.sendall(word)
                assert client.recv(16) == word.upper()
    assert child.wait(timeout=10) == 0
