"""Cohorts: subscriptions that read the shared log through one cursor (sans-I/O).

Fan-out used to cost the daemon work per event *and per subscriber*: every
event was filtered, keyed and buffered once for each subscription. Here the
daemon does a fixed amount per event (append it, encoded once, to the
:class:`Log`); subscriptions with the same patterns, sessions, owner, window
and delta mode form a :class:`Cohort` with one cursor into that log. When a
cohort is due, :meth:`Cohort.take` filters and coalesces the slice since its
cursor once, for all of its members, into a :class:`SharedBatch` whose bytes
every member sends. The cost of an event then grows with the number of
*different* subscriptions, not with the number of subscribers.

Coalescing over a slice gives what coalescing the same events one by one
gives (the same :class:`~busd.core.coalesce.Accumulator` does it), so order,
losslessness and the rules of docs/coalescing.md are unchanged. The window
is kept by the caller, who decides when a cohort is due.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Final, Generic, TypeVar, cast

import msgspec

from .coalesce import (
    DEFAULT_MAX_MERGED_CHARS,
    DELTA_TYPES,
    LIFECYCLE_TYPES,
    Accumulator,
    Keyer,
    coalescing_key,
)
from .events import Envelope, Event

__all__ = ["Cohort", "Log", "SharedBatch", "SharedPart"]

M = TypeVar("M")

_EVENT_OF = attrgetter("event")
_UNBOUNDED: Final = sys.maxsize  # a cohort's own buffer never refuses: its members' may


class Log:
    """The accepted envelopes (and their bytes) since the oldest cursor still reading them.

    Seqs are consecutive, as the bus assigns them, so a cursor finds its
    place by arithmetic; :meth:`trim` lets go of what every cursor has read.
    """

    __slots__ = ("_base", "_envelopes", "_raws")

    def __init__(self, *, head_seq: int = 0) -> None:
        self._envelopes: list[Envelope[Event]] = []
        self._raws: list[msgspec.Raw] = []
        self._base = head_seq + 1  # the seq of _envelopes[0]

    @property
    def head_seq(self) -> int:
        """The seq of the newest envelope appended (or the one before the first to come)."""
        return self._base + len(self._envelopes) - 1

    def __len__(self) -> int:
        return len(self._envelopes)

    def append(self, envelope: Envelope[Event], raw: msgspec.Raw) -> None:
        """Add the next envelope; its seq must follow the head's (else ``ValueError``)."""
        if envelope.seq != self._base + len(self._envelopes):
            raise ValueError(f"seq {envelope.seq} does not follow the log's head {self.head_seq}")
        self._envelopes.append(envelope)
        self._raws.append(raw)

    def extend(self, envelopes: list[Envelope[Event]], raws: list[msgspec.Raw]) -> None:
        """:meth:`append` each of a run, whose seqs follow one another."""
        if envelopes and (
            envelopes[0].seq != self._base + len(self._envelopes)
            or envelopes[-1].seq != envelopes[0].seq + len(envelopes) - 1
        ):
            raise ValueError(f"seqs {envelopes[0].seq}.. do not follow the head {self.head_seq}")
        self._envelopes += envelopes
        self._raws += raws

    def after(self, seq: int) -> tuple[list[Envelope[Event]], list[msgspec.Raw]]:
        """The envelopes after ``seq`` and their bytes (``seq`` must not be trimmed yet)."""
        start = seq + 1 - self._base
        if start < 0:
            raise ValueError(f"seq {seq} is no longer in the log (it starts at {self._base})")
        return self._envelopes[start:], self._raws[start:]

    def raw_of(self, envelope: Envelope[Event]) -> msgspec.Raw | None:
        """The bytes appended with this very envelope, ``None`` for another (a merged delta)."""
        i = envelope.seq - self._base
        if 0 <= i < len(self._envelopes) and self._envelopes[i] is envelope:
            return self._raws[i]
        return None

    def trim(self, seq: int) -> None:
        """Forget the envelopes up to ``seq``: every cursor has read them."""
        n = min(seq + 1 - self._base, len(self._envelopes))
        if n > 0:
            del self._envelopes[:n]
            del self._raws[:n]
            self._base += n


@dataclass(slots=True)
class SharedBatch:
    """One cohort's batch: the survivors of a slice and their bytes, built once for all members.

    ``first_seq`` is the seq of the slice's first wanted event, superseded
    or merged ones included: where a member that fails to deliver the batch
    resumes from. ``parts`` is for the sending side: the ``events`` arrays,
    packed once (more than one when the batch is over a frame's cap).
    """

    envelopes: list[Envelope[Event]]
    raws: list[msgspec.Raw]
    first_seq: int
    size: int
    """Bytes of the envelopes together."""
    parts: list[SharedPart] | None = None

    def __len__(self) -> int:
        return len(self.envelopes)


@dataclass(slots=True)
class SharedPart:
    """One ``events`` frame of a shared batch: its packed array, sent by every member.

    ``since`` is the resume point if it is not delivered; ``heads`` the frame
    head built per subscription id (members with the same id send the very
    same bytes).
    """

    since: int
    body: bytes
    heads: dict[int, bytes] = field(default_factory=dict)


class Cohort(Generic[M]):
    """Members that want the same events at the same pace, and their cursor into the log.

    ``matches`` says whether an event type name is subscribed; ``admits``
    (``None``: everything) is the per-event part of the filter. Both come
    from any one member: the members share the key they were grouped by.
    """

    __slots__ = (
        "_acc",
        "_admits",
        "_inert",
        "_matches",
        "_types",
        "cursor",
        "key",
        "last_flush",
        "members",
        "window",
    )

    def __init__(
        self,
        key: Hashable,
        *,
        matches: Callable[[str], bool],
        admits: Callable[[Envelope[Event]], bool] | None,
        window: float,
        merge_deltas: bool,
        cursor: int,
        keyer: Keyer = coalescing_key,
        max_merged_chars: int = DEFAULT_MAX_MERGED_CHARS,
    ) -> None:
        self.key = key
        self.members: list[M] = []
        self.window = window
        self.cursor = cursor
        """The last seq taken: what the members have been given (or were not subscribed for)."""
        self.last_flush = -float("inf")
        """When the last non-empty batch was taken (the caller's clock)."""
        self._matches = matches
        self._admits = admits
        self._types: dict[type[Event], bool] = {}
        self._inert = LIFECYCLE_TYPES if merge_deltas else LIFECYCLE_TYPES | DELTA_TYPES
        self._acc = Accumulator(
            keyer=keyer,
            merge_deltas=merge_deltas,
            max_events=_UNBOUNDED,
            max_merged_chars=max_merged_chars,
        )

    def _wanted(self, envelopes: list[Envelope[Event]]) -> list[int]:
        """Indexes of the envelopes the members want.

        Types are judged once each: a slice of one subscribed type, and no
        per-envelope filter, is wanted whole without a look at each.
        """
        kinds: list[type[Event]] = list(map(type, map(_EVENT_OF, envelopes)))
        types = self._types
        for cls in set(kinds).difference(types):
            types[cls] = self._matches(cast(str, cls.__struct_config__.tag))
        admits = self._admits
        if admits is None:
            if all(map(types.__getitem__, set(kinds))):
                return list(range(len(envelopes)))
            return [i for i, cls in enumerate(kinds) if types[cls]]
        return [i for i, cls in enumerate(kinds) if types[cls] and admits(envelopes[i])]

    def take(
        self, log: Log, encode: Callable[[Envelope[Event]], msgspec.Raw]
    ) -> SharedBatch | None:
        """Filter and coalesce what the log holds past the cursor; ``None`` if nothing is wanted.

        The cursor moves to the head either way. ``encode`` gives the bytes
        of an envelope the log does not hold (a merged delta).
        """
        envelopes, raws = log.after(self.cursor)
        self.cursor = log.head_seq
        wanted = self._wanted(envelopes)
        if not wanted:
            return None
        first = envelopes[wanted[0]].seq
        if not self._may_coalesce(envelopes, wanted):
            if len(wanted) == len(envelopes):  # the slices are fresh lists: the batch takes them
                return SharedBatch(envelopes, raws, first, sum(map(len, raws)))
            kept = [raws[i] for i in wanted]  # nothing to thin: the survivors are the wanted
            return SharedBatch([envelopes[i] for i in wanted], kept, first, sum(map(len, kept)))
        acc = self._acc
        before = acc.statistics()
        for i in wanted:
            acc.add(envelopes[i])
        survivors = acc.drain()
        after = acc.statistics()
        if after.superseded == before.superseded and after.merged == before.merged:
            kept = [raws[i] for i in wanted]  # nothing thinned: the survivors are the wanted
        else:
            kept = []
            for envelope in survivors:
                raw = log.raw_of(envelope)
                kept.append(raw if raw is not None else encode(envelope))
        return SharedBatch(survivors, kept, first, sum(map(len, kept)))

    def _may_coalesce(self, envelopes: list[Envelope[Event]], wanted: list[int]) -> bool:
        """Whether any wanted event could be superseded or merged (else the accumulator is moot).

        Lifecycle types never are, deltas only when merging; a keyed type or
        one the built-in rules do not know (a plugin keyer may key it) could.
        """
        inert = self._inert
        if len(wanted) == len(envelopes):
            return not inert.issuperset(map(type, map(_EVENT_OF, envelopes)))
        return any(type(envelopes[i].event) not in inert for i in wanted)

    def first_pending(self, log: Log) -> int | None:
        """The seq of the oldest wanted event past the cursor, ``None`` if there is none."""
        envelopes, _ = log.after(self.cursor)
        wanted = self._wanted(envelopes)
        return envelopes[wanted[0]].seq if wanted else None
