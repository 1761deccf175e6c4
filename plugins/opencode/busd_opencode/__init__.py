"""The OpenCode adapter (``/event`` stream → catalog events), its driver and its attacher.

The driver runs prompts on an OpenCode server with the ``opencode-ai`` SDK,
imported only when a run starts (install the ``driver`` extra). The attacher
(``busd attach opencode --url URL``) follows a server busd did not start.
All three are registered through the ``busd`` entry-point group under the
name ``opencode``, exactly as a third-party plugin would be.
"""

from __future__ import annotations

from collections.abc import Sequence

from busd import Adapter, Attacher, Driver, hookimpl

from .attach import OpenCodeAttacher
from .driver import OpenCodeDriver
from .translator import OpenCodeTranslator

__all__ = [
    "OpenCodeAdapter",
    "OpenCodeAttacher",
    "OpenCodeDriver",
    "OpenCodeTranslator",
    "busd_adapters",
    "busd_attachers",
    "busd_drivers",
]


class OpenCodeAdapter:
    """Makes one :class:`OpenCodeTranslator` per ``/event`` stream."""

    name = "opencode"

    def translator(self, *, session_id: str | None = None) -> OpenCodeTranslator:
        return OpenCodeTranslator(session_id=session_id, adapter=self.name)


@hookimpl
def busd_adapters() -> Sequence[Adapter]:
    return [OpenCodeAdapter()]


@hookimpl
def busd_drivers() -> Sequence[Driver]:
    return [OpenCodeDriver()]


@hookimpl
def busd_attachers() -> Sequence[Attacher]:
    return [OpenCodeAttacher()]
