from __future__ import annotations

import gc
import itertools

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from busd.core.events import Envelope, Event, TextDelta
from busd.core.history import RECENT, STRETCH, History, Replay
from busd.wire import encode_envelope

_DECODE = msgspec.msgpack.Decoder(Envelope[TextDelta])


def env(seq: int) -> Envelope[Event]:
    return Envelope(seq, float(seq), TextDelta(message_id="m", text=str(seq)), "s1")


def filled(capacity: int, seqs: list[int] | range, *, first_seq: int = 1) -> History:
    history = History(capacity, first_seq=first_seq)
    for seq in seqs:
        envelope = env(seq)
        history.append(envelope, encode_envelope(envelope))
    return history


def seqs_of(replay: Replay) -> list[int]:
    """The replay's seqs, checked against the bytes it carries."""
    assert [_DECODE.decode(raw).seq for raw in replay.raws] == replay.seqs
    return replay.seqs


def test_an_empty_history_replays_nothing_and_reports_no_gap() -> None:
    replay = History(10).since(0)

    assert replay.seqs == []
    assert replay.raws == []
    assert replay.gap is None
    assert not replay.ahead
    assert len(replay) == 0


def test_resuming_a_few_events_back_returns_them_in_order_with_their_encodings() -> None:
    history = filled(100, range(1, 51))

    replay = history.since(47)

    assert seqs_of(replay) == [48, 49, 50]
    assert replay.raws == [encode_envelope(env(seq)) for seq in (48, 49, 50)]
    assert replay.gap is None
    assert replay.head_seq == 50


def test_resuming_from_the_head_returns_nothing() -> None:
    history = filled(10, range(1, 6))

    replay = history.since(5)

    assert replay.seqs == []
    assert replay.gap is None
    assert not replay.ahead


def test_resuming_from_before_the_oldest_held_event_reports_the_evicted_range() -> None:
    history = filled(3, range(1, 11))  # holds 8, 9, 10

    replay = history.since(2)

    assert replay.gap == (3, 7)
    assert seqs_of(replay) == [8, 9, 10]


def test_resuming_right_before_the_oldest_held_event_has_no_gap() -> None:
    history = filled(3, range(1, 11))

    replay = history.since(7)

    assert replay.gap is None
    assert seqs_of(replay) == [8, 9, 10]


def test_a_since_seq_past_the_head_is_reported_as_ahead_with_nothing_replayed() -> None:
    history = filled(10, range(1, 6))

    replay = history.since(42)

    assert replay.ahead
    assert replay.seqs == []
    assert replay.gap is None
    assert replay.head_seq == 5


def test_seqs_skipped_by_the_server_are_holes_not_gaps() -> None:
    history = filled(10, [5, 9, 10, 20])

    replay = history.since(0)

    assert replay.gap is None
    assert seqs_of(replay) == [5, 9, 10, 20]
    assert seqs_of(history.since(9)) == [10, 20]


def test_seqs_before_first_seq_belong_to_an_earlier_daemon_and_are_a_gap() -> None:
    history = filled(10, range(1000, 1003), first_seq=1000)

    replay = history.since(500)

    assert replay.gap == (501, 999)
    assert seqs_of(replay) == [1000, 1001, 1002]


def test_an_empty_history_started_late_reports_everything_before_it_as_lost() -> None:
    history = History(10, first_seq=1000)

    assert history.head_seq == 999
    assert history.since(500).gap == (501, 999)
    assert history.since(999).gap is None


@pytest.mark.parametrize("seq", [3, 2, 0])
def test_appending_a_seq_that_does_not_increase_is_refused(seq: int) -> None:
    history = filled(10, [1, 2, 3])

    with pytest.raises(ValueError, match="not after the head"):
        history.append(env(seq), encode_envelope(env(seq)))
    assert len(history) == 3
    assert history.head_seq == 3


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="capacity"):
        History(0)


def test_first_seq_must_be_positive() -> None:
    with pytest.raises(ValueError, match="first_seq"):
        History(10, first_seq=0)


def test_a_negative_since_seq_is_refused() -> None:
    with pytest.raises(ValueError, match="since_seq"):
        filled(10, [1, 2]).since(-1)


def test_statistics_count_what_was_appended_held_and_evicted() -> None:
    history = filled(4, range(1, 11))

    stats = history.statistics()

    assert stats.held == 4
    assert stats.capacity == 4
    assert stats.appended == 10
    assert stats.evicted == 6
    assert stats.head_seq == 10
    assert stats.oldest_seq == 7
    assert History(3).statistics().oldest_seq is None


@given(
    capacity=st.integers(1, 12),
    steps=st.lists(st.integers(1, 3), max_size=40),
    probe=st.integers(0, 130),
)
def test_since_returns_exactly_the_held_events_after_seq_and_the_gap_covers_the_evicted(
    capacity: int, steps: list[int], probe: int
) -> None:
    appended: list[int] = []
    seq = 0
    for step in steps:
        seq += step
        appended.append(seq)
    history = filled(capacity, appended)
    held = appended[-capacity:]
    evicted = appended[: len(appended) - len(held)]

    replay = history.since(probe)

    assert len(history) == len(held) <= capacity
    assert history.oldest_seq == (held[0] if held else None)
    assert seqs_of(replay) == [s for s in held if s > probe]
    lost = [s for s in evicted if s > probe]
    if not lost:
        assert replay.gap is None
    else:
        assert replay.gap == (probe + 1, held[0] - 1)
    assert replay.ahead == (probe > history.head_seq)
    assert history.since(history.head_seq).seqs == []


@given(capacity=st.integers(1, 12), count=st.integers(0, 40), probe=st.integers(0, 45))
def test_with_contiguous_seqs_the_gap_is_exactly_the_evicted_seqs_after_since(
    capacity: int, count: int, probe: int
) -> None:
    history = filled(capacity, range(1, count + 1))
    evicted = range(1, max(0, count - capacity) + 1)

    gap = history.since(probe).gap

    covered = [] if gap is None else list(range(gap[0], gap[1] + 1))
    assert covered == [s for s in evicted if s > probe]


@given(
    capacity=st.integers(1, 12),
    before=st.integers(0, 30),
    runs=st.lists(st.integers(0, 30), max_size=6),
)
def test_extend_keeps_what_appending_each_keeps(
    capacity: int, before: int, runs: list[int]
) -> None:
    """A run extended is a run appended: same ring, same replays, same statistics."""
    one_by_one = filled(capacity, range(1, before + 1))
    at_once = filled(capacity, range(1, before + 1))
    seq = before
    for length in runs:
        envelopes = [env(s) for s in range(seq + 1, seq + length + 1)]
        raws = [encode_envelope(e) for e in envelopes]
        for envelope, raw in zip(envelopes, raws, strict=True):
            one_by_one.append(envelope, raw)
        at_once.extend(envelopes, raws)
        seq += length
        assert at_once.statistics() == one_by_one.statistics()
        for since in range(0, seq + 2):
            assert at_once.since(since) == one_by_one.since(since)
        for envelope in envelopes:
            assert at_once.raw_of(envelope) == one_by_one.raw_of(envelope)


def raw(seq: int) -> msgspec.Raw:
    return encode_envelope(env(seq))


def test_extend_refuses_a_run_that_does_not_follow_and_keeps_nothing() -> None:
    history = filled(4, range(1, 4))
    before = history.statistics()
    with pytest.raises(ValueError, match="not after the head seq 3"):
        history.extend([env(3), env(4)], [raw(3), raw(4)])
    with pytest.raises(ValueError, match="do not increase"):
        history.extend([env(4), env(6), env(5)], [raw(4), raw(6), raw(5)])
    with pytest.raises(ValueError, match="2 envelopes but 1 encodings"):
        history.extend([env(4), env(5)], [raw(4)])
    assert history.statistics() == before


def big(seq: int) -> Envelope[Event]:
    return Envelope(seq, float(seq), TextDelta(message_id="m", text=str(seq) * 5000), "s1")


def test_replays_read_the_right_bytes_across_pages_and_the_wrap() -> None:
    """Encodings of ~20 KB fill a page every few events; the ring wraps many times."""
    history = History(7)
    envelopes = [big(seq) for seq in range(1, 41)]
    history.extend(envelopes[:13], [encode_envelope(e) for e in envelopes[:13]])
    for envelope in envelopes[13:]:
        history.append(envelope, encode_envelope(envelope))

    replay = history.since(30)

    assert replay.seqs == [34, 35, 36, 37, 38, 39, 40]
    assert replay.gap == (31, 33)
    assert replay.raws == [encode_envelope(e) for e in envelopes[33:]]


@given(
    capacity=st.integers(1, 12),
    runs=st.lists(st.tuples(st.integers(1, 3), st.integers(1, 9)), max_size=12),
)
def test_raw_of_finds_exactly_the_recent_envelopes_by_identity(
    capacity: int, runs: list[tuple[int, int]]
) -> None:
    """Only a published envelope's own bytes; with contiguous seqs, for each of the last
    ``capacity`` (fewer than RECENT), and for no older one."""
    history = History(capacity)
    appended: list[Envelope[Event]] = []
    seq = 0
    for gap_before, length in runs:
        seq += gap_before  # a hole before the run: slots no longer follow, the guess may miss
        run = [env(s) for s in range(seq, seq + length)]
        history.extend(run, [encode_envelope(e) for e in run])
        appended += run
        seq += length - 1
    contiguous = all(b.seq == a.seq + 1 for a, b in itertools.pairwise(appended))
    for i, envelope in enumerate(appended):
        found = history.raw_of(envelope)
        if found is not None:  # never another envelope's bytes
            assert found == encode_envelope(envelope)
        if contiguous:
            assert (found is not None) == (i >= len(appended) - capacity)
        copy = Envelope(envelope.seq, envelope.ts, envelope.event, envelope.session_id)
        assert history.raw_of(copy) is None  # the same seq, another envelope: a merged delta


def held_objects(history: History) -> int:
    """The distinct objects the history's containers refer to (an array refers to none)."""
    return len({id(o) for c in gc.get_referents(history) for o in gc.get_referents(c)})


def full(capacity: int) -> History:
    history = History(capacity)
    for start in range(1, capacity + 1, 1000):
        run = [env(s) for s in range(start, min(start + 1000, capacity + 1))]
        history.extend(run, [encode_envelope(e) for e in run])
    return history


def test_the_ring_keeps_bytes_not_an_object_per_event() -> None:
    """Past RECENT envelopes, more events held is no more objects (a page per ~64 KiB).

    A ring of objects (envelope, event, strings, bytes per event) slowed every
    allocation of a daemon the longer it ran.
    """
    small, large = full(RECENT * 2), full(RECENT * 6)

    more = held_objects(large) - held_objects(small)

    assert len(large) == RECENT * 6
    assert more <= RECENT * 4 // 500  # the extra pages, not an object per event
    assert seqs_of(large.since(0)) == list(range(1, RECENT * 6 + 1))


def test_a_replay_reads_what_was_held_when_it_was_taken_while_the_ring_goes_on() -> None:
    """A replay is sent in chunks while events keep coming: the ring wrapping over the
    replayed slots, and the page it read from growing, change nothing it reads."""
    history = filled(50, range(1, 121))
    replay = history.since(100)
    history.extend([env(s) for s in range(121, 300)], [raw(s) for s in range(121, 300)])
    for seq in range(300, 400):
        history.append(env(seq), raw(seq))

    assert [seqs for seqs, _ in replay.chunks(7)] == [
        list(range(101, 108)),
        list(range(108, 115)),
        list(range(115, 121)),
    ]
    assert [r for _, raws in replay.chunks(3) for r in raws] == [raw(s) for s in range(101, 121)]


@given(
    capacity=st.integers(1, 80),
    steps=st.lists(
        st.tuples(st.sampled_from(["append", "extend", "read"]), st.integers(0, 2 * STRETCH)),
        max_size=30,
    ),
)
def test_events_waiting_for_their_stretch_are_seen_by_every_read(
    capacity: int, steps: list[tuple[str, int]]
) -> None:
    """Appends go into the ring STRETCH at a time; whenever anyone reads, it is as if each
    had gone in at once (the model: the last ``capacity`` of everything appended)."""
    history = History(capacity)
    appended: list[Envelope[Event]] = []
    for op, n in steps:
        if op == "read":
            held = appended[-capacity:]
            assert len(history) == len(held)
            assert history.oldest_seq == (held[0].seq if held else None)
            assert history.statistics().appended == len(appended)
            assert seqs_of(history.since(n)) == [e.seq for e in held if e.seq > n]
            if appended:
                assert history.raw_of(appended[-1]) == encode_envelope(appended[-1])
            continue
        run = [env(s) for s in range(len(appended) + 1, len(appended) + n + 1)]
        if op == "append":
            for envelope in run:
                history.append(envelope, encode_envelope(envelope))
        else:
            history.extend(run, [encode_envelope(e) for e in run])
        appended += run
        assert history.head_seq == len(appended)  # at once, kept or not
    held = appended[-capacity:]
    assert seqs_of(history.since(0)) == [e.seq for e in held]
