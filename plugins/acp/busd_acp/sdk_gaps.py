"""What the driver needs from ACP that the ``agent-client-protocol`` SDK (0.12) cannot say.

ACP's ``notice`` session update (a warning or note for people, not answer
text) is newer than the SDK's schema: its ``ClientCapabilities`` drops the
``session.notices`` field that asks for them, and it refuses a ``notice``
update it cannot validate (logging a traceback per update). Both go through
the SDK's own JSON-RPC ``Connection`` (``ClientSideConnection._conn``, the
one private name used here; ``tests/test_acp_notices.py`` fails if it
moves):

- :func:`initialize` sends ``initialize`` with ``clientCapabilities.session.notices``
  (an agent without notices ignores it);
- :func:`accept_newer_updates` has a ``session/update`` the SDK cannot
  validate end quietly: the driver's stream observer has already fed it, as
  it crossed the wire, and the driver's client ignores updates anyway.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from acp.client.connection import ClientSideConnection
    from acp.schema import InitializeResponse

__all__ = ["accept_newer_updates", "initialize"]

_Handler = Callable[[str, Any, bool], Awaitable[Any]]


def _connection(conn: ClientSideConnection) -> Any:
    inner = getattr(conn, "_conn", None)
    if inner is None or not hasattr(inner, "_handler") or not hasattr(inner, "send_request"):
        raise RuntimeError("the ACP SDK's ClientSideConnection has no _conn: update sdk_gaps.py")
    return inner


async def initialize(
    conn: ClientSideConnection, *, fs: bool, name: str, version: str
) -> InitializeResponse:
    """ACP ``initialize`` as the SDK sends it, asking for ``notice`` updates too."""
    from acp import PROTOCOL_VERSION
    from acp.schema import (
        ClientCapabilities,
        FileSystemCapabilities,
        Implementation,
        InitializeRequest,
        InitializeResponse,
    )
    from acp.utils import serialize_params

    request = InitializeRequest(
        protocol_version=PROTOCOL_VERSION,
        client_capabilities=ClientCapabilities(
            fs=FileSystemCapabilities(read_text_file=fs, write_text_file=fs)
        ),
        client_info=Implementation(name=name, version=version),
    )
    params = serialize_params(request)
    capabilities = params.setdefault("clientCapabilities", {})
    capabilities.setdefault("session", {})["notices"] = {}
    result = await _connection(conn).send_request("initialize", params)
    return InitializeResponse.model_validate(result)


def accept_newer_updates(conn: ClientSideConnection) -> None:
    """A ``session/update`` the SDK's schema refuses ends quietly (see the module docstring)."""
    from pydantic import ValidationError

    inner = _connection(conn)
    handler: _Handler = inner._handler

    async def tolerant(method: str, params: Any, is_notification: bool) -> Any:
        if not (is_notification and method == "session/update"):
            return await handler(method, params, is_notification)
        try:
            return await handler(method, params, is_notification)
        except ValidationError:
            return None  # fed already: the observer saw it as it crossed the wire

    inner._handler = tolerant
