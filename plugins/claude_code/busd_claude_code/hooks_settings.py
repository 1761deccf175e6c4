"""busd's entries in Claude Code's ``settings.json``: added, replaced and removed, nothing else.

Claude Code reads hooks from ``hooks`` (event name → list of matchers, each
``{"matcher": ..., "hooks": [{"type": "command", "command": ..., "timeout":
seconds}]}``) and its status line from ``statusLine`` (``{"type":
"command", "command": ...}``). busd's entries are the commands that run
``busd hook claude-code`` or ``busd statusline claude-code`` (whatever the
path of ``busd``): those are the ones replaced on install and removed on
uninstall. A status line of the user's own is left in place (:func:`notes`
says so). Pure: the CLI reads and writes the file.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from busd import HookCommands

__all__ = ["PERMISSION", "REPORTED", "install", "is_ours", "notes", "settings_path", "uninstall"]

REPORTED: Final = (
    "SessionStart",
    "UserPromptSubmit",
    "PreToolUse",
    "PostToolUse",
    "PostToolUseFailure",
    "Notification",
    "Stop",
    "SessionEnd",
)
"""The hooks that report to the bus (``busd hook claude-code``)."""

PERMISSION: Final = "PermissionRequest"
"""The hook that asks busd's permission broker (``busd hook claude-code --timeout N``)."""

_TOOL_HOOKS: Final = frozenset({"PreToolUse", "PostToolUse", "PostToolUseFailure", PERMISSION})
REPORT_TIMEOUT: Final = 10
"""Seconds Claude Code gives a reporting hook (it connects, sends, and is done in well under 1)."""

_OURS = re.compile(r"(?:^|[\s/'\"])busd['\"]?\s+(?:hook|statusline)\s+claude-code(?:\s|$)")


def settings_path(directory: Path | None) -> Path:
    """``settings.json`` in ``directory``, else ``$CLAUDE_CONFIG_DIR``, else ``~/.claude``."""
    if directory is None:
        configured = os.environ.get("CLAUDE_CONFIG_DIR")
        directory = Path(configured) if configured else Path.home() / ".claude"
    return directory / "settings.json"


def is_ours(entry: object) -> bool:
    """Whether a hook or status-line entry runs busd's command for Claude Code."""
    if not isinstance(entry, Mapping):
        return False
    command = entry.get("command")
    return isinstance(command, str) and _OURS.search(command) is not None


def _entry(event: str, commands: HookCommands) -> dict[str, Any]:
    if event == PERMISSION:
        seconds = commands.permission_timeout
        hook = {
            "type": "command",
            "command": commands.permission,
            "timeout": int(seconds) if float(seconds).is_integer() else seconds,
        }
    else:
        hook = {"type": "command", "command": commands.hook, "timeout": REPORT_TIMEOUT}
    matcher: dict[str, Any] = {"matcher": "*"} if event in _TOOL_HOOKS else {}
    return {**matcher, "hooks": [hook]}


def _status_line(commands: HookCommands) -> dict[str, Any]:
    return {"type": "command", "command": commands.statusline, "padding": 0}


def _has_ours(matcher: object) -> bool:
    hooks = matcher.get("hooks") if isinstance(matcher, Mapping) else None
    return isinstance(hooks, list) and any(is_ours(h) for h in hooks)


def _without_ours(matchers: list[Any]) -> list[Any]:
    """The matchers with busd's hooks taken out; a matcher left with no hooks goes too."""
    kept = []
    for matcher in matchers:
        if not _has_ours(matcher):
            kept.append(matcher)
            continue
        rest = [h for h in matcher["hooks"] if not is_ours(h)]
        if rest:
            kept.append({**matcher, "hooks": rest})
    return kept


def _hooks_of(settings: dict[str, Any]) -> dict[str, Any]:
    hooks = settings.setdefault("hooks", {})
    if not isinstance(hooks, dict):
        raise ValueError(f"its 'hooks' is not an object but {type(hooks).__name__}")
    return hooks


def install(settings: Mapping[str, Any], commands: HookCommands) -> dict[str, Any]:
    """``settings`` with busd's hooks and status line; everything else as it was.

    An event whose only busd entry is already the one wanted is left alone,
    so installing twice changes nothing; busd entries of an earlier install
    (another path, another timeout) are replaced by the new one, at the end.
    """
    result = copy.deepcopy(dict(settings))
    hooks = _hooks_of(result)
    for event in (*REPORTED, PERMISSION):
        matchers = hooks.get(event, [])
        if not isinstance(matchers, list):
            raise ValueError(f"its 'hooks.{event}' is not a list")
        wanted = _entry(event, commands)
        if [m for m in matchers if _has_ours(m)] != [wanted]:
            hooks[event] = [*_without_ours(matchers), wanted]
    status = result.get("statusLine")
    if status is None or is_ours(status):
        result["statusLine"] = _status_line(commands)
    return result


def uninstall(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` without busd's hooks and status line; events left empty by it are dropped."""
    result = copy.deepcopy(dict(settings))
    if "hooks" in result:
        hooks = _hooks_of(result)
        for event, matchers in list(hooks.items()):
            if not isinstance(matchers, list):
                continue
            kept = _without_ours(matchers)
            if kept != matchers:
                if kept:
                    hooks[event] = kept
                else:
                    del hooks[event]
        if not hooks:
            del result["hooks"]
    if is_ours(result.get("statusLine")):
        del result["statusLine"]
    return result


def notes(settings: Mapping[str, Any], commands: HookCommands) -> list[str]:
    """What the user should know about installing into ``settings``."""
    lines = []
    status = settings.get("statusLine")
    if status is not None and not is_ours(status):
        lines.append(
            "kept your own statusLine; to show busd's line there, set its command to "
            f"{commands.statusline!r}"
        )
    if settings.get("disableAllHooks") is True:
        lines.append("disableAllHooks is true in these settings: Claude Code runs no hooks")
    return lines
