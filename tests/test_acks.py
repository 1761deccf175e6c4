"""Acknowledged publishes: a ``publish`` or ``ingest`` with ``ack`` answered once it is journaled.

A real daemon on a real socket; the disk's failures are SQLite's own
(``max_page_count``: the file may not grow, as on a full disk) and a
writer held in its thread (a disk slower than the publishers).
"""

from __future__ import annotations

import resource
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from busd.client import NotJournaled, RequestFailed, connect
from busd.core.events import SessionIdle, TextDelta
from busd.daemon.hub import DaemonConfig
from busd.daemon.journal import Journal
from busd.daemon.journalfile import JournalReader
from busd.daemon.server import Server
from busd.wire import (
    NOT_JOURNALED,
    TOO_MANY_REQUESTS,
    Error,
    Outgoing,
    Publish,
    Reply,
)
from tests.daemon_helpers import BUSD, RawClient, accepted, running_daemon, serving


@pytest.fixture
def sock_path() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="busd-", dir="/tmp"))
    yield directory / "run" / "bus.sock"
    shutil.rmtree(directory, ignore_errors=True)


def journal_of(server: Server) -> Journal:
    journal = server.daemon.journal
    assert journal is not None
    return journal


def fill_the_disk(journal: Journal) -> None:
    """SQLite's own limit: the file may not grow by a page (SQLITE_FULL, as on a full disk)."""
    conn = journal.file._conn
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count = {pages}")


def big(i: int) -> TextDelta:
    return TextDelta(message_id="m", text=f"{i} " + "x" * 4000)


async def test_an_acknowledged_publish_is_in_the_journal_when_it_returns(
    tmp_path: Path, sock_path: Path
) -> None:
    path = tmp_path / "j.sqlite3"
    async with (
        running_daemon(sock_path, DaemonConfig(journal=str(path))) as server,
        connect(sock_path, client="agent", role="agent") as client,
    ):
        for i in range(100):
            await client.publish(TextDelta(message_id="m", text=str(i)), session_id="s1")
        acked = await client.publish(SessionIdle(), session_id="s1", ack=True)
        assert acked is not None
        assert acked.journaled
        head = server.daemon.bus.head_seq
        assert (acked.first_seq, acked.last_seq) == (1, head)
        assert journal_of(server).journaled_seq >= head  # durable, not just accepted
        with JournalReader(path) as reader:
            assert [row[0] for row in reader.page(0, head).rows] == list(range(1, head + 1))


async def test_without_a_journal_the_ack_says_so_at_once(sock_path: Path) -> None:
    async with (
        running_daemon(sock_path, DaemonConfig(journal=None)) as server,
        connect(sock_path, client="agent", role="agent") as client,
    ):
        acked = await client.publish(SessionIdle(), session_id="s1", ack=True)
        assert acked is not None
        assert (acked.journaled, acked.last_seq) == (False, server.daemon.bus.head_seq)


async def test_an_ack_is_not_journaled_while_the_disk_is_full(
    tmp_path: Path, sock_path: Path
) -> None:
    async with (
        running_daemon(sock_path, DaemonConfig(journal=str(tmp_path / "j.sqlite3"))) as server,
        connect(sock_path, client="agent", role="agent") as client,
    ):
        assert await client.publish(SessionIdle(), session_id="s1", ack=True)
        fill_the_disk(journal_of(server))
        for i in range(50):
            await client.publish(big(i), session_id="s1")
        with trio.fail_after(10), pytest.raises(NotJournaled, match="cannot write the journal"):
            await client.acknowledge()
        # The daemon and the connection go on: the events were delivered all the same.
        assert server.daemon.bus.head_seq >= 51


async def test_events_the_journal_dropped_are_never_acknowledged(
    tmp_path: Path, sock_path: Path
) -> None:
    """A stuck disk past ``max_pending``: the dropped events make every later ack fail."""
    config = DaemonConfig(journal=str(tmp_path / "j.sqlite3"), journal_max_pending=200)
    async with running_daemon(sock_path, config) as server:
        journal = journal_of(server)
        journal.max_wait = 0.05  # publishers are not held long
        opened = threading.Event()
        write = journal.file.write

        def stuck(*args: Any, **kwargs: Any) -> Any:
            assert opened.wait(30)
            return write(*args, **kwargs)

        journal.file.write = stuck  # type: ignore[method-assign]
        async with connect(sock_path, client="agent", role="agent") as client:
            for i in range(1000):
                await client.publish(TextDelta(message_id="m", text=str(i)), session_id="s1")
            await client.flush()
            assert journal.statistics()["lost"] > 0
            opened.set()
            with trio.fail_after(10), pytest.raises(NotJournaled, match="not journaled"):
                await client.acknowledge()
            with trio.fail_after(10), pytest.raises(NotJournaled):
                await client.publish(SessionIdle(), session_id="s1", ack=True)  # still true


async def test_a_refused_frame_that_asked_for_an_ack_gets_a_failed_reply(
    tmp_path: Path, sock_path: Path
) -> None:
    async with running_daemon(sock_path, DaemonConfig(journal=str(tmp_path / "j.sqlite3"))):
        raw = await RawClient.open(sock_path)
        bad = Publish(events=[Outgoing(event=SessionIdle())], ack=7)
        body = bytearray(encode(bad))
        body[body.index(b"stream.session.idle") : body.index(b"stream.session.idle") + 6] = (
            b"nosuch"
        )
        await raw.send_bytes(bytes(body))
        reply = await raw.receive()
        assert isinstance(reply, Reply)
        assert (reply.id, reply.ok, reply.error and reply.error.code) == (7, False, "invalid_event")
        await raw.send(Publish(events=[Outgoing(event=SessionIdle(), session_id="s1")], ack=8))
        reply = await raw.receive()
        assert isinstance(reply, Reply)
        assert (reply.id, reply.ok, reply.result["journaled"]) == (8, True, True)
        await raw.aclose()


async def test_too_many_waiting_acks_refuse_the_frame_whole(
    tmp_path: Path, sock_path: Path
) -> None:
    config = DaemonConfig(journal=str(tmp_path / "j.sqlite3"), max_requests=2)
    async with running_daemon(sock_path, config) as server:
        journal = journal_of(server)
        opened = threading.Event()
        write = journal.file.write

        def held(*args: Any, **kwargs: Any) -> Any:
            assert opened.wait(30)
            return write(*args, **kwargs)

        journal.file.write = held  # type: ignore[method-assign]
        raw = await RawClient.open(sock_path)
        before = server.daemon.bus.head_seq
        for ack in (1, 2, 3):
            await raw.send(
                Publish(events=[Outgoing(event=SessionIdle(), session_id="s1")], ack=ack)
            )
        refused = await raw.receive()
        assert isinstance(refused, Reply)
        assert (refused.id, refused.error and refused.error.code) == (3, TOO_MANY_REQUESTS)
        opened.set()
        answers = {(await raw.receive()).id for _ in range(2)}  # type: ignore[union-attr]
        assert answers == {1, 2}
        published = [type(e.event) for e in accepted(server.daemon, before)]
        assert published.count(SessionIdle) == 2  # the refused frame published nothing
        await raw.aclose()


def encode(frame: Any) -> bytes:
    from busd.wire import encode_frame

    return encode_frame(frame)


async def busd_cli(*args: str) -> Any:
    with trio.fail_after(60):
        return await trio.run_process(
            [*BUSD, *args], capture_stdout=True, capture_stderr=True, check=False
        )


async def test_busd_publish_exits_non_zero_when_its_event_is_not_journaled(
    tmp_path: Path, sock_path: Path
) -> None:
    async with running_daemon(
        sock_path, DaemonConfig(journal=str(tmp_path / "j.sqlite3"))
    ) as server:
        published = await busd_cli(
            "publish", "stream.session.info", "--socket", str(sock_path), "--field", "message=hi"
        )
        assert published.returncode == 0, published.stderr
        assert published.stderr == b""
        fill_the_disk(journal_of(server))
        big_text = "x" * 100_000  # pages the full file cannot add
        failed = await busd_cli(
            "publish",
            "stream.session.info",
            "--socket",
            str(sock_path),
            "--field",
            f"message={big_text}",
        )
        assert failed.returncode == 3, failed.stderr
        assert b"not journaled" in failed.stderr
        assert failed.stderr.count(b"\n") == 1


async def test_busd_publish_says_when_the_daemon_keeps_no_journal(sock_path: Path) -> None:
    async with running_daemon(sock_path, DaemonConfig(journal=None)):
        published = await busd_cli(
            "publish", "stream.session.info", "--socket", str(sock_path), "--field", "message=hi"
        )
    assert published.returncode == 0
    assert b"without a journal" in published.stderr


def test_the_error_code_is_in_the_protocol() -> None:
    from busd.wire import ERROR_CODES

    assert NOT_JOURNALED in ERROR_CODES
    assert isinstance(Error(code=NOT_JOURNALED, message="x"), Error)
    assert issubclass(NotJournaled, RequestFailed)


FIXTURES = Path(__file__).resolve().parent / "fixtures" / "sdk"


@pytest.mark.parametrize("disk", ["works", "fails"])
async def test_busd_ingest_exits_non_zero_when_the_stream_is_not_journaled(
    tmp_path: Path, sock_path: Path, disk: str
) -> None:
    async with serving(sock_path, "--journal", str(tmp_path / "j.sqlite3")) as daemon:
        if disk == "fails":  # no file of the daemon's may grow past 4 KiB (EFBIG)
            resource.prlimit(daemon.pid, resource.RLIMIT_FSIZE, (4096, 4096))
        ingested = await busd_cli(
            "ingest",
            "--socket",
            str(sock_path),
            "--sdk",
            "claude-code",
            "--session",
            "s1",
            str(FIXTURES / "claude_code.jsonl"),
        )
    if disk == "works":
        assert ingested.returncode == 0, ingested.stderr
        assert b"ingested" in ingested.stderr
    else:
        assert ingested.returncode == 3, ingested.stderr
        assert b"ingested, but not journaled" in ingested.stderr
