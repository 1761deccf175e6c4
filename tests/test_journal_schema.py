"""The journal's schema 2 (an event's row is seq, id, envelope) and schema 1 files.

A schema 1 journal written by the last busd that wrote them
(tests/fixtures/journal/v1.sqlite3) is read as it is, rebuilt by a writer
without losing a row, and served by a real ``busd serve``; readers get
what the old columns held from the envelope's head.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import shutil
import sqlite3
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from busd.cli import main
from busd.client import connect
from busd.core.events import (
    Envelope,
    Event,
    SessionIdle,
    SessionStart,
    TextDelta,
    ToolStart,
)
from busd.core.ids import new_event_id
from busd.core.sessions import SessionRegistry
from busd.daemon import journalfile, journalrows
from busd.daemon.journalfile import (
    SCHEMA_VERSION,
    JournalError,
    JournalFile,
    JournalReader,
    session_row,
)
from busd.daemon.journalrecover import recover
from busd.daemon.journalspan import Missing, page_items
from busd.wire import encode_envelope

from .daemon_helpers import BUSD, read_line, serving

V1 = Path(__file__).parent / "fixtures" / "journal" / "v1.sqlite3"
V1_SESSIONS = {
    "febcaa44-9f0f-4ae7-ad70-748009748653": (1, 28),
    "4db6a695-04ee-466f-b26b-74dae52ad74c": (29, 56),
    "ses_43ad8482affef0ocxqD4UJi3Ym": (57, 80),
    "sess_abc123def456": (81, 113),
    "anthropic-fixture-session": (100114, 100124),
}
V1_SEQS = [*range(1, 114), *range(100114, 100125)]


@pytest.fixture
def v1(tmp_path: Path) -> Path:
    """A copy: SQLite adds ``-shm`` and ``-wal`` files beside any journal it opens."""
    path = tmp_path / "journal.sqlite3"
    shutil.copyfile(V1, path)
    return path


def query(path: Path, sql: str) -> list[Any]:
    conn = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def whole(path: Path) -> journalfile.Page:
    with JournalReader(path) as reader:
        return reader.page(0, 1 << 62, limit=1 << 30)


def test_the_fixture_is_a_schema_1_journal(v1: Path) -> None:
    assert query(v1, "PRAGMA user_version") == [(1,)]
    assert [r[0] for r in query(v1, "SELECT seq FROM events ORDER BY seq")] == V1_SEQS
    assert ("events_by_session",) in query(v1, "SELECT name FROM sqlite_master")


def test_a_reader_reads_a_schema_1_journal_as_it_is(v1: Path) -> None:
    before = hashlib.sha256(v1.read_bytes()).hexdigest()
    columns = query(
        v1, "SELECT seq, type, session_id, run_id, stale, envelope FROM events ORDER BY seq"
    )
    page = whole(v1)
    # what schema 1 stored in columns, a reader now gets from the envelope's head
    assert [(*row[:4], int(row[4]), row[5]) for row in page.rows] == columns
    assert page.lost == [(114, 100113)]
    with JournalReader(v1) as reader:
        assert {s.session_id: (s.first_seq, s.last_seq) for s in reader.sessions()} == V1_SESSIONS
        for session_id, (first, last) in V1_SESSIONS.items():
            blobs = list(reader.session_events(session_id))
            assert [msgspec.msgpack.decode(b)["seq"] for b in blobs] == [
                s for s in V1_SEQS if first <= s <= last
            ]
        only = reader.page(0, 1 << 62, sessions=["sess_abc123def456"]).rows
    assert [row[0] for row in only] == list(range(81, 114))
    assert hashlib.sha256(v1.read_bytes()).hexdigest() == before
    assert query(v1, "PRAGMA user_version") == [(1,)]


def test_the_writer_rebuilds_a_schema_1_journal_keeping_every_row(
    v1: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tables = ("SELECT seq, id, envelope FROM events ORDER BY seq", "SELECT * FROM lost")
    kept = ("SELECT * FROM sessions ORDER BY session_id", "SELECT * FROM meta ORDER BY key")
    before = [query(v1, sql) for sql in (*tables, *kept)]
    with caplog.at_level(logging.INFO, logger="busd.daemon.journalfile"):
        JournalFile.open(v1).close()
    assert f"journal {v1}: rebuilding schema 1 as schema 2 (124 events)" in caplog.text
    assert f"journal {v1}: rebuilt as schema 2 (124 events" in caplog.text
    assert query(v1, "PRAGMA user_version") == [(SCHEMA_VERSION,)] == [(2,)]
    assert [r[1] for r in query(v1, "PRAGMA table_info(events)")] == ["seq", "id", "envelope"]
    assert query(v1, "SELECT name FROM sqlite_master WHERE tbl_name = 'events'") == [
        ("events",),
        ("sqlite_autoindex_events_1",),  # the id's uniqueness, nothing else
    ]
    assert [query(v1, sql) for sql in (*tables, *kept)] == before
    assert {s: (a, b) for s, a, b in query(v1, "SELECT * FROM spans")} == V1_SESSIONS
    assert query(v1, "PRAGMA journal_mode") == [("wal",)]
    assert query(v1, "PRAGMA integrity_check") == [("ok",)]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="busd.daemon.journalfile"):
        again = JournalFile.open(v1)  # the second open finds nothing to do
    try:
        assert again.statistics()["events"] == 124
    finally:
        again.close()
    assert "rebuilt" not in caplog.text


def test_a_rebuild_while_a_reader_has_the_file_open(v1: Path) -> None:
    """The reader keeps WAL mode on (the rebuild goes through the WAL) and reads on after it."""
    with JournalReader(v1) as reader:
        before = reader.page(0, 1 << 62).rows
        JournalFile.open(v1).close()
        assert query(v1, "PRAGMA user_version") == [(2,)]
        assert reader.page(0, 1 << 62).rows == before
        assert [s.session_id for s in reader.sessions()] == list(reversed(V1_SESSIONS))


def test_a_rebuild_that_fails_leaves_the_file_as_it_was(
    v1: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = hashlib.sha256(v1.read_bytes()).hexdigest()
    failing = journalrows.MIGRATE_1_TO_2.replace("COMMIT;", "INSERT INTO nowhere VALUES (1);")
    monkeypatch.setattr(journalfile, "MIGRATE_1_TO_2", failing)
    with pytest.raises(JournalError, match=r"cannot rebuild the journal .* \(schema 1\)"):
        JournalFile.open(v1)
    assert query(v1, "PRAGMA user_version") == [(1,)]
    assert query(v1, "SELECT count(*) FROM events") == [(124,)]
    assert ("events_2",) not in query(v1, "SELECT name FROM sqlite_master")
    monkeypatch.undo()
    JournalFile.open(v1).close()  # the lock was let go; the real rebuild works
    assert query(v1, "PRAGMA user_version") == [(2,)]
    assert before != hashlib.sha256(v1.read_bytes()).hexdigest()


def test_sessions_and_export_say_the_same_before_and_after_the_rebuild(v1: Path) -> None:
    runner = CliRunner()

    def outputs() -> list[bytes]:
        said = [runner.invoke(main, ["sessions", "--journal", str(v1), "--json"])]
        for session_id in V1_SESSIONS:
            said.append(runner.invoke(main, ["export", "--journal", str(v1), session_id]))
        assert all(r.exit_code == 0 for r in said), [r.output for r in said]
        return [r.stdout_bytes for r in said]

    before = outputs()
    assert all(b'"role":"assistant"' in b for b in before[1:])
    JournalFile.open(v1).close()
    assert query(v1, "PRAGMA user_version") == [(2,)]
    assert outputs() == before


def test_recover_makes_schema_2_from_a_schema_1_journal(v1: Path) -> None:
    rows = query(v1, "SELECT seq, id, envelope FROM events ORDER BY seq")
    result = recover(v1)
    assert (result.events, result.sessions, result.damaged) == (124, 5, [])
    assert query(v1, "PRAGMA user_version") == [(2,)]
    assert query(v1, "SELECT seq, id, envelope FROM events ORDER BY seq") == rows
    assert {s: (a, b) for s, a, b in query(v1, "SELECT * FROM spans")} == V1_SESSIONS
    assert whole(v1).lost == [(114, 100113)]


async def test_busd_serve_on_a_schema_1_journal_resumes_from_it(v1: Path, tmp_path: Path) -> None:
    sock = tmp_path / "run" / "bus.sock"
    ids = dict(query(v1, "SELECT seq, id FROM events"))
    async with serving(sock, "--journal", str(v1)):
        async with connect(sock, client="t", role="agent") as client:
            seen: list[tuple[int, str]] = []
            gaps: list[tuple[int, int]] = []
            async with client.subscribe([">"], since_seq=0, window_ms=0, deltas="raw") as sub:
                await client.publish(SessionIdle(), session_id="s-new")
                with trio.fail_after(20):
                    async for batch in sub:
                        if batch.gap is not None:
                            gaps.append(batch.gap)
                        seen += [(e.seq, e.id) for e in batch.events]
                        if seen and seen[-1][0] > 100124:
                            break
            session = "sess_abc123def456"
            async with client.subscribe([">"], since_seq=0, sessions=[session]) as only:
                await client.publish(SessionIdle(), session_id=session)
                mine: list[int] = []
                with trio.fail_after(20):
                    async for batch in only:
                        assert {e.session_id for e in batch.events} <= {session}
                        mine += [e.seq for e in batch.events]
                        if mine and mine[-1] > 100125:
                            break
    assert [x for x in seen if x[0] <= 100124] == [(seq, ids[seq]) for seq in V1_SEQS]
    assert next(seq for seq, _ in seen if seq > 100124) == 100125  # none given twice
    assert gaps == [(114, 100113)]
    assert [seq for seq in mine if seq <= 100124] == list(range(81, 114))
    assert query(v1, "PRAGMA user_version") == [(2,)]


def test_an_envelope_that_does_not_decode_is_a_gap_not_a_frame(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    delta = TextDelta(message_id="m", text="x")
    envelopes = [_envelope(seq, "s1", None, False, delta) for seq in (1, 2, 3)]
    write(path, envelopes)
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("UPDATE events SET envelope = x'c1' WHERE seq = 2")  # 0xc1: never msgpack
    conn.close()
    page = whole(path)
    assert [row[0] for row in page.rows] == [1, 3]
    assert page.lost == [(2, 2)]
    assert Missing(2, 2) in page_items(0, page, lambda *_: True)
    with JournalReader(path) as reader:
        assert len(list(reader.session_events("s1"))) == 2


def write(path: Path, envelopes: list[Envelope[Event]], cuts: Iterable[int] = ()) -> None:
    """``envelopes`` in one write, or one per stretch between ``cuts``; no sessions rows."""
    file = JournalFile.open(path)
    try:
        bounds = [0, *sorted({c for c in cuts if 0 < c < len(envelopes)}), len(envelopes)]
        for a, b in itertools.pairwise(bounds):
            part = envelopes[a:b]
            if not part:
                continue
            raws = [encode_envelope(e) for e in part]
            file.write(part, raws, [], [], head=part[-1].seq, reserved=part[-1].seq)
    finally:
        file.close()


def _envelope(
    seq: int, session: str | None, run: str | None, stale: bool, event: Event
) -> Envelope[Event]:
    return Envelope(
        seq, 1e9 + seq, event, session_id=session, run_id=run, stale=stale, id=new_event_id()
    )


_events = st.sampled_from(
    [
        TextDelta(message_id="m", text="hello"),
        SessionStart(title="t"),
        ToolStart(tool_call_id="c", name="Bash", input={"command": "ls"}),
        SessionIdle(),
    ]
)
_rows = st.lists(
    st.tuples(
        st.sampled_from([None, "s1", "s2", "s3"]),
        st.sampled_from([None, "r1", "r2"]),
        st.booleans(),
        _events,
    ),
    max_size=40,
)


@settings(max_examples=80, deadline=None)
@given(
    rows=_rows,
    cuts=st.lists(st.integers(1, 40), max_size=4),
    sessions=st.none() | st.lists(st.sampled_from(["s1", "s2", "s4"])),
    limit=st.integers(1, 50),
)
def test_pages_are_each_envelopes_head_and_a_session_filter_keeps_only_those(
    tmp_path_factory: pytest.TempPathFactory,
    rows: list[tuple[str | None, str | None, bool, Event]],
    cuts: list[int],
    sessions: list[str] | None,
    limit: int,
) -> None:
    """Written in several transactions, read page by page as a resume reads."""
    path = tmp_path_factory.mktemp("j") / "journal.sqlite3"
    envelopes = [_envelope(i + 1, *row) for i, row in enumerate(rows)]
    write(path, envelopes, cuts)
    got: list[journalfile.Row] = []
    cursor, upto = 0, len(envelopes) + 5  # the range may run past the file's last event
    with JournalReader(path) as reader:
        while cursor < upto:
            page = reader.page(cursor, upto, limit=limit, sessions=sessions)
            assert page.end > cursor
            assert page.lost == []
            got += page.rows
            cursor = page.end
        exported = {s: list(reader.session_events(s)) for s in ("s1", "s2", "s3", "s4")}
    assert got == [
        (e.seq, e.event.__struct_config__.tag, e.session_id, e.run_id, e.stale, bytes(raw))
        for e in envelopes
        if sessions is None or e.session_id in sessions
        for raw in [encode_envelope(e)]
    ]
    for session_id, blobs in exported.items():
        assert blobs == [bytes(encode_envelope(e)) for e in envelopes if e.session_id == session_id]
    spans: dict[str, tuple[int, int]] = {}
    for e in envelopes:
        if e.session_id is not None:
            spans[e.session_id] = (spans.get(e.session_id, (e.seq, 0))[0], e.seq)
    assert {s: (a, b) for s, a, b in query(path, "SELECT * FROM spans")} == spans


def test_export_finds_a_session_the_registry_forgot(tmp_path: Path) -> None:
    """The registry keeps 10,000 sessions: one forgotten between writes keeps a stale row.

    Its ``sessions`` row says where it stood at the first write; its later
    events are in the file all the same, and ``spans`` says where.
    """
    path = tmp_path / "journal.sqlite3"
    delta = TextDelta(message_id="m", text="x")
    envelopes = [_envelope(seq, f"s{seq % 3}", None, False, delta) for seq in range(1, 31)]
    registry = SessionRegistry()
    for e in envelopes[:10]:
        registry.observe(e)
    file = JournalFile.open(path)
    try:
        for part, rows in (
            (envelopes[:10], [session_row(state) for state in registry.touched_since(0)]),
            (envelopes[10:], []),  # forgotten: no rows for the later writes
        ):
            raws = [encode_envelope(e) for e in part]
            file.write(part, raws, [], rows, head=part[-1].seq, reserved=part[-1].seq)
    finally:
        file.close()
    assert max(r[0] for r in query(path, "SELECT last_seq FROM sessions")) == 10
    with JournalReader(path) as reader:
        for session_id in ("s0", "s1", "s2"):
            seqs = [msgspec.msgpack.decode(b)["seq"] for b in reader.session_events(session_id)]
            assert seqs == [e.seq for e in envelopes if e.session_id == session_id]
        assert list(reader.session_events("s9")) == []


def test_retention_takes_a_sessions_span_with_its_last_event(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    delta = TextDelta(message_id="m", text="x")
    sessions = ["old"] * 10 + ["both"] * 10 + ["new"] * 10 + ["both"]  # seqs 1..31
    envelopes = [_envelope(i + 1, s, None, False, delta) for i, s in enumerate(sessions)]
    write(path, envelopes)
    file = JournalFile.open(path)
    try:
        assert file.prune_step(15) == (15, 15)
    finally:
        file.close()
    spans = {s: (a, b) for s, a, b in query(path, "SELECT * FROM spans")}
    assert spans == {"both": (11, 31), "new": (21, 30)}  # "old" went with its last event
    with JournalReader(path) as reader:
        seqs = [msgspec.msgpack.decode(b)["seq"] for b in reader.session_events("both")]
    assert seqs == [*range(16, 21), 31]


def _grown(path: Path, events: int) -> list[Any]:
    """The schema 1 fixture and ``events`` more in schema 1's columns: a longer rebuild."""
    delta = TextDelta(message_id="m", text="a rebuild takes a while " * 4)
    tag = "stream.text.delta"
    more = [_envelope(200_000 + i, f"s{i % 7}", "r", False, delta) for i in range(1, events + 1)]
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [(e.seq, e.id, e.ts, e.session_id, "r", tag, 0, encode_envelope(e)) for e in more],
        )
        conn.execute("UPDATE meta SET value = value + ? WHERE key = 'events'", (events,))
        conn.execute("UPDATE meta SET value = ? WHERE key IN ('head', 'reserved')", (more[-1].seq,))
        conn.execute("COMMIT")
    finally:
        conn.close()
    return query(path, "SELECT seq, id, envelope FROM events ORDER BY seq")


async def _killed_mid_rebuild(v1: Path, sock: Path) -> None:
    """``busd serve`` on ``v1``, killed with SIGKILL once its rebuild has written to the file."""
    process = await trio.lowlevel.open_process(
        [*BUSD, "serve", "--socket", str(sock), "--journal", str(v1)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    size = v1.stat().st_size
    try:
        assert process.stderr is not None
        with trio.fail_after(20):
            while "rebuilding schema 1" not in (line := await read_line(process.stderr)):
                assert line, "busd serve ended before it rebuilt the journal"
            while True:  # a condition of another process: polled, with a deadline
                if v1.stat().st_size > size:
                    break
                await trio.sleep(0.001)
        process.kill()  # mid-copy: the new table's first pages are in the file
        await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        assert process.stderr is not None
        await process.stderr.aclose()
    hot = Path(f"{v1}-journal").read_bytes()[:8]
    assert hot == bytes.fromhex("d9d505f920a163d7")  # SQLite's rollback journal, hot: its magic


async def test_busd_serve_killed_while_it_rebuilds_a_journal_leaves_schema_1_whole(
    v1: Path, tmp_path: Path
) -> None:
    """``kill -9`` mid-rebuild: the next ``busd serve`` finds schema 1 as it was and rebuilds it."""
    rows = _grown(v1, 100_000)
    sock = tmp_path / "run" / "bus.sock"
    await _killed_mid_rebuild(v1, sock)
    with pytest.raises(JournalError, match="left mid-change by a busd that was killed"):
        JournalReader(v1)  # read-only: it cannot roll the change back
    said = await trio.run_process(
        [*BUSD, "sessions", "--journal", str(v1)], capture_stderr=True, check=False
    )
    assert said.returncode == 1
    assert b"the next `busd serve" in said.stderr
    assert b"Traceback" not in said.stderr
    async with serving(sock, "--journal", str(v1)):
        pass
    assert query(v1, "PRAGMA user_version") == [(2,)]
    assert query(v1, "SELECT seq, id, envelope FROM events ORDER BY seq") == rows
    assert query(v1, "PRAGMA integrity_check") == [("ok",)]


async def test_recover_after_a_killed_rebuild_takes_the_rollback_journal_along(
    v1: Path, tmp_path: Path
) -> None:
    """The file set aside keeps its hot ``-journal``: SQLite rolls it back when recover reads."""
    rows = _grown(v1, 100_000)
    await _killed_mid_rebuild(v1, tmp_path / "run" / "bus.sock")
    result = recover(v1)
    assert not Path(f"{v1}-journal").exists()
    assert not Path(f"{result.aside}-journal").exists()  # rolled back, then gone
    assert (result.events, result.damaged) == (len(rows), [])
    assert query(v1, "SELECT seq, id, envelope FROM events ORDER BY seq") == rows
    assert query(v1, "PRAGMA user_version") == [(2,)]
