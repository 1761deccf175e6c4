"""Permission rules and decisions, pure: what the broker consults before it asks people.

The order a request is decided in (plugin policy, then the daemon's rules,
then the rules its run was started with, then the first frontend to
answer, then the timeout) is the broker's (:mod:`busd.daemon.broker`);
here are the rules (tool-name glob, category, annotations, command pattern
→ ``allow`` / ``deny`` / ``ask``, first match wins) and the
:class:`PermissionDecision` a driver gets back.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import msgspec

from .errors import BusdError
from .events import PermissionOption, PermissionRequested

__all__ = [
    "PermissionDecision",
    "PermissionRejected",
    "PermissionRule",
    "decision_for",
    "match_rule",
]


class PermissionDecision(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The answer to a permission request, for the driver to give its SDK."""

    outcome: Literal["allowed", "denied", "cancelled"]
    option_id: str | None = None
    """The offered option that was chosen (``allow_once``, ``reject``, ...), if any."""
    by: str | None = None
    """Who decided: a client's identity (``name[pid=…,uid=…]``: its answer, or a rule it
    started the run with), ``policy``, ``rule:<n>``, ``timeout``, or ``busd`` (the run was
    cancelled)."""
    reason: str | None = None

    @property
    def allowed(self) -> bool:
        return self.outcome == "allowed"


class PermissionRule(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, forbid_unknown_fields=True
):
    """One permission rule (the daemon's, or a run's); every given condition must match."""

    action: Literal["allow", "deny", "ask"]
    tool: str | tuple[str, ...] = "*"
    """A glob over the tool name (``Bash``, ``mcp__*``), or a list of them: any may match."""
    category: str | tuple[str, ...] | None = None
    """The request's category, exactly (``edit``, ``execute``, ``read``...), or a list of them."""
    annotations: dict[str, Any] = {}
    """Each key must be present with this value (``{"readOnlyHint": true}``)."""
    command: str | None = None
    """A regular expression searched in the input's ``command`` (shell tools)."""
    reason: str | None = None
    """Why, in the rule giver's words (``--deny Write``): the decision's ``reason``."""

    def __post_init__(self) -> None:
        for name in ("tool", "category"):
            if getattr(self, name) == ():
                raise ValueError(f"{name} is an empty list: it would match nothing")
        if self.command is not None:
            try:
                re.compile(self.command)
            except re.error as exc:  # caught here, not when a request is matched
                raise ValueError(
                    f"command {self.command!r} is not a regular expression: {exc}"
                ) from None

    def matches(self, request: PermissionRequested) -> bool:
        tools = (self.tool,) if isinstance(self.tool, str) else self.tool
        if not any(fnmatch.fnmatchcase(request.tool, glob) for glob in tools):
            return False
        if self.category is not None:
            categories = (self.category,) if isinstance(self.category, str) else self.category
            if request.category not in categories:
                return False
        for key, value in self.annotations.items():
            if request.annotations.get(key) != value:
                return False
        if self.command is not None:
            command = request.input.get("command")
            if isinstance(command, list):
                command = " ".join(map(str, command))
            if not isinstance(command, str) or re.search(self.command, command) is None:
                return False
        return True


def match_rule(
    rules: Sequence[PermissionRule], request: PermissionRequested
) -> tuple[int, PermissionRule] | None:
    """The first rule that matches, with its index."""
    for index, rule in enumerate(rules):
        if rule.matches(request):
            return index, rule
    return None


def _option(options: Sequence[PermissionOption], prefix: str) -> str | None:
    for option in options:
        if option.kind.startswith(prefix):
            return option.id
    return None


def decision_for(
    request: PermissionRequested,
    *,
    allow: bool,
    by: str,
    reason: str | None = None,
) -> PermissionDecision:
    """An allow/deny decision, with the SDK's matching one-time option picked."""
    option = _option(request.options, "allow_once" if allow else "reject_once") or _option(
        request.options, "allow" if allow else "reject"
    )
    return PermissionDecision(
        outcome="allowed" if allow else "denied", option_id=option, by=by, reason=reason
    )


class PermissionRejected(BusdError):
    """A reply the broker refuses (``code``: unknown_request, already_resolved, invalid_option)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def rules_from_config(raw: Sequence[Mapping[str, Any]]) -> list[PermissionRule]:
    """Rules from a config file's list of tables (validated; a bad rule is a clear error)."""
    return [msgspec.convert(dict(item), PermissionRule) for item in raw]
