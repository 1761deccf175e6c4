"""Agent hooks: an agent busd did not start reports to busd from its own hook commands.

Claude Code runs a command at points of its life (a prompt submitted, a
tool about to run, a permission to ask) and reads what the command prints.
``busd hooks NAME --install`` puts ``busd hook NAME`` there; each call reads
the agent's JSON on stdin and either sends events (through the daemon's
adapters, as ``ingest`` does) or asks the daemon's permission broker
(``ask_permission``) and prints the decision in the agent's format. The
agent's status line runs ``busd statusline NAME``.

What is the agent's (its settings file, the shape of its hook payloads and
answers) is the plugin's, behind :class:`AgentHooks`; the connection, the
timeouts and never breaking the agent are the CLI's (:mod:`busd.cli.hooks`).
Everything here is pure: no I/O but what the CLI does with the results.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import msgspec

from ..core.events import PermissionOption

__all__ = ["AgentHooks", "Ask", "HookCommands", "Report", "Settled"]


class Report(msgspec.Struct, frozen=True, kw_only=True):
    """A hook call that only reports: raw payloads for the daemon's adapter ``sdk``."""

    sdk: str
    session_id: str | None
    events: list[Any]


class Ask(msgspec.Struct, frozen=True, kw_only=True):
    """A hook call that asks for a permission (the fields of ``ask_permission``)."""

    session_id: str
    tool: str
    input: dict[str, Any] = {}
    tool_call_id: str | None = None
    agent_id: str | None = None
    title: str | None = None
    category: str | None = None
    options: list[PermissionOption] = []


class Settled(msgspec.Struct, frozen=True, kw_only=True):
    """What busd decided for an :class:`Ask` (``outcome`` ``allowed`` or ``denied``)."""

    outcome: str
    option_id: str | None = None
    by: str | None = None
    reason: str | None = None


class HookCommands(msgspec.Struct, frozen=True, kw_only=True):
    """The command lines an agent's settings run, made by the CLI (absolute busd path)."""

    hook: str
    """For events that only report (``busd hook NAME``)."""
    permission: str
    """For permission requests (``busd hook NAME --timeout N``)."""
    permission_timeout: float
    """Seconds the agent should give the permission command before it decides itself."""
    statusline: str
    """For the agent's status line (``busd statusline NAME``)."""


@runtime_checkable
class AgentHooks(Protocol):
    """One agent's hook payloads and settings; returned by ``busd_agent_hooks``."""

    name: str
    """What ``busd hook NAME``, ``busd hooks NAME`` and ``busd statusline NAME`` select."""
    description: str
    """One line for ``busd hooks --help``."""

    def read(self, payload: Mapping[str, Any]) -> Report | Ask | None:
        """What one hook call (its stdin, parsed) asks of busd; ``None``: nothing.

        Raise ``ValueError`` for a payload that is not one of the agent's.
        """
        ...

    def answer(self, payload: Mapping[str, Any], decision: Settled | None) -> str:
        """What the hook prints for an :class:`Ask`; ``""`` leaves the decision to the agent."""
        ...

    def status_session(self, payload: Mapping[str, Any]) -> str | None:
        """The session a status-line call (its stdin, parsed) is about."""
        ...

    def settings_path(self, directory: Path | None) -> Path:
        """The settings file ``--install`` edits (``directory``: the agent's config dir)."""
        ...

    def install(self, settings: Mapping[str, Any], commands: HookCommands) -> dict[str, Any]:
        """``settings`` with busd's entries in it; every other key and entry kept.

        Installing twice gives what installing once gave; busd's own entries
        from an earlier install (another path, another timeout) are replaced.
        """
        ...

    def uninstall(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        """``settings`` without busd's entries, and nothing else changed."""
        ...

    def notes(self, settings: Mapping[str, Any], commands: HookCommands) -> Sequence[str]:
        """Lines for the user about an install (an entry of theirs busd left in place)."""
        ...
