"""A real ``nats-server -js`` on loopback, and daemons bridged through it, for the tests."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import busd_nats
import nats
import pytest
import trio

from busd import (
    Daemon,
    DaemonConfig,
    Endpoint,
    Envelope,
    Event,
    InternalError,
    PluginManager,
    Server,
)
from tests.daemon_helpers import quiet_port

__all__ = [
    "INSTALL_HINT",
    "ErrorLog",
    "NatsServer",
    "StoredMessage",
    "add_names_bucket",
    "add_stream",
    "bridged_daemon",
    "count_requests",
    "find_nats_server",
    "put_key",
    "read_stream",
    "running_nats",
    "stream_config",
]

INSTALL_HINT = "install nats-server: apt-get install nats-server"


def find_nats_server() -> str | None:
    """The ``nats-server`` binary (Debian puts it in /usr/sbin, not on every PATH)."""
    path = os.environ.get("PATH", "") + os.pathsep + "/usr/sbin"
    return shutil.which("nats-server", path=path)


class NatsServer:
    """One nats-server with JetStream on 127.0.0.1, a fixed port and store: restartable.

    It runs in ``nursery``; its output is read as it comes, and :meth:`start`
    returns when the server says it is ready.
    """

    def __init__(self, binary: str, workdir: Path, nursery: trio.Nursery) -> None:
        self.binary = binary
        self.store = workdir / "jetstream"
        self.port = quiet_port()  # the same port after a restart: none of the kernel's
        self.output = bytearray()
        self._nursery = nursery
        self._process: trio.Process | None = None
        self._gone = trio.Event()

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._gone = trio.Event()
        with trio.fail_after(10):
            await self._nursery.start(self._serve)

    async def _serve(self, *, task_status: trio.TaskStatus[None]) -> None:
        command = [self.binary, "-js", "-a", "127.0.0.1", "-p", str(self.port)]
        process = await trio.lowlevel.open_process(
            [*command, "-sd", str(self.store)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        self._process = process
        assert process.stdout is not None
        ready = False
        try:
            async for chunk in process.stdout:
                self.output += chunk
                if not ready and b"Server is ready" in self.output:
                    ready = True
                    task_status.started()
            if not ready:
                raise RuntimeError(f"nats-server exited: {self.output.decode()}")
        finally:
            with trio.CancelScope(shield=True):
                if process.returncode is None and self._process is process:
                    process.kill()  # cancelled, not stopped
                await process.wait()
                await process.stdout.aclose()
            self._gone.set()

    async def stop(self) -> None:
        """Terminate it (SIGTERM, as a service manager would) and wait until it is gone."""
        process, self._process = self._process, None
        if process is not None:
            process.terminate()
            await self._gone.wait()


class ErrorLog:
    """The ``busd.internal.error`` events of one daemon, as they come (a bus handler)."""

    def __init__(self) -> None:
        self.errors: list[InternalError] = []
        self._changed = trio.Event()

    def __call__(self, envelope: Envelope[Event]) -> None:
        assert isinstance(envelope.event, InternalError)
        self.errors.append(envelope.event)
        self._changed.set()
        self._changed = trio.Event()

    async def wait_for(self, text: str) -> InternalError:
        """The first error whose message holds ``text``, once there is one."""
        while True:
            for error in self.errors:
                if text in error.message:
                    return error
            await self._changed.wait()


StoredMessage = tuple[str, bytes, dict[str, str]]
"""Subject, payload and headers of one message in a stream."""


def read_stream(url: str, stream: str = "BUSD") -> list[StoredMessage]:
    """Every message in ``stream``, in stream order, read with nats-py (it blocks: call it in
    a thread)."""

    async def main() -> list[StoredMessage]:
        nc = await nats.connect(url)
        try:
            js = nc.jetstream()
            state = (await js.stream_info(stream)).state
            out: list[StoredMessage] = []
            for seq in range(state.first_seq, state.last_seq + 1):
                msg = await js.get_msg(stream, seq)
                out.append((msg.subject or "", msg.data or b"", dict(msg.headers or {})))
            return out
        finally:
            await nc.close()

    return asyncio.run(main())


def add_stream(url: str, name: str, subjects: list[str]) -> None:
    """Make a stream the way an operator would (blocking)."""

    async def main() -> None:
        nc = await nats.connect(url)
        try:
            await nc.jetstream().add_stream(name=name, subjects=subjects)
        finally:
            await nc.close()

    asyncio.run(main())


def stream_config(url: str, stream: str = "BUSD") -> dict[str, Any]:
    """The stream's configuration as the server reports it (blocking)."""

    async def main() -> dict[str, Any]:
        nc = await nats.connect(url)
        try:
            return (await nc.jetstream().stream_info(stream)).config.as_dict()
        finally:
            await nc.close()

    return asyncio.run(main())


def add_names_bucket(url: str, ttl: float) -> None:
    """Make the bucket of daemon names the way an operator would, with its TTL (blocking)."""

    async def main() -> None:
        nc = await nats.connect(url)
        try:
            await nc.jetstream().create_key_value(bucket="busd-names", ttl=ttl, history=1)
        finally:
            await nc.close()

    asyncio.run(main())


def put_key(url: str, key: str, value: bytes) -> None:
    """Set ``key`` in the bucket of daemon names, as another daemon would (blocking)."""

    async def main() -> None:
        nc = await nats.connect(url)
        try:
            await (await nc.jetstream().key_value("busd-names")).put(key, value)
        finally:
            await nc.close()

    asyncio.run(main())


def count_requests(url: str, subject: str, count: int, timeout: float = 20.0) -> None:
    """Return once ``count`` messages were published on ``subject`` (a JetStream API subject,
    say), counted by a core NATS subscriber; raise TimeoutError after ``timeout`` seconds
    (blocking: call it in a thread)."""

    async def main() -> None:
        nc = await nats.connect(url)
        try:
            seen = 0
            enough = asyncio.Event()

            async def on_message(_: Any) -> None:
                nonlocal seen
                seen += 1
                if seen >= count:
                    enough.set()

            await nc.subscribe(subject, cb=on_message)
            await asyncio.wait_for(enough.wait(), timeout)
        finally:
            await nc.close()

    asyncio.run(main())


@asynccontextmanager
async def running_nats(tmp_path: Path) -> AsyncIterator[NatsServer]:
    """A started server (the test is skipped, saying how to install it, where there is none)."""
    binary = find_nats_server()
    if binary is None:
        pytest.skip(INSTALL_HINT)
    async with trio.open_nursery() as nursery:
        server = NatsServer(binary, tmp_path, nursery)
        await server.start()
        try:
            yield server
        finally:
            with trio.CancelScope(shield=True):
                await server.stop()


@asynccontextmanager
async def bridged_daemon(
    path: Path,
    url: str,
    name: str | None,
    *,
    wait_ready: bool = True,
    errors: ErrorLog | None = None,
    **options: Any,
) -> AsyncIterator[tuple[Daemon, busd_nats.Bridge]]:
    """A daemon on ``path`` with the plugin registered as its entry point would, bridged to ``url``.

    Named ``name`` (None: the default name); its internal errors go to ``errors`` from the
    start. Yields once its stream and consumer are in place, or at once without
    ``wait_ready``.
    """
    manager = PluginManager(environ={})
    manager.register(busd_nats, name="nats")
    if name is not None:
        options["name"] = name
    config = DaemonConfig(plugin_options={"nats": {"url": url, **options}})
    with Endpoint.bind(path) as endpoint:
        daemon = Daemon(config, socket_path=str(path), plugins=manager)
        if errors is not None:
            daemon.bus.on("busd.internal.error", errors)
        server = Server(daemon, endpoint.socket)
        async with trio.open_nursery() as nursery:
            await nursery.start(server.run)
            bridge = busd_nats.bridge_of(daemon)
            assert bridge is not None, manager.failures
            if wait_ready:
                with trio.fail_after(15):
                    await bridge.ready.wait()
            yield daemon, bridge
            nursery.cancel_scope.cancel()
