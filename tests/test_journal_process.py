"""The journal with real ``busd serve`` processes: ``kill -9`` mid-stream, restart, resume.

The durability promise under test (docs/journal.md): every event up to the
``journaled_seq`` that ``status`` reported is in the journal after the
daemon is killed, in order and with the same ids; the restarted daemon
never gives a seq again; a resume from before the restart is served from
the journal; ``busd sessions`` and ``busd export`` read it, daemon or not.
"""

from __future__ import annotations

import errno
import json
import os
import re
import resource
import shutil
import signal
import sqlite3
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from busd.client import Client, ConnectionLost, connect
from busd.core.events import (
    Envelope,
    Event,
    SessionIdle,
    SessionStart,
    TextComplete,
    TextDelta,
    ThinkingComplete,
    TokenUsage,
    ToolComplete,
    ToolStart,
    TurnEnd,
    TurnStart,
    Usage,
)
from busd.daemon.journalfile import SCHEMA_VERSION, JournalFile, JournalReader
from busd.wire import Status

from .daemon_helpers import BUSD, read_line, serving

SIGNATURE = "ErUBCkYIBRgCIkD0+signature/of/the/thinking=="


@pytest.fixture
def sock_path() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="busd-", dir="/tmp"))
    yield directory / "run" / "bus.sock"
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def journal(tmp_path: Path) -> Path:
    return tmp_path / "state" / "journal.sqlite3"


async def busd(*args: str) -> subprocess.CompletedProcess[bytes]:
    with trio.fail_after(60):
        return await trio.run_process(
            [*BUSD, *args], capture_stdout=True, capture_stderr=True, check=False
        )


def journaled(path: Path) -> list[tuple[int, str]]:
    """(seq, id) of every event in the journal, read as a reader would."""
    with JournalReader(path) as reader:
        rows = reader.page(0, 1 << 62, limit=1 << 30).rows
    return [(row[0], msgspec.msgpack.decode(row[5])["id"]) for row in rows]


async def publish_until_cancelled(client: Client) -> None:
    """A steady stream of deltas (bursts of 50), until the daemon dies under it."""
    i = 0
    try:
        while True:
            for _ in range(50):
                await client.publish(TextDelta(message_id="m", text=f"{i} "), session_id="s1")
                i += 1
            await client.flush()
            await trio.sleep(0.002)
    except ConnectionLost:
        pass


async def test_kill_9_mid_stream_loses_nothing_journaled_and_reuses_no_seq(
    sock_path: Path, journal: Path
) -> None:
    seen: list[tuple[int, str]] = []  # what a subscriber got from the first daemon
    caught_up = trio.Event()  # the subscriber has seen everything acknowledged
    acknowledged = 1 << 62
    async with serving(sock_path, "--journal", str(journal)) as daemon:
        async with (
            connect(sock_path, client="watcher") as watcher,
            connect(sock_path, client="publisher", role="agent") as publisher,
            watcher.subscribe([">"], window_ms=0, deltas="raw") as sub,
        ):

            async def record() -> None:
                try:
                    async for batch in sub:
                        seen.extend((e.seq, e.id) for e in batch.events)
                        if seen and seen[-1][0] >= acknowledged:
                            caught_up.set()
                except ConnectionLost:
                    pass

            async with trio.open_nursery() as nursery:
                nursery.start_soon(record)
                nursery.start_soon(publish_until_cancelled, publisher)
                with trio.fail_after(30):
                    while True:  # a condition of another process: polled, with a deadline
                        status = await watcher.request(Status())
                        if status["journal"]["journaled_seq"] >= 3000:
                            acknowledged = status["journal"]["journaled_seq"]
                            break
                        await trio.sleep(0.02)
                    if seen and seen[-1][0] >= acknowledged:
                        caught_up.set()
                    await caught_up.wait()
                    head_at_kill = (await watcher.request(Status()))["head_seq"]
                daemon.kill()  # SIGKILL, mid-stream: the publisher is still going
                await daemon.wait()
                # Both clients notice; their tasks end.
    assert daemon.returncode == -signal.SIGKILL
    head_seen = max(head_at_kill, *(seq for seq, _ in seen))

    ids = dict(seen)
    durable = journaled(journal)
    seqs = [seq for seq, _ in durable]
    assert seqs == list(range(1, len(seqs) + 1))  # in order, no hole
    assert len(seqs) >= acknowledged  # everything acknowledged is there
    assert all(ids[seq] == event_id for seq, event_id in durable[:acknowledged])  # the same
    assert all(ids.get(seq, event_id) == event_id for seq, event_id in durable)

    async with serving(sock_path, "--journal", str(journal)):
        async with connect(sock_path, client="again", role="agent") as client:
            status = await client.request(Status())
            assert status["head_seq"] > head_seen  # no seq is given twice
            assert status["journal"]["journaled_seq"] == status["head_seq"]
            # Resume from before the kill: the journal serves it, with a gap for the
            # seqs the dead daemon may have given without journaling them.
            since = acknowledged // 2
            events: list[Envelope[Event]] = []
            gaps: list[tuple[int, int]] = []
            async with client.subscribe([">"], since_seq=since, window_ms=0, deltas="raw") as sub2:
                await client.publish(SessionIdle(), session_id="s1")
                with trio.fail_after(20):
                    async for batch in sub2:
                        if batch.gap is not None:
                            gaps.append(batch.gap)
                        events += batch.events
                        if any(type(e.event) is SessionIdle for e in batch.events):
                            break
    replayed = [(e.seq, e.id) for e in events if e.seq <= status["head_seq"]]
    assert replayed == [(s, i) for s, i in durable if s > since]
    assert gaps == [(len(durable) + 1, status["head_seq"])]
    [idle] = [e for e in events if type(e.event) is SessionIdle]
    assert idle.seq == status["head_seq"] + 1


async def conversation(client: Client) -> None:
    """One model call: signed thinking, text, a tool call and its result, usage."""
    for event in [
        SessionStart(model="claude-x", title="list the files", cwd="/tmp"),
        TurnStart(turn_id="t1"),
        ThinkingComplete(message_id="b0", text="ls will do.", signature=SIGNATURE),
        TextDelta(message_id="b1", text="Listing"),
        TextComplete(message_id="b1", text="Listing."),
        ToolStart(tool_call_id="c1", name="Bash", input={"command": "ls"}),
        Usage(tokens=TokenUsage(input_tokens=120, output_tokens=30), model="claude-x"),
        TurnEnd(turn_id="t1", finish_reason="tool_use"),
        ToolComplete(tool_call_id="c1", name="Bash", output="a\nb\n"),
        SessionIdle(),
    ]:
        await client.publish(event, session_id="s1")
    await client.flush()


def exported(stdout: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines()]


async def test_sessions_and_export_read_the_journal_with_or_without_the_daemon(
    sock_path: Path, journal: Path, tmp_path: Path
) -> None:
    async with serving(sock_path, "--journal", str(journal)) as daemon:
        async with connect(sock_path, client="agent", role="agent") as client:
            await conversation(client)
            with trio.fail_after(20):  # another process's condition: polled, with a deadline
                while True:  # until the write that holds the whole conversation
                    status = await client.request(Status())
                    if status["journal"]["journaled_seq"] >= status["head_seq"]:
                        break
                    await trio.sleep(0.02)
        listed = await busd("sessions", "--journal", str(journal))
        assert listed.returncode == 0, listed.stderr
        assert b"s1" in listed.stdout
        assert b"list the files" in listed.stdout
        daemon.send_signal(signal.SIGTERM)
        await daemon.wait()

    listed = await busd("sessions", "--journal", str(journal), "--json")
    assert listed.returncode == 0, listed.stderr
    [record] = json.loads(listed.stdout)
    assert (record["session_id"], record["title"], record["model"]) == (
        "s1",
        "list the files",
        "claude-x",
    )
    assert record["usage"] == {"input_tokens": 120, "output_tokens": 30}

    lines = await busd("export", "s1", "--journal", str(journal))
    assert lines.returncode == 0, lines.stderr
    session, assistant, tool = exported(lines.stdout)
    assert (session["kind"], session["session_id"], session["status"]) == ("session", "s1", "idle")
    assert assistant["parts"][0] == {
        "type": "reasoning",
        "text": "ls will do.",
        "message_id": "b0",
        "signature": SIGNATURE,
    }
    assert [p["type"] for p in assistant["parts"]] == ["reasoning", "text", "tool_call"]
    assert assistant["usage"] == {"input_tokens": 120, "output_tokens": 30}
    assert tool["parts"][0]["output"] == "a\nb\n"

    out = tmp_path / "s1.json"
    document = await busd(
        "export", "s1", "--journal", str(journal), "--format", "json", "-o", str(out)
    )
    assert document.returncode == 0, document.stderr
    data = json.loads(out.read_text())
    assert data["messages"][0]["parts"][0]["signature"] == SIGNATURE

    unknown = await busd("export", "nope", "--journal", str(journal))
    assert unknown.returncode == 1
    assert b"no session 'nope'" in unknown.stderr
    missing = await busd("sessions", "--journal", str(tmp_path / "none.sqlite3"))
    assert missing.returncode == 1
    assert b"no journal at" in missing.stderr


class FailingDisk:
    """Where a journal lives, and a real way to make its writes fail under a running daemon."""

    def __init__(self, how: str, directory: Path) -> None:
        self.how = how
        self.directory = directory
        self.filler = directory / "filler"

    def fail(self, daemon: trio.Process) -> None:
        if self.how == "full-tmpfs":  # the file system has no free block left
            assert _write_until_full(self.filler) == errno.ENOSPC
        else:  # RLIMIT_FSIZE: no file of the daemon's may grow past 4 KiB (EFBIG)
            resource.prlimit(daemon.pid, resource.RLIMIT_FSIZE, (4096, 4096))

    def heal(self) -> None:
        self.filler.unlink(missing_ok=True)  # a new daemon has no file size limit


def _write_until_full(path: Path) -> int:
    """Grow ``path`` until a write fails; its errno."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 65536)
    except OSError as exc:
        return exc.errno or 0
    finally:
        os.close(fd)


@pytest.fixture(params=["full-tmpfs", "file-size-limit"])
def failing_disk(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[FailingDisk]:
    directory = tmp_path / "disk"
    directory.mkdir()
    if request.param == "file-size-limit":
        yield FailingDisk(request.param, directory)
        return
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m,mode=0700", "busd-test", str(directory)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield FailingDisk(request.param, directory)
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=False)


async def wait_journaled(client: Client, *, errors: bool = False) -> dict[str, Any]:
    """Poll ``status`` (another process's condition) until all is journaled, or writes fail."""
    with trio.fail_after(20):
        while True:
            journal = (await client.request(Status()))["journal"]
            if errors and journal["write_errors"] > 0:
                return dict(journal)
            if not errors and journal["pending"] == 0:
                return dict(journal)
            await trio.sleep(0.02)


async def test_a_stop_while_the_disk_fails_says_what_was_lost_and_gives_no_seq_again(
    sock_path: Path, failing_disk: FailingDisk
) -> None:
    journal = failing_disk.directory / "journal.sqlite3"
    seen: dict[int, str] = {}
    async with serving(sock_path, "--journal", str(journal)) as daemon:
        async with (
            connect(sock_path, client="watcher") as watcher,
            connect(sock_path, client="publisher", role="agent") as publisher,
            watcher.subscribe([">"], window_ms=0, deltas="raw") as sub,
        ):
            for i in range(500):
                await publisher.publish(TextDelta(message_id="m", text=f"{i}"), session_id="s1")
            await publisher.flush()
            journaled_before = (await wait_journaled(watcher))["journaled_seq"]
            failing_disk.fail(daemon)
            for i in range(3000):
                text = f"{i} " + "x" * 400
                await publisher.publish(TextDelta(message_id="m", text=text), session_id="s1")
            await publisher.flush()
            await wait_journaled(watcher, errors=True)
            head = (await watcher.request(Status()))["head_seq"]
            with trio.fail_after(20):
                async for batch in sub:
                    seen.update((e.seq, e.id) for e in batch.events)
                    if max(seen) >= head:
                        break
        daemon.send_signal(signal.SIGTERM)
        with trio.fail_after(20):
            await daemon.wait()
        assert daemon.stderr is not None
        stderr = b""
        while chunk := await daemon.stderr.receive_some(65536):
            stderr += chunk
    assert daemon.returncode == 3, stderr.decode()
    said = re.search(
        rb"(\d+) events \(seqs (\d+)\.\.(\d+)\) were delivered but not journaled", stderr
    )
    assert said is not None, stderr.decode()
    count, first, last = map(int, said.groups())
    assert first > journaled_before
    # Everything handed out, up to the last seq given: the daemon's own events (its
    # reports on the journal: failing, falling behind) may come after the watcher's last batch.
    assert last >= max(seen)
    assert count == last - first + 1

    failing_disk.heal()
    async with serving(sock_path, "--journal", str(journal)):
        async with connect(sock_path, client="again", role="agent") as client:
            events: list[Envelope[Event]] = []
            gaps: list[tuple[int, int]] = []
            async with client.subscribe([">"], since_seq=0, window_ms=0, deltas="raw") as again:
                await client.publish(SessionIdle(), session_id="s1")
                with trio.fail_after(20):
                    async for batch in again:
                        if batch.gap is not None:
                            gaps.append(batch.gap)
                        events += batch.events
                        if any(type(e.event) is SessionIdle for e in batch.events):
                            break
    [idle] = [e for e in events if type(e.event) is SessionIdle]
    assert idle.seq > last  # no seq is given twice, not even one nobody journaled or saw
    assert gaps  # the loss, told in place
    assert gaps[-1][0] <= first
    assert gaps[-1][1] >= last
    assert all(seen[e.seq] == e.id for e in events if e.seq in seen)


def _not_sqlite(path: Path) -> None:
    path.write_text("not a database\n" * 200)


def _newer(path: Path) -> None:
    JournalFile.open(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()


def _damaged(path: Path) -> None:
    from tests.test_journal import damage, written_journal

    written_journal(path, 5000)
    damage(path)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (_not_sqlite, b"is not a busd journal"),
        (_newer, b"was written by a newer busd"),
        (_damaged, b"is damaged"),
    ],
)
async def test_serve_refuses_a_journal_it_cannot_use(
    sock_path: Path, tmp_path: Path, make: Any, message: bytes
) -> None:
    path = tmp_path / "journal.sqlite3"
    make(path)
    result = await busd("serve", "--socket", str(sock_path), "--journal", str(path))
    assert result.returncode == 1
    assert message in result.stderr
    assert result.stderr.count(b"\n") == 1  # one line, no traceback
    assert not sock_path.exists()  # it stopped before serving anyone


async def test_a_damaged_journal_is_recovered_and_served_again(
    sock_path: Path, tmp_path: Path
) -> None:
    path = tmp_path / "journal.sqlite3"
    _damaged(path)
    refused = await busd("serve", "--socket", str(sock_path), "--journal", str(path))
    assert refused.returncode == 1
    assert f"busd journal recover --journal {path}".encode() in refused.stderr
    recovered = await busd("journal", "recover", "--journal", str(path))
    assert recovered.returncode == 0, recovered.stderr
    assert b"recorded as lost" in recovered.stdout
    async with serving(sock_path, "--journal", str(path)):
        async with connect(sock_path, client="again", role="agent") as client:
            gaps: list[tuple[int, int]] = []
            seqs: list[int] = []
            async with client.subscribe([">"], since_seq=0, window_ms=0, deltas="raw") as sub:
                await client.publish(SessionIdle(), session_id="s1")
                with trio.fail_after(20):
                    async for batch in sub:
                        if batch.gap is not None:
                            gaps.append(batch.gap)
                        seqs += [e.seq for e in batch.events]
                        if seqs and seqs[-1] > 5000:
                            break
    assert gaps  # the damaged pages' seqs, in place
    told = set(seqs) | {s for a, b in gaps for s in range(a, b + 1)}
    assert set(range(1, 5001)) <= told
    assert next(s for s in seqs if s > 5000) == 5001  # right after every seq it knew


async def test_no_journal_writes_nothing(sock_path: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    process = await trio.lowlevel.open_process(
        [*BUSD, "serve", "--socket", str(sock_path), "--no-journal"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "XDG_STATE_HOME": str(state)},
    )
    try:
        assert process.stdout is not None
        with trio.fail_after(20):
            assert "listening" in await read_line(process.stdout)
        async with connect(sock_path, client="t", role="agent") as client:
            await client.publish(SessionIdle(), session_id="s1")
            await client.flush()
            assert (await client.request(Status()))["journal"] is None
    finally:
        process.send_signal(signal.SIGTERM)
        with trio.fail_after(20):
            await process.wait()
    assert not state.exists()
