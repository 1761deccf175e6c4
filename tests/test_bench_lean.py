"""The fanout benchmark's lean server (contrib/bench/fanout_peers.py) speaks busd's protocol.

It is the floor the benchmark compares busd's daemon with, so it must
deliver to busd's own clients what the daemon delivers: every event, in
order, numbered, in frames that fit their limit, to every subscriber.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "contrib" / "bench"))

from fanout_peers import LEAN_FRAME_EVENTS, LeanLoad, lean_server, make_event

from busd.client import Client, connect
from busd.core.events import TextDelta


@pytest.fixture
def sock_path() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="busd-", dir="/tmp"))  # AF_UNIX paths are short
    yield directory / "lean.sock"
    shutil.rmtree(directory, ignore_errors=True)


async def test_the_lean_server_delivers_every_event_in_order_to_every_subscriber(
    sock_path: Path,
) -> None:
    count = LEAN_FRAME_EVENTS + 10  # one publish frame, more than one events frame holds
    received: list[list[tuple[int, str]]] = [[], []]
    async with trio.open_nursery() as nursery:
        await nursery.start(lean_server, str(sock_path))
        async with (
            connect(str(sock_path), client="a", role="frontend") as a,
            connect(str(sock_path), client="b", role="frontend") as b,
            connect(str(sock_path), client="p", role="agent") as publisher,
        ):
            with trio.fail_after(10):
                async with trio.open_nursery() as readers:
                    for client, into in zip((a, b), received, strict=True):
                        await readers.start(read, client, into, count)
                    for index in range(count):
                        publisher.publish_nowait(make_event(index, 0), session_id="s")
                    await publisher.flush()
        nursery.cancel_scope.cancel()
    for got in received:
        assert [seq for seq, _ in got] == list(range(1, count + 1))
        assert [int(text[:9]) for _, text in got] == list(range(count))


async def read(
    client: Client,
    into: list[tuple[int, str]],
    count: int,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    async with client.subscribe(["stream.text.delta"], window_ms=0, deltas="raw") as subscription:
        task_status.started()  # subscribed: the server has it
        async for batch in subscription:
            for envelope in batch.events:
                assert isinstance(envelope.event, TextDelta)
                into.append((envelope.seq, envelope.event.text))
            if len(into) >= count:
                return


def test_a_load_falls_on_one_publish_frame_in_every() -> None:
    assert [LeanLoad(0, 150, 3).applies(n) for n in range(1, 7)] == [False, False, True] * 2
    assert all(LeanLoad(40, 0).applies(n) for n in range(1, 4))
    assert not any(LeanLoad().applies(n) for n in range(1, 4))
    assert str(LeanLoad(0, 150, 6)) == "150 µs after the writes, 1 burst in 6"
    with pytest.raises(ValueError, match="not a load"):
        LeanLoad(0, -1)
    with pytest.raises(ValueError, match="not a load"):
        LeanLoad(0, 10, 0)


async def test_the_lean_server_spends_its_load_and_still_delivers(sock_path: Path) -> None:
    """Each loaded frame costs the server's thread its CPU (here the test's own thread)."""
    frames, load = 4, LeanLoad(after_us=20_000, every=2)  # 2 frames of 4 loaded: 40 ms
    received: list[tuple[int, str]] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(lean_server, str(sock_path), load=load))
        async with (
            connect(str(sock_path), client="a", role="frontend") as frontend,
            connect(str(sock_path), client="p", role="agent") as publisher,
        ):
            with trio.fail_after(10):
                async with trio.open_nursery() as readers:
                    await readers.start(read, frontend, received, frames)
                    began = time.thread_time()
                    for index in range(frames):
                        publisher.publish_nowait(make_event(index, 0), session_id="s")
                        await publisher.flush()  # a publish frame each
                spent = time.thread_time() - began
        nursery.cancel_scope.cancel()
    assert [seq for seq, _ in received] == list(range(1, frames + 1))
    assert spent >= 0.040
