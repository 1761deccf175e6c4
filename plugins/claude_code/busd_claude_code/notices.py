"""Claude Code lines that become notes for people: rate limits, hook runs, a result's error.

``rate_limit_event`` is sent when the subscription's rate-limit state
changes: ``allowed`` says nothing worth showing, ``allowed_warning`` and
``rejected`` become a ``stream.session.warning`` with the window and its
reset time. A ``hook_response`` (sent with ``--include-hook-events``) says
that a hook ran and how it went: ``stream.session.info``, or a warning when
it did not succeed. Its ``hook_started`` adds nothing the response does not
say, and is ignored. ``api_retry`` is a retry, ``compact_boundary`` a
compaction; a user message that begins ``[Request interrupted by user`` is
the CLI's own note that the turn was interrupted.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final, Literal

from busd import (
    SessionCompaction,
    SessionError,
    SessionInfo,
    SessionRetry,
    SessionWarning,
)

__all__ = [
    "IGNORED_SYSTEM",
    "TASK_END",
    "compaction",
    "hook_notice",
    "interrupted",
    "rate_limit_warning",
    "result_error",
    "retry",
]

TASK_END: Final[dict[str, Literal["ok", "error", "cancelled"]]] = {
    # a task's terminal status (task_notification's or task_updated's) -> the agent's
    "completed": "ok",
    "failed": "error",
    "stopped": "cancelled",
    "killed": "cancelled",
}
IGNORED_SYSTEM: Final = frozenset(  # system subtypes ignored on purpose
    {
        "status",  # "requesting" / "compacting": the stream itself shows both
        "hook_started",  # its hook_response says the same, and how it went
        "thinking_tokens",  # an estimate of thinking so far: the deltas say more
        "background_tasks_changed",  # the running tasks: task_* lines say each change
    }
)

_INTERRUPT_NOTE: Final = "[Request interrupted by user"
"""How the CLI's note of an interrupt begins (also ``... for tool use]``)."""

_WINDOWS: Final = {
    "five_hour": "five-hour",
    "seven_day": "seven-day",
    "seven_day_opus": "seven-day Opus",
    "seven_day_sonnet": "seven-day Sonnet",
    "overage": "overage",
}


def _when(value: object) -> str | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < 1e11:
        return datetime.fromtimestamp(value, UTC).strftime("%Y-%m-%d %H:%M UTC")
    return None


def rate_limit_warning(line: Mapping[str, Any]) -> SessionWarning | None:
    """The warning a ``rate_limit_event`` deserves, if any."""
    info = line.get("rate_limit_info")
    if not isinstance(info, Mapping):
        return None
    status = info.get("status")
    kind = info.get("rateLimitType")
    window = _WINDOWS.get(kind, str(kind)) if isinstance(kind, str) else None
    limit = f"the {window} limit" if window else "the limit"
    resets = _when(info.get("resetsAt"))
    used = info.get("utilization")
    if status == "allowed_warning":
        share = (
            f"{round(used * 100)}% of {limit} used"
            if isinstance(used, int | float) and not isinstance(used, bool)
            else f"close to {limit}"
        )
        message = f"rate limit: {share}"
    elif status == "rejected":
        message = f"rate limit reached: {limit}"
    else:
        return None  # "allowed": within the limit
    return SessionWarning(message=f"{message}; resets {resets}" if resets else message)


def hook_notice(line: Mapping[str, Any]) -> SessionInfo | SessionWarning:
    """A hook ran: its name and outcome (with the exit code and stderr when it failed)."""
    name = line.get("hook_name") or line.get("hook_event") or "hook"
    outcome = line.get("outcome")
    outcome = outcome if isinstance(outcome, str) and outcome else "done"
    if outcome == "success":
        return SessionInfo(message=f"hook {name}: success")
    code = line.get("exit_code")
    stderr = line.get("stderr")
    detail = f" (exit {code})" if isinstance(code, int) and not isinstance(code, bool) else ""
    if isinstance(stderr, str) and stderr.strip():
        detail += f": {stderr.strip().splitlines()[0]}"
    return SessionWarning(message=f"hook {name}: {outcome}{detail}")


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


_INTERRUPTED: Final = ("[ede_diagnostic]", "Error: Request was aborted", "Request was aborted")
"""How the CLI's errors of an interrupted turn start: its diagnostics, not a failure."""


def result_error(line: Mapping[str, Any], subtype: str) -> SessionError | None:
    """The error a ``result`` reports, if any (an interrupt alone is none).

    An interrupt ends the turn ``error_during_execution`` and lists the
    CLI's own diagnostics (``[ede_diagnostic] result_type=user ...``,
    ``Error: Request was aborted.``): they say it was cancelled, which the
    idle says too. Anything else listed is an error.
    """
    errors = line.get("errors")
    entries = [e for e in errors if isinstance(e, str)] if isinstance(errors, list) else []
    listed = "\n".join(entries)
    if subtype == "error_during_execution":
        kept = [e for e in entries if e.strip() and not e.lstrip().startswith(_INTERRUPTED)]
        return SessionError(message="\n".join(kept), code=subtype) if kept else None
    if subtype.startswith("error") or line.get("is_error") is True:
        message = listed or _text(line.get("result")) or subtype or "error"
        code = subtype if subtype and subtype != "success" else None
        return SessionError(message=message, code=code)
    return None


def interrupted(content: list[Any]) -> bool:
    """Whether a user message's content is the CLI's note that the user interrupted the turn."""
    return any(
        isinstance(block, Mapping)
        and block.get("type") == "text"
        and str(block.get("text", "")).startswith(_INTERRUPT_NOTE)
        for block in content
    )


def retry(line: Mapping[str, Any]) -> SessionRetry:
    """An ``api_retry`` line: the attempt, why (the error, else its HTTP status), the delay."""
    delay = line.get("retry_delay_ms")
    status = _int(line.get("error_status"))
    error = line.get("error")
    return SessionRetry(
        attempt=_int(line.get("attempt")) or 0,
        message=error if isinstance(error, str) else f"HTTP {status}" if status else "",
        delay_s=delay / 1000 if isinstance(delay, int | float) else None,
    )


def compaction(line: Mapping[str, Any]) -> SessionCompaction:
    """A ``compact_boundary`` line: the tokens before, when the CLI says."""
    meta = line.get("compact_metadata")
    return SessionCompaction(
        tokens_before=_int(meta.get("pre_tokens")) if isinstance(meta, Mapping) else None
    )


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
