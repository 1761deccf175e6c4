"""A publish frame's deltas go through the bus as runs: nothing anyone sees may change."""

from __future__ import annotations

from typing import Any

import msgspec
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from busd.core.accounting import Accountant
from busd.core.events import (
    Event,
    SessionIdle,
    TextDelta,
    ThinkingDelta,
    TokenUsage,
    TurnEnd,
    TurnStart,
    Usage,
)
from busd.daemon.hub import Daemon, DaemonConfig
from busd.wire import Outgoing
from tests.daemon_helpers import accepted

EVENTS = st.one_of(
    st.builds(lambda m, t: TextDelta(message_id=m, text=t), st.sampled_from("ab"), st.text()),
    st.builds(lambda t: ThinkingDelta(message_id="t", text=t), st.text(max_size=20)),
    st.builds(
        lambda n: Usage(tokens=TokenUsage(input_tokens=10, output_tokens=n)), st.integers(0, 99)
    ),
    st.just(TurnStart()),
    st.just(TurnEnd(finish_reason="end_turn")),
    st.just(SessionIdle()),
)


def seen(daemon: Daemon) -> list[Any]:
    """Everything the daemon accepted, derived events included, but each id and time."""
    return [
        (e.seq, e.event, e.session_id, e.run_id, e.agent_id, e.stale, e.source)
        for e in accepted(daemon)
    ]


def state(daemon: Daemon, sessions: set[str]) -> list[Any]:
    """Each session's summary and stats, but wall-clock times (the bus stamps its own)."""
    out = []
    for session in sorted(sessions):
        summary = msgspec.to_builtins(daemon.sessions.summary(session))
        out.append({k: v for k, v in summary.items() if not k.endswith("_ts")})
        out.append(msgspec.to_builtins(daemon.session_stats(session)))
    return out


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.lists(
            st.tuples(EVENTS, st.sampled_from(["s1", "s2"]), st.sampled_from([None, "ghost"])),
            max_size=12,
        ),
        max_size=6,
    )
)
def test_a_frame_published_as_runs_is_what_publishing_each_event_gives(
    frames: list[list[tuple[Event, str, str | None]]],
) -> None:
    """A run id nobody started makes its events stale: those take the slow path."""

    async def main() -> None:
        by_frame = Daemon(DaemonConfig(journal=None), accountant=Accountant(tick_interval=3600))
        one_by_one = Daemon(DaemonConfig(journal=None), accountant=Accountant(tick_interval=3600))
        async with trio.open_nursery() as nursery:
            for daemon in (by_frame, one_by_one):
                await nursery.start(daemon.run)
            for frame in frames:
                outgoing = [Outgoing(event=e, session_id=s, run_id=r) for e, s, r in frame]
                by_frame.publish_frame(outgoing, source="client-1")
                for e, s, r in frame:
                    one_by_one.publish(e, session_id=s, run_id=r, source="client-1")
                by_frame.settle()
                one_by_one.settle()
            assert seen(by_frame) == seen(one_by_one)
            sessions = {s for frame in frames for _, s, _ in frame}
            assert state(by_frame, sessions) == state(one_by_one, sessions)
            # The run asks the correlator once per place: its counts are still per event.
            assert by_frame.correlator.statistics() == one_by_one.correlator.statistics()
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock())


async def test_deltas_in_a_frame_are_one_run_each_type_and_message_in_order() -> None:
    daemon = Daemon(DaemonConfig(journal=None))
    runs: list[list[int]] = []
    daemon.bus.on_all(lambda e: None, many=lambda es: runs.append([e.seq for e in es]))
    events: list[Event] = [
        TextDelta(message_id="m", text="a"),
        TextDelta(message_id="m", text="b"),
        ThinkingDelta(message_id="t", text="c"),
        TurnEnd(finish_reason="end_turn"),
        TextDelta(message_id="m", text="d"),
    ]
    daemon.publish_frame([Outgoing(event=e, session_id="s1") for e in events], source="c")
    assert runs == [[1, 2], [3], [5]]  # the turn's end went alone, in its place
    assert [e.event for e in accepted(daemon) if e.source == "c"] == events
