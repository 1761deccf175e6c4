"""busd adapters, driver and attacher for Claude Code (entry point ``claude-code``).

The ``claude-code`` adapter translates Claude Code's ``stream-json``
messages; the driver runs prompts with the Claude Agent SDK (the ``driver``
extra) and feeds it. The ``claude-code-transcript`` adapter translates the
transcripts Claude Code writes itself, which the ``claude-code`` attacher
(``busd attach claude-code``) follows.
"""

from __future__ import annotations

from collections.abc import Sequence

from busd import Adapter, Attacher, Driver, hookimpl

from .attach import ClaudeCodeAttacher as ClaudeCodeAttacher
from .driver import ClaudeCodeDriver as ClaudeCodeDriver
from .driver import ClaudeCodeError as ClaudeCodeError
from .permissions import control_response as control_response
from .transcript import TranscriptAdapter as TranscriptAdapter
from .transcript import TranscriptTranslator as TranscriptTranslator
from .translator import ClaudeCodeAdapter as ClaudeCodeAdapter
from .translator import ClaudeCodeTranslator as ClaudeCodeTranslator

__all__ = [
    "ClaudeCodeAdapter",
    "ClaudeCodeAttacher",
    "ClaudeCodeDriver",
    "ClaudeCodeError",
    "ClaudeCodeTranslator",
    "TranscriptAdapter",
    "TranscriptTranslator",
    "busd_adapters",
    "busd_attachers",
    "busd_drivers",
    "control_response",
]


@hookimpl
def busd_adapters() -> Sequence[Adapter]:
    return [ClaudeCodeAdapter(), TranscriptAdapter()]


@hookimpl
def busd_drivers() -> Sequence[Driver]:
    return [ClaudeCodeDriver()]


@hookimpl
def busd_attachers() -> Sequence[Attacher]:
    return [ClaudeCodeAttacher()]


# Claude Code's hooks (busd hook claude-code): their adapter, and the agent hooks.
@hookimpl(specname="busd_adapters")
def busd_hooks_adapters() -> Sequence[Adapter]:
    from .hooks import HooksAdapter

    return [HooksAdapter()]


@hookimpl
def busd_agent_hooks() -> Sequence[object]:
    from .hooks import ClaudeCodeHooks

    return [ClaudeCodeHooks()]
