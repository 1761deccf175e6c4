from __future__ import annotations

import logging
from itertools import count

import pytest
from hypothesis import given
from hypothesis import strategies as st

from busd.core.bus import Bus, HandlerError
from busd.core.errors import InvalidPattern, UnknownEventType
from busd.core.events import (
    Envelope,
    Event,
    SessionIdle,
    TextComplete,
    TextDelta,
    ThinkingDelta,
    TokenUsage,
    Usage,
)
from busd.core.reports import REPORT_EVERY

Seen = list[tuple[str, int]]


def recorder(seen: Seen, label: str):  # type: ignore[no-untyped-def]
    def handler(envelope: Envelope[Event]) -> None:
        seen.append((label, envelope.seq))

    return handler


def delta(text: str = "x") -> TextDelta:
    return TextDelta(message_id="m1", text=text)


def test_typed_then_pattern_then_catch_all_each_in_registration_order() -> None:
    bus = Bus()
    seen: Seen = []
    # Registered deliberately out of dispatch order.
    bus.on_all(recorder(seen, "all-1"))
    bus.on("stream.>", recorder(seen, "pattern-1"))
    bus.on("stream.text.delta", recorder(seen, "typed-1"))
    bus.on_all(recorder(seen, "all-2"))
    bus.on("stream.*.delta", recorder(seen, "pattern-2"))
    bus.on("stream.text.delta", recorder(seen, "typed-2"))

    bus.publish(delta())

    assert [label for label, _ in seen] == [
        "typed-1",
        "typed-2",
        "pattern-1",
        "pattern-2",
        "all-1",
        "all-2",
    ]


def test_handlers_only_see_what_they_asked_for() -> None:
    bus = Bus()
    seen: Seen = []
    bus.on("stream.thinking.delta", recorder(seen, "thinking"))
    bus.on("stream.text.*", recorder(seen, "text"))
    bus.publish(delta())
    bus.publish(ThinkingDelta(message_id="m1", text="hm"))
    bus.publish(SessionIdle())
    assert seen == [("text", 1), ("thinking", 2)]


def test_seq_is_strictly_increasing_and_stamped_on_the_envelope() -> None:
    times = count(100.0)
    bus = Bus(clock=lambda: next(times), first_seq=41)
    envelopes = [bus.publish(delta(str(i)), session_id="s", source="test") for i in range(5)]
    assert [e.seq for e in envelopes] == [41, 42, 43, 44, 45]
    assert [e.ts for e in envelopes] == [100.0, 101.0, 102.0, 103.0, 104.0]
    assert {e.session_id for e in envelopes} == {"s"}
    assert bus.head_seq == 45


def test_a_raising_handler_is_isolated_counted_and_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bus = Bus()
    seen: Seen = []
    errors: list[HandlerError] = []

    def broken(envelope: Envelope[Event]) -> None:
        raise RuntimeError("boom")

    bus.on("stream.text.delta", broken)
    bus.on("stream.text.delta", recorder(seen, "typed"))
    bus.on_all(recorder(seen, "all"))
    bus.on_internal_error(errors.append)

    with caplog.at_level(logging.ERROR, logger="busd.bus"):
        bus.publish(delta())
        bus.publish(delta())

    assert seen == [("typed", 1), ("all", 1), ("typed", 2), ("all", 2)]
    assert bus.statistics().handler_errors == 2
    assert [e.envelope.seq for e in errors] == [1, 2]
    assert isinstance(errors[0].exception, RuntimeError)
    assert errors[0].handler is broken
    assert "failed on stream.text.delta" in caplog.text


def test_a_handler_failing_on_every_event_is_logged_now_and_then_and_always_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A traceback per event (a plugin's handler broken on deltas) flooded the log and
    slowed the daemon for everyone: the first is logged, then one an interval."""
    now = [0.0]
    bus = Bus(report_clock=lambda: now[0])
    errors: list[HandlerError] = []
    seen: Seen = []

    def broken(envelope: Envelope[Event]) -> None:
        raise RuntimeError("boom")

    bus.on("stream.text.delta", broken)
    bus.on_all(recorder(seen, "all"))
    bus.on_internal_error(errors.append)
    with caplog.at_level(logging.ERROR, logger="busd.bus"):
        for _ in range(1000):
            bus.publish(delta())
        bus.publish_stretch(
            [delta(), delta()], session_id=None, run_id=None, agent_id=None, stale=False
        )
        assert len(caplog.records) == 1
        now[0] += REPORT_EVERY
        bus.publish(delta())
    assert bus.statistics().handler_errors == len(errors) == 1003  # every one counted and told
    assert len(seen) == 1003  # and the other handlers saw every event
    assert len(caplog.records) == 2
    said = caplog.records[1].getMessage()
    more = "1001 more failures of this handler since the last report"
    assert said.endswith(f"(and {more}, {REPORT_EVERY:g} s ago)")


def test_a_raising_error_listener_does_not_break_dispatch() -> None:
    bus = Bus()
    seen: Seen = []

    def broken(envelope: Envelope[Event]) -> None:
        raise RuntimeError("boom")

    def broken_listener(error: HandlerError) -> None:
        raise RuntimeError("listener boom")

    bus.on_all(broken)
    bus.on_all(recorder(seen, "after"))
    bus.on_internal_error(broken_listener)
    bus.publish(delta())
    assert seen == [("after", 1)]


def test_publish_from_a_handler_is_breadth_first() -> None:
    bus = Bus()
    order: list[tuple[str, int, str]] = []

    def on_delta(envelope: Envelope[Event]) -> None:
        order.append(("typed", envelope.seq, "delta"))
        if isinstance(envelope.event, TextDelta) and envelope.event.text == "go":
            inner = bus.publish(TextComplete(message_id="m1", text="go"))
            # Sequenced at once, dispatched later.
            assert inner.seq == envelope.seq + 1
            order.append(("published", inner.seq, "complete"))

    def catch_all(envelope: Envelope[Event]) -> None:
        order.append(("all", envelope.seq, type(envelope.event).__name__))

    bus.on("stream.text.delta", on_delta)
    bus.on_all(catch_all)
    bus.publish(delta("go"))

    assert order == [
        ("typed", 1, "delta"),
        ("published", 2, "complete"),
        ("all", 1, "TextDelta"),
        ("all", 2, "TextComplete"),
    ]


@given(st.lists(st.integers(min_value=0, max_value=3), max_size=30))
def test_dispatch_order_equals_seq_order_under_any_reentrant_publishing(
    fanouts: list[int],
) -> None:
    """Each handler call republishes some number of events; the catch-all sees seq order."""
    bus = Bus()
    plan = iter(fanouts)
    seen: list[int] = []

    def republish(envelope: Envelope[Event]) -> None:
        for _ in range(next(plan, 0)):
            bus.publish(delta())

    bus.on("stream.text.delta", republish)
    bus.on_all(lambda envelope: seen.append(envelope.seq))
    bus.publish(delta())

    assert seen == list(range(1, bus.head_seq + 1))
    assert bus.statistics().queued == 0


def test_unsubscribe_is_idempotent_and_takes_effect_immediately() -> None:
    bus = Bus()
    seen: Seen = []
    handle = bus.on("stream.text.delta", recorder(seen, "typed"))
    pattern = bus.on("stream.>", recorder(seen, "pattern"))
    everything = bus.on_all(recorder(seen, "all"))
    bus.publish(delta())
    handle.unsubscribe()
    handle.unsubscribe()
    pattern.unsubscribe()
    with everything:
        bus.publish(delta())
    bus.publish(delta())
    assert seen == [("typed", 1), ("pattern", 1), ("all", 1), ("all", 2)]
    assert not everything.active
    stats = bus.statistics()
    assert (stats.exact_handlers, stats.pattern_handlers, stats.catch_all_handlers) == (0, 0, 0)


def test_a_handler_unsubscribed_mid_dispatch_is_not_called_again() -> None:
    bus = Bus()
    seen: Seen = []
    later = bus.on_all(recorder(seen, "later"))

    def first(envelope: Envelope[Event]) -> None:
        later.unsubscribe()

    bus.on("stream.text.delta", first)
    bus.publish(delta())
    assert seen == []


def test_unknown_event_types_are_rejected_at_the_boundary() -> None:
    class Stray(Event, frozen=True, tag="acme.stray"):
        pass

    bus = Bus()
    seen: Seen = []
    bus.on_all(recorder(seen, "all"))
    with pytest.raises(UnknownEventType, match="not a registered event type"):
        bus.publish(Stray())
    with pytest.raises(UnknownEventType):
        bus.publish("stream.text.delta")  # type: ignore[arg-type]
    assert seen == []
    assert bus.head_seq == 0  # a rejected event takes no seq

    bus.catalog.register(Stray)
    bus.publish(Stray())
    assert seen == [("all", 1)]


def test_subscribing_to_an_unknown_exact_type_or_bad_pattern_fails_loudly() -> None:
    bus = Bus()
    with pytest.raises(UnknownEventType, match=r"stream\.text\.deltas"):
        bus.on("stream.text.deltas", lambda envelope: None)
    with pytest.raises(InvalidPattern):
        bus.on("stream.>.delta", lambda envelope: None)


def test_route_cache_follows_later_registrations() -> None:
    bus = Bus()
    seen: Seen = []
    bus.publish(Usage(tokens=TokenUsage(output_tokens=1)))
    bus.on("stream.usage", recorder(seen, "typed"))
    bus.publish(Usage(tokens=TokenUsage(output_tokens=2)))
    assert seen == [("typed", 2)]


# -- runs ----------------------------------------------------------------------------


def stretch(bus: Bus, *events: Event, source: str = "") -> list[Envelope[Event]]:
    """``publish_stretch`` of events from session s1."""
    return bus.publish_stretch(
        list(events), session_id="s1", run_id=None, agent_id=None, stale=False, source=source
    )


def test_a_run_is_sequenced_at_once_and_reaches_each_handler_whole() -> None:
    bus = Bus()
    seen: Seen = []
    runs: list[list[int]] = []
    bus.on("stream.text.delta", recorder(seen, "typed"))
    bus.on_all(recorder(seen, "one"), many=lambda es: runs.append([e.seq for e in es]))
    bus.on_all(recorder(seen, "plain"))
    envelopes = stretch(bus, delta("a"), delta("b"), delta("c"), source="me")
    assert [e.seq for e in envelopes] == [1, 2, 3]
    assert {e.ts for e in envelopes} == {envelopes[0].ts}  # accepted together
    assert len({e.id for e in envelopes}) == 3
    assert {e.source for e in envelopes} == {"me"}
    assert runs == [[1, 2, 3]]  # the one with many= in one call, instead of its handler
    assert seen == [
        ("typed", 1),
        ("typed", 2),
        ("typed", 3),
        ("plain", 1),
        ("plain", 2),
        ("plain", 3),
    ]
    assert bus.statistics().published == 3


def test_what_a_handler_publishes_during_a_run_follows_the_run() -> None:
    bus = Bus()
    order: list[tuple[int, str]] = []

    def derive(envelope: Envelope[Event]) -> None:
        order.append((envelope.seq, envelope.event.__struct_config__.tag))  # type: ignore[arg-type]
        if isinstance(envelope.event, TextDelta) and envelope.event.text == "a":
            bus.publish(SessionIdle(), session_id="s1")

    bus.on_all(derive)
    stretch(bus, delta("a"), delta("b"))
    assert order == [(1, "stream.text.delta"), (2, "stream.text.delta"), (3, "stream.session.idle")]


def test_a_run_published_from_a_handler_goes_one_by_one_in_turn() -> None:
    bus = Bus()
    order: list[int] = []

    def handler(envelope: Envelope[Event]) -> None:
        order.append(envelope.seq)
        if envelope.seq == 1:
            stretch(bus, delta("b"), delta("c"))

    bus.on_all(handler)
    bus.publish(delta("a"), session_id="s1")
    assert order == [1, 2, 3]


def test_a_run_of_two_types_is_refused_whole() -> None:
    bus = Bus()
    seen: Seen = []
    bus.on_all(recorder(seen, "all"))
    with pytest.raises(ValueError, match="one type"):
        stretch(bus, delta("a"), ThinkingDelta(message_id="m1", text="b"))
    assert (seen, bus.head_seq) == ([], 0)


def test_a_failing_many_handler_is_reported_once_and_the_others_get_the_run() -> None:
    bus = Bus()
    seen: Seen = []
    errors: list[HandlerError] = []
    bus.on_internal_error(errors.append)

    def explode(envelopes: list[Envelope[Event]]) -> None:
        raise RuntimeError("boom")

    bus.on_all(recorder(seen, "unused"), many=explode)
    bus.on_all(recorder(seen, "after"))
    stretch(bus, delta("a"), delta("b"))
    assert seen == [("after", 1), ("after", 2)]
    assert [(e.envelope.seq, str(e.exception)) for e in errors] == [(1, "boom")]
