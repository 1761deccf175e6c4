"""The accountant: turns the stream into the derived ``busd.*`` events UIs show.

:class:`Accountant` is pure: it is fed every envelope (``observe``) and asked
for what is due at a given time (``tick``), and answers with derived events
to publish. It emits ``busd.stats`` on ticks while a session is busy (so a
thinking timer visibly ticks) and once more when the session goes quiet
(idle, its run finished, or :data:`QUIET_AFTER_S` seconds without any event:
a session that never says idle must not tick for ever);
``busd.context`` when a model call, a compaction or a provider report moves
the context figure; ``busd.tool.timeout`` once per overdue tool call, with
a ``stream.tool.complete`` (status ``timed_out``, error "timed out: ...")
that ends the call on the bus.
Nothing is emitted per delta, so accounting never doubles the event rate.

Stale envelopes (late output of a finished or superseded run, see
:mod:`busd.core.correlation`) are ignored: they would restart a session's
clock that nothing stops, and add text the run's figures already closed on.

:class:`busd.daemon.accounting.AccountingService` is the Trio shell: a bus
handler plus a loop that sleeps until the next tick or tool deadline.
"""

from __future__ import annotations

import bisect
import itertools
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from .context import ContextRegistry
from .events import (
    ContextUsage,
    Envelope,
    Event,
    RunFinished,
    SessionCompaction,
    SessionContext,
    SessionContextParts,
    SessionIdle,
    StreamingStats,
    TextDelta,
    ThinkingDelta,
    ToolComplete,
    ToolStart,
    TurnEnd,
    Usage,
    event_type,
)
from .stats import StatsRegistry
from .toolmetrics import ToolTracker
from .windows import ModelWindow, ModelWindows

__all__ = ["QUIET_AFTER_S", "SETTLE_STRETCH", "TIMED_OUT", "Accountant", "Derived"]

TIMED_OUT: Final = "timed out"
"""How the error of a tool call busd ended at its limit starts (``stream.tool.complete``)."""

QUIET_AFTER_S: Final = 60.0
"""Seconds without any event after which a busy session stops ticking.

Its next event resumes the ticks; its clock is not stopped (only idle or
the end of the run stop it), so the figures stay right when it does.
"""

_CONTEXT_MOVERS = (Usage, TurnEnd, SessionCompaction, SessionContext, SessionContextParts)
_QUIET = (SessionIdle, RunFinished)
_TOOL_INPUT = frozenset({ToolStart, ToolComplete, RunFinished, SessionIdle})

_MAX_DEFERRED: Final = 1024  # deltas held before they are accounted in one go
_SLICE_CHARS: Final = 32_768  # text fed to each registry in turn: 8 chunks of the estimator's 16
SETTLE_STRETCH: Final = 32
"""Deltas a publisher's :meth:`Accountant.settle` lets wait: a stretch of bursts shares
the cost of accounting a run (docs/performance.md, "A shorter path in Python")."""
_STALE = operator.attrgetter("stale")
_MESSAGE_OF = operator.attrgetter("event.message_id")  # of a delta's envelope
_TEXT_OF = operator.attrgetter("event.text")  # of a delta's envelope

# Per event class: is it the accountant's own kind of output (``busd.*`` but
# not ``busd.run.*``)? Asked for every event, so answered once per class.
_DERIVED: dict[type[Event], bool] = {}


def _is_derived(cls: type[Event], event: Event) -> bool:
    tag = event_type(event)
    derived = _DERIVED[cls] = tag.startswith("busd.") and not tag.startswith("busd.run.")
    return derived


def _one_run(a: Envelope[Event], b: Envelope[Event]) -> bool:
    """Whether two deltas are of one type, message and place: only the first one's time
    counts (a second message's would start its own thinking timer)."""
    return (
        type(a.event) is type(b.event)
        and _MESSAGE_OF(a) == _MESSAGE_OF(b)
        and a.session_id == b.session_id
        and a.agent_id == b.agent_id
        and a.run_id == b.run_id
    )


@dataclass(frozen=True, slots=True)
class Derived:
    """A derived event and the envelope fields it is published with."""

    event: Event
    session_id: str | None
    run_id: str | None = None
    agent_id: str | None = None


class Accountant:
    """Feeds the stats, context and tool trackers and says what to publish."""

    def __init__(
        self,
        *,
        tick_interval: float = 0.25,
        context_window: int | None = None,
        window_for: Callable[[str], int | None] | None = None,
        tool_timeout_s: float | None = None,
        tool_limits: Mapping[str, float | None] | None = None,
        quiet_after_s: float = QUIET_AFTER_S,
        model_windows: Mapping[str, int | ModelWindow] | None = None,
    ) -> None:
        """``context_window`` is the window of a model nobody knows;
        ``model_windows`` overrides the model table by id or prefix (the
        config's); ``window_for`` (tests, embedders) is asked before the table.
        """
        self.tick_interval = tick_interval
        self.quiet_after_s = quiet_after_s
        self._stats = StatsRegistry()
        self._context = ContextRegistry(
            window=context_window, window_for=window_for, models=ModelWindows(model_windows)
        )
        self.tools = ToolTracker(tool_timeout_s, tool_limits)
        self._busy: dict[str, str | None] = {}  # session id -> run id, while streaming
        self._seen: dict[str, float] = {}  # busy session id -> time of its last event
        self._stale = 0
        self._last_stats: dict[str, StreamingStats] = {}
        self._last_context: dict[tuple[str, str | None], ContextUsage] = {}
        self._next_tick: float | None = None
        # Deltas seen but not yet fed to the stats and context registries: runs
        # of one type from one place, each with its time, fed in runs (see
        # _account_deltas) before anything reads them or any other event is observed.
        self._deferred: list[tuple[list[Envelope[Event]], float]] = []
        self._deferred_count = 0
        self._gathering: list[Envelope[Event]] | None = None  # the last run, if it is ours

    @property
    def stats(self) -> StatsRegistry:
        """Streaming stats per session and run, up to date with everything observed."""
        self.settle()
        return self._stats

    @property
    def context(self) -> ContextRegistry:
        """Context windows per conversation, up to date with everything observed."""
        self.settle()
        return self._context

    def set_context_window(
        self, session_id: str, window: int | None, reserve: int | None = None
    ) -> None:
        """A run's own context window for ``session_id`` (``None``: back to the table).

        It wins over ``window_for``, the config's overrides and the table, for
        the session's conversations now and later (sub-agents included).
        ``reserve`` ``None``: the table's reserve for the model, if below ``window``.
        The daemon calls this for ``start_run.context_window`` as it starts the run,
        before the driver can feed anything.
        """
        self._context.pin(session_id, window, reserve)

    @property
    def stale_events(self) -> int:
        """Stale envelopes seen and ignored."""
        return self._stale

    def observe(self, envelope: Envelope[Event], now: float) -> list[Derived]:
        if envelope.stale:
            self._stale += 1
            return []
        event = envelope.event
        cls = type(event)
        if cls is TextDelta or cls is ThinkingDelta:
            return self._observe_delta(envelope, now)
        derived = _DERIVED.get(cls)
        if derived is None:
            derived = _is_derived(cls, event)
        if derived:
            return []  # derived events (ours included) are output, not input
        if self._deferred:
            self._account_deltas()
        self._stats.observe(envelope, now)
        if cls in _TOOL_INPUT:
            self.tools.observe(envelope, now)
        session_id = envelope.session_id
        out: list[Derived] = []
        if session_id is None:
            return out
        if isinstance(event, _CONTEXT_MOVERS):
            window = self._context.observe(envelope)
            if window is not None:
                snapshot = window.snapshot()
                key = (session_id, envelope.agent_id)
                if self._last_context.get(key) != snapshot:
                    self._last_context[key] = snapshot
                    out.append(Derived(snapshot, session_id, envelope.run_id, envelope.agent_id))
        else:
            self._context.observe(envelope)
        if type(event) in _QUIET and envelope.agent_id is None:
            self._busy.pop(session_id, None)
            self._seen.pop(session_id, None)
            self._emit_stats(session_id, envelope.run_id, now, out)
            return out
        if type(event) is TurnEnd:
            self._emit_stats(session_id, envelope.run_id, now, out)  # exact at each turn's end
        self._busy_at(session_id, envelope.run_id, now)
        return out

    def observe_run(self, envelopes: list[Envelope[Event]], now: float) -> list[Derived]:
        """:meth:`observe` each of a run of one type from one place, at ``now``.

        A run as :meth:`Bus.publish_stretch <busd.core.bus.Bus.publish_stretch>`
        dispatches it: a publish frame's deltas, with one session, agent and
        run. Deltas that are not stale are only noted, as :meth:`observe` would,
        without a call each (the list is kept: it must not change); anything
        else goes through :meth:`observe`.
        """
        first = envelopes[0]
        cls = type(first.event)
        if (cls is not TextDelta and cls is not ThinkingDelta) or any(map(_STALE, envelopes)):
            out: list[Derived] = []
            for envelope in envelopes:
                out += self.observe(envelope, now)
            return out
        self._deferred.append((envelopes, now))
        self._gathering = None  # the bus's list: never added to
        self._deferred_count += len(envelopes)
        if self._deferred_count >= _MAX_DEFERRED:
            self._account_deltas()
        session_id = first.session_id
        if session_id is not None:
            self._busy_at(session_id, first.run_id, now)
        return []

    def _busy_at(self, session_id: str, run_id: str | None, now: float) -> None:
        self._seen[session_id] = now
        if session_id not in self._busy:
            self._busy[session_id] = run_id
            if self._next_tick is None:
                self._next_tick = now + self.tick_interval

    @property
    def deferred_deltas(self) -> int:
        """Deltas noted but not yet fed to the registries (see :meth:`settle`)."""
        return self._deferred_count

    def settle(self, *, stretch: int = 1) -> None:
        """Account the deltas noted so far, now, if at least ``stretch`` of them wait.

        The daemon calls this when a publisher yields, with
        :data:`SETTLE_STRETCH`, so that the work (and the token estimates it
        triggers) is spread over stretches of bursts: neither piled up until
        the next tick nor paid again for each burst of a few deltas. Whatever
        reads the figures (:attr:`stats`, :attr:`context`, :meth:`tick`)
        settles all of them first.
        """
        if self._deferred_count >= stretch and self._deferred:
            self._account_deltas()

    def _observe_delta(self, envelope: Envelope[Event], now: float) -> list[Derived]:
        """A delta is only noted here: it emits nothing, and it is accounted later, in a run.

        The hot path. Only the busy bookkeeping (which decides the next tick)
        happens now.
        """
        last = self._gathering
        if last is not None and _one_run(last[-1], envelope):
            last.append(envelope)  # a delta published alone joins the one before it
        else:
            self._gathering = last = [envelope]
            self._deferred.append((last, now))
        self._deferred_count += 1
        if self._deferred_count >= _MAX_DEFERRED:
            self._account_deltas()
        session_id = envelope.session_id
        if session_id is not None:
            self._busy_at(session_id, envelope.run_id, now)
        return []

    def _account_deltas(self) -> None:
        """Feed the deferred deltas to the registries, in order, a run at a time.

        A run is consecutive deltas of one type, message, session, agent and
        run: after its first, each of them only adds text, so the registries
        take it in one call (see ``observe_many``), and its texts are taken
        once for all of them. The result is what feeding them one by one
        would give.
        """
        deferred, self._deferred = self._deferred, []
        self._deferred_count = 0
        self._gathering = None
        pieces: list[list[Envelope[Event]]] = []  # of the run being gathered
        key: tuple[object, ...] = ()
        since = 0.0  # when the run's first delta was seen
        for envelopes, now in deferred:  # each of one type from one place
            first = envelopes[0]
            kind, place = type(first.event), (first.session_id, first.agent_id, first.run_id)
            at = 0
            for message_id, same in itertools.groupby(map(_MESSAGE_OF, envelopes)):
                count = len(list(same))
                piece = envelopes if count == len(envelopes) else envelopes[at : at + count]
                at += count
                run_key = (kind, message_id, place)
                if run_key == key:
                    pieces.append(piece)
                    continue
                if pieces:
                    self._feed(pieces, since)
                pieces, key, since = [piece], run_key, now
        if pieces:
            self._feed(pieces, since)

    def _feed(self, pieces: list[list[Envelope[Event]]], now: float) -> None:
        """One run of deltas, in pieces, to the stats and context registries.

        A long run goes to them a slice at a time, so that the chunks the
        first tracker estimates are still in the estimator's memory when the
        others ask (after the first, a delta's time does not count).
        """
        run = pieces[0] if len(pieces) == 1 else list(itertools.chain.from_iterable(pieces))
        texts: list[str] = list(map(_TEXT_OF, run))
        stats, context = self._stats, self._context
        if len(texts) < 2 or sum(map(len, texts)) <= _SLICE_CHARS:
            stats.observe_many(run, now, texts)
            context.observe_many(run, texts)
            return
        ends = list(itertools.accumulate(map(len, texts), initial=0))
        start = 0
        while start < len(run):
            stop = bisect.bisect_right(ends, ends[start] + _SLICE_CHARS, start + 2) - 1
            stats.observe_many(run[start:stop], now, texts[start:stop])
            context.observe_many(run[start:stop], texts[start:stop])
            start = stop

    def tick(self, now: float) -> list[Derived]:
        """What is due at ``now``: stats of busy sessions, tool timeouts."""
        self.settle()
        out: list[Derived] = []
        if self._next_tick is not None and now >= self._next_tick:
            quiet_since = now - self.quiet_after_s
            for session_id, run_id in list(self._busy.items()):
                self._emit_stats(session_id, run_id, now, out)
                if self._seen.get(session_id, now) <= quiet_since:
                    del self._busy[session_id]  # no event for too long: stop ticking
                    self._seen.pop(session_id, None)
            self._next_tick = now + self.tick_interval if self._busy else None
        for timeout in self.tools.check(now):
            start = self.tools.started(timeout.tool_call_id)
            if start is None:
                out.append(Derived(timeout, None))
                continue
            scope = (start.session_id, start.run_id, start.agent_id)
            out.append(Derived(timeout, *scope))
            # The call ends on the bus with an error result, so transcripts, run
            # summaries and tool metrics close it; a real result that still
            # comes later is then a duplicate, ignored by trackers.
            complete = ToolComplete(
                tool_call_id=timeout.tool_call_id,
                name=timeout.name,
                status="timed_out",
                error=f"{TIMED_OUT}: no result after {timeout.limit_s:g}s "
                f"(the busd limit for {timeout.name})",
                duration_s=timeout.elapsed_s,
            )
            self.tools.observe(Envelope(0, now, complete, *scope, "busd.accounting"), now)
            out.append(Derived(complete, *scope))
        return out

    def next_wakeup(self) -> float | None:
        """When ``tick`` next has something to do (``None``: only after new input)."""
        tick = self._next_tick
        tool = self.tools.next_deadline()
        if tool is None:
            return tick
        return tool if tick is None or tool < tick else tick

    def session_stats(self, session_id: str, now: float) -> StreamingStats | None:
        return self.stats.session_stats(session_id, now)

    def _emit_stats(
        self, session_id: str, run_id: str | None, now: float, out: list[Derived]
    ) -> None:
        snapshot = self._stats.session_stats(session_id, now)
        if snapshot is not None and self._last_stats.get(session_id) != snapshot:
            self._last_stats[session_id] = snapshot
            out.append(Derived(snapshot, session_id, run_id))
