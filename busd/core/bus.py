"""The bus: sequencing and typed-then-wildcard dispatch, synchronous and I/O-free.

Every accepted event gets the next ``seq`` and reaches its handlers in one
fixed order: handlers for its exact type, then pattern handlers, then
catch-all handlers, each group in registration order. A publish from inside
a handler is queued and dispatched once the current event has reached all of
its handlers (breadth-first), so dispatch order always equals ``seq`` order.

Handlers are plain callables: anything slow or asynchronous belongs behind
them (the daemon's fan-out), never inside them.

A *run* of events of one type from one place (:meth:`Bus.publish_stretch`,
a ``publish`` frame's deltas) is sequenced at once and reaches each handler as a whole: a
catch-all handler registered with ``many=`` takes the list in one call, the
others each event in turn. Only for such runs may a handler see event k+1
before the next handler has seen event k, and an event a handler publishes
meanwhile is sequenced after the run; the daemon batches only types its
handlers never publish on (deltas).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from itertools import repeat

from .catalog import Catalog
from .errors import UnknownEventType
from .events import Envelope, Event
from .ids import EventIds
from .patterns import Pattern, is_pattern
from .reports import Reports

__all__ = ["Bus", "BusStatistics", "Handle", "Handler", "HandlerError", "ManyHandler"]

logger = logging.getLogger("busd.bus")

Handler = Callable[[Envelope[Event]], object]
ManyHandler = Callable[[list[Envelope[Event]]], object]
"""Takes a run of envelopes at once; must do what the handler does with each, in order."""


@dataclass(frozen=True, slots=True)
class HandlerError:
    """A handler raised while an event was dispatched; the event went on to the others."""

    envelope: Envelope[Event]
    handler: Handler
    exception: Exception


ErrorListener = Callable[[HandlerError], object]


def _nothing() -> None:
    """``Bus.prepare_ids`` for an id source that has nothing to prepare."""


@dataclass(frozen=True, slots=True)
class BusStatistics:
    head_seq: int
    published: int
    handler_errors: int
    queued: int
    exact_handlers: int
    pattern_handlers: int
    catch_all_handlers: int


class _Entry:
    __slots__ = ("active", "handler", "many", "pattern", "type_name")

    def __init__(
        self,
        handler: Handler,
        type_name: str | None,
        pattern: Pattern | None,
        many: ManyHandler | None = None,
    ) -> None:
        self.handler = handler
        self.type_name = type_name
        self.pattern = pattern
        self.many = many
        self.active = True


class Handle:
    """Returned by :meth:`Bus.on`; unsubscribes its handler. Also a context manager."""

    __slots__ = ("_bus", "_entry")

    def __init__(self, bus: Bus, entry: _Entry) -> None:
        self._bus = bus
        self._entry = entry

    @property
    def active(self) -> bool:
        return self._entry.active

    def unsubscribe(self) -> None:
        """Stop calling the handler, from the next call on; calling it twice is harmless."""
        if self._entry.active:
            self._entry.active = False
            self._bus._remove(self._entry)

    def __enter__(self) -> Handle:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.unsubscribe()


class Bus:
    """Assigns ``seq`` and dispatches events to handlers in one total order."""

    def __init__(
        self,
        catalog: Catalog | None = None,
        *,
        clock: Callable[[], float] = time.time,
        first_seq: int = 1,
        new_id: Callable[[], str] | None = None,
        report_clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.catalog = catalog if catalog is not None else Catalog()
        self._clock = clock
        self._new_id = new_id if new_id is not None else EventIds()
        self._new_ids: Callable[[int], list[str]] = getattr(
            self._new_id, "many", lambda n: [self._new_id() for _ in range(n)]
        )
        self.prepare_ids: Callable[[], None] = getattr(self._new_id, "prepare", _nothing)
        """Have the next ids ready (:meth:`EventIds.prepare`): for where nothing waits."""
        self._seq = first_seq - 1
        self._exact: dict[str, list[_Entry]] = {}
        self._patterns: list[_Entry] = []
        self._catch_all: list[_Entry] = []
        self._error_listeners: list[ErrorListener] = []
        # Per event class: the ordered handler entries it reaches (rebuilt lazily).
        self._routes: dict[type[Event], tuple[_Entry, ...]] = {}
        self._queue: deque[Envelope[Event]] = deque()
        self._dispatching = False
        self._published = 0
        self._handler_errors = 0
        # A handler failing on every event: logged first, then now and then (core.reports);
        # every failure is still counted and told to the listeners.
        self._reports = Reports("handler", clock=report_clock)

    # -- registration --------------------------------------------------------

    def on(self, type_or_pattern: str, handler: Handler) -> Handle:
        """Call ``handler`` for an exact type name or a NATS-style pattern (``*``, ``>``)."""
        if is_pattern(type_or_pattern):
            entry = _Entry(handler, None, Pattern(type_or_pattern))
            self._patterns.append(entry)
        else:
            if type_or_pattern not in self.catalog:
                raise UnknownEventType(
                    f"unknown event type {type_or_pattern!r} (use a pattern such as "
                    f"'{type_or_pattern}.>' to match a family)"
                )
            entry = _Entry(handler, type_or_pattern, None)
            self._exact.setdefault(type_or_pattern, []).append(entry)
        self._routes.clear()
        return Handle(self, entry)

    def on_all(self, handler: Handler, *, many: ManyHandler | None = None) -> Handle:
        """Call ``handler`` for every event, after the typed and pattern handlers.

        ``many``, if given, takes a whole run (:meth:`publish_stretch`) in one call.
        """
        entry = _Entry(handler, None, None, many)
        self._catch_all.append(entry)
        self._routes.clear()
        return Handle(self, entry)

    def on_internal_error(self, listener: ErrorListener) -> Callable[[], None]:
        """Be told about every handler failure; returns a function that stops it."""
        self._error_listeners.append(listener)

        def remove() -> None:
            if listener in self._error_listeners:
                self._error_listeners.remove(listener)

        return remove

    def _remove(self, entry: _Entry) -> None:
        if entry.type_name is not None:
            self._exact[entry.type_name].remove(entry)
        elif entry.pattern is not None:
            self._patterns.remove(entry)
        else:
            self._catch_all.remove(entry)
        self._routes.clear()

    def _route(self, cls: type[Event], name: str) -> tuple[_Entry, ...]:
        route = (
            *self._exact.get(name, ()),
            *(e for e in self._patterns if e.pattern is not None and e.pattern.matches(name)),
            *self._catch_all,
        )
        self._routes[cls] = route
        return route

    # -- publishing ----------------------------------------------------------

    @property
    def head_seq(self) -> int:
        """The ``seq`` of the last accepted event (``first_seq - 1`` before any)."""
        return self._seq

    def publish(
        self,
        event: Event,
        *,
        session_id: str | None = None,
        run_id: str | None = None,
        agent_id: str | None = None,
        source: str = "",
        stale: bool = False,
        event_id: str | None = None,
    ) -> Envelope[Event]:
        """Validate, sequence and dispatch ``event``; returns its envelope.

        ``event_id`` keeps the id of an event that was accepted elsewhere (a
        bridged copy); every other event gets a new one.

        Called from inside a handler, the event is sequenced at once but
        dispatched only after the current event has reached every handler.
        """
        cls = type(event)
        route = self._routes.get(cls)
        if route is None:
            route = self._route(cls, self.catalog.check(event))
        self._seq += 1
        self._published += 1
        envelope: Envelope[Event] = Envelope(
            self._seq,
            self._clock(),
            event,
            session_id,
            run_id,
            agent_id,
            source,
            stale,
            event_id or self._new_id(),
        )
        if self._dispatching:
            self._queue.append(envelope)
            return envelope
        self._dispatching = True
        try:
            self._deliver(envelope, route)
            if self._queue:
                self._drain()
        finally:
            self._dispatching = False
        return envelope

    def publish_stretch(
        self,
        events: list[Event],
        *,
        session_id: str | None,
        run_id: str | None,
        agent_id: str | None,
        stale: bool,
        source: str = "",
    ) -> list[Envelope[Event]]:
        """Sequence and dispatch events of one type from one place as a run.

        Every event gets the next ``seq``, a new id, and the same ``ts``; the
        envelopes are made by ``map`` over the constructor (a publish frame's
        deltas: one message streaming into one session). From inside a
        handler, the events are published one by one instead.
        """
        if not events:
            return []
        if self._dispatching:
            return [
                self.publish(
                    e,
                    session_id=session_id,
                    run_id=run_id,
                    agent_id=agent_id,
                    source=source,
                    stale=stale,
                )
                for e in events
            ]
        cls = type(events[0])
        if len(set(map(type, events))) != 1:
            raise ValueError(f"a stretch is of one type: {cls.__qualname__} and others")
        route = self._routes.get(cls)
        if route is None:
            route = self._route(cls, self.catalog.check(events[0]))
        count = len(events)
        seq = self._seq
        envelopes: list[Envelope[Event]] = list(
            map(
                Envelope,
                range(seq + 1, seq + count + 1),
                repeat(self._clock(), count),
                events,
                repeat(session_id, count),
                repeat(run_id, count),
                repeat(agent_id, count),
                repeat(source, count),
                repeat(stale, count),
                self._new_ids(count),
            )
        )
        self._seq = seq + count
        self._dispatch_run(envelopes, route)
        return envelopes

    def _dispatch_run(self, envelopes: list[Envelope[Event]], route: tuple[_Entry, ...]) -> None:
        """Each handler of ``route`` once for the run (``many``) or once per envelope."""
        self._published += len(envelopes)
        self._dispatching = True
        try:
            for entry in route:
                if not entry.active:
                    continue
                many = entry.many
                if many is not None:
                    try:
                        many(envelopes)
                    except Exception as exc:
                        self._handler_failed(envelopes[0], entry.handler, exc)
                    continue
                handler = entry.handler
                for envelope in envelopes:
                    try:
                        handler(envelope)
                    except Exception as exc:
                        self._handler_failed(envelope, handler, exc)
            if self._queue:
                self._drain()
        finally:
            self._dispatching = False

    def _drain(self) -> None:
        """Dispatch what handlers published meanwhile, in ``seq`` order."""
        queue = self._queue
        while queue:
            queued = queue.popleft()
            qcls = type(queued.event)
            qroute = self._routes.get(qcls)
            if qroute is None:
                qroute = self._route(qcls, self.catalog.check(queued.event))
            self._deliver(queued, qroute)

    def _deliver(self, envelope: Envelope[Event], route: tuple[_Entry, ...]) -> None:
        for entry in route:
            if entry.active:
                try:
                    entry.handler(envelope)
                except Exception as exc:
                    self._handler_failed(envelope, entry.handler, exc)

    def _handler_failed(self, envelope: Envelope[Event], handler: Handler, exc: Exception) -> None:
        self._handler_errors += 1
        more = self._reports.due(handler)
        if more is not None:
            logger.error(
                "handler %r failed on %s (seq %d)%s",
                handler,
                envelope.event.__struct_config__.tag,
                envelope.seq,
                more,
                exc_info=exc,
            )
        error = HandlerError(envelope, handler, exc)
        for listener in tuple(self._error_listeners):
            try:
                listener(error)
            except Exception:
                logger.exception("internal-error listener %r failed", listener)

    def statistics(self) -> BusStatistics:
        return BusStatistics(
            head_seq=self._seq,
            published=self._published,
            handler_errors=self._handler_errors,
            queued=len(self._queue),
            exact_handlers=sum(len(v) for v in self._exact.values()),
            pattern_handlers=len(self._patterns),
            catch_all_handlers=len(self._catch_all),
        )
