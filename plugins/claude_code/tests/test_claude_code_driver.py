"""The ``claude-code`` driver, through the real Claude Agent SDK, against a stand-in CLI.

``fake_claude.py`` speaks Claude Code's ``stream-json`` on stdio, replays the
recorded session and records what the SDK sent it (see its docstring).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from busd_claude_code import ClaudeCodeDriver, ClaudeCodeError, ClaudeCodeTranslator, busd_drivers
from busd_claude_code.driver import DEFAULT_MODEL, InvalidDriverOptions, _Run, agent_options

from busd import (
    Driver,
    Event,
    PermissionDecision,
    PermissionOption,
    PermissionRequested,
    RunRequest,
    SessionError,
    SessionIdle,
    ToolComplete,
    ToolStart,
    Usage,
)

pytest.importorskip("claude_agent_sdk")

from claude_agent_sdk import (
    PermissionResultAllow,
    StreamEvent,
    ToolPermissionContext,
)

FAKE = Path(__file__).with_name("fake_claude.py")
FIXTURE = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "sdk" / "claude_code.jsonl"
SESSION = "febcaa44-9f0f-4ae7-ad70-748009748653"
WRITE = "toolu_01XBi6iRqmAPhVzA57VVYt2U"
REQUEST = "db52ed9a-0c32-46db-8ed8-d0a8531c7460"
SUGGESTIONS = [{"type": "setMode", "mode": "acceptEdits", "destination": "session"}]

Answer = Callable[[PermissionRequested], Awaitable[PermissionDecision]]


async def allow(request: PermissionRequested) -> PermissionDecision:
    return PermissionDecision(outcome="allowed", option_id="allow", by="test")


class Context:
    """A RunContext that translates what it is fed and answers permissions from a script."""

    def __init__(self, request: RunRequest, answer: Answer = allow) -> None:
        self.request = request
        self.run_id = "run-1"
        self.translator = ClaudeCodeTranslator(session_id=request.session_id)
        self.answer = answer
        self.raw: list[Any] = []
        self.timeline: list[Event] = []  # translated events and permission requests, in order
        self.asked: list[PermissionRequested] = []
        self.sdk_sessions: list[str] = []
        self.on_feed: Callable[[Any], None] | None = None

    def feed(self, raw: object) -> list[Event]:
        self.raw.append(raw)
        events = [e.event for e in self.translator.feed(raw, trio.current_time())]
        self.timeline += events
        if self.on_feed is not None:
            self.on_feed(raw)
        return events

    async def request_permission(self, request: PermissionRequested) -> PermissionDecision:
        self.asked.append(request)
        self.timeline.append(request)
        return await self.answer(request)

    def publish(self, event: Event) -> None:
        raise AssertionError(f"this driver publishes nothing beside its SDK's events: {event}")

    def set_sdk_session(self, sdk_session_id: str) -> None:
        self.sdk_sessions.append(sdk_session_id)

    def finish(self) -> list[Event]:
        self.timeline += [e.event for e in self.translator.finish(trio.current_time())]
        return self.timeline

    def of(self, cls: type[Any]) -> list[Any]:
        return [e for e in self.timeline if type(e) is cls]


class Fake:
    """The stand-in's command line and what it recorded."""

    def __init__(self, tmp_path: Path, **env: str) -> None:
        self.record = tmp_path / "record.jsonl"
        self.cli = tmp_path / "claude"
        self.cli.write_text(
            f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(str(FAKE))} "$@"\n'
        )
        self.cli.chmod(0o755)
        self.env = {"FAKE_CLAUDE_RECORD": str(self.record), **env}

    def request(self, prompt: str = "write hello", **fields: Any) -> RunRequest:
        options = {"cli_path": str(self.cli), "env": self.env, **fields.pop("options", {})}
        return RunRequest(
            adapter="claude-code", prompt=prompt, session_id="busd-1", options=options, **fields
        )

    def entries(self, key: str) -> list[Any]:
        lines = self.record.read_text(encoding="utf-8").splitlines()
        return [entry[key] for entry in map(json.loads, lines) if key in entry]

    def assert_gone(self) -> None:
        """The CLI ended on its own terms and was reaped: no process is left."""
        assert self.entries("exit") != []
        (start,) = self.entries("pid")
        with pytest.raises(ProcessLookupError):
            os.kill(start, 0)


def fixture() -> list[dict[str, Any]]:
    with FIXTURE.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def within(fed: object, line: object) -> bool:
    """Everything the driver fed is in the CLI's line, with the same value."""
    if isinstance(fed, dict):
        return isinstance(line, dict) and all(
            k in line and within(v, line[k]) for k, v in fed.items()
        )
    if isinstance(fed, list):
        return isinstance(line, list) and len(fed) == len(line) and all(map(within, fed, line))
    return bool(fed == line)


# -- a whole run ------------------------------------------------------------------------


async def test_full_run_feeds_the_session_and_gives_the_recorded_totals(tmp_path: Path) -> None:
    fake = Fake(tmp_path)
    context = Context(fake.request())
    await ClaudeCodeDriver().run(context)
    events = context.finish()

    final = context.of(Usage)[-1].tokens
    assert final.output_tokens == 231
    assert final.reasoning_tokens == 59
    assert final.cost_usd == pytest.approx(0.120235)
    assert context.sdk_sessions == [SESSION]
    assert context.of(SessionIdle) == [SessionIdle(aborted=False)]
    assert fake.entries("permission") == [
        {
            "subtype": "success",
            "request_id": REQUEST,
            "response": {
                "behavior": "allow",
                "updatedInput": {
                    "file_path": "/home/u/proj/tmp/hello-allow.txt",
                    "content": "hello",
                },
            },
        }
    ]
    (done,) = context.of(ToolComplete)
    assert (done.tool_call_id, done.status) == (WRITE, "ok")
    assert events.index(context.of(ToolStart)[0]) < events.index(context.asked[0])
    fake.assert_gone()


async def test_what_is_fed_is_the_clis_stream_json_without_its_control_requests(
    tmp_path: Path,
) -> None:
    fake = Fake(tmp_path)
    context = Context(fake.request())
    await ClaudeCodeDriver().run(context)

    lines = [line for line in fixture() if line["type"] != "control_request"]
    assert [raw["type"] for raw in context.raw] == [line["type"] for line in lines]
    for raw, line in zip(context.raw, lines, strict=True):
        if line["type"] == "system":
            assert raw == line  # passed through as the CLI wrote it
        else:
            assert within(raw, line), raw  # rebuilt: nothing invented
        if line["type"] == "stream_event":
            assert raw["event"] == line["event"]  # the API event itself is the CLI's
    # what the adapter needs of the rebuilt lines survives
    assistant = [raw for raw in context.raw if raw["type"] == "assistant"]
    assert [a["message"]["id"] for a in assistant] == [
        "msg_011CedhYCFjGqQnSudUgUaty",
        "msg_011CedhYCFjGqQnSudUgUaty",
        "msg_011CedhYdQ2vLk3pFzR8Hn4T",
    ]
    result = context.raw[-1]
    assert result["usage"]["output_tokens"] == 231
    assert result["total_cost_usd"] == pytest.approx(0.120235)


async def test_the_prompt_reaches_the_cli_as_a_stream_json_user_message(tmp_path: Path) -> None:
    fake = Fake(tmp_path)
    await ClaudeCodeDriver().run(Context(fake.request("make hello.txt")))
    (user,) = fake.entries("user")
    assert user["message"] == {"role": "user", "content": "make hello.txt"}
    (init,) = fake.entries("init")
    assert init["subtype"] == "initialize"


# -- permissions ------------------------------------------------------------------------


async def test_the_permission_request_describes_the_tool_call(tmp_path: Path) -> None:
    fake = Fake(tmp_path)
    context = Context(fake.request())
    await ClaudeCodeDriver().run(context)
    assert context.asked == [
        PermissionRequested(
            request_id=WRITE,
            tool="Write",
            input={"file_path": "/home/u/proj/tmp/hello-allow.txt", "content": "hello"},
            tool_call_id=WRITE,
            title="tmp/hello-allow.txt",
            category="edit",
            annotations={"display_name": "Write", "permission_suggestions": SUGGESTIONS},
            options=[
                PermissionOption(id="allow", label="Allow", kind="allow_once"),
                PermissionOption(id="allow_always", label="Always allow", kind="allow_always"),
                PermissionOption(id="deny", label="Deny", kind="reject_once"),
            ],
        )
    ]


async def test_a_denied_tool_is_refused_and_the_turn_ends(tmp_path: Path) -> None:
    async def deny(request: PermissionRequested) -> PermissionDecision:
        return PermissionDecision(outcome="denied", option_id="deny", reason="not today")

    fake = Fake(tmp_path)
    context = Context(fake.request(), deny)
    await ClaudeCodeDriver().run(context)
    context.finish()

    (answer,) = fake.entries("permission")
    assert answer["request_id"] == REQUEST
    assert answer["response"] == {"behavior": "deny", "message": "not today"}
    (done,) = context.of(ToolComplete)
    assert (done.tool_call_id, done.status) == (WRITE, "error")
    assert context.of(SessionIdle) == [SessionIdle(aborted=False)]
    fake.assert_gone()


async def test_always_allow_applies_claude_codes_suggestions(tmp_path: Path) -> None:
    async def always(request: PermissionRequested) -> PermissionDecision:
        return PermissionDecision(outcome="allowed", option_id="allow_always")

    fake = Fake(tmp_path)
    await ClaudeCodeDriver().run(Context(fake.request(), always))
    (answer,) = fake.entries("permission")
    assert answer["response"]["behavior"] == "allow"
    assert answer["response"]["updatedPermissions"] == SUGGESTIONS


async def test_a_permission_request_waits_until_its_tool_call_was_announced() -> None:
    # The SDK answers control requests in another task than the one reading the
    # stream, so the request could otherwise overtake the call's own start.
    context = Context(RunRequest(adapter="claude-code", prompt="x", session_id="busd-1"))
    run = _Run(context)
    lines = [line for line in fixture() if line["type"] == "stream_event"][:12]

    def feed(line: dict[str, Any]) -> None:
        run.feed(StreamEvent(uuid=line["uuid"], session_id=SESSION, event=line["event"]))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run.can_use_tool, "Write", {}, ToolPermissionContext(tool_use_id=WRITE))
        for line in lines:
            if line["event"]["type"] == "content_block_stop" and line["event"]["index"] == 1:
                await trio.testing.wait_all_tasks_blocked()
                assert context.asked == []  # the call started streaming, but is not complete
            feed(line)
    (tool_start,) = context.of(ToolStart)
    assert context.timeline.index(tool_start) < context.timeline.index(context.asked[0])


async def test_a_permission_request_for_a_call_never_fed_is_asked_anyway(
    autojump_clock: trio.abc.Clock,
) -> None:
    context = Context(RunRequest(adapter="claude-code", prompt="x", session_id="busd-1"))
    run = _Run(context)
    with trio.fail_after(5):
        result = await run.can_use_tool("Write", {}, ToolPermissionContext(tool_use_id=WRITE))
    assert result == PermissionResultAllow()
    assert [r.tool_call_id for r in context.asked] == [WRITE]


# -- cancellation -----------------------------------------------------------------------


async def test_cancelling_mid_stream_interrupts_the_cli_and_ends_it(tmp_path: Path) -> None:
    fake = Fake(tmp_path, FAKE_CLAUDE_HOLD_AT="5")  # it holds after the first thinking delta
    context = Context(fake.request())
    cancelled_at = 0.0
    with trio.CancelScope() as scope:

        def cancel_on_thinking(raw: Any) -> None:
            nonlocal cancelled_at
            if raw.get("event", {}).get("delta", {}).get("type") == "thinking_delta":
                cancelled_at = time.monotonic()
                scope.cancel()

        context.on_feed = cancel_on_thinking
        await ClaudeCodeDriver().run(context)
    stopped_in = time.monotonic() - cancelled_at
    context.finish()

    assert scope.cancelled_caught
    assert stopped_in < 1.5
    (interrupt,) = fake.entries("interrupt")
    assert interrupt["request"] == {"subtype": "interrupt"}
    assert fake.entries("permission") == []
    # the interrupted turn's own result was read: the session says it was aborted
    assert context.raw[-1]["subtype"] == "error_during_execution"
    assert context.of(SessionIdle) == [SessionIdle(aborted=True)]
    fake.assert_gone()


async def test_cancelling_while_a_permission_is_pending_withdraws_it(tmp_path: Path) -> None:
    fake = Fake(tmp_path)
    context = Context(fake.request())
    withdrawn = trio.Event()
    with trio.CancelScope() as scope:

        async def never(request: PermissionRequested) -> PermissionDecision:
            scope.cancel()
            try:
                await trio.sleep_forever()
            finally:
                withdrawn.set()

        context.answer = never
        await ClaudeCodeDriver().run(context)
    context.finish()

    assert scope.cancelled_caught
    with trio.fail_after(1):
        await withdrawn.wait()  # the SDK cancelled the pending can_use_tool call
    assert fake.entries("interrupt") != []
    assert fake.entries("withdrawn") == [REQUEST]
    assert fake.entries("permission") == []  # never answered
    (done,) = context.of(ToolComplete)
    assert (done.tool_call_id, done.status) == (WRITE, "cancelled")
    assert context.of(SessionIdle) == [SessionIdle(aborted=True)]
    fake.assert_gone()


# -- errors -----------------------------------------------------------------------------


async def test_a_cli_that_fails_raises_with_its_stderr(tmp_path: Path) -> None:
    fake = Fake(tmp_path, FAKE_CLAUDE_FAIL="crash")
    with pytest.raises(ClaudeCodeError, match="exit code 3") as caught:
        await ClaudeCodeDriver().run(Context(fake.request()))
    assert "fake claude: cannot reach the API" in str(caught.value)
    fake.assert_gone()


async def test_an_error_result_raises_and_is_reported(tmp_path: Path) -> None:
    fake = Fake(tmp_path, FAKE_CLAUDE_FAIL="result")
    context = Context(fake.request())
    with pytest.raises(ClaudeCodeError, match="API Error: 401 invalid key"):
        await ClaudeCodeDriver().run(context)
    (error,) = context.of(SessionError)
    assert error.message == "API Error: 401 invalid key"
    fake.assert_gone()


async def test_a_cli_that_exits_without_a_result_raises(tmp_path: Path) -> None:
    fake = Fake(tmp_path, FAKE_CLAUDE_FAIL="silent")
    with pytest.raises(ClaudeCodeError, match="without a result"):
        await ClaudeCodeDriver().run(Context(fake.request()))
    fake.assert_gone()


async def test_unknown_or_reserved_options_are_refused_before_starting(tmp_path: Path) -> None:
    fake = Fake(tmp_path)
    with pytest.raises(InvalidDriverOptions, match="no_such_option"):
        await ClaudeCodeDriver().run(Context(fake.request(options={"no_such_option": 1})))
    with pytest.raises(InvalidDriverOptions, match="can_use_tool"):
        await ClaudeCodeDriver().run(Context(fake.request(options={"can_use_tool": None})))
    assert not fake.record.exists()


# -- options ----------------------------------------------------------------------------


async def test_request_fields_and_options_reach_the_cli(tmp_path: Path) -> None:
    fake = Fake(tmp_path)
    workdir = tmp_path / "work"
    workdir.mkdir()
    request = fake.request(
        model="claude-opus-4-1",
        system_prompt="Be brief.",
        cwd=str(workdir),
        permission_mode="acceptEdits",
        max_turns=3,
        resume="0b5e7f6a-1111-4222-8333-444455556666",
        options={"model": "overridden", "max_budget_usd": 1.5},
    )
    await ClaudeCodeDriver().run(Context(request))
    (argv,) = fake.entries("argv")
    flags = " ".join(argv)
    assert "--model claude-opus-4-1" in flags
    assert "--system-prompt Be brief." in flags
    assert "--permission-mode acceptEdits" in flags
    assert "--max-turns 3" in flags
    assert "--resume=0b5e7f6a-1111-4222-8333-444455556666" in flags
    assert "--max-budget-usd 1.5" in flags
    assert "--include-partial-messages" in flags
    assert "--permission-prompt-tool stdio" in flags
    assert fake.entries("cwd") == [str(workdir)]


async def test_defaults_are_the_documented_model_and_claude_codes_system_prompt(
    tmp_path: Path,
) -> None:
    fake = Fake(tmp_path)
    await ClaudeCodeDriver().run(Context(fake.request()))
    (argv,) = fake.entries("argv")
    assert argv[argv.index("--model") + 1] == DEFAULT_MODEL == "claude-sonnet-4-5"
    assert "--system-prompt" not in argv  # Claude Code's own prompt, not an empty one
    assert "--resume" not in " ".join(argv)


def test_options_can_turn_partial_messages_off() -> None:
    request = RunRequest(
        adapter="claude-code",
        prompt="x",
        session_id="s",
        options={"include_partial_messages": False},
    )
    assert agent_options(request).include_partial_messages is False


# -- registration -----------------------------------------------------------------------


def test_the_plugin_provides_the_driver() -> None:
    (driver,) = busd_drivers()
    assert isinstance(driver, Driver)
    assert (driver.name, driver.default_model) == ("claude-code", "claude-sonnet-4-5")


def test_the_plugin_loads_without_the_sdk() -> None:
    code = (
        "import sys; sys.modules['claude_agent_sdk'] = None\n"
        "import busd_claude_code\n"
        "print([d.name for d in busd_claude_code.busd_drivers()])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=10
    )
    assert out.stdout.strip() == "['claude-code']"
