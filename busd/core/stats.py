"""Streaming stats: the numbers of a live status line, per session and per run.

Sans-I/O: a tracker is fed envelopes with the time they were seen
(``observe(envelope, now)``) and asked for a :class:`~busd.core.events.StreamingStats`
at any time (``snapshot(now)``); time is always an argument, never read.
docs/accounting.md states the rules; in short:

- **Output tokens.** ``stream.usage`` carries running totals, so a report
  never lowers the figure (late snapshots are absorbed). Text, thinking and
  tool-input seen *after* the last report is estimated
  (:func:`busd.core.estimate.estimate_tokens`) and added on top, with
  ``output_estimated=True``; the next report replaces that estimate, also
  when it is lower than the estimate, equal to the last report, or zero. So
  the authoritative part never goes down, while the total may drop once when
  an over-estimate is corrected: a number that is wrong is worse than one
  that moves.
- **Thinking time.** A live wall-clock timer per stream runs from the first
  thinking delta to the first event of that stream that is not thinking; a
  ``duration_s`` on ``stream.thinking.complete`` replaces what the timer
  measured for that message. Blocks add up.
- **Elapsed.** Busy time: it runs from the first event that shows the agent
  working (a turn, a delta, a tool...) or an explicit ``start(now)``, and
  pauses when the main agent goes idle or the run finishes, so a session's
  figure is the time its agent worked, not its age.

Counts are kept per *lane*, one per ``(session_id, agent_id)``, because
sub-agents stream in parallel and may report usage of their own. A report of
the main agent also covers the sub-agents of its session that never reported
on their own (the usage ledger publishes session totals).
"""

from __future__ import annotations

import bisect
import itertools
import operator
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Final, cast

from .estimate import estimate_json_tokens, estimate_tokens
from .events import (
    AgentStart,
    AgentUpdate,
    ContextUsage,
    Envelope,
    Event,
    InternalError,
    PermissionRequested,
    RunFinished,
    RunStarted,
    SessionCompaction,
    SessionIdle,
    SessionInfo,
    SessionRetry,
    SessionTitleChanged,
    SessionWarning,
    StreamingStats,
    TextComplete,
    TextDelta,
    ThinkingComplete,
    ThinkingDelta,
    ToolPartialResult,
    ToolStart,
    ToolTimeout,
    TurnStart,
    Usage,
)

__all__ = [
    "StatsRegistry",
    "StatsRegistryStatistics",
    "StreamingStatsTracker",
    "TrackerStatistics",
]

LaneKey = tuple[str | None, str | None]
Baseline = Callable[[LaneKey], int]
"""Maps a lane to the cumulative output already reported before a tracker saw it."""

# Events that say nothing about what the agent is doing right now: they never
# start the clock nor stop a thinking timer (busd.* ones are our own output).
_NEUTRAL: Final[frozenset[type[Event]]] = frozenset(
    {
        Usage,
        SessionInfo,
        SessionWarning,
        SessionTitleChanged,
        AgentUpdate,
        StreamingStats,
        ContextUsage,
        ToolTimeout,
        InternalError,
    }
)

# Events that show the agent at work: the first one opens a busy period.
# Endings (turn end, tool complete, ...) are left out: a late one after idle
# must not restart a clock that nothing would stop.
_WORK: Final[frozenset[type[Event]]] = frozenset(
    {
        RunStarted,
        TurnStart,
        TextDelta,
        TextComplete,
        ThinkingDelta,
        ThinkingComplete,
        ToolStart,
        ToolPartialResult,
        AgentStart,
        PermissionRequested,
        SessionRetry,
        SessionCompaction,
    }
)

_MAX_STREAMED: Final = 256  # open messages remembered per lane
_FLUSH_CHARS: Final = 4096  # estimate pending delta text at least this often
_TEXT_OF = operator.attrgetter("event.text")  # of a delta's envelope


class _Lane:
    """One ``(session_id, agent_id)`` stream: its output count and thinking timer."""

    __slots__ = (
        "authoritative",
        "base",
        "measured",
        "pending",
        "pending_chars",
        "reported",
        "streamed",
        "tail",
        "think_id",
        "think_start",
    )

    def __init__(self, base: int) -> None:
        self.base = base
        self.reported = base  # highest cumulative output_tokens reported, absolute
        self.authoritative = 0  # reported - base, never negative, never down
        self.tail = 0  # estimated output since the last report that raised `reported`
        self.pending: list[str] = []  # delta text not estimated yet (part of the tail)
        self.pending_chars = 0
        self.streamed: set[str] = set()  # messages whose deltas were counted
        self.think_id: str | None = None  # message of the live thinking timer
        self.think_start = 0.0
        self.measured: dict[str, float] = {}  # timer figures awaiting their complete


@dataclass(frozen=True, slots=True)
class TrackerStatistics:
    lanes: int
    thinking_live: int
    reports: int
    stale_reports: int
    estimated_tokens: int


class StreamingStatsTracker:
    """Streaming stats of one session or one run; see the module docs for the rules.

    :param baseline: cumulative output each lane had before this tracker saw
        it (a run inside a longer session starts from the session's figure).
    :param idle_ends: whether ``stream.session.idle`` of the main agent pauses
        elapsed time; a run that owns several sessions only pauses when it
        finishes.
    :param max_lanes: bound on remembered lanes; the oldest idle one is
        forgotten first (its counts stay in the totals).

    Delta text is estimated lazily, in chunks of at least 4 KiB (a read
    estimates what is gathered without consuming it): one pass per chunk
    instead of one per delta, a piece cut in two by a delta boundary counts
    once, and the chunks do not depend on when the tracker is read.
    """

    __slots__ = (
        "_active_since",
        "_auth_total",
        "_baseline",
        "_elapsed_done",
        "_estimated",
        "_idle_ends",
        "_lanes",
        "_live",
        "_max_lanes",
        "_pending",
        "_reports",
        "_stale_reports",
        "_tail_total",
        "_thinking_done",
    )

    def __init__(
        self,
        *,
        baseline: Baseline | None = None,
        idle_ends: bool = True,
        max_lanes: int = 1024,
    ) -> None:
        if max_lanes < 1:
            raise ValueError("max_lanes must be at least 1")
        self._baseline = baseline
        self._idle_ends = idle_ends
        self._max_lanes = max_lanes
        self._lanes: dict[LaneKey, _Lane] = {}
        self._live: dict[LaneKey, _Lane] = {}  # lanes whose thinking timer runs
        self._pending: dict[LaneKey, _Lane] = {}  # lanes with text not estimated yet
        self._auth_total = 0
        self._tail_total = 0
        self._thinking_done = 0.0
        self._elapsed_done = 0.0
        self._active_since: float | None = None
        self._reports = 0
        self._stale_reports = 0
        self._estimated = 0

    # -- reading -----------------------------------------------------------

    @property
    def active(self) -> bool:
        """Whether the elapsed clock runs (the agent is working)."""
        return self._active_since is not None

    @property
    def output_tokens(self) -> int:
        """Authoritative output plus the estimate of what came after the last report."""
        return self._auth_total + self._tail_total + self._pending_tokens()

    def _pending_tokens(self) -> int:
        """The estimate of the text not flushed yet. A read leaves it pending: a lane is
        estimated in the same chunks whenever it is read, so that the session's and the
        run's trackers, fed the same text, cut it alike (:func:`estimate_tokens` remembers
        a chunk it has just estimated)."""
        pending = self._pending
        if not pending:
            return 0
        return sum(estimate_tokens("".join(lane.pending)) for lane in pending.values())

    @property
    def authoritative_output_tokens(self) -> int:
        """The reported part of :attr:`output_tokens`; never goes down."""
        return self._auth_total

    @property
    def output_estimated(self) -> bool:
        """Whether :attr:`output_tokens` includes estimated output."""
        return self._tail_total > 0 or bool(self._pending)

    def thinking_s(self, now: float) -> float:
        """Thinking time so far, including the running part of live timers."""
        total = self._thinking_done
        for lane in self._live.values():
            total += max(0.0, now - lane.think_start)
        return total

    def elapsed_s(self, now: float) -> float:
        """Busy time so far (see the module docs)."""
        if self._active_since is None:
            return self._elapsed_done
        return self._elapsed_done + max(0.0, now - self._active_since)

    def snapshot(self, now: float) -> StreamingStats:
        """The figures at ``now``; thinking and elapsed time tick with ``now``."""
        tail = self._tail_total + self._pending_tokens()
        return StreamingStats(
            elapsed_s=self.elapsed_s(now),
            output_tokens=self._auth_total + tail,
            output_estimated=tail > 0,
            thinking_s=self.thinking_s(now),
            thinking=bool(self._live),
        )

    def statistics(self) -> TrackerStatistics:
        return TrackerStatistics(
            lanes=len(self._lanes),
            thinking_live=len(self._live),
            reports=self._reports,
            stale_reports=self._stale_reports,
            estimated_tokens=self._estimated + self._pending_tokens(),
        )

    # -- the clock ---------------------------------------------------------

    def start(self, now: float) -> None:
        """Start (or resume) the elapsed clock; a no-op while it runs."""
        if self._active_since is None:
            self._active_since = now

    def stop(self, now: float) -> None:
        """Pause the elapsed clock and every thinking timer."""
        for key in list(self._live):
            self._stop_thinking(key, self._live[key], now)
        if self._active_since is not None:
            self._elapsed_done += max(0.0, now - self._active_since)
            self._active_since = None

    # -- feeding -----------------------------------------------------------

    def observe(self, envelope: Envelope[Event], now: float) -> None:
        """Account for one envelope seen at ``now``.

        Dispatch is on the exact event class (``type(e) is C``), the cheap
        check on this hot path.
        """
        event = envelope.event
        cls = type(event)
        key: LaneKey = (envelope.session_id, envelope.agent_id)
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._new_lane(key)
        if self._active_since is None and cls in _WORK:
            self._active_since = now

        if type(event) is TextDelta:
            if lane.think_id is not None:
                self._stop_thinking(key, lane, now)
            self._streamed(key, lane, event.message_id, event.text)
        elif type(event) is ThinkingDelta:
            if lane.think_id != event.message_id:
                if lane.think_id is not None:
                    self._stop_thinking(key, lane, now)
                lane.think_id = event.message_id
                lane.think_start = now
                self._live[key] = lane
            self._streamed(key, lane, event.message_id, event.text)
        elif type(event) is Usage:
            self._report(key, lane, event.tokens.output_tokens)
        elif type(event) is ThinkingComplete:
            self._thinking_complete(key, lane, event, now)
        elif cls in _NEUTRAL:
            pass
        else:
            if lane.think_id is not None:
                self._stop_thinking(key, lane, now)
            if type(event) is TextComplete:
                self._completed(lane, event.message_id, event.text)
            elif type(event) is ToolStart:
                tool_tokens = estimate_tokens(event.name) + estimate_json_tokens(event.input)
                self._estimate(lane, tool_tokens)
            elif cls is RunFinished or (
                cls is SessionIdle and self._idle_ends and envelope.agent_id is None
            ):
                self.stop(now)

    def observe_many(
        self,
        envelopes: Sequence[Envelope[Event]],
        now: float,
        texts: Sequence[str] | None = None,
    ) -> None:
        """:meth:`observe` each of ``envelopes``: deltas of one type, message, session and agent.

        After the first, such deltas only add text (the first one set the
        lane, the clock and the thinking timer), so they skip the dispatch,
        and only the first one's time ``now`` counts. ``texts``: their texts,
        when the caller has them already.
        """
        envelope = envelopes[0]
        self.observe(envelope, now)
        if len(envelopes) == 1:
            return
        if texts is None:
            texts = list(map(_TEXT_OF, envelopes))
        key: LaneKey = (envelope.session_id, envelope.agent_id)
        self._streamed_many(
            key,
            self._lanes[key],
            cast(TextDelta, envelope.event).message_id,
            itertools.islice(texts, 1, None),
        )

    def _new_lane(self, key: LaneKey) -> _Lane:
        if len(self._lanes) >= self._max_lanes:
            for old_key, old in self._lanes.items():
                if old.think_id is None:
                    if old.pending:
                        self._flush(old_key, old)
                    del self._lanes[old_key]
                    break
        lane = _Lane(self._baseline(key) if self._baseline is not None else 0)
        self._lanes[key] = lane
        return lane

    def _estimate(self, lane: _Lane, tokens: int) -> None:
        lane.tail += tokens
        self._tail_total += tokens
        self._estimated += tokens

    def _streamed(self, key: LaneKey, lane: _Lane, message_id: str, text: str) -> None:
        if not text:
            return
        streamed = lane.streamed
        if message_id not in streamed:
            if len(streamed) >= _MAX_STREAMED:
                streamed.clear()  # messages that never completed
            streamed.add(message_id)
        if not lane.pending:
            self._pending[key] = lane
        lane.pending.append(text)
        lane.pending_chars += len(text)
        if lane.pending_chars >= _FLUSH_CHARS:
            self._flush(key, lane)

    def _streamed_many(
        self, key: LaneKey, lane: _Lane, message_id: str, texts: Iterable[str]
    ) -> None:
        """:meth:`_streamed` of each text in turn, flushing where it would: one call per chunk."""
        texts = list(filter(None, texts))
        if not texts:
            return
        self._streamed(key, lane, message_id, texts[0])  # marks the message streamed
        ends = list(itertools.accumulate(map(len, texts), initial=0))
        start, count = 1, len(texts)
        while start < count:
            if not lane.pending:
                self._pending[key] = lane
            # The first text after which the pending ones reach a flush, if any.
            end = bisect.bisect_left(
                ends, ends[start] + _FLUSH_CHARS - lane.pending_chars, start + 1
            )
            stop = min(end, count)
            lane.pending += texts[start:stop]
            lane.pending_chars += ends[stop] - ends[start]
            if end <= count:
                self._flush(key, lane)
            start = stop

    def _flush(self, key: LaneKey, lane: _Lane) -> None:
        self._estimate(lane, estimate_tokens("".join(lane.pending)))
        lane.pending.clear()
        lane.pending_chars = 0
        del self._pending[key]

    def _completed(self, lane: _Lane, message_id: str, text: str) -> None:
        # A complete message whose deltas were counted adds nothing; one that
        # never streamed (a non-streaming SDK) is estimated whole.
        if message_id in lane.streamed:
            lane.streamed.discard(message_id)
        elif text:
            self._estimate(lane, estimate_tokens(text))

    def _report(self, key: LaneKey, lane: _Lane, cumulative: int) -> None:
        self._reports += 1
        if cumulative < lane.reported:
            self._stale_reports += 1  # a late snapshot: covers nothing new
            return
        # A count equal to the last one (a model call that streamed text the
        # provider had already counted, or a failed call's authoritative 0)
        # still covers everything seen so far: the estimate gives way to it.
        lane.reported = cumulative
        authoritative = cumulative - lane.base
        self._auth_total += authoritative - lane.authoritative
        lane.authoritative = authoritative
        self._covered(key, lane)
        session_id, agent_id = key
        if agent_id is None and len(self._lanes) > 1:
            # A main-agent report may be the session's total, sub-agents included
            # (the usage ledger counts per session). Sub-agents that never
            # reported on their own are taken as covered by it; one that does
            # report keeps its own figures.
            for other_key, other in self._lanes.items():
                if (
                    other_key[0] == session_id
                    and other_key[1] is not None
                    and other.reported == 0
                    and (other.tail or other.pending)
                ):
                    self._covered(other_key, other)

    def _covered(self, key: LaneKey, lane: _Lane) -> None:
        """A report covers the lane's output so far: drop its estimate."""
        self._tail_total -= lane.tail
        lane.tail = 0
        if lane.pending:  # never estimated at all
            lane.pending.clear()
            lane.pending_chars = 0
            del self._pending[key]

    def _stop_thinking(self, key: LaneKey, lane: _Lane, now: float) -> None:
        message_id = lane.think_id
        assert message_id is not None
        measured = max(0.0, now - lane.think_start)
        self._thinking_done += measured
        pending = lane.measured
        if message_id not in pending and len(pending) >= _MAX_STREAMED:
            pending.clear()  # blocks whose complete never came: keep what was measured
        pending[message_id] = pending.get(message_id, 0.0) + measured
        lane.think_id = None
        del self._live[key]

    def _thinking_complete(
        self, key: LaneKey, lane: _Lane, event: ThinkingComplete, now: float
    ) -> None:
        message_id = event.message_id
        if lane.think_id is not None:
            self._stop_thinking(key, lane, now)
        measured = lane.measured.pop(message_id, None)
        if event.duration_s is not None:
            # The SDK's figure covers the whole block: it replaces the timer's.
            self._thinking_done += max(0.0, event.duration_s) - (measured or 0.0)
        self._completed(lane, message_id, event.text)


@dataclass(frozen=True, slots=True)
class StatsRegistryStatistics:
    sessions: int
    runs: int
    evicted_sessions: int
    evicted_runs: int
    observed: int


class StatsRegistry:
    """One :class:`StreamingStatsTracker` per session and one per run, bounded.

    Trackers are created on the first envelope that names their session or
    run; past ``max_sessions`` / ``max_runs`` the least recently fed one is
    forgotten. A run's tracker counts output from the session's figure at the
    moment the run first touched each lane, so a second run in a session
    does not inherit the first run's tokens.
    """

    __slots__ = (
        "_evicted_runs",
        "_evicted_sessions",
        "_last_run",
        "_last_session",
        "_max_runs",
        "_max_sessions",
        "_observed",
        "_runs",
        "_sessions",
    )

    def __init__(self, *, max_sessions: int = 1024, max_runs: int = 1024) -> None:
        if max_sessions < 1 or max_runs < 1:
            raise ValueError("max_sessions and max_runs must be at least 1")
        self._max_sessions = max_sessions
        self._max_runs = max_runs
        self._sessions: dict[str, StreamingStatsTracker] = {}
        self._runs: dict[str, StreamingStatsTracker] = {}
        self._last_session: str | None = None
        self._last_run: str | None = None
        self._evicted_sessions = 0
        self._evicted_runs = 0
        self._observed = 0

    def observe(self, envelope: Envelope[Event], now: float) -> None:
        """Feed the envelope to its run's tracker, then to its session's."""
        self._observed += 1
        run_id = envelope.run_id
        if run_id is not None:
            self._run_tracker(run_id).observe(envelope, now)
        session_id = envelope.session_id
        if session_id is not None:
            self._session_tracker(session_id).observe(envelope, now)

    def observe_many(
        self,
        envelopes: Sequence[Envelope[Event]],
        now: float,
        texts: Sequence[str] | None = None,
    ) -> None:
        """:meth:`observe` each of ``envelopes``: deltas of one type, message, lane and run,
        the first seen at ``now``; ``texts``, their texts, taken once for both trackers."""
        self._observed += len(envelopes)
        first = envelopes[0]
        if texts is None and len(envelopes) > 1:
            texts = list(map(_TEXT_OF, envelopes))
        run_id = first.run_id
        if run_id is not None:
            self._run_tracker(run_id).observe_many(envelopes, now, texts)
        session_id = first.session_id
        if session_id is not None:
            self._session_tracker(session_id).observe_many(envelopes, now, texts)

    def session(self, session_id: str) -> StreamingStatsTracker | None:
        return self._sessions.get(session_id)

    def run(self, run_id: str) -> StreamingStatsTracker | None:
        return self._runs.get(run_id)

    def session_stats(self, session_id: str, now: float) -> StreamingStats | None:
        tracker = self._sessions.get(session_id)
        return None if tracker is None else tracker.snapshot(now)

    def run_stats(self, run_id: str, now: float) -> StreamingStats | None:
        tracker = self._runs.get(run_id)
        return None if tracker is None else tracker.snapshot(now)

    def discard_session(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)
        if self._last_session == session_id:
            self._last_session = None

    def discard_run(self, run_id: str) -> None:
        self._runs.pop(run_id, None)
        if self._last_run == run_id:
            self._last_run = None

    def statistics(self) -> StatsRegistryStatistics:
        return StatsRegistryStatistics(
            sessions=len(self._sessions),
            runs=len(self._runs),
            evicted_sessions=self._evicted_sessions,
            evicted_runs=self._evicted_runs,
            observed=self._observed,
        )

    def _session_reported(self, key: LaneKey) -> int:
        session_id = key[0]
        tracker = None if session_id is None else self._sessions.get(session_id)
        if tracker is None:
            return 0
        lane = tracker._lanes.get(key)
        return 0 if lane is None else lane.reported

    def _session_tracker(self, session_id: str) -> StreamingStatsTracker:
        sessions = self._sessions
        tracker = sessions.get(session_id)
        if tracker is None:
            if len(sessions) >= self._max_sessions:
                del sessions[next(iter(sessions))]
                self._evicted_sessions += 1
            tracker = sessions[session_id] = StreamingStatsTracker()
        elif self._last_session != session_id:
            sessions[session_id] = sessions.pop(session_id)  # most recently fed goes last
        self._last_session = session_id
        return tracker

    def _run_tracker(self, run_id: str) -> StreamingStatsTracker:
        runs = self._runs
        tracker = runs.get(run_id)
        if tracker is None:
            if len(runs) >= self._max_runs:
                del runs[next(iter(runs))]
                self._evicted_runs += 1
            tracker = runs[run_id] = StreamingStatsTracker(
                baseline=self._session_reported, idle_ends=False
            )
        elif self._last_run != run_id:
            runs[run_id] = runs.pop(run_id)
        self._last_run = run_id
        return tracker
