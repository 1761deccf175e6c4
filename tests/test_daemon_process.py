"""``busd serve`` and its client commands as real processes on a real socket."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from busd.core.catalog import Catalog
from busd.wire import (
    PROTOCOL_VERSION,
    Bye,
    Error,
    Frame,
    Goodbye,
    Hello,
    Subscribe,
    Unsubscribe,
    Welcome,
    encode_frame,
    server_frame_decoder,
)

from .daemon_helpers import BUSD, read_line, serving

PUBLISHER = """
import sys, trio
from busd.client import connect
from busd.core.events import SessionIdle, SessionInfo, TextDelta

async def main(path, count):
    async with connect(path, client="publisher", role="agent") as client:
        for i in range(count):
            session = "s1" if i % 2 else "s2"
            if i % 4:
                await client.publish(TextDelta(message_id="m", text=f"{i} "), session_id=session)
            else:
                await client.publish(SessionInfo(message=str(i)), session_id=session)
        await client.publish(SessionIdle(), session_id="s1")
        await client.flush()

trio.run(main, sys.argv[1], int(sys.argv[2]))
"""


@pytest.fixture
def sock_path() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="busd-", dir="/tmp"))
    yield directory / "run" / "bus.sock"
    shutil.rmtree(directory, ignore_errors=True)


async def busd(*args: str, check: bool = False) -> subprocess.CompletedProcess[bytes]:
    with trio.fail_after(60):
        return await trio.run_process(
            [*BUSD, *args], capture_stdout=True, capture_stderr=True, check=check
        )


async def test_serve_listens_with_private_permissions_and_reports_status(sock_path: Path) -> None:
    async with serving(sock_path):
        assert stat.S_IMODE(sock_path.stat().st_mode) == 0o600
        assert stat.S_IMODE(sock_path.parent.stat().st_mode) == 0o700
        result = await busd("status", "--json", "--socket", str(sock_path), check=True)
        status = json.loads(result.stdout)
        assert status["socket"] == str(sock_path)
        assert status["clients"] == 1


async def test_serve_leaves_its_startup_heap_out_of_garbage_collection(sock_path: Path) -> None:
    async with serving(sock_path, "--no-journal"):
        frozen = (await _status(sock_path))["gc"]
    async with serving(sock_path, "--no-journal", "--no-gc-freeze"):
        unfrozen = (await _status(sock_path))["gc"]
    # The imports, plugins and daemon: tens of thousands of objects a full collection skips.
    assert frozen["frozen"] > 10_000
    assert unfrozen["frozen"] == 0
    for gc in (frozen, unfrozen):
        assert len(gc["collections"]) == len(gc["pause_ms_longest"]) == 3


async def test_tail_processes_with_different_filters_each_get_exactly_their_events(
    sock_path: Path,
) -> None:
    count = 400
    every = [(i, "s1" if i % 2 else "s2") for i in range(count)]
    infos = [i for i, _ in every if i % 4 == 0]
    deltas_s1 = [i for i, s in every if i % 4 and s == "s1"]
    async with serving(sock_path), trio.open_nursery() as nursery:
        results: dict[str, subprocess.CompletedProcess[bytes]] = {}

        async def tail(name: str, *args: str) -> None:
            # --since 0: however the tail's start races the publisher, replay plus
            # live delivery must add up to exactly the stream, without gaps or doubles.
            results[name] = await busd(
                "tail",
                "--socket",
                str(sock_path),
                "--json",
                "--since",
                "0",
                "--timeout",
                "30",
                *args,
            )

        tails = {
            "infos": ("stream.session.info", "--count", str(len(infos))),
            "deltas": (
                "stream.text.delta",
                "--session",
                "s1",
                "--raw-deltas",
                "--count",
                str(len(deltas_s1)),
            ),
            "until-idle": ("stream.>", "--until", "stream.session.idle"),
        }
        for name, args in tails.items():
            nursery.start_soon(tail, name, *args)
        await trio.run_process([sys.executable, "-c", PUBLISHER, str(sock_path), str(count)])

    for name, result in results.items():
        assert result.returncode == 0, (name, result.stderr)
    lines = {
        name: [json.loads(line) for line in r.stdout.splitlines()] for name, r in results.items()
    }
    assert [int(e["event"]["message"]) for e in lines["infos"]] == infos
    assert [int(e["event"]["text"]) for e in lines["deltas"]] == deltas_s1
    assert {e["session_id"] for e in lines["deltas"]} == {"s1"}
    everything = lines["until-idle"]
    assert everything[-1]["event"]["type"] == "stream.session.idle"
    for name, envelopes in lines.items():
        seqs = [e["seq"] for e in envelopes]
        assert seqs == sorted(set(seqs)), name
    text = "".join(
        e["event"]["text"] for e in everything if e["event"]["type"] == "stream.text.delta"
    )
    assert text == "".join(f"{i} " for i in range(count) if i % 4)


async def _status(path: Path) -> dict[str, Any]:
    result = await busd("status", "--json", "--socket", str(path), check=True)
    status: dict[str, Any] = json.loads(result.stdout)
    return status


async def test_a_second_instance_is_refused_while_the_first_keeps_serving(
    sock_path: Path,
) -> None:
    async with serving(sock_path) as first:
        second = await busd("serve", "--socket", str(sock_path))
        assert second.returncode != 0
        assert b"already running" in second.stderr
        assert str(first.pid).encode() in second.stderr
        assert (await _status(sock_path))["clients"] == 1


async def test_a_stale_socket_left_by_kill_9_is_reclaimed(sock_path: Path) -> None:
    async with serving(sock_path) as first:
        first.send_signal(signal.SIGKILL)
        await first.wait()
    assert sock_path.exists()  # left behind, as after a crash
    async with serving(sock_path):
        assert (await _status(sock_path))["head_seq"] == 0


async def test_a_file_that_is_not_a_socket_is_refused_and_left_alone(sock_path: Path) -> None:
    sock_path.parent.mkdir(mode=0o700)
    sock_path.write_text("precious")
    result = await busd("serve", "--socket", str(sock_path))
    assert result.returncode != 0
    assert b"not a socket" in result.stderr
    assert sock_path.read_text() == "precious"


async def test_sigterm_says_goodbye_to_clients_and_exits_cleanly(sock_path: Path) -> None:
    async with serving(sock_path) as daemon:
        client = await trio.open_unix_socket(str(sock_path))
        await client.send_all(encode_frame(Hello(protocol=PROTOCOL_VERSION, client="t")))
        decoder = server_frame_decoder(Catalog())
        frames: list[Frame] = []
        with trio.fail_after(10):
            while not frames:  # welcomed first: a connection still in the listen backlog at
                decoder.feed(await client.receive_some(65536))  # the signal is reset, not told
                frames += list(decoder)
            daemon.send_signal(signal.SIGTERM)
            while data := await client.receive_some(65536):
                decoder.feed(data)
                frames += list(decoder)
            code = await daemon.wait()
        await client.aclose()
    assert code == 0
    welcome, goodbye = frames
    assert isinstance(welcome, Welcome)
    assert isinstance(goodbye, Goodbye)
    assert goodbye.reason == "shutdown"
    assert not sock_path.exists()


async def test_what_stopped_busd_serve_now_ends_one_connection_at_most(sock_path: Path) -> None:
    """Issue 14's reproductions against the real process: it serves on, nothing is lost."""
    journal = str(sock_path.parent.parent / "journal.sqlite3")
    options = ("--journal", journal, "--outbound-cap", "65536")
    async with serving(sock_path, *options) as daemon:
        publisher = [sys.executable, "-c", PUBLISHER, str(sock_path), "3000"]
        await trio.run_process(publisher, check=True)
        # Subscribe and unsubscribe, and one id twice, pipelined in one write.
        client = await trio.open_unix_socket(str(sock_path))
        hello = Hello(protocol=PROTOCOL_VERSION, client="pipelined")
        pipelined = (hello, Subscribe(id=1), Unsubscribe(id=1), Subscribe(id=2), Subscribe(id=2))
        await client.send_all(b"".join(encode_frame(f) for f in (*pipelined, Bye())))
        decoder = server_frame_decoder(Catalog())
        with trio.fail_after(10):
            while data := await client.receive_some(65536):
                decoder.feed(data)
        await client.aclose()
        *_, goodbye = decoder
        assert isinstance(goodbye, Goodbye)
        assert goodbye.reason == "bye"
        # A replay of ~150 KB through a 64 KiB outbound queue.
        tail = await busd("tail", "--socket", str(sock_path), "--since", "0", "--count", "3001")
        assert (tail.returncode, len(tail.stdout.splitlines())) == (0, 3001), tail.stderr
        daemon.send_signal(signal.SIGTERM)
        with trio.fail_after(10):
            assert await daemon.wait() == 0
    async with serving(sock_path, *options) as daemon:  # restarted: replays read the journal
        for _ in range(3):  # and leave in the middle of it
            one = await busd("tail", "--socket", str(sock_path), "--since", "0", "--count", "1")
            assert one.returncode == 0, one.stderr
        status = await _status(sock_path)
        assert (status["internal_errors"], status["clients"]) == (0, 1)
        assert daemon.returncode is None


async def test_client_commands_without_a_daemon_fail_with_a_message(sock_path: Path) -> None:
    for args in (
        ("status",),
        ("tail",),
        ("publish", "stream.session.info", "--field", "message=x"),
    ):
        result = await busd(*args, "--socket", str(sock_path))
        assert result.returncode == 1
        assert b"no busd daemon" in result.stderr


async def test_publish_validates_before_connecting(sock_path: Path) -> None:
    result = await busd(
        "publish", "stream.text.delta", "--field", "text=x", "--socket", str(sock_path)
    )
    assert result.returncode == 2
    assert b"message_id" in result.stderr
    result = await busd("publish", "stream.nope", "--socket", str(sock_path))
    assert result.returncode == 2
    assert b"unknown event type" in result.stderr


async def test_tail_times_out_with_exit_124(sock_path: Path) -> None:
    async with serving(sock_path):
        result = await busd("tail", "--socket", str(sock_path), "--count", "1", "--timeout", "0.5")
    assert result.returncode == 124
    assert b"timed out" in result.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as another uid")
async def test_a_peer_with_another_uid_is_refused_by_its_credentials(sock_path: Path) -> None:
    async with serving(sock_path):
        # Open the file permissions so only SO_PEERCRED stands in the way.
        os.chmod(sock_path.parent.parent, 0o755)
        os.chmod(sock_path.parent, 0o755)
        os.chmod(sock_path, 0o666)
        answer = await trio.to_thread.run_sync(_connect_as_nobody, str(sock_path))
        assert (await _status(sock_path))["clients"] == 1  # the daemon is fine
    frame = msgspec.msgpack.Decoder(Error).decode(answer[4:])
    assert (frame.code, frame.fatal) == ("forbidden", True)
    assert "uid 65534" in frame.message


def _connect_as_nobody(path: str) -> bytes:
    """Fork a child that drops to uid 65534, connects and returns what the daemon says."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(read_end)
            os.setgid(65534)
            os.setuid(65534)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(10)
                sock.connect(path)
                sock.sendall(encode_frame(Hello(protocol=PROTOCOL_VERSION, client="nobody")))
                data = b""
                while chunk := sock.recv(65536):
                    data += chunk
            os.write(write_end, data)
        except BaseException as exc:
            os.write(write_end, f"child failed: {exc!r}".encode())
        finally:
            os._exit(0)
    os.close(write_end)
    chunks = []
    while chunk := os.read(read_end, 65536):
        chunks.append(chunk)
    os.close(read_end)
    os.waitpid(pid, 0)
    data = b"".join(chunks)
    assert not data.startswith(b"child failed"), data
    (length,) = struct.unpack(">I", data[:4])
    assert len(data) == 4 + length
    return data


async def test_serve_tells_systemd_when_ready_and_when_stopping(sock_path: Path) -> None:
    notify_path = sock_path.parent.parent / "notify.sock"
    listener = trio.socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    await listener.bind(str(notify_path))
    process = await trio.lowlevel.open_process(
        [*BUSD, "serve", "--socket", str(sock_path)],
        env={**os.environ, "NOTIFY_SOCKET": str(notify_path)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        with trio.fail_after(20):
            ready = (await listener.recv(4096)).decode()
            assert ready.startswith("READY=1")
            assert f"listening on {sock_path}" in ready
            process.send_signal(signal.SIGTERM)
            assert (await listener.recv(4096)).decode() == "STOPPING=1"
            assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        listener.close()


async def test_serve_adopts_a_socket_activated_listener(sock_path: Path) -> None:
    sock_path.parent.mkdir(mode=0o700)
    listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listening.bind(str(sock_path))
    listening.listen()
    fd = listening.fileno()
    # systemd hands the socket over as fd 3 with LISTEN_PID set to the service's pid;
    # a tiny exec wrapper does the same (exec keeps the pid).
    wrapper = (
        "import os, sys; os.dup2(int(sys.argv[1]), 3); "
        "os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS='1'); "
        "os.execv(sys.executable, [sys.executable, *sys.argv[2:]])"
    )
    process = await trio.lowlevel.open_process(
        [sys.executable, "-c", wrapper, str(fd), *BUSD[1:], "serve", "--socket", "/nonexist/x"],
        pass_fds=(fd,),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    listening.close()  # the daemon holds its own copy now
    try:
        assert process.stdout is not None
        with trio.fail_after(20):
            line = await read_line(process.stdout)
        if not line:
            assert process.stderr is not None
            raise AssertionError(await process.stderr.receive_some(65536))
        assert f"listening on {sock_path}" in line
        status = await _status(sock_path)
        assert status["clients"] == 1
        process.send_signal(signal.SIGTERM)
        with trio.fail_after(20):
            assert await process.wait() == 0
        assert sock_path.exists()  # systemd's socket file: not ours to remove
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        if process.stdout is not None:
            await process.stdout.aclose()
