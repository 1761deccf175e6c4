from __future__ import annotations

import pytest
import trio
import trio.testing
from hypothesis import example, given, settings
from hypothesis import strategies as st

from busd.core import estimate
from busd.core.accounting import SETTLE_STRETCH, Accountant
from busd.core.bus import Bus
from busd.core.context import ContextRegistry
from busd.core.events import (
    ContextUsage,
    Envelope,
    Event,
    SessionIdle,
    SessionStart,
    StreamingStats,
    TextComplete,
    TextDelta,
    ThinkingComplete,
    ThinkingDelta,
    TokenUsage,
    ToolStart,
    ToolTimeout,
    TurnEnd,
    TurnStart,
    Usage,
)
from busd.core.stats import StatsRegistry
from busd.daemon.accounting import AccountingService


def derived_of(bus: Bus) -> list[Envelope[Event]]:
    seen: list[Envelope[Event]] = []
    bus.on("busd.>", seen.append)
    return seen


async def test_thinking_timer_ticks_on_the_bus_and_stops_at_text(
    autojump_clock: trio.testing.MockClock,
) -> None:
    bus = Bus()
    derived = derived_of(bus)
    service = AccountingService(bus, Accountant(tick_interval=1.0))
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        bus.publish(SessionStart(model="m"), session_id="s1")
        bus.publish(ThinkingDelta(message_id="m1", text="hmm"), session_id="s1")
        await trio.sleep(3.5)
        ticking = [e.event for e in derived if isinstance(e.event, StreamingStats)]
        assert [s.thinking for s in ticking] == [True, True, True]
        assert [round(s.thinking_s) for s in ticking] == [1, 2, 3]

        bus.publish(TextDelta(message_id="m1", text="answer"), session_id="s1")
        await trio.sleep(2.0)
        after = [e.event for e in derived if isinstance(e.event, StreamingStats)][3:]
        assert after
        assert all(not s.thinking and 3.4 < s.thinking_s < 3.6 for s in after)
        nursery.cancel_scope.cancel()


async def test_stats_go_quiet_at_idle_with_an_exact_final_snapshot(
    autojump_clock: trio.testing.MockClock,
) -> None:
    bus = Bus()
    derived = derived_of(bus)
    service = AccountingService(bus, Accountant(tick_interval=1.0))
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        bus.publish(TextDelta(message_id="m1", text="hello there"), session_id="s1")
        bus.publish(Usage(tokens=TokenUsage(output_tokens=30)), session_id="s1")
        await trio.sleep(1.5)
        bus.publish(SessionIdle(), session_id="s1")
        count_at_idle = len(derived)
        await trio.sleep(10)
        assert len(derived) == count_at_idle  # nothing ticks for an idle session
        final = [e.event for e in derived if isinstance(e.event, StreamingStats)][-1]
        assert final.output_tokens == 30
        assert not final.output_estimated
        nursery.cancel_scope.cancel()


def test_deltas_alone_produce_no_derived_events() -> None:
    accountant = Accountant()
    out = []
    for seq in range(1, 101):
        envelope: Envelope[Event] = Envelope(seq, 0.0, TextDelta(message_id="m", text="x "), "s1")
        out += accountant.observe(envelope, now=seq * 0.001)
    assert out == []


def test_context_is_emitted_when_a_call_moves_it_and_not_when_unchanged() -> None:
    accountant = Accountant(context_window=200_000)
    usage: Envelope[Event] = Envelope(
        1, 0.0, Usage(tokens=TokenUsage(input_tokens=1000, output_tokens=50)), "s1"
    )
    first = accountant.observe(usage, now=1.0)
    contexts = [d.event for d in first if isinstance(d.event, ContextUsage)]
    assert len(contexts) == 1
    assert contexts[0].used == 1050
    assert contexts[0].window == 200_000
    assert not contexts[0].estimated
    again: Envelope[Event] = Envelope(2, 0.0, usage.event, "s1")
    assert [
        d for d in accountant.observe(again, now=2.0) if isinstance(d.event, ContextUsage)
    ] == []
    turn_end: Envelope[Event] = Envelope(3, 0.0, TurnEnd(finish_reason="end_turn"), "s1")
    assert all(not isinstance(d.event, ContextUsage) for d in accountant.observe(turn_end, 3.0))


async def test_a_tool_past_its_limit_times_out_once_on_the_bus(
    autojump_clock: trio.testing.MockClock,
) -> None:
    bus = Bus()
    derived = derived_of(bus)
    service = AccountingService(bus, Accountant(tool_timeout_s=30.0, tool_limits={"bash": 5.0}))
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        bus.publish(
            ToolStart(tool_call_id="t1", name="bash", input={"cmd": "sleep 99"}),
            session_id="s1",
            run_id="r1",
            agent_id="a1",
        )
        await trio.sleep(4.9)
        assert not [e for e in derived if isinstance(e.event, ToolTimeout)]
        await trio.sleep(60)
        timeouts = [e for e in derived if isinstance(e.event, ToolTimeout)]
        assert len(timeouts) == 1
        timeout = timeouts[0].event
        assert isinstance(timeout, ToolTimeout)
        assert (timeout.tool_call_id, timeout.name, timeout.limit_s) == ("t1", "bash", 5.0)
        assert timeout.elapsed_s >= 5.0
        assert (timeouts[0].session_id, timeouts[0].run_id, timeouts[0].agent_id) == (
            "s1",
            "r1",
            "a1",
        )
        nursery.cancel_scope.cancel()


async def test_the_service_unsubscribes_when_cancelled() -> None:
    bus = Bus()
    service = AccountingService(bus)
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        assert bus.statistics().catch_all_handlers == 1
        nursery.cancel_scope.cancel()
    assert bus.statistics().catch_all_handlers == 0


# -- deltas are accounted in runs: the same as one by one ----------------------------------

_TEXT = st.text(alphabet="ab 1😀\n", max_size=6)  # pieces that differ when cut or repeated
_EVENTS = st.one_of(
    st.builds(TextDelta, message_id=st.sampled_from(["m1", "m2"]), text=_TEXT),
    # Thinking and text of one message may share its id (Anthropic's blocks do).
    st.builds(ThinkingDelta, message_id=st.sampled_from(["t1", "t2", "m1"]), text=_TEXT),
    st.builds(TextComplete, message_id=st.sampled_from(["m1", "m2"]), text=_TEXT),
    st.builds(ThinkingComplete, message_id=st.sampled_from(["t1", "t2"]), text=st.just("x")),
    st.builds(Usage, tokens=st.builds(TokenUsage, output_tokens=st.integers(0, 50))),
    st.sampled_from(
        [
            TurnStart(),
            TurnEnd(),
            TurnEnd(finish_reason="cancelled"),  # the context keeps the partial text
            SessionIdle(),
            SessionIdle(aborted=True),
        ]
    ),
)
_STEPS = st.lists(
    st.tuples(
        _EVENTS,
        st.sampled_from(["s1", "s1", "s2", None]),  # session
        st.sampled_from([None, None, "sub"]),  # agent
        st.sampled_from([None, "r1"]),  # run
        st.floats(0, 0.5),  # time since the previous event
        st.integers(1, 4),  # how many times in a row (runs of the same delta)
        st.booleans(),  # read the figures after this event
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(_STEPS)
@example(  # two messages' deltas back to back are two runs: the second's end is not new text
    [
        (TextDelta(message_id="m1", text="ab"), "s1", None, None, 0.1, 1, False),
        (TextDelta(message_id="m2", text="ab 1"), "s1", None, None, 0.1, 1, False),
        (TextComplete(message_id="m2", text="ab 1"), "s1", None, None, 0.1, 1, True),
    ]
)
@example(  # thinking, then the answer, of one message: two runs, not one
    [
        (ThinkingDelta(message_id="m1", text="ab"), "s1", None, None, 0.1, 2, False),
        (TextDelta(message_id="m1", text="cd 1"), "s1", None, None, 0.1, 2, False),
        (TurnEnd(finish_reason="cancelled"), "s1", None, None, 0.1, 1, True),
    ]
)
def test_deferred_deltas_give_the_figures_of_one_by_one_feeding(
    steps: list[tuple[Event, str | None, str | None, str | None, float, int, bool]],
) -> None:
    accountant = Accountant()
    stats, context = StatsRegistry(), ContextRegistry()  # the reference: fed one by one
    now = 0.0
    seq = 0
    for event, session, agent, run, elapsed, repeat, read in steps:
        for _ in range(repeat):
            now += elapsed
            seq += 1
            envelope = Envelope(seq, now, event, session_id=session, agent_id=agent, run_id=run)
            accountant.observe(envelope, now)
            stats.observe(envelope, now)
            if session is not None:
                context.observe(envelope)
                if type(event) is TurnEnd or (type(event) is SessionIdle and agent is None):
                    # The accountant publishes the session's figures here, which
                    # estimates its pending text: so does the reference.
                    stats.session_stats(session, now)
        if read:
            _assert_the_same_figures(accountant, stats, context, now)
    assert accountant.stats.session_stats("s1", now) == stats.session_stats("s1", now)


def _assert_the_same_figures(
    accountant: Accountant, stats: StatsRegistry, context: ContextRegistry, now: float
) -> None:
    """The accountant's figures at ``now`` are the reference's, fed one by one."""
    for sid in ("s1", "s2"):
        assert accountant.session_stats(sid, now) == stats.session_stats(sid, now)
        for aid in (None, "sub"):
            window = accountant.context.get(sid, aid)
            expected = context.get(sid, aid)
            assert (window and window.snapshot()) == (expected and expected.snapshot())
    assert accountant.stats.run_stats("r1", now) == stats.run_stats("r1", now)


@settings(max_examples=300, deadline=None)
@given(_STEPS, st.integers(1, 40))
@example(  # one run of two messages, the first again after the second
    [
        (TextDelta(message_id="m1", text="ab"), "s1", None, "r1", 0.1, 2, False),
        (TextDelta(message_id="m2", text="1 a"), "s1", None, "r1", 0.1, 1, False),
        (TextDelta(message_id="m1", text="b"), "s1", None, "r1", 0.1, 1, False),
        (TextComplete(message_id="m2", text="1 a"), "s1", None, "r1", 0.1, 1, True),
    ],
    40,
)
@example(  # thinking of two messages in one run: the timer stops at the second
    [
        (ThinkingDelta(message_id="t1", text="ab"), "s1", None, None, 0.1, 1, False),
        (ThinkingDelta(message_id="t2", text="ab"), "s1", None, None, 0.2, 1, False),
        (TurnEnd(), "s1", None, None, 0.3, 1, True),
    ],
    1,
)
def test_runs_of_deltas_give_the_figures_of_one_by_one_feeding(
    steps: list[tuple[Event, str | None, str | None, str | None, float, int, bool]],
    stretch: int,
) -> None:
    """As the daemon feeds it: consecutive deltas of one type from one place as one run
    (a publish frame's, seen at one time; its messages may change within it), settled
    in stretches; the registries fed one by one are the reference."""
    accountant = Accountant()
    stats, context = StatsRegistry(), ContextRegistry()
    now = 0.0
    seq = 0
    run: list[Envelope[Event]] = []

    def publish_run() -> None:
        if run:
            accountant.observe_run(list(run), run[0].ts)
            accountant.settle(stretch=stretch)
            run.clear()

    for event, session, agent, run_id, elapsed, repeat, read in steps:
        delta = type(event) in (TextDelta, ThinkingDelta)
        place = (type(event), session, agent, run_id)
        if run and (not delta or place != (type(run[0].event), *_place(run[0]))):
            publish_run()
        now += elapsed
        at = run[0].ts if run else now  # a run's deltas are seen at once
        for _ in range(repeat):
            seq += 1
            envelope = Envelope(seq, at, event, session_id=session, agent_id=agent, run_id=run_id)
            stats.observe(envelope, at)
            if session is not None:
                context.observe(envelope)
                if type(event) is TurnEnd or (type(event) is SessionIdle and agent is None):
                    stats.session_stats(session, at)  # as the accountant publishes them
            if delta:
                run.append(envelope)
            else:
                accountant.observe(envelope, at)
        if read:
            publish_run()
            _assert_the_same_figures(accountant, stats, context, at)
    publish_run()
    _assert_the_same_figures(accountant, stats, context, now)


def _place(envelope: Envelope[Event]) -> tuple[str | None, str | None, str | None]:
    return envelope.session_id, envelope.agent_id, envelope.run_id


def test_deltas_wait_for_a_settle_a_read_or_another_event() -> None:
    accountant = Accountant()
    for seq in range(1, 4):
        accountant.observe(Envelope(seq, 1.0, TextDelta(message_id="m", text="ab"), "s1"), 1.0)
    assert accountant.deferred_deltas == 3
    accountant.settle()
    assert accountant.deferred_deltas == 0
    accountant.observe(Envelope(4, 2.0, TextDelta(message_id="m", text="cd"), "s1"), 2.0)
    accountant.observe(Envelope(5, 2.0, TurnEnd(), "s1"), 2.0)  # another event: first the delta
    assert accountant.deferred_deltas == 0


def test_a_settle_with_a_stretch_leaves_fewer_deltas_waiting_and_reads_never_wait() -> None:
    accountant = Accountant()
    reference = StatsRegistry()
    for seq in range(1, 4):
        envelope: Envelope[Event] = Envelope(seq, 1.0, TextDelta(message_id="m", text="ab "), "s1")
        accountant.observe_run([envelope], 1.0)
        reference.observe(envelope, 1.0)
        accountant.settle(stretch=4)
        assert accountant.deferred_deltas == seq  # not yet a stretch: they wait
    assert accountant.session_stats("s1", 2.0) == reference.session_stats("s1", 2.0)
    assert accountant.deferred_deltas == 0  # the read took them all
    for seq in range(4, 8):
        accountant.observe(Envelope(seq, 3.0, TextDelta(message_id="m", text="cd "), "s1"), 3.0)
    accountant.settle(stretch=4)
    assert accountant.deferred_deltas == 0  # a stretch: accounted at once


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The texts the estimator counts from now on (its memory of recent chunks emptied)."""
    texts: list[str] = []
    fast = estimate._fast_estimate

    def counting(text: str) -> int:
        texts.append(text)
        return fast(text)

    monkeypatch.setattr(estimate, "_fast_estimate", counting)
    estimate._recent.clear()
    return texts


def test_a_chunk_of_streamed_text_is_estimated_once_for_all_its_trackers(
    counted: list[str],
) -> None:
    """The session's and the run's stats and the context's message each estimate a
    message's text in the same 4 KB chunks: the estimator does each chunk's work once
    (it was a third of an accounting stretch's CPU, three times over)."""
    accountant = Accountant()
    prose = "Streamed words, numbers 12345 and code() {\n  return x;\n}\n" * 400
    seq = 0
    for start in range(0, 3 * 4096 + 100, 70):  # bursts of 5 deltas of 14 characters
        envelopes: list[Envelope[Event]] = []
        for at in range(start, start + 70, 14):
            seq += 1
            delta = TextDelta(message_id="m1", text=prose[at : at + 14])
            envelopes.append(Envelope(seq, 1.0, delta, "s1", "r1"))
        accountant.observe_run(envelopes, 1.0)
        accountant.settle(stretch=SETTLE_STRETCH)
    accountant.settle()
    assert len(counted) == 3  # three chunks of 4 KB, each once
    assert all(len(text) >= 4096 for text in counted)


def test_a_big_frames_chunks_are_estimated_once_for_all_its_trackers(
    counted: list[str],
) -> None:
    """A publisher going flat out sends frames of hundreds of deltas: one settle then
    estimates several chunks in each tracker in turn, and the estimator's memory of
    recent chunks must still hold the first when the last tracker asks for it (it
    forgot them all at once when full: a chunk in four was estimated twice)."""
    accountant = Accountant()
    seq = 0
    for frame in range(40):  # frames of 256 deltas of 100 characters: 25 KB a settle
        envelopes: list[Envelope[Event]] = []
        for n in range(256):
            seq += 1
            text = f"{frame:02d} {n:03d} " + "streamed words and code() " * 4
            delta = TextDelta(message_id="m1", text=text[:100])
            envelopes.append(Envelope(seq, 1.0, delta, "s1", "r1"))
        accountant.observe_run(envelopes, 1.0)
        accountant.settle(stretch=SETTLE_STRETCH)
    accountant.settle()
    assert len(counted) >= 40 * 256 * 100 // 4200  # about a chunk per 4 KB...
    assert len(set(counted)) == len(counted)  # ...and each of them estimated once


def test_a_long_wait_s_chunks_are_estimated_once_for_all_its_trackers(
    counted: list[str],
) -> None:
    """Deltas published one at a time (an adapter in the daemon) wait until the accountant
    holds 1,024 or is read: 100 KB at once, more chunks than the estimator remembers, and
    each tracker took all of its chunks before the next asked for the first."""
    envelopes: list[Envelope[Event]] = []
    for seq in range(1, 3 * 1024 + 1):
        text = f"{seq:05d} " + "streamed words and code() " * 4
        envelopes.append(Envelope(seq, 1.0, TextDelta("m1", text[:100]), "s1", "r1"))
    accountant = Accountant()
    for envelope in envelopes:
        accountant.observe(envelope, 1.0)
    accountant.settle()
    assert len(counted) >= 3 * 1024 * 100 // 4200
    assert len(set(counted)) == len(counted)
    stats, context = StatsRegistry(), ContextRegistry()  # fed one by one: the same figures
    for envelope in envelopes:
        stats.observe(envelope, 1.0)
        context.observe(envelope)
    assert accountant.session_stats("s1", 2.0) == stats.session_stats("s1", 2.0)
    assert accountant.stats.run_stats("r1", 2.0) == stats.run_stats("r1", 2.0)
    mine, theirs = accountant.context.get("s1"), context.get("s1")
    assert mine is not None
    assert theirs is not None
    assert mine._pending == theirs._pending  # the streamed text, kept and estimated alike
    assert mine.snapshot() == theirs.snapshot()
