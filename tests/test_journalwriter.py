"""The journal's writer process: the same rows as the thread, its failures, its lock, its end.

The process is real (``python -c`` running :func:`busd.daemon.journalwriter.main`),
killed with real signals; the daemon-level tests run ``busd serve``, whose
default it is.
"""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from busd.client import connect
from busd.core.events import (
    Envelope,
    Event,
    RunFinished,
    SessionInfo,
    TextDelta,
    ThinkingDelta,
    ToolStart,
)
from busd.daemon.journalfile import (
    JournalFile,
    JournalReader,
    Retention,
    _parameters,
    _raw_parameters,
)
from busd.daemon.journallock import JournalLock, LockHeld
from busd.daemon.journalwriter import ProcessWriter, WriterGone, _frame, _Write, serve_one
from busd.wire import Status, encode_envelope
from tests.daemon_helpers import family, serving
from tests.test_journal import Harness, envelope


@pytest.fixture
def jpath(tmp_path: Path) -> Path:
    return tmp_path / "journal.sqlite3"


def _process(h: Harness) -> ProcessWriter:
    writer = h.journal.writer
    assert isinstance(writer, ProcessWriter)
    return writer


# -- the same rows from the envelopes' bytes ----------------------------------------------

_events: list[Event] = [
    TextDelta(message_id="m1", text="hi"),
    ThinkingDelta(message_id="m1", text="hmm"),
    ToolStart(tool_call_id="t1", name="Bash", input={"command": "ls"}),
    RunFinished(status="ok", duration_s=1.5),
]


@given(
    seq=st.integers(1, 1 << 53),
    ts=st.floats(0, 4e9),
    event=st.sampled_from(_events),
    session=st.none() | st.text(max_size=8),
    run=st.none() | st.text(max_size=8),
    stale=st.booleans(),
    event_id=st.text(max_size=40),
)
def test_the_process_reads_the_columns_the_thread_takes_from_the_objects(
    seq: int,
    ts: float,
    event: Event,
    session: str | None,
    run: str | None,
    stale: bool,
    event_id: str,
) -> None:
    e = Envelope(seq, ts, event, session_id=session, run_id=run, stale=stale, id=event_id)
    raw = encode_envelope(e)
    assert _raw_parameters([raw]) == _parameters([e], [raw])


def test_a_failing_statement_is_an_sqlite_error_in_the_reply(jpath: Path) -> None:
    JournalFile.open(jpath).close()
    file = JournalFile.attach(jpath)
    try:
        file._conn.execute("PRAGMA query_only = ON")
        e = envelope(1)
        request = _frame(_Write([encode_envelope(e)], [], [], 1, 10))
        reply = msgspec.msgpack.decode(serve_one(file, bytes(request[4:]))[4:])
        assert reply[0] == "failed"
        assert reply[1] is True  # sqlite: the daemon raises sqlite3.DatabaseError
        assert "readonly" in reply[2]
        garbage = msgspec.msgpack.decode(serve_one(file, b"\xc1")[4:])
        assert garbage[:2] == ["failed", False]
    finally:
        file.close()


def test_an_attached_file_cannot_reserve_in_the_lock_file(jpath: Path) -> None:
    JournalFile.open(jpath).close()
    file = JournalFile.attach(jpath)
    try:
        assert file.reserve_beside(100) is False
    finally:
        file.close()


# -- the process ----------------------------------------------------------------------------


async def test_events_written_by_the_process_read_back_as_sent(jpath: Path) -> None:
    h = Harness(jpath, writer="process")
    await h.journal.writer.start()
    pid = _process(h).pid
    assert pid is not None
    assert pid != os.getpid()
    for _ in range(500):
        h.publish()
    h.publish(RunFinished(status="ok", duration_s=1.0), run_id="r1", stale=True)
    assert await h.journal.flush()
    assert h.journal.journaled_seq == h.seq
    with JournalReader(jpath) as reader:
        rows = reader.page(0, 1 << 62, limit=1 << 30).rows
        assert [r[0] for r in rows] == [e.seq for e in h.sent]
        assert rows[-1][1:5] == ("busd.run.finished", "s1", "r1", 1)
        assert [bytes(r[5]) for r in rows] == [bytes(encode_envelope(e)) for e in h.sent]
        [session] = reader.sessions()
        assert session.events == 501
    stats = h.journal.statistics()
    assert (stats["writer"], stats["writer_restarts"], stats["events"]) == ("process", 0, 501)
    await h.journal.aclose()
    assert _process(h).pid is None


async def test_a_killed_writer_is_a_failed_write_and_the_next_try_writes_it_all(
    jpath: Path,
) -> None:
    h = Harness(jpath, writer="process")
    h.publish()
    assert await h.journal.flush()
    first = _process(h).pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    for _ in range(20):
        h.publish()
    assert not await h.journal.flush()
    stats = h.journal.statistics()
    assert stats["write_errors"] == 1
    assert h.reports == [
        f"cannot write the journal {jpath}: the journal writer (pid {first}) was killed "
        "by SIGKILL (retrying)"
    ]
    assert await h.journal.flush()  # a new process
    assert _process(h).pid not in (None, first)
    assert h.journal.statistics()["writer_restarts"] == 1
    assert h.reports[-1] == f"the journal {jpath} is written again"
    assert [seq for seq, _ in h.read()] == list(range(1, 22))
    await h.journal.aclose()
    assert h.journal.unjournaled == []


async def test_ctrl_c_and_sigterm_do_not_stop_the_writer(jpath: Path) -> None:
    """The daemon writes its last events through it after either signal."""
    h = Harness(jpath, writer="process")
    await h.journal.writer.start()
    pid = _process(h).pid
    assert pid is not None
    assert os.getpgid(pid) == pid  # its own session: a terminal's Ctrl-C does not reach it
    h.publish()
    assert await h.journal.flush()  # it has set its handlers by now
    os.kill(pid, signal.SIGINT)
    os.kill(pid, signal.SIGTERM)
    h.publish()
    assert await h.journal.flush()
    assert _process(h).pid == pid
    await h.journal.aclose()
    assert [seq for seq, _ in h.read()] == [1, 2]


async def test_the_writer_holds_the_lock_while_it_runs(jpath: Path) -> None:
    """Were the daemon killed, no other could open the journal while the process writes."""
    h = Harness(jpath, writer="process")
    h.publish()
    assert await h.journal.flush()
    lock_fd = h.journal.file.lock_fd
    os.close(os.dup(lock_fd))  # the descriptor is open...
    h.journal.file._lock.close()  # type: ignore[union-attr]  # ...and now the daemon's is not
    with pytest.raises(LockHeld):
        JournalLock.acquire(jpath)
    writer = _process(h)
    await writer.aclose()
    JournalLock.acquire(jpath).close()  # the process is gone: so is the lock
    h.journal.file._lock = None  # closed above
    h.journal.file.close()


async def test_a_writer_that_cannot_start_fails_the_write_and_says_why(
    jpath: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = Harness(jpath, writer="process")
    monkeypatch.setattr("sys.executable", str(jpath.parent / "no-python-here"))
    h.publish()
    assert not await h.journal.flush()
    assert "cannot start the journal writer" in h.reports[0]
    monkeypatch.undo()
    assert await h.journal.flush()
    await h.journal.aclose()
    assert [seq for seq, _ in h.read()] == [1]


async def test_retention_runs_in_the_process(jpath: Path) -> None:
    h = Harness(jpath, writer="process", retention=Retention(max_age=60, max_size=None))
    for seq in range(1, 101):
        h.publish(ts=1000.0 + seq)
    assert await h.journal.flush()
    removed = await h.journal.prune(now=1000.0 + 60 + 40.5)
    assert removed == 40
    assert h.journal.statistics()["oldest_seq"] == 41
    await h.journal.aclose()
    assert [seq for seq, _ in h.read()] == list(range(41, 101))


async def test_a_cancelled_write_still_reads_its_reply(jpath: Path) -> None:
    """Like a worker thread's, a request runs to its end: the next one is not out of step."""
    h = Harness(jpath, writer="process")
    await h.journal.writer.start()
    for _ in range(50):
        h.publish()
    outcome: list[bool] = []

    async def flush() -> None:
        outcome.append(await h.journal.flush())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(flush)
        await trio.testing.wait_all_tasks_blocked()  # the request sent, its reply awaited
        nursery.cancel_scope.cancel()
    assert outcome == [True]
    assert h.journal.journaled_seq == 50
    h.publish()
    assert await h.journal.flush()
    await h.journal.aclose()
    assert [seq for seq, _ in h.read()] == list(range(1, 52))


async def test_the_process_exits_when_its_stdin_closes(jpath: Path) -> None:
    h = Harness(jpath, writer="process")
    writer = _process(h)
    await writer.start()
    process: Any = writer._process
    assert process is not None
    await process.stdin.aclose()
    await process.wait()
    assert process.returncode == 0
    h.publish()
    with pytest.raises(WriterGone, match=r"exited with status 0"):
        await writer.write([h.sent[0]], [encode_envelope(h.sent[0])], [], [], head=1, reserved=9)
    await h.journal.aclose()
    with sqlite3.connect(jpath) as conn:
        assert conn.execute("SELECT count(*) FROM events").fetchone()[0] == 1
    conn.close()


def test_a_dead_daemons_lock_is_waited_for_while_its_writer_finishes(jpath: Path) -> None:
    """``kill -9`` of a daemon, then a restart: its writer may still hold the lock a moment."""
    JournalFile.open(jpath).close()
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid that is no process now: the killed daemon's
    lock = JournalLock.acquire(jpath)
    os.pwrite(lock.fd, f"{gone.pid}\n0\n".encode().ljust(63) + b"\n", 0)
    writer = subprocess.Popen(  # the orphaned writer: it holds the lock until its stdin closes
        [sys.executable, "-c", "import sys; sys.stdin.read()"],
        stdin=subprocess.PIPE,
        pass_fds=(lock.fd,),
    )
    lock.close()
    try:
        with pytest.raises(LockHeld) as held:
            JournalLock.acquire(jpath, orphan_wait=0)
        assert held.value.pid == gone.pid
        assert writer.stdin is not None
        writer.stdin.close()  # it exits; the lock is free once it has
        JournalLock.acquire(jpath).close()
    finally:
        writer.kill()
        writer.wait()


def test_a_live_daemons_lock_is_not_waited_for(
    jpath: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def wait(seconds: float) -> None:
        raise AssertionError("waited for a live holder")

    monkeypatch.setattr("busd.daemon.journallock.time.sleep", wait)
    lock = JournalLock.acquire(jpath)
    try:
        with pytest.raises(LockHeld) as held:
            JournalLock.acquire(jpath)  # the default wait: not for a live holder
        assert held.value.pid == os.getpid()
    finally:
        lock.close()


# -- busd serve ------------------------------------------------------------------------------


@pytest.fixture
def sock_path() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="busd-", dir="/tmp"))
    yield directory / "run" / "bus.sock"
    shutil.rmtree(directory, ignore_errors=True)


async def test_busd_serve_writes_from_a_process_that_ends_with_the_daemon(
    sock_path: Path, jpath: Path
) -> None:
    """Killed or stopped, the daemon leaves no writer behind; what it acknowledged is kept."""
    for stop in ("SIGKILL", "SIGTERM"):
        async with serving(sock_path, "--journal", str(jpath)) as daemon:
            [writer] = family(daemon.pid)[1:]
            exited = os.pidfd_open(writer)
            async with connect(sock_path, client="agent", role="agent") as client:
                status = await client.request(Status())
                assert (status["journal"]["writer"], status["journal"]["writer_restarts"]) == (
                    "process",
                    0,
                )
                await client.publish(SessionInfo(message=stop), session_id="s1", ack=True)
            daemon.send_signal(getattr(signal, stop))
            with trio.fail_after(20):
                await daemon.wait()
                await trio.lowlevel.wait_readable(exited)  # the writer exited by itself
            os.close(exited)
            assert daemon.returncode == (-signal.SIGKILL if stop == "SIGKILL" else 0)
    with JournalReader(jpath) as reader:
        rows = reader.page(0, 1 << 62, limit=1 << 30).rows
    messages = [msgspec.msgpack.decode(r[5])["event"].get("message") for r in rows]
    assert [m for m in messages if m] == ["SIGKILL", "SIGTERM"]


async def test_busd_serve_can_write_from_its_threads(sock_path: Path, jpath: Path) -> None:
    async with serving(sock_path, "--journal", str(jpath), "--journal-writer", "thread") as d:
        assert family(d.pid)[1:] == []
        async with connect(sock_path, client="agent", role="agent") as client:
            assert (await client.request(Status()))["journal"]["writer"] == "thread"
            await client.publish(SessionInfo(message="hi"), session_id="s1", ack=True)
    assert len(JournalReader(jpath).page(0, 100).rows) == 1
