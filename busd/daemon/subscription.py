"""One ``subscribe`` of one connection: its filter, its dispatcher, its cohort's key."""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Iterable
from collections.abc import Set as AbstractSet

import msgspec

from ..core.cohorts import Cohort
from ..core.events import Envelope, Event, event_type
from ..core.patterns import Pattern
from .batching import BatchDispatcher
from .fanout import Member
from .journalrows import event_head

__all__ = ["Subscription"]

logger = logging.getLogger("busd.daemon")


class Subscription:
    """One ``subscribe`` of one connection: its filter and its batch dispatcher.

    In the daemon it is a member of the cohort (:mod:`busd.daemon.fanout`)
    of the subscriptions with the same :meth:`cohort_key`.
    """

    __slots__ = (
        "_key",
        "_matches",
        "_names",
        "cohort",
        "connection_id",
        "dispatcher",
        "id",
        "on_error",
        "owned",
        "owned_only",
        "patterns",
        "sessions",
    )

    def __init__(
        self,
        connection_id: int,
        sub_id: int,
        patterns: Iterable[str],
        *,
        sessions: Iterable[str] | None,
        owned_only: bool,
        dispatcher: BatchDispatcher,
        owned: AbstractSet[str] = frozenset(),
    ) -> None:
        self.connection_id = connection_id
        self.id = sub_id
        patterns = list(patterns)
        self.patterns = [Pattern(p) for p in patterns]  # InvalidPattern for a bad one
        self.sessions = frozenset(sessions) if sessions is not None else None
        self.owned_only = owned_only
        self.owned = owned
        """With ``owned_only``: the ids of the runs this client started (a live set)."""
        self.dispatcher = dispatcher
        self._matches: dict[type[Event], bool] = {}
        self._names: dict[str, bool] = {}
        self.on_error: Callable[[Exception], None] | None = None
        """Told when adding an event failed unexpectedly: its connection ends."""
        self.cohort: Cohort[Member] | None = None
        self._key = (
            tuple(sorted(set(patterns))),
            self.sessions,
            id(owned) if owned_only else None,  # the same live set: the same owner
            dispatcher.window,
            dispatcher.merge_deltas,
        )

    def cohort_key(self) -> Hashable:
        """Equal for subscriptions that want the same events at the same pace."""
        return self._key

    def failed(self, exc: Exception) -> None:
        """Adding an event raised: the owner fails (the fan-out to the others goes on)."""
        if self.on_error is not None:
            self.on_error(exc)
        else:
            logger.error("subscription %d failed; dropped", self.id, exc_info=exc)

    def wants_row(self, name: str, session_id: str | None, run_id: str | None, stale: bool) -> bool:
        """:meth:`wants` for a journaled event, from its columns (no decoding)."""
        if self.sessions is not None and session_id not in self.sessions:
            return False
        if self.owned_only and (stale or run_id not in self.owned):
            return False
        return self.matches(name)

    def wanted(
        self, seqs: list[int], raws: list[msgspec.Raw]
    ) -> tuple[list[int], list[msgspec.Raw]]:
        """The events of ``raws`` (envelopes' bytes) this subscription wants, by their heads."""
        if not self.filtered and any(p.text == ">" for p in self.patterns):
            return seqs, raws  # everything: nothing to decode
        kept_seqs: list[int] = []
        kept: list[msgspec.Raw] = []
        for seq, raw in zip(seqs, raws, strict=True):
            head = event_head(raw)
            if self.wants_row(head.event.type, head.session_id, head.run_id, head.stale):
                kept_seqs.append(seq)
                kept.append(raw)
        return kept_seqs, kept

    @property
    def filtered(self) -> bool:
        """Whether events of a matching type still need :meth:`admits`."""
        return self.sessions is not None or self.owned_only

    def matches(self, name: str) -> bool:
        """Whether an event type is one of the subscribed patterns."""
        matched = self._names.get(name)
        if matched is None:
            matched = self._names[name] = any(p.matches(name) for p in self.patterns)
        return matched

    def admits(self, envelope: Envelope[Event]) -> bool:
        """The per-event part of the filter: sessions and ownership."""
        if self.sessions is not None and envelope.session_id not in self.sessions:
            return False
        return not (self.owned_only and (envelope.stale or envelope.run_id not in self.owned))

    def wants(self, envelope: Envelope[Event]) -> bool:
        if not self.admits(envelope):
            return False
        cls = type(envelope.event)
        matched = self._matches.get(cls)
        if matched is None:
            matched = self._matches[cls] = self.matches(event_type(envelope.event))
        return matched
