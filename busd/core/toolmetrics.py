"""Tool metrics and timeouts (sans-I/O).

:class:`ToolTracker` follows ``stream.tool.start`` / ``stream.tool.complete``
and keeps, per tool name, how often it was called, how often it failed (a
call ended with status ``timed_out`` failed too, and is also counted apart:
``ToolMetrics.timed_out``) and how long it took. It also knows when each
open call runs past its limit: the Trio shell sleeps until
:meth:`ToolTracker.next_deadline`, then publishes what
:meth:`ToolTracker.check` returns, so there is no polling and each
overdue call is reported exactly once.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from .events import (
    Envelope,
    Event,
    RunFinished,
    SessionIdle,
    ToolComplete,
    ToolMetrics,
    ToolStart,
    ToolTimeout,
)

__all__ = ["ToolTracker", "ToolTrackerStatistics"]

_HEAP_SLACK: Final = 64


class _Call:
    __slots__ = ("envelope", "limit", "name", "start", "timed_out", "tool_call_id")

    def __init__(
        self,
        tool_call_id: str,
        name: str,
        start: float,
        limit: float | None,
        envelope: Envelope[Event],
    ) -> None:
        self.tool_call_id = tool_call_id
        self.name = name
        self.start = start
        self.limit = limit
        self.envelope = envelope
        self.timed_out = False


class _Stat:
    __slots__ = ("calls", "errors", "last_called", "last_s", "timed", "timed_out", "total_s")

    def __init__(self) -> None:
        self.calls = 0
        self.errors = 0  # status error or timed_out
        self.timed_out = 0
        self.timed = 0  # calls whose duration is known
        self.total_s = 0.0
        self.last_called: float | None = None
        self.last_s: float | None = None  # the duration of the last call that ended


@dataclass(frozen=True, slots=True)
class ToolTrackerStatistics:
    open_calls: int
    tools: int
    timeouts: int
    evicted: int
    abandoned: int
    unmatched_completions: int
    duplicates: int


def _check_limit(what: str, limit: float | None) -> None:
    if limit is not None and not limit > 0:
        raise ValueError(f"{what} must be positive (or None for no limit), not {limit}")


class ToolTracker:
    """Per-tool metrics and one-shot timeouts for the tool calls it is fed.

    :param default_limit_s: limit for tools not named in ``limits``; ``None``
        means no timeout.
    :param limits: per tool name, a limit that overrides the default
        (``None`` there turns the timeout off for that tool).
    :param max_open: bound on open calls; past it the oldest is forgotten.
    :param remember: how many finished call ids are kept to drop duplicates.

    Durations come from the ``now`` arguments (any monotonic clock, seconds);
    ``last_called`` is the start envelope's ``ts`` (epoch seconds), because
    that is what a frontend can show.
    """

    __slots__ = (
        "_abandoned",
        "_default",
        "_done",
        "_duplicates",
        "_evicted",
        "_heap",
        "_limits",
        "_max_open",
        "_open",
        "_order",
        "_remember",
        "_stats",
        "_timeouts",
        "_unmatched",
    )

    def __init__(
        self,
        default_limit_s: float | None = None,
        limits: Mapping[str, float | None] | None = None,
        *,
        max_open: int = 4096,
        remember: int = 4096,
    ) -> None:
        _check_limit("default_limit_s", default_limit_s)
        for name, limit in (limits or {}).items():
            _check_limit(f"the limit of {name!r}", limit)
        if max_open < 1 or remember < 0:
            raise ValueError("max_open must be at least 1 and remember not negative")
        self._default = default_limit_s
        self._limits = dict(limits or {})
        self._max_open = max_open
        self._remember = remember
        self._open: dict[str, _Call] = {}
        self._done: dict[str, None] = {}  # recently finished ids, oldest first
        self._heap: list[tuple[float, int, _Call]] = []  # (deadline, order, call)
        self._order = 0
        self._stats: dict[str, _Stat] = {}
        self._timeouts = 0
        self._evicted = 0
        self._abandoned = 0
        self._unmatched = 0
        self._duplicates = 0

    # -- configuration -----------------------------------------------------

    def limit_for(self, name: str) -> float | None:
        """The limit a new call of ``name`` gets."""
        return self._limits.get(name, self._default)

    # -- feeding -----------------------------------------------------------

    def observe(self, envelope: Envelope[Event], now: float) -> None:
        """Account for a tool start or completion seen at ``now``; ignores other events.

        A run that finishes, or a main agent that goes idle, abandons its
        open calls: they can no longer complete, so they never time out.
        """
        event = envelope.event
        if type(event) is ToolStart:
            self._start(event, envelope, now)
        elif type(event) is ToolComplete:
            self._complete(event, envelope, now)
        elif type(event) is RunFinished:
            run_id = envelope.run_id
            if run_id is not None:
                self._abandon(lambda start: start.run_id == run_id)
        elif type(event) is SessionIdle and envelope.agent_id is None:
            session_id = envelope.session_id
            if session_id is not None:
                self._abandon(lambda start: start.session_id == session_id)

    def _stat(self, name: str) -> _Stat:
        stat = self._stats.get(name)
        if stat is None:
            stat = self._stats[name] = _Stat()
        return stat

    def _start(self, event: ToolStart, envelope: Envelope[Event], now: float) -> None:
        call_id = event.tool_call_id
        if call_id in self._open or call_id in self._done:
            self._duplicates += 1
            return
        open_calls = self._open
        if len(open_calls) >= self._max_open:
            del open_calls[next(iter(open_calls))]
            self._evicted += 1
            self._maybe_compact()
        limit = self.limit_for(event.name)
        call = _Call(call_id, event.name, now, limit, envelope)
        open_calls[call_id] = call
        if limit is not None:
            self._order += 1
            heapq.heappush(self._heap, (now + limit, self._order, call))
        stat = self._stat(event.name)
        stat.calls += 1
        stat.last_called = envelope.ts

    def _complete(self, event: ToolComplete, envelope: Envelope[Event], now: float) -> None:
        call_id = event.tool_call_id
        call = self._open.pop(call_id, None)
        if call is None:
            if call_id in self._done:
                self._duplicates += 1
                return
            # Started before we were watching: count it if we can name it.
            self._unmatched += 1
            if event.name is None:
                self._finished(call_id)
                return
            stat = self._stat(event.name)
            stat.calls += 1
            stat.last_called = envelope.ts
            duration = event.duration_s
        else:
            stat = self._stat(call.name)
            duration = event.duration_s if event.duration_s is not None else now - call.start
            self._maybe_compact()
        if duration is not None:
            stat.timed += 1
            stat.total_s += max(0.0, duration)
            stat.last_s = max(0.0, duration)
        status = event.status
        if status == "error":
            stat.errors += 1
        elif status == "timed_out":  # a failure too, counted apart as well
            stat.errors += 1
            stat.timed_out += 1
        self._finished(call_id)

    def _finished(self, call_id: str) -> None:
        if self._remember:
            done = self._done
            done[call_id] = None
            if len(done) > self._remember:
                del done[next(iter(done))]

    def _abandon(self, belongs: Callable[[Envelope[Event]], bool]) -> None:
        gone = [k for k, c in self._open.items() if belongs(c.envelope)]
        for call_id in gone:
            del self._open[call_id]
            self._finished(call_id)
        self._abandoned += len(gone)
        self._maybe_compact()

    def _maybe_compact(self) -> None:
        # Finished calls leave their deadline behind (lazy deletion); sweep
        # them out once they outnumber the live ones, so memory stays bounded.
        if len(self._heap) > 2 * len(self._open) + _HEAP_SLACK:
            self._heap = [e for e in self._heap if self._is_live(e[2])]
            heapq.heapify(self._heap)

    def discard(self, tool_call_id: str) -> None:
        """Forget an open call (it will not time out); its start still counts."""
        if self._open.pop(tool_call_id, None) is not None:
            self._abandoned += 1
            self._finished(tool_call_id)

    # -- timeouts ----------------------------------------------------------

    def _is_live(self, call: _Call) -> bool:
        return self._open.get(call.tool_call_id) is call

    def next_deadline(self) -> float | None:
        """When the next open call runs out (same clock as ``now``); ``None`` if none can."""
        heap = self._heap
        while heap and not self._is_live(heap[0][2]):
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def check(self, now: float) -> list[ToolTimeout]:
        """Timeouts of open calls whose limit passed by ``now``, each reported once.

        A call that timed out stays open here: the accountant then ends it
        with a ``stream.tool.complete`` of status ``timed_out`` (fed back
        here, it counts as an error and a timeout); fed nothing, the tracker
        would count the real completion, if it ever came, with its duration.
        """
        heap = self._heap
        fired: list[ToolTimeout] = []
        while heap and heap[0][0] <= now:
            _, _, call = heapq.heappop(heap)
            if not self._is_live(call) or call.limit is None:
                continue
            call.timed_out = True
            fired.append(
                ToolTimeout(
                    tool_call_id=call.tool_call_id,
                    name=call.name,
                    limit_s=call.limit,
                    elapsed_s=now - call.start,
                )
            )
        self._timeouts += len(fired)
        return fired

    def started(self, tool_call_id: str) -> Envelope[Event] | None:
        """The start envelope of an open call: its session, run and agent scope a timeout."""
        call = self._open.get(tool_call_id)
        return None if call is None else call.envelope

    def timed_out(self, tool_call_id: str) -> bool:
        """Whether an open call has been reported overdue."""
        call = self._open.get(tool_call_id)
        return call is not None and call.timed_out

    # -- reading -----------------------------------------------------------

    @property
    def open_calls(self) -> int:
        return len(self._open)

    def metric(self, name: str) -> ToolMetrics | None:
        stat = self._stats.get(name)
        return None if stat is None else _metrics(name, stat)

    def metrics(self) -> list[ToolMetrics]:
        """One entry per tool name seen, sorted by name."""
        return [_metrics(name, self._stats[name]) for name in sorted(self._stats)]

    def statistics(self) -> ToolTrackerStatistics:
        return ToolTrackerStatistics(
            open_calls=len(self._open),
            tools=len(self._stats),
            timeouts=self._timeouts,
            evicted=self._evicted,
            abandoned=self._abandoned,
            unmatched_completions=self._unmatched,
            duplicates=self._duplicates,
        )


def _metrics(name: str, stat: _Stat) -> ToolMetrics:
    return ToolMetrics(
        name=name,
        calls=stat.calls,
        errors=stat.errors,
        total_s=stat.total_s,
        mean_s=stat.total_s / stat.timed if stat.timed else 0.0,
        last_called=stat.last_called,
        last_s=stat.last_s,
        timed_out=stat.timed_out,
    )
