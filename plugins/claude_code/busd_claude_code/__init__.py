"""busd adapter for Claude Code's ``stream-json`` messages (entry point ``claude-code``)."""

from __future__ import annotations

from collections.abc import Sequence

from busd.adapters import Adapter
from busd.hookspecs import hookimpl

from .permissions import control_response as control_response
from .translator import ClaudeCodeAdapter as ClaudeCodeAdapter
from .translator import ClaudeCodeTranslator as ClaudeCodeTranslator

__all__ = ["ClaudeCodeAdapter", "ClaudeCodeTranslator", "busd_adapters", "control_response"]


@hookimpl
def busd_adapters() -> Sequence[Adapter]:
    return [ClaudeCodeAdapter()]
