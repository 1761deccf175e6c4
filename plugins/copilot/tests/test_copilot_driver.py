"""The copilot driver, run through the real Copilot SDK against a fake Copilot CLI.

``fake_copilot.py`` is started by the SDK as its CLI and replays the recorded
``copilot.jsonl`` session over the SDK's JSON-RPC; it writes every request it
gets to a record file, so each test sees what reached the CLI.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio
from busd_copilot import (
    CopilotAdapter,
    CopilotDriver,
    CopilotRunError,
    MaxTurnsExceeded,
    busd_drivers,
)

from busd import (
    Driver,
    Event,
    PermissionDecision,
    PermissionRequested,
    PermissionResolved,
    RunRequest,
    SessionContext,
    SessionIdle,
    TextDelta,
    ToolComplete,
    Usage,
)

pytest.importorskip("copilot")

FIXTURE = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "sdk" / "copilot.jsonl"
FAKE = Path(__file__).resolve().with_name("fake_copilot.py")

E = TypeVar("E", bound=Event)

ANSWER = "session.permissions.handlePendingPermissionRequest"
ALLOW = PermissionDecision(outcome="allowed", option_id="approve-once", by="tester")


@pytest.fixture(autouse=True)
def no_errors_logged(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """The SDK logs (and drops) what it cannot parse: the fake must speak its schema."""
    yield
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


class ScriptedContext:
    """A RunContext that translates what it is fed and answers permissions from a script."""

    def __init__(
        self, request: RunRequest, answers: list[PermissionDecision | None] | None = None
    ) -> None:
        self.request = request
        self.run_id = "run-1"
        self.raws: list[object] = []
        self.events: list[Event] = []
        self.asked: list[PermissionRequested] = []
        self.sdk_sessions: list[str] = []
        self.answers = list(answers or [])
        self.seen: defaultdict[type[Event], trio.Event] = defaultdict(trio.Event)
        self.asking = trio.Event()
        self._translator = CopilotAdapter().translator(session_id=request.session_id)

    def feed(self, raw: object) -> list[Event]:
        trio.lowlevel.current_task()  # fed in Trio, never on the SDK's threads
        self.raws.append(raw)
        events = [item.event for item in self._translator.feed(raw, trio.current_time())]
        for event in events:
            self.events.append(event)
            self.seen[type(event)].set()
        return events

    async def request_permission(self, request: PermissionRequested) -> PermissionDecision:
        """The next scripted answer; ``None`` is nobody answering."""
        self.asked.append(request)
        self.asking.set()
        answer = self.answers.pop(0)
        if answer is None:
            await trio.sleep_forever()
        assert answer is not None
        return answer

    def publish(self, event: Event) -> None:
        raise AssertionError(f"this driver publishes nothing beside its SDK's events: {event}")

    def set_sdk_session(self, sdk_session_id: str) -> None:
        self.sdk_sessions.append(sdk_session_id)

    def of(self, kind: type[E]) -> list[E]:
        return [e for e in self.events if isinstance(e, kind)]


class Record:
    """What the fake CLI wrote down."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def entries(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines()]

    def params(self, method: str) -> list[dict[str, Any]]:
        return [e["params"] for e in self.entries() if e.get("method") == method]

    def answers(self) -> list[dict[str, Any]]:
        return [e["answer"] for e in self.entries() if "answer" in e]

    def pid(self) -> int:
        return next(int(e["pid"]) for e in self.entries() if "pid" in e)


def fake_cli(tmp_path: Path, scenario: str = "full") -> tuple[CopilotDriver, Record]:
    record = tmp_path / "cli-record.jsonl"
    args = [str(FAKE), "--fixture", str(FIXTURE), "--record", str(record), "--scenario", scenario]
    return CopilotDriver(cli_path=sys.executable, cli_args=args), Record(record)


def request(**fields: Any) -> RunRequest:
    return RunRequest(
        adapter="copilot",
        prompt="Find where login is implemented",
        session_id="sess-1",
        model=fields.pop("model", CopilotDriver.default_model),
        **fields,
    )


def assert_cli_gone(record: Record) -> None:
    with pytest.raises(ProcessLookupError):  # exited and reaped
        os.kill(record.pid(), 0)


def sdk_threads() -> set[threading.Thread]:
    """Threads other than Trio's idle thread cache."""
    return {t for t in threading.enumerate() if not t.name.startswith("Trio thread")}


async def test_a_full_run_feeds_the_recorded_session_through_the_sdk(tmp_path: Path) -> None:
    driver, record = fake_cli(tmp_path)
    context = ScriptedContext(request(), [ALLOW])
    before = sdk_threads()

    await driver.run(context)

    assert all(type(raw).__name__ == "SessionEvent" for raw in context.raws)  # the SDK's objects
    assert len(context.raws) == 22
    usage = context.of(Usage)[-1].tokens
    assert (usage.output_tokens, usage.reasoning_tokens) == (110, 31)
    assert context.of(SessionContext) == [SessionContext(used=18234, window=200000)]
    assert context.of(SessionIdle) == [SessionIdle()]
    assert [t.status for t in context.of(ToolComplete)] == ["ok"]
    # busd was asked once, about the tool the adapter published, and the CLI got the answer.
    [asked] = context.asked
    assert (asked.request_id, asked.tool, asked.input["command"]) == (
        "perm-7f3a",
        "bash",
        "grep -rn login src/",
    )
    assert asked in context.of(PermissionRequested)
    assert record.answers() == [{"kind": "approve-once"}]
    assert [p["requestId"] for p in record.params(ANSWER)] == ["perm-7f3a"]
    assert [r.outcome for r in context.of(PermissionResolved)] == ["allowed"]
    # The SDK session is remembered for a later resume, and everything is cleaned up.
    [created] = record.params("session.create")
    assert context.sdk_sessions == [created["sessionId"]]
    assert record.params("session.abort") == []
    assert_cli_gone(record)
    assert sdk_threads() <= before
    # The CLI led a session of its own: a terminal's Ctrl-C on busd run reaches busd only.
    [started] = [e for e in record.entries() if "sid" in e]
    assert started["sid"] == started["pid"] != os.getsid(0)


@pytest.mark.parametrize(
    ("decision", "sent", "outcome", "tool_status"),
    [
        (
            PermissionDecision(outcome="denied", option_id="reject", by="tester", reason="no"),
            {"kind": "reject", "feedback": "no"},
            "denied",
            "error",
        ),
        (
            PermissionDecision(outcome="allowed", option_id="approve-for-session", by="tester"),
            {
                "kind": "approve-for-session",
                "approval": {"kind": "commands", "commandIdentifiers": ["grep"]},
            },
            "allowed",
            "ok",
        ),
        (
            PermissionDecision(outcome="cancelled", by="busd"),
            {"kind": "user-not-available"},
            "denied",
            "error",
        ),
    ],
)
async def test_the_decision_reaches_the_cli_in_the_sdks_terms(
    tmp_path: Path,
    decision: PermissionDecision,
    sent: dict[str, Any],
    outcome: str,
    tool_status: str,
) -> None:
    driver, record = fake_cli(tmp_path)
    context = ScriptedContext(request(), [decision])

    await driver.run(context)

    assert record.answers() == [sent]
    assert [r.outcome for r in context.of(PermissionResolved)] == [outcome]
    assert [t.status for t in context.of(ToolComplete)] == [tool_status]
    assert context.of(SessionIdle) == [SessionIdle()]


async def test_cancelling_the_run_aborts_the_session_and_stops_the_cli(tmp_path: Path) -> None:
    driver, record = fake_cli(tmp_path, "hang")
    context = ScriptedContext(request())
    before = sdk_threads()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(driver.run, context)
        await context.seen[TextDelta].wait()  # the fake now waits for the abort
        started = trio.current_time()
        nursery.cancel_scope.cancel()

    assert trio.current_time() - started < 2
    assert len(record.params("session.abort")) == 1
    assert context.of(SessionIdle) == [SessionIdle(aborted=True)]  # the SDK's abort, fed
    assert_cli_gone(record)
    assert sdk_threads() <= before


async def test_cancelling_while_busd_waits_for_a_permission_answer(tmp_path: Path) -> None:
    driver, record = fake_cli(tmp_path)
    context = ScriptedContext(request(), [None])
    before = sdk_threads()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(driver.run, context)
        await context.asking.wait()
        started = trio.current_time()
        nursery.cancel_scope.cancel()

    assert trio.current_time() - started < 2
    assert [a.request_id for a in context.asked] == ["perm-7f3a"]
    assert record.params(ANSWER) == []
    assert len(record.params("session.abort")) == 1
    assert_cli_gone(record)
    assert sdk_threads() <= before


@pytest.mark.parametrize(
    ("scenario", "message"),
    [("error", "model error: rate limited"), ("crash", "the fake CLI crashed")],
)
async def test_an_agent_error_or_a_dead_cli_fails_the_run(
    tmp_path: Path, scenario: str, message: str
) -> None:
    driver, record = fake_cli(tmp_path, scenario)
    context = ScriptedContext(request())

    with pytest.raises(CopilotRunError, match=message):
        await driver.run(context)

    assert_cli_gone(record)


async def test_the_options_reach_the_cli(tmp_path: Path) -> None:
    driver, record = fake_cli(tmp_path)
    context = ScriptedContext(
        request(
            model="gpt-5",
            system_prompt="Answer in one line.",
            cwd=str(tmp_path),
            permission_mode="plan",
            options={"reasoning_effort": "high", "send": {"display_prompt": "find login"}},
        ),
        [ALLOW],
    )

    await driver.run(context)

    [created] = record.params("session.create")
    assert created["model"] == "gpt-5"
    assert created["systemMessage"] == {"mode": "append", "content": "Answer in one line."}
    assert created["workingDirectory"] == str(tmp_path)
    assert created["reasoningEffort"] == "high"
    assert created["requestPermission"] is True
    assert created["streaming"] is True  # deltas for `busd run --pretty` and every frontend
    [sent] = record.params("session.send")
    assert sent["prompt"] == "Find where login is implemented"
    assert (sent["agentMode"], sent["displayPrompt"]) == ("plan", "find login")


async def test_a_run_may_turn_streaming_off(tmp_path: Path) -> None:
    driver, record = fake_cli(tmp_path)
    await driver.run(ScriptedContext(request(options={"streaming": False}), [ALLOW]))
    [created] = record.params("session.create")
    assert created["streaming"] is False


async def test_a_later_run_resumes_the_sdk_session(tmp_path: Path) -> None:
    driver, record = fake_cli(tmp_path)
    context = ScriptedContext(request(resume="4db6a695-04ee-466f-b26b-74dae52ad74c"), [ALLOW])

    await driver.run(context)

    assert [p["sessionId"] for p in record.params("session.resume")] == [
        "4db6a695-04ee-466f-b26b-74dae52ad74c"
    ]
    assert record.params("session.create") == []
    assert context.sdk_sessions == ["4db6a695-04ee-466f-b26b-74dae52ad74c"]


async def test_max_turns_aborts_when_the_agent_wants_another_call(tmp_path: Path) -> None:
    driver, record = fake_cli(tmp_path)
    context = ScriptedContext(request(max_turns=1), [ALLOW])

    with pytest.raises(MaxTurnsExceeded):
        await driver.run(context)

    assert len(record.params("session.abort")) == 1
    assert_cli_gone(record)


async def test_max_turns_that_suffice_let_the_run_finish(tmp_path: Path) -> None:
    driver, _ = fake_cli(tmp_path)
    context = ScriptedContext(request(max_turns=2), [ALLOW])

    await driver.run(context)

    assert context.of(Usage)[-1].tokens.output_tokens == 110


async def test_an_unknown_permission_mode_fails_before_the_cli_starts(tmp_path: Path) -> None:
    driver, record = fake_cli(tmp_path)

    with pytest.raises(ValueError, match="permission_mode"):
        await driver.run(ScriptedContext(request(permission_mode="bypassPermissions")))

    assert record.entries() == []


def test_the_plugin_provides_the_copilot_driver() -> None:
    [driver] = busd_drivers()
    assert isinstance(driver, Driver)
    assert (driver.name, driver.default_model) == ("copilot", "claude-sonnet-4.5")
