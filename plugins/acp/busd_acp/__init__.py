"""busd-acp: the Agent Client Protocol adapter, loaded like any third-party plugin.

``busd ingest --sdk acp`` (or an ``ingest`` frame naming ``acp``) feeds it the
JSON-RPC messages of one ACP connection, both directions interleaved in the
order they crossed the wire; see :mod:`busd_acp.translator` for what becomes
what.
"""

from __future__ import annotations

from collections.abc import Sequence

from busd.adapters import Adapter
from busd.hookspecs import hookimpl

from .translator import AcpTranslator

__all__ = ["AcpAdapter", "AcpTranslator", "busd_adapters"]


class AcpAdapter:
    """The ``acp`` adapter: one :class:`AcpTranslator` per connection."""

    name: str = "acp"

    def translator(self, *, session_id: str | None = None) -> AcpTranslator:
        return AcpTranslator(session_id=session_id)


@hookimpl
def busd_adapters() -> Sequence[Adapter]:
    return [AcpAdapter()]
