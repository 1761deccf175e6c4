from __future__ import annotations

import tracemalloc
from itertools import count
from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st

from busd.core import estimate, partial
from busd.core.context import ContextRegistry, ContextWindow
from busd.core.estimate import estimate_json_tokens, estimate_tokens
from busd.core.events import (
    ContextBasis,
    ContextBreakdown,
    Envelope,
    Event,
    RunStarted,
    SessionCompaction,
    SessionContext,
    SessionStart,
    TextComplete,
    TextDelta,
    ThinkingDelta,
    TokenUsage,
    ToolComplete,
    TurnEnd,
    TurnStart,
    Usage,
)
from busd.core.partial import PartialTexts
from busd.core.windows import ModelWindows

_seq = count(1)

SYSTEM = "You are a careful coding agent. Answer briefly and run the tests."
TOOLS = [{"name": "bash", "input_schema": {"type": "object", "properties": {"cmd": {}}}}]


def env(event: Event, *, session: str = "s1", agent: str | None = None) -> Envelope[Event]:
    return Envelope(next(_seq), 0.0, event, session, None, agent)


def call(
    input_tokens: int = 0, output: int = 0, *, cache_read: int = 0, cache_write: int = 0
) -> TokenUsage:
    return TokenUsage(
        input_tokens=input_tokens,
        output_tokens=output,
        cache_read_tokens=cache_read,
        cache_write_tokens=cache_write,
    )


# -- the figure ----------------------------------------------------------------


def test_before_any_call_the_figure_is_a_pure_estimate() -> None:
    context = ContextWindow(200_000)
    context.set_system(SYSTEM)
    context.set_tools(TOOLS)
    context.add_message("Please fix the failing test in tests/test_x.py")

    system = estimate_tokens(SYSTEM)
    tools = sum(estimate_json_tokens(t) for t in TOOLS)
    messages = estimate_tokens("Please fix the failing test in tests/test_x.py")
    usage = context.snapshot()
    assert usage.used == system + tools + messages
    assert usage.estimated is True
    assert usage.breakdown == ContextBreakdown(
        system=system, tools=tools, messages=messages, free=200_000 - usage.used
    )


def test_after_a_call_the_figure_is_last_input_with_cache_plus_output_plus_new_messages() -> None:
    context = ContextWindow(200_000)
    context.set_system(SYSTEM)
    context.record_call(call(10, 143, cache_read=14_926, cache_write=39_452))

    assert context.used == 10 + 14_926 + 39_452 + 143
    assert context.estimated is False
    assert context.last_input == 10 + 14_926 + 39_452

    context.add_message(500)
    context.add_message("tool output")
    assert context.used == 10 + 14_926 + 39_452 + 143 + 500 + estimate_tokens("tool output")
    assert context.snapshot().estimated is False


def test_after_compaction_with_a_figure_it_restarts_from_that_figure_as_an_estimate() -> None:
    context = ContextWindow(100_000)
    context.record_call(call(90_000, 1_000))
    context.compacted(tokens_after=12_000)

    assert context.used == 12_000
    assert context.estimated is True
    context.add_message(300)
    assert context.used == 12_300


def test_after_compaction_without_a_figure_it_restarts_from_system_and_tools() -> None:
    context = ContextWindow(100_000)
    context.set_system(2_000)
    context.set_tools(3_000)
    context.record_call(call(90_000, 1_000))
    context.compacted()

    assert context.used == 5_000
    assert context.estimated is True


def test_a_cancelled_call_keeps_the_last_actuals_and_adds_its_partial_output() -> None:
    context = ContextWindow(100_000)
    context.record_call(call(1_000, 200))
    context.add_message(50)
    context.cancelled("I was about to say")

    assert context.used == 1_200 + 50 + estimate_tokens("I was about to say")
    assert context.last_input == 1_000
    assert context.estimated is False


def test_breakdown_is_back_calculated_and_never_negative() -> None:
    context = ContextWindow(10_000)
    context.set_system(6_000)  # an over-estimate: the real call says 5,000 in all
    context.set_tools(3_000)
    context.record_call(call(4_900, 100))

    breakdown = context.breakdown()
    assert breakdown == ContextBreakdown(system=5_000, tools=0, messages=0, free=5_000)


def test_breakdown_messages_are_what_the_actual_count_leaves() -> None:
    context = ContextWindow(10_000)
    context.set_system(1_000)
    context.set_tools(500)
    context.record_call(call(3_000, 500))
    assert context.breakdown() == ContextBreakdown(
        system=1_000, tools=500, messages=2_000, free=6_500
    )


def test_percent_and_free_are_of_the_window() -> None:
    context = ContextWindow(1_000)
    context.add_message(250)
    usage = context.snapshot()
    assert usage.percent == pytest.approx(25.0)
    assert usage.breakdown.free == 750


def test_free_is_clamped_at_zero_and_percent_at_one_hundred() -> None:
    """Issue 16: an estimate past the window shows a full bar, not 120%."""
    context = ContextWindow(1_000)
    context.add_message(1_200)
    usage = context.snapshot()
    assert usage.breakdown.free == 0
    assert usage.percent == 100.0
    assert usage.used == 1_200  # the figure itself is not clamped


def test_an_unknown_window_has_no_percent_free_or_compaction() -> None:
    context = ContextWindow()
    context.add_message(10**9)
    usage = context.snapshot()
    assert usage.window is None
    assert usage.percent is None
    assert usage.breakdown.free is None
    assert context.should_compact() is False


def test_a_reported_state_wins_over_the_estimate() -> None:
    context = ContextWindow()
    context.set_system(SYSTEM)
    context.add_message(5_000)
    context.observe_reported(200_000, 18_234)

    usage = context.snapshot()
    assert (usage.used, usage.window, usage.estimated) == (18_234, 200_000, False)
    context.add_message(100)
    assert context.used == 18_334


def test_a_reported_state_arrives_on_the_stream_as_session_context() -> None:
    context = ContextWindow()
    context.add_message(5_000)
    context.observe(env(SessionContext(used=18_234, window=200_000)))
    usage = context.snapshot()
    assert (usage.used, usage.window, usage.estimated) == (18_234, 200_000, False)
    assert usage.percent == pytest.approx(9.117)


# -- compaction decision -------------------------------------------------------


def test_should_compact_uses_the_shown_number() -> None:
    context = ContextWindow(1_000, threshold=0.8)
    context.add_message(799)
    assert context.snapshot().used == 799
    assert context.should_compact() is False

    context.add_message(1)
    assert context.snapshot().used == 800
    assert context.should_compact() is True


@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("msg"), st.integers(0, 5_000)),
            st.tuples(st.just("call"), st.integers(0, 100_000)),
            st.tuples(st.just("compact"), st.integers(0, 50_000)),
            st.tuples(st.just("report"), st.integers(0, 150_000)),
        ),
        max_size=30,
    ),
    st.floats(min_value=0.1, max_value=1.0),
)
def test_should_compact_agrees_with_the_snapshot_after_any_history(
    steps: list[tuple[str, int]], threshold: float
) -> None:
    context = ContextWindow(100_000, threshold=threshold)
    for kind, n in steps:
        if kind == "msg":
            context.add_message(n)
        elif kind == "call":
            context.record_call(call(n, n // 10))
        elif kind == "compact":
            context.compacted(n)
        else:
            context.observe_reported(None, n)
        shown = context.snapshot()
        assert context.should_compact() == (shown.used >= threshold * 100_000)
        parts = shown.breakdown
        assert min(parts.system, parts.tools, parts.messages) >= 0
        assert parts.system + parts.tools + parts.messages == shown.used


# -- estimate error ------------------------------------------------------------


def test_each_call_records_how_far_the_estimate_was_from_the_actual_input() -> None:
    context = ContextWindow(100_000)
    context.set_system(1_000)
    context.add_message(200)
    context.call_started()  # shown: 1,200
    context.add_message(999)  # arrives after the call went out: not part of the prediction
    context.record_call(call(1_000, 50))

    stats = context.statistics()
    assert stats.calls == 1
    assert stats.samples == 1
    assert stats.last_error == 200
    assert stats.mean_abs_pct_error == pytest.approx(20.0)

    context.add_message(100)  # predicted next input: 1,000 + 50 + 100
    context.record_call(call(1_300, 20))
    stats = context.statistics()
    assert stats.last_error == 1_150 - 1_300
    assert stats.mean_error == pytest.approx((200 - 150) / 2)


def test_a_later_report_of_the_same_call_is_not_a_new_sample() -> None:
    context = ContextWindow()
    context.add_message(100)
    context.record_call(call(90, 1))
    context.record_call(call(90, 40), update=True)

    assert context.statistics().samples == 1
    assert context.used == 130


def test_errors_are_kept_in_a_bounded_window() -> None:
    context = ContextWindow(max_samples=3)
    for i in range(10):
        context.add_message(100)
        context.record_call(call(100 + i))
    stats = context.statistics()
    assert stats.calls == 10
    assert stats.samples == 3


def test_no_sample_when_nothing_was_estimated() -> None:
    context = ContextWindow()
    context.record_call(call(100))
    assert context.statistics().samples == 0
    assert context.statistics().mean_abs_pct_error is None


@pytest.mark.parametrize(
    "bad", [{"window": 0}, {"window": -5}, {"threshold": 0.0}, {"threshold": 1.5}]
)
def test_nonsense_settings_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must be"):
        ContextWindow(**bad)  # type: ignore[arg-type]


# -- from the stream -----------------------------------------------------------


def test_observe_turns_cumulative_usage_into_per_call_figures() -> None:
    # Two model calls, usage reported as running totals (claude_code fixture numbers).
    context = ContextWindow(200_000)
    first = TokenUsage(
        input_tokens=10, output_tokens=143, cache_read_tokens=14_926, cache_write_tokens=39_452
    )
    both = TokenUsage(
        input_tokens=18, output_tokens=231, cache_read_tokens=69_266, cache_write_tokens=41_926
    )
    context.observe(env(TurnStart()))
    context.observe(env(Usage(tokens=TokenUsage(input_tokens=10, output_tokens=4))))
    context.observe(env(Usage(tokens=first)))
    context.observe(env(TurnEnd(finish_reason="tool_use")))
    assert context.used == 10 + 14_926 + 39_452 + 143

    context.observe(env(ToolComplete(tool_call_id="t1", output="main\n")))
    context.observe(env(TurnStart()))
    context.observe(env(Usage(tokens=both)))
    context.observe(env(Usage(tokens=first)))  # a late snapshot: ignored
    context.observe(env(TurnEnd()))

    assert context.last_input == 8 + 54_340 + 2_474
    assert context.used == 8 + 54_340 + 2_474 + 88
    assert context.statistics().calls == 2


def test_observe_without_turn_events_starts_a_call_when_input_grows() -> None:
    context = ContextWindow()
    context.observe(env(Usage(tokens=TokenUsage(input_tokens=100, output_tokens=1))))
    context.observe(env(Usage(tokens=TokenUsage(input_tokens=100, output_tokens=30))))
    assert context.used == 130
    context.observe(env(Usage(tokens=TokenUsage(input_tokens=260, output_tokens=50))))
    assert context.used == 160 + 20
    assert context.statistics().calls == 2


def test_observe_counts_the_prompt_and_tool_results_as_new_messages() -> None:
    context = ContextWindow()
    context.record_call(call(1_000, 10))
    context.observe(env(RunStarted(adapter="claude", prompt="Now run the tests")))
    context.observe(env(ToolComplete(tool_call_id="t", status="error", error="exit 1")))
    assert context.used == 1_010 + estimate_tokens("Now run the tests") + estimate_tokens("exit 1")


def test_observe_adds_a_completed_answer_until_its_usage_covers_it() -> None:
    context = ContextWindow()
    context.observe(env(TurnStart()))
    context.observe(env(TextComplete(message_id="m", text="The answer is 42.")))
    assert context.used == estimate_tokens("The answer is 42.")

    context.observe(env(Usage(tokens=TokenUsage(input_tokens=50, output_tokens=7))))
    context.observe(env(TextComplete(message_id="m2", text="covered by the usage")))
    assert context.used == 57


def test_observe_a_cancelled_turn_counts_the_streamed_partial_text() -> None:
    context = ContextWindow()
    context.record_call(call(1_000, 10))
    context.observe(env(TurnStart()))
    context.observe(env(TextDelta(message_id="m", text="Half of a ")))
    context.observe(env(TextDelta(message_id="m", text="sentence")))
    context.observe(env(TurnEnd(finish_reason="cancelled")))

    partial = estimate_tokens("Half of a sentence")
    assert context.used == 1_010 + partial
    assert context.last_input == 1_000
    assert context.statistics().calls == 1  # the cancelled one was not a call


def test_observe_compaction_restarts_from_tokens_after() -> None:
    context = ContextWindow(100_000)
    context.record_call(call(95_000, 100))
    context.observe(env(SessionCompaction(tokens_before=95_100, tokens_after=9_000)))
    assert context.snapshot().used == 9_000
    assert context.snapshot().estimated is True


def test_registry_keeps_one_window_per_session_and_agent() -> None:
    registry = ContextRegistry(window=1_000, window_for={"big": 200_000}.get)
    registry.observe(env(SessionStart(model="big")))
    registry.observe(env(ToolComplete(tool_call_id="t", output="x" * 60), agent="sub"))

    main = registry.get("s1")
    sub = registry.get("s1", "sub")
    assert main is not None
    assert sub is not None
    assert main.window == 200_000
    assert sub.window == 1_000
    assert main.used == 0
    assert sub.used > 0


def test_registry_forgets_the_least_recently_fed_conversation() -> None:
    registry = ContextRegistry(max_windows=2)
    registry.observe(env(TurnStart(), session="a"))
    registry.observe(env(TurnStart(), session="b"))
    registry.observe(env(TurnStart(), session="a"))
    registry.observe(env(TurnStart(), session="c"))
    assert registry.get("b") is None
    assert registry.get("a") is not None
    assert registry.statistics().evicted == 1


def test_the_basis_says_what_the_figure_stands_on() -> None:
    """Dexto's breakdown: last input + last output + estimate since, and how good estimates were."""
    context = ContextWindow(200_000)
    assert context.basis() == ContextBasis()  # nothing known yet
    context.add_message(400)
    context.call_started()  # 400 shown before the first call
    context.record_call(
        TokenUsage(
            input_tokens=100, cache_read_tokens=300, cache_write_tokens=100, output_tokens=50
        )
    )
    context.add_message(30)
    basis = context.snapshot().basis
    assert basis == ContextBasis(
        last_input=500,
        last_output=50,
        added=30,
        cache_read=300,
        cache_write=100,
        cache_hit_percent=60.0,
        estimate_samples=1,
        estimate_error_percent=20.0,  # 400 shown, 500 sent
    )
    assert context.used == 500 + 50 + 30  # last_input + last_output + added
    context.observe_reported(None, 700)  # the provider's own figure wins until the next call
    context.add_message(5)
    basis = context.basis()
    assert (basis.reported, basis.added) == (700, 5)
    assert context.used == 705
    context.call_started()  # 705 shown; the call sends 705 exactly
    context.record_call(TokenUsage(input_tokens=705, output_tokens=1))
    basis = context.basis()
    assert basis.reported is None
    assert (basis.cache_hit_percent, basis.estimate_samples) == (0.0, 2)
    assert basis.estimate_error_percent == pytest.approx(10.0)  # (20 + 0) / 2


def test_estimates_learn_a_correction_from_the_calls_that_follow() -> None:
    """An estimator that guesses half of what the provider counts is doubled once seen."""
    context = ContextWindow(200_000)
    context.add_message(1_000)
    context.call_started()
    context.record_call(TokenUsage(input_tokens=1_000, output_tokens=100))  # anchor 1,100
    assert context.correction == 1.0  # nothing estimated on an anchor yet
    context.add_message(500)  # busd guesses 500; the provider will count 1,000
    context.call_started()
    assert context.used == 1_600
    context.record_call(TokenUsage(input_tokens=2_100, output_tokens=100))
    assert context.correction == 2.0
    context.add_message(500)
    assert context.used == 2_200 + 1_000  # the same guess, corrected
    assert context.basis().added == 1_000
    assert context.basis().estimate_correction == 2.0
    context.call_started()
    context.record_call(TokenUsage(input_tokens=3_200, output_tokens=0))
    assert context.statistics().last_error == 0  # the corrected figure was exact


def test_a_correction_is_bounded_and_ignores_tiny_estimates() -> None:
    context = ContextWindow(200_000)
    context.call_started()
    context.record_call(TokenUsage(input_tokens=1_000))
    context.add_message(10)  # too small to learn from
    context.call_started()
    context.record_call(TokenUsage(input_tokens=5_000))
    assert context.correction == 1.0
    context.add_message(100)  # a huge jump the estimate could not know (a file attached)
    context.call_started()
    context.record_call(TokenUsage(input_tokens=50_000))
    assert context.correction == 4.0  # capped
    uncalibrated = ContextWindow(200_000, calibrate=False)
    uncalibrated.call_started()
    uncalibrated.record_call(TokenUsage(input_tokens=1_000))
    uncalibrated.add_message(500)
    uncalibrated.call_started()
    uncalibrated.record_call(TokenUsage(input_tokens=2_500))
    assert uncalibrated.correction == 1.0


def test_a_count_before_the_call_makes_the_figure_exact() -> None:
    """The anthropic driver's count_tokens, as the context window sees it."""
    context = ContextWindow(200_000)
    context.add_message(1_234)  # the estimate of the prompt
    context.observe_reported(None, 1_500)  # the API counted it before the call
    context.call_started()
    assert context.used == 1_500
    context.record_call(TokenUsage(input_tokens=1_500, output_tokens=20))
    assert context.statistics().last_error == 0


def test_a_window_the_provider_reported_is_not_replaced_by_the_model_table() -> None:
    """Copilot enforced 128,000 for a model the table says has 200,000: the provider knows."""
    registry = ContextRegistry(models=ModelWindows())
    registry.observe(env(SessionStart(model="claude-sonnet-4-5")))
    context = registry.get("s1")
    assert context is not None
    assert context.window == 200_000  # the table, until the provider says
    registry.observe(env(SessionContext(used=2_534, window=128_000)))
    registry.observe(env(Usage(tokens=TokenUsage(input_tokens=10), model="claude-sonnet-4-5")))
    assert context.window == 128_000
    assert context.window_reported


@given(
    st.lists(st.text(alphabet="ab ", max_size=5), min_size=1, max_size=8),
    st.booleans(),
    st.booleans(),
)
def test_a_run_of_deltas_at_once_is_each_delta_in_turn(
    texts: list[str], usage_first: bool, thinking: bool
) -> None:
    """The run's text is the partial answer of a cancelled call, as one by one; thinking is not."""
    one, many = ContextRegistry(window=1_000), ContextRegistry(window=1_000)
    make = ThinkingDelta if thinking else TextDelta
    envelopes = [env(make(message_id="m1", text=t)) for t in texts]
    for registry in (one, many):
        registry.window("s1").observe(env(TurnStart()))
        if usage_first:  # the call's usage came before its text: that text is counted
            registry.window("s1").observe(env(Usage(tokens=call(100, 5))))
        registry.window("s1").observe(env(TextDelta(message_id="m1", text="x")))
    for envelope in envelopes:
        one.window("s1").observe(envelope)
    many.observe_many(envelopes)
    assert many.window("s1")._pending == one.window("s1")._pending
    for registry in (one, many):
        registry.window("s1").observe(env(TurnEnd(finish_reason="cancelled")))
    assert many.window("s1").snapshot() == one.window("s1").snapshot()


def test_a_message_that_streams_without_end_keeps_bounded_text() -> None:
    """A stream that never ends its turn (a benchmark's, a stuck agent's) held every delta's
    text until then: the daemon grew by ~160 bytes an event. Now a message keeps a count and
    less than FOLD_CHARS of text, and a cut-short call still counts all of it."""
    from busd.core.partial import FOLD_CHARS, MAX_OPEN

    context = ContextWindow()
    context.record_call(call(1_000, 10))
    context.observe(env(TurnStart()))
    deltas = [f"word{i} and some more text, " for i in range(100_000)]  # ~2.9 million chars
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for text in deltas:
            context.observe(env(TextDelta(message_id="m", text=text)))
        estimate._recent.clear()  # the estimator's few recent chunks are its, bounded apart
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 64 << 10  # the deltas' own strings were about 8 MB kept alive before
    assert context._pending.held_chars() < FOLD_CHARS
    context.observe(env(TurnEnd(finish_reason="cancelled")))
    chunks, text, size = [], "", 0  # the estimate is of FOLD_CHARS-sized stretches
    for delta in deltas:
        text += delta
        size += len(delta)
        if size >= FOLD_CHARS:
            chunks.append(text)
            text, size = "", 0
    partial = sum(estimate_tokens(c) for c in [*chunks, text])
    assert context.used == 1_010 + partial
    assert abs(partial - estimate_tokens("".join(deltas))) <= 0.01 * partial  # close to one pass

    many = ContextWindow()
    many.observe(env(TurnStart()))
    for i in range(MAX_OPEN * 4):  # open messages, none completed
        many.observe(env(TextDelta(message_id=f"m{i}", text="Half of a sentence")))
    assert len(many._pending._messages) == MAX_OPEN
    many.observe(env(TurnEnd(finish_reason="cancelled")))
    assert many.used == MAX_OPEN * 4 * estimate_tokens("Half of a sentence")


@given(
    st.lists(st.lists(st.text(alphabet="ab .", max_size=9), max_size=6), max_size=8),
    st.integers(1, 12),
)
def test_partial_texts_fold_a_run_where_each_text_in_turn_would(
    runs: list[list[str]], fold: int
) -> None:
    """A run added at once keeps the counts and text the rule gives text by text (a message
    folds once it holds ``fold`` characters), with folds inside runs, at their ends and
    across them."""
    model: dict[str, tuple[int, str]] = {}  # message: tokens folded, text held
    texts = PartialTexts()
    with mock.patch.object(partial, "FOLD_CHARS", fold):
        for i, run in enumerate(runs):
            message = f"m{i % 3}"
            for text in run:
                folded, held = model.get(message, (0, ""))
                held += text
                if len(held) >= fold:
                    folded, held = folded + estimate_tokens(held), ""
                model[message] = (folded, held)
            texts.add(message, run)
            assert texts.held_chars() == sum(len(held) for _, held in model.values())
            assert texts.tokens() == sum(
                folded + (estimate_tokens(held) if held else 0) for folded, held in model.values()
            )
