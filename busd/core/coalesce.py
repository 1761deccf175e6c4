"""Coalescing: what may replace or absorb what inside one batch window (sans-I/O).

A subscriber gets one frame per window, so within a window the accumulator
keeps only what still carries meaning:

- an event with a *coalescing key* supersedes the earlier buffered event with
  the same key; the survivor keeps its own (later) position and nothing else
  moves, so order is never changed, only thinned;
- adjacent text or thinking deltas of the same message are concatenated,
  which is lossless; deltas are never replaced;
- lifecycle events (session start, idle, error, turns, runs...) are never
  superseded or merged, whatever a keyer says.

Keys are plain hashables that start with the dotted type name, so different
types never collide. They end with the envelope's ``stale`` flag, so an event
from a dead run never hides a live one (nor the reverse).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Final, cast

import msgspec

from .errors import BusdError
from .events import (
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
    ToolComplete,
    ToolPartialResult,
    ToolStart,
    ToolTimeout,
    TurnEnd,
    TurnStart,
    Usage,
    UserPrompt,
)

__all__ = [
    "DEFAULT_MAX_MERGED_CHARS",
    "DELTA_TYPES",
    "KEYED_TYPES",
    "LIFECYCLE_TYPES",
    "Accumulator",
    "AccumulatorFull",
    "AccumulatorStatistics",
    "Keyer",
    "chain_keyers",
    "coalescing_key",
]

Keyer = Callable[[Envelope[Event]], Hashable | None]
"""Maps an envelope to its coalescing key, or ``None`` for "never superseded"."""


class AccumulatorFull(BusdError):
    """The accumulator holds ``max_events`` survivors and the new event needs a slot.

    The buffer is left exactly as it was: the owner decides whether to drain
    it now or to give up on the subscriber.
    """


# -- keys ----------------------------------------------------------------------


def _tag(cls: type[Event]) -> str:
    return cast(str, cls.__struct_config__.tag)


def _per_session(cls: type[Event]) -> Keyer:
    tag = _tag(cls)

    def key(env: Envelope[Event]) -> Hashable:
        return (tag, env.session_id, env.stale)

    return key


def _per_session_agent(cls: type[Event]) -> Keyer:
    tag = _tag(cls)

    def key(env: Envelope[Event]) -> Hashable:
        return (tag, env.session_id, env.agent_id, env.stale)

    return key


def _per_tool_call(cls: type[ToolStart | ToolPartialResult | ToolComplete]) -> Keyer:
    tag = _tag(cls)

    def key(env: Envelope[Event]) -> Hashable:
        event = cast(ToolStart | ToolPartialResult | ToolComplete, env.event)
        return (tag, env.session_id, event.tool_call_id, env.stale)

    return key


def _per_message(cls: type[TextComplete | ThinkingComplete]) -> Keyer:
    tag = _tag(cls)

    def key(env: Envelope[Event]) -> Hashable:
        event = cast(TextComplete | ThinkingComplete, env.event)
        return (tag, env.session_id, event.message_id, env.stale)

    return key


def _agent_update_key(env: Envelope[Event]) -> Hashable:
    event = cast(AgentUpdate, env.event)
    return ("stream.agent.update", env.session_id, event.agent_id, env.stale)


_KEY_FUNCTIONS: Final[dict[type[Event], Keyer]] = {
    Usage: _per_session_agent(Usage),
    ToolStart: _per_tool_call(ToolStart),
    ToolPartialResult: _per_tool_call(ToolPartialResult),
    ToolComplete: _per_tool_call(ToolComplete),
    AgentUpdate: _agent_update_key,
    TextComplete: _per_message(TextComplete),
    ThinkingComplete: _per_message(ThinkingComplete),
    SessionTitleChanged: _per_session(SessionTitleChanged),
    SessionRetry: _per_session(SessionRetry),
    StreamingStats: _per_session_agent(StreamingStats),
    ContextUsage: _per_session_agent(ContextUsage),
    SessionContext: _per_session_agent(SessionContext),
    SessionContextParts: _per_session_agent(SessionContextParts),
}

KEYED_TYPES: Final[frozenset[type[Event]]] = frozenset(_KEY_FUNCTIONS)
"""Built-in types that :func:`coalescing_key` gives a key: snapshots, the last one wins."""

DELTA_TYPES: Final[frozenset[type[Event]]] = frozenset({TextDelta, ThinkingDelta})
"""Never replaced; adjacent ones of the same message may be concatenated."""

LIFECYCLE_TYPES: Final[frozenset[type[Event]]] = frozenset(
    {
        SessionStart,
        SessionIdle,
        SessionError,
        SessionInfo,
        SessionWarning,
        SessionCompaction,
        UserPrompt,
        SessionTruncation,
        TurnStart,
        TurnEnd,
        AgentStart,
        AgentComplete,
        PermissionRequested,
        PermissionResolved,
        ToolTimeout,
        RunStarted,
        RunCancelled,
        RunFinished,
        InternalError,
    }
)
"""Never superseded nor merged, even if a plugin keyer returns a key for them."""


def coalescing_key(envelope: Envelope[Event]) -> Hashable | None:
    """The built-in coalescing key of ``envelope``, ``None`` if it must never be superseded.

    Unknown (plugin) types get ``None``; put a plugin keyer in front with
    :func:`chain_keyers` to coalesce them.
    """
    key = _KEY_FUNCTIONS.get(type(envelope.event))
    return None if key is None else key(envelope)


def chain_keyers(*keyers: Keyer) -> Keyer:
    """A keyer that asks each of ``keyers`` in turn and returns the first non-``None`` key.

    Typical use puts plugin keyers first and the built-in one last:
    ``chain_keyers(plugin_keyer, coalescing_key)``. Plugin keys should start
    with the plugin's type name, as the built-in ones do, so they never
    collide with another type's keys.
    """
    if not keyers:
        raise ValueError("chain_keyers() needs at least one keyer")
    if len(keyers) == 1:
        return keyers[0]

    def chained(envelope: Envelope[Event]) -> Hashable | None:
        for keyer in keyers:
            key = keyer(envelope)
            if key is not None:
                return key
        return None

    return chained


# -- the accumulator -------------------------------------------------------------

DEFAULT_MAX_MERGED_CHARS: Final = 131_072
"""Text one merged delta holds at most: an eighth of the default 1 MiB frame cap."""

_DELTA: Final = 1
_PROTECTED: Final = 2
_KIND: Final[dict[type[Event], int]] = {
    **dict.fromkeys(DELTA_TYPES, _DELTA),
    **dict.fromkeys(LIFECYCLE_TYPES, _PROTECTED),
}

_COMPACT_MIN_DEAD: Final = 64


@dataclass(frozen=True, slots=True)
class AccumulatorStatistics:
    buffered: int
    """Survivors waiting for the next drain."""
    added: int
    """Events given to :meth:`Accumulator.add` and accepted (over the lifetime)."""
    superseded: int
    """Buffered events dropped because a later one had the same key."""
    merged: int
    """Deltas concatenated into the delta before them."""
    drained_batches: int
    """Non-empty drains."""
    drained_events: int
    """Survivors handed out by drains."""


class Accumulator:
    """The events of one batch window for one subscriber, coalesced as they arrive.

    Survivors sit in a slot list; a superseded slot becomes a tombstone
    (``None``) and a dict maps each key to its live slot, so :meth:`add` is
    O(1) and :meth:`drain` O(n). A run of merged deltas keeps its pieces in a
    list and is joined once, when the run ends, so a long run costs O(total
    length) and not O(n²).

    A merged delta holds at most ``max_merged_chars`` characters of text (a
    delta that would take it past that starts a new one), so that it still
    fits one frame: 4 bytes a character at most, the daemon passes an
    eighth of its ``max_frame``.
    """

    __slots__ = (
        "_added",
        "_dead",
        "_drained_batches",
        "_drained_events",
        "_first_seq",
        "_index",
        "_keyer",
        "_live",
        "_max",
        "_max_chars",
        "_merge",
        "_merged",
        "_parts",
        "_parts_chars",
        "_slots",
        "_superseded",
        "_tail",
    )

    def __init__(
        self,
        *,
        keyer: Keyer = coalescing_key,
        merge_deltas: bool = True,
        max_events: int = 10_000,
        max_merged_chars: int = DEFAULT_MAX_MERGED_CHARS,
    ) -> None:
        if max_events < 1:
            raise ValueError(f"max_events must be at least 1, not {max_events}")
        if max_merged_chars < 1:
            raise ValueError(f"max_merged_chars must be at least 1, not {max_merged_chars}")
        self._keyer = keyer
        self._merge = merge_deltas
        self._max = max_events
        self._max_chars = max_merged_chars
        self._slots: list[Envelope[Event] | None] = []
        self._index: dict[Hashable, int] = {}
        self._live = 0
        self._dead = 0
        # The last slot, when it is a delta more deltas may merge into: the
        # newest envelope of the run, and the run's texts once it has two.
        self._tail: Envelope[Event] | None = None
        self._parts: list[str] | None = None
        self._parts_chars = 0
        self._first_seq: int | None = None
        self._added = 0
        self._superseded = 0
        self._merged = 0
        self._drained_batches = 0
        self._drained_events = 0

    @property
    def max_events(self) -> int:
        return self._max

    @property
    def merge_deltas(self) -> bool:
        return self._merge

    @property
    def first_seq(self) -> int | None:
        """The ``seq`` of the oldest event added since the last drain, ``None`` if none.

        Superseded and merged events count, so this is where a subscriber that
        loses the buffer has to resume from (a merged delta carries a later seq).
        """
        return self._first_seq

    def __len__(self) -> int:
        return self._live

    def __bool__(self) -> bool:
        return self._live > 0

    def add(self, envelope: Envelope[Event]) -> None:
        """Buffer ``envelope``, superseding or merging as the rules say.

        Raises :class:`AccumulatorFull`, leaving the buffer untouched, when
        ``max_events`` survivors are buffered and ``envelope`` would need a
        new slot.
        """
        cls = type(envelope.event)
        kind = _KIND.get(cls)
        key: Hashable | None
        if kind is None:
            key = self._keyer(envelope)
        else:
            key = None
            if kind == _DELTA:
                tail = self._tail
                if (
                    tail is not None
                    and type(tail.event) is cls
                    and cast(TextDelta, tail.event).message_id
                    == cast(TextDelta, envelope.event).message_id
                    and tail.session_id == envelope.session_id
                    and tail.agent_id == envelope.agent_id
                    and tail.run_id == envelope.run_id
                    and tail.source == envelope.source
                    and tail.stale == envelope.stale
                    and self._fits(cast(TextDelta, tail.event), cast(TextDelta, envelope.event))
                ):
                    parts = self._parts
                    if parts is None:
                        self._parts = [
                            cast(TextDelta, tail.event).text,
                            cast(TextDelta, envelope.event).text,
                        ]
                    else:
                        parts.append(cast(TextDelta, envelope.event).text)
                    self._tail = envelope
                    self._merged += 1
                    self._added += 1
                    return

        slots = self._slots
        old = None if key is None else self._index.get(key)
        if old is None:
            if self._live >= self._max:
                raise AccumulatorFull(
                    f"{self._live} events are buffered (max_events={self._max}); "
                    "drain the buffer or drop the subscriber"
                )
            self._live += 1
        else:
            slots[old] = None
            self._dead += 1
            self._superseded += 1
        if self._parts is not None:
            self._seal()
        if key is not None:
            self._index[key] = len(slots)
        slots.append(envelope)
        self._tail = envelope if kind == _DELTA and self._merge else None
        if self._first_seq is None:
            self._first_seq = envelope.seq
        self._added += 1
        if self._dead > _COMPACT_MIN_DEAD and self._dead > self._live:
            self._compact()

    def hold_from(self, seq: int) -> None:
        """Resume from ``seq`` at the latest: what was added came coalesced from there on.

        For a batch coalesced upstream (a cohort's), whose first survivor may
        carry a later seq than the first event it stands for.
        """
        if self._live and (self._first_seq is None or seq < self._first_seq):
            self._first_seq = seq

    def _fits(self, tail: TextDelta, delta: TextDelta) -> bool:
        """Whether ``delta`` may merge into the run ending with ``tail`` (and count it)."""
        chars = (len(tail.text) if self._parts is None else self._parts_chars) + len(delta.text)
        if chars > self._max_chars:
            return False
        self._parts_chars = chars
        return True

    def drain(self) -> list[Envelope[Event]]:
        """Every survivor in order; the accumulator is empty afterwards."""
        if self._parts is not None:
            self._seal()
        slots = self._slots
        out: list[Envelope[Event]]
        if self._dead:
            out = [env for env in slots if env is not None]
        else:
            out = cast(list[Envelope[Event]], slots)
        self._slots = []
        self._index.clear()
        self._live = self._dead = 0
        self._tail = None
        self._first_seq = None
        if out:
            self._drained_batches += 1
            self._drained_events += len(out)
        return out

    def clear(self) -> None:
        """Discard everything buffered (not counted as drained)."""
        self._parts = None
        self._slots = []
        self._index.clear()
        self._live = self._dead = 0
        self._tail = None
        self._first_seq = None

    def statistics(self) -> AccumulatorStatistics:
        return AccumulatorStatistics(
            buffered=self._live,
            added=self._added,
            superseded=self._superseded,
            merged=self._merged,
            drained_batches=self._drained_batches,
            drained_events=self._drained_events,
        )

    def _seal(self) -> None:
        """Write the pending delta run into the last slot as one envelope."""
        tail = self._tail
        assert tail is not None
        assert self._parts is not None
        event = msgspec.structs.replace(tail.event, text="".join(self._parts))
        self._slots[-1] = msgspec.structs.replace(tail, event=event)
        self._parts = None

    def _compact(self) -> None:
        """Drop tombstones once they outnumber survivors, keeping add O(1) amortized."""
        slots = self._slots
        where = [0] * len(slots)
        live: list[Envelope[Event] | None] = []
        for i, env in enumerate(slots):
            if env is not None:
                where[i] = len(live)
                live.append(env)
        index = self._index
        for key, i in index.items():
            index[key] = where[i]
        self._slots = live
        self._dead = 0
