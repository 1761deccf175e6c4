"""``busd run``: the pure parts on their own, then the command as a real process.

The processes run real SDKs against local stand-ins: the ``anthropic`` driver
against :class:`MessagesAPI` (a small Trio HTTP server replaying
``fixtures/sdk/anthropic.jsonl`` as server-sent events), and the
``claude-code`` driver against the fake ``claude`` CLI of its plugin, whose
recorded stream asks permission to use ``Write``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from busd.client import RequestFailed, connect
from busd.core.catalog import Catalog
from busd.core.events import (
    Envelope,
    Event,
    PermissionOption,
    PermissionRequested,
    PermissionResolved,
    RunFinished,
    RunStarted,
    TextComplete,
    TextDelta,
    TokenUsage,
    ToolStart,
)
from busd.frontends.headless import (
    EXIT_AGENT_ERROR,
    EXIT_CANCELLED,
    EXIT_OK,
    EXIT_TIMED_OUT,
    HeadlessRun,
    PrettyPrinter,
    RunView,
    ToolRules,
    _Follower,
    exit_code,
    parse_option,
    reply_for,
    summary_lines,
)
from busd.wire import Runs

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "sdk" / "anthropic.jsonl"
EVENTS = [json.loads(line) for line in FIXTURE.read_text().splitlines() if line.strip()]
FIRST_TEXT = next(i for i, e in enumerate(EVENTS) if e.get("delta", {}).get("type") == "text_delta")
FAKE_CLAUDE = ROOT / "plugins" / "claude_code" / "tests" / "fake_claude.py"
WORKFLOW = ROOT / "contrib" / "ci" / "github-actions.yml"
BUSD = [sys.executable, "-m", "busd"]
TEXT = "I'll check the weather for you."


# -- the pure parts ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "allowed", "reason"),
    [
        ("Read", True, "--allow Read"),
        ("mcp__github__search", True, "--allow mcp__*"),
        ("Bash", False, "--deny Bash"),
        ("mcp__shell__exec", False, "--deny mcp__shell__*"),  # deny is checked first
        ("Write", False, "no --allow rule matches Write: busd run fails closed"),
        ("read", False, "no --allow rule matches read: busd run fails closed"),
    ],
)
def test_deny_rules_come_first_and_an_unmatched_tool_is_denied(
    tool: str, allowed: bool, reason: str
) -> None:
    rules = ToolRules(allow=("Read", "mcp__*"), deny=("Bash", "mcp__shell__*"))
    verdict = rules.decide(tool)
    assert (verdict.allowed, verdict.reason) == (allowed, reason)


def test_the_reply_takes_the_one_time_option_and_never_always() -> None:
    offered = PermissionRequested(
        request_id="r",
        tool="Write",
        options=[
            PermissionOption(id="always", kind="allow_always"),
            PermissionOption(id="once", kind="allow_once"),
            PermissionOption(id="no", kind="reject_once"),
        ],
    )
    assert reply_for(offered, True) == ("once", None)
    assert reply_for(offered, False) == ("no", None)
    only_always = PermissionRequested(
        request_id="r", tool="Write", options=[PermissionOption(id="a", kind="allow_always")]
    )
    assert reply_for(only_always, True) == (None, True)
    assert reply_for(PermissionRequested(request_id="r", tool="Write"), False) == (None, False)


def test_exit_codes_follow_the_run_status() -> None:
    assert [exit_code(s) for s in ("ok", "error", "timed_out", "cancelled")] == [
        EXIT_OK,
        EXIT_AGENT_ERROR,
        EXIT_TIMED_OUT,
        EXIT_CANCELLED,
    ]
    assert (EXIT_TIMED_OUT, EXIT_CANCELLED) == (124, 130)


def test_option_values_are_json_when_they_are_json() -> None:
    assert parse_option("max_tokens=512") == ("max_tokens", 512)
    assert parse_option('env={"A": "1"}') == ("env", {"A": "1"})
    assert parse_option("base_url=http://127.0.0.1:8080") == ("base_url", "http://127.0.0.1:8080")
    assert parse_option("system=a=b") == ("system", "a=b")
    for bad in ("novalue", "=x"):
        with pytest.raises(ValueError, match="not key=value"):
            parse_option(bad)


def envelope(seq: int, event: Event, run_id: str | None = "run-1") -> Envelope[Event]:
    return Envelope(seq, 0.0, event, "sess-1", run_id)


def test_the_view_holds_early_events_until_the_run_id_is_known() -> None:
    view = RunView()
    early = [
        envelope(1, RunStarted(adapter="a"), "run-0"),
        envelope(2, RunStarted(adapter="a")),
        envelope(3, TextDelta(message_id="m", text="x"), None),
    ]
    assert view.observe(early) == []
    assert [e.seq for e in view.start("run-1")] == [2]
    finished = RunFinished(status="ok", duration_s=1.0)
    later = [
        envelope(4, TextDelta(message_id="m", text="hi")),
        envelope(5, TextDelta(message_id="m", text="other"), "run-0"),
        envelope(6, finished),
        envelope(7, TextDelta(message_id="m", text="late")),
    ]
    assert [e.seq for e in view.observe(later)] == [4, 6]
    assert view.finished == finished
    assert view.observe([envelope(8, TextDelta(message_id="m", text="late"))]) == []


def test_pretty_output_streams_text_and_starts_other_lines_fresh() -> None:
    printer = PrettyPrinter()
    asked = PermissionRequested(request_id="run-1/p", tool="Write", title="tmp/hello.txt")
    finished = RunFinished(
        status="ok",
        duration_s=18.4,
        thinking_s=5.2,
        usage=TokenUsage(input_tokens=69, output_tokens=1412, cost_usd=0.0123),
    )
    events: list[Event] = [
        TextDelta(message_id="m", text="Hello"),
        TextDelta(message_id="m", text=" world"),
        ToolStart(tool_call_id="t", name="Write", input={"path": "a"}),
        asked,
        PermissionResolved(request_id="run-1/p", outcome="denied", by="busd-run", reason="x"),
        TextDelta(message_id="m", text="Done.\n"),
        TextComplete(message_id="m", text="Hello world"),
        finished,
    ]
    text = "".join(printer.render(envelope(i, e)) for i, e in enumerate(events))
    assert text == (
        "Hello world\n"
        '⏺ Write({"path":"a"})\n'
        "? Write asks permission: tmp/hello.txt\n"
        "✗ denied Write (by busd-run: x)\n"
        "Done.\n"
        "✻ Worked for 18s · ↓ 1.4k tokens · thought for 5s\n"
        "ok · 69 in · 1.4k out · $0.0123\n"
    )
    assert summary_lines(finished)[-1] == "ok · 69 in · 1.4k out · $0.0123"


def test_the_summary_has_a_line_per_model_share_when_there_are_several() -> None:
    """sonnet 412 + haiku 3 = 415 out; $0.030195 + $0.0018767 = $0.0320717."""
    finished = RunFinished(
        status="ok",
        duration_s=0.4,
        usage=TokenUsage(input_tokens=7, output_tokens=415, cost_usd=0.030195 + 0.0018767),
        models={
            "claude-sonnet-4-5": TokenUsage(input_tokens=5, output_tokens=412, cost_usd=0.030195),
            "claude-haiku-5-5": TokenUsage(input_tokens=2, output_tokens=3, cost_usd=0.0018767),
        },
    )
    assert summary_lines(finished) == [
        "✻ Worked for 0s · ↓ 415 tokens",
        "ok · 7 in · 415 out · $0.0321",
        "claude-sonnet-4-5 412 out · claude-haiku-5-5 3 out",
    ]
    one = msgspec.structs.replace(finished, models={"claude-sonnet-4-5": finished.usage})
    assert len(summary_lines(one)) == 2


# -- stand-ins -------------------------------------------------------------------------------


class MessagesAPI:
    """``POST /v1/messages`` answered with the fixture as SSE; ``stall_at`` stops before an event.

    A stalled response waits until the client hangs up (a cancelled run), so
    a test can stop a run mid-stream without any timing.
    """

    def __init__(self, *, stall_at: int | None = None) -> None:
        self.stall_at = stall_at
        self.bodies: list[Any] = []
        self.base_url = ""

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.base_url = f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, self._connection, listeners)
            task_status.started()

    async def _connection(self, stream: trio.SocketStream) -> None:
        try:
            buffer = bytearray()
            while (body := await _read_request(stream, buffer)) is not None:
                self.bodies.append(body)
                await stream.send_all(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b"transfer-encoding: chunked\r\n\r\n"
                )
                for index, event in enumerate(EVENTS):
                    if index == self.stall_at:
                        while await stream.receive_some():
                            pass
                        return
                    data = f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()
                    await stream.send_all(b"%x\r\n%s\r\n" % (len(data), data))
                await stream.send_all(b"0\r\n\r\n")
        except trio.BrokenResourceError:
            pass


async def _read_request(stream: trio.SocketStream, buffer: bytearray) -> Any:
    while (end := buffer.find(b"\r\n\r\n")) < 0:
        chunk = await stream.receive_some()
        if not chunk:
            return None
        buffer += chunk
    head = bytes(buffer[:end]).decode("latin-1").lower()
    del buffer[: end + 4]
    length = next(
        int(line.split(":", 1)[1])
        for line in head.split("\r\n")
        if line.startswith("content-length")
    )
    while len(buffer) < length:
        buffer += await stream.receive_some()
    body = json.loads(bytes(buffer[:length]))
    del buffer[:length]
    return body


@asynccontextmanager
async def messages_api(*, stall_at: int | None = None) -> AsyncIterator[MessagesAPI]:
    api = MessagesAPI(stall_at=stall_at)
    async with trio.open_nursery() as nursery:
        await nursery.start(api.serve)
        yield api
        nursery.cancel_scope.cancel()


class Place:
    """A test's private directories and the environment its ``busd`` processes get."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.socket = root / "run" / "bus.sock"
        self.tmp = root / "tmp"
        self.tmp.mkdir()
        self.env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("BUSD_", "ANTHROPIC_", "FAKE_CLAUDE_"))
        }
        self.env |= {
            "BUSD_SOCKET": str(self.socket),
            "TMPDIR": str(self.tmp),
            "ANTHROPIC_API_KEY": "sk-ant-test",
        }

    async def run(self, *args: str, **env: str) -> subprocess.CompletedProcess[bytes]:
        with trio.fail_after(60):
            return await trio.run_process(
                [*BUSD, "run", *args],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
                env=self.env | env,
                cwd=self.root,
            )

    def fake_claude(self) -> tuple[Path, Path]:
        """A ``claude`` executable running the stand-in, and the file it records to."""
        cli = self.root / "claude"
        cli.write_text(
            f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(str(FAKE_CLAUDE))} "$@"\n'
        )
        cli.chmod(0o755)
        record = self.root / "claude-record.jsonl"
        self.env["FAKE_CLAUDE_RECORD"] = str(record)
        return cli, record


@pytest.fixture
def place() -> Iterator[Place]:
    # Short, under /tmp: a socket path has a 107-byte limit that pytest's tmp_path can exceed.
    root = Path(tempfile.mkdtemp(prefix="busd-h-", dir="/tmp"))
    yield Place(root)
    shutil.rmtree(root, ignore_errors=True)


def lines(output: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in output.decode().splitlines()]


def of_type(transcript: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e["event"] for e in transcript if e["event"]["type"] == name]


def text_of(transcript: list[dict[str, Any]]) -> str:
    return "".join(e["text"] for e in of_type(transcript, "stream.text.delta"))


@asynccontextmanager
async def busd_serve(place: Place) -> AsyncIterator[trio.Process]:
    """``busd serve`` on the place's socket, yielded once it listens."""
    process = await trio.lowlevel.open_process(
        [*BUSD, "serve"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=place.env
    )
    try:
        assert process.stdout is not None
        with trio.fail_after(20):
            assert b"listening on" in await process.stdout.receive_some()
        yield process
    finally:
        process.send_signal(signal.SIGTERM)
        with trio.fail_after(20):
            await process.wait()
        assert process.stdout is not None
        await process.stdout.aclose()


# -- busd run as a process -------------------------------------------------------------------


async def test_without_a_daemon_it_runs_one_in_process_and_leaves_nothing_behind(
    place: Place,
) -> None:
    async with messages_api() as api:
        result = await place.run(
            "--adapter", "anthropic", "--json", "--option", "max_tokens=512",
            "What is the weather in San Francisco?", ANTHROPIC_BASE_URL=api.base_url,
        )  # fmt: skip
    assert result.returncode == 0, result.stderr.decode()
    transcript = lines(result.stdout)
    run_ids = {e["run_id"] for e in transcript}
    assert len(run_ids) == 1  # only its own run's envelopes
    assert transcript[0]["event"]["type"] == "busd.run.started"
    assert transcript[-1]["event"]["type"] == "busd.run.finished"
    finished = transcript[-1]["event"]
    assert (finished["status"], finished["usage"]["output_tokens"]) == ("ok", 112)
    assert text_of(transcript) == TEXT
    [body] = api.bodies
    assert body["max_tokens"] == 512  # --option values are JSON when they are JSON
    assert body["messages"] == [
        {"role": "user", "content": "What is the weather in San Francisco?"}
    ]
    assert b"Worked for" in result.stderr  # the summary, for the CI log
    assert not place.socket.exists()
    assert list(place.tmp.iterdir()) == []  # the private socket's directory is gone


async def test_with_a_running_daemon_it_uses_it_and_prints_pretty_text(place: Place) -> None:
    async with messages_api() as api, busd_serve(place):
        # base_url as an option: the daemon's environment, not busd run's, reaches the driver.
        result = await place.run(
            "--adapter", "anthropic", "--pretty", "--watchdog", "5",
            "--option", f"base_url={api.base_url}", "Weather?",
        )  # fmt: skip
        async with connect(place.socket, client="test", role="admin") as client:
            runs = await client.request(Runs())
    assert result.returncode == 0, result.stderr.decode()
    [run] = runs
    assert (run["adapter"], run["status"]) == ("anthropic", "ok")
    assert re.fullmatch(rf"busd-run\[pid=\d+,uid={os.getuid()}\]", run["started_by"])
    out = result.stdout.decode()
    assert out.startswith("▶ anthropic (")
    assert f"{TEXT}\n" in out
    assert '⏺ get_weather({"location":"San Francisco, CA"})\n' in out
    assert "✻ Worked for " in out
    assert out.endswith("ok · 69 in · 112 out\n")
    assert b"--watchdog ignored" in result.stderr  # the daemon keeps its own


async def test_an_unknown_adapter_is_a_usage_error(place: Place) -> None:
    result = await place.run("--adapter", "nope", "--json", "hi")
    assert result.returncode == 2
    assert b"unknown_adapter" in result.stderr
    assert result.stdout == b""


async def test_a_stalled_agent_is_stopped_by_the_watchdog_with_exit_124(place: Place) -> None:
    async with messages_api(stall_at=FIRST_TEXT) as api:
        result = await place.run(
            "--adapter", "anthropic", "--json", "--watchdog", "1", "Weather?",
            ANTHROPIC_BASE_URL=api.base_url,
        )  # fmt: skip
    assert result.returncode == 124, result.stderr.decode()
    finished = lines(result.stdout)[-1]["event"]
    assert finished["status"] == "timed_out"
    assert "watchdog" in finished["error"]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
async def test_a_signal_cancels_the_run_and_waits_for_its_summary(
    place: Place, signum: signal.Signals
) -> None:
    async with messages_api(stall_at=FIRST_TEXT + 1) as api:
        process = await trio.lowlevel.open_process(
            [*BUSD, "run", "--adapter", "anthropic", "--json", "Weather?"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=place.env | {"ANTHROPIC_BASE_URL": api.base_url},
        )
        assert process.stdout is not None
        assert process.stderr is not None
        output = bytearray()
        with trio.fail_after(30):
            while b'"stream.text.delta"' not in output:
                chunk = await process.stdout.receive_some()
                assert chunk, "busd run ended before any text"
                output += chunk
            process.send_signal(signum)
            while chunk := await process.stdout.receive_some():
                output += chunk
            errors = b""
            while chunk := await process.stderr.receive_some():
                errors += chunk
            await process.wait()
        await process.stdout.aclose()
        await process.stderr.aclose()
    assert process.returncode == 130, errors.decode()
    transcript = lines(bytes(output))
    kinds = [e["event"]["type"] for e in transcript]
    assert kinds[-1] == "busd.run.finished"
    assert "busd.run.cancelled" in kinds
    assert transcript[-1]["event"]["status"] == "cancelled"
    [stopped] = of_type(transcript, "stream.text.complete")
    assert (stopped["text"], stopped["stopped"]) == ("I'll check", True)
    assert f"{signum.name}: cancelling the run".encode() in errors
    assert b"Worked for" in errors
    assert b"cancelled" in errors
    assert list(place.tmp.iterdir()) == []


@pytest.mark.parametrize(
    ("rules", "outcome", "reason"),
    [
        (["--allow", "W*", "--deny", "Bash"], "allowed", "--allow W*"),
        (["--allow", "*", "--deny", "Write"], "denied", "--deny Write"),
    ],
)
async def test_permission_requests_are_answered_from_the_rules(
    place: Place, rules: list[str], outcome: str, reason: str
) -> None:
    cli, record = place.fake_claude()
    result = await place.run(
        "--adapter", "claude-code", "--json", *rules, "--option", f"cli_path={cli}",
        "write hello",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr.decode()
    transcript = lines(result.stdout)
    [asked] = of_type(transcript, "stream.permission.requested")
    [resolved] = of_type(transcript, "stream.permission.resolved")
    assert asked["tool"] == "Write"
    assert (resolved["request_id"], resolved["outcome"]) == (asked["request_id"], outcome)
    assert resolved["reason"] == reason
    pid = re.fullmatch(rf"busd-run\[pid=(\d+),uid={os.getuid()}\]", resolved["by"])
    assert pid is not None, resolved["by"]
    said = f"permission {outcome} Write (by busd-run (pid {pid[1]}): {reason})"
    assert said.encode() in result.stderr
    recorded = [json.loads(line) for line in record.read_text().splitlines()]
    [answer] = [entry["permission"] for entry in recorded if "permission" in entry]
    assert answer["response"]["behavior"] == ("allow" if outcome == "allowed" else "deny")


def workflow_step(name: str) -> str:
    """The ``run:`` script of the workflow step called ``name``."""
    text = WORKFLOW.read_text().splitlines()
    start = next(i for i, line in enumerate(text) if line.strip() == f"- name: {name}")
    run = next(i for i in range(start, len(text)) if text[i].strip() == "run: |")
    indent = len(text[run]) - len(text[run].lstrip())
    script = []
    for line in text[run + 1 :]:
        if line.strip() and len(line) - len(line.lstrip()) <= indent:
            break
        script.append(line)
    return textwrap.dedent("\n".join(script))


async def test_the_ci_example_runs_locally_against_a_stand_in(place: Place) -> None:
    workflow = WORKFLOW.read_text()
    for step in (
        "actions/setup-python@",
        "pip install busd",
        "ANTHROPIC_API_KEY: ${{ secrets.ANTHROPIC_API_KEY }}",
        "actions/upload-artifact@",
        "path: transcript.jsonl",
        "if: always()",
    ):
        assert step in workflow, step
    script = workflow_step("Run the agent")
    assert script.lstrip().startswith("busd run --adapter claude-code --json")
    cli, record = place.fake_claude()
    # The same command line, with `busd` pointed at this checkout and the stand-in CLI.
    shim = f'busd() {{ {shlex.join(BUSD)} "$@" --option cli_path={shlex.quote(str(cli))}; }}\n'
    with trio.fail_after(60):
        result = await trio.run_process(
            ["bash", "-e", "-c", shim + script],
            capture_stderr=True,
            check=False,
            env=place.env,
            cwd=place.root,
        )
    assert result.returncode == 0, result.stderr.decode()
    decoder = msgspec.json.Decoder(Catalog().envelope_type())  # valid JSONL of envelopes
    transcript: list[Envelope[Event]] = [
        decoder.decode(line) for line in (place.root / "transcript.jsonl").read_bytes().splitlines()
    ]
    assert isinstance(transcript[-1].event, RunFinished)
    assert transcript[-1].event.status == "ok"
    [resolved] = [e.event for e in transcript if isinstance(e.event, PermissionResolved)]
    assert resolved.outcome == "denied"  # Write: no rule, fails closed
    assert re.fullmatch(r"busd-run\[pid=\d+,uid=\d+\]", resolved.by or ""), resolved.by
    [started] = [json.loads(line) for line in record.read_text().splitlines()[:1]]
    assert started["cwd"] == str(place.root)  # --cwd defaults to where busd run was started


async def test_busd_run_says_when_its_answer_was_refused() -> None:
    """An answer that fails is said on stderr (it was dropped: the run then waited for ever)."""

    class Refusing:
        async def reply_permission(self, request_id: str, **_: object) -> None:
            raise RequestFailed("unknown_request", f"no pending permission {request_id!r}")

    errors: list[str] = []
    spec = HeadlessRun(adapter="claude-code", prompt="p", rules=ToolRules(allow=("Write",)))
    client: Any = Refusing()
    follower = _Follower(client, spec, out=lambda _: None, err=errors.append, pretty=False)
    await follower._answer(PermissionRequested(request_id="run-1/p", tool="Write"))
    said = "unknown_request: no pending permission 'run-1/p'"
    assert errors == [f"busd: could not answer run-1/p: {said}\n"]


def test_busd_run_into_a_reader_that_stops_early_finishes_without_a_traceback() -> None:
    """`busd run ... | head`: the pipe breaks; the run still ends ok, quietly."""
    argv = [*BUSD, "run", "--adapter", "claude-code", "--driver", "replay", "--allow", "*"]
    argv += ["--option", "recording=claude_code", "--option", "speed=1000", "--json", "hi"]
    run = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert run.stdout is not None
    run.stdout.read(10)  # the first few bytes, then the reader goes away
    run.stdout.close()
    _, stderr = run.communicate(timeout=60)
    assert run.returncode == 0, stderr
    assert b"Traceback" not in stderr
    assert b"BrokenPipe" not in stderr
