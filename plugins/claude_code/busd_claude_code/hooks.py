"""Claude Code's hooks: the ``claude-code-hooks`` adapter and the ``claude-code`` agent hooks.

Claude Code runs ``busd hook claude-code`` at points of a session's life
with one JSON object on stdin (``hook_event_name``, ``session_id``, ``cwd``
and the event's own fields). :class:`ClaudeCodeHooks` (``busd_agent_hooks``)
says what busd does with it; the daemon's ``claude-code-hooks`` adapter
(:class:`HooksTranslator`) turns the payloads it is sent into events:

========================  ==================================================
hook                      events (session id: Claude Code's ``session_id``)
========================  ==================================================
``SessionStart``          ``stream.session.start`` (``cwd``, ``model``), then
                          ``stream.session.idle`` (it waits for a prompt)
``UserPromptSubmit``      ``stream.turn.start`` (turn id: ``prompt_id``) and
                          ``stream.session.prompt`` with the prompt
``PreToolUse``            ``stream.tool.start`` (tool call id: ``tool_use_id``)
``PostToolUse``           ``stream.tool.complete`` ``ok`` with the output
``PostToolUseFailure``    ``stream.tool.complete`` ``error`` (``cancelled``
                          when interrupted)
``Notification``          ``stream.session.info``
``Stop``, ``SessionEnd``  ``stream.session.idle``
``PermissionRequest``     nothing: it is asked with ``ask_permission``
========================  ==================================================

A tool call inside a sub-agent carries Claude Code's ``agent_id``. Each
hook call is its own process and connection, so the translator keeps no
state between payloads. Large strings (a file being written, a tool's
output) are clipped before they leave the hook (:data:`CLIP`), so a payload
always fits a frame; the decision applies to Claude Code's own input, never
to the clipped copy.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from busd import (
    Ask,
    Emitted,
    Event,
    HookCommands,
    Report,
    SessionIdle,
    SessionInfo,
    SessionStart,
    Settled,
    ToolComplete,
    ToolStart,
    Translator,
    TurnStart,
    UserPrompt,
    as_mapping,
)

from . import hooks_settings
from .permissions import ALLOW_ALWAYS, category, permission_options

__all__ = ["ADAPTER", "CLIP", "ClaudeCodeHooks", "HooksAdapter", "HooksTranslator"]

ADAPTER: Final = "claude-code-hooks"
"""The daemon's adapter for hook payloads (what ``ingest`` frames name)."""

CLIP: Final = 16_384
"""Characters kept of any one string of a payload (the rest is said to be clipped)."""

_PROMPT_SHOWN: Final = 500  # characters of a submitted prompt in its info line


def _str(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def clip(value: Any, limit: int = CLIP) -> Any:
    """``value`` with every string longer than ``limit`` cut, saying how much was cut."""
    if isinstance(value, str):
        if len(value) <= limit:
            return value
        return f"{value[:limit]}… [clipped {len(value) - limit} characters]"
    if isinstance(value, Mapping):
        return {str(k): clip(v, limit) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clip(v, limit) for v in value]
    return value


def _output(response: object) -> str | None:
    """A tool's result as text: Bash's stdout and stderr, a string, else its JSON."""
    if response is None:
        return None
    if isinstance(response, str):
        return response
    if isinstance(response, Mapping) and ("stdout" in response or "stderr" in response):
        parts = [response.get("stdout"), response.get("stderr")]
        return "\n".join(p for p in parts if isinstance(p, str) and p)
    return json.dumps(response, ensure_ascii=False, default=str)


def _seconds(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
        return value / 1000
    return None


class HooksTranslator(Translator):
    """One hook payload in, its events out (stateless: every hook call is a new stream)."""

    def translate(self, raw: object, now: float) -> list[Emitted]:
        payload = as_mapping(raw)
        name = payload.get("hook_event_name")
        sid = _str(payload.get("session_id")) or self.session_id
        agent = _str(payload.get("agent_id"))
        events: list[Event] = []
        match name:
            case "SessionStart":  # it then waits for a prompt
                cwd, model = _str(payload.get("cwd")), payload.get("model")
                events += [SessionStart(cwd=cwd, model=_str(model)), SessionIdle()]
            case "UserPromptSubmit":
                prompt_id = _str(payload.get("prompt_id"))
                events.append(TurnStart(turn_id=prompt_id))
                prompt = _str(payload.get("prompt"))
                if prompt is not None:  # once, with the transcript's (the same prompt id)
                    events.append(UserPrompt(text=prompt, prompt_id=prompt_id))
            case "PreToolUse":
                tool_input = payload.get("tool_input")
                events.append(
                    ToolStart(
                        tool_call_id=self._call_id(payload),
                        name=_str(payload.get("tool_name")) or "tool",
                        input=dict(tool_input) if isinstance(tool_input, Mapping) else {},
                    )
                )
            case "PostToolUse":
                events.append(
                    ToolComplete(
                        tool_call_id=self._call_id(payload),
                        name=_str(payload.get("tool_name")),
                        output=_output(payload.get("tool_response")),
                        duration_s=_seconds(payload.get("duration_ms")),
                    )
                )
            case "PostToolUseFailure":
                interrupted = payload.get("is_interrupt") is True
                events.append(
                    ToolComplete(
                        tool_call_id=self._call_id(payload),
                        name=_str(payload.get("tool_name")),
                        status="cancelled" if interrupted else "error",
                        error=_str(payload.get("error")),
                        duration_s=_seconds(payload.get("duration_ms")),
                    )
                )
            case "Notification":
                message = _str(payload.get("message"))
                if message is None:
                    raise ValueError("a Notification without a message")
                title = _str(payload.get("title"))
                events.append(SessionInfo(message=f"{title}: {message}" if title else message))
            case "Stop" | "SessionEnd":
                events.append(SessionIdle())
            case "PermissionRequest":
                pass  # asked with ask_permission, published by the daemon's broker
            case str():
                self.unknown(name)
            case _:
                raise ValueError("no hook_event_name")
        return [self.emit(event, session_id=sid, agent_id=agent) for event in events]

    @staticmethod
    def _call_id(payload: Mapping[str, Any]) -> str:
        call = _str(payload.get("tool_use_id"))
        if call is None:
            raise ValueError("a tool hook without a tool_use_id")
        return call


class HooksAdapter:
    """The ``claude-code-hooks`` adapter: what ``busd hook claude-code`` sends."""

    name = ADAPTER

    def translator(self, *, session_id: str | None = None) -> Translator:
        return HooksTranslator(session_id=session_id, adapter=ADAPTER)


def _title(tool: str, tool_input: Mapping[str, Any]) -> str | None:
    """What a permission card says first: the command, the file, the URL."""
    for key in ("command", "file_path", "notebook_path", "url", "pattern", "query"):
        value = tool_input.get(key)
        if isinstance(value, str) and value:
            return f"{tool}: {value if len(value) <= 200 else value[:200] + '…'}"
    return None


class ClaudeCodeHooks:
    """``busd hook claude-code``: Claude Code's hook payloads, answers and settings."""

    name = "claude-code"
    description = "Claude Code's hooks: live sessions, permissions answered from busd, status line"

    def read(self, payload: Mapping[str, Any]) -> Report | Ask | None:
        name = payload.get("hook_event_name")
        session_id = _str(payload.get("session_id"))
        if not isinstance(name, str) or session_id is None:
            raise ValueError("not a Claude Code hook payload (no hook_event_name or session_id)")
        if name == "PermissionRequest":
            tool = _str(payload.get("tool_name"))
            if tool is None:
                raise ValueError("a PermissionRequest without a tool_name")
            raw_input = payload.get("tool_input")
            tool_input = clip(dict(raw_input)) if isinstance(raw_input, Mapping) else {}
            return Ask(
                session_id=session_id,
                tool=tool,
                input=tool_input,
                agent_id=_str(payload.get("agent_id")),
                title=_title(tool, tool_input),
                category=category(tool),
                options=permission_options(payload.get("permission_suggestions")),
            )
        return Report(sdk=ADAPTER, session_id=session_id, events=[clip(dict(payload))])

    def answer(self, payload: Mapping[str, Any], decision: Settled | None) -> str:
        if decision is None or decision.outcome not in ("allowed", "denied"):
            return ""  # Claude Code's own prompt decides
        verdict: dict[str, Any]
        if decision.outcome == "allowed":
            verdict = {"behavior": "allow"}
            suggestions = payload.get("permission_suggestions")
            if decision.option_id == ALLOW_ALWAYS and isinstance(suggestions, list) and suggestions:
                verdict["updatedPermissions"] = suggestions
        else:
            who = f" by {decision.by}" if decision.by else ""
            verdict = {"behavior": "deny", "message": decision.reason or f"Denied from busd{who}"}
        output = {"hookEventName": "PermissionRequest", "decision": verdict}
        return json.dumps({"hookSpecificOutput": output}, ensure_ascii=False)

    def status_session(self, payload: Mapping[str, Any]) -> str | None:
        return _str(payload.get("session_id"))

    def settings_path(self, directory: Path | None) -> Path:
        return hooks_settings.settings_path(directory)

    def install(self, settings: Mapping[str, Any], commands: HookCommands) -> dict[str, Any]:
        return hooks_settings.install(settings, commands)

    def uninstall(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        return hooks_settings.uninstall(settings)

    def notes(self, settings: Mapping[str, Any], commands: HookCommands) -> Sequence[str]:
        return hooks_settings.notes(settings, commands)
