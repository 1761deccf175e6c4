from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import cast

import msgspec
import pytest

from busd.core.coalesce import (
    DELTA_TYPES,
    KEYED_TYPES,
    LIFECYCLE_TYPES,
    Accumulator,
    AccumulatorFull,
    chain_keyers,
    coalescing_key,
)
from busd.core.errors import BusdError
from busd.core.events import (
    BUILTIN_EVENTS,
    AgentComplete,
    AgentStart,
    AgentUpdate,
    ContextUsage,
    Envelope,
    Event,
    InternalError,
    PermissionRequested,
    PermissionResolved,
    RunCancelled,
    RunFinished,
    RunStarted,
    SessionCompaction,
    SessionContext,
    SessionContextParts,
    SessionError,
    SessionIdle,
    SessionInfo,
    SessionRetry,
    SessionStart,
    SessionTitleChanged,
    SessionTruncation,
    SessionWarning,
    StreamingStats,
    TextComplete,
    TextDelta,
    ThinkingComplete,
    ThinkingDelta,
    TokenUsage,
    ToolComplete,
    ToolPartialResult,
    ToolStart,
    ToolTimeout,
    TurnEnd,
    TurnStart,
    Usage,
    UserPrompt,
)


class PluginPing(Event, frozen=True, tag="acme.ping"):
    n: int = 0


def _seqs() -> Iterator[int]:
    n = 0
    while True:
        n += 1
        yield n


class Stream:
    """Builds envelopes with strictly increasing seq (ts = seq / 10)."""

    def __init__(self) -> None:
        self._seq = _seqs()

    def __call__(
        self,
        event: Event,
        *,
        session: str | None = "s1",
        agent: str | None = None,
        run: str | None = "r1",
        source: str = "claude",
        stale: bool = False,
    ) -> Envelope[Event]:
        seq = next(self._seq)
        return Envelope(
            seq=seq,
            ts=seq / 10,
            event=event,
            session_id=session,
            run_id=run,
            agent_id=agent,
            source=source,
            stale=stale,
        )


@pytest.fixture
def env() -> Stream:
    return Stream()


def usage(output: int) -> Usage:
    return Usage(tokens=TokenUsage(input_tokens=10, output_tokens=output))


def fill(acc: Accumulator, *envelopes: Envelope[Event]) -> list[Envelope[Event]]:
    for e in envelopes:
        acc.add(e)
    return acc.drain()


# -- the key table -----------------------------------------------------------------


def test_every_builtin_event_type_has_exactly_one_coalescing_rule() -> None:
    groups = [KEYED_TYPES, DELTA_TYPES, LIFECYCLE_TYPES]
    for cls in BUILTIN_EVENTS:
        assert sum(cls in g for g in groups) == 1, cls.__name__
    assert set().union(*groups) == set(BUILTIN_EVENTS)


SNAPSHOTS: list[tuple[Event, Event]] = [
    (usage(1), usage(2)),
    (ToolStart(tool_call_id="t1", name="Bash"), ToolStart(tool_call_id="t1", name="Bash2")),
    (
        ToolPartialResult(tool_call_id="t1", output="a"),
        ToolPartialResult(tool_call_id="t1", output="ab"),
    ),
    (ToolComplete(tool_call_id="t1"), ToolComplete(tool_call_id="t1", status="error")),
    (AgentUpdate(agent_id="a1", status="reading"), AgentUpdate(agent_id="a1", status="writing")),
    (TextComplete(message_id="m1", text="x"), TextComplete(message_id="m1", text="xy")),
    (ThinkingComplete(message_id="m1", text="x"), ThinkingComplete(message_id="m1", text="xy")),
    (SessionTitleChanged(title="a"), SessionTitleChanged(title="b")),
    (SessionRetry(attempt=1), SessionRetry(attempt=2)),
    (StreamingStats(elapsed_s=1.0), StreamingStats(elapsed_s=2.0)),
    (ContextUsage(used=1), ContextUsage(used=2)),
    (SessionContext(used=1), SessionContext(used=2)),
    (SessionContextParts(system=1), SessionContextParts(system=2, tools=3)),
]


@pytest.mark.parametrize(("first", "second"), SNAPSHOTS, ids=lambda e: type(e).__name__)
def test_later_snapshot_supersedes_earlier_and_keeps_its_own_position(
    env: Stream, first: Event, second: Event
) -> None:
    acc = Accumulator()
    a = env(first)
    b = env(TurnStart())
    c = env(second)
    d = env(TurnEnd())
    assert fill(acc, a, b, c, d) == [b, c, d]


@pytest.mark.parametrize(("first", "second"), SNAPSHOTS, ids=lambda e: type(e).__name__)
def test_snapshots_of_other_sessions_do_not_supersede(
    env: Stream, first: Event, second: Event
) -> None:
    a = env(first, session="s1")
    b = env(second, session="s2")
    assert fill(Accumulator(), a, b) == [a, b]


@pytest.mark.parametrize(("first", "second"), SNAPSHOTS, ids=lambda e: type(e).__name__)
def test_stale_snapshot_never_hides_a_live_one(env: Stream, first: Event, second: Event) -> None:
    a = env(first)
    b = env(second, stale=True)
    assert fill(Accumulator(), a, b) == [a, b]


def test_snapshot_table_covers_every_keyed_type() -> None:
    assert {type(first) for first, _ in SNAPSHOTS} == KEYED_TYPES


def test_usage_is_kept_per_agent(env: Stream) -> None:
    main = env(usage(5))
    sub = env(usage(7), agent="a1")
    main2 = env(usage(9))
    assert fill(Accumulator(), main, sub, main2) == [sub, main2]


def test_a_later_usage_keeps_the_per_model_breakdown(env: Stream) -> None:
    """Usage is cumulative and each report carries the whole breakdown (as the
    adapters send it), so the later report supersedes without losing a model:
    sonnet 266 -> 412, haiku 3 in both."""
    haiku = TokenUsage(output_tokens=3)
    early = Usage(
        tokens=TokenUsage(output_tokens=269),
        models={"sonnet": TokenUsage(output_tokens=266), "haiku": haiku},
    )
    late = Usage(
        tokens=TokenUsage(output_tokens=415),
        models={"sonnet": TokenUsage(output_tokens=412), "haiku": haiku},
    )
    a, b = env(early), env(late)
    (kept,) = fill(Accumulator(), a, b)
    assert kept is b
    assert isinstance(kept.event, Usage)
    assert {m: u.output_tokens for m, u in kept.event.models.items()} == {
        "sonnet": 412,
        "haiku": 3,
    }
    assert sum(u.output_tokens for u in kept.event.models.values()) == 412 + 3


def test_keys_differ_per_identifier(env: Stream) -> None:
    events = [
        env(ToolStart(tool_call_id="t1", name="Bash")),
        env(ToolStart(tool_call_id="t2", name="Bash")),
        env(AgentUpdate(agent_id="a1", status="x")),
        env(AgentUpdate(agent_id="a2", status="x")),
        env(TextComplete(message_id="m1", text="x")),
        env(TextComplete(message_id="m2", text="x")),
    ]
    assert fill(Accumulator(), *events) == events


def test_different_types_with_the_same_identifier_never_collide(env: Stream) -> None:
    events = [
        env(ToolStart(tool_call_id="t1", name="Bash")),
        env(ToolPartialResult(tool_call_id="t1", output="a")),
        env(ToolComplete(tool_call_id="t1")),
        env(TextComplete(message_id="m1", text="x")),
        env(ThinkingComplete(message_id="m1", text="x")),
        env(SessionTitleChanged(title="a")),
        env(SessionRetry(attempt=1)),
        env(StreamingStats(elapsed_s=1.0)),
        env(ContextUsage(used=1)),
        env(SessionContext(used=1)),
        env(usage(1)),
    ]
    keys = [coalescing_key(e) for e in events]
    assert len(set(keys)) == len(keys)
    assert fill(Accumulator(), *events) == events


LIFECYCLE: list[Event] = [
    SessionStart(),
    SessionIdle(),
    SessionError(message="boom"),
    SessionInfo(message="hi"),
    SessionWarning(message="careful"),
    SessionCompaction(),
    SessionTruncation(),
    UserPrompt(text="Go.", prompt_id="p1"),
    TurnStart(),
    TurnEnd(),
    AgentStart(agent_id="a1"),
    AgentComplete(agent_id="a1"),
    PermissionRequested(request_id="p1", tool="Bash"),
    PermissionResolved(request_id="p1", outcome="allowed"),
    ToolTimeout(tool_call_id="t1", name="Bash", limit_s=1, elapsed_s=2),
    RunStarted(adapter="claude"),
    RunCancelled(),
    RunFinished(status="ok", duration_s=1.0),
    InternalError(where="x", message="y"),
]


def test_lifecycle_list_covers_every_lifecycle_type() -> None:
    assert {type(e) for e in LIFECYCLE} == LIFECYCLE_TYPES


@pytest.mark.parametrize("event", LIFECYCLE, ids=lambda e: type(e).__name__)
def test_lifecycle_events_are_never_superseded(env: Stream, event: Event) -> None:
    assert coalescing_key(env(event)) is None
    twice = [env(event), env(event)]
    assert fill(Accumulator(), *twice) == twice


def test_session_start_and_idle_of_one_session_both_survive(env: Stream) -> None:
    events = [env(SessionStart()), env(SessionIdle()), env(SessionStart()), env(SessionIdle())]
    assert fill(Accumulator(), *events) == events


def test_a_keyer_cannot_make_lifecycle_events_or_deltas_supersede(env: Stream) -> None:
    acc = Accumulator(keyer=lambda e: "everything", merge_deltas=False)
    events = [
        env(SessionStart()),
        env(TextDelta(message_id="m1", text="a")),
        env(SessionIdle()),
        env(TextDelta(message_id="m1", text="b")),
        env(RunFinished(status="ok", duration_s=1)),
    ]
    assert fill(acc, *events) == events


def test_plugin_types_are_not_coalesced_by_default(env: Stream) -> None:
    events = [env(PluginPing(n=1)), env(PluginPing(n=1))]
    assert coalescing_key(events[0]) is None
    assert fill(Accumulator(), *events) == events


def test_chained_plugin_keyer_coalesces_custom_types_and_keeps_builtin_keys(env: Stream) -> None:
    def plugin_keyer(e: Envelope[Event]) -> Hashable | None:
        return ("acme.ping", e.session_id) if isinstance(e.event, PluginPing) else None

    keyer = chain_keyers(plugin_keyer, coalescing_key)
    a, b, c, d = env(PluginPing(n=1)), env(usage(1)), env(PluginPing(n=2)), env(usage(2))
    assert keyer(a) == ("acme.ping", "s1")
    assert keyer(b) == coalescing_key(b)
    assert keyer(env(SessionStart())) is None
    assert fill(Accumulator(keyer=keyer), a, b, c, d) == [c, d]


def test_chain_keyers_asks_in_order_and_stops_at_the_first_key(env: Stream) -> None:
    asked: list[str] = []

    def first(e: Envelope[Event]) -> Hashable | None:
        asked.append("first")
        return "k1"

    def second(e: Envelope[Event]) -> Hashable | None:
        asked.append("second")
        return "k2"

    assert chain_keyers(first, second)(env(PluginPing())) == "k1"
    assert asked == ["first"]
    assert chain_keyers(second) is second
    with pytest.raises(ValueError, match="at least one"):
        chain_keyers()


# -- deltas --------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [TextDelta, ThinkingDelta])
def test_adjacent_deltas_merge_into_one_with_the_later_seq_and_ts(
    env: Stream, cls: type[TextDelta | ThinkingDelta]
) -> None:
    a, b, c = (env(cls(message_id="m1", text=t)) for t in ("Hel", "lo", " world"))
    (merged,) = fill(Accumulator(), a, b, c)
    assert merged == msgspec.structs.replace(c, event=cls(message_id="m1", text="Hello world"))
    assert (merged.seq, merged.ts) == (c.seq, c.ts)


def test_a_merged_delta_stops_growing_at_its_cap_and_a_new_one_starts(env: Stream) -> None:
    texts = ["abcd", "efgh", "ij", "k", "lmnopq", "r"]
    deltas = [env(TextDelta(message_id="m1", text=t)) for t in texts]
    merged = fill(Accumulator(max_merged_chars=10), *deltas)
    assert [cast(TextDelta, e.event).text for e in merged] == ["abcdefghij", "klmnopqr"]
    assert [e.seq for e in merged] == [deltas[2].seq, deltas[5].seq]
    (alone,) = fill(Accumulator(max_merged_chars=3), env(TextDelta(message_id="m2", text="long")))
    assert cast(TextDelta, alone.event).text == "long"  # one delta over the cap is kept whole


def test_the_merge_cap_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_merged_chars"):
        Accumulator(max_merged_chars=0)


@pytest.mark.parametrize(
    "change",
    [
        {"session": "s2"},
        {"agent": "a1"},
        {"run": "r2"},
        {"source": "copilot"},
        {"stale": True},
    ],
    ids=lambda d: next(iter(d)),
)
def test_deltas_with_different_envelope_fields_do_not_merge(
    env: Stream, change: dict[str, object]
) -> None:
    a = env(TextDelta(message_id="m1", text="a"))
    b = env(TextDelta(message_id="m1", text="b"), **change)  # type: ignore[arg-type]
    assert fill(Accumulator(), a, b) == [a, b]


def test_deltas_of_other_messages_or_kinds_do_not_merge(env: Stream) -> None:
    events = [
        env(TextDelta(message_id="m1", text="a")),
        env(TextDelta(message_id="m2", text="b")),
        env(ThinkingDelta(message_id="m2", text="c")),
        env(TextDelta(message_id="m2", text="d")),
    ]
    assert fill(Accumulator(), *events) == events


def test_deltas_do_not_merge_across_any_other_event(env: Stream) -> None:
    a = env(TextDelta(message_id="m1", text="a"))
    u1 = env(usage(1))
    b = env(TextDelta(message_id="m1", text="b"))
    u2 = env(usage(2))  # supersedes u1; a and b are still not adjacent at add time
    c = env(TextDelta(message_id="m1", text="c"))
    assert fill(Accumulator(), a, u1, b, u2, c) == [a, b, u2, c]


def test_deltas_do_not_merge_across_drains(env: Stream) -> None:
    acc = Accumulator()
    a = env(TextDelta(message_id="m1", text="a"))
    b = env(TextDelta(message_id="m1", text="b"))
    assert fill(acc, a) == [a]
    assert fill(acc, b) == [b]


def test_raw_mode_passes_deltas_one_by_one_but_still_supersedes_snapshots(env: Stream) -> None:
    acc = Accumulator(merge_deltas=False)
    a = env(TextDelta(message_id="m1", text="a"))
    b = env(TextDelta(message_id="m1", text="b"))
    u1, u2 = env(usage(1)), env(usage(2))
    assert not acc.merge_deltas
    assert fill(acc, a, b, u1, u2) == [a, b, u2]


def test_unmerged_delta_is_passed_through_unchanged(env: Stream) -> None:
    a = env(TextDelta(message_id="m1", text="a"))
    (out,) = fill(Accumulator(), a)
    assert out is a


# -- buffer, drain, statistics -------------------------------------------------------


def test_drain_empties_the_buffer(env: Stream) -> None:
    acc = Accumulator()
    assert not acc
    assert acc.drain() == []
    a, b = env(TurnStart()), env(TurnEnd())
    acc.add(a)
    acc.add(b)
    assert acc
    assert len(acc) == 2
    assert acc.drain() == [a, b]
    assert not acc
    assert len(acc) == 0
    assert acc.drain() == []


def test_len_counts_survivors_not_inputs(env: Stream) -> None:
    acc = Accumulator()
    for e in [env(usage(1)), env(usage(2)), env(TextDelta(message_id="m", text="a"))]:
        acc.add(e)
    acc.add(env(TextDelta(message_id="m", text="b")))
    assert len(acc) == 2


def test_first_seq_is_the_oldest_undrained_input_even_when_merged_or_superseded(
    env: Stream,
) -> None:
    acc = Accumulator()
    assert acc.first_seq is None
    d1 = env(TextDelta(message_id="m", text="a"))
    d2 = env(TextDelta(message_id="m", text="b"))
    acc.add(d1)
    acc.add(d2)
    assert acc.first_seq == d1.seq
    assert acc.drain()[0].seq == d2.seq
    assert acc.first_seq is None
    u1, u2 = env(usage(1)), env(usage(2))
    acc.add(u1)
    acc.add(u2)
    assert acc.first_seq == u1.seq


def test_statistics_count_what_happened(env: Stream) -> None:
    acc = Accumulator()
    for e in [
        env(usage(1)),
        env(usage(2)),
        env(TextDelta(message_id="m", text="a")),
        env(TextDelta(message_id="m", text="b")),
        env(TurnEnd()),
    ]:
        acc.add(e)
    stats = acc.statistics()
    assert (stats.buffered, stats.added, stats.superseded, stats.merged) == (3, 5, 1, 1)
    assert (stats.drained_batches, stats.drained_events) == (0, 0)
    acc.drain()
    acc.drain()
    stats = acc.statistics()
    assert (stats.buffered, stats.drained_batches, stats.drained_events) == (0, 1, 3)


def test_many_supersedes_keep_order_through_compaction(env: Stream) -> None:
    acc = Accumulator(max_events=8)
    expected: dict[str, Envelope[Event]] = {}
    for i in range(2_000):
        tool = f"t{i % 5}"
        e = env(ToolPartialResult(tool_call_id=tool, output=str(i)))
        acc.add(e)
        expected[tool] = e
    last = env(TurnEnd())
    acc.add(last)
    out = acc.drain()
    assert out == [*sorted(expected.values(), key=lambda e: e.seq), last]
    assert acc.statistics().superseded == 2_000 - 5


def test_long_delta_runs_are_joined_exactly(env: Stream) -> None:
    pieces = [f"{i}," for i in range(5_000)]
    acc = Accumulator(max_events=1)
    for p in pieces:
        acc.add(env(ThinkingDelta(message_id="m", text=p)))
    (out,) = acc.drain()
    assert isinstance(out.event, ThinkingDelta)
    assert out.event.text == "".join(pieces)


# -- the cap ---------------------------------------------------------------------------


def test_full_accumulator_refuses_a_new_slot_and_leaves_the_buffer_untouched(env: Stream) -> None:
    acc = Accumulator(max_events=3)
    a = env(TextDelta(message_id="m", text="a"))
    b = env(TextDelta(message_id="m", text="b"))
    u = env(usage(1))
    t = env(TurnStart())
    for e in (a, b, u, t):
        acc.add(e)
    before = acc.statistics()
    with pytest.raises(AccumulatorFull, match="max_events=3") as info:
        acc.add(env(TurnEnd()))
    assert isinstance(info.value, BusdError)
    assert acc.statistics() == before
    assert len(acc) == 3
    assert acc.first_seq == a.seq
    merged = msgspec.structs.replace(b, event=TextDelta(message_id="m", text="ab"))
    assert acc.drain() == [merged, u, t]


def test_full_accumulator_still_takes_supersedes_and_merges(env: Stream) -> None:
    acc = Accumulator(max_events=2)
    u1 = env(usage(1))
    d1 = env(TextDelta(message_id="m", text="a"))
    acc.add(u1)
    acc.add(d1)
    d2 = env(TextDelta(message_id="m", text="b"))
    acc.add(d2)  # merge: no new slot
    u2 = env(usage(2))
    acc.add(u2)  # supersede: no new slot
    with pytest.raises(AccumulatorFull):
        acc.add(env(TextDelta(message_id="m", text="c")))  # no longer adjacent to d2
    merged = msgspec.structs.replace(d2, event=TextDelta(message_id="m", text="ab"))
    assert acc.drain() == [merged, u2]


def test_max_events_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Accumulator(max_events=0)


def test_clear_discards_the_buffer_without_counting_a_drain(env: Stream) -> None:
    acc = Accumulator()
    acc.add(env(TextDelta(message_id="m", text="a")))
    acc.add(env(TextDelta(message_id="m", text="b")))
    acc.add(env(usage(1)))
    acc.clear()
    assert (len(acc), acc.first_seq) == (0, None)
    assert acc.statistics().drained_batches == 0
    c = env(TextDelta(message_id="m", text="c"))
    assert fill(acc, c) == [c]
