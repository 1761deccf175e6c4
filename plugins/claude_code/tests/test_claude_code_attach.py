"""``busd attach claude-code``: the pure follower, the attacher on real files, and ccusage parity.

The recordings are ``fixtures/transcripts/`` (see test_claude_code_transcripts.py
for what each session holds). The end-to-end tests run ``busd serve`` and
``busd attach`` as processes, read the result with ``busd sessions --json``
and the daemon's ``sessions`` command, and compare it with ``ccusage session
--offline --json`` run on the same directory; the live test has the real
Claude Code CLI write a transcript while ``busd attach`` follows it.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import claude_agent_sdk
import msgspec
import pytest
import trio
from busd_claude_code.attach import (
    STATE_FILE,
    ClaudeCodeAttacher,
    TranscriptsNotFound,
    config_dirs,
    load_state,
    save_state,
)
from busd_claude_code.follow import (
    SDK,
    FileMark,
    Follower,
    Place,
    Read,
    Stat,
    State,
    place_of,
    split_lines,
)
from busd_claude_code.transcript import TranscriptTranslator

from busd import (
    AgentComplete,
    AttachOptions,
    Emitted,
    SessionIdle,
    TokenUsage,
    ToolComplete,
    ToolStart,
    Usage,
)
from busd.client import connect
from busd.wire.frames import Sessions
from tests.daemon_helpers import serving

HERE = Path(__file__).resolve().parent
FIXTURES = HERE / "fixtures"
PROJECTS = FIXTURES / "transcripts" / "projects"
REPO = HERE.parents[2]
CCUSAGE = REPO / "contrib" / "agents" / "node_modules" / ".bin" / "ccusage"
CLI = Path(claude_agent_sdk.__file__).parent / "_bundled" / "claude"
BUSD = [sys.executable, "-m", "busd"]
ALPHA = "a68808b5-fc8b-45c8-951a-0ba31f84b1e8"
BETA = "98a9a30d-4869-44ca-8751-13bb3fe6ebfb"
GAMMA = "4142c389-504f-4e3a-948f-6a0aa3935eea"
SONNET = "claude-sonnet-4-5-20250929"

needs_ccusage = pytest.mark.skipif(
    not CCUSAGE.exists() or shutil.which("node") is None,
    reason="ccusage is not installed (npm ci in contrib/agents; CI does)",
)


def _main(session: str) -> Path:
    return next(PROJECTS.rglob(f"{session}.jsonl"))


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A directory with a short path: AF_UNIX socket paths are short."""
    directory = Path(tempfile.mkdtemp(prefix="busd-", dir="/tmp"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def _config(root: Path, sessions: Sequence[str] = (ALPHA, BETA, GAMMA)) -> Path:
    """A copy of the recorded configuration directory with only ``sessions`` (and their agents).

    Copied as just written (``shutil.copy``, not ``copy2``): a follower only
    follows files written lately, and a checkout's own mtimes age (these
    tests failed in a working tree older than the follow window).
    """
    config = root / "config"
    for session in sessions:
        main = _main(session)
        target = config / "projects" / main.parent.name
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy(main, target / main.name)
        agents = main.with_suffix("")
        if agents.is_dir():
            shutil.copytree(agents, target / agents.name, copy_function=shutil.copy)
    return config


# -- the pure parts ------------------------------------------------------------------------


def test_only_complete_lines_are_taken() -> None:
    assert split_lines(b'{"a":1}\n{"b":2}\n{"c"', final=False) == ([b'{"a":1}', b'{"b":2}'], 16)
    assert split_lines(b'{"a":1}\n{"c"', final=True) == ([b'{"a":1}'], 8)  # still half-written
    # With --once, a last line that is whole JSON is taken, as ccusage takes it.
    assert split_lines(b'{"a":1}\n{"c":3}', final=True) == ([b'{"a":1}', b'{"c":3}'], 15)
    assert split_lines(b'{"c":3}', final=False) == ([], 0)


def test_each_file_belongs_to_its_session() -> None:
    assert place_of(("-p", "s1.jsonl")) == Place("s1")
    assert place_of(("-p", "s1", "subagents", "agent-a9.jsonl")) == Place("s1", "a9")
    assert place_of(("-p", "s1", "other", "x.jsonl")) == Place("s1")
    assert place_of(("s1.jsonl",)) is None  # not in a project
    assert place_of(("-p", "s1.json")) is None


def _stat(inode: int, size: int, mtime: float = 1_000.0) -> Stat:
    return Stat(inode, size, mtime)


def test_a_file_is_read_on_from_where_the_last_round_stopped() -> None:
    follower = Follower(State(), once=False, window=60.0)
    place = Place("s1")
    [read] = follower.plan({"/p/s1.jsonl": (_stat(7, 30), place)}, now=1_010.0)
    assert read == Read("/p/s1.jsonl", 0)
    follower.take(read, b'{"type":"last-prompt"}\n{"type":')  # 23 bytes, then half a line
    assert follower.state().files["/p/s1.jsonl"].offset == 23
    [again] = follower.plan({"/p/s1.jsonl": (_stat(7, 40), place)}, now=1_011.0)
    assert again == Read("/p/s1.jsonl", 23)
    assert follower.plan({"/p/s1.jsonl": (_stat(7, 23), place)}, now=1_012.0) == []
    assert list(follower.drain_notes()) == []


def test_a_shrunk_or_replaced_file_is_read_again_and_a_gone_one_finishes_its_session() -> None:
    follower = Follower(State(), once=False, window=60.0)
    place = Place("s1")
    [read] = follower.plan({"/p/s1.jsonl": (_stat(7, 100), place)}, now=1_010.0)
    follower.take(read, b'{"type":"user","message":{"content":"hi"}}\n' * 2)
    assert [b.session for b in follower.batches()] == ["s1"]
    [shrunk] = follower.plan({"/p/s1.jsonl": (_stat(7, 10), place)}, now=1_011.0)
    assert shrunk.offset == 0
    [replaced] = follower.plan({"/p/s1.jsonl": (_stat(8, 200), place)}, now=1_012.0)
    assert replaced.offset == 0
    assert list(follower.drain_notes()) == [
        "/p/s1.jsonl: shrank; reading it again from the start",
        "/p/s1.jsonl: was replaced; reading it again from the start",
    ]
    assert follower.plan({}, now=1_013.0) == []
    [end] = follower.batches()
    assert (end.session, end.payloads, end.end) == ("s1", [], True)
    assert list(follower.drain_notes()) == ["/p/s1.jsonl: went away"]
    assert follower.state() == State()


def test_following_skips_sessions_older_than_the_window_until_they_move() -> None:
    scan = {
        "/p/old.jsonl": (_stat(1, 10, mtime=0.0), Place("old")),
        "/p/new.jsonl": (_stat(2, 10, mtime=990.0), Place("new")),
        "/p/new/subagents/agent-a.jsonl": (_stat(3, 10, mtime=0.0), Place("new", "a")),
    }
    follower = Follower(State(), once=False, window=60.0)
    reads = follower.plan(scan, now=1_000.0)
    assert [r.path for r in reads] == ["/p/new.jsonl", "/p/new/subagents/agent-a.jsonl"]
    assert reads[1].meta  # a sub-agent's file: its meta.json is read with it
    moved = {**scan, "/p/old.jsonl": (_stat(1, 20, mtime=999.0), Place("old"))}
    follower.take(reads[0], b'{"a":123}\n')  # 10 bytes: all there is
    follower.take(reads[1], b'{"a":123}\n')
    assert [r.path for r in follower.plan(moved, now=1_000.0)] == ["/p/old.jsonl"]
    everything = Follower(State(), once=True, window=60.0)
    assert len(everything.plan(scan, now=1_000.0)) == 3


def _response_lines(message_id: str, blocks: int) -> list[bytes]:
    line = {
        "type": "assistant",
        "sessionId": "s1",
        "timestamp": "2026-11-26T06:00:00.000Z",
        "requestId": f"req_{message_id}",
        "message": {
            "id": message_id,
            "model": SONNET,
            "stop_reason": "end_turn",
            "content": [{"type": "text", "text": "x"}],
            "usage": {"input_tokens": 10, "output_tokens": 5},
        },
    }
    return [json.dumps({**line, "uuid": f"{message_id}-{n}"}).encode() for n in range(blocks)]


def test_a_restart_resumes_the_totals_and_a_response_across_it_counts_once() -> None:
    place = Place("s1")
    first, second = _response_lines("msg_1", 2)
    follower = Follower(State(), once=False, window=60.0)
    [read] = follower.plan({"/p/s1.jsonl": (_stat(7, 1), place)}, now=1_000.0)
    follower.take(read, first + b"\n")
    [batch] = follower.batches()
    assert [p["type"] for p in batch.payloads] == ["assistant", "busd.caught-up"]
    state = msgspec.json.decode(msgspec.json.encode(follower.state()), type=State)
    assert state.sessions["s1"].keys == ["msg_1:req_msg_1"]
    # A new attacher (a new connection, a new translator in the daemon).
    again = Follower(state, once=False, window=60.0)
    size = len(first) + 1 + len(second) + 1
    [rest] = again.plan({"/p/s1.jsonl": (_stat(7, size), place)}, now=1_001.0)
    assert rest.offset == len(first) + 1
    again.take(rest, second + b"\n")
    [batch] = again.batches()
    resume, counted, line, caught_up = batch.payloads
    assert resume["type"] == "busd.resume"
    assert resume["models"][SONNET]["output_tokens"] == 5
    assert counted == {"type": "busd.counted", "keys": ["msg_1:req_msg_1"]}
    assert line["uuid"] == "msg_1-1"
    assert caught_up == {"type": "busd.caught-up"}
    translator = TranscriptTranslator(session_id="s1")
    out = [e for p in batch.payloads for e in translator.feed(p, 0.0)]
    usages = [e.event for e in out if type(e.event) is Usage]
    assert [u.tokens.output_tokens for u in usages] == [5]  # the resumed total, nothing more


def test_a_sub_agents_meta_goes_again_before_its_lines_on_a_new_connection() -> None:
    path, place = "/p/s1/subagents/agent-a.jsonl", Place("s1", "a")
    state = State(files={path: FileMark(inode=3, offset=10, session="s1", agent="a")})
    follower = Follower(state, once=False, window=60.0)
    [read] = follower.plan({path: (_stat(3, 20), place)}, now=1_000.0)
    assert (read.offset, read.meta) == (10, True)
    follower.take(read, b'{"type":"user","isSidechain":true,"agentId":"a"}\n', {"toolUseId": "t"})
    [batch] = follower.batches()
    assert batch.payloads[0] == {
        "type": "busd.subagent",
        "agentId": "a",
        "meta": {"toolUseId": "t"},
    }
    [later] = follower.plan({path: (_stat(3, 70), place)}, now=1_001.0)
    assert not later.meta  # this connection's translator has it


def test_the_state_file_survives_a_round_trip_and_damage_is_said(tmp_path: Path) -> None:
    path = tmp_path / STATE_FILE
    notes: list[str] = []
    assert load_state(path, notes.append) == State()
    follower = Follower(State(), once=True, window=0.0)
    [read] = follower.plan({"/p/s1.jsonl": (_stat(7, 10), Place("s1"))}, now=0.0)
    follower.take(read, b"\n".join(_response_lines("msg_1", 1)) + b"\n")
    follower.batches()
    save_state(path, follower.state())
    assert load_state(path, notes.append) == follower.state()
    path.write_bytes(b"{not json")
    assert load_state(path, notes.append) == State()
    assert notes[0].startswith(f"resume points {path} are damaged (")
    assert notes[0].endswith("; starting afresh")


def test_where_it_looks(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".claude" / "projects").mkdir(parents=True)
    (tmp_path / "a" / "projects").mkdir(parents=True)
    (tmp_path / "b").mkdir()
    assert config_dirs(None, {}, home) == [home / ".claude"]
    xdg = {"XDG_CONFIG_HOME": str(tmp_path)}
    (tmp_path / "claude" / "projects").mkdir(parents=True)
    assert config_dirs(None, xdg, home) == [tmp_path / "claude", home / ".claude"]
    listed = {"CLAUDE_CONFIG_DIR": f" {tmp_path / 'a'} ,{tmp_path / 'b'},"}
    assert config_dirs(None, listed, home) == [tmp_path / "a"]  # b has no projects
    assert config_dirs(tmp_path / "a", listed, home) == [tmp_path / "a"]
    with pytest.raises(TranscriptsNotFound) as caught:
        config_dirs(tmp_path / "b", {}, home)
    assert str(caught.value) == (
        f"no Claude Code transcripts: none of {tmp_path / 'b' / 'projects'} is a directory"
    )


# -- the attacher on real files, in this process ------------------------------------------------


class Translating:
    """A sink that translates as the daemon does: one translator per session and connection."""

    def __init__(self) -> None:
        self.translators: dict[str | None, TranscriptTranslator] = {}
        self.events: list[Emitted] = []
        self.notes: list[str] = []
        self.ended: list[str | None] = []
        self.checkpoints = 0
        self._changed = trio.Event()

    async def ingest(
        self, sdk: str, session_id: str | None, events: Sequence[object], *, end: bool = False
    ) -> None:
        assert sdk == SDK
        translator = self.translators.get(session_id)
        if translator is None:
            translator = self.translators[session_id] = TranscriptTranslator(session_id=session_id)
        for event in events:
            self.events += translator.feed(event, trio.current_time())
        if end:
            self.events += self.translators.pop(session_id).finish(trio.current_time())
            self.ended.append(session_id)
        self._changed.set()
        self._changed = trio.Event()

    async def checkpoint(self) -> bool:
        self.checkpoints += 1
        return True

    def note(self, message: str) -> None:
        self.notes.append(message)

    def of(self, cls: type[Any]) -> list[Any]:
        return [e.event for e in self.events if isinstance(e.event, cls)]

    async def until(self, done: Any) -> None:
        """Wait until ``done()`` holds (bounded by the caller's ``fail_after``)."""
        while not done():
            await self._changed.wait()


@asynccontextmanager
async def following(sink: Translating, config: Path, state: Path) -> AsyncIterator[None]:
    attacher = ClaudeCodeAttacher(poll_s=0.02)
    options = AttachOptions(state_dir=state, directory=config)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(attacher.attach, sink, options)
        yield
        nursery.cancel_scope.cancel()


async def test_a_half_written_last_line_waits_for_its_newline(tmp_path: Path) -> None:
    config = _config(tmp_path, [GAMMA])
    path = next(config.rglob("*.jsonl"))
    whole = path.read_bytes().splitlines(keepends=True)
    result = next(n for n, line in enumerate(whole) if b'"tool_result"' in line)
    path.write_bytes(b"".join(whole[:result]) + whole[result][:100])
    sink = Translating()
    async with following(sink, config, tmp_path):
        with trio.fail_after(10):
            await sink.until(lambda: sink.of(ToolStart))
            await sink.until(lambda: sink.checkpoints >= 1)
        assert sink.of(ToolComplete) == []
        with path.open("ab") as f:
            f.write(whole[result][100:])
        with trio.fail_after(10):
            await sink.until(lambda: sink.of(ToolComplete))
    assert sink.notes == []  # the half line was held, not judged
    [complete] = sink.of(ToolComplete)
    assert (complete.name, complete.output) == ("Bash", "milk\nbread")


async def test_a_shrunk_file_is_read_again_without_counting_twice(tmp_path: Path) -> None:
    config = _config(tmp_path, [GAMMA])
    path = next(config.rglob("*.jsonl"))
    whole = path.read_bytes()
    sink = Translating()
    async with following(sink, config, tmp_path):
        with trio.fail_after(10):
            await sink.until(lambda: sink.of(SessionIdle))
        path.write_bytes(whole[: len(whole) // 2])
        with trio.fail_after(10):
            await sink.until(lambda: len(sink.notes) >= 1)
    assert sink.notes == [f"{path}: shrank; reading it again from the start"]
    usages = sink.of(Usage)
    assert len({u.tokens for u in usages}) == 1  # the response again, not counted again
    assert usages[-1].tokens.output_tokens == 210


async def test_a_deleted_file_is_said_and_its_session_finished(tmp_path: Path) -> None:
    config = _config(tmp_path, [ALPHA, GAMMA])
    sink = Translating()
    async with following(sink, config, tmp_path):
        with trio.fail_after(10):
            await sink.until(lambda: sink.of(AgentComplete) and sink.checkpoints >= 1)
        gone = next(config.rglob(f"{GAMMA}.jsonl"))
        gone.unlink()
        with trio.fail_after(10):
            await sink.until(lambda: sink.ended)
    assert sink.notes == [f"{gone}: went away"]
    assert sink.ended == [GAMMA]
    state = load_state(tmp_path / STATE_FILE, sink.notes.append)
    assert set(state.sessions) == {ALPHA}
    assert str(gone) not in state.files


async def test_a_missing_directory_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TranscriptsNotFound):
        await ClaudeCodeAttacher().attach(
            Translating(), AttachOptions(state_dir=tmp_path, directory=tmp_path / "nope")
        )


# -- a real daemon, `busd attach` and ccusage --------------------------------------------------


async def _run(*args: str, env: dict[str, str] | None = None) -> str:
    result = await trio.run_process(
        list(args), capture_stdout=True, capture_stderr=True, check=False, env=env
    )
    assert result.returncode == 0, (args, result.stderr.decode())
    return result.stdout.decode() + result.stderr.decode()


async def _attach(sock: Path, config: Path, state: Path) -> str:
    return await _run(
        *BUSD, "attach", "claude-code", "--socket", str(sock), "--once",
        "--dir", str(config), "--state-dir", str(state),
    )  # fmt: skip


async def _ccusage(config: Path, home: Path) -> dict[str, Any]:
    node = shutil.which("node")
    assert node is not None
    env = {"PATH": f"{Path(node).parent}:/usr/bin:/bin", "HOME": str(home),
           "CLAUDE_CONFIG_DIR": str(config)}  # fmt: skip
    said = await _run(str(CCUSAGE), "session", "--offline", "--json", env=env)
    loaded: dict[str, Any] = json.loads(said)
    return loaded


def _ccusage_models(report: dict[str, Any]) -> dict[str, TokenUsage]:
    models: dict[str, TokenUsage] = {}
    for row in report["sessions"]:
        for m in row["modelBreakdowns"]:
            before = models.get(m["modelName"], TokenUsage(cost_usd=0.0))
            models[m["modelName"]] = TokenUsage(
                input_tokens=before.input_tokens + m["inputTokens"],
                output_tokens=before.output_tokens + m["outputTokens"],
                cache_write_tokens=before.cache_write_tokens + m["cacheCreationTokens"],
                cache_read_tokens=before.cache_read_tokens + m["cacheReadTokens"],
                cost_usd=(before.cost_usd or 0.0) + m["cost"],
            )
    return models


async def _busd_models(sock: Path) -> dict[str, dict[str, TokenUsage]]:
    """Each session's ``usage_by_model``, from the daemon's ``sessions`` command."""
    async with connect(sock, client="parity", role="observer") as client:
        reply = await client.request(Sessions())
    rows = msgspec.convert(reply, list[dict[str, Any]])
    return {
        row["session_id"]: msgspec.convert(row.get("usage_by_model", {}), dict[str, TokenUsage])
        for row in rows
    }


def _close(a: TokenUsage, b: TokenUsage) -> bool:
    counts = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")
    same = all(getattr(a, n) == getattr(b, n) for n in counts)
    return same and abs((a.cost_usd or 0.0) - (b.cost_usd or 0.0)) < 1e-9


def _add(a: TokenUsage, b: TokenUsage) -> TokenUsage:
    return TokenUsage(
        input_tokens=a.input_tokens + b.input_tokens,
        output_tokens=a.output_tokens + b.output_tokens,
        cache_read_tokens=a.cache_read_tokens + b.cache_read_tokens,
        cache_write_tokens=a.cache_write_tokens + b.cache_write_tokens,
        cost_usd=(a.cost_usd or 0.0) + (b.cost_usd or 0.0),
    )


def _sessions_in(config: Path) -> set[str]:
    return {p.stem for p in config.rglob("*.jsonl") if p.parent.parent.name == "projects"}


async def _written(path: Path) -> None:
    """Wait until another process has written ``path`` (bounded by the caller)."""
    for _ in iter(int, 1):
        if await trio.Path(path).exists():
            return
        await trio.sleep(0.05)


async def _assert_parity(sock: Path, journal: Path, config: Path, home: Path) -> None:
    """``busd sessions --json`` (the journal) equals ccusage's, model by model."""
    report = await _ccusage(config, home)
    records = json.loads(await _run(*BUSD, "sessions", "--journal", str(journal), "--json"))
    by_session = {
        r["session_id"]: msgspec.convert(r.get("usage_by_model", {}), dict[str, TokenUsage])
        for r in records
    }
    assert by_session == await _busd_models(sock)  # the journal keeps what the daemon shows
    assert {r["session_id"] for r in records} == _sessions_in(config)
    models: dict[str, TokenUsage] = {}
    total = TokenUsage(cost_usd=0.0)
    for record in records:
        usage = msgspec.convert(record["usage"], TokenUsage)
        breakdown = by_session[record["session_id"]]
        whole = TokenUsage(cost_usd=0.0)
        for model, tokens in breakdown.items():
            models[model] = _add(models.get(model, TokenUsage(cost_usd=0.0)), tokens)
            whole = _add(whole, tokens)
        assert _close(usage, whole), record  # the journal's total is its breakdown's sum
        total = _add(total, usage)
    theirs = _ccusage_models(report)
    assert set(models) == set(theirs)
    for model, tokens in theirs.items():
        assert _close(models[model], tokens), (model, models[model], tokens)
    totals = report["totals"]
    assert (total.input_tokens, total.output_tokens) == (
        totals["inputTokens"],
        totals["outputTokens"],
    )
    assert (total.cache_write_tokens, total.cache_read_tokens) == (
        totals["cacheCreationTokens"],
        totals["cacheReadTokens"],
    )
    assert total.cost_usd == pytest.approx(totals["totalCost"], abs=1e-9)


@needs_ccusage
async def test_busd_sessions_equal_ccusage_and_a_second_attach_adds_nothing(
    short_tmp: Path,
) -> None:
    config = _config(short_tmp, [ALPHA, BETA, GAMMA, "78cfba7a-4f44-48df-afca-173e040c0edb"])
    sock, journal, state = short_tmp / "bus.sock", short_tmp / "j.sqlite3", short_tmp / "state"
    async with serving(sock, "--journal", str(journal)):
        said = await _attach(sock, config, state)
        assert "busd: attach claude-code done: " in said
        assert "from 4 session(s)" in said
        await _assert_parity(sock, journal, config, short_tmp)
        again = await _attach(sock, config, state)
        assert "done: 0 payload(s) from 0 session(s)" in again
        await _assert_parity(sock, journal, config, short_tmp)


@needs_ccusage
async def test_a_follow_stopped_mid_file_and_started_again_counts_nothing_twice(
    short_tmp: Path,
) -> None:
    config = _config(short_tmp, [BETA])
    main = next(config.rglob(f"{BETA}.jsonl"))
    whole = main.read_bytes().splitlines(keepends=True)
    half = len(whole) // 2
    main.write_bytes(b"".join(whole[:half]))
    sock, journal, state = short_tmp / "bus.sock", short_tmp / "j.sqlite3", short_tmp / "state"
    async with serving(sock, "--journal", str(journal)):
        async with (
            connect(sock, client="watcher") as watcher,
            watcher.subscribe(["stream.usage"], sessions=[BETA], window_ms=0) as sub,
        ):
            follow = await trio.lowlevel.open_process(
                [*BUSD, "attach", "claude-code", "--socket", str(sock),
                 "--dir", str(config), "--state-dir", str(state)],
                stderr=subprocess.PIPE,
            )  # fmt: skip
            with trio.fail_after(20):
                await sub.__anext__()  # the first half is on the bus
            with trio.fail_after(20):  # and its resume points are written
                await _written(state / STATE_FILE)
        follow.send_signal(signal.SIGTERM)
        with trio.fail_after(20):
            assert await follow.wait() == 0
        assert follow.stderr is not None
        said = (await follow.stderr.receive_some(65536)).decode()
        await follow.stderr.aclose()
        assert "busd: attach claude-code stopped: " in said
        with main.open("ab") as f:  # Claude Code goes on writing while busd is away
            f.write(b"".join(whole[half:]))
        await _attach(sock, config, state)
        await _assert_parity(sock, journal, config, short_tmp)
        exported = await _run(*BUSD, "export", "--journal", str(journal), "--format", "json", BETA)
    turns = [m["turn_id"] for m in json.loads(exported)["messages"] if m["role"] == "assistant"]
    assert sorted(turns) == [f"msg_{n:03d}" for n in range(5, 13)]  # each response once


# -- the live test: the real CLI writes while busd attach follows ---------------------------------


def _stand_in() -> Any:
    spec = importlib.util.spec_from_file_location(
        "transcript_stand_in_live", FIXTURES / "transcript_stand_in.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def stand_in() -> Iterator[tuple[str, Any]]:
    module = _stand_in()
    server = ThreadingHTTPServer(("127.0.0.1", 0), module.Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", module
    finally:
        module.GATE.set()
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.skipif(not CLI.exists(), reason=f"no bundled Claude Code CLI at {CLI}")
async def test_a_session_shows_on_the_bus_while_the_cli_writes_it(
    short_tmp: Path, stand_in: tuple[str, Any]
) -> None:
    base_url, model = stand_in
    config, project, home = short_tmp / "config", short_tmp / "project", short_tmp / "home"
    for directory in (config / "projects", project, home):
        directory.mkdir(parents=True)
    (project / "notes.txt").write_text("milk\nbread\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "CLAUDE_CONFIG_DIR": str(config),
           "ANTHROPIC_BASE_URL": base_url, "ANTHROPIC_API_KEY": "sk-ant-stand-in"}  # fmt: skip
    sock = short_tmp / "bus.sock"
    async with (
        serving(sock, "--no-journal"),
        connect(sock, client="watcher") as watcher,
        watcher.subscribe(["stream.>"], window_ms=0) as sub,
    ):
        follow = await trio.lowlevel.open_process(
            [*BUSD, "attach", "claude-code", "--socket", str(sock),
             "--dir", str(config), "--state-dir", str(short_tmp / "state")],
        )  # fmt: skip
        claude = await trio.lowlevel.open_process(
            [str(CLI), "-p", "[hold] Please read my notes.", "--model", SONNET,
             "--allowedTools", "Bash"],
            cwd=project, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            seen: list[Any] = []
            with trio.fail_after(30):  # the first turn, while the model's answer is held
                async for batch in sub:
                    seen += [e for e in batch.events if e.session_id is not None]
                    if any(isinstance(e.event, ToolComplete) for e in seen):
                        break
            assert claude.returncode is None  # the CLI is still running: this is live
            assert model.SERVED[-1][1] == "tool_call"
            [bash] = [e.event for e in seen if isinstance(e.event, ToolComplete)]
            assert (bash.name, bash.output) == ("Bash", "milk\nbread")
            session = seen[-1].session_id
            assert {e.session_id for e in seen} == {session}
            model.GATE.set()  # the model answers; the run ends
            with trio.fail_after(30):
                async for batch in sub:
                    seen += list(batch.events)
                    if any(isinstance(e.event, SessionIdle) for e in seen):
                        break
            with trio.fail_after(30):
                assert await claude.wait() == 0
        finally:
            for process in (claude, follow):
                if process.returncode is None:
                    process.send_signal(signal.SIGTERM)
            with trio.fail_after(20):
                await follow.wait()
                await claude.wait()
    assert _sessions_in(config) == {session}  # the session is the file's, by its id
    [idle] = [e.event for e in seen if isinstance(e.event, SessionIdle)]
    assert not idle.aborted
    usage = [e.event for e in seen if isinstance(e.event, Usage)][-1]
    total = usage.tokens
    fresh, write, read, out = model.USAGE["tool_call"]
    fresh2, write2, read2, out2 = model.USAGE["tool_answer"]
    assert (total.input_tokens, total.output_tokens) == (fresh + fresh2, out + out2)
    assert (total.cache_write_tokens, total.cache_read_tokens) == (write + write2, read + read2)
    assert set(usage.models) == {SONNET}
    assert usage.models[SONNET].output_tokens == total.output_tokens
