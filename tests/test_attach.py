"""``busd attach``: the sink an attacher sends through, over a real socket to a real daemon.

The attachers themselves (Claude Code transcripts, OpenCode's server) are
tested in their plugins against the real programs; this is what they share:
framing under the daemon's cap, skipping what cannot be sent, checkpoints,
and the command's own errors.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import trio
from click.testing import CliRunner

from busd import AttachOptions, Sink
from busd.cli import main as cli
from busd.cli.attach import ClientSink, _attach_once
from busd.client import connect
from busd.core.errors import lone_error
from busd.core.events import TextComplete, TurnEnd
from busd.daemon.hub import DaemonConfig
from busd.plugins.manager import PluginManager

from .daemon_helpers import BUSD, running_daemon, serving

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "sdk"


def _anthropic_stream() -> list[Any]:
    lines = (FIXTURES / "anthropic.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def _plugins() -> PluginManager:
    plugins = PluginManager()
    plugins.load_entry_points()
    return plugins


class Recorded:
    """An attacher that sends one recorded stream per session, in pieces, and checkpoints."""

    name = "recorded"
    description = "a recorded Anthropic stream per session (test)"

    def __init__(self, sessions: Sequence[str], *, extra: Sequence[object] = ()) -> None:
        self.sessions = sessions
        self.extra = extra
        self.checkpoints: list[bool] = []

    async def attach(self, sink: Sink, options: AttachOptions) -> None:
        stream = _anthropic_stream()
        for session in self.sessions:
            await sink.ingest("anthropic", session, [*self.extra, *stream[:5]])
            await sink.ingest("anthropic", session, stream[5:], end=True)
        self.checkpoints.append(await sink.checkpoint())
        sink.note("sent everything")


async def test_an_attacher_publishes_translated_sessions_and_a_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bus.sock"
    attacher = Recorded(["s-one", "s-two"])
    async with running_daemon(path, plugins=_plugins()), connect(path, client="watcher") as watcher:
        async with watcher.subscribe(["stream.turn.end"], window_ms=0) as sub:
            options = AttachOptions(state_dir=tmp_path, once=True)
            assert await _attach_once(path, attacher, options) == 0
            ends: list[str | None] = []
            with trio.fail_after(5):
                async for batch in sub:
                    for envelope in batch.events:
                        assert isinstance(envelope.event, TurnEnd)
                        ends.append(envelope.session_id)
                    if len(ends) == 2:
                        break
    assert sorted(s or "" for s in ends) == ["s-one", "s-two"]
    assert attacher.checkpoints == [False]  # the test daemon keeps no journal
    err = capsys.readouterr().err
    assert "busd: sent everything" in err
    total = 2 * len(_anthropic_stream())
    assert f"attach recorded done: {total} payload(s) from 2 session(s)" in err
    assert "(the daemon keeps no journal: not durable)" in err


async def test_the_sink_splits_frames_under_the_cap_and_skips_what_cannot_be_sent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bus.sock"
    config = DaemonConfig(max_frame=64 << 10)
    big = {"type": "ping", "padding": "x" * (40 << 10)}  # fits, but not two to a frame
    huge = {"type": "ping", "padding": "x" * (80 << 10)}  # over the cap: skipped
    async with (
        running_daemon(path, config, plugins=_plugins()),
        connect(path, role="agent") as client,
    ):
        sink = ClientSink(client, max_frame=client.limits.max_frame)
        stream = _anthropic_stream()
        async with client.subscribe(["stream.text.complete"], window_ms=0) as sub:
            await sink.ingest("anthropic", "s", [big, big, huge, object(), *stream], end=True)
            assert await sink.checkpoint() is False
            with trio.fail_after(5):
                batch = await sub.__anext__()
            assert [type(e.event) for e in batch.events] == [TextComplete]
        assert client.errors == []  # the daemon refused nothing: no frame was over its cap
    assert sink.skipped == 2
    assert sink.events == 2 + len(stream)
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("busd: anthropic: skipped a payload of ")
    assert err[0].endswith("bytes, over the daemon's frame cap")
    assert err[1].startswith("busd: anthropic: skipped a payload that is not JSON-like")


def test_an_unknown_attacher_is_a_one_line_error() -> None:
    result = CliRunner().invoke(cli, ["attach", "no-such-agent"])
    assert result.exit_code == 2
    assert result.stderr.startswith("busd: no attacher 'no-such-agent' is installed (installed: ")
    assert "Traceback" not in result.output


def test_an_unusable_state_dir_is_a_one_line_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    installed = sorted(_plugins().attachers())
    if not installed:
        pytest.skip("no attacher plugin is installed")
    result = CliRunner().invoke(
        cli, ["attach", installed[0], "--once", "--state-dir", str(blocker / "state")]
    )
    assert result.exit_code == 2
    assert result.stderr.startswith(f"busd: cannot use {blocker / 'state'} for resume points: ")


async def test_an_attacher_that_cannot_start_is_a_one_line_error(tmp_path: Path) -> None:
    if "claude-code" not in _plugins().attachers():
        pytest.skip("the claude-code plugin is not installed")
    path = tmp_path / "bus.sock"
    where = ["--dir", str(tmp_path / "nowhere"), "--state-dir", str(tmp_path / "state")]
    async with serving(path):
        result = await trio.run_process(
            [*BUSD, "attach", "claude-code", "--socket", str(path), "--once", *where],
            capture_stderr=True,
            check=False,
        )
    assert result.returncode == 2
    said = result.stderr.decode()
    assert said.startswith("busd: no Claude Code transcripts: "), said
    assert len(said.splitlines()) == 1, said


def test_a_lone_error_is_unwrapped_from_nested_groups_and_two_are_not() -> None:
    """What lets `busd attach` and `busd web` say one line for one failure in a nursery."""
    one = ValueError("no such directory")
    assert lone_error(one) is one
    assert lone_error(ExceptionGroup("outer", [ExceptionGroup("inner", [one])])) is one
    two = ExceptionGroup("outer", [one, ExceptionGroup("inner", [KeyError("k")])])
    assert lone_error(two) is None


async def _sessions(journal: Path) -> dict[str, Any]:
    result = await trio.run_process(
        [*BUSD, "sessions", "--journal", str(journal), "--json"], capture_stdout=True
    )
    return {r["session_id"]: r["usage"] for r in json.loads(result.stdout)}


async def _read_until(stream: trio.abc.ReceiveStream, needle: bytes, seen: bytearray) -> None:
    while needle not in seen:
        chunk = await stream.receive_some(4096)
        assert chunk, f"ended before {needle!r}: {bytes(seen)!r}"
        seen += chunk


async def test_attach_waits_out_a_daemon_restart_and_counts_nothing_twice(tmp_path: Path) -> None:
    """Claude Code keeps writing while the daemon restarts: busd attach says so and goes on."""
    if "claude-code" not in _plugins().attachers():
        pytest.skip("the claude-code plugin is not installed")
    transcripts = ROOT / "plugins" / "claude_code" / "tests" / "fixtures" / "transcripts"
    config = tmp_path / "config"
    shutil.copytree(transcripts, config, copy_function=shutil.copy)  # modified now: followed
    sock, journal = tmp_path / "bus.sock", tmp_path / "journal.sqlite3"
    args = ["--socket", str(sock), "--dir", str(config), "--state-dir", str(tmp_path / "state")]
    said = bytearray()
    async with serving(sock, "--journal", str(journal)) as daemon:
        attach = await trio.lowlevel.open_process(
            [*BUSD, "attach", "claude-code", *args], stderr=subprocess.PIPE
        )
        assert attach.stderr is not None
        try:
            with trio.fail_after(30):  # another process's progress: polled, with a deadline
                while len(before := await _sessions(journal)) < 4:  # noqa: ASYNC110
                    await trio.sleep(0.2)
            daemon.send_signal(signal.SIGTERM)
            with trio.fail_after(30):
                await _read_until(attach.stderr, b"reconnecting", said)
        except BaseException:
            attach.kill()
            raise
    try:
        assert attach.returncode is None  # it waits for the daemon
        async with serving(sock, "--journal", str(journal)):
            with trio.fail_after(30):
                await _read_until(attach.stderr, b"the daemon is back", said)
            attach.send_signal(signal.SIGTERM)
            with trio.fail_after(30):
                code = await attach.wait()
                await _read_until(attach.stderr, b"stopped", said)
        assert await _sessions(journal) == before  # resumed from its resume points
    finally:
        if attach.returncode is None:
            attach.kill()
            await attach.wait()
        await attach.stderr.aclose()
    assert code == 0, said.decode()
    text = said.decode()
    assert text.count("lost the daemon") == 1, text
    assert "Traceback" not in text
