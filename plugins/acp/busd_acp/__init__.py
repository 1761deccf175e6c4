"""busd-acp: the Agent Client Protocol adapter and driver, loaded like any third-party plugin.

``busd ingest --sdk acp`` (or an ``ingest`` frame naming ``acp``) feeds the
adapter the JSON-RPC messages of one ACP connection, both directions
interleaved in the order they crossed the wire; see
:mod:`busd_acp.translator` for what becomes what. ``start_run`` with
``adapter="acp"`` runs an ACP agent subprocess with the driver
(:mod:`busd_acp.driver`, which needs the ``agent-client-protocol`` SDK: the
``driver`` extra), and the adapter translates what it feeds.
"""

from __future__ import annotations

from collections.abc import Sequence

from busd import Adapter, Driver, hookimpl

from .driver import AcpAgentError, AcpDriver, AcpOptions, AcpOptionsError
from .translator import AcpTranslator

__all__ = [
    "AcpAdapter",
    "AcpAgentError",
    "AcpDriver",
    "AcpOptions",
    "AcpOptionsError",
    "AcpTranslator",
    "busd_adapters",
    "busd_drivers",
]


class AcpAdapter:
    """The ``acp`` adapter: one :class:`AcpTranslator` per connection."""

    name: str = "acp"

    def translator(self, *, session_id: str | None = None) -> AcpTranslator:
        return AcpTranslator(session_id=session_id)


@hookimpl
def busd_adapters() -> Sequence[Adapter]:
    return [AcpAdapter()]


@hookimpl
def busd_drivers() -> Sequence[Driver]:
    return [AcpDriver()]
