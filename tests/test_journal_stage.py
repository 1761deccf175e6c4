"""Staging: the journal inserts events as they come, and commits them once per write.

The writer thread's inserts used to come in one burst per write (every
50 ms), which delayed the events fanned out meanwhile; now, when a
publisher's burst ends (``Journal.stage_now``, the daemon's settle) and
``stage_events`` wait (at most every ``stage_every`` seconds), they are
staged into the transaction the write then commits, in a worker thread
that answers by a callback.
What must hold: nothing staged is visible or counted as journaled before
the commit, a failure anywhere leaves every event written exactly once
(or recorded lost at a stop), a stop commits what was staged, the file is
never used by a stage and the writer at once, and a stage costs the
writer's task no step.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import trio.testing

from busd.core.events import Envelope, Event, TextDelta
from busd.core.ids import new_event_id
from busd.daemon.journal import Found, Journal
from busd.daemon.journalfile import JournalFile, JournalReader, Retention
from busd.wire import encode_envelope


def envelope(seq: int, *, id: str | None = None) -> Envelope[Event]:
    return Envelope(
        seq,
        1e9 + seq,
        TextDelta(message_id="m1", text=f"t{seq}"),
        session_id=f"s{seq % 3}",
        id=id or new_event_id(),
    )


def seqs_in(path: Path) -> list[int]:
    with JournalReader(path) as reader:
        return [row[0] for row in reader.page(0, 10**9).rows]


class StagingFile(JournalFile):
    """Tells the Trio side each time a stage has been inserted (or has failed)."""

    staged_calls: list[int]
    failed_calls: list[int]
    on_stage: trio.Event
    token: trio.lowlevel.TrioToken

    def stage(self, envelopes: Sequence[Envelope[Event]], raws: Sequence[msgspec.Raw]) -> None:
        try:
            super().stage(envelopes, raws)
            self.staged_calls.append(len(envelopes))
        except BaseException:
            self.failed_calls.append(len(envelopes))
            raise
        finally:
            trio.from_thread.run_sync(self.on_stage.set, trio_token=self.token)


def staging(path: Path) -> StagingFile:
    file = StagingFile.open(path)
    assert isinstance(file, StagingFile)
    file.staged_calls = []
    file.failed_calls = []
    file.on_stage = trio.Event()
    file.token = trio.lowlevel.current_trio_token()
    return file


async def staged(file: StagingFile, count: int) -> None:
    """Wait until ``count`` events are staged (each stage wakes this)."""
    while file.staged < count:
        file.on_stage = trio.Event()
        await file.on_stage.wait()


async def answered(journal: Journal) -> None:
    """Wait until the journal took the answer of its stage in flight (as its writer does)."""
    await journal._stage.wait()


def journal_on(file: JournalFile, **options: Any) -> Journal:
    return Journal(file, file.recover(reserve=1000, sessions=0), sessions=lambda s: [], **options)


def staging_each_event(file: JournalFile, **options: Any) -> Journal:
    """A journal that stages every event at once (a stage per millisecond at most)."""
    return journal_on(file, stage_every=0.001, stage_events=1, **options)


def append(journal: Journal, seqs: range) -> None:
    """A publisher's burst: its events queued, then staged if it is time (the daemon's settle)."""
    for seq in seqs:
        e = envelope(seq)
        journal.append(e, encode_envelope(e))
    journal.stage_now()


async def first_write(journal: Journal) -> None:
    """A journal without history writes at once; staging starts after its first write."""
    append(journal, range(1, 2))
    await journal.journaled(1)


def test_staged_rows_are_committed_by_the_write_and_counted_once(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite3"
    file = JournalFile.open(path)
    try:
        sent = [envelope(seq) for seq in range(1, 11)]
        raws = [encode_envelope(e) for e in sent]
        # A copy already journaled adds no row: counted as a duplicate, not inserted.
        copy = envelope(11, id=sent[0].id)
        file.stage(sent[:6], raws[:6])
        file.stage([copy], [encode_envelope(copy)])
        assert file.staged == 7
        assert seqs_in(path) == []  # nothing is visible before the commit
        batch = [*sent[:6], copy, *sent[6:]]
        written = file.write(
            batch, [encode_envelope(e) for e in batch], [], [], head=11, reserved=11
        )
        assert written.inserted == 10
        assert file.staged == 0
        assert seqs_in(path) == list(range(1, 11))
        # A write must carry what was staged (else it would commit rows it does not know).
        more = [envelope(seq) for seq in range(12, 15)]
        file.stage(more, [encode_envelope(e) for e in more])
        with pytest.raises(ValueError, match="3 events are staged but the write has 1"):
            file.write(more[:1], [encode_envelope(more[0])], [], [], head=12, reserved=12)
    finally:
        file.close()


def test_a_stop_drops_what_was_staged_and_never_written(tmp_path: Path) -> None:
    """``release`` after a stage (the write never came): the rows go, the head is kept."""
    path = tmp_path / "j.sqlite3"
    file = JournalFile.open(path)
    sent = [envelope(seq) for seq in range(1, 6)]
    file.stage(sent, [encode_envelope(e) for e in sent])
    file.release(5, [(1, 5)])
    file.close()
    with JournalReader(path) as reader:
        page = reader.page(0, 10)
    assert page.rows == []
    assert page.lost == [(1, 5)]
    again = JournalFile.open(path)
    try:
        assert again.recover(reserve=100, sessions=0).next_seq == 6
    finally:
        again.close()


async def test_events_are_staged_as_they_come_and_journaled_at_the_write(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite3"
    file = staging(path)
    journal = staging_each_event(
        file,
        interval=60.0,  # only a full batch writes during this test
        batch_events=150,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        await first_write(journal)
        append(journal, range(2, 102))
        await staged(file, 100)
        # Staged is not journaled: not in the file, not the watermark; a resume
        # still gets every event (the staged ones from memory).
        assert seqs_in(path) == [1]
        assert journal.journaled_seq == 1
        assert journal.pending == 100
        items = [i async for i in journal.span(0, 101).read(lambda *a: True, lambda e: True)]
        assert [seq for item in items if isinstance(item, Found) for seq in item.seqs] == list(
            range(1, 102)
        )
        # The batch counts the staged events: 50 more make it full and written.
        append(journal, range(102, 152))
        await journal.journaled(151)
        nursery.cancel_scope.cancel()
    assert seqs_in(path) == list(range(1, 152))
    assert file.staged == 0
    assert sum(file.staged_calls) >= 100
    stats = journal.statistics()
    assert (stats["events"], stats["duplicates"], stats["write_errors"]) == (151, 0, 0)
    await journal.aclose()


async def test_a_write_failing_after_a_stage_rewrites_everything_once(tmp_path: Path) -> None:
    """The failed commit rolls the staged rows back; the retry writes the batch whole."""
    path = tmp_path / "j.sqlite3"
    file = staging(path)
    reports: list[str] = []
    failed = trio.Event()

    def report(message: str) -> None:
        reports.append(message)
        if "cannot write" in message:
            failed.set()

    journal = staging_each_event(file, report=report, interval=0.05)
    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        await first_write(journal)
        file._conn.execute(  # the write's last statement fails, after the rows went in
            "CREATE TEMP TRIGGER fail BEFORE UPDATE ON main.meta "
            "BEGIN SELECT RAISE(ABORT, 'disk I/O error'); END"
        )
        append(journal, range(2, 51))
        await staged(file, 1)
        await failed.wait()  # the journal now waits a second before it tries again
        assert file.staged == 0
        assert seqs_in(path) == [1]
        file._conn.execute("DROP TRIGGER temp.fail")
        await journal.journaled(50)
        nursery.cancel_scope.cancel()
    assert seqs_in(path) == list(range(1, 51))
    stats = journal.statistics()
    assert (stats["events"], stats["duplicates"], stats["write_errors"]) == (50, 0, 1)
    assert "is written again" in reports[-1]
    await journal.aclose()


class Warned(logging.Handler):
    """Wakes the test when the journal logs a warning (it logs on the Trio thread)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []
        self.event = trio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
        self.event.set()


async def test_a_stage_that_fails_leaves_its_events_to_the_write(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite3"
    file = staging(path)
    failures = [True]  # the first insert of a staged row fails, then the disk is fine

    def fail_once() -> int:
        return int(bool(failures) and failures.pop())

    file._conn.create_function("fail_once", 0, fail_once)
    file._conn.execute(
        "CREATE TEMP TRIGGER flaky BEFORE INSERT ON main.batches "
        "WHEN NEW.first_seq > 1 AND fail_once() BEGIN SELECT RAISE(ABORT, 'disk I/O error'); END"
    )
    journal = staging_each_event(file, interval=60.0, batch_events=40)
    warned = Warned()
    logging.getLogger("busd.journal").addHandler(warned)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(journal.run)
            await first_write(journal)
            append(journal, range(2, 21))
            await answered(journal)  # taken at the next burst's end, or by the writer
            assert file.failed_calls == [19]
            assert "cannot stage events" in warned.messages[0]
            assert file.staged == 0  # rolled back; the events wait for the write
            assert journal.pending == 19
            append(journal, range(21, 42))  # 40 in all after the first write: a full batch
            await journal.journaled(41)
            nursery.cancel_scope.cancel()
    finally:
        logging.getLogger("busd.journal").removeHandler(warned)
    assert file.staged_calls == []  # nothing is staged onto a batch that failed to stage
    assert seqs_in(path) == list(range(1, 42))
    stats = journal.statistics()
    assert (stats["events"], stats["duplicates"], stats["write_errors"]) == (41, 0, 0)
    await journal.aclose()


async def test_a_stop_commits_what_was_staged(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite3"
    file = staging(path)
    journal = staging_each_event(file, interval=60.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        await first_write(journal)
        append(journal, range(2, 31))
        await staged(file, 29)
        nursery.cancel_scope.cancel()
    await journal.aclose()
    assert journal.unjournaled == []
    assert seqs_in(path) == list(range(1, 31))
    again = Journal.open(path, sessions=lambda since: [])
    try:
        assert again.next_seq == 31
        assert again.crashed is None
    finally:
        await again.aclose()


@pytest.mark.parametrize(
    ("options", "count"),
    [({"stage_events": 10}, 9), ({"stage_every": 0, "stage_events": 1}, 29)],
    ids=["too few to stage", "staging off"],
)
async def test_unstaged_events_are_inserted_by_the_write(
    tmp_path: Path, options: dict[str, Any], count: int
) -> None:
    """At an agent's pace a stage would cost a trip to the thread for an event or two."""
    path = tmp_path / "j.sqlite3"
    file = staging(path)
    journal = journal_on(file, **{"interval": 0.02, "stage_every": 0.001, **options})
    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        await first_write(journal)
        append(journal, range(2, count + 2))
        await journal.journaled(count + 1)
        nursery.cancel_scope.cancel()
    assert file.staged_calls == []
    assert seqs_in(path) == list(range(1, count + 2))
    await journal.aclose()


async def test_at_a_slow_pace_nothing_is_staged_until_enough_events_wait(tmp_path: Path) -> None:
    """Fewer than ``stage_events`` are not worth a trip to the thread: the write inserts them."""
    file = staging(tmp_path / "j.sqlite3")
    journal = journal_on(file, interval=0.05, stage_every=0.001, stage_events=32)
    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        await first_write(journal)
        for seq in range(2, 7):  # bursts of one event
            append(journal, range(seq, seq + 1))
        await journal.journaled(6)
        assert file.staged_calls == []
        append(journal, range(7, 50))  # 43 more in a burst: enough to stage
        await staged(file, 43)
        await journal.journaled(49)
        nursery.cancel_scope.cancel()
    assert file.staged_calls == [43]
    await journal.aclose()


class WriterSteps(trio.abc.Instrument):
    """Counts the steps of the journal's writer task."""

    def __init__(self) -> None:
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task.name.endswith("Journal.run"):
            self.steps += 1


async def test_a_stage_costs_the_writer_task_no_step(tmp_path: Path) -> None:
    """The stage starts at the burst's end and its answer is taken there: the writer task
    sleeps until its write (it used to wake for each stage, four task switches a stage)."""
    file = staging(tmp_path / "j.sqlite3")
    journal = journal_on(file, interval=60.0, stage_every=1e-9, stage_events=5)
    steps = WriterSteps()
    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        await first_write(journal)
        append(journal, range(2, 12))  # the first events of a batch wake the writer, once
        await answered(journal)
        await trio.testing.wait_all_tasks_blocked()
        trio.lowlevel.add_instrument(steps)
        try:
            for start in range(12, 112, 10):
                append(journal, range(start, start + 10))
                await answered(journal)
            await trio.testing.wait_all_tasks_blocked()
        finally:
            trio.lowlevel.remove_instrument(steps)
        assert steps.steps == 0
        assert file.staged_calls == [10] * 11
        nursery.cancel_scope.cancel()
    await journal.aclose()
    assert seqs_in(file.path) == list(range(1, 112))


async def test_a_write_waits_for_the_stage_in_flight(tmp_path: Path) -> None:
    """One connection, one thread at a time: a batch that fills while a stage is in its
    thread is written once the stage is done, with the stage's rows in it."""
    file = staging(tmp_path / "j.sqlite3")
    journal = journal_on(file, interval=60.0, stage_every=1e-9, stage_events=1, batch_events=15)
    entered, release = trio.Event(), threading.Event()
    stage, write = file.stage, file.write
    staged_at_write: list[int] = []

    def slow_stage(envelopes: Sequence[Envelope[Event]], raws: Sequence[msgspec.Raw]) -> None:
        trio.from_thread.run_sync(entered.set, trio_token=file.token)
        release.wait()
        stage(envelopes, raws)

    def counted_write(*args: Any, **kwargs: Any) -> Any:
        staged_at_write.append(file.staged)
        return write(*args, **kwargs)

    file.write = counted_write  # type: ignore[method-assign]
    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        await first_write(journal)
        file.stage = slow_stage  # type: ignore[method-assign]
        append(journal, range(2, 12))  # staged: 10, held in the thread
        await entered.wait()
        append(journal, range(12, 17))  # 5 more fill the batch of 15: the write is due
        await trio.testing.wait_all_tasks_blocked()
        assert staged_at_write == [0]  # the first write only: the batch's waits for the stage
        release.set()
        await journal.journaled(16)
        nursery.cancel_scope.cancel()
    assert staged_at_write == [0, 10]
    assert file.staged_calls == [10]
    await journal.aclose()
    assert seqs_in(file.path) == list(range(1, 17))


async def test_retention_writes_what_is_staged_before_it_removes(tmp_path: Path) -> None:
    """Retention's statements open transactions of their own: never inside a stage's."""
    file = staging(tmp_path / "j.sqlite3")
    journal = journal_on(
        file, interval=60.0, stage_every=1e-9, stage_events=1, retention=Retention(max_age=60.0)
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        await first_write(journal)
        append(journal, range(2, 12))
        await answered(journal)
        assert (file.staged, journal.journaled_seq) == (10, 1)
        removed = await journal.prune(now=1e9 + 1_000)  # every event is older than a minute
        nursery.cancel_scope.cancel()
    assert removed == 11
    assert (file.staged, journal.journaled_seq) == (0, 11)
    assert seqs_in(file.path) == []
    await journal.aclose()


@pytest.mark.parametrize("where", ["in its thread", "starting its thread"])
async def test_a_stage_that_breaks_otherwise_leaves_its_events_to_the_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """Not a disk error (a bug, no thread to be had): logged, and the write inserts them."""
    file = staging(tmp_path / "j.sqlite3")
    journal = journal_on(file, interval=60.0, stage_every=1e-9, stage_events=1, batch_events=30)
    warned = Warned()
    logging.getLogger("busd.journal").addHandler(warned)

    def broken(*args: Any) -> None:
        raise RuntimeError("can't start new thread")

    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(journal.run)
            await first_write(journal)
            if where == "in its thread":
                file.stage = broken  # type: ignore[method-assign, assignment]
            else:
                monkeypatch.setattr(trio.lowlevel, "start_thread_soon", broken)
            append(journal, range(2, 12))
            await answered(journal)
            await warned.event.wait()
            assert "can't start new thread" in warned.messages[0]
            assert (file.staged, journal.pending) == (0, 10)
            monkeypatch.undo()
            append(journal, range(12, 32))  # 30 in all after the first write: a full batch
            await journal.journaled(31)
            nursery.cancel_scope.cancel()
    finally:
        logging.getLogger("busd.journal").removeHandler(warned)
    assert seqs_in(file.path) == list(range(1, 32))
    await journal.aclose()


class CountingToken:
    """A Trio token that counts the journal's wake-ups of the loop (``run_sync_soon``)."""

    def __init__(self, token: trio.lowlevel.TrioToken) -> None:
        self.token, self.calls = token, 0

    def run_sync_soon(self, fn: Any, *args: Any) -> None:
        self.calls += 1
        self.token.run_sync_soon(fn, *args)


class Told:
    """Tells when a worker thread has delivered its job's answer (``start_thread_soon``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.delivered = threading.Event()
        self.jobs = 0
        start = trio.lowlevel.start_thread_soon

        def start_and_tell(fn: Any, deliver: Any, **kwargs: Any) -> None:
            def told(result: Any) -> None:
                deliver(result)
                self.delivered.set()

            self.jobs += 1
            start(fn, told, **kwargs)

        monkeypatch.setattr(trio.lowlevel, "start_thread_soon", start_and_tell)

    async def done(self) -> None:
        """The last job's thread has answered (the loop has not taken it)."""
        await trio.to_thread.run_sync(self.delivered.wait)
        self.delivered.clear()


async def test_a_stage_answers_without_waking_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nobody waits for a stage's answer at a steady rate: its thread leaves it for the next
    burst's end to take (a wake-up of the loop was a lump between bursts); the writer, which
    does wait, is woken (test_a_write_waits_for_the_stage_in_flight)."""
    file = JournalFile.open(tmp_path / "j.sqlite3")
    journal = journal_on(file, interval=60.0, stage_every=1e-9, stage_events=5)
    told = Told(monkeypatch)
    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        await first_write(journal)
        token = journal._token = CountingToken(journal._token)  # type: ignore[assignment, arg-type]
        for start_seq in range(2, 32, 10):
            append(journal, range(start_seq, start_seq + 10))  # takes the last answer, stages
            await told.done()
            assert journal._stage.busy  # answered, and not taken: nobody was woken
        assert token.calls == 0
        journal.stage_now()  # the next burst's end takes it
        assert not journal._stage.busy
        assert file.staged == 30
        nursery.cancel_scope.cancel()
    await journal.aclose()
    assert seqs_in(file.path) == list(range(1, 32))
