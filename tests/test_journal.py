"""The journal: the SQLite file, batching off the hot path, retention, resume, the transcript.

The in-process daemon tests at the end run a real daemon on a real socket
(tests/daemon_helpers.py); tests/test_journal_process.py kills real
``busd serve`` processes.
"""

from __future__ import annotations

import gc
import logging
import os
import shutil
import sqlite3
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import trio.lowlevel
import trio.testing
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from busd.cli import main
from busd.client import Client, connect
from busd.core.catalog import Catalog
from busd.core.events import (
    Envelope,
    Event,
    RunFinished,
    RunStarted,
    SessionStart,
    SessionTitleChanged,
    TextComplete,
    TextDelta,
    ThinkingComplete,
    ThinkingDelta,
    TokenUsage,
    ToolComplete,
    ToolStart,
    TurnEnd,
    TurnStart,
    Usage,
)
from busd.core.ids import new_event_id
from busd.core.sessions import SessionRegistry, SessionState
from busd.core.usage import add_usage
from busd.daemon import journalrows
from busd.daemon.batching import BatchDispatcher
from busd.daemon.config import ConfigError, FileConfig, load_config
from busd.daemon.hub import Daemon, DaemonConfig, Subscription
from busd.daemon.journal import Found, Journal, Missing, page_items
from busd.daemon.journalfile import (
    APPLICATION_ID,
    SCHEMA_VERSION,
    JournalError,
    JournalFile,
    JournalReader,
    Page,
    Retention,
    parse_duration,
    parse_size,
)
from busd.daemon.journalstore import _chunks
from busd.frontends.transcript import (
    ReasoningPart,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    build_transcript,
    export_document,
)
from busd.wire import Status, encode_envelope
from tests.daemon_helpers import running_daemon

SIGNATURE = "EqQBCkgIARABGAIiQL7+signature/with+slashes=="


def envelope(
    seq: int, event: Event | None = None, *, session: str | None = "s1", ts: float = 1e9, **kw: Any
) -> Envelope[Event]:
    return Envelope(
        seq,
        ts,
        event if event is not None else TextDelta(message_id="m1", text=f"t{seq}"),
        session_id=session,
        id=new_event_id(),
        **kw,
    )


class Harness:
    """A journal fed the way the daemon feeds it: a session registry beside it."""

    def __init__(self, path: Path, **options: Any) -> None:
        self.path = path
        self.registry = SessionRegistry()
        self.reports: list[str] = []
        self.journal = Journal.open(
            path,
            sessions=lambda since: [_row(state) for state in self.registry.touched_since(since)],
            report=self.reports.append,
            **options,
        )
        self.seq = self.journal.next_seq - 1
        self.sent: list[Envelope[Event]] = []

    def publish(self, event: Event | None = None, **kw: Any) -> Envelope[Event]:
        self.seq += 1
        e = envelope(self.seq, event, **kw)
        self.registry.observe(e)
        self.journal.append(e, encode_envelope(e))
        self.sent.append(e)
        return e

    def read(self) -> list[tuple[int, str]]:
        with JournalReader(self.path) as reader:
            page = reader.page(0, 1 << 62, limit=1 << 30)
        return [(row[0], msgspec.msgpack.decode(row[5])["id"]) for row in page.rows]


def _row(state: Any) -> tuple[Any, ...]:
    from busd.daemon.journalfile import session_row

    return session_row(state)


@pytest.fixture
def jpath(tmp_path: Path) -> Path:
    return tmp_path / "state" / "busd" / "journal.sqlite3"


@pytest.fixture
def sock_path() -> Iterator[Path]:
    """A socket path short enough for ``sun_path``."""
    directory = Path(tempfile.mkdtemp(prefix="busd-", dir="/tmp"))
    yield directory / "run" / "bus.sock"
    shutil.rmtree(directory, ignore_errors=True)


# -- units ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30d", 2_592_000.0), ("12h", 43_200.0), ("90m", 5_400.0), ("3600", 3600.0), ("0", 0.0)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    ("text", "size"),
    [("1GiB", 1 << 30), ("500MiB", 500 << 20), ("2G", 2 << 30), ("64k", 65_536), ("99", 99)],
)
def test_sizes(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "soon", "-1d", "3 days"])
def test_a_bad_duration_says_what_is_expected(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration such as 30d"):
        parse_duration(text)


def test_a_bad_size_says_what_is_expected() -> None:
    with pytest.raises(ValueError, match="not a size such as 1GiB"):
        parse_size("lots")


# -- the file ---------------------------------------------------------------------------


def test_a_new_journal_is_private_wal_and_versioned(jpath: Path) -> None:
    file = JournalFile.open(jpath)
    file.close()
    assert stat.S_IMODE(os.stat(jpath).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(jpath.parent).st_mode) == 0o700
    with sqlite3.connect(jpath) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
        assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2  # incremental
    conn.close()


def _not_sqlite(path: Path) -> None:
    path.write_text("these are my notes, not a database\n" * 100)


def _someone_elses(path: Path) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE notes (text TEXT)")
    conn.close()


def _newer(path: Path) -> None:
    JournalFile.open(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()


def _directory(path: Path) -> None:
    path.mkdir()


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (_not_sqlite, "is not a busd journal"),
        (_someone_elses, "is an SQLite database but not a busd journal"),
        (_newer, "was written by a newer busd"),
        (_directory, "exists and is not a file"),
    ],
)
def test_a_journal_that_cannot_be_used_is_a_clear_error(
    tmp_path: Path, make: Callable[[Path], None], message: str
) -> None:
    path = tmp_path / "journal.sqlite3"
    make(path)
    with pytest.raises(JournalError, match=message):
        JournalFile.open(path)
    if path.is_file():
        before = path.read_bytes()
        with pytest.raises(JournalError, match=message):
            JournalReader(path)
        assert path.read_bytes() == before  # refused, and left as it was


def test_a_journal_under_a_file_cannot_be_created(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(JournalError, match="cannot create"):
        JournalFile.open(tmp_path / "file" / "journal.sqlite3")


def test_one_daemon_writes_a_journal(jpath: Path) -> None:
    first = JournalFile.open(jpath)
    try:
        with pytest.raises(JournalError, match=f"in use by another busd \\(pid {os.getpid()}\\)"):
            JournalFile.open(jpath)
        JournalReader(jpath).close()  # readers need no lock
    finally:
        first.close()
    JournalFile.open(jpath).close()


def test_there_is_no_journal_to_read(tmp_path: Path) -> None:
    with pytest.raises(JournalError, match="no journal at"):
        JournalReader(tmp_path / "nope.sqlite3")


# -- writing: batches, the watermark, restarts ------------------------------------------------


def _queue_state(journal: Journal) -> tuple[Any, ...]:
    """What appending changes: the queue, the lost ranges, the reservation, the wake-ups."""
    return (
        [e.seq for e in journal._pending],
        [bytes(r) for r in journal._pending_raws],
        list(journal._lost),
        (journal._given, journal._reserve_at, journal._reserved),
        (journal._wake.is_set(), journal._nudge.is_set()),
        {k: v for k, v in journal.statistics().items() if k != "path"},
    )


@settings(max_examples=40, deadline=None)
@given(runs=st.lists(st.integers(0, 9), max_size=8), flushing=st.integers(0, 6))
def test_extending_a_run_queues_what_appending_each_does(runs: list[int], flushing: int) -> None:
    """The hot path's run at once, and one by one: the same queue, drops, reservations and
    wake-ups (a full queue and a reservation inside the run included)."""
    with tempfile.TemporaryDirectory() as tmp:
        options = dict(max_pending=12, batch_events=5, stage_events=3)
        one, many = (Harness(Path(tmp) / name / "j.sqlite3", **options) for name in "ab")
        try:
            for h in (one, many):  # a write in flight holds some of the room
                h.journal._flushing = [envelope(0)] * flushing
                h.journal._reserve_at = 4  # a reservation falls due in the first runs
            seq = 0
            for length in runs:
                run = [envelope(s) for s in range(seq + 1, seq + length + 1)]
                seq += length
                raws = [encode_envelope(e) for e in run]
                for e, raw in zip(run, raws, strict=True):
                    one.journal.append(e, raw)
                many.journal.extend(run, raws)
                assert _queue_state(many.journal) == _queue_state(one.journal)
        finally:
            one.journal.file.close()
            many.journal.file.close()


async def test_events_are_journaled_with_their_seq_id_and_bytes(jpath: Path) -> None:
    h = Harness(jpath)
    for _ in range(5):
        h.publish()
    h.publish(SessionStart(title="t"), session="s2")
    assert h.journal.journaled_seq == 0  # appending does no I/O
    assert await h.journal.flush()
    assert h.journal.journaled_seq == 6
    assert h.read() == [(e.seq, e.id) for e in h.sent]
    with JournalReader(jpath) as reader:
        rows = reader.page(0, 10).rows
        blobs = list(reader.session_events("s1"))
    assert [bytes(encode_envelope(e)) for e in h.sent] == [row[5] for row in rows]
    assert [row[1:5] for row in rows][-1] == ("stream.session.start", "s2", None, 0)
    assert len(blobs) == 5
    stats = h.journal.statistics()
    assert stats["events"] == 6
    assert stats["journaled_seq"] == 6
    assert stats["pending"] == 0
    assert stats["bytes"] > 0
    await h.journal.aclose()


async def test_seq_continues_after_a_clean_stop(jpath: Path) -> None:
    h = Harness(jpath)
    for _ in range(3):
        h.publish()
    await h.journal.aclose()  # flushes what is left
    again = Harness(jpath)
    assert again.journal.next_seq == 4
    assert again.journal.crashed is None
    assert again.read() == [(e.seq, e.id) for e in h.sent]
    await again.journal.aclose()


async def test_after_a_crash_seq_skips_what_the_dead_daemon_may_have_given(
    jpath: Path,
) -> None:
    h = Harness(jpath, max_pending=1000)
    for _ in range(3):
        h.publish()
    await h.journal.flush()
    h.publish()  # accepted, delivered, never written: then the process dies
    h.journal.file.close()  # no aclose: the reservation stays
    again = Harness(jpath, max_pending=1000)
    assert again.journal.crashed == (4, 1003)
    assert again.journal.next_seq == 1004  # seq 4 was given once; it is never given again
    assert again.journal.journaled_seq == 1003
    with JournalReader(jpath) as reader:
        page = reader.page(0, 2000)
    assert [row[0] for row in page.rows] == [1, 2, 3]
    assert page.lost == [(4, 1003)]
    await again.journal.aclose()


async def test_a_daemon_that_never_journaled_anything_skips_nothing(jpath: Path) -> None:
    JournalFile.open(jpath).close()  # created, then the daemon was killed before any event
    h = Harness(jpath)
    assert h.journal.next_seq == 1
    assert h.journal.crashed is None
    h.journal.file.close()


async def test_sessions_are_journaled_and_restored(jpath: Path) -> None:
    h = Harness(jpath)
    h.publish(SessionStart(model="m1", title="first"), session="a")
    h.publish(RunStarted(adapter="claude-code", prompt="go"), session="a", run_id="r1")
    h.publish(Usage(tokens=TokenUsage(input_tokens=10, output_tokens=4)), session="a")
    h.publish(SessionTitleChanged(title="second"), session="b")
    await h.journal.aclose()
    again = Harness(jpath)
    restored = {r.session_id: r for r in again.journal.restored}
    assert [r.session_id for r in again.journal.restored] == ["a", "b"]  # oldest first
    a = restored["a"]
    assert (a.title, a.model, a.adapter, a.run_id, a.events) == (
        "first",
        "m1",
        "claude-code",
        "r1",
        3,
    )
    assert a.usage == TokenUsage(input_tokens=10, output_tokens=4)
    assert a.status == "active"  # as journaled; the registry brings it back idle
    registry = SessionRegistry()
    registry.restore(a, stats=a.stats, context=a.context)
    summary = registry.summary("a")
    assert summary is not None
    assert (summary.status, summary.title, summary.events) == ("idle", "first", 3)
    again.journal.file.close()


async def test_a_full_batch_is_written_without_waiting_for_the_interval(
    jpath: Path, autojump_clock: trio.testing.MockClock
) -> None:
    h = Harness(jpath, batch_events=100, interval=0.05)
    h.publish()
    async with trio.open_nursery() as nursery:
        await nursery.start(h.journal.run)
        await h.journal.journaled(1)  # the first write of a fresh journal goes at once
        start = trio.current_time()
        h.publish()
        await h.journal.journaled(2)
        assert trio.current_time() - start >= 0.05  # a trickle waits for the interval
        start = trio.current_time()
        for _ in range(100):
            h.publish()
        await h.journal.journaled(102)
        assert trio.current_time() - start < 0.05  # a full batch does not
        nursery.cancel_scope.cancel()
    await h.journal.aclose()


class CountingFile(JournalFile):
    """Counts its writes; with a gate, the first write tells ``entered`` and waits for it."""

    writes: list[int]
    gate: threading.Event | None = None
    entered: trio.Event | None = None

    def write(self, envelopes: Any, *args: Any, **kwargs: Any) -> Any:
        if self.gate is not None:
            if self.entered is not None:
                trio.from_thread.run_sync(self.entered.set)
            assert self.gate.wait(30)
        self.writes.append(len(envelopes))
        return super().write(envelopes, *args, **kwargs)


def counting(path: Path) -> CountingFile:
    file = CountingFile.open(path)
    assert isinstance(file, CountingFile)
    file.writes = []
    return file


async def test_queued_events_give_the_garbage_collector_nothing_to_walk(jpath: Path) -> None:
    """A tracked object per waiting event made every young collection walk them all."""
    h = Harness(jpath)
    sent = [(e, encode_envelope(e)) for e in (envelope(seq) for seq in range(1, 2001))]
    gc.disable()
    try:
        before = gc.get_count()[0]
        for e, raw in sent:
            h.journal.append(e, raw)
        allocated = gc.get_count()[0] - before
    finally:
        gc.enable()
    assert allocated < 20  # a few list resizes at most, not one per event
    assert await h.journal.flush()
    assert [seq for seq, _ in h.read()] == list(range(1, 2001))
    await h.journal.aclose()


async def test_many_events_are_few_transactions(jpath: Path) -> None:
    file = counting(jpath)
    journal = Journal(file, file.recover(reserve=100, sessions=0), sessions=lambda s: [])
    sent = [envelope(seq) for seq in range(1, 10_001)]
    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        for e in sent:
            journal.append(e, encode_envelope(e))
            if e.seq % 1000 == 0:
                await trio.lowlevel.checkpoint()
        await journal.journaled(10_000)
        nursery.cancel_scope.cancel()
    assert sum(file.writes) == 10_000
    assert len(file.writes) <= 12
    await journal.aclose()


async def test_a_slow_disk_costs_journal_entries_not_memory(jpath: Path) -> None:
    """Past max_pending, events are not journaled: counted, reported, recorded as lost."""
    file = counting(jpath)
    file.gate = threading.Event()
    file.entered = trio.Event()
    reports: list[str] = []
    journal = Journal(
        file,
        file.recover(reserve=100, sessions=0),
        sessions=lambda s: [],
        report=reports.append,
        max_pending=100,
        batch_events=10,
    )
    sent = [envelope(seq) for seq in range(1, 301)]
    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        for e in sent[:10]:
            journal.append(e, encode_envelope(e))
        await file.entered.wait()  # the first write is stuck in its thread
        for e in sent[10:]:
            journal.append(e, encode_envelope(e))
            assert journal.pending <= 100
        assert journal.statistics()["lost"] == 200
        assert len(reports) == 1
        assert "100 events behind" in reports[0]
        assert "from seq 101 on" in reports[0]
        # A resume meanwhile is told about the loss, in place.
        items = [i async for i in journal.span(0, 300).read(lambda *a: True, lambda e: True)]
        written = [encode_envelope(e) for e in sent[:100]]
        assert items == [Found(list(range(1, 101)), written), Missing(101, 300)]
        file.gate.set()
        await journal.journaled(300)
        nursery.cancel_scope.cancel()
    assert "events 101..300 were not journaled" in reports[1]
    with JournalReader(jpath) as reader:
        page = reader.page(0, 1000)
    assert [row[0] for row in page.rows] == list(range(1, 101))
    assert page.lost == [(101, 300)]
    assert page_items(0, page, lambda *a: True)[-1] == Missing(101, 300)
    await journal.aclose()


async def test_a_failing_write_is_retried_and_nothing_is_doubled(jpath: Path) -> None:
    file = counting(jpath)
    reports: list[str] = []
    journal = Journal(
        file, file.recover(reserve=100, sessions=0), sessions=lambda s: [], report=reports.append
    )
    sent = [envelope(seq) for seq in range(1, 6)]
    for e in sent[:3]:
        journal.append(e, encode_envelope(e))
    real_write = file.write

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise sqlite3.OperationalError("disk I/O error")

    file.write = broken  # type: ignore[method-assign]
    assert not await journal.flush()
    assert journal.journaled_seq == 0
    assert "cannot write the journal" in reports[0]
    file.write = real_write  # type: ignore[method-assign]
    for e in sent[3:]:
        journal.append(e, encode_envelope(e))
    assert await journal.flush()
    assert journal.journaled_seq == 5
    assert "is written again" in reports[1]
    stats = journal.statistics()
    assert (stats["events"], stats["write_errors"]) == (5, 1)
    await journal.aclose()
    with JournalReader(jpath) as reader:
        assert [row[0] for row in reader.page(0, 100).rows] == [1, 2, 3, 4, 5]


# -- a disk that cannot be written: no seq is given twice ------------------------------


def fill_the_disk(journal: Journal) -> None:
    """SQLite's own limit: the file may not grow by a page, so batches fail (SQLITE_FULL)."""
    conn = journal.file._conn
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    assert conn.execute(f"PRAGMA max_page_count = {pages}").fetchone()[0] == pages


def refuse_every_write(journal: Journal) -> None:
    """SQLite refuses every write, the small ones too (as a disk that fails outright)."""
    journal.file._conn.execute("PRAGMA query_only = ON")


def big(i: int) -> TextDelta:
    return TextDelta(message_id="m1", text=f"{i:04} " + "x" * 2000)


async def test_a_stop_on_a_full_disk_records_the_gap_and_gives_no_seq_again(
    jpath: Path, caplog: pytest.LogCaptureFixture
) -> None:
    h = Harness(jpath, max_pending=100)
    for _ in range(10):
        h.publish()
    assert await h.journal.flush()
    fill_the_disk(h.journal)
    for i in range(300):  # 100 wait for the disk, 200 are not even queued
        h.publish(big(i))
    assert not await h.journal.flush()
    with caplog.at_level(logging.ERROR, logger="busd.journal"):
        await h.journal.aclose()
    assert h.journal.unjournaled == [(11, 310)]
    assert "300 events (seqs 11..310) were delivered but not journaled" in caplog.text
    assert "recorded as lost in the journal" in caplog.text
    again = Harness(jpath, max_pending=100)
    assert again.journal.next_seq == 311  # 11..310 were delivered: never given again
    assert again.journal.crashed is None  # it said so itself, in the journal
    with JournalReader(jpath) as reader:
        page = reader.page(0, 1000)
    assert [row[0] for row in page.rows] == list(range(1, 11))
    assert page.lost == [(11, 310)]  # a resume gets a gap for them
    await again.journal.aclose()


async def test_a_stop_when_nothing_can_be_written_reserves_in_the_lock_file(
    jpath: Path, caplog: pytest.LogCaptureFixture
) -> None:
    h = Harness(jpath, max_pending=100)
    for _ in range(10):
        h.publish()
    assert await h.journal.flush()
    refuse_every_write(h.journal)
    for i in range(300):
        h.publish(big(i))
    with caplog.at_level(logging.ERROR, logger="busd.journal"):
        await h.journal.aclose()
    assert h.journal.unjournaled == [(11, 310)]
    assert "300 events (seqs 11..310)" in caplog.text
    assert "the next start skips them" in caplog.text
    again = Harness(jpath, max_pending=100)
    assert again.journal.next_seq == 311
    assert again.journal.crashed == (11, 310)
    with JournalReader(jpath) as reader:
        assert reader.page(0, 1000).lost == [(11, 310)]
    await again.journal.aclose()


async def test_a_crash_while_the_disk_fails_gives_no_seq_again(jpath: Path) -> None:
    """Killed while nothing can be written: the lock file's reservation ran ahead of the seqs."""
    h = Harness(jpath, max_pending=100)
    for _ in range(10):
        h.publish()
    assert await h.journal.flush()  # the database reserves up to 110
    refuse_every_write(h.journal)
    for i in range(300):
        h.publish(big(i))
        if i % 50 == 0:
            assert not await h.journal.flush()
    h.journal.file.close()  # no aclose: the process died
    again = Harness(jpath, max_pending=100)
    assert again.journal.next_seq > 310
    assert again.journal.crashed is not None
    assert again.journal.crashed[0] == 11
    await again.journal.aclose()


async def test_a_crash_before_the_first_write_of_a_new_journal_gives_no_seq_again(
    jpath: Path,
) -> None:
    h = Harness(jpath, max_pending=100)
    h.publish()  # delivered; the process dies before the writer ran
    h.journal.file.close()
    again = Harness(jpath, max_pending=100)
    assert again.journal.next_seq > 1
    await again.journal.aclose()


# -- a damaged file --------------------------------------------------------------------


def written_journal(path: Path, count: int) -> list[Envelope[Event]]:
    """A journal of ``count`` events in three sessions, stopped cleanly."""
    file = JournalFile.open(path)
    file.recover(reserve=1000, sessions=0)
    now = time.time()  # recent: retention at start keeps them
    sent = [envelope(seq, session=f"s{seq % 3}", ts=now) for seq in range(1, count + 1)]
    registry = SessionRegistry()
    for e in sent:
        registry.observe(e)
    rows = [_row(state) for state in registry.touched_since(0)]
    file.write(sent, [encode_envelope(e) for e in sent], [], rows, head=count, reserved=count)
    file.release(count)
    file.close()
    return sent


def damage(path: Path) -> None:
    """Garbage over three pages in the middle of the file, as a stray write leaves it."""
    page = 8192
    middle = path.stat().st_size // 2 // page * page
    with path.open("r+b") as f:
        f.seek(middle)
        f.write(b"\xde\xad\xbe\xef" * (3 * page // 4))


def test_a_damaged_journal_stops_the_start_with_the_way_out(jpath: Path) -> None:
    written_journal(jpath, 5000)
    damage(jpath)
    with pytest.raises(JournalError, match="is damaged") as refused:
        JournalFile.open(jpath)
    assert f"busd journal recover --journal {jpath}" in str(refused.value)
    assert "\n" not in str(refused.value)
    with pytest.raises(JournalError, match="is damaged"):
        Daemon(DaemonConfig(journal=str(jpath)))


def test_recover_sets_the_damaged_journal_aside_and_keeps_what_is_readable(jpath: Path) -> None:
    from busd.daemon.journalrecover import check, recover

    sent = written_journal(jpath, 5000)
    damage(jpath)
    assert check(jpath) != ["ok"]
    result = recover(jpath, now=0)
    assert result.aside == jpath.with_name("journal.sqlite3.damaged-" + _stamp(0))
    assert result.aside.is_file()
    assert check(jpath) == ["ok"]
    assert result.damaged  # what was on the damaged pages
    assert 0 < result.events < 5000
    assert result.sessions == 3
    with JournalReader(jpath) as reader:
        page = reader.page(0, 10_000, limit=10_000)
    kept = {row[0]: msgspec.msgpack.decode(row[5])["id"] for row in page.rows}
    assert all(kept[e.seq] == e.id for e in sent if e.seq in kept)
    lost = {s for a, b in page.lost for s in range(a, b + 1)}
    assert set(kept) | lost == set(range(1, 5001))  # every seq: kept, or a gap
    h = Harness(jpath)
    assert h.journal.next_seq == 5001
    h.journal.file.close()


def test_journal_check_and_recover_from_the_command_line(jpath: Path) -> None:
    written_journal(jpath, 3000)
    runner = CliRunner()
    intact = runner.invoke(main, ["journal", "check", "--journal", str(jpath)])
    assert (intact.exit_code, "is intact" in intact.output) == (0, True)
    damage(jpath)
    damaged = runner.invoke(main, ["journal", "check", "--journal", str(jpath)])
    assert damaged.exit_code == 1
    assert "is damaged" in damaged.output
    assert "busd journal recover" in damaged.output
    held = Harness(jpath.with_name("other.sqlite3"))  # a daemon on another journal: no matter
    recovered = runner.invoke(main, ["journal", "recover", "--journal", str(jpath)])
    held.journal.file.close()
    assert recovered.exit_code == 0, recovered.output
    assert "moved the damaged journal to" in recovered.output
    assert "recorded as lost" in recovered.output
    again = runner.invoke(main, ["journal", "check", "--journal", str(jpath)])
    assert again.exit_code == 0


def test_recover_refuses_a_journal_a_daemon_holds(jpath: Path) -> None:
    from busd.daemon.journalrecover import recover

    h = Harness(jpath)
    with pytest.raises(JournalError, match="in use by a busd"):
        recover(jpath)
    h.journal.file.close()


def _stamp(now: float) -> str:
    return time.strftime("%Y%m%dT%H%M%S", time.localtime(now))


async def test_a_copy_of_a_journaled_event_is_not_journaled_twice(jpath: Path) -> None:
    h = Harness(jpath)
    first = h.publish()
    copy = msgspec.structs.replace(first, seq=2)  # a bridge looped it back: same id
    h.journal.append(copy, encode_envelope(copy))
    await h.journal.flush()
    stats = h.journal.statistics()
    assert (stats["events"], stats["duplicates"], stats["journaled_seq"]) == (1, 1, 2)
    await h.journal.aclose()


# -- resume items -----------------------------------------------------------------------


def rows(seqs: list[int], session: str = "s1") -> list[Any]:
    return [(s, "stream.text.delta", session, None, 0, b"\x80") for s in seqs]


def test_a_page_puts_gaps_where_the_seqs_are_missing() -> None:
    page = Page(floor=3, rows=rows([4, 5, 9, 10]), lost=[(6, 8), (11, 12)], end=12)
    items = page_items(0, page, lambda *a: True)
    raw = msgspec.Raw(b"\x80")
    assert items == [
        Missing(1, 3),
        Found([4, 5], [raw, raw]),
        Missing(6, 8),
        Found([9, 10], [raw, raw]),
        Missing(11, 12),
    ]


def test_a_page_filters_events_but_never_gaps() -> None:
    page = Page(floor=0, rows=rows([1, 3]) + rows([4], "other"), lost=[(2, 2)], end=4)
    wanted = page_items(0, page, lambda name, session, run, stale: session == "s1")
    assert [type(i).__name__ for i in wanted] == ["Found", "Missing", "Found"]


def test_a_page_starts_after_the_cursor() -> None:
    page = Page(floor=5, rows=rows([8]), lost=[(1, 7)], end=8)
    assert page_items(6, page, lambda *a: True) == [
        Missing(7, 7),
        Found([8], [msgspec.Raw(b"\x80")]),
    ]


# -- retention -------------------------------------------------------------------------


DAY = 86_400.0
NOW = 2_000_000_000.0


async def test_age_retention_removes_old_events_and_whole_old_sessions(jpath: Path) -> None:
    h = Harness(jpath, retention=Retention(max_age=30 * DAY, max_size=None))
    for _ in range(10):
        h.publish(session="old", ts=NOW - 40 * DAY)
    for _ in range(5):
        h.publish(session="long", ts=NOW - 35 * DAY)
    for _ in range(5):
        h.publish(session="long", ts=NOW - 1 * DAY)
    for _ in range(5):
        h.publish(session="new", ts=NOW - 10)
    await h.journal.flush()
    removed = await h.journal.prune(now=NOW)
    assert removed == 15
    stats = h.journal.statistics()
    assert (stats["events"], stats["oldest_seq"]) == (10, 16)
    with JournalReader(jpath) as reader:
        assert [row[0] for row in reader.page(0, 100).rows] == list(range(16, 26))
        sessions = {r.session_id: r for r in reader.sessions()}
        # A resume from before the cut is told what is gone.
        assert page_items(0, reader.page(0, 100), lambda *a: True)[0] == Missing(1, 15)
    assert set(sessions) == {"long", "new"}
    assert sessions["long"].truncated
    assert not sessions["new"].truncated
    assert await h.journal.prune(now=NOW) == 0  # nothing more to do
    await h.journal.aclose()


async def test_size_retention_keeps_the_file_under_its_limit(jpath: Path) -> None:
    limit = 256 << 10
    h = Harness(jpath, retention=Retention(max_age=None, max_size=limit))
    for i in range(4000):
        h.publish(TextDelta(message_id="m", text=f"{i:08d}" + "x" * 200))
    await h.journal.flush()
    assert h.journal.statistics()["bytes"] > limit
    removed = await h.journal.prune(now=NOW)
    stats = h.journal.statistics()
    assert removed > 0
    assert stats["bytes"] <= limit
    assert stats["events"] == 4000 - removed
    assert stats["oldest_seq"] == removed + 1  # the oldest went first
    assert os.path.getsize(jpath) <= limit  # the pages went back to the file system
    await h.journal.aclose()


async def test_size_retention_gets_under_its_limit_across_a_gap_in_the_seqs(
    jpath: Path,
) -> None:
    """The target is the oldest seq plus the events to drop: a gap (a lost range) makes a
    round fall short, and the next round takes the rest."""
    limit = 256 << 10
    h = Harness(jpath, retention=Retention(max_age=None, max_size=limit))
    for i in range(4000):
        if i == 100:
            h.seq += 3000  # seqs 101..3100 never reach the journal
        h.publish(TextDelta(message_id="m", text=f"{i:08d}" + "x" * 200))
    await h.journal.flush()
    removed = await h.journal.prune(now=NOW)
    stats = h.journal.statistics()
    assert stats["bytes"] <= limit
    assert stats["events"] == 4000 - removed
    assert stats["oldest_seq"] == 3000 + removed + 1  # still the oldest first, past the gap


async def test_the_writer_prunes_when_the_file_grows_past_its_limit(
    jpath: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    limit = 128 << 10
    h = Harness(jpath, retention=Retention(max_age=None, max_size=limit))
    pruned = trio.Event()
    prune = h.journal.prune

    async def pruning(now: float | None = None) -> int:
        removed = await prune(now)
        if removed:
            pruned.set()
        return removed

    monkeypatch.setattr(h.journal, "prune", pruning)
    async with trio.open_nursery() as nursery:
        await nursery.start(h.journal.run)
        for i in range(3000):
            h.publish(TextDelta(message_id="m", text=f"{i:08d}" + "x" * 200))
        await h.journal.journaled(3000)
        await pruned.wait()  # the write that went over the limit set it off
        h.publish()
        await h.journal.journaled(3001)
        nursery.cancel_scope.cancel()
    stats = h.journal.statistics()
    assert stats["bytes"] <= limit
    assert 0 < stats["events"] < 3001
    await h.journal.aclose()


async def test_writes_go_on_between_the_steps_of_a_long_prune(
    jpath: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prune of a full journal takes two seconds or more (a tenth of 1 GiB deleted, then
    the pages given back): an agent's events must not wait for all of it, or the 50 ms bound
    that acks and the crash window rely on breaks every time the file is full."""
    from busd.daemon import journalfile

    monkeypatch.setattr(journalfile, "_PRUNE_CHUNK", 200)  # many steps from a small file
    limit = 256 << 10
    h = Harness(jpath, retention=Retention(max_age=None, max_size=limit))
    for i in range(4000):
        h.publish(TextDelta(message_id="m", text=f"{i:08d}" + "x" * 200))
    await h.journal.flush()
    step, vacuum_step = h.journal.file.prune_step, h.journal.file.vacuum_step
    journaled_at: list[tuple[str, int]] = []  # the watermark as each later step starts

    def watermark() -> int:
        return int(h.journal.statistics()["journaled_seq"])

    def stepping(target: int) -> tuple[int, int]:
        if not journaled_at:
            trio.from_thread.run_sync(h.publish)  # an agent's event arrives mid-prune
        journaled_at.append(("prune", trio.from_thread.run_sync(watermark)))
        return step(target)

    def vacuuming(retention: Retention) -> int:
        trio.from_thread.run_sync(h.publish)  # and another while the pages go back
        journaled_at.append(("vacuum", trio.from_thread.run_sync(watermark)))
        return vacuum_step(retention)

    monkeypatch.setattr(h.journal.file, "prune_step", stepping)
    monkeypatch.setattr(h.journal.file, "vacuum_step", vacuuming)
    monkeypatch.setattr(journalfile, "_VACUUM_PAGES", 8)
    assert await h.journal.prune(now=NOW) > 0
    prunes = [seq for what, seq in journaled_at if what == "prune"]
    vacuums = [seq for what, seq in journaled_at if what == "vacuum"]
    assert len(prunes) > 2
    assert len(vacuums) > 2
    assert prunes[:2] == [4000, 4001]  # written before the next step, not after the prune
    # Each piece of the vacuum finds the event published during the one before written.
    assert vacuums == list(range(4001, 4001 + len(vacuums)))
    await h.journal.aclose()


async def test_a_prune_ends_in_a_file_that_cannot_give_pages_back(jpath: Path) -> None:
    """A file made without ``auto_vacuum`` keeps its free pages: the vacuum's steps stop
    when one frees none instead of trying forever."""
    JournalFile.open(jpath).close()
    conn = sqlite3.connect(jpath)  # as a file from before auto_vacuum would be
    conn.execute("PRAGMA auto_vacuum = NONE")
    conn.execute("VACUUM")
    conn.close()
    limit = 256 << 10
    h = Harness(jpath, retention=Retention(max_age=None, max_size=limit))
    for i in range(4000):
        h.publish(TextDelta(message_id="m", text=f"{i:08d}" + "x" * 200))
    await h.journal.flush()
    with trio.fail_after(30):
        assert await h.journal.prune(now=NOW) > 0
    free = h.journal.file._conn.execute("PRAGMA freelist_count").fetchone()[0]
    assert free > 0  # kept, for the next inserts to use
    await h.journal.aclose()


# -- the transcript --------------------------------------------------------------------


def conversation() -> list[Envelope[Event]]:
    """A run with thinking (signed), text, a tool call and its result, usage per call."""
    events: list[tuple[Event, dict[str, Any]]] = [
        (RunStarted(adapter="anthropic", model="claude-x", prompt="list the files"), {}),
        (SessionStart(model="claude-x", title="files"), {}),
        (TurnStart(turn_id="t1"), {}),
        (Usage(tokens=TokenUsage(input_tokens=100, output_tokens=1)), {}),
        (ThinkingDelta(message_id="b0", text="I should "), {}),
        (ThinkingDelta(message_id="b0", text="run ls."), {}),
        (
            ThinkingComplete(
                message_id="b0", text="I should run ls.", signature=SIGNATURE, duration_s=1.5
            ),
            {},
        ),
        (TextDelta(message_id="b1", text="Listing."), {}),
        (TextComplete(message_id="b1", text="Listing."), {}),
        (ToolStart(tool_call_id="c1", name="Bash", input={"command": "ls"}), {}),
        (Usage(tokens=TokenUsage(input_tokens=100, output_tokens=40)), {}),
        (TurnEnd(turn_id="t1", finish_reason="tool_use"), {}),
        (ToolComplete(tool_call_id="c1", name="Bash", output="a\nb\n", duration_s=0.1), {}),
        (TurnStart(turn_id="t2"), {}),
        (TextDelta(message_id="b2", text="Two files"), {}),  # cut short: no complete
        (Usage(tokens=TokenUsage(input_tokens=150, output_tokens=50, cost_usd=0.01)), {}),
        (TurnEnd(turn_id="t2", finish_reason="max_tokens"), {}),
        (RunFinished(status="ok", duration_s=3.0, usage=TokenUsage(input_tokens=150)), {}),
    ]
    return [
        envelope(seq, event, session="s1", run_id="r1", **kw)
        for seq, (event, kw) in enumerate(events, 1)
    ]


def test_the_transcript_has_messages_with_their_parts() -> None:
    t = build_transcript("s1", conversation())
    assert [m.role for m in t.messages] == ["user", "assistant", "tool", "assistant"]
    user, first, tool, second = t.messages
    assert user.parts == [TextPart(text="list the files")]
    assert first.parts == [
        ReasoningPart(
            text="I should run ls.", message_id="b0", signature=SIGNATURE, duration_s=1.5
        ),
        TextPart(text="Listing.", message_id="b1"),
        ToolCallPart(tool_call_id="c1", name="Bash", input={"command": "ls"}),
    ]
    assert (first.turn_id, first.finish_reason, first.model) == ("t1", "tool_use", "claude-x")
    assert first.usage == TokenUsage(input_tokens=100, output_tokens=40)
    assert tool.parts == [
        ToolResultPart(tool_call_id="c1", name="Bash", output="a\nb\n", duration_s=0.1)
    ]
    assert second.parts == [TextPart(text="Two files", message_id="b2", stopped=True)]
    assert second.usage == TokenUsage(input_tokens=50, output_tokens=10, cost_usd=0.01)
    assert t.usage == TokenUsage(input_tokens=150, output_tokens=50, cost_usd=0.01)
    assert [(r.run_id, r.adapter, r.status, r.prompt) for r in t.runs] == [
        ("r1", "anthropic", "ok", "list the files")
    ]


async def test_the_reasoning_signature_round_trips_through_the_journal(jpath: Path) -> None:
    h = Harness(jpath)
    for e in conversation():
        h.publish(e.event, session="s1", run_id="r1")
    await h.journal.aclose()
    decoder = msgspec.msgpack.Decoder(Catalog().envelope_type())
    with JournalReader(jpath) as reader:
        record = reader.session("s1")
        envelopes = [decoder.decode(blob) for blob in reader.session_events("s1")]
    assert record is not None
    document = msgspec.json.decode(
        export_document(record, build_transcript("s1", envelopes), lines=False)
    )
    reasoning = document["messages"][1]["parts"][0]
    assert reasoning == {
        "type": "reasoning",
        "text": "I should run ls.",
        "message_id": "b0",
        "signature": SIGNATURE,
        "duration_s": 1.5,
    }
    assert document["session"]["title"] == "files"
    lines = export_document(record, build_transcript("s1", envelopes), lines=True).splitlines()
    assert [msgspec.json.decode(line)["kind"] for line in lines] == ["session"] + ["message"] * 4
    assert msgspec.json.decode(lines[2])["parts"][0]["signature"] == SIGNATURE


# -- through a daemon on a real socket -------------------------------------------------------


def journal_of(daemon: Daemon) -> Journal:
    assert daemon.journal is not None
    return daemon.journal


async def publish_texts(client: Client, count: int, session: str = "s1") -> None:
    for i in range(count):
        await client.publish(TextDelta(message_id="m", text=str(i)), session_id=session)
    await client.flush()


async def collect(
    client: Client, since_seq: int, until_seq: int, **kw: Any
) -> tuple[list[Envelope[Event]], list[tuple[int, int]]]:
    events: list[Envelope[Event]] = []
    gaps: list[tuple[int, int]] = []
    async with client.subscribe([">"], since_seq=since_seq, window_ms=0, deltas="raw", **kw) as sub:
        with trio.fail_after(20):
            async for batch in sub:
                if batch.gap is not None:
                    gaps.append(batch.gap)
                events += batch.events
                if events and events[-1].seq >= until_seq:
                    return events, gaps
    raise AssertionError("the subscription ended")


async def test_a_resume_older_than_the_ring_reads_the_journal(
    tmp_path: Path, sock_path: Path
) -> None:
    config = DaemonConfig(journal=str(tmp_path / "j.sqlite3"), replay=16)
    async with (
        running_daemon(sock_path, config) as server,
        connect(sock_path, client="t", role="agent") as client,
    ):
        journal = journal_of(server.daemon)
        async with client.subscribe([">"], window_ms=0, deltas="raw") as live:
            await publish_texts(client, 200)
            head = server.daemon.bus.head_seq
            seen: list[Envelope[Event]] = []
            async for batch in live:
                seen += batch.events
                if seen[-1].seq >= head:
                    break
        # At once: some of it may still be waiting for its write.
        events, gaps = await collect(client, 10, head)
        assert gaps == []
        assert [(e.seq, e.id) for e in events[: head - 10]] == [(e.seq, e.id) for e in seen[10:]]
        await journal.journaled(head)
        events, gaps = await collect(client, 10, head)
        assert gaps == []
        assert [(e.seq, e.id) for e in events[: head - 10]] == [(e.seq, e.id) for e in seen[10:]]
        status = await client.request(Status())
        assert status["journal"]["path"] == str(tmp_path / "j.sqlite3")
        assert status["journal"]["journaled_seq"] >= head


async def test_a_resume_from_the_journal_neither_loses_nor_doubles_live_events(
    tmp_path: Path, sock_path: Path
) -> None:
    """Subscribe mid-stream from seq 0 while a publisher runs: every seq once, in order."""
    config = DaemonConfig(journal=str(tmp_path / "j.sqlite3"), replay=50)
    async with running_daemon(sock_path, config) as server:
        async with (
            connect(sock_path, client="pub", role="agent") as publisher,
            connect(sock_path, client="sub") as subscriber,
            trio.open_nursery() as nursery,
        ):
            await publish_texts(publisher, 1000)
            await journal_of(server.daemon).journaled(500)
            nursery.start_soon(publish_texts, publisher, 2000)  # still publishing meanwhile
            events, gaps = await collect(subscriber, 0, 3000, sessions=["s1"])
        assert gaps == []
        assert [e.seq for e in events[:3000]] == list(range(1, 3001))


@pytest.mark.parametrize("staging", [True, False])
async def test_the_daemon_stages_a_fast_stream_unless_told_not_to(
    tmp_path: Path, sock_path: Path, staging: bool
) -> None:
    """``busd serve --no-journal-staging`` is ``journal_staging=False``: writes insert whole."""
    config = DaemonConfig(journal=str(tmp_path / "j.sqlite3"), journal_staging=staging)
    async with running_daemon(sock_path, config) as server:
        journal = journal_of(server.daemon)
        stages: list[int] = []
        stage = journal.file.stage

        def counted(envelopes: Any, raws: Any) -> None:
            stages.append(len(envelopes))
            stage(envelopes, raws)

        journal.file.stage = counted  # type: ignore[method-assign]
        async with connect(sock_path, client="pub", role="agent") as client:
            await publish_texts(client, 1)  # a new journal's first write goes at once
            await journal.journaled(server.daemon.bus.head_seq)
            await publish_texts(client, 2000)
        await journal.journaled(server.daemon.bus.head_seq)
        stats = journal.statistics()
    assert (stats["events"], stats["duplicates"], stats["lost"]) == (2001, 0, 0)
    if staging:
        assert stages
        assert min(stages) >= journal.stage_events
    else:
        assert journal.stage_every == 0
        assert stages == []


async def test_a_restarted_daemon_continues_seq_keeps_sessions_and_resumes(
    tmp_path: Path, sock_path: Path
) -> None:
    path = str(tmp_path / "j.sqlite3")
    async with running_daemon(sock_path, DaemonConfig(journal=path)) as server:
        async with connect(sock_path, client="t", role="agent") as client:
            await client.publish(SessionStart(title="before"), session_id="s1")
            await publish_texts(client, 20)
            before, _ = await collect(client, 0, server.daemon.bus.head_seq)
    head = server.daemon.bus.head_seq  # the first daemon's last
    async with running_daemon(sock_path, DaemonConfig(journal=path)) as server:
        assert server.daemon.bus.head_seq == head
        assert server.daemon.sessions.summary("s1") is not None
        async with connect(sock_path, client="t", role="agent") as client:
            titles = [s["title"] for s in await client.request(_sessions())]
            assert "before" in titles
            async with trio.open_nursery() as nursery:
                nursery.start_soon(publish_texts, client, 1)
                after, gaps = await collect(client, 0, head + 1)
    assert gaps == []
    assert [(e.seq, e.id) for e in after[: len(before)]] == [(e.seq, e.id) for e in before]
    assert after[-1].seq == head + 1


def _sessions() -> Any:
    from busd.wire import Sessions

    return Sessions()


async def test_a_resume_gets_a_gap_for_what_retention_removed(
    tmp_path: Path, sock_path: Path
) -> None:
    path = str(tmp_path / "j.sqlite3")
    async with running_daemon(sock_path, DaemonConfig(journal=path)) as server:
        async with connect(sock_path, client="t", role="agent") as client:
            await publish_texts(client, 30)
    head = server.daemon.bus.head_seq
    file = JournalFile.open(path)
    file.prune_step(10)  # as retention would
    file.close()
    async with running_daemon(sock_path, DaemonConfig(journal=path)) as server:
        async with connect(sock_path, client="t", role="agent") as client:
            events, gaps = await collect(client, 0, head)
    assert gaps == [(1, 10)]
    assert [e.seq for e in events] == list(range(11, head + 1))


def test_a_daemon_on_a_journal_it_cannot_read_fails_clearly(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite3"
    _newer(path)
    with pytest.raises(JournalError, match="newer busd"):
        Daemon(DaemonConfig(journal=str(path)))


# -- smaller parts -------------------------------------------------------------------------


@pytest.mark.parametrize("count", [0, 1, 7, 255, 256, 257, 1000, 4096])
def test_ids_go_in_few_distinct_statement_sizes(count: int) -> None:
    sizes = list(_chunks(count))
    assert sum(sizes) == count
    assert set(sizes) <= {256, 128, 64, 32, 16, 8, 4, 2, 1}
    assert sizes == sorted(sizes, reverse=True)


def test_the_config_file_sets_the_journal(tmp_path: Path) -> None:
    path = tmp_path / "busd.toml"
    path.write_text('[journal]\npath = "~/j.sqlite3"\nmax_age = "12h"\nmax_size = 1048576\n')
    config = load_config(path)
    assert config.journal.path == "~/j.sqlite3"
    assert config.journal.limits() == (43_200.0, 1 << 20)
    assert FileConfig().journal.limits() == (None, None)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[journal]\nmax_age = "soon"\n', "not a duration"),
        ('[journal]\nmax_size = "lots"\n', "not a size"),
        ("[journal]\nmax_age = -1\n", "cannot be negative"),
        ("[journal]\nkeep = 3\n", "keep"),
    ],
)
def test_a_bad_journal_table_is_a_clear_error(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "busd.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def test_serve_checks_its_retention_flags_before_anything() -> None:
    result = CliRunner().invoke(main, ["serve", "--journal-max-age", "forever"])
    assert result.exit_code == 2
    assert "not a duration" in result.output


async def _nowhere(batch: list[Envelope[Event]]) -> None:
    pass


@pytest.mark.parametrize(
    ("patterns", "sessions", "owned_only"),
    [
        (["stream.text.*", "busd.run.>"], ["s1"], True),
        ([">"], None, False),  # everything: a ring's bytes are not even decoded
        ([">"], ["s1"], False),
        (["stream.>"], None, False),
    ],
)
def test_a_subscription_filters_rows_and_bytes_as_it_filters_envelopes(
    patterns: list[str], sessions: list[str] | None, owned_only: bool
) -> None:
    """A journal row by its columns, a ring's bytes by their heads: what the envelope says."""
    sub = Subscription(
        1,
        1,
        patterns,
        sessions=sessions,
        owned_only=owned_only,
        dispatcher=BatchDispatcher(_nowhere),
        owned={"r"},
    )
    cases = [
        envelope(1, session="s1", run_id="r"),
        envelope(2, session="s2", run_id="r"),
        envelope(3, session="s1"),
        envelope(4, session="s1", run_id="r", stale=True),
        envelope(5, SessionStart(), session="s1", run_id="r"),
        envelope(6, RunFinished(status="ok", duration_s=1.0), session="s1", run_id="r"),
        envelope(7, session="s1", run_id="someone-else's"),
        envelope(8, RunFinished(status="ok", duration_s=1.0), session=None, run_id="r"),
    ]
    for e in cases:
        row = (e.event.__struct_config__.tag, e.session_id, e.run_id, e.stale)
        assert sub.wants_row(*row) == sub.wants(e), e  # type: ignore[arg-type]
    raws = [encode_envelope(e) for e in cases]
    seqs, kept = sub.wanted([e.seq for e in cases], raws)
    assert seqs == [e.seq for e in cases if sub.wants(e)]
    assert kept == [raw for e, raw in zip(cases, raws, strict=True) if sub.wants(e)]
    if owned_only:
        assert [sub.wants(e) for e in cases] == [True, *[False] * 4, True, False, False]


def test_the_registry_names_the_adapter_and_says_who_changed() -> None:
    registry = SessionRegistry()
    registry.observe(envelope(1, session="a", source="client-3/claude-code"))
    registry.observe(envelope(2, RunStarted(adapter="copilot"), session="b"))
    registry.observe(envelope(3, session="c", source="busd-publish"))
    adapters = {s: registry.summary(s).adapter for s in "abc"}  # type: ignore[union-attr]
    assert adapters == {"a": "claude-code", "b": "copilot", "c": None}
    assert [s.session_id for s in registry.touched_since(1)] == ["c", "b"]
    assert registry.touched_since(3) == []


def test_docs_journal_md_shows_the_schema_as_it_is(jpath: Path) -> None:
    doc = (Path(__file__).resolve().parent.parent / "docs" / "journal.md").read_text()
    schema = doc[doc.index("```sql") : doc.index("```", doc.index("```sql") + 6)]
    JournalFile.open(jpath).close()
    with sqlite3.connect(jpath) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        indexes = conn.execute(
            "SELECT name FROM sqlite_master WHERE type='index' AND sql IS NOT NULL"
        ).fetchall()
        meta = [r[0] for r in conn.execute("SELECT key FROM meta")]
        assert sorted(tables) == ["batches", "ids", "lost", "meta", "sessions", "spans"]
        for table in tables:
            assert f"CREATE TABLE {table} (" in schema, table
            for column in conn.execute(f"PRAGMA table_info({table})"):
                assert f"{column[1]} " in schema, (table, column[1])
        for (index,) in indexes:
            assert f"CREATE INDEX {index} " in schema, index
    conn.close()
    for key in meta:
        assert f"{key}:" in schema, key
    assert f"the schema version, {SCHEMA_VERSION}" in doc


# -- backpressure --------------------------------------------------------------------------


class Gate:
    """Holds the journal's writes in their thread until opened; tells when one is held."""

    def __init__(self, journal: Journal) -> None:
        self.opened = threading.Event()
        self.held = trio.Event()
        self.waiting = trio.Event()  # a publisher waits for room
        write = journal.file.write
        room = journal.room

        def gated(*args: Any, **kwargs: Any) -> Any:
            trio.from_thread.run_sync(self.held.set)
            assert self.opened.wait(30)
            return write(*args, **kwargs)

        async def waited() -> None:
            self.waiting.set()
            await room()

        journal.file.write = gated  # type: ignore[method-assign]
        journal.room = waited  # type: ignore[method-assign]


async def test_a_slow_disk_slows_publishers_instead_of_losing_their_events(
    tmp_path: Path, sock_path: Path
) -> None:
    config = DaemonConfig(journal=str(tmp_path / "j.sqlite3"), journal_max_pending=400)
    async with running_daemon(sock_path, config) as server:
        journal = journal_of(server.daemon)
        journal.max_wait = 30.0
        gate = Gate(journal)
        async with connect(sock_path, client="pub", role="agent") as client:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(publish_texts, client, 3000)
                await gate.held.wait()
                await gate.waiting.wait()  # the daemon stopped reading the publisher
                assert journal.high_water <= journal.pending <= journal.high_water + 64
                assert journal.statistics()["lost"] == 0
                gate.opened.set()
            head = server.daemon.bus.head_seq
            await journal.journaled(head)
        stats = journal.statistics()
        assert stats["lost"] == 0
        assert stats["held"] >= 1  # status says publishers waited, and how long
        assert stats["held_s"] > 0
    with JournalReader(tmp_path / "j.sqlite3") as reader:
        assert [r[0] for r in reader.page(0, head, limit=10_000).rows] == list(range(1, head + 1))


async def test_a_stuck_disk_holds_publishers_back_only_for_a_while(
    tmp_path: Path, sock_path: Path
) -> None:
    path = tmp_path / "j.sqlite3"
    config = DaemonConfig(journal=str(path), journal_max_pending=400)
    async with running_daemon(sock_path, config) as server:
        journal = journal_of(server.daemon)
        journal.max_wait = 0.1
        gate = Gate(journal)
        async with connect(sock_path, client="pub", role="agent") as client:
            with trio.fail_after(20):
                await publish_texts(client, 3000)  # done while the disk is still stuck
                await client.request(Status())
            assert journal.pending <= 400
            assert journal.statistics()["held_s"] >= journal.max_wait
            assert journal.statistics()["lost"] > 0
            gate.opened.set()
            head = server.daemon.bus.head_seq
            await journal.journaled(head)
    with JournalReader(path) as reader:
        page = reader.page(0, head, limit=10_000)
    assert page.lost  # recorded: a resume gets a gap for it
    assert sorted(
        {r[0] for r in page.rows} | {s for a, b in page.lost for s in range(a, b + 1)}
    ) == list(range(1, head + 1))


def test_the_sessions_table_keeps_the_per_model_breakdown(tmp_path: Path) -> None:
    """`busd sessions --json` shows what each model used, after the daemon is gone (issue 21)."""
    path = tmp_path / "journal.sqlite3"
    sonnet = TokenUsage(input_tokens=10, output_tokens=100, cache_read_tokens=5)
    haiku = TokenUsage(input_tokens=3, output_tokens=7)
    state = SessionState("s1", 1, 1.0)
    state.usage = add_usage(sonnet, haiku)
    state.usage_by_model = {"claude-sonnet-4-5": sonnet, "claude-haiku-4-5": haiku}
    journal = JournalFile.open(path)
    try:
        journal.write([], [], [], [journalrows.session_row(state)], head=1, reserved=1)
    finally:
        journal.close()
    with JournalReader(path) as reader:
        [record] = reader.sessions()
    assert record.usage == add_usage(sonnet, haiku)
    assert record.usage_by_model == state.usage_by_model


def test_a_usage_column_without_a_breakdown_reads_as_an_empty_one() -> None:
    """Journals written before the breakdown was stored (and by other busds) still read."""
    old = msgspec.json.encode(TokenUsage(input_tokens=1, output_tokens=2))
    total, by_model = journalrows._usage(old)
    assert (total, by_model) == (TokenUsage(input_tokens=1, output_tokens=2), {})
    new = journalrows._usage_blob(TokenUsage(output_tokens=2), {"m": TokenUsage(output_tokens=2)})
    assert new is not None
    assert msgspec.json.decode(new, type=TokenUsage) == TokenUsage(output_tokens=2)  # old readers
