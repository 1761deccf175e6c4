"""Copilot's permission prompts and their answers, as the catalog tells them (pure).

``permission.requested`` and ``permission.completed`` carry most of what the
catalog needs in their own payloads; only which conversation a prompt
belongs to, and whether it was seen before, takes the translator's state.
Building the events here keeps that state apart from the reading of the
payloads. Option ids are the SDK's own decision kinds
(:mod:`busd_copilot.vocabulary`), so a reply maps straight back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from busd import PermissionOption, PermissionRequested, PermissionResolved

from .payloads import as_tool_input, field, field_str
from .state import Tool
from .vocabulary import ALLOW_ONCE, ALLOW_SESSION, REJECT, RESULT_OPTION


def permission_requested(
    request_id: str, request: Mapping[str, Any], tool: Tool | None
) -> PermissionRequested:
    """The prompt for ``request``; ``tool`` is its call when that already started."""
    kind = field_str(request, "kind")
    details = {
        k: v
        for k, v in request.items()
        if v is not None and k not in ("kind", "toolCallId", "tool_call_id")
    }
    if tool is not None:
        name, tool_input = tool.name, tool.input
    else:
        name = field_str(request, "toolName") or kind or "unknown"
        args = field(request, "args")
        if args is None:
            args = field(request, "toolArgs")
        tool_input = details if args is None else as_tool_input(args)
    title = (
        field_str(request, "intention")
        or field_str(request, "toolTitle")
        or field_str(request, "hookMessage")
        or field_str(request, "toolDescription")
    )
    options = [PermissionOption(id=ALLOW_ONCE, label="Allow once", kind="allow_once")]
    if field(request, "canOfferSessionApproval") is not False:
        options.append(
            PermissionOption(id=ALLOW_SESSION, label="Allow for this session", kind="allow_always")
        )
    options.append(PermissionOption(id=REJECT, label="Deny", kind="reject_once"))
    return PermissionRequested(
        request_id=request_id,
        tool=name,
        input=tool_input,
        tool_call_id=field_str(request, "toolCallId"),
        title=title,
        category=kind,
        annotations=details,
        options=options,
    )


def permission_resolved(
    request_id: str, kind: str, result: Mapping[str, Any], *, by: str | None
) -> PermissionResolved | None:
    """The answer a ``result`` of ``kind`` gives; ``None`` when the kind is not known."""
    outcome: Literal["allowed", "denied", "cancelled"]
    reason = None
    if kind == "cancelled":
        outcome = "cancelled"
        reason = field_str(result, "reason")
    elif kind.startswith("approve"):
        outcome = "allowed"
    elif kind.startswith(("denied", "deny", "reject")) or kind == "user-not-available":
        outcome = "denied"
        reason = field_str(result, "feedback") or field_str(result, "message")
        if reason is None and kind not in RESULT_OPTION:
            reason = kind  # who denied it: rules, a hook, a policy, nobody to ask
    else:
        return None
    option = RESULT_OPTION.get(kind, kind if outcome == "allowed" else None)
    return PermissionResolved(
        request_id=request_id, outcome=outcome, option_id=option, by=by, reason=reason
    )
