"""busd adapter and driver for the Anthropic Messages API stream (entry point ``anthropic``).

:mod:`busd_anthropic.stream` holds the message-stream state machine other
adapters built on Anthropic streams (Claude Code) reuse.
"""

from __future__ import annotations

from collections.abc import Sequence

from busd import Adapter, Driver, hookimpl

from .driver import AnthropicDriver as AnthropicDriver
from .stream import MessageStream as MessageStream
from .translator import AnthropicAdapter as AnthropicAdapter
from .translator import AnthropicTranslator as AnthropicTranslator

__all__ = [
    "AnthropicAdapter",
    "AnthropicDriver",
    "AnthropicTranslator",
    "MessageStream",
    "busd_adapters",
    "busd_drivers",
]


@hookimpl
def busd_adapters() -> Sequence[Adapter]:
    return [AnthropicAdapter()]


@hookimpl
def busd_drivers() -> Sequence[Driver]:
    return [AnthropicDriver()]
