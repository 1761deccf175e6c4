"""``busd watch`` and ``busd demo`` as a new user meets them (issue 19), through the real programs.

Real ``busd serve`` processes, the bundled recordings played by the replay
driver, watchers in panes of a private tmux server at the sizes people use
(80x24 and 160x40), keys sent with ``send-keys``, screens read with
``capture-pane`` and polled against a condition until a deadline.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from busd.client import Client
from busd.client import connect as busd_connect
from busd.core.events import PermissionRequested, SessionInfo
from busd.frontends.demo import BUNDLED, bundled_recordings

from .daemon_helpers import serving
from .test_watch_tmux import BUSD, Tmux, tmux

__all__ = ["tmux"]  # the fixture, imported for its name

FIXTURE = Path(__file__).parent / "fixtures" / "sdk" / "claude_code.jsonl"
ROW = re.compile(r"^[▸ ] (w-\w+) +(.*)$")
"""A row of the session list (the sessions these tests start are ``w-<recording>``)."""


@pytest.fixture
def workdir() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="busd-screen-", dir="/tmp"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


async def start_all(client: Client, speed: float) -> dict[str, str]:
    """One replay per bundled recording, in sessions ``w-<name>``; their run ids by name."""
    runs = {}
    for run in bundled_recordings():
        started = await client.start_run(
            run.adapter,
            run.prompt,
            session_id=f"w-{run.name}",
            driver="replay",
            options={"recording": run.name, "speed": speed},
        )
        runs[run.name] = started["run_id"]
    return runs


def rows(screen: str) -> dict[str, str]:
    """The session list: each session's row, by id."""
    found = {}
    for line in screen.splitlines():
        match = ROW.match(line)
        if match:
            found[match[1]] = line
    return found


def focused(screen: str) -> str:
    (line,) = [line for line in screen.splitlines() if line.startswith("▸ ")]
    return line.split()[1]


async def test_80x24_and_160x40_show_what_a_person_needs_and_an_answer_keeps_the_focus(
    workdir: Path, tmux: Tmux
) -> None:
    sock = workdir / "bus.sock"
    async with serving(sock, "--no-journal"), busd_connect(sock, client="test") as client:
        watch = [*BUSD, "watch", "--socket", str(sock)]
        await tmux.start("N", [*watch, "--name", "N"], width=80, height=24)
        await tmux.start("W", [*watch, "--name", "W"], width=160, height=40)
        for pane in ("N", "W"):
            await tmux.wait_for(pane, "screen", lambda s: "busd watch · 0 sessions" in s)
        await start_all(client, speed=2.0)

        def all_ask(screen: str) -> bool:
            listed = rows(screen)
            return len(listed) == 4 and all("⚠ 1 permission" in r for r in listed.values())

        narrow = await tmux.wait_for("N", "four questions", all_ask)
        lines = narrow.splitlines()
        assert len(lines) <= 24
        assert all(len(line) <= 80 for line in lines)
        for row in rows(narrow).values():
            # the state is whole (shortened, not cut): who waits, for how long, how much
            assert re.search(r"⚠ 1 permission  ✶ \d+s( · ↓ ~?\d+)?$", row), row
        footer = [line for line in lines if line.startswith(" ")][-2:]
        assert footer[0].startswith(" y  allow   a  allow always   n  deny   c  cancel run")
        assert footer[1].endswith("scroll   q  quit")
        assert not any("…" in line for line in footer)
        assert "[y] allow  [a] allow always  [n] deny" in narrow

        wide = await tmux.wait_for("W", "four questions", all_ask)
        for run in bundled_recordings():
            row = rows(wide)[f"w-{run.name}"]
            assert f"  {run.prompt} · {run.adapter}  " in row, wide  # the title whole
            assert re.search(r"⚠ 1 permission waiting  ✶ Working… \(\d+s", row), row

        # An answer: the focus stays on the session answered, although three others ask.
        asked = focused(narrow)
        await tmux.keys("N", "y")
        screen = await tmux.wait_for(
            "N", "the answer", lambda s: "3 more sessions wait for an answer (Tab)" in s
        )
        screen = await tmux.wait_for("N", "the tool's end", lambda s: "✓ " in s)
        assert focused(screen) == asked
        assert sum("⚠ 1 permission" in row for row in rows(screen).values()) == 3
        for pane in ("N", "W"):
            await tmux.keys(pane, "q")
            assert "[exited 0]" in await tmux.wait_for(pane, "exit", lambda s: "[exited" in s)


async def test_the_transcript_scrolls_with_the_keys_and_says_where_it_is(
    workdir: Path, tmux: Tmux
) -> None:
    sock = workdir / "bus.sock"
    async with (
        serving(sock, "--no-journal"),
        busd_connect(sock, client="agent", role="agent") as agent,
    ):
        for i in range(100):
            await agent.publish(SessionInfo(message=f"note {i}"), session_id="long")
        await tmux.start("S", [*BUSD, "watch", "--socket", str(sock)], width=80, height=24)
        screen = await tmux.wait_for("S", "the newest", lambda s: "ℹ note 99" in s)
        assert "── ↑ earlier lines: PgUp " in screen
        assert " ↑↓ PgUp PgDn Home End  scroll " in screen

        def notes(screen: str) -> list[int]:
            return [int(n) for n in re.findall(r"^ℹ note (\d+)$", screen, flags=re.M)]

        await tmux.keys("S", "PPage")
        screen = await tmux.wait_for("S", "a page back", lambda s: "scrolled back" in s)
        page = notes(screen)
        assert page[-1] < 99
        assert "End: the newest" in screen
        await agent.publish(SessionInfo(message="note 100"), session_id="long")
        await agent.publish(SessionInfo(message="marker"), session_id="other")
        await tmux.wait_for("S", "the other session", lambda s: "other" in s)
        now = notes(await tmux.screen("S"))  # a row more in the session list: a line less
        assert now == page[: len(now)]  # new output does not move the page
        await tmux.keys("S", "Up")
        screen = await tmux.wait_for("S", "a line back", lambda s: notes(s)[0] == page[0] - 1)
        await tmux.keys("S", "j")
        await tmux.wait_for("S", "a line on", lambda s: notes(s) == now)
        await tmux.keys("S", "Home")
        screen = await tmux.wait_for("S", "the top", lambda s: "scrolled back (top)" in s)
        assert notes(screen)[0] == 0
        await tmux.keys("S", "End")
        screen = await tmux.wait_for("S", "the newest again", lambda s: "ℹ note 100" in s)
        assert "scrolled back" not in screen
        await tmux.keys("S", "q")
        await tmux.wait_for("S", "exit", lambda s: "[exited 0]" in s)


async def test_c_asks_before_cancelling_and_the_note_goes_with_the_run(
    workdir: Path, tmux: Tmux
) -> None:
    sock = workdir / "bus.sock"
    async with serving(sock, "--no-journal"), busd_connect(sock, client="test") as client:
        await tmux.start("C", [*BUSD, "watch", "--socket", str(sock)], width=80, height=24)
        run = await client.start_run(
            "claude-code",
            "Create tmp/hello-allow.txt containing hello",
            session_id="w-cancel",
            driver="replay",
            options={"recording": "claude_code", "speed": 1.0},
        )
        await tmux.wait_for("C", "the run", lambda s: "▸ w-cancel" in s and "✶" in s)
        question = f"cancel {run['run_id']}? c or y: cancel it · any other key: keep it"
        await tmux.keys("C", "c")
        screen = await tmux.wait_for("C", "the question", lambda s: question in s)
        assert " c y  yes, cancel the run   any other key  keep it running" in screen
        await tmux.keys("C", "x")
        await tmux.wait_for("C", "no cancel", lambda s: f"{run['run_id']} keeps running" in s)
        await tmux.keys("C", "c")
        await tmux.wait_for("C", "the question again", lambda s: question in s)
        await tmux.keys("C", "c")
        screen = await tmux.wait_for("C", "the end", lambda s: "⊘ cancelled by" in s)
        assert "cancelling" not in screen  # the note went with the run's end
        await tmux.keys("C", "q")
        await tmux.wait_for("C", "exit", lambda s: "[exited 0]" in s)


async def test_the_demo_keeps_its_hint_on_the_screen(tmux: Tmux) -> None:
    await tmux.start(
        "D", [*BUSD, "demo", "--speed", "1", "--only", "claude_code"], width=80, height=24
    )
    screen = await tmux.wait_for("D", "the question", lambda s: "Permission requested" in s)
    socket = re.search(r"more frontends: BUSD_SOCKET=(\S+) busd watch", screen)
    assert socket is not None, screen
    assert socket[1].endswith("/bus.sock")
    await tmux.keys("D", "y")
    screen = await tmux.wait_for("D", "the tool's end", lambda s: "✓ Write" in s)
    assert f"more frontends: BUSD_SOCKET={socket[1]} busd watch" in screen
    await tmux.wait_for("D", "the end", lambda s: "[exited 0]" in s)


async def test_an_unknown_window_is_said_and_two_ingests_agree_with_busd_sessions(
    workdir: Path, tmux: Tmux
) -> None:
    """Items: the context line without a window; `↓ ~278` in watch vs 231 in `busd sessions`."""
    sock, journal = workdir / "bus.sock", workdir / "journal.sqlite3"
    mystery = workdir / "mystery.jsonl"
    mystery.write_text(
        FIXTURE.read_text()
        .replace("claude-haiku-4-5-20251001", "mystery-model-1")
        .replace('"contextWindow":200000,', "")  # nobody says how large its window is
        .replace("febcaa44-9f0f-4ae7-ad70-748009748653", "w-mystery")
    )
    ingest = [*BUSD, "ingest", "--socket", str(sock), "--sdk", "claude-code"]
    async with serving(sock, "--journal", str(journal)):
        await trio.run_process([*ingest, str(mystery)], capture_stderr=True)
        await tmux.start("U", [*BUSD, "watch", "--socket", str(sock)], width=80, height=24)
        screen = await tmux.wait_for("U", "the context line", lambda s: "context " in s)
        (line,) = [line for line in screen.splitlines() if "context " in line]
        assert line.startswith("context 56.9k · window unknown"), line
        assert "█" not in screen
        assert "░" not in screen
        for _ in range(2):  # the same recording twice, into the same session
            await trio.run_process([*ingest, str(FIXTURE)], capture_stderr=True)
        with trio.fail_after(30):
            plain = await trio.run_process(
                [*BUSD, "watch", "--socket", str(sock), "--plain", "--exit-when-idle"],
                capture_stdout=True,
            )
        session = "febcaa44-9f0f-4ae7-ad70-748009748653"
        summaries = [
            line
            for line in plain.stdout.decode().splitlines()
            if line.startswith(f"[{session}] ✻ Worked for")
        ]
        assert len(summaries) == 2
        assert all(line.endswith("· ↓ 231 tokens") for line in summaries), summaries
        await tmux.keys("U", "Tab")
        await tmux.wait_for("U", "the session", lambda s: f"▸ {session[:8]}" in s)
        screen = await tmux.wait_for("U", "its summary", lambda s: "✻ Worked for" in s)
        assert "↓ 231 tokens" in screen
        assert "~" not in screen.split("✻ Worked for")[-1].splitlines()[0]
    listed = await trio.run_process(
        [*BUSD, "sessions", "--journal", str(journal), "--json"], capture_stdout=True
    )
    records = {r["session_id"]: r for r in json.loads(listed.stdout)}
    assert records[session]["usage"]["output_tokens"] == 231


async def answer_late(
    client: Client, wait: float, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """A person who reads each question for ``wait`` seconds, then allows it."""
    async with client.subscribe(["stream.permission.requested"]) as sub, trio.open_nursery() as n:
        task_status.started()

        async def answer(request_id: str) -> None:
            await trio.sleep(wait)  # the person reading, not a wait for an event
            await client.reply_permission(request_id, allow=True)

        async for envelope in sub.events():
            assert isinstance(envelope.event, PermissionRequested)
            n.start_soon(answer, envelope.event.request_id)


async def test_tool_timers_leave_out_the_wait_for_permission_in_every_adapter(
    workdir: Path,
) -> None:
    """A 3 s wait for each answer is in no tool's time; ACP keeps its count; <1s thinking."""
    sock = workdir / "bus.sock"
    wait = 3.0
    async with (
        serving(sock, "--no-journal"),
        busd_connect(sock, client="person") as client,
        trio.open_nursery() as nursery,
    ):
        await nursery.start(answer_late, client, wait)
        result: list[subprocess.CompletedProcess[bytes]] = []
        async with trio.open_nursery() as watching:

            async def watch() -> None:
                with trio.fail_after(90):
                    result.append(
                        await trio.run_process(
                            [*BUSD, "watch", "--socket", str(sock), "--plain", "--exit-when-idle"],
                            capture_stdout=True,
                        )
                    )

            watching.start_soon(watch)
            await start_all(client, speed=2.0)
        nursery.cancel_scope.cancel()
    lines = result[0].stdout.decode().splitlines()
    timers = [re.match(r"\[(w-\w+)\] [✓✗] .* (\d+\.\d)s$", line) for line in lines]
    times = [(m[1], float(m[2])) for m in timers if m is not None]
    assert {session for session, _ in times} == {f"w-{name}" for name in BUNDLED}, lines
    assert all(seconds < wait for _, seconds in times), times
    assert any("∴ Thought for <1s" in line for line in lines), lines
    assert not any("Thought for 0s" in line for line in lines)
    (acp,) = [line for line in lines if line.startswith("[w-acp] ✻ Worked for")]
    assert re.search(r"· ↓ ~\d+ tokens", acp), acp
