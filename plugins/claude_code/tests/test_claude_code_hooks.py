"""Claude Code's hook payloads, answers and settings, without a daemon.

The payloads are those Claude Code 2.1.332 writes on a hook's stdin, as
logged from the bundled CLI (``hooks_stand_in.py`` as its model, a logging
hook for every event): their keys and values are the CLI's, only the paths
and ids shortened.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from busd_claude_code.hooks import ADAPTER, CLIP, ClaudeCodeHooks, HooksAdapter
from busd_claude_code.hooks_settings import REPORTED, is_ours

from busd import (
    SessionIdle,
    SessionInfo,
    SessionStart,
    ToolComplete,
    ToolStart,
    TurnStart,
    UserPrompt,
)
from busd.plugins.agenthooks import Ask, HookCommands, Report, Settled

BASE: dict[str, Any] = {
    "session_id": "fd60a077",
    "transcript_path": "/h/.claude/projects/-w/fd60a077.jsonl",
}
PRE: dict[str, Any] = {
    **BASE,
    "cwd": "/w",
    "prompt_id": "6b85",
    "permission_mode": "default",
    "hook_event_name": "PreToolUse",
    "tool_name": "Bash",
    "tool_input": {"command": "echo hooked > hooked.txt", "description": "Write hooked.txt"},
    "tool_use_id": "toolu_hooked_1",
}
PERMISSION: dict[str, Any] = {
    **BASE,
    "cwd": "/w",
    "permission_mode": "default",
    "hook_event_name": "PermissionRequest",
    "tool_name": "Bash",
    "tool_input": {"command": "echo hooked > hooked.txt", "description": "Write hooked.txt"},
    "permission_suggestions": [
        {"type": "addDirectories", "directories": ["/w"], "destination": "session"}
    ],
}
COMMANDS = HookCommands(
    hook="/opt/busd/bin/busd hook claude-code",
    permission="/opt/busd/bin/busd hook claude-code --timeout 55",
    permission_timeout=60,
    statusline="/opt/busd/bin/busd statusline claude-code",
)
HOOKS = ClaudeCodeHooks()


def translate(*payloads: dict[str, Any]) -> list[tuple[Any, str | None, str | None]]:
    translator = HooksAdapter().translator()
    return [(e.event, e.session_id, e.agent_id) for p in payloads for e in translator.feed(p, 0.0)]


def test_each_hook_becomes_its_events_in_claude_codes_session() -> None:
    post = {**PRE, "hook_event_name": "PostToolUse", "duration_ms": 1500}
    post["tool_response"] = {"stdout": "done", "stderr": "", "interrupted": False}
    events = translate(
        {**BASE, "cwd": "/w", "hook_event_name": "SessionStart", "source": "startup"},
        {**BASE, "hook_event_name": "UserPromptSubmit", "prompt_id": "6b85", "prompt": "Go."},
        PRE,
        PERMISSION,
        post,
        {**BASE, "hook_event_name": "Stop", "stop_hook_active": False},
    )
    assert [e for e, _, _ in events] == [
        SessionStart(cwd="/w"),
        SessionIdle(),
        TurnStart(turn_id="6b85"),
        UserPrompt(text="Go.", prompt_id="6b85"),
        ToolStart(tool_call_id="toolu_hooked_1", name="Bash", input=PRE["tool_input"]),
        ToolComplete(tool_call_id="toolu_hooked_1", name="Bash", output="done", duration_s=1.5),
        SessionIdle(),
    ]
    assert {sid for _, sid, _ in events} == {"fd60a077"}


def test_failures_interrupts_notifications_and_sub_agents() -> None:
    failed = {**PRE, "hook_event_name": "PostToolUseFailure", "error": "exit 1"}
    interrupted = {**failed, "is_interrupt": True}
    note = {**BASE, "hook_event_name": "Notification", "message": "Claude needs your permission"}
    inside = {**PRE, "agent_id": "a1b2", "agent_type": "general-purpose"}
    events = translate(failed, interrupted, {**note, "title": "Claude Code"}, inside)
    assert events[0][0] == ToolComplete(
        tool_call_id="toolu_hooked_1", name="Bash", status="error", error="exit 1"
    )
    assert events[1][0].status == "cancelled"
    assert events[2][0] == SessionInfo(message="Claude Code: Claude needs your permission")
    assert (type(events[3][0]), events[3][2]) == (ToolStart, "a1b2")


def test_a_payload_it_cannot_read_is_counted_not_raised() -> None:
    translator = HooksAdapter().translator()
    assert translator.feed({**PRE, "tool_use_id": None}, 0.0) == []
    assert translator.feed({"session_id": "s"}, 0.0) == []
    assert translator.feed({**BASE, "hook_event_name": "FileChanged"}, 0.0) == []
    stats = translator.statistics()
    assert stats.malformed == {"<no type>": 2}
    assert stats.unknown == {"FileChanged": 1}


def test_reporting_hooks_send_the_payload_clipped_and_permissions_ask() -> None:
    big = {**PRE, "tool_input": {"file_path": "/w/a.txt", "content": "x" * (CLIP + 10)}}
    report = HOOKS.read(big)
    assert isinstance(report, Report)
    assert (report.sdk, report.session_id) == (ADAPTER, "fd60a077")
    content = report.events[0]["tool_input"]["content"]
    assert content.startswith("x" * CLIP)
    assert content.endswith("[clipped 10 characters]")
    ask = HOOKS.read(PERMISSION)
    assert isinstance(ask, Ask)
    assert (ask.session_id, ask.tool, ask.category) == ("fd60a077", "Bash", "execute")
    assert ask.title == "Bash: echo hooked > hooked.txt"
    assert [o.id for o in ask.options] == ["allow", "allow_always", "deny"]
    without = HOOKS.read({**PERMISSION, "permission_suggestions": []})
    assert isinstance(without, Ask)
    assert [o.id for o in without.options] == ["allow", "deny"]
    with pytest.raises(ValueError, match="not a Claude Code hook payload"):
        HOOKS.read({"hook_event_name": "Stop"})


def test_decisions_are_printed_as_claude_code_reads_them() -> None:
    def printed(decision: Settled | None) -> Any:
        text = HOOKS.answer(PERMISSION, decision)
        return json.loads(text)["hookSpecificOutput"] if text else None

    assert printed(None) is None  # nothing: Claude Code's own prompt decides
    assert printed(Settled(outcome="allowed", option_id="allow")) == {
        "hookEventName": "PermissionRequest",
        "decision": {"behavior": "allow"},
    }
    always = printed(Settled(outcome="allowed", option_id="allow_always"))
    assert always["decision"]["updatedPermissions"] == PERMISSION["permission_suggestions"]
    denied = printed(Settled(outcome="denied", option_id="deny", by="web (pid 7)"))
    assert denied["decision"] == {"behavior": "deny", "message": "Denied from busd by web (pid 7)"}
    reason = printed(Settled(outcome="denied", reason="not here"))
    assert reason["decision"]["message"] == "not here"


def _ours(settings: dict[str, Any]) -> list[str]:
    return [
        hook["command"]
        for matchers in settings.get("hooks", {}).values()
        for matcher in matchers
        for hook in matcher["hooks"]
        if is_ours(hook)
    ]


def test_install_keeps_what_is_there_and_twice_is_once() -> None:
    mine = {"type": "command", "command": "~/bin/audit.sh"}
    settings: dict[str, Any] = {
        "model": "opus",
        "permissions": {"allow": ["Bash(ls:*)"]},
        "hooks": {"PreToolUse": [{"matcher": "Bash", "hooks": [mine]}]},
    }
    once = HOOKS.install(settings, COMMANDS)
    assert once["model"] == "opus"
    assert once["permissions"] == {"allow": ["Bash(ls:*)"]}
    assert once["hooks"]["PreToolUse"][0] == {"matcher": "Bash", "hooks": [mine]}
    assert set(once["hooks"]) == {*REPORTED, "PermissionRequest"}
    assert len(_ours(once)) == len(REPORTED) + 1
    [permission] = once["hooks"]["PermissionRequest"]
    assert permission == {
        "matcher": "*",
        "hooks": [{"type": "command", "command": COMMANDS.permission, "timeout": 60}],
    }
    assert "matcher" not in once["hooks"]["Stop"][0]
    assert once["statusLine"]["command"] == COMMANDS.statusline
    assert HOOKS.install(once, COMMANDS) == once
    assert settings["hooks"]["PreToolUse"] == [{"matcher": "Bash", "hooks": [mine]}]  # untouched


def test_a_new_path_or_timeout_replaces_busds_entries() -> None:
    once = HOOKS.install({}, COMMANDS)
    moved = HookCommands(
        hook="/usr/local/bin/busd hook claude-code",
        permission="/usr/local/bin/busd hook claude-code --timeout 20",
        permission_timeout=25,
        statusline="/usr/local/bin/busd statusline claude-code",
    )
    again = HOOKS.install(once, moved)
    assert all(command.startswith("/usr/local/bin/busd ") for command in _ours(again))
    assert len(_ours(again)) == len(REPORTED) + 1
    assert again["hooks"]["PermissionRequest"][0]["hooks"][0]["timeout"] == 25
    assert again["statusLine"]["command"] == moved.statusline


def test_uninstall_removes_busds_entries_only() -> None:
    mine = {"type": "command", "command": "~/bin/audit.sh"}
    theirs_status = {"type": "command", "command": "~/bin/status.sh"}
    settings = {
        "hooks": {"Stop": [{"hooks": [mine]}]},
        "statusLine": theirs_status,
        "env": {"A": "1"},
    }
    installed = HOOKS.install(settings, COMMANDS)
    assert installed["statusLine"] == theirs_status  # the user's own is kept
    assert any("kept your own statusLine" in n for n in HOOKS.notes(settings, COMMANDS))
    assert HOOKS.uninstall(installed) == settings
    assert HOOKS.uninstall(HOOKS.install({}, COMMANDS)) == {}
    assert HOOKS.uninstall(settings) == settings


def test_settings_that_are_not_claude_codes_shape_are_refused() -> None:
    with pytest.raises(ValueError, match="'hooks' is not an object"):
        HOOKS.install({"hooks": []}, COMMANDS)
    with pytest.raises(ValueError, match=r"'hooks.Stop' is not a list"):
        HOOKS.install({"hooks": {"Stop": {}}}, COMMANDS)


def test_settings_live_in_claude_config_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", "/cfg")
    assert HOOKS.settings_path(None) == Path("/cfg/settings.json")
    assert HOOKS.settings_path(Path("/x")) == Path("/x/settings.json")
    monkeypatch.delenv("CLAUDE_CONFIG_DIR")
    monkeypatch.setenv("HOME", "/home/u")
    assert HOOKS.settings_path(None) == Path("/home/u/.claude/settings.json")


def test_only_busds_own_commands_are_recognized() -> None:
    assert is_ours({"command": "/a b/busd hook claude-code --timeout 5"})
    assert is_ours({"command": "'/a b/busd' statusline claude-code --socket /s"})
    assert is_ours({"command": "busd hook claude-code"})
    assert not is_ours({"command": "notbusd hook claude-code"})
    assert not is_ours({"command": "busd hook claude-codex"})
    assert not is_ours({"command": "~/bin/audit.sh"})
    assert not is_ours("busd hook claude-code")
