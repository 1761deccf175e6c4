"""Claude Code's ``can_use_tool`` permission requests, and the answers it accepts.

Claude Code asks with a ``control_request`` (subtype ``can_use_tool``) and
takes ``behavior: "allow"`` (optionally with ``updatedPermissions``, which is
how "always allow" is said) or ``behavior: "deny"``. busd offers those as
:data:`ALLOW`, :data:`ALLOW_ALWAYS` (only when Claude Code made permission
suggestions to apply) and :data:`DENY`; :func:`control_response` builds the
line to write back, :func:`resolution` reads one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

from busd import PermissionOption

__all__ = [
    "ALLOW",
    "ALLOW_ALWAYS",
    "DENY",
    "category",
    "control_response",
    "permission_options",
    "resolution",
]

ALLOW: Final = "allow"
ALLOW_ALWAYS: Final = "allow_always"
DENY: Final = "deny"

_ONCE: Final = PermissionOption(id=ALLOW, label="Allow", kind="allow_once")
_ALWAYS: Final = PermissionOption(id=ALLOW_ALWAYS, label="Always allow", kind="allow_always")
_DENY: Final = PermissionOption(id=DENY, label="Deny", kind="reject_once")

_CATEGORIES: Final = {
    "Bash": "execute",
    "BashOutput": "execute",
    "KillShell": "execute",
    "Edit": "edit",
    "MultiEdit": "edit",
    "Write": "edit",
    "NotebookEdit": "edit",
    "Read": "read",
    "Glob": "search",
    "Grep": "search",
    "WebFetch": "fetch",
    "WebSearch": "fetch",
}


def permission_options(suggestions: object) -> list[PermissionOption]:
    """The answers to offer: always-allow only when there are suggestions to apply."""
    if isinstance(suggestions, list) and suggestions:
        return [_ONCE, _ALWAYS, _DENY]
    return [_ONCE, _DENY]


def category(tool: str) -> str | None:
    """A coarse kind for policies (``edit``, ``execute``...); MCP tools are ``mcp``."""
    if tool.startswith("mcp__"):
        return "mcp"
    return _CATEGORIES.get(tool)


def control_response(
    request_id: str,
    option_id: str,
    *,
    input: Mapping[str, Any],
    suggestions: Sequence[Any] = (),
    message: str | None = None,
) -> dict[str, Any]:
    """The ``control_response`` line that answers ``request_id`` with ``option_id``.

    Anything but :data:`ALLOW` or :data:`ALLOW_ALWAYS` denies, so an unknown
    answer never grants a tool.
    """
    answer: dict[str, Any]
    if option_id in (ALLOW, ALLOW_ALWAYS):
        answer = {"behavior": "allow", "updatedInput": dict(input)}
        if option_id == ALLOW_ALWAYS and suggestions:
            answer["updatedPermissions"] = list(suggestions)
    else:
        answer = {"behavior": "deny", "message": message or "Denied by the user"}
    return {
        "type": "control_response",
        "response": {"subtype": "success", "request_id": request_id, "response": answer},
    }


def resolution(
    response: Mapping[str, Any],
) -> tuple[Literal["allowed", "denied", "cancelled"], str | None, str | None]:
    """Outcome, option id and reason of a ``control_response``'s ``response`` object."""
    if response.get("subtype") == "error":
        error = response.get("error")
        return "cancelled", None, error if isinstance(error, str) else None
    answer = response.get("response")
    if not isinstance(answer, Mapping):
        return "cancelled", None, None
    if answer.get("behavior") == "allow":
        always = bool(answer.get("updatedPermissions"))
        return "allowed", ALLOW_ALWAYS if always else ALLOW, None
    message = answer.get("message")
    return "denied", DENY, message if isinstance(message, str) and message else None
