"""The journal's schema 3 (a row per write, the ids beside it), and schema 1 and 2 files.

Journals written by the last busd of schemas 1 and 2
(tests/fixtures/journal/v1.sqlite3 and v2.sqlite3) are read as they are,
rebuilt by a writer without losing an event, and served by a real ``busd
serve``; readers get what schema 1's columns held from the envelope's head.
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
from busd.daemon import journalfile, journalstore
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

FIXTURES = Path(__file__).parent / "fixtures" / "journal"
V1 = FIXTURES / "v1.sqlite3"
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


@pytest.fixture(params=[1, 2], ids=["schema1", "schema2"])
def old(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, int]:
    """A copy of the schema 1 or the schema 2 fixture, and its version."""
    path = tmp_path / "journal.sqlite3"
    shutil.copyfile(FIXTURES / f"v{request.param}.sqlite3", path)
    return path, request.param


def query(path: Path, sql: str) -> list[Any]:
    conn = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def stored(path: Path) -> list[tuple[int, str, bytes]]:
    """Every stored event as (seq, id, envelope bytes), whatever the file's schema."""
    if query(path, "PRAGMA user_version") < [(3,)]:
        return query(path, "SELECT seq, id, envelope FROM events ORDER BY seq")
    out: list[tuple[int, str, bytes]] = []
    for first, last, blob in query(path, "SELECT * FROM batches ORDER BY first_seq"):
        for raw in msgspec.msgpack.decode(blob, type=list[msgspec.Raw]):
            envelope = msgspec.msgpack.decode(raw)
            assert first <= envelope["seq"] <= last
            out.append((envelope["seq"], envelope["id"], bytes(raw)))
    assert out == sorted(out)
    return out


def whole(path: Path) -> journalfile.Page:
    with JournalReader(path) as reader:
        return reader.page(0, 1 << 62, limit=1 << 30)


def test_the_fixtures_are_schema_1_and_2_journals(old: tuple[Path, int]) -> None:
    path, version = old
    assert query(path, "PRAGMA user_version") == [(version,)]
    assert [r[0] for r in query(path, "SELECT seq FROM events ORDER BY seq")] == V1_SEQS
    names = {name for (name,) in query(path, "SELECT name FROM sqlite_master")}
    assert ("events_by_session" in names) == (version == 1)
    assert ("spans" in names) == (version == 2)


def test_a_reader_reads_an_old_journal_as_it_is(old: tuple[Path, int]) -> None:
    path, version = old
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    page = whole(path)
    heads = [(seq, msgspec.msgpack.decode(blob), blob) for seq, _, blob in stored(path)]
    assert [(*row[:5], row[5]) for row in page.rows] == [
        (seq, e["event"]["type"], e.get("session_id"), e.get("run_id"), e.get("stale", False), b)
        for seq, e, b in heads
    ]
    if version == 1:  # what schema 1 stored in columns, a reader gets from the envelope's head
        columns = query(
            path, "SELECT seq, type, session_id, run_id, stale, envelope FROM events ORDER BY seq"
        )
        assert [(*row[:4], int(row[4]), row[5]) for row in page.rows] == columns
    assert page.lost == [(114, 100113)]
    with JournalReader(path) as reader:
        assert {s.session_id: (s.first_seq, s.last_seq) for s in reader.sessions()} == V1_SESSIONS
        for session_id, (first, last) in V1_SESSIONS.items():
            blobs = list(reader.session_events(session_id))
            assert [msgspec.msgpack.decode(b)["seq"] for b in blobs] == [
                s for s in V1_SEQS if first <= s <= last
            ]
        only = reader.page(0, 1 << 62, sessions=["sess_abc123def456"]).rows
    assert [row[0] for row in only] == list(range(81, 114))
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    assert query(path, "PRAGMA user_version") == [(version,)]


def test_the_writer_rebuilds_an_old_journal_keeping_every_event(
    old: tuple[Path, int], caplog: pytest.LogCaptureFixture
) -> None:
    path, version = old
    kept = (
        "SELECT * FROM lost",
        "SELECT * FROM sessions ORDER BY session_id",
        "SELECT * FROM meta ORDER BY key",
    )
    before = [stored(path), *(query(path, sql) for sql in kept)]
    with caplog.at_level(logging.INFO, logger="busd.daemon.journalfile"):
        JournalFile.open(path).close()
    assert f"journal {path}: rebuilding schema {version} as schema 3 (124 events)" in caplog.text
    assert f"journal {path}: rebuilt as schema 3 (124 events" in caplog.text
    assert query(path, "PRAGMA user_version") == [(SCHEMA_VERSION,)] == [(3,)]
    assert [stored(path), *(query(path, sql) for sql in kept)] == before
    assert sorted(query(path, "SELECT seq, id FROM ids")) == [(s, i) for s, i, _ in before[0]]
    tables = {name for (name,) in query(path, "SELECT name FROM sqlite_master WHERE type='table'")}
    assert tables == {"batches", "ids", "lost", "sessions", "spans", "meta"}
    assert {s: (a, b) for s, a, b in query(path, "SELECT * FROM spans")} == V1_SESSIONS
    assert query(path, "PRAGMA journal_mode") == [("wal",)]
    assert query(path, "PRAGMA integrity_check") == [("ok",)]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="busd.daemon.journalfile"):
        again = JournalFile.open(path)  # the second open finds nothing to do
    try:
        assert again.statistics()["events"] == 124
    finally:
        again.close()
    assert "rebuilt" not in caplog.text


def test_a_rebuild_while_a_reader_has_the_file_open(old: tuple[Path, int]) -> None:
    """The reader keeps WAL mode on (the rebuild goes through the WAL) and reads on after it."""
    path, _ = old
    with JournalReader(path) as reader:
        before = reader.page(0, 1 << 62).rows
        JournalFile.open(path).close()
        assert query(path, "PRAGMA user_version") == [(3,)]
        assert reader.page(0, 1 << 62).rows == before
        assert [s.session_id for s in reader.sessions()] == list(reversed(V1_SESSIONS))


def test_a_rebuild_that_fails_leaves_the_file_as_it_was(
    old: tuple[Path, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, version = old
    before = hashlib.sha256(path.read_bytes()).hexdigest()

    def failing(conn: sqlite3.Connection, version: int) -> int:
        journalstore.rebuild(conn, version)  # all of it, then the disk fails
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(journalfile, "rebuild", failing)
    with pytest.raises(JournalError, match=rf"cannot rebuild the journal .* \(schema {version}\)"):
        JournalFile.open(path)
    assert query(path, "PRAGMA user_version") == [(version,)]
    assert query(path, "SELECT count(*) FROM events") == [(124,)]
    assert ("batches",) not in query(path, "SELECT name FROM sqlite_master")
    monkeypatch.undo()
    JournalFile.open(path).close()  # the lock was let go; the real rebuild works
    assert query(path, "PRAGMA user_version") == [(3,)]
    assert before != hashlib.sha256(path.read_bytes()).hexdigest()


def test_sessions_and_export_say_the_same_before_and_after_the_rebuild(
    old: tuple[Path, int],
) -> None:
    path, _ = old
    runner = CliRunner()

    def outputs() -> list[bytes]:
        said = [runner.invoke(main, ["sessions", "--journal", str(path), "--json"])]
        for session_id in V1_SESSIONS:
            said.append(runner.invoke(main, ["export", "--journal", str(path), session_id]))
        assert all(r.exit_code == 0 for r in said), [r.output for r in said]
        return [r.stdout_bytes for r in said]

    before = outputs()
    assert all(b'"role":"assistant"' in b for b in before[1:])
    JournalFile.open(path).close()
    assert query(path, "PRAGMA user_version") == [(3,)]
    assert outputs() == before


def test_recover_makes_schema_3_from_an_old_journal(old: tuple[Path, int]) -> None:
    path, _ = old
    events = stored(path)
    result = recover(path)
    assert (result.events, result.sessions, result.damaged) == (124, 5, [])
    assert query(path, "PRAGMA user_version") == [(3,)]
    assert stored(path) == events
    assert {s: (a, b) for s, a, b in query(path, "SELECT * FROM spans")} == V1_SESSIONS
    assert whole(path).lost == [(114, 100113)]
    again = recover(path)  # and from schema 3: the same
    assert (again.events, again.sessions, again.damaged) == (124, 5, [])
    assert stored(path) == events


async def test_busd_serve_on_an_old_journal_resumes_from_it(
    old: tuple[Path, int], tmp_path: Path
) -> None:
    path, _ = old
    sock = tmp_path / "run" / "bus.sock"
    ids = dict(query(path, "SELECT seq, id FROM events"))
    async with serving(sock, "--journal", str(path)):
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
    assert query(path, "PRAGMA user_version") == [(3,)]


def _batch_row(path: Path, change: Any) -> None:
    """Rewrite the first batch row's envelopes with ``change(list of raws)``."""
    conn = sqlite3.connect(path)
    with conn:
        first, blob = conn.execute("SELECT first_seq, envelopes FROM batches").fetchone()
        raws = msgspec.msgpack.decode(blob, type=list[msgspec.Raw])
        blob = change(raws)
        conn.execute("UPDATE batches SET envelopes = ? WHERE first_seq = ?", (blob, first))
    conn.close()


def test_an_envelope_that_does_not_decode_is_a_gap_not_a_frame(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    delta = TextDelta(message_id="m", text="x")
    envelopes = [_envelope(seq, "s1", None, False, delta) for seq in (1, 2, 3, 4)]
    write(path, envelopes)
    seven = msgspec.Raw(msgspec.msgpack.encode(7))  # msgpack, but not an envelope
    _batch_row(path, lambda raws: msgspec.msgpack.encode([raws[0], seven, *raws[2:]]))
    page = whole(path)
    assert [row[0] for row in page.rows] == [1, 3, 4]
    assert page.lost == [(2, 2)]  # between its neighbours
    assert Missing(2, 2) in page_items(0, page, lambda *_: True)
    with JournalReader(path) as reader:
        assert len(list(reader.session_events("s1"))) == 3
    _batch_row(path, lambda raws: b"\xc1")  # 0xc1: never msgpack; the row cannot be read
    page = whole(path)
    assert (page.rows, page.lost) == ([], [(1, 4)])
    with JournalReader(path) as reader:
        assert list(reader.session_events("s1")) == []
    file = JournalFile.open(path)
    try:  # age retention has no times to go by in it (and does not fail on it)
        assert file.prune_target(journalfile.Retention(max_age=1.0, max_size=None), 2e9) == 0
        # retention by seq cuts the row: what it could not read after the cut stays a gap
        assert file.prune_step(2) == (2, 0)
    finally:
        file.close()
    page = whole(path)
    assert (page.floor, page.rows, page.lost) == (2, [], [(3, 4)])
    assert query(path, "SELECT count(*) FROM batches") == [(0,)]


def test_retention_cutting_a_row_keeps_the_gap_of_an_envelope_after_its_cut(
    tmp_path: Path,
) -> None:
    """The row that stays is written again: an envelope after the cut that does not decode
    is not in it, so its seq is recorded lost (else a resume would skip it without a gap)."""
    path = tmp_path / "journal.sqlite3"
    delta = TextDelta(message_id="m", text="x")
    write(path, [_envelope(seq, "s1", None, False, delta) for seq in (1, 2, 3, 4, 5)])
    seven = msgspec.Raw(msgspec.msgpack.encode(7))  # msgpack, but not an envelope
    _batch_row(path, lambda raws: msgspec.msgpack.encode([*raws[:3], seven, raws[4]]))
    assert whole(path).lost == [(4, 4)]
    file = JournalFile.open(path)
    try:
        assert file.prune_step(2) == (2, 2)
    finally:
        file.close()
    page = whole(path)
    assert (page.floor, [row[0] for row in page.rows], page.lost) == (2, [3, 5], [(4, 4)])
    assert query(path, "SELECT count(*) FROM ids") == [(3,)]


@pytest.mark.parametrize(
    ("change", "damaged", "kept"),
    [
        (lambda raws: msgspec.msgpack.encode([raws[0], 7, *raws[2:]]), [(2, 2)], [1, 3, 4]),
        (lambda raws: msgspec.msgpack.encode([*raws[:3], "x"]), [(4, 4)], [1, 2, 3]),
        (lambda raws: b"\xc1", [(1, 4)], []),
    ],
    ids=["an envelope", "the last envelope", "the row"],
)
def test_recover_keeps_what_a_damaged_batch_row_still_holds(
    tmp_path: Path, change: Any, damaged: list[tuple[int, int]], kept: list[int]
) -> None:
    path = tmp_path / "journal.sqlite3"
    delta = TextDelta(message_id="m", text="x")
    write(path, [_envelope(seq, "s1", None, False, delta) for seq in (1, 2, 3, 4, 5)], [4])
    _batch_row(path, change)  # the first row, 1..4; 5 is a row of its own
    result = recover(path)
    assert (result.damaged, result.events) == (damaged, len(kept) + 1)
    page = whole(path)
    assert [row[0] for row in page.rows] == [*kept, 5]
    assert page.lost == damaged


def test_an_old_envelope_that_does_not_decode_is_recorded_lost_by_the_rebuild(
    old: tuple[Path, int],
) -> None:
    """In a batch it would take its neighbours with it: the rebuild leaves it out, as a gap."""
    path, _ = old
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("UPDATE events SET envelope = x'c1' WHERE seq = 2")
    conn.close()
    assert whole(path).lost == [(2, 2), (114, 100113)]  # read as it is: a gap already
    JournalFile.open(path).close()
    page = whole(path)
    assert [row[0] for row in page.rows] == [s for s in V1_SEQS if s != 2]
    assert page.lost == [(2, 2), (114, 100113)]
    assert (2, 2, "damaged") in query(path, "SELECT * FROM lost")
    with JournalReader(path) as reader:
        assert reader.meta()["events"] == 123


def test_a_write_is_rows_of_at_most_256_events_and_copies_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    delta = TextDelta(message_id="m", text="x")
    first = [_envelope(seq, "s1", None, False, delta) for seq in range(1, 101)]
    write(path, first)
    copies = [msgspec.structs.replace(e, seq=1000 + e.seq) for e in first[::10]]  # 10 copies
    second = [_envelope(seq, "s1", None, False, delta) for seq in range(101, 701)]
    mixed = [*second, *copies, msgspec.structs.replace(second[5], seq=2000)]  # one twice
    raws = [encode_envelope(e) for e in mixed]
    file = JournalFile.open(path)
    try:
        written = file.write(mixed, raws, [], [], head=2000, reserved=2000)
    finally:
        file.close()
    assert written.inserted == 600
    rows = query(path, "SELECT first_seq, last_seq FROM batches ORDER BY first_seq")
    assert rows == [(1, 100), (101, 356), (357, 612), (613, 700)]
    assert [seq for seq, _, _ in stored(path)] == list(range(1, 701))
    assert query(path, "SELECT count(*) FROM ids") == [(700,)]
    owner = query(path, f"SELECT seq FROM ids WHERE id = '{second[5].id}'")
    assert owner == [(106,)]  # the first to come keeps it


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
        assert reader.meta()["events"] == 16
    assert seqs == [*range(16, 21), 31]
    assert sorted(query(path, "SELECT seq, id FROM ids")) == [(e.seq, e.id) for e in envelopes[15:]]
    assert query(path, "SELECT first_seq, last_seq FROM batches") == [(16, 31)]  # the row, cut


@settings(max_examples=60, deadline=None)
@given(
    count=st.integers(1, 700),
    cuts=st.lists(st.integers(1, 700), max_size=5),
    holes=st.sets(st.integers(1, 700), max_size=20),
    cutoff=st.integers(0, 720),
    chunk=st.sampled_from([1, 7, 100, 5_000]),
    by_size=st.booleans(),
)
def test_retention_removes_exactly_the_events_up_to_its_cut_whatever_the_rows(
    tmp_path_factory: pytest.TempPathFactory,
    count: int,
    cuts: list[int],
    holes: set[int],
    cutoff: int,
    chunk: int,
    by_size: bool,
) -> None:
    """Rows of up to 256 events from writes of any size, with seqs missing between them;
    pruned by age (event ``i`` is ``i`` seconds old... newer as seq grows) or by a seq
    target, in steps of ``chunk`` events: what stays is every event after the cut, each
    with its id, and the count in ``meta`` says so."""
    path = tmp_path_factory.mktemp("j") / "journal.sqlite3"
    delta = TextDelta(message_id="m", text="x")
    envelopes = [
        _envelope(seq, f"s{seq % 3}", None, False, delta)
        for seq in range(1, count + 1)
        if seq not in holes
    ]
    if not envelopes:
        return
    write(path, envelopes, cuts)
    file = JournalFile.open(path)
    try:
        if by_size:
            target = cutoff
        else:  # _envelope's ts is 1e9 + seq: a max_age from "now" that cuts after ``cutoff``
            now = 1e9 + cutoff + 0.5 + 1000.0
            retention = journalfile.Retention(max_age=1000.0, max_size=None)
            target = file.prune_target(retention, now)
            before = [e.seq for e in envelopes if e.seq <= cutoff]
            assert target == (before[-1] if before else 0)
        floor = 0
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(journalfile, "_PRUNE_CHUNK", chunk)
            while target > floor:
                floor, _ = file.prune_step(target)
        statistics = file.statistics()
    finally:
        file.close()
    kept = [e for e in envelopes if e.seq > target]
    assert [seq for seq, _, _ in stored(path)] == [e.seq for e in kept]
    assert sorted(query(path, "SELECT seq, id FROM ids")) == [(e.seq, e.id) for e in kept]
    assert statistics["events"] == len(kept)
    assert statistics["floor"] == max(target, 0)
    rows = query(path, "SELECT first_seq, last_seq FROM batches ORDER BY first_seq")
    assert all(a <= b < c for (a, b), (c, _) in itertools.pairwise(rows))  # disjoint, in order
    assert all(a > target for a, _ in rows)


def _grown(path: Path, version: int, events: int) -> list[Any]:
    """An old fixture and ``events`` more in its columns: a longer rebuild."""
    delta = TextDelta(message_id="m", text="a rebuild takes a while " * 4)
    tag = "stream.text.delta"
    more = [_envelope(200_000 + i, f"s{i % 7}", "r", False, delta) for i in range(1, events + 1)]
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN")
        if version == 1:
            conn.executemany(
                "INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(e.seq, e.id, e.ts, e.session_id, "r", tag, 0, encode_envelope(e)) for e in more],
            )
        else:
            conn.executemany(
                "INSERT INTO events VALUES (?, ?, ?)",
                [(e.seq, e.id, encode_envelope(e)) for e in more],
            )
        conn.execute("UPDATE meta SET value = value + ? WHERE key = 'events'", (events,))
        conn.execute("UPDATE meta SET value = ? WHERE key IN ('head', 'reserved')", (more[-1].seq,))
        conn.execute("COMMIT")
    finally:
        conn.close()
    return stored(path)


async def _killed_mid_rebuild(v1: Path, version: int, sock: Path) -> None:
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
            while f"rebuilding schema {version}" not in (line := await read_line(process.stderr)):
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


async def test_busd_serve_killed_while_it_rebuilds_a_journal_leaves_it_whole(
    old: tuple[Path, int], tmp_path: Path
) -> None:
    """``kill -9`` mid-rebuild: the next ``busd serve`` finds the old file as it was and
    rebuilds it."""
    v1, version = old
    rows = _grown(v1, version, 100_000)
    sock = tmp_path / "run" / "bus.sock"
    await _killed_mid_rebuild(v1, version, sock)
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
    assert query(v1, "PRAGMA user_version") == [(3,)]
    assert stored(v1) == rows
    assert query(v1, "PRAGMA integrity_check") == [("ok",)]


async def test_recover_after_a_killed_rebuild_takes_the_rollback_journal_along(
    v1: Path, tmp_path: Path
) -> None:
    """The file set aside keeps its hot ``-journal``: SQLite rolls it back when recover reads."""
    rows = _grown(v1, 1, 100_000)
    await _killed_mid_rebuild(v1, 1, tmp_path / "run" / "bus.sock")
    result = recover(v1)
    assert not Path(f"{v1}-journal").exists()
    assert not Path(f"{result.aside}-journal").exists()  # rolled back, then gone
    assert (result.events, result.damaged) == (len(rows), [])
    assert stored(v1) == rows
    assert query(v1, "PRAGMA user_version") == [(3,)]
