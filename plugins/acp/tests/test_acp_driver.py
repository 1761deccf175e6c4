"""The ``acp`` driver, through the real SDK, against a stand-in agent subprocess.

``fake_acp_agent.py`` replays the agent's side of ``acp.jsonl``; a scripted
RunContext translates what the driver feeds with the ``acp`` adapter and
answers permission requests from a list.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import pytest
import trio
from busd_acp import AcpAdapter, AcpAgentError, AcpDriver, AcpOptionsError, busd_drivers, spawn

from busd import (
    Driver,
    Emitted,
    Event,
    PermissionDecision,
    PermissionRequested,
    PermissionResolved,
    RunContext,
    RunRequest,
    SessionContext,
    SessionIdle,
    SessionStart,
    TextDelta,
    ToolComplete,
    TurnEnd,
)

FIXTURE = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "sdk" / "acp.jsonl"
FAKE = Path(__file__).resolve().parent / "fake_acp_agent.py"
SESSION = "sess_abc123def456"
LINES = [json.loads(line) for line in FIXTURE.read_text().splitlines() if line]
FIRST = LINES[:16]
"""The first prompt, up to its ``end_turn`` answer."""
SECOND = LINES[16:]
"""The second prompt, cancelled while its permission request waits."""
WRITE_PROMPT = FIRST[0]["params"]["prompt"][0]["text"]
DELETE_PROMPT = SECOND[0]["params"]["prompt"][0]["text"]
ALLOW = PermissionDecision(outcome="allowed", option_id="once", by="test")
DENY = PermissionDecision(outcome="denied", by="test")

E = TypeVar("E", bound=Event)


class ScriptedContext:
    """A RunContext that translates what is fed and answers permissions from a script.

    An answer of ``None`` waits until the run is cancelled.
    """

    def __init__(self, request: RunRequest, answers: list[PermissionDecision | None]) -> None:
        self.request = request
        self.run_id = "run-1"
        self.raw: list[dict[str, Any]] = []
        self.emitted: list[Emitted] = []
        self.translator = AcpAdapter().translator(session_id=request.session_id)
        self.answers = answers
        self.asked: list[PermissionRequested] = []
        self.asking = trio.Event()
        self.sdk_sessions: list[str] = []

    def feed(self, raw: object) -> list[Event]:
        assert isinstance(raw, dict)
        self.raw.append(raw)
        emitted = self.translator.feed(raw, trio.current_time())
        self.emitted += emitted
        return [e.event for e in emitted]

    async def request_permission(self, request: PermissionRequested) -> PermissionDecision:
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

    def events(self) -> list[Event]:
        self.emitted += self.translator.finish(trio.current_time())
        return [e.event for e in self.emitted]

    def from_prompt(self) -> list[dict[str, Any]]:
        """What was fed from the ``session/prompt`` request on."""
        start = next(i for i, m in enumerate(self.raw) if m.get("method") == "session/prompt")
        return self.raw[start:]


def request(tmp_path: Path, prompt: str, *flags: str, **fields: Any) -> RunRequest:
    command = [sys.executable, str(FAKE), str(FIXTURE), str(tmp_path / "record.jsonl"), *flags]
    options = {"command": command, **fields.pop("options", {})}
    fields.setdefault("cwd", str(tmp_path))
    return RunRequest(adapter="acp", prompt=prompt, session_id="s1", options=options, **fields)


def recorded(tmp_path: Path) -> list[dict[str, Any]]:
    """What the fake agent wrote down: its pid and cwd, then each message it got."""
    lines = (tmp_path / "record.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def client_messages(tmp_path: Path, method: str) -> list[dict[str, Any]]:
    return [
        r["from_client"]
        for r in recorded(tmp_path)
        if "from_client" in r and r["from_client"].get("method") == method
    ]


def of(events: list[Event], cls: type[E]) -> list[E]:
    return [e for e in events if isinstance(e, cls)]


def untimed(events: list[Event]) -> list[Event]:
    """Events without the wall-clock durations and the session start (cwd differs)."""
    return [
        msgspec.structs.replace(e, duration_s=None) if hasattr(e, "duration_s") else e
        for e in events
        if not isinstance(e, SessionStart)
    ]


def assert_agent_gone(tmp_path: Path) -> None:
    pid = recorded(tmp_path)[0]["pid"]
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # reaped, not a zombie: the SDK waited for it


def without_ids(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in m.items() if k != "id"} for m in messages]


# -- a prompt end to end ---------------------------------------------------------------


async def test_first_prompt_feeds_the_fixture_exchange_as_it_crossed_the_wire(
    tmp_path: Path,
) -> None:
    context = ScriptedContext(request(tmp_path, WRITE_PROMPT), [ALLOW])
    await AcpDriver().run(context)

    assert context.from_prompt() == FIRST  # both directions, ids and all
    expected = fixture_events(FIRST)
    assert untimed(context.events()) == untimed(expected)
    assert context.sdk_sessions == [SESSION]
    assert_agent_gone(tmp_path)


async def test_the_agent_leads_its_own_process_group_and_leaves_nothing_behind(
    tmp_path: Path,
) -> None:
    """A terminal's Ctrl-C reaches busd only; what the agent started ends with the run.

    The agent starts a program that outlives it and ignores SIGTERM (as
    claude-agent-acp's Claude Code could, for a moment): once the agent has
    exited, the rest of its process group is ended too, SIGKILL after the
    shutdown timeout.
    """
    options = {"shutdown_timeout": 0.5}
    context = ScriptedContext(request(tmp_path, WRITE_PROMPT, "--orphan", options=options), [ALLOW])
    await AcpDriver().run(context)

    [started] = [r for r in recorded(tmp_path) if "pid" in r]
    [orphan] = [r["orphan"] for r in recorded(tmp_path) if "orphan" in r]
    assert started["sid"] == started["pgid"] == started["pid"] != os.getsid(0)
    assert_agent_gone(tmp_path)
    assert orphan != started["pid"]
    assert spawn.group_members(started["pid"]) == []  # the orphan too (a zombie counts as gone)


def fixture_events(lines: list[dict[str, Any]]) -> list[Event]:
    """The fixture lines as the adapter translates them, one second apart."""
    translator = AcpAdapter().translator(session_id="s1")
    out = [e for i, line in enumerate(lines) for e in translator.feed(line, float(i))]
    return [e.event for e in out + translator.finish(float(len(lines)))]


async def test_first_prompt_asks_once_and_the_agent_gets_the_selected_option(
    tmp_path: Path,
) -> None:
    context = ScriptedContext(request(tmp_path, WRITE_PROMPT), [ALLOW])
    await AcpDriver().run(context)
    events = context.events()

    published = of(events, PermissionRequested)
    assert context.asked == published  # the adapter's event, so the daemon sees one request
    assert published[0].request_id == "acp-0"
    answers = [r["permission_answer"] for r in recorded(tmp_path) if "permission_answer" in r]
    assert answers == [
        {
            "jsonrpc": "2.0",
            "id": 0,
            "result": {"outcome": {"outcome": "selected", "optionId": "once"}},
        }
    ]
    assert of(events, PermissionResolved) == [
        PermissionResolved(request_id="acp-0", outcome="allowed", option_id="once")
    ]
    [tool] = of(events, ToolComplete)
    assert (tool.name, tool.status, tool.output) == ("write", "ok", "Wrote file successfully.")
    assert of(events, SessionContext) == [SessionContext(used=11524, window=200000)]
    assert of(events, TurnEnd)[-1] == TurnEnd(turn_id="acp-prompt-2", finish_reason="end_turn")


async def test_denied_permission_selects_the_reject_option_and_the_tool_fails(
    tmp_path: Path,
) -> None:
    context = ScriptedContext(request(tmp_path, WRITE_PROMPT), [DENY])
    await AcpDriver().run(context)
    events = context.events()

    answers = [r["permission_answer"] for r in recorded(tmp_path) if "permission_answer" in r]
    assert [a["result"] for a in answers] == [
        {"outcome": {"outcome": "selected", "optionId": "reject"}}
    ]
    assert of(events, PermissionResolved) == [
        PermissionResolved(request_id="acp-0", outcome="denied", option_id="reject")
    ]
    assert [(t.name, t.status) for t in of(events, ToolComplete)] == [("write", "error")]
    assert of(events, TurnEnd)[-1].finish_reason == "end_turn"


# -- cancellation ------------------------------------------------------------------------


async def test_cancel_mid_permission_sends_session_cancel_then_answers_cancelled(
    tmp_path: Path,
) -> None:
    context = ScriptedContext(request(tmp_path, DELETE_PROMPT, resume=SESSION), [None])
    scope = trio.CancelScope()

    async def run() -> None:
        with scope:
            await AcpDriver().run(context)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        await context.asking.wait()
        scope.cancel()

    assert scope.cancelled_caught  # run() re-raised Cancelled
    assert client_messages(tmp_path, "session/load")[0]["params"]["sessionId"] == SESSION
    assert client_messages(tmp_path, "session/cancel") == [
        {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": SESSION}}
    ]
    [answer] = [r for r in recorded(tmp_path) if "permission_answer" in r]
    assert answer["permission_answer"]["result"] == {"outcome": {"outcome": "cancelled"}}
    assert answer["cancel_seen_first"]
    # The agent's answer to the cancelled prompt was still fed: the turn ends as ACP says.
    assert without_ids(context.from_prompt()) == without_ids(SECOND)
    events = context.events()
    assert of(events, TurnEnd) == [TurnEnd(turn_id="acp-prompt-2", finish_reason="cancelled")]
    assert of(events, SessionIdle)[-1] == SessionIdle(aborted=True)
    assert [(t.tool_call_id, t.status) for t in of(events, ToolComplete)] == [
        ("call_1d2e3f", "error")
    ]
    assert_agent_gone(tmp_path)


async def test_agent_ignoring_cancel_is_terminated_after_cancel_timeout(tmp_path: Path) -> None:
    options = {"cancel_timeout": 0.3}
    run = request(tmp_path, DELETE_PROMPT, "--stuck", resume=SESSION, options=options)
    context = ScriptedContext(run, [None])
    scope = trio.CancelScope()

    async def go() -> None:
        with scope:
            await AcpDriver().run(context)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(go)
        await context.asking.wait()
        cancelled_at = trio.current_time()
        scope.cancel()
    waited = trio.current_time() - cancelled_at

    assert scope.cancelled_caught
    assert 0.3 <= waited < 2.0  # cancel_timeout, then SIGTERM: not the 2 s shutdown wait
    assert len(client_messages(tmp_path, "session/cancel")) == 1
    assert of(context.events(), TurnEnd) == []  # the agent never answered the prompt
    assert_agent_gone(tmp_path)


class CancelOnSession(ScriptedContext):
    """Cancels the run as soon as the agent's session exists, before the prompt is sent."""

    def __init__(self, request: RunRequest, scope: trio.CancelScope) -> None:
        super().__init__(request, [])
        self.scope = scope

    def publish(self, event: Event) -> None:
        raise AssertionError(f"this driver publishes nothing beside its SDK's events: {event}")

    def set_sdk_session(self, sdk_session_id: str) -> None:
        super().set_sdk_session(sdk_session_id)
        self.scope.cancel()


async def test_cancel_before_the_prompt_ends_the_conversation(tmp_path: Path) -> None:
    scope = trio.CancelScope()
    run = request(tmp_path, WRITE_PROMPT, "--hold-mode", permission_mode="acceptEdits")
    context = CancelOnSession(run, scope)  # the driver waits for session/set_mode meanwhile
    with scope:
        await AcpDriver().run(context)

    assert scope.cancelled_caught
    assert context.sdk_sessions == [SESSION]
    assert len(client_messages(tmp_path, "session/set_mode")) == 1
    assert client_messages(tmp_path, "session/prompt") == []
    assert client_messages(tmp_path, "session/cancel") == []  # no prompt to cancel
    assert_agent_gone(tmp_path)


async def test_resumed_permission_request_names_the_tool_from_the_earlier_tool_call(
    tmp_path: Path,
) -> None:
    context = ScriptedContext(request(tmp_path, DELETE_PROMPT, resume=SESSION), [None])
    with trio.move_on_after(10):  # a bound for a broken driver, not a wait
        async with trio.open_nursery() as nursery:
            nursery.start_soon(AcpDriver().run, context)
            await context.asking.wait()
            nursery.cancel_scope.cancel()

    # The request only names the tool call; the adapter's event knows what it runs.
    [asked] = context.asked
    assert (asked.request_id, asked.tool, asked.input) == (
        "acp-0",
        "rm /tmp/p4/p4-check.txt",
        {"command": "rm /tmp/p4/p4-check.txt"},
    )
    # History replayed by session/load is not fed again.
    assert not [e for e in context.events() if isinstance(e, TextDelta)]
    assert not [m for m in context.raw if "user_message_chunk" in json.dumps(m)]


# -- errors ----------------------------------------------------------------------------------


async def test_agent_exiting_mid_prompt_raises_with_its_exit_code_and_stderr(
    tmp_path: Path,
) -> None:
    context = ScriptedContext(request(tmp_path, WRITE_PROMPT, "--crash"), [])
    with pytest.raises(AcpAgentError, match=r"(?s)exit code 3.*provider is unreachable") as caught:
        await AcpDriver().run(context)
    assert isinstance(caught.value.__cause__, ConnectionError)
    assert context.from_prompt() == FIRST[:2]  # what it said before dying was fed
    assert_agent_gone(tmp_path)


async def test_missing_agent_command_raises_a_clear_error(tmp_path: Path) -> None:
    options = {"command": [str(tmp_path / "no-such-agent")]}
    context = ScriptedContext(request(tmp_path, WRITE_PROMPT, options=options), [])
    with pytest.raises(AcpAgentError, match="cannot start the agent"):
        await AcpDriver().run(context)
    assert context.raw == []


@pytest.mark.parametrize(
    ("options", "complaint"),
    [
        ({}, "command"),
        ({"command": []}, "command"),
        ({"command": ["x"], "comand": ["x"]}, "comand"),
        ({"command": ["x"], "cancel_timeout": -1}, "cancel_timeout"),
    ],
)
async def test_bad_options_are_refused_before_the_agent_starts(
    options: dict[str, Any], complaint: str
) -> None:
    bad = RunRequest(adapter="acp", prompt="hi", session_id="s1", options=options)
    with pytest.raises(AcpOptionsError, match=complaint):
        await AcpDriver().run(ScriptedContext(bad, []))


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ((), "no command"),
        (("--option", "command=opencode"), "command 'opencode' is not a JSON list"),
    ],
)
def test_busd_run_without_a_command_says_how_to_give_one(
    tmp_path: Path, given: tuple[str, ...], said: str
) -> None:
    """As the user sees it: one line on stderr, exit 1, the same words as the run's error."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "BUSD_SOCKET": str(tmp_path / "x")}
    busd = Path(sys.executable).with_name("busd")
    done = subprocess.run(
        [str(busd), "run", "--json", "--adapter", "acp", *given, "hi"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    events = [json.loads(line)["event"] for line in done.stdout.splitlines()]
    (error,) = [e["error"] for e in events if e["type"] == "busd.run.finished"]
    assert error == (
        f"AcpOptionsError: the acp driver needs the agent's argv: {said}; "
        """give --option 'command=["opencode","acp"]' (the program and its arguments)"""
    )
    assert done.returncode == 1
    assert [x for x in done.stderr.splitlines() if x.startswith("busd: error:")] == [
        f"busd: error: {error}"
    ]
    assert "Traceback" not in done.stderr


# -- what reaches the agent -------------------------------------------------------------------


async def test_cwd_env_model_mode_system_prompt_and_options_reach_the_agent(
    tmp_path: Path,
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    servers = [{"name": "files", "command": "/bin/true", "args": [], "env": []}]
    run = request(
        tmp_path,
        WRITE_PROMPT,
        cwd=str(work),
        model="fake-large",
        system_prompt="Be brief.",
        permission_mode="acceptEdits",
        options={
            "env": {"BUSD_FAKE_MARK": "m-1"},
            "mcp_servers": servers,
            "session_meta": {"trace": "t-1"},
        },
    )
    context = ScriptedContext(run, [ALLOW])
    await AcpDriver().run(context)

    start = recorded(tmp_path)[0]
    assert (start["cwd"], start["mark"]) == (str(work), "m-1")
    [init] = client_messages(tmp_path, "initialize")
    assert init["params"]["clientInfo"]["name"] == "busd"
    assert init["params"]["clientCapabilities"]["fs"] == {
        "readTextFile": True,
        "writeTextFile": True,
    }
    [new] = client_messages(tmp_path, "session/new")
    assert new["params"] == {
        "cwd": str(work),
        "mcpServers": servers,
        "_meta": {"trace": "t-1", "systemPrompt": "Be brief."},
    }
    [model] = client_messages(tmp_path, "session/set_config_option")
    assert model["params"] == {"sessionId": SESSION, "configId": "model", "value": "fake-large"}
    [mode] = client_messages(tmp_path, "session/set_mode")
    assert mode["params"] == {"sessionId": SESSION, "modeId": "acceptEdits"}
    assert of(context.events(), TurnEnd)[-1].finish_reason == "end_turn"


async def test_default_model_leaves_the_agent_its_own(tmp_path: Path) -> None:
    run = request(tmp_path, WRITE_PROMPT, model=AcpDriver.default_model)
    await AcpDriver().run(ScriptedContext(run, [ALLOW]))
    assert client_messages(tmp_path, "session/set_config_option") == []
    assert client_messages(tmp_path, "session/set_mode") == []


async def test_agent_reads_and_writes_files_through_the_client(tmp_path: Path) -> None:
    target = tmp_path / "out" / "p4-check.txt"
    context = ScriptedContext(request(tmp_path, WRITE_PROMPT, "--fs", str(target)), [ALLOW])
    await AcpDriver().run(context)

    assert target.read_text() == "okra\nfig\n"
    record = {k: v for r in recorded(tmp_path) for k, v in r.items() if k.startswith("fs_")}
    assert record["fs_write"]["result"] == {}
    assert record["fs_read"]["result"] == {"content": "fig\n"}
    assert record["fs_missing"]["error"]["code"] == -32002  # resource not found
    assert context.from_prompt()[1]["method"] == "fs/write_text_file"  # fed like the rest


def test_plugin_registers_the_driver_paired_with_the_adapter() -> None:
    [driver] = busd_drivers()
    assert isinstance(driver, Driver)
    assert (driver.name, driver.default_model) == (AcpAdapter.name, "")
    context = ScriptedContext(RunRequest(adapter="acp", prompt="p", session_id="s"), [])
    assert isinstance(context, RunContext)
