"""Helpers for tests that run a real daemon on a real Unix socket, and the servers beside it."""

from __future__ import annotations

import importlib.util
import os
import random
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import trio

from busd.core.accounting import Accountant
from busd.core.catalog import Catalog
from busd.core.events import Envelope
from busd.daemon.endpoint import Endpoint
from busd.daemon.hub import Daemon, DaemonConfig
from busd.daemon.server import Server
from busd.plugins.manager import PluginManager
from busd.wire import (
    PROTOCOL_VERSION,
    Frame,
    Hello,
    Role,
    ServerFrame,
    Welcome,
    encode_frame,
    server_frame_decoder,
)


def accepted(daemon: Daemon, since: int = 0) -> list[Envelope[Any]]:
    """The envelopes the daemon's replay ring holds after ``since``, decoded from its bytes."""
    decoder = msgspec.msgpack.Decoder(daemon.catalog.envelope_type())
    return [decoder.decode(raw) for raw in daemon.history.since(since).raws]


@asynccontextmanager
async def running_daemon(
    path: Path,
    config: DaemonConfig | None = None,
    *,
    plugins: PluginManager | None = None,
    accountant: Accountant | None = None,
) -> AsyncIterator[Server]:
    """A daemon serving ``path`` in this test's nursery (no entry-point plugins unless given)."""
    with Endpoint.bind(path) as endpoint:
        daemon = Daemon(config, socket_path=str(path), plugins=plugins, accountant=accountant)
        server = Server(daemon, endpoint.socket)
        async with trio.open_nursery() as nursery:
            await nursery.start(server.run)
            yield server
            nursery.cancel_scope.cancel()


class RawClient:
    """Speaks bytes to the daemon, for tests of what a broken client can do."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.decoder = server_frame_decoder(Catalog())

    @classmethod
    async def open(cls, path: Path, *, hello: bool = True, role: Role = "admin") -> RawClient:
        """Connected, and past a ``hello`` in ``role`` (by default one that may do anything)."""
        client = cls(await trio.open_unix_socket(os.fspath(path)))
        if hello:
            await client.send(Hello(protocol=PROTOCOL_VERSION, client="raw", role=role))
            welcome = await client.receive()
            assert isinstance(welcome, Welcome), welcome
        return client

    async def send(self, frame: Frame) -> None:
        await self.stream.send_all(encode_frame(frame))

    async def send_bytes(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def receive(self) -> ServerFrame:
        """The next frame; raises EOFError when the daemon closed the connection."""
        while True:
            frame = self.decoder.next_frame()
            if frame is not None:
                return frame
            data = await self.stream.receive_some(65536)
            if not data:
                raise EOFError("the daemon closed the connection")
            self.decoder.feed(data)

    async def receive_until_closed(self) -> list[Any]:
        """Every frame until the daemon closes the connection (then close ours)."""
        frames: list[Any] = []
        try:
            while True:
                frames.append(await self.receive())
        except (EOFError, trio.BrokenResourceError):
            await self.aclose()
            return frames

    async def aclose(self) -> None:
        await self.stream.aclose()


BUSD = [sys.executable, "-m", "busd"]


async def read_line(stream: trio.abc.ReceiveStream) -> str:
    data = b""
    while not data.endswith(b"\n"):
        chunk = await stream.receive_some(1)
        if not chunk:
            break
        data += chunk
    return data.decode()


@asynccontextmanager
async def serving(path: Path, *args: str) -> AsyncIterator[trio.Process]:
    """``busd serve`` in a subprocess (``BUSD``), yielded once it says it listens."""
    process = await trio.lowlevel.open_process(
        [*BUSD, "serve", "--socket", str(path), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        with trio.fail_after(20):
            line = await read_line(process.stdout)
        assert f"listening on {path}" in line, line
        yield process
    finally:
        if process.returncode is None:
            process.kill()
        with trio.fail_after(20):
            await process.wait()
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                await pipe.aclose()


def load_module(path: Path, name: str) -> Any:
    """The test helper at ``path`` (plugin test folders are no packages), as module ``name``.

    Registered in ``sys.modules`` first: its dataclasses look themselves up there.
    """
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def quiet_port(host: str = "127.0.0.1") -> int:
    """A free TCP port below the kernel's ephemeral range, where nothing takes it by chance.

    A port the kernel picked (``bind`` to 0) goes back to the ephemeral range
    once closed, where any process's next connection or port-0 listener may
    take it, the other pytest workers' (``-n auto``) included: a server started
    again on its old port would find it taken, and a URL meant to have nobody
    behind it could find someone. Below the range, only a program that asks
    for that very port gets it.
    """
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
            low = int(ports.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default
    # Not the global generator: a test may have seeded it, and two workers would then agree.
    for port in random.SystemRandom().sample(range(max(1024, low - 8192), low), 64):
        with socket.socket() as probe:
            try:
                probe.bind((host, port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port on {host} below {low}")
