"""The OpenCode adapter: OpenCode's ``/event`` stream as busd catalog events.

Registered through the ``busd`` entry-point group under the name
``opencode``, exactly as a third-party plugin would be.
"""

from __future__ import annotations

from collections.abc import Sequence

from busd.adapters import Adapter
from busd.hookspecs import hookimpl

from .translator import OpenCodeTranslator

__all__ = ["OpenCodeAdapter", "OpenCodeTranslator", "busd_adapters"]


class OpenCodeAdapter:
    """Makes one :class:`OpenCodeTranslator` per ``/event`` stream."""

    name = "opencode"

    def translator(self, *, session_id: str | None = None) -> OpenCodeTranslator:
        return OpenCodeTranslator(session_id=session_id, adapter=self.name)


@hookimpl
def busd_adapters() -> Sequence[Adapter]:
    return [OpenCodeAdapter()]
