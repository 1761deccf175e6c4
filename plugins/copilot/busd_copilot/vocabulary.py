"""Copilot's words and the catalog's: finish reasons, permission decisions, error codes.

Kept apart from the translator so the tables can be read (and extended, as
new CLI versions add event kinds) without the logic around them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

FINISH: Final[Mapping[str, str]] = {
    "stop": "end_turn",
    "end_turn": "end_turn",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "tool_use": "tool_use",
    "length": "max_tokens",
    "max_tokens": "max_tokens",
    "stop_sequence": "stop_sequence",
    "content_filter": "refusal",
    "refusal": "refusal",
    "cancelled": "cancelled",
    "canceled": "cancelled",
    "aborted": "cancelled",
    "error": "error",
}
"""Copilot's ``finishReason`` (OpenAI's words, mostly) onto the catalog's."""

ALLOW_ONCE: Final = "approve-once"
ALLOW_SESSION: Final = "approve-for-session"
REJECT: Final = "reject"
"""Option ids: the SDK's own permission decision kinds, so a reply maps straight back."""

RESULT_OPTION: Final[Mapping[str, str]] = {
    "approved": ALLOW_ONCE,
    "approve-once": ALLOW_ONCE,
    "approved-for-session": ALLOW_SESSION,
    "approve-for-session": ALLOW_SESSION,
    "denied-interactively-by-user": REJECT,
    "reject": REJECT,
}

CANCEL_CODES: Final = frozenset({"cancelled", "canceled", "aborted", "abort"})
RETRYABLE_STATUS: Final = frozenset({408, 429, 500, 502, 503, 504, 529})

IGNORED: Final = frozenset(
    {
        # Known, and nothing in them for the catalog (telemetry, UI state, echoes).
        "pending_messages.modified",
        "assistant.intent",
        "assistant.idle",
        "assistant.streaming_delta",
        "assistant.tool_call_delta",
        "assistant.server_tool_progress",
        "model.call_start",
        "model.call_finished",
        "model.call_final_result",
        "model.call_failure",
        "prompt_cache_break",
        "session.compaction_start",
        "session.context_changed",
        "session.mode_changed",
        "session.plan_changed",
        "session.todos_changed",
        "session.workspace_file_changed",
        "session.usage_checkpoint",
        "session.shutdown",
        "session.skills_loaded",
        "session.custom_agents_updated",
        "session.mcp_servers_loaded",
        "session.mcp_server_status_changed",
        "session.mcp_server_tools_loaded",
        "session.tools_updated",
        "session.extensions_loaded",
        "session.remote_steerable_changed",
        "session.background_tasks_changed",
        "session.task_complete",
        # The CLI's own model-loop tracing and policy decisions (seen with CLI 1.0.102):
        # the calls, messages and tool runs they trace arrive as the events above.
        "session.managed_settings_resolved",
        "sandbox.decision",
        "session.indexed_search",
        "model.turn_started",
        "model.log",
        "model.model_call_started",
        "model.model_call_success",
        "model.message",
        "model.tool_execution",
        "model.turn_ended",
        "model.response",
        "model.messages_snapshot",
        # ...and on an abort: the abort event and the turn's end say it for the catalog.
        "agent.interrupted",
        "model.telemetry",
        "model.turn_failed",
        "subagent.selected",
        "subagent.deselected",
        "subagent.configured",
        "tool.user_requested",
        "tool_search.activated",
        "skill.invoked",
        "hook.start",
        "hook.end",
        "hook.progress",
        "system.message",
        "system.notification",
        "instruction.update",
        "commands.changed",
        "capabilities.changed",
    }
)
