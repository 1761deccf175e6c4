"""The journal's write from a publisher's burst's end.

At a steady rate the writer task woke for every write (its deadline, the
thread limiter, the thread's answer, the loop back: four task steps, each a
lump of the loop's CPU between two bursts). Now the burst's end that finds
the write due starts it in a worker thread and moves the writer's deadline;
the next burst's end takes the answer. What must hold: the writer task does
not wake while bursts come, whoever waits for the write (an acknowledged
publish, the journaled watermark) is woken when it is done, a failure is
retried by the writer with every event written once, and a stop writes
what a write in flight left.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from busd.daemon.journal import Journal
from busd.daemon.journalfile import JournalFile
from tests.test_journal_stage import (
    CountingToken,
    Told,
    WriterSteps,
    append,
    first_write,
    journal_on,
    seqs_in,
)

INTERVAL = 0.05


@contextlib.asynccontextmanager
async def gathering(tmp_path: Path, interval: float = INTERVAL) -> AsyncIterator[Journal]:
    """A running journal (no stages) that wrote seq 1 and gathers seqs 2..6 for its next
    write (the first events after a write wake the writer task, once); stopped at the end."""
    journal = journal_on(JournalFile.open(tmp_path / "j.sqlite3"), interval=interval, stage_every=0)
    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        await first_write(journal)
        append(journal, range(2, 7))
        await trio.testing.wait_all_tasks_blocked()
        assert journal._gather_scope is not None
        yield journal
        nursery.cancel_scope.cancel()
    await journal.aclose()


async def test_a_due_write_starts_at_a_bursts_end_and_the_writer_task_sleeps(
    tmp_path: Path, mock_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    told = Told(monkeypatch)
    steps = WriterSteps()
    async with gathering(tmp_path) as journal:
        token = journal._token = CountingToken(journal._token)  # type: ignore[assignment, arg-type]
        trio.lowlevel.add_instrument(steps)
        try:
            for start in range(7, 57, 5):  # a burst after each interval
                mock_clock.jump(INTERVAL)
                append(journal, range(start, start + 5))  # takes the last answer, writes
                assert journal._stage.busy
                await told.done()
                # The answer before it was taken by this burst's end; its own by nobody yet.
                assert journal.journaled_seq == (1 if start == 7 else start - 1)
            await trio.testing.wait_all_tasks_blocked()
        finally:
            trio.lowlevel.remove_instrument(steps)
        journal.stage_now()  # the next burst's end takes it
        assert journal.journaled_seq == 56
        assert steps.steps == 0
        assert token.calls == 0
        assert told.jobs == 10
    assert seqs_in(journal.path) == list(range(1, 57))


async def test_a_bursts_end_writes_in_the_intervals_last_fifth_and_before_it_leaves_it(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    """Woken at its deadline, the writer task would beat the bursts to nearly every write:
    a burst's end writes from 4/5 of the interval on (the deadline moves on)."""
    async with gathering(tmp_path) as journal:
        mock_clock.jump(INTERVAL * 0.75)
        append(journal, range(7, 12))
        assert not journal._stage.busy  # not yet
        mock_clock.jump(INTERVAL * 0.05)
        append(journal, range(12, 17))
        assert journal._stage.busy
        assert journal._gather_scope is not None
        assert journal._gather_scope.deadline == trio.current_time() + INTERVAL
        await journal._stage.wait()
        append(journal, range(17, 22))  # the next write gathers
        mock_clock.autojump_threshold = 0
        before = trio.current_time()
        await journal.journaled(21)  # no burst after it: the writer's deadline
        assert trio.current_time() - before == pytest.approx(INTERVAL)
    assert seqs_in(journal.path) == list(range(1, 22))


@pytest.mark.parametrize("waiter", ["journaled", "durable"])
async def test_whoever_waits_for_a_write_from_a_bursts_end_is_woken_when_it_is_done(
    tmp_path: Path, mock_clock: trio.testing.MockClock, waiter: str
) -> None:
    """An acknowledged publish waits for its events' write: with no burst after it, the
    thread wakes the loop, instead of the answer waiting for the writer's next deadline."""
    async with gathering(tmp_path, 60.0) as journal:
        mock_clock.jump(60.0)
        append(journal, range(7, 12))  # due: written from the burst's end
        assert journal._stage.busy
        # A wake-up that never comes leaves the autojump to the writer's deadline, 60 s on.
        mock_clock.autojump_threshold = 5.0  # real seconds idle: the thread takes milliseconds
        before = trio.current_time()
        if waiter == "journaled":
            await journal.journaled(11)
        else:
            await journal.durable([(7, 11)])
        assert trio.current_time() == before
        assert journal.journaled_seq == 11
    assert seqs_in(journal.path) == list(range(1, 12))


async def test_a_write_from_a_bursts_end_that_fails_is_retried_by_the_writer_once(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    reports: list[str] = []
    fail = [True]
    async with gathering(tmp_path) as journal:
        journal._report = reports.append
        file, write = journal.file, journal.file.write

        def failing_once(*args: Any, **kwargs: Any) -> Any:
            if fail.pop() if fail else False:
                raise sqlite3.OperationalError("disk I/O error")
            return write(*args, **kwargs)

        file.write = failing_once  # type: ignore[method-assign]
        mock_clock.jump(INTERVAL)
        append(journal, range(7, 12))  # due: written from the burst's end, and it fails
        await journal._stage.wait()
        assert journal.statistics()["write_errors"] == 1
        assert reports == [f"cannot write the journal {file.path}: disk I/O error (retrying)"]
        append(journal, range(12, 17))  # the writer retries, not the burst's end
        assert not journal._stage.busy
        mock_clock.autojump_threshold = 0
        await journal.journaled(16)
        assert reports[1:] == [f"the journal {file.path} is written again"]
    assert seqs_in(journal.path) == list(range(1, 17))
    assert journal.statistics()["duplicates"] == 0


async def test_a_stop_writes_what_a_write_in_flight_left(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    async with gathering(tmp_path) as journal:
        mock_clock.jump(INTERVAL)
        append(journal, range(7, 12))  # the write is in its thread
        for seq in range(12, 15):  # and more come after it, unwritten
            append(journal, range(seq, seq + 1))
    assert journal.unjournaled == []
    assert seqs_in(journal.path) == list(range(1, 15))
