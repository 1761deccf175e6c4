"""The replay driver: recorded SDK streams played as live driven runs.

Over a real socket, with the installed adapter plugins: each bundled
recording ends with the usage its fixture's README says a correct adapter
derives, its permission requests wait for a frontend's answer, a denial
stops it, a cancel ends it. The timing is checked in virtual time, both in
the driver alone (a stand-in RunContext) and through the daemon.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import msgspec
import pytest
import trio
import trio.testing
from click.testing import CliRunner

from busd.cli import main as cli
from busd.client import Client, RequestFailed, connect
from busd.core.events import (
    Envelope,
    Event,
    PermissionRequested,
    PermissionResolved,
    RunCancelled,
    RunFinished,
    RunStarted,
    SessionError,
    SessionStart,
    TokenUsage,
    event_type,
)
from busd.daemon.hub import Daemon
from busd.plugins.adapters import Adapter
from busd.plugins.drivers import PermissionDecision, RunContext, RunRequest
from busd.plugins.manager import PluginManager
from busd.plugins.replay import (
    BUNDLED,
    FORMAT_VERSION,
    ReplayDriver,
    ReplayError,
    bundled_recording,
    load_recording,
    parse_recording,
)
from busd.wire import Runs
from tests.daemon_helpers import running_daemon

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "sdk"
RECORDINGS = ROOT / "busd" / "data" / "recordings"
GENERATOR = ROOT / "contrib" / "recordings" / "make_recordings.py"
CLIENT = "tester"
ME = f"{CLIENT}[pid={os.getpid()},uid={os.getuid()}]"  # what the daemon calls this process

ADAPTER = {"claude_code": "claude-code", "copilot": "copilot", "opencode": "opencode", "acp": "acp"}
"""The ``adapter=`` each bundled recording is started with."""

USAGE = {
    # README: the result line's totals, output 231, thinking 59, cost 0.120235 USD.
    "claude_code": TokenUsage(
        input_tokens=18,
        output_tokens=231,
        reasoning_tokens=59,
        cache_read_tokens=69266,
        cache_write_tokens=41926,
        cost_usd=0.120235,
    ),
    # README: per-call usage summed, output 98 + 12 = 110, reasoning 31.
    "copilot": TokenUsage(
        input_tokens=3895, output_tokens=110, reasoning_tokens=31, cache_read_tokens=46164
    ),
    # README: cumulative per message, output 154 + 7 = 161, reasoning 81, cost 0.0081171.
    "opencode": TokenUsage(
        input_tokens=20961,
        output_tokens=161,
        reasoning_tokens=81,
        cache_read_tokens=22143,
        cost_usd=0.0081171,
    ),
    # ACP reports no token usage: usage_update is context-window state.
    "acp": TokenUsage(),
}
PERMISSIONS = {"claude_code": 1, "copilot": 1, "opencode": 1, "acp": 2}


@pytest.fixture
def sock_path() -> Iterator[Path]:
    # Short, under /tmp: a socket path has a 107-byte limit that pytest's tmp_path can exceed.
    directory = Path(tempfile.mkdtemp(prefix="busd-r-", dir="/tmp"))
    yield directory / "bus.sock"
    shutil.rmtree(directory, ignore_errors=True)


def plugins() -> PluginManager:
    """The installed plugins, whatever BUSD_* variables the test runner has."""
    manager = PluginManager(environ={})
    manager.load_entry_points()
    return manager


def adapter(name: str) -> Adapter:
    return plugins().adapters()[name]


def fixture_lines(name: str) -> list[str]:
    return (FIXTURES / f"{name}.jsonl").read_text("utf-8").splitlines()


def is_stream(envelope: Envelope[Event]) -> bool:
    """A ``stream.*`` event: what the adapter (and the broker) published, not busd's own."""
    return event_type(envelope.event).startswith("stream.")


def stream_types(envelopes: list[Envelope[Event]]) -> list[str]:
    return [event_type(e.event) for e in envelopes if is_stream(e)]


def translated_by_line(
    name: str, *, until_permission: int | None = None, lines: int | None = None
) -> list[tuple[int, str]]:
    """``(line index, type)`` of what the adapter makes of the fixture, closed at the end.

    Up to its Nth permission request, or its first ``lines``, when told. A
    resolution the adapter derives for a request the broker answered is
    replaced by the broker's own, which comes right after the request.
    """
    translator = adapter(ADAPTER[name]).translator(session_id="s")
    out: list[tuple[int, str]] = []
    asked = 0
    number = 0
    for number, line in enumerate(fixture_lines(name)[:lines]):
        for item in translator.feed(json.loads(line), float(number)):
            if type(item.event) is PermissionResolved:
                continue
            out.append((number, event_type(item.event)))
            if type(item.event) is PermissionRequested:
                out.append((number, "stream.permission.resolved"))  # the broker's
                asked += 1
        if until_permission is not None and asked == until_permission:
            break
    closing = translator.finish(float(number + 1))
    out += [
        (number, event_type(e.event)) for e in closing if type(e.event) is not PermissionResolved
    ]
    return out


def translated(
    name: str, *, until_permission: int | None = None, lines: int | None = None
) -> list[str]:
    return [
        kind for _, kind in translated_by_line(name, until_permission=until_permission, lines=lines)
    ]


Answer = Callable[[Client, PermissionRequested], Awaitable[None]]


async def allow(client: Client, request: PermissionRequested) -> None:
    await client.reply_permission(request.request_id, allow=True, reason="looks fine")


async def deny(client: Client, request: PermissionRequested) -> None:
    await client.reply_permission(request.request_id, allow=False, reason="not today")


async def replay(
    client: Client,
    name: str,
    *,
    answer: Answer = allow,
    on_event: Callable[[Envelope[Event], str], Awaitable[None]] | None = None,
    arrivals: list[float] | None = None,
    request_id: str | None = None,
    **options: Any,
) -> tuple[str, list[Envelope[Event]]]:
    """Start ``name`` with the replay driver; its envelopes up to ``busd.run.finished``.

    ``arrivals`` gets the time each envelope arrived (``trio.current_time()``).
    """
    options.setdefault("recording", name)
    options.setdefault("speed", 0)
    async with client.subscribe([">"], window_ms=0, deltas="raw") as sub:
        started = await client.start_run(
            ADAPTER.get(name, name),
            "replay it",
            driver="replay",
            options=options,
            request_id=request_id,
        )
        run_id = started["run_id"]
        seen: list[Envelope[Event]] = []
        with trio.fail_after(30):
            async for batch in sub:
                for envelope in batch.events:
                    if envelope.run_id != run_id:
                        continue
                    seen.append(envelope)
                    if arrivals is not None:
                        arrivals.append(trio.current_time())
                    if on_event is not None:
                        await on_event(envelope, run_id)
                    if type(envelope.event) is PermissionRequested:
                        await answer(client, envelope.event)
                    if type(envelope.event) is RunFinished:
                        return run_id, seen
    raise AssertionError("the subscription ended before the run did")


def finished(seen: list[Envelope[Event]]) -> RunFinished:
    last = seen[-1].event
    assert isinstance(last, RunFinished)
    return last


def of(seen: list[Envelope[Event]], cls: type[Any]) -> list[Any]:
    return [e.event for e in seen if type(e.event) is cls]


# -- each bundled recording, through the daemon ------------------------------------------------


@pytest.mark.parametrize("name", BUNDLED)
async def test_a_bundled_recording_plays_as_a_live_run_with_the_fixture_usage(
    sock_path: Path, name: str
) -> None:
    async with (
        running_daemon(sock_path, plugins=plugins()),
        connect(sock_path, client=CLIENT) as client,
    ):
        run_id, seen = await replay(client, name)
        runs = await client.request(Runs())

    summary = finished(seen)
    assert (summary.status, summary.error) == ("ok", None)
    expected = USAGE[name]
    assert msgspec.structs.replace(summary.usage, cost_usd=None) == msgspec.structs.replace(
        expected, cost_usd=None
    )
    assert summary.usage.cost_usd == pytest.approx(expected.cost_usd)
    seqs = [e.seq for e in seen]
    assert seqs == sorted(seqs)
    assert len(set(seqs)) == len(seqs)
    assert type(seen[0].event).__name__ == "RunStarted"
    # Exactly what the adapter makes of the fixture, each permission answered by us.
    assert stream_types(seen) == translated(name)
    asked = of(seen, PermissionRequested)
    resolved = of(seen, PermissionResolved)
    assert len(asked) == len(resolved) == PERMISSIONS[name]
    assert all(r.request_id.startswith(f"{run_id}/") for r in asked)
    assert [(r.request_id, r.outcome, r.by, r.reason) for r in resolved] == [
        (r.request_id, "allowed", ME, "looks fine") for r in asked
    ]
    [summary_of_run] = [r for r in runs if r["run_id"] == run_id]
    assert (summary_of_run["adapter"], summary_of_run["driver"]) == (ADAPTER[name], "replay")


@pytest.mark.parametrize("name", BUNDLED)
async def test_a_denial_stops_the_replay_where_it_was(sock_path: Path, name: str) -> None:
    async with (
        running_daemon(sock_path, plugins=plugins()),
        connect(sock_path, client=CLIENT) as client,
    ):
        _, seen = await replay(client, name, answer=deny)

    summary = finished(seen)
    assert (summary.status, summary.error) == ("ok", None)  # the replay ended as it should
    [resolved] = of(seen, PermissionResolved)
    assert (resolved.outcome, resolved.by, resolved.reason) == ("denied", ME, "not today")
    # Nothing of the recording after the request: only what the adapter closes at the end.
    assert stream_types(seen) == translated(name, until_permission=1)
    assert len(of(seen, PermissionRequested)) == 1


async def test_cancelling_a_replay_while_it_waits_for_its_next_event(sock_path: Path) -> None:
    async def cancel_once_started(envelope: Envelope[Event], run_id: str) -> None:
        if type(envelope.event) is SessionStart:  # at 0 s; the next line is seconds away
            await client.cancel_run(run_id, reason="enough")

    async with (
        running_daemon(sock_path, plugins=plugins()),
        connect(sock_path, client=CLIENT) as client,
    ):
        _, seen = await replay(client, "claude_code", speed=0.001, on_event=cancel_once_started)

    summary = finished(seen)
    assert summary.status == "cancelled"
    [cancelled] = of(seen, RunCancelled)
    assert (cancelled.by, cancelled.reason) == (ME, "enough")
    assert stream_types(seen) == translated("claude_code", lines=1)
    assert stream_types(seen)[0] == "stream.session.start"


async def test_the_request_id_a_frontend_chose_is_on_every_run_event(sock_path: Path) -> None:
    """ac-dc correlates each callback by its own id, before it knows the run_id (issue 22)."""

    async def cancel_once_started(envelope: Envelope[Event], run_id: str) -> None:
        if type(envelope.event) is SessionStart:
            await client.cancel_run(run_id)

    async with (
        running_daemon(sock_path, plugins=plugins()),
        connect(sock_path, client=CLIENT) as client,
    ):
        _, seen = await replay(
            client, "claude_code", speed=0.001, on_event=cancel_once_started, request_id="q-7"
        )
        _, untagged = await replay(client, "claude_code")
    [started] = of(seen, RunStarted)
    [cancelled] = of(seen, RunCancelled)
    assert started.request_id == cancelled.request_id == finished(seen).request_id == "q-7"
    assert of(untagged, RunStarted)[0].request_id is None
    assert finished(untagged).request_id is None


async def test_cancelling_a_replay_while_it_waits_for_a_permission(sock_path: Path) -> None:
    async def cancel(client: Client, request: PermissionRequested) -> None:
        run_id = request.request_id.split("/")[0]
        await client.cancel_run(run_id)

    async with (
        running_daemon(sock_path, plugins=plugins()),
        connect(sock_path, client=CLIENT) as client,
    ):
        _, seen = await replay(client, "copilot", answer=cancel)

    assert finished(seen).status == "cancelled"
    [resolved] = of(seen, PermissionResolved)
    assert resolved.outcome == "cancelled"
    assert stream_types(seen) == translated("copilot", until_permission=1)


async def test_the_recorded_timing_drives_the_run_through_the_daemon(
    sock_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    """In virtual time, over the socket.

    The clock jumps only once the run's first stream event is here: before
    that the driver reads the recording in a worker thread, and a clock
    that jumps whenever every task waits would jump past that wait too.
    (The recording's first line, at 0 s, is its first stream event.)
    """
    at = [event.at for event in bundled_recording("claude_code").events]
    lines = [line for line, _ in translated_by_line("claude_code")]

    async def jump_once_playing(envelope: Envelope[Event], run_id: str) -> None:
        if is_stream(envelope):
            mock_clock.autojump_threshold = 0

    async with (
        running_daemon(sock_path, plugins=plugins()),
        connect(sock_path, client=CLIENT) as client,
    ):
        for speed in (1, 4):
            mock_clock.autojump_threshold = math.inf
            arrivals: list[float] = []
            _, seen = await replay(
                client, "claude_code", speed=speed, arrivals=arrivals, on_event=jump_once_playing
            )
            received = [t for t, e in zip(arrivals, seen, strict=True) if is_stream(e)]
            # Each stream event arrives at its line's recorded offset over the speed.
            expected = [at[line] / speed for line in lines]
            assert [t - received[0] for t in received] == pytest.approx(
                [t - expected[0] for t in expected], abs=1e-6
            )
            assert finished(seen).duration_s >= at[-1] / speed


# -- the driver alone, in virtual time ---------------------------------------------------------


class FakeContext:
    """A RunContext that translates with the real adapter and notes when each event was fed."""

    def __init__(
        self,
        name: str,
        options: dict[str, Any],
        answer: Callable[[PermissionRequested], Awaitable[PermissionDecision]],
    ) -> None:
        self.request = RunRequest(
            adapter=ADAPTER[name], prompt="p", session_id="s", options=options
        )
        self.run_id = "run-fake"
        self.translator = adapter(ADAPTER[name]).translator(session_id="s")
        self.answer = answer
        self.fed: list[float] = []
        self.asked: list[float] = []

    def feed(self, raw: object) -> list[Event]:
        self.fed.append(trio.current_time())
        return [e.event for e in self.translator.feed(raw, trio.current_time())]

    async def request_permission(self, request: PermissionRequested) -> PermissionDecision:
        self.asked.append(trio.current_time())
        return await self.answer(request)

    def publish(self, event: Event) -> None:
        raise AssertionError(f"this driver publishes nothing beside its SDK's events: {event}")

    def set_sdk_session(self, sdk_session_id: str) -> None:
        raise AssertionError("a replay has no SDK session to resume")


def answer_after(seconds: float) -> Callable[[PermissionRequested], Awaitable[PermissionDecision]]:
    async def answer(request: PermissionRequested) -> PermissionDecision:
        await trio.sleep(seconds)
        return PermissionDecision(outcome="allowed", by="person")

    return answer


@pytest.mark.parametrize("speed", [1, 2.5])
async def test_each_event_is_fed_at_its_recorded_offset_over_the_speed(
    autojump_clock: trio.testing.MockClock, speed: float
) -> None:
    context = FakeContext(
        "claude_code", {"recording": "claude_code", "speed": speed}, answer_after(0)
    )
    assert isinstance(context, RunContext)
    await ReplayDriver().run(context)

    offsets = [event.at / speed for event in bundled_recording("claude_code").events]
    start = context.fed[0]
    assert [t - start for t in context.fed] == pytest.approx(offsets, abs=1e-9)
    assert len(context.asked) == 1


async def test_the_clock_stops_while_a_permission_waits_for_its_answer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    context = FakeContext("copilot", {"recording": "copilot"}, answer_after(30.0))
    await ReplayDriver().run(context)

    events = bundled_recording("copilot").events
    [asked] = context.asked
    start = context.fed[0]
    expected = [e.at if start + e.at <= asked else e.at + 30.0 for e in events]
    assert [t - start for t in context.fed] == pytest.approx(expected, abs=1e-9)
    assert context.fed[-1] - start == pytest.approx(bundled_recording("copilot").duration + 30)


async def test_speed_zero_does_not_wait_at_all(autojump_clock: trio.testing.MockClock) -> None:
    context = FakeContext("acp", {"recording": "acp", "speed": 0}, answer_after(0))
    await ReplayDriver().run(context)

    assert len(context.fed) == len(fixture_lines("acp"))
    assert len(set(context.fed)) == 1  # all at the same instant
    assert len(context.asked) == 2


async def test_a_refused_permission_ends_the_replay_there(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def refuse(request: PermissionRequested) -> PermissionDecision:
        return PermissionDecision(outcome="denied", by="person")

    context = FakeContext("opencode", {"recording": "opencode"}, refuse)
    await ReplayDriver().run(context)

    lines = fixture_lines("opencode")
    asked_at = next(n for n, line in enumerate(lines) if '"permission.asked"' in line)
    assert len(context.fed) == asked_at + 1


# -- bad input: clear errors, and the daemon carries on ----------------------------------------


def header(**fields: Any) -> str:
    return json.dumps({"busd_recording": 1, "adapter": "copilot", **fields})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "is empty: it needs a header line"),
        ('{"at": 0, "raw": {}}\n', "line 1 is not a busd recording header"),
        ("not json\n", "line 1 is not a busd recording header"),
        (
            json.dumps({"busd_recording": 2, "adapter": "x"}),
            "is format 2; this busd plays format 1",
        ),
        (header() + '\n{"at": "soon", "raw": {}}', 'line 2 is not {"at": seconds, "raw": event}'),
        (header() + '\n{"at": 1}', "line 2 is not"),
        (header() + '\n{"at": -1, "raw": {}}', "line 2 is not"),
        (header() + '\n\n{"at": 2, "raw": {}}\n{"at": 1, "raw": {}}', "line 4: at 1 comes before"),
        (header() + "\n{broken", "line 2 is not"),
    ],
)
def test_a_broken_recording_is_refused_saying_where(text: str, message: str) -> None:
    with pytest.raises(ReplayError, match=r"^recording x\.jsonl") as raised:
        parse_recording(text.encode(), source="x.jsonl")
    assert message in str(raised.value)


def test_a_recording_parses_with_its_header_and_blank_lines_skipped() -> None:
    text = header(title="t", prompt="p", future="ignored") + '\n{"at": 0, "raw": {"a": 1}}\n\n'
    recording = parse_recording(text.encode(), source="x")
    assert (recording.header.adapter, recording.header.title, recording.header.prompt) == (
        "copilot",
        "t",
        "p",
    )
    assert recording.header.busd_recording == FORMAT_VERSION
    assert [(e.at, e.raw) for e in recording.events] == [(0.0, {"a": 1})]


def test_a_relative_path_is_read_from_the_runs_cwd(tmp_path: Path) -> None:
    (tmp_path / "mine.jsonl").write_text(header() + '\n{"at": 0.5, "raw": {}}\n')
    assert load_recording("mine.jsonl", cwd=str(tmp_path)).duration == 0.5
    assert load_recording(str(tmp_path / "mine.jsonl")).duration == 0.5
    with pytest.raises(ReplayError, match=r"cannot read recording .*No such file"):
        load_recording("missing.jsonl", cwd=str(tmp_path))


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        (
            "copilot",
            {"recording": "claude_code"},
            "recording claude_code is a 'claude-code' stream; start the run with"
            " adapter='claude-code', not 'copilot'",
        ),
        ("copilot", {"recording": "/nonexistent/r.jsonl"}, "cannot read recording"),
        ("copilot", {"recording": "BROKEN"}, "line 2 is not"),
        ("copilot", {}, "options.recording is required"),
        ("copilot", {"recording": 7}, "options.recording is required"),
        ("copilot", {"recording": "copilot", "speed": "fast"}, "options.speed must be a number"),
        ("copilot", {"recording": "copilot", "speed": -1}, "options.speed must be a number"),
        ("copilot", {"recording": "copilot", "speed": True}, "options.speed must be a number"),
        ("copilot", {"recording": "copilot", "sped": 2}, "unknown replay option 'sped'"),
    ],
)
async def test_bad_replay_input_ends_the_run_with_a_clear_error(
    sock_path: Path, name: str, options: dict[str, Any], message: str
) -> None:
    broken = sock_path.parent / "broken.jsonl"
    broken.write_text(header() + '\n{"at": "soon", "raw": {}}\n')
    if options.get("recording") == "BROKEN":
        options = {**options, "recording": str(broken)}
    async with (
        running_daemon(sock_path, plugins=plugins()),
        connect(sock_path, client=CLIENT) as client,
    ):
        async with client.subscribe([">"], window_ms=0) as sub:
            started = await client.start_run(name, "p", driver="replay", options=options)
            seen: list[Envelope[Event]] = []
            with trio.fail_after(30):
                async for batch in sub:
                    seen += [e for e in batch.events if e.run_id == started["run_id"]]
                    if of(seen, RunFinished):
                        break
        # Nothing else is lost: the daemon plays the next run as usual.
        _, after = await replay(client, "copilot")

    [summary] = of(seen, RunFinished)
    assert summary.status == "error"
    assert summary.error is not None
    assert summary.error.startswith("ReplayError: ")
    assert message in summary.error
    [error] = of(seen, SessionError)
    assert error.message == summary.error
    assert finished(after).status == "ok"


async def test_an_unknown_driver_or_adapter_is_refused_at_once(sock_path: Path) -> None:
    async with (
        running_daemon(sock_path, plugins=plugins()),
        connect(sock_path, client=CLIENT) as client,
    ):
        with pytest.raises(RequestFailed, match="unknown_driver") as unknown:
            await client.start_run("copilot", "p", driver="replya")
        assert "no driver 'replya'" in str(unknown.value)
        assert "replay" in str(unknown.value)  # the message lists the loaded drivers
        with pytest.raises(RequestFailed, match="unknown_adapter") as no_adapter:
            await client.start_run("nope", "p", driver="replay", options={"recording": "acp"})
        assert "no adapter 'nope'" in str(no_adapter.value)
        with pytest.raises(RequestFailed, match="unknown_adapter"):
            await client.start_run("nope", "p")  # no driver named: the adapter's own, as before
        assert await client.request(Runs()) == []


# -- the bundled recordings themselves -----------------------------------------------------------


def load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_recordings", GENERATOR)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", BUNDLED)
def test_a_bundled_recording_is_its_fixture_line_for_line_with_timing(name: str) -> None:
    text = (RECORDINGS / f"{name}.jsonl").read_text("utf-8")
    assert text == load_generator().build(name)  # reproducible from the committed script
    lines = text.splitlines()
    raw_lines = [line.split(', "raw": ', 1)[1][:-1] for line in lines[1:]]
    assert raw_lines == fixture_lines(name)  # every raw line, in order, byte for byte
    recording = bundled_recording(name)
    assert recording.header.adapter == ADAPTER[name]
    assert recording.header.adapter in plugins().adapters()
    assert recording.header.title
    assert recording.header.prompt
    assert [e.raw for e in recording.events] == [json.loads(line) for line in fixture_lines(name)]
    assert 6.0 <= recording.duration <= 15.0
    assert all(math.isfinite(e.at) for e in recording.events)


def test_the_recordings_name_their_provenance() -> None:
    readme = (RECORDINGS / "README.md").read_text("utf-8")
    for name in BUNDLED:
        assert f"`{name}.jsonl`" in readme
    assert "copied from tests/fixtures/sdk/" in readme


def test_an_unknown_bundled_name_is_not_guessed() -> None:
    with pytest.raises(ReplayError, match="no bundled recording 'claude-code'"):
        bundled_recording("claude-code")


# -- the built-in plugin ------------------------------------------------------------------------


def test_the_replay_driver_is_built_in_to_every_daemon() -> None:
    daemon = Daemon(plugins=PluginManager(environ={"BUSD_DISABLE_PLUGIN_AUTOLOAD": "1"}))
    assert daemon.status()["drivers"] == ["replay"]
    assert "busd.replay" in daemon.status()["plugins"]
    assert Daemon().status()["drivers"] == ["replay"]
    blocked = PluginManager(environ={"BUSD_BLOCK_PLUGINS": "busd.replay"})
    assert "replay" not in blocked.drivers()


def test_busd_plugins_lists_the_built_in_plugin_and_the_drivers() -> None:
    result = CliRunner().invoke(cli, ["plugins", "--json"])
    assert result.exit_code == 0, result.output
    listing = json.loads(result.stdout)
    [replay_plugin] = [p for p in listing["plugins"] if p["name"] == "busd.replay"]
    assert replay_plugin["distribution"] == "busd"
    assert replay_plugin["hooks"] == ["busd_drivers"]
    assert "replay" in listing["drivers"]
    text = CliRunner().invoke(cli, ["plugins"]).stdout
    assert "busd.replay" in text
    [drivers] = [line for line in text.splitlines() if line.startswith("drivers:")]
    assert "replay" in drivers


# -- busd run --driver replay ---------------------------------------------------------------------


async def busd_run(place: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BUSD_")}
    env["BUSD_SOCKET"] = str(place / "bus.sock")  # nobody listens: an in-process daemon
    with trio.fail_after(60):
        return await trio.run_process(
            [sys.executable, "-m", "busd", "run", "--json", *args],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env=env,
            cwd=place,
        )


async def test_busd_run_plays_a_recording_answering_from_its_rules(sock_path: Path) -> None:
    result = await busd_run(
        sock_path.parent,
        "--adapter", "claude-code", "--driver", "replay", "--allow", "Write",
        "--option", "recording=claude_code", "--option", "speed=0",
        "Create tmp/hello-allow.txt containing hello",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr.decode()
    transcript = [json.loads(line) for line in result.stdout.decode().splitlines()]
    [resolved] = [
        e["event"] for e in transcript if e["event"]["type"] == "stream.permission.resolved"
    ]
    assert resolved["outcome"] == "allowed"
    assert re.fullmatch(r"busd-run\[pid=\d+,uid=\d+\]", resolved["by"]), resolved["by"]
    assert transcript[-1]["event"]["usage"]["output_tokens"] == 231


async def test_busd_run_stops_a_recording_at_a_denied_tool(sock_path: Path) -> None:
    result = await busd_run(
        sock_path.parent,
        "--adapter", "claude-code", "--driver", "replay",
        "--option", "recording=claude_code", "--option", "speed=0", "hello",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr.decode()
    transcript = [json.loads(line) for line in result.stdout.decode().splitlines()]
    types = [e["event"]["type"] for e in transcript]
    assert "stream.text.delta" not in types  # the second model call never came
    assert b"permission denied Write" in result.stderr
    assert transcript[-1]["event"]["status"] == "ok"


async def test_busd_run_refuses_an_unknown_driver(sock_path: Path) -> None:
    result = await busd_run(sock_path.parent, "--adapter", "copilot", "--driver", "nope", "hi")
    assert result.returncode == 2
    assert b"unknown_driver" in result.stderr
