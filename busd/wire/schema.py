"""The protocol as one JSON Schema: every frame, every request's result, every event.

Generated from the msgspec types (``msgspec.json.schema_components``), so
it cannot drift from what the daemon decodes and encodes; ``busd schema``
prints it and docs/protocol.schema.json is a copy a test keeps current.
Frames are msgpack on the wire; the schema describes the same maps as
JSON (bytes and extension types never occur).

Entry points, under ``$defs``: ``ClientFrame`` (what a client may send),
``ServerFrame`` (what it receives; ``events`` carry ``Envelope``\\ s),
``Envelope``, ``Event`` (any catalog event) and ``Result.<cmd>`` (the
``result`` of a successful ``reply`` to that command).
"""

from __future__ import annotations

from typing import Any, Union

import msgspec

from ..core.catalog import Catalog
from ..core.events import Envelope
from .frames import CLIENT_FRAMES, PROTOCOL_VERSION, SERVER_FRAMES, Events, Outgoing, Publish
from .results import RESULTS

__all__ = ["protocol_schema"]

_DIALECT = "https://json-schema.org/draft/2020-12/schema"
_REF = "#/$defs/"


def protocol_schema(catalog: Catalog | None = None) -> dict[str, Any]:
    """The JSON Schema of protocol version 1 over ``catalog``'s events."""
    catalog = catalog if catalog is not None else Catalog()
    event = catalog.union()
    client = [Publish[event] if f is Publish else f for f in CLIENT_FRAMES]  # type: ignore[valid-type]
    server = [Events[Envelope[event]] if f is Events else f for f in SERVER_FRAMES]  # type: ignore[valid-type]
    entry_points: dict[str, Any] = {
        "ClientFrame": Union[tuple(client)],  # noqa: UP007 - built at run time
        "ServerFrame": Union[tuple(server)],  # noqa: UP007
        "Envelope": Envelope[event],  # type: ignore[valid-type]
        "Outgoing": Outgoing[event],  # type: ignore[valid-type]
        "Event": event,
        **{f"Result.{cmd}": kind for cmd, kind in RESULTS.items()},
    }
    schemas, defs = msgspec.json.schema_components(
        entry_points.values(), ref_template=_REF + "{name}"
    )
    renamed = _short_names(defs)
    named = {renamed.get(name, name): schema for name, schema in defs.items()}
    for name, schema in zip(entry_points, schemas, strict=True):
        named.setdefault(name, schema)  # a Struct (Envelope, Outgoing) is its own entry point
    return {
        "$schema": _DIALECT,
        "$comment": "Tagged unions are oneOf with an OpenAPI-style discriminator (ajv: "
        "discriminator: true); the tag ('op', 'cmd', 'type') tells the branches apart.",
        "title": f"busd protocol {PROTOCOL_VERSION}",
        "description": "Frames, request results and events of busd's Unix-socket protocol "
        "(docs/protocol.md). Entry points: $defs/ClientFrame, $defs/ServerFrame, "
        "$defs/Envelope, $defs/Event, $defs/Result.<cmd>.",
        "$defs": _tidy(dict(sorted(named.items())), renamed),
    }


def _tidy(node: Any, renamed: dict[str, str]) -> Any:
    """References to renamed definitions follow them; tagged unions become ``oneOf``.

    msgspec writes a tagged union as ``anyOf`` + ``discriminator``; its
    branches exclude each other, and validators that use the discriminator
    (ajv) want ``oneOf``.
    """
    if isinstance(node, dict):
        node = {key: _tidy(value, renamed) for key, value in node.items()}
        if "discriminator" in node and "anyOf" in node:
            node["oneOf"] = node.pop("anyOf")
            node.setdefault("type", "object")
        return node
    if isinstance(node, list | tuple):  # a default such as ("*",): JSON has lists only
        return [_tidy(item, renamed) for item in node]
    if isinstance(node, str) and node.startswith(_REF):
        return _REF + renamed.get(node.removeprefix(_REF), node.removeprefix(_REF))
    return node


def _short_names(defs: dict[str, Any]) -> dict[str, str]:
    """msgspec names a parametrized generic after its arguments: give it a readable name.

    Over the whole event union it is the generic's own name (``Envelope``);
    over one event, ``Envelope.PermissionRequested``.
    """
    renamed: dict[str, str] = {}
    for name in defs:
        base, sep, argument = name.partition("_")
        if not sep or base not in ("Publish", "Events", "Envelope", "Outgoing"):
            continue
        renamed[name] = base if "Union" in argument else f"{base}.{argument.strip('_')}"
    return renamed
