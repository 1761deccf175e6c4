"""Event ids: UUIDv7, unique, time-ordered, kept by copies."""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Callable

from hypothesis import given
from hypothesis import strategies as st

from busd.core.bus import Bus
from busd.core.events import SessionIdle
from busd.core.ids import EventIds


def test_ids_are_uuid7_with_the_current_millisecond() -> None:
    before = time.time_ns() // 1_000_000
    parsed = uuid.UUID(EventIds()())
    after = time.time_ns() // 1_000_000
    assert parsed.version == 7
    assert parsed.variant == uuid.RFC_4122
    assert before <= parsed.int >> 80 <= after


def test_one_generator_never_repeats_and_sorts_in_order_of_making() -> None:
    ids = EventIds()
    made = [ids() for _ in range(10_000)]
    assert len(set(made)) == len(made)
    assert sorted(made) == made


def test_two_generators_do_not_collide() -> None:
    a, b = EventIds(), EventIds()
    assert not {a() for _ in range(1000)} & {b() for _ in range(1000)}


def test_the_bus_gives_every_event_an_id_and_keeps_a_copys() -> None:
    bus = Bus()
    first = bus.publish(SessionIdle(), session_id="s")
    second = bus.publish(SessionIdle(), session_id="s")
    assert uuid.UUID(first.id).version == 7
    assert first.id != second.id
    copy = bus.publish(SessionIdle(), session_id="s", event_id=first.id)
    assert copy.id == first.id
    assert copy.seq == second.seq + 1


def test_ids_across_a_carry_into_the_cached_part_stay_exact_and_ordered() -> None:
    ids = EventIds()
    ids._base = (1 << 62) - 3  # the counter carries through the cached groups after 2 ids
    made = [uuid.UUID(ids()) for _ in range(6)]
    for count, parsed in enumerate(made, start=1):
        low = ids._base + count
        rand_a, rand_b = (parsed.int >> 64) & 0xFFF, parsed.int & ((1 << 62) - 1)
        assert (rand_a << 62) | rand_b == low
        assert parsed.version == 7
        assert parsed.variant == uuid.RFC_4122
    assert sorted(made) == made


def _low(event_id: str) -> int:
    """The 74 bits after the time: a generator's random base plus its counter."""
    value = uuid.UUID(event_id).int
    return (((value >> 64) & 0xFFF) << 62) | (value & ((1 << 62) - 1))


def test_many_ids_are_what_as_many_calls_give_also_across_carries() -> None:
    one, bulk = EventIds(), EventIds()
    base = (1 << 74) - 5  # carries into the cached part, then wraps the 74 bits
    one._base = bulk._base = base
    for n in (1, 3, 2, 7, 0, 1):
        expected = [one() for _ in range(n)]
        got = bulk.many(n)
        assert [_low(i) for i in got] == [_low(i) for i in expected]
        assert all(uuid.UUID(i).version == 7 for i in got)
    assert [_low(i) for i in bulk.many(3)] == [10, 11, 12]  # past the wrap: base + 14 + k - 2**74
    assert [_low(bulk())] == [13]


@given(
    base=st.one_of(
        st.integers(0, (1 << 74) - 1),
        st.builds(  # a few ids before a carry into the cached part, or the 74 bits' wrap
            lambda m, k: ((m << 48) - k) % (1 << 74), st.integers(1, 1 << 26), st.integers(1, 70)
        ),
    ),
    steps=st.lists(st.one_of(st.just("call"), st.just("prepare"), st.integers(0, 70)), max_size=40),
    ms_steps=st.lists(st.integers(0, 70_000), min_size=1, max_size=8),
)
def test_prepared_ids_are_the_ids_made_without_preparing(
    base: int, steps: list[str | int], ms_steps: list[int]
) -> None:
    """Formatting the last groups ahead changes no id: across carries into the cached part,
    the 74 bits' wrap and the first group's turn (every 65,536 ms)."""
    base_ms = 1_764_000_000_000 + 65_536 - 3

    def clock() -> Callable[[], int]:
        times = itertools.accumulate(itertools.cycle(ms_steps), initial=base_ms)
        return lambda: next(times) * 1_000_000

    prepared, plain = EventIds(base=base, clock=clock()), EventIds(base=base, clock=clock())
    reads = clock()  # the millisecond each call and each many() reads
    made: list[str] = []
    for step in steps:
        match step:
            case "prepare":
                prepared.prepare()
                continue
            case "call":
                new = [prepared()]
                assert new == [plain()]
            case int(n):
                new = prepared.many(n)
                assert new == plain.many(n)
        ms = reads() // 1_000_000
        assert [uuid.UUID(i).int >> 80 for i in new] == [ms] * len(new)
        made += new
    assert all(uuid.UUID(i).version == 7 for i in made)
    assert len(set(made)) == len(made)
    assert [_low(i) for i in made] == [
        (base + k) & ((1 << 74) - 1) for k in range(1, len(made) + 1)
    ]


@given(
    base=st.one_of(
        st.integers(0, (1 << 74) - 1),
        st.builds(  # some ids before a carry into the cached part, or the 74 bits' wrap
            lambda m, k: ((m << 48) - k) % (1 << 74), st.integers(1, 1 << 26), st.integers(1, 600)
        ),
    ),
    sizes=st.lists(st.integers(0, 700), min_size=1, max_size=6),
)
def test_a_big_frames_ids_are_what_as_many_calls_give(base: int, sizes: list[int]) -> None:
    """A frame of hundreds of deltas takes its ids in one ``many``, past what was prepared
    and across every 256th value (where the last group's upper digits change)."""
    ms = 1_764_000_000_000

    def clock() -> int:
        return ms * 1_000_000

    one, bulk = EventIds(base=base, clock=clock), EventIds(base=base, clock=clock)
    for n in sizes:
        assert bulk.many(n) == [one() for _ in range(n)]
        ms += 1
