"""Context window estimate: how full the window will be on the next model call.

Sans-I/O and clock-free. The core is a handful of methods that say what
happened (:meth:`ContextWindow.set_system`, :meth:`~ContextWindow.add_message`,
:meth:`~ContextWindow.record_call`, :meth:`~ContextWindow.compacted`,
:meth:`~ContextWindow.cancelled`, :meth:`~ContextWindow.observe_reported`);
:meth:`ContextWindow.observe` maps stream envelopes onto them.

The figure shown is ``used``, and it is anchored on the last actual count:

- after a call: ``last_input + last_output + estimate(messages since)``,
  where ``last_input`` counts cache reads and writes too (all of it was
  context) and the new messages are estimated (:mod:`busd.estimate`);
- after a provider reported the window state (Copilot's usage info): that
  figure plus what was added since; the most recent actual count wins;
- before any call, or after a compaction: a pure estimate, system prompt +
  tool specs + messages (or the compaction's ``tokens_after`` + messages),
  flagged ``estimated``.

:meth:`ContextWindow.should_compact` decides from that same ``used`` figure,
so what the user sees is what the decision was made on. docs/accounting.md
has the full rules.
"""

from __future__ import annotations

import operator
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import cast

from .estimate import estimate_json_tokens, estimate_tokens
from .events import (
    ContextBasis,
    ContextBreakdown,
    ContextUsage,
    Envelope,
    Event,
    RunStarted,
    SessionCompaction,
    SessionContext,
    SessionContextParts,
    SessionIdle,
    SessionStart,
    SessionTruncation,
    TextComplete,
    TextDelta,
    ThinkingDelta,
    TokenUsage,
    ToolComplete,
    ToolStart,
    TurnEnd,
    TurnStart,
    Usage,
    UserPrompt,
)
from .partial import PartialTexts
from .usage import tokens_max, tokens_minus
from .windows import ModelWindows

__all__ = [
    "ContextRegistry",
    "ContextRegistryStatistics",
    "ContextStatistics",
    "ContextWindow",
]

_TEXT_OF = operator.attrgetter("event.text")  # of a text delta's envelope


@dataclass(frozen=True, slots=True)
class ContextStatistics:
    """How well the estimate predicted the actual input of the calls that followed.

    ``mean_error`` is signed (positive: the estimate was too high), in tokens;
    ``mean_abs_pct_error`` is the mean of ``|estimate - actual| / actual`` in
    percent. Both cover the last ``samples`` calls and are ``None`` without any.
    """

    calls: int
    samples: int
    last_error: int | None
    mean_error: float | None
    mean_abs_pct_error: float | None


_CALIBRATION_SAMPLES = 16
"""Calls a conversation's correction is learned over (the most recent ones)."""
_CALIBRATION_MIN_TOKENS = 50
"""Estimated growth below this teaches nothing: the call's own overhead would dominate."""
_CALIBRATION_MIN, _CALIBRATION_MAX = 0.25, 4.0
"""A correction stays within these: one odd call must not make the figure absurd."""


def _context_input(usage: TokenUsage) -> int:
    return usage.input_tokens + usage.cache_read_tokens + usage.cache_write_tokens


def _tokens(text_or_tokens: str | int) -> int:
    if isinstance(text_or_tokens, str):
        return estimate_tokens(text_or_tokens)
    if text_or_tokens < 0:
        raise ValueError(f"a token count cannot be negative: {text_or_tokens}")
    return text_or_tokens


class ContextWindow:
    """The context fill of one conversation (one session's main agent, or one sub-agent).

    :param window: the model's context window in tokens, ``None`` if unknown
        (then ``percent`` and ``free`` are ``None`` and nothing asks to compact).
    :param reserve: room kept for the model's output (its maximum output
        tokens): ``free`` is ``window - used - reserve``, never below 0.
    :param threshold: fraction of the window at which :meth:`should_compact`
        says yes.
    :param max_samples: how many estimate-vs-actual errors are kept.
    """

    __slots__ = (
        "_actual",
        "_anchor",
        "_calibrate",
        "_calls",
        "_compacted_in_turn",
        "_correction",
        "_cumulative",
        "_errors",
        "_last_cache",
        "_last_input",
        "_last_output",
        "_pending",
        "_predicted_since",
        "_prediction",
        "_reported",
        "_reserve",
        "_residuals",
        "_since",
        "_system",
        "_threshold",
        "_tools",
        "_turn_base",
        "_turn_open",
        "_turn_usage",
        "_window",
        "_window_reported",
    )

    def __init__(
        self,
        window: int | None = None,
        *,
        reserve: int = 0,
        threshold: float = 0.8,
        max_samples: int = 256,
        calibrate: bool = True,
    ) -> None:
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], not {threshold}")
        if max_samples < 1:
            raise ValueError("max_samples must be at least 1")
        self._window: int | None = None
        self._reserve = 0
        self.set_window(window, reserve=reserve)
        self._threshold = threshold
        self._system = 0
        self._tools = 0
        self._anchor: int | None = None  # last actual (or compaction) figure
        self._actual = False  # whether the anchor is a provider count
        self._since = 0  # estimated tokens added since the anchor (or since the start)
        self._last_input: int | None = None
        self._last_output = 0
        self._last_cache = (0, 0)  # the last call's cache reads and writes
        self._window_reported = False  # the provider said the window: no table overrides it
        self._reported: int | None = None  # the provider's own figure, until the next call
        self._prediction: int | None = None  # `used` when the pending call went out
        self._errors: deque[tuple[int, int]] = deque(maxlen=max_samples)  # (estimate, actual)
        # Calibration: what the estimated part of each prediction turned out to be.
        self._calibrate = calibrate
        self._predicted_since: tuple[int, int] | None = None  # (anchor, raw since) at call start
        self._residuals: deque[tuple[int, int]] = deque(maxlen=_CALIBRATION_SAMPLES)
        self._correction = 1.0
        self._calls = 0
        # observe(): per-call figures out of cumulative stream.usage reports
        self._cumulative: TokenUsage | None = None
        self._turn_base: TokenUsage | None = None
        self._turn_open = False
        self._turn_usage = False
        self._compacted_in_turn = False  # the call's usage is a billed sum, not the context
        self._pending = PartialTexts()  # streamed text of this call not yet complete

    # -- reading -----------------------------------------------------------

    @property
    def window(self) -> int | None:
        return self._window

    @property
    def window_reported(self) -> bool:
        """Whether the provider itself said how large the window is (it beats any table)."""
        return self._window_reported

    @property
    def reserve(self) -> int:
        """Tokens kept free for the model's output (0 when unknown)."""
        return self._reserve

    @property
    def threshold(self) -> float:
        return self._threshold

    @property
    def used(self) -> int:
        """Tokens the next call is expected to send: the figure shown and acted on."""
        if self._anchor is None:
            return self._system + self._tools + self._since
        return self._anchor + self.added

    @property
    def added(self) -> int:
        """The estimate of what went in since the anchor, corrected by what calls showed."""
        return round(self._since * self._correction)

    @property
    def correction(self) -> float:
        """The factor the estimates since the last call are scaled by (1.0 until learned).

        Learned per conversation from the calls that followed an estimate:
        what each call's input grew by beyond the last actual count, over
        what busd had estimated for that growth (docs/accounting.md).
        """
        return self._correction

    @property
    def estimated(self) -> bool:
        """True while no provider count backs :attr:`used` (no call yet, or just compacted)."""
        return not self._actual

    @property
    def last_input(self) -> int | None:
        """Input of the last call, cache reads and writes included; ``None`` before one."""
        return self._last_input

    @property
    def last_output(self) -> int:
        return self._last_output

    def percent(self) -> float | None:
        """``used`` as a percentage of the window, clamped to 0..100; ``None`` if unknown.

        An estimate can overshoot the window (or a reported figure exceed a
        window that was configured too small): a bar never shows 130%.
        """
        window = self._window
        if window is None:
            return None
        return min(100.0, 100.0 * self.used / window)

    def should_compact(self) -> bool:
        """Whether the shown figure reached ``threshold`` of the window."""
        return self._window is not None and self.used >= self._threshold * self._window

    def breakdown(self) -> ContextBreakdown:
        """Where ``used`` goes; the parts sum to ``used`` and none is negative.

        System and tool figures are estimates, so after a call they are capped
        by the actual total and ``messages`` is what remains of it.
        """
        used = self.used
        system = min(self._system, used)
        tools = min(self._tools, used - system)
        free = None if self._window is None else max(0, self._window - used - self._reserve)
        return ContextBreakdown(
            system=system, tools=tools, messages=used - system - tools, free=free
        )

    def basis(self) -> ContextBasis:
        """What :attr:`used` stands on (docs/accounting.md, "The context figure's basis")."""
        cache_read, cache_write = self._last_cache
        last_input = self._last_input
        stats = self.statistics()
        return ContextBasis(
            last_input=last_input,
            last_output=self._last_output,
            reported=self._reported,
            added=self.added,
            estimate_correction=self._correction,
            cache_read=cache_read,
            cache_write=cache_write,
            cache_hit_percent=(100.0 * cache_read / last_input) if last_input else None,
            estimate_samples=stats.samples,
            estimate_error_percent=stats.mean_abs_pct_error,
        )

    def snapshot(self) -> ContextUsage:
        return ContextUsage(
            used=self.used,
            window=self._window,
            percent=self.percent(),
            estimated=not self._actual,
            breakdown=self.breakdown(),
            basis=self.basis(),
        )

    def statistics(self) -> ContextStatistics:
        errors = self._errors
        if not errors:
            return ContextStatistics(self._calls, 0, None, None, None)
        n = len(errors)
        signed = sum(estimate - actual for estimate, actual in errors)
        with_actual = [(e, a) for e, a in errors if a > 0]
        mape = (
            100.0 * sum(abs(e - a) / a for e, a in with_actual) / len(with_actual)
            if with_actual
            else None
        )
        last_estimate, last_actual = errors[-1]
        return ContextStatistics(
            calls=self._calls,
            samples=n,
            last_error=last_estimate - last_actual,
            mean_error=signed / n,
            mean_abs_pct_error=mape,
        )

    # -- what happened -----------------------------------------------------

    def set_window(self, window: int | None, *, reserve: int | None = None) -> None:
        """Set the window (and the output reserve; ``None`` keeps the current one)."""
        if window is not None and window <= 0:
            raise ValueError(f"a context window must be positive, not {window}")
        if reserve is not None:
            if reserve < 0:
                raise ValueError(f"an output reserve cannot be negative: {reserve}")
            self._reserve = reserve
        self._window = window

    def set_system(self, text_or_tokens: str | int) -> None:
        """The system prompt (text to estimate, or a known count)."""
        self._system = _tokens(text_or_tokens)

    def set_tools(self, specs: Iterable[object] | int) -> None:
        """The tool specs sent with every call (JSON-like values, or a known count)."""
        if isinstance(specs, int):
            self._tools = _tokens(specs)
        else:
            self._tools = sum(estimate_json_tokens(spec) for spec in specs)

    def add_message(self, text_or_tokens: str | int) -> int:
        """Something that will be in the next call's input; returns its estimate."""
        tokens = _tokens(text_or_tokens)
        self._since += tokens
        return tokens

    def call_started(self) -> None:
        """A call went out: freeze the figure shown now as its prediction.

        Without it, :meth:`record_call` compares with the figure shown just
        before the actual count arrived.
        """
        self._prediction = self.used
        if self._anchor is not None and self._actual:
            self._predicted_since = (self._anchor, self._since)

    def record_call(self, usage: TokenUsage, *, update: bool = False) -> None:
        """The provider's count of one call; it becomes the new anchor.

        Records the estimate error of this call (once: ``update=True`` marks
        a later, more complete report of the call already recorded).
        """
        actual_input = _context_input(usage)
        if not update:
            self._calls += 1
            predicted = self._prediction if self._prediction is not None else self.used
            if predicted > 0:  # nothing shown, nothing to grade
                self._errors.append((predicted, actual_input))
            self._learn(actual_input)
        self._prediction = None
        self._predicted_since = None
        self._last_input = actual_input
        self._last_output = usage.output_tokens
        self._last_cache = (usage.cache_read_tokens, usage.cache_write_tokens)
        self._reported = None
        self._anchor = actual_input + usage.output_tokens
        self._actual = True
        self._since = 0

    def _learn(self, actual_input: int) -> None:
        """One more sample of how the estimated growth compared with the actual one."""
        basis = self._predicted_since
        if basis is None or not self._calibrate:
            return
        anchor, estimated = basis
        if estimated < _CALIBRATION_MIN_TOKENS:  # too little was estimated to learn from
            return
        self._residuals.append((max(0, actual_input - anchor), estimated))
        actual = sum(a for a, _ in self._residuals)
        guessed = sum(e for _, e in self._residuals)
        self._correction = min(_CALIBRATION_MAX, max(_CALIBRATION_MIN, actual / guessed))

    def observe_reported(self, window: int | None, used: int) -> None:
        """A provider's own view of the window (e.g. Copilot usage info); it wins."""
        if used < 0:
            raise ValueError(f"used cannot be negative: {used}")
        if window is not None:
            self.set_window(window)
            self._window_reported = True
        self._anchor = used
        self._reported = used
        self._actual = True
        self._since = 0

    def compacted(self, tokens_after: int | None = None) -> None:
        """The conversation was summarized; estimate afresh from what remains."""
        self._anchor = tokens_after
        self._reported = None
        self._actual = False
        self._since = 0
        self._prediction = None

    def truncated(self, tokens_removed: int) -> None:
        """Old messages were dropped; the figure shrinks (never below zero)."""
        if self._anchor is not None:
            self._anchor = max(0, self._anchor - tokens_removed)
        else:
            self._since = max(0, self._since - tokens_removed)

    def cancelled(self, partial_output: str | int = "") -> None:
        """A call was cut short with no usage: keep the last actuals, add its partial output."""
        self._prediction = None
        self.add_message(partial_output)

    # -- from the stream ---------------------------------------------------

    def observe(self, envelope: Envelope[Event]) -> None:
        """Map one envelope of this conversation onto the methods above.

        Feed only the envelopes of one conversation (same ``session_id`` and
        ``agent_id``): :class:`ContextRegistry` does that routing.
        ``stream.usage`` is cumulative, so each call's figures are the
        difference from the report before its ``stream.turn.start``; without
        turn events, a report whose input grew starts a new call.
        """
        event = envelope.event
        if type(event) is TextDelta:
            if not self._turn_usage and event.text:
                self._pending.add(event.message_id, (event.text,))
        elif type(event) is ToolComplete:
            # A tool result is input of the next call, whatever the turn state.
            self.add_message(event.output or event.error or "")
        elif type(event) is Usage:
            self._usage(event.tokens)
        elif type(event) is TextComplete:
            self._pending.discard(event.message_id)
            if not self._turn_usage:  # after the usage, it is in last_output
                self.add_message(event.text)
        elif type(event) is ToolStart:
            if not self._turn_usage:
                self.add_message(estimate_tokens(event.name) + estimate_json_tokens(event.input))
        elif type(event) is TurnStart:
            self._turn_open = True
            self._turn_usage = False
            self._compacted_in_turn = False
            self._turn_base = self._cumulative
            self._pending.clear()
            self.call_started()
        elif type(event) is TurnEnd:
            self._end_turn(cancelled=event.finish_reason == "cancelled")
        elif type(event) is SessionIdle:
            if self._turn_open:
                self._end_turn(cancelled=event.aborted)
        elif type(event) is RunStarted:
            if event.prompt:
                self.add_message(event.prompt)
        elif type(event) is UserPrompt:
            self.add_message(event.text)
        elif type(event) is SessionCompaction:
            self.compacted(event.tokens_after)
            self._compacted_in_turn = self._turn_open
        elif type(event) is SessionTruncation and event.tokens_removed:
            self.truncated(event.tokens_removed)
        elif type(event) is SessionContext:
            self.observe_reported(event.window, max(0, event.used))
        elif type(event) is SessionContextParts:
            if event.system is not None:
                self.set_system(max(0, event.system))
            if event.tools is not None:
                self.set_tools(max(0, event.tools))

    def observe_texts(self, message_id: str, texts: Iterable[str]) -> None:
        """:meth:`observe` of a ``stream.text.delta`` of ``message_id`` for each of ``texts``."""
        if self._turn_usage:
            return
        texts = list(filter(None, texts))
        if texts:
            self._pending.add(message_id, texts)

    def _end_turn(self, *, cancelled: bool) -> None:
        if cancelled and not self._turn_usage:
            # The partial answer stays in the transcript: what it streamed, estimated.
            self.cancelled(self._pending.tokens())
        self._prediction = None
        self._pending.clear()
        self._turn_open = False
        self._turn_usage = False
        self._compacted_in_turn = False

    def _usage(self, tokens: TokenUsage) -> None:
        previous = self._cumulative
        cumulative = tokens if previous is None else tokens_max(previous, tokens)
        if cumulative == previous:
            return  # a repeat or a late snapshot
        self._cumulative = cumulative
        if self._compacted_in_turn:
            # A compacting call bills every iteration (Anthropic's usage.iterations): its
            # sum is no context figure, and not an estimate's outcome. What is in the
            # window comes with stream.session.context, or from the next call.
            return
        if self._turn_open:
            update = self._turn_usage
        elif previous is None or _context_input(cumulative) > _context_input(previous):
            self._turn_base = previous  # an implicit call start
            update = False
        else:
            update = True
        call = tokens_minus(cumulative, self._turn_base)
        if _context_input(call) == 0:
            return  # a late report of an earlier call: every call has some input
        self.record_call(call, update=update)
        self._turn_usage = self._turn_open


@dataclass(frozen=True, slots=True)
class ContextRegistryStatistics:
    windows: int
    evicted: int


class ContextRegistry:
    """One :class:`ContextWindow` per conversation, keyed by ``(session_id, agent_id)``.

    The window of a conversation comes from, first to last: a size pinned
    for its session (:meth:`pin`, a run's override), ``window_for``, the
    model table ``models`` (:class:`~busd.core.windows.ModelWindows`, with
    the config's overrides), and ``window``. The model is the one named by
    ``stream.session.start``, ``busd.run.started`` or ``stream.usage``.

    :param window: the window of a new conversation when nothing knows its model.
    :param window_for: maps a model name to its window; ``None`` for "don't know".
    :param models: the model table (no output reserve without it).
    :param max_windows: bound; the least recently fed conversation goes first.
    """

    __slots__ = (
        "_calibrate",
        "_evicted",
        "_last",
        "_max",
        "_models",
        "_pinned",
        "_threshold",
        "_window",
        "_window_for",
        "_windows",
    )

    def __init__(
        self,
        *,
        window: int | None = None,
        window_for: Callable[[str], int | None] | None = None,
        models: ModelWindows | None = None,
        threshold: float = 0.8,
        max_windows: int = 1024,
        calibrate: bool = True,
    ) -> None:
        if max_windows < 1:
            raise ValueError("max_windows must be at least 1")
        self._calibrate = calibrate
        self._window = window
        self._window_for = window_for
        self._models = models
        self._threshold = threshold
        self._max = max_windows
        self._windows: dict[tuple[str, str | None], ContextWindow] = {}
        self._last: tuple[tuple[str, str | None], ContextWindow] | None = None
        self._pinned: dict[str, tuple[int, int | None]] = {}  # session -> (window, reserve)
        self._evicted = 0

    def pin(self, session_id: str, window: int | None, reserve: int | None = None) -> None:
        """Fix the window of ``session_id``'s conversations (``None``: unpin).

        For a run's own override: the model table and later model names no
        longer change it. ``reserve`` ``None`` keeps the table's reserve for
        the model named (0 until one is, or when it is not below ``window``).
        """
        if window is None:
            self._pinned.pop(session_id, None)
            return
        if window <= 0 or (reserve is not None and not 0 <= reserve < window):
            raise ValueError(f"need 0 < window and 0 <= reserve < window: {window}, {reserve}")
        if len(self._pinned) >= self._max and session_id not in self._pinned:
            del self._pinned[next(iter(self._pinned))]
        self._pinned[session_id] = (window, reserve)
        for (sid, _), context in self._windows.items():
            if sid == session_id:
                kept = reserve if reserve is not None else context.reserve
                context.set_window(window, reserve=kept if kept < window else 0)

    def get(self, session_id: str, agent_id: str | None = None) -> ContextWindow | None:
        return self._windows.get((session_id, agent_id))

    def window(self, session_id: str, agent_id: str | None = None) -> ContextWindow:
        """The conversation's window, created on first use (and made most recent)."""
        key = (session_id, agent_id)
        last = self._last
        if last is not None and last[0] == key:
            return last[1]  # fed again: already the most recent (a stream of deltas)
        windows = self._windows
        found = windows.pop(key, None)
        if found is None:
            if len(windows) >= self._max:
                del windows[next(iter(windows))]
                self._evicted += 1
            window, reserve = self._pinned.get(session_id, (self._window, None))
            found = ContextWindow(
                window, reserve=reserve or 0, threshold=self._threshold, calibrate=self._calibrate
            )
        windows[key] = found
        self._last = (key, found)
        return found

    def observe(self, envelope: Envelope[Event]) -> ContextWindow | None:
        """Route the envelope to its conversation; returns the window it fed, if any."""
        session_id = envelope.session_id
        if session_id is None:
            return None
        context = self.window(session_id, envelope.agent_id)
        event = envelope.event
        cls = type(event)
        if cls is SessionStart or cls is Usage or cls is RunStarted:
            model = cast(SessionStart, event).model
            if model and not context.window_reported:
                pinned = self._pinned.get(session_id)
                if pinned is None:
                    self._size(context, model)
                elif pinned[1] is None and self._models is not None:
                    found = self._models.lookup(model)  # the pinned window, the model's reserve
                    if found is not None and found.reserve < pinned[0]:
                        context.set_window(pinned[0], reserve=found.reserve)
        context.observe(envelope)
        return context

    def _size(self, context: ContextWindow, model: str) -> None:
        if self._window_for is not None:
            size = self._window_for(model)
            if size is not None:
                context.set_window(size, reserve=0 if context.reserve >= size else None)
                return
        if self._models is not None:
            found = self._models.lookup(model)
            if found is not None:
                context.set_window(found.window, reserve=found.reserve)

    def observe_many(
        self, envelopes: Sequence[Envelope[Event]], texts: Sequence[str] | None = None
    ) -> None:
        """:meth:`observe` each of ``envelopes``: deltas of one type, message and conversation.

        ``texts``: their texts, when the caller has them already (the accountant
        hands the stats registry the same list).
        """
        first = envelopes[0]
        if first.session_id is None:
            return
        context = self.window(first.session_id, first.agent_id)
        event = first.event
        if type(event) is TextDelta:
            if texts is None:
                texts = list(map(_TEXT_OF, envelopes))
            context.observe_texts(event.message_id, texts)
        elif type(event) is not ThinkingDelta:  # thinking is not input of the next call
            for envelope in envelopes:
                context.observe(envelope)

    def discard(self, session_id: str, agent_id: str | None = None) -> None:
        if agent_id is None:
            self._pinned.pop(session_id, None)
        self._windows.pop((session_id, agent_id), None)
        if self._last is not None and self._last[0] == (session_id, agent_id):
            self._last = None

    def statistics(self) -> ContextRegistryStatistics:
        return ContextRegistryStatistics(windows=len(self._windows), evicted=self._evicted)
