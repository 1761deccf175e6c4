"""What a daemon does with one message from the stream: sans-I/O, one message at a time.

A message is published locally, in the order it came, unless it is the
daemon's own, outside the configured subjects, a copy already published
(its event id is in a bounded memory of ids: JetStream redelivers what was
not acknowledged in time, and a publisher retries what it could not confirm),
of a type this daemon's catalog does not know, or not an envelope at all.
Each kind of skip is counted, and logged once, not once per message.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Literal, NamedTuple, get_args

import msgspec

from busd import BusdError, Catalog, Envelope, Event

from .subjects import IngestFilter, origin_of

__all__ = ["LOCAL_ONLY", "Incoming", "IngestStatistics", "Ingestor", "Outcome"]

logger = logging.getLogger("busd.nats")

LOCAL_ONLY = frozenset({"busd.stats", "busd.context", "busd.tool.timeout"})
"""Types each daemon's accountant derives from the stream events it has: never bridged,
so a frontend sees one timer and one context figure, not one per daemon."""

Outcome = Literal[
    "published", "duplicate", "own", "filtered", "local_only", "unknown", "malformed", "rejected"
]


class Incoming(NamedTuple):
    """One message from the stream, as the Trio side gets it."""

    subject: str
    data: bytes


class _Wire(msgspec.Struct, frozen=True):
    """An envelope with its event left as bytes, so an unknown type is not an error."""

    seq: int
    ts: float
    event: msgspec.Raw
    session_id: str | None = None
    run_id: str | None = None
    agent_id: str | None = None
    source: str = ""
    stale: bool = False
    id: str = ""


class _Tag(msgspec.Struct, frozen=True):
    type: str


class IngestStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """Messages by outcome; ``unknown_types`` names the types that were skipped.

    ``own`` and ``filtered`` stay near zero: the NATS side already drops those
    before they cross; this is the second check.
    """

    published: int
    duplicate: int
    own: int
    filtered: int
    local_only: int
    unknown: int
    malformed: int
    rejected: int
    unknown_types: list[str]


Publish = Callable[..., Envelope[Event]]


class Ingestor:
    """Decodes, de-duplicates and publishes messages through ``publish`` (``Daemon.publish``)."""

    def __init__(
        self, publish: Publish, catalog: Catalog, wanted: IngestFilter, *, seen: int
    ) -> None:
        self._publish = publish
        self._catalog = catalog
        self._wanted = wanted
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._seen_max = seen
        self._wire = msgspec.msgpack.Decoder(_Wire)
        self._tag = msgspec.msgpack.Decoder(_Tag)
        self._events = catalog.event_decoder()
        self._counts: dict[str, int] = dict.fromkeys(get_args(Outcome), 0)
        self._unknown_types: set[str] = set()
        self._warned: set[Any] = set()

    def seen(self, event_id: str) -> bool:
        """Whether ``event_id`` came in from NATS (the exporter skips those: no echo)."""
        return event_id in self._seen

    def remember(self, event_id: str) -> None:
        seen = self._seen
        seen[event_id] = None
        if len(seen) > self._seen_max:
            seen.popitem(last=False)

    def ingest(self, message: Incoming) -> Outcome:
        outcome = self._ingest(message)
        self._counts[outcome] += 1
        return outcome

    def _ingest(self, message: Incoming) -> Outcome:
        origin = origin_of(message.subject)
        if origin == self._wanted.daemon:
            return "own"
        if not self._wanted.wants(message.subject):
            return "filtered"
        try:
            wire = self._wire.decode(message.data)
            name = self._tag.decode(wire.event).type
        except msgspec.DecodeError as exc:
            self._warn_once(("malformed", origin), "not an event envelope", message.subject, exc)
            return "malformed"
        if wire.id and wire.id in self._seen:
            return "duplicate"
        if name in LOCAL_ONLY:
            return "local_only"
        if name not in self._catalog:
            if name not in self._unknown_types:
                self._unknown_types.add(name)
                logger.warning(
                    "nats %s: skipping %r events (from %s): this daemon's catalog has no such "
                    "type; install the plugin that defines it to receive them",
                    self._wanted.daemon,
                    name,
                    origin,
                )
            return "unknown"
        try:
            event = self._events.decode(wire.event)
            if wire.id:
                self.remember(wire.id)
            self._publish(
                event,
                session_id=wire.session_id,
                run_id=wire.run_id,
                agent_id=wire.agent_id,
                source=f"nats:{origin}",
                event_id=wire.id or None,
            )
        except (msgspec.DecodeError, BusdError) as exc:
            self._warn_once(
                ("rejected", name), f"a {name!r} event was refused", message.subject, exc
            )
            return "rejected"
        return "published"

    def _warn_once(self, key: Any, what: str, subject: str, exc: Exception) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(
                "nats %s: skipping %s on %s: %s (said once)",
                self._wanted.daemon,
                what,
                subject,
                exc,
            )

    def statistics(self) -> IngestStatistics:
        return IngestStatistics(**self._counts, unknown_types=sorted(self._unknown_types))
