"""The registry of event types a bus accepts, and the decoders built from it.

msgspec decodes a tagged union only over the classes it is given (a base
class does not pull in its subclasses), so decoders are built from the
catalog *after* plugins have registered their types; :meth:`Catalog.freeze`
marks that moment.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Union

import msgspec

from .errors import CatalogConflict, UnknownEventType
from .events import BUILTIN_EVENTS, Envelope, Event

__all__ = ["Catalog"]


class Catalog:
    """Dotted type name → event class, for built-in and plugin types alike."""

    __slots__ = ("_by_class", "_by_name", "_frozen")

    def __init__(self, types: Iterable[type[Event]] = BUILTIN_EVENTS) -> None:
        self._by_name: dict[str, type[Event]] = {}
        self._by_class: dict[type[Event], str] = {}
        self._frozen = False
        self.register(*types)

    def register(self, *types: type[Event]) -> None:
        """Add event classes; re-registering the same class is a no-op."""
        if self._frozen:
            raise RuntimeError("the catalog is frozen: register types before building decoders")
        for cls in types:
            if not (isinstance(cls, type) and issubclass(cls, Event)) or cls is Event:
                raise UnknownEventType(f"{cls!r} is not a subclass of busd.Event")
            name = cls.__struct_config__.tag
            if not isinstance(name, str) or "." not in name:
                raise UnknownEventType(
                    f"{cls.__qualname__} needs a dotted tag, e.g. class X(Event, tag='acme.thing')"
                )
            known = self._by_name.get(name)
            if known is not None and known is not cls:
                raise CatalogConflict(
                    f"event type {name!r} is already {known.__module__}.{known.__qualname__}"
                )
            self._by_name[name] = cls
            self._by_class[cls] = name

    def freeze(self) -> None:
        """Refuse further registration; decoders built from now on are final."""
        self._frozen = True

    @property
    def frozen(self) -> bool:
        return self._frozen

    def __contains__(self, item: object) -> bool:
        if isinstance(item, str):
            return item in self._by_name
        return item in self._by_class

    def __iter__(self) -> Iterator[type[Event]]:
        return iter(self._by_name.values())

    def __len__(self) -> int:
        return len(self._by_name)

    def names(self) -> list[str]:
        """Every registered type name, sorted."""
        return sorted(self._by_name)

    def get(self, name: str) -> type[Event]:
        """The class registered as ``name``; :class:`UnknownEventType` if none."""
        try:
            return self._by_name[name]
        except KeyError:
            raise UnknownEventType(f"unknown event type {name!r}") from None

    def check(self, event: object) -> str:
        """Validate ``event`` at the boundary and return its type name."""
        name = self._by_class.get(type(event))  # type: ignore[arg-type]
        if name is None:
            raise UnknownEventType(
                f"{type(event).__qualname__} is not a registered event type; "
                "register it with Catalog.register() or a busd_event_types hook"
            )
        return name

    def union(self) -> Any:
        """The tagged union of every registered class, for msgspec decoders."""
        return Union[tuple(self._by_name.values())]  # noqa: UP007 - built at run time

    def envelope_type(self) -> Any:
        """``Envelope`` parametrized over the union: decodes any registered event."""
        return Envelope[self.union()]  # type: ignore[misc]

    def event_decoder(self) -> msgspec.msgpack.Decoder[Any]:
        return msgspec.msgpack.Decoder(self.union())

    def json_event_decoder(self) -> msgspec.json.Decoder[Any]:
        return msgspec.json.Decoder(self.union())

    def json_schema(self) -> dict[str, Any]:
        """JSON Schema of ``Envelope`` over every registered event (for other languages)."""
        schema = msgspec.json.schema(self.envelope_type())
        # msgspec names a parametrized generic after its whole union; call it Envelope.
        generated = schema["$ref"].rsplit("/", 1)[1]
        envelope = schema["$defs"].pop(generated)
        envelope["title"] = "Envelope"
        schema["$defs"]["Envelope"] = envelope
        schema["$ref"] = "#/$defs/Envelope"
        return schema
