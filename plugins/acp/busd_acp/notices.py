"""What an ACP agent says to people beside its answer: warnings and notes, not answer text.

Two shapes carry them, both seen from claude-agent-acp 0.101.0
(``dist/session-notices.js``):

- ``session/update`` ``notice`` (``severity``, ``title``, optional
  ``description``): sent only to a client that advertised
  ``clientCapabilities.session.notices`` (an object), as busd's driver does.
  ``warning`` becomes ``stream.session.warning``, anything else
  ``stream.session.info``; the message is ``"title: description"``.
- Without that capability the same notice is an ``agent_message_chunk``
  whose text is a bold-label line (``**Auto mode unavailable:** the selected
  model ...``), mixed into the answer. Only the chunks the agent marks with
  ``_meta.claudeCode.kind`` (``informational``: Claude Code's own notices,
  with its ``level``; ``mcpServerStatus``: an MCP server that failed or
  needs sign-in, with its ``status``) can be told from answer text; they are
  read as notices too. Unmarked ones (the auto-mode and fast-mode notices,
  a model fallback) stay text: nothing tells them from what the model said.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from busd import SessionInfo, SessionWarning

from .usage import as_map

__all__ = ["notice_event", "transcript_notice"]

_WARNINGS: Final = frozenset({"warning", "error"})
_BOLD_LABEL: Final = re.compile(r"^\*\*(?P<label>[^*\n]+?)(?::\*\*|\*\*:)\s*(?P<rest>.*)$", re.S)
_BOLD_ONLY: Final = re.compile(r"^\*\*(?P<label>[^*\n]+)\*\*$")


def _text(value: object) -> str | None:
    return value.strip() if isinstance(value, str) and value.strip() else None


def _event(warning: bool, message: str) -> SessionWarning | SessionInfo:
    return SessionWarning(message=message) if warning else SessionInfo(message=message)


def notice_event(update: Mapping[str, Any]) -> SessionWarning | SessionInfo | None:
    """A ``notice`` update as the event people see; ``None`` when it says nothing."""
    title, description = _text(update.get("title")), _text(update.get("description"))
    if title is None and description is None:
        return None
    message = ": ".join(part for part in (title, description) if part is not None)
    return _event(update.get("severity") in _WARNINGS, message)


def transcript_notice(update: Mapping[str, Any]) -> SessionWarning | SessionInfo | None:
    """A message chunk the agent marked as a notice (see the module docstring), else ``None``."""
    meta = as_map(update.get("_meta"))
    vendor = None if meta is None else as_map(meta.get("claudeCode"))
    kind = None if vendor is None else vendor.get("kind")
    if vendor is None or kind not in ("informational", "mcpServerStatus"):
        return None
    content = as_map(update.get("content"))
    text = None if content is None else _text(content.get("text"))
    if text is None:
        return None
    if kind == "informational":
        warning = vendor.get("level") == "warning"
    else:
        warning = vendor.get("status") == "failed"
    return _event(warning, _unlabel(text))


def _unlabel(text: str) -> str:
    """``**Title:** rest`` as ``Title: rest``, ``**Title**`` as ``Title`` (the agent's markup)."""
    if (found := _BOLD_LABEL.match(text)) is not None:
        return f"{found['label']}: {found['rest']}".rstrip(": ")
    if (found := _BOLD_ONLY.match(text)) is not None:
        return found["label"]
    return text
