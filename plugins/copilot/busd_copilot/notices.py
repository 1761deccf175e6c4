"""Copilot's notes about the session, as the catalog tells them (pure).

The title, info and warning lines, a truncated or compacted history and the
context window's state: each is one event built from its payload alone, so
the translator only decides which conversation it belongs to. What is wrong
with a payload comes back as text, for the translator to report as
malformed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from busd import (
    Event,
    SessionCompaction,
    SessionContext,
    SessionInfo,
    SessionTitleChanged,
    SessionTruncation,
    SessionWarning,
)

from .payloads import field, field_int, field_str


def session_notice(kind: str, data: Mapping[str, Any]) -> Event | str:
    """The event a notice of ``kind`` says, or what is wrong with its ``data``."""
    match kind:
        case "session.title_changed":
            title = field_str(data, "title")
            return "no string 'title'" if title is None else SessionTitleChanged(title=title)
        case "session.info" | "session.warning":
            message = field_str(data, "message")
            if message is None:
                return "no string 'message'"
            if kind == "session.info":
                return SessionInfo(message=message)
            return SessionWarning(message=message)
        case "session.truncation":
            return SessionTruncation(
                tokens_removed=field_int(data, "tokensRemovedDuringTruncation"),
                messages_removed=field_int(data, "messagesRemovedDuringTruncation"),
            )
        case "session.compaction_complete":
            if field(data, "success") is False:
                why = (
                    field_str(data, "error") or field_str(data, "failureReason") or "unknown reason"
                )
                return SessionWarning(message=f"compaction failed: {why}")
            return SessionCompaction(
                tokens_before=field_int(data, "preCompactionTokens"),
                tokens_after=field_int(data, "postCompactionTokens"),
            )
        case "session.usage_info":
            used = field_int(data, "currentTokens")
            if used is None or used < 0:
                return "no count in 'currentTokens'"
            window = field_int(data, "tokenLimit")
            return SessionContext(used=used, window=window if window and window > 0 else None)
        case _:
            return f"not a session notice: {kind!r}"
