"""busd adapter and driver for Claude Code (entry point ``claude-code``).

The adapter translates Claude Code's ``stream-json`` messages; the driver
runs prompts with the Claude Agent SDK (the ``driver`` extra) and feeds it.
"""

from __future__ import annotations

from collections.abc import Sequence

from busd import Adapter, Driver, hookimpl

from .driver import ClaudeCodeDriver as ClaudeCodeDriver
from .driver import ClaudeCodeError as ClaudeCodeError
from .permissions import control_response as control_response
from .translator import ClaudeCodeAdapter as ClaudeCodeAdapter
from .translator import ClaudeCodeTranslator as ClaudeCodeTranslator

__all__ = [
    "ClaudeCodeAdapter",
    "ClaudeCodeDriver",
    "ClaudeCodeError",
    "ClaudeCodeTranslator",
    "busd_adapters",
    "busd_drivers",
    "control_response",
]


@hookimpl
def busd_adapters() -> Sequence[Adapter]:
    return [ClaudeCodeAdapter()]


@hookimpl
def busd_drivers() -> Sequence[Driver]:
    return [ClaudeCodeDriver()]
