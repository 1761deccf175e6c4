"""The answers to ``request`` commands, from the daemon's state alone.

:func:`answer` returns what a command's ``reply`` carries, or raises
:class:`Failed` with the code of a failed reply. It reads and changes the
daemon, never the connection that asked: a command that fails unexpectedly
spoils its own reply (``internal_error``) and nothing else, so the
connection goes on (docs/protocol.md, "Error codes").
"""

from __future__ import annotations

from typing import Any

import msgspec

from ..core.permissions import PermissionRejected
from ..wire import (
    UNKNOWN_COMMAND,
    UNKNOWN_SESSION,
    CancelRun,
    PermissionReply,
    Runs,
    Sessions,
    Snapshot,
    StartRun,
    Stats,
    Status,
)
from .hub import Daemon
from .runs import RunRejected

__all__ = ["Failed", "answer"]


class Failed(Exception):
    """A command the daemon refuses: the failed reply's code and message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def answer(daemon: Daemon, command: object, *, by: str) -> Any:
    """The result of ``command``, asked by the client named ``by``."""
    match command:
        case Status():
            return daemon.status()
        case Sessions(limit=limit):
            return daemon.sessions.list(limit)
        case Snapshot(session_id=session_id):
            snapshot = daemon.sessions.snapshot(session_id, stats=daemon.session_stats(session_id))
            if snapshot is None:
                raise Failed(UNKNOWN_SESSION, f"no session {session_id!r}")
            return snapshot
        case Stats(session_id=session_id):
            stats = daemon.stats(session_id)
            if stats is None:
                raise Failed(UNKNOWN_SESSION, f"no stats for session {session_id!r}")
            return stats
        case StartRun():
            try:
                state = daemon.runs.start(
                    adapter=command.adapter,
                    prompt=command.prompt,
                    started_by=by,
                    session_id=command.session_id,
                    model=command.model,
                    system_prompt=command.system_prompt,
                    cwd=command.cwd,
                    permission_mode=command.permission_mode,
                    max_turns=command.max_turns,
                    options=command.options,
                    driver=command.driver,
                    request_id=command.request_id,
                    permission_rules=command.permission_rules,
                    env=command.env,
                )
            except RunRejected as exc:
                raise Failed(exc.code, str(exc)) from None
            if command.context_window is not None:
                # Pinned before the driver can feed anything (it starts on the next
                # checkpoint); busd.run.started, already published, only named the model.
                daemon.accountant.set_context_window(
                    state.request.session_id, command.context_window, command.output_reserve
                )
            return {"run_id": state.run_id, "session_id": state.request.session_id}
        case CancelRun():
            try:
                state = daemon.runs.cancel(command.run_id, by=by, reason=command.reason)
            except RunRejected as exc:
                raise Failed(exc.code, str(exc)) from None
            return state.summary()
        case PermissionReply():
            try:
                decision = daemon.broker.reply(
                    command.request_id,
                    by=by,
                    option_id=command.option_id,
                    allow=command.allow,
                    reason=command.reason,
                )
            except PermissionRejected as exc:
                raise Failed(exc.code, str(exc)) from None
            return msgspec.to_builtins(decision)
        case Runs():
            return daemon.runs.runs()
    raise Failed(UNKNOWN_COMMAND, f"unknown command {type(command).__name__}")
