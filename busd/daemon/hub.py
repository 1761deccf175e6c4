"""The daemon's hub: everything shared by all connections, with no socket in sight.

One :class:`Daemon` owns the bus and what hangs off it: correlation (stamped
on every event before it is sequenced), the accountant (derived ``busd.*``
events), the replay history, the session registry, and every live
subscription. Each accepted event is encoded to msgpack exactly once, here;
the bytes are kept for replay and appended to the fan-out's log
(:mod:`busd.daemon.fanout`), whose cohorts send them to every subscriber:
per event the hub's work does not depend on how many subscribe.

With a journal (:mod:`busd.journal`), the same bytes are queued for it
too, ``seq`` continues after the journal's, the sessions it knew come back,
and a resume from before the replay ring reads the rest from the file.

Connections (:mod:`busd.connection`) call in synchronously; the only Trio
parts are :meth:`Daemon.run` (the accountant's tick loop, the journal's
writer, the fan-out's task and the nursery that plugin services run in).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import groupby
from operator import attrgetter
from typing import Any, cast

import msgspec
import trio

from .._version import __version__
from ..core.accounting import Accountant
from ..core.bus import Bus
from ..core.catalog import Catalog
from ..core.coalesce import Keyer, chain_keyers, coalescing_key
from ..core.correlation import Correlator
from ..core.errors import BusdError
from ..core.events import (
    BUILTIN_EVENTS,
    Envelope,
    Event,
    InternalError,
    PermissionRequested,
    StreamingStats,
    TextDelta,
    ThinkingDelta,
    event_type,
)
from ..core.history import History, Replay
from ..core.permissions import PermissionRule
from ..core.sessions import SessionRegistry
from ..plugins.adapters import Adapter, Emitted
from ..plugins.manager import HookFailure, PluginManager, supervise
from ..wire import (
    DEFAULT_GRANTS,
    DEFAULT_MAX_FRAME,
    Limits,
    Outgoing,
    Right,
    Role,
    encode_envelope,
    encode_envelopes,
)
from .accounting import AccountingService
from .broker import DEFAULT_PERMISSION_TIMEOUT, PermissionBroker
from .fanout import Fanout, Member
from .gcwatch import GcWatch
from .journal import (
    DEFAULT_MAX_AGE,
    DEFAULT_MAX_PENDING,
    DEFAULT_MAX_SIZE,
    DEFAULT_STAGE_EVERY,
    Journal,
    JournalSpan,
    Retention,
    session_row,
)
from .runs import RunManager
from .subscription import Subscription

__all__ = ["Daemon", "DaemonConfig", "Resume", "Subscription"]

_BUILTIN = frozenset(BUILTIN_EVENTS)
_RUNS: frozenset[type[Event]] = frozenset({TextDelta, ThinkingDelta})
"""What :meth:`Daemon.publish_frame` publishes as runs: the daemon never publishes on them."""
_EVENT_OF = attrgetter("event")
_PLACE_OF = attrgetter("session_id", "run_id", "agent_id")

logger = logging.getLogger("busd.daemon")


@dataclass(frozen=True, slots=True)
class DaemonConfig:
    """Limits and defaults; most are ``busd serve`` flags (docs/operations.md).

    ``goodbye_timeout`` is how long a connection that is being closed (slow
    consumer, fatal error) may take to write what it already started
    writing plus its last frame, so a client that resumes reading still
    learns why it was dropped.
    """

    max_frame: int = DEFAULT_MAX_FRAME
    outbound_cap: int = 8 << 20
    send_buffer: int = 1 << 20
    """Each client socket's kernel send buffer (``SO_SNDBUF``; 0: the system's default)."""
    handshake_timeout: float = 5.0
    replay: int = 100_000
    max_subscriptions: int = 64
    max_requests: int = 16
    max_connections_per_uid: int = 256
    """Connections past their hello, per uid; the next hello gets ``too_many_connections``."""
    max_handshakes_per_uid: int = 64
    """Sockets per uid still waiting for their hello; a newer one closes the oldest."""
    window_ms_default: int = 16
    shutdown_grace: float = 2.0
    goodbye_timeout: float = 5.0
    watchdog: float = 300.0
    """A run that emits nothing for this long ends ``timed_out``."""
    permission_rules: tuple[PermissionRule, ...] = ()
    permission_timeout: float | None = DEFAULT_PERMISSION_TIMEOUT
    """Deny a driven run's permission request nobody answered in time (None: wait for ever)."""
    subscription_buffer: int = 10_000
    """Events one subscription may hold while its client's outbox is full."""
    journal: str | None = None
    """The SQLite journal's path (None: no journal; ``busd serve`` has a default)."""
    journal_max_age: float | None = DEFAULT_MAX_AGE
    """Seconds of history the journal keeps (None: no limit)."""
    journal_max_size: int | None = DEFAULT_MAX_SIZE
    """Bytes of journal before its oldest events go (None: no limit)."""
    journal_max_pending: int = DEFAULT_MAX_PENDING
    """Events waiting for the disk before further ones are not journaled."""
    journal_staging: bool = True
    """Insert a batch's events while it gathers, commit them at the write (docs/journal.md)."""
    plugin_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Per plugin name, its options (``[plugins.NAME]`` in the config file, some flags)."""
    grants: Mapping[Role, frozenset[Right]] = field(default_factory=lambda: dict(DEFAULT_GRANTS))
    """What each role may change (``[roles]`` in the config file narrows it)."""

    def limits(self) -> Limits:
        return Limits(
            max_frame=self.max_frame,
            max_subscriptions=self.max_subscriptions,
            max_inflight_requests=self.max_requests,
            outbound_cap=self.outbound_cap,
            window_ms_default=self.window_ms_default,
            replay_capacity=self.replay,
        )


@dataclass(frozen=True, slots=True)
class Resume:
    """What a subscription resuming after ``since_seq`` gets, in this order.

    ``gap``: lost for good, known now (no journal); ``journal``: read from
    the journal (it reports its own gaps); then ``ring``, what the replay
    ring holds, unfiltered (:meth:`Subscription.wanted` filters it as it is
    sent). When :attr:`ahead`, the client numbered by another daemon life:
    it gets the ring from its start.
    """

    since_seq: int
    head_seq: int
    ring: Replay
    gap: tuple[int, int] | None = None
    journal: JournalSpan | None = None

    @property
    def ahead(self) -> bool:
        return self.since_seq > self.head_seq


@dataclass(slots=True)
class _Counters:
    started: float = field(default_factory=time.time)
    connections_total: int = 0
    slow_consumer_disconnects: int = 0
    protocol_errors: int = 0
    rejected_events: int = 0
    internal_errors: int = 0
    """Failures serving a connection: each ended that connection (or spoiled one reply)."""
    refused_peers: int = 0
    """Connections refused for their uid (SO_PEERCRED) before a byte was read."""
    handshake_timeouts: int = 0
    forbidden: int = 0
    """Frames refused ``forbidden``: a role without the right, a driven run's events, a name."""
    repeated_hellos: int = 0


class Daemon:
    """The bus and everything every connection shares."""

    def __init__(
        self,
        config: DaemonConfig | None = None,
        *,
        catalog: Catalog | None = None,
        accountant: Accountant | None = None,
        socket_path: str | None = None,
        plugins: PluginManager | None = None,
    ) -> None:
        self._startup_failures: list[HookFailure] = []
        self.config = config if config is not None else DaemonConfig()
        self.plugins = plugins if plugins is not None else PluginManager(environ={})
        self.catalog = catalog if catalog is not None else Catalog()
        for plugin, cls in self.plugins.event_types():
            try:
                self.catalog.register(cls)
            except BusdError as exc:
                self._startup_failures.append(
                    HookFailure(plugin=plugin, hook="busd_event_types", error=str(exc))
                )
        self.catalog.freeze()  # decoders are built from it from now on
        self.adapters: dict[str, Adapter] = self.plugins.adapters()
        self.keyer: Keyer = chain_keyers(coalescing_key, self._plugin_key)
        self.sessions = SessionRegistry()
        self.journal: Journal | None = None
        if self.config.journal is not None:
            self.journal = self._open_journal(self.config.journal)  # JournalError
        first_seq = self.journal.next_seq if self.journal is not None else 1
        self.bus = Bus(self.catalog, first_seq=first_seq)
        self.correlator = Correlator()
        self.history = History(self.config.replay, first_seq=first_seq)
        self.socket_path = socket_path
        self._accounting = AccountingService(self.bus, accountant)
        self.broker = PermissionBroker(
            self.publish,
            policy=self.plugins.permission_policy,
            rules=self.config.permission_rules,
            timeout=self.config.permission_timeout,
        )
        self.runs = RunManager(
            self, self.plugins.drivers(), self.broker, watchdog=self.config.watchdog
        )
        self._subscriptions: list[Subscription] = []
        self.fanout = Fanout(
            keyer=self.keyer,
            max_merged_chars=self.config.max_frame // 8,  # a merged delta fits a frame
            # Half a subscriber's buffer: one early batch never fills it alone.
            limit=max(1, self.config.subscription_buffer // 2),
            head_seq=first_seq - 1,
            drop=self._drop_member,
        )
        """Offers each event to every subscription, one cohort at a time."""
        self._connections: dict[int, tuple[str, str, int]] = {}  # id -> (client, role, uid)
        self._next_client_id = 0
        self._rate: deque[tuple[int, int]] = deque(maxlen=11)  # (second, head seq)
        self.counters = _Counters()
        self.gc = GcWatch()
        """The collector's pauses while :meth:`run` runs (``status``'s ``gc``)."""
        self.bus.on_all(self._on_event, many=self._on_events)
        self._nursery: trio.Nursery | None = None

    def _open_journal(self, path: str) -> Journal:
        config = self.config
        journal = Journal.open(
            path,
            sessions=self._touched_sessions,
            keep_sessions=self.sessions.max_sessions,
            report=self._journal_problem,
            retention=Retention(max_age=config.journal_max_age, max_size=config.journal_max_size),
            max_pending=config.journal_max_pending,
            stage_every=DEFAULT_STAGE_EVERY if config.journal_staging else 0.0,
        )
        for record in journal.restored:
            self.sessions.restore(record, stats=record.stats, context=record.context)
        if journal.crashed is not None:
            first, last = journal.crashed
            logger.warning(
                "the last daemon did not stop cleanly: seqs %d..%d are skipped (some of them "
                "may have been delivered but not journaled)",
                first,
                last,
            )
        return journal

    def _touched_sessions(self, since_seq: int) -> list[tuple[Any, ...]]:
        return [session_row(state) for state in self.sessions.touched_since(since_seq)]

    def _journal_problem(self, message: str) -> None:
        logger.warning("%s", message)
        self.publish(InternalError(where="journal", message=message), source="busd.journal")

    # -- the Trio part ---------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the accountant and the journal, host subscription dispatchers, until cancelled.

        On the way out, the journal writes what is left and is closed.
        """
        self.plugins.on_error = self._plugin_failed
        for failure in (*self._startup_failures, *self.plugins.failures):
            self._plugin_failed(failure)
        try:
            with self.gc:
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    if self.journal is not None:
                        await nursery.start(self.journal.run)
                    await nursery.start(self._accounting.run)
                    await nursery.start(self.fanout.run)
                    for name, service in self.plugins.services(self):
                        nursery.start_soon(
                            partial(supervise, name, service, on_failure=self._service_failed)
                        )
                    self.plugins.startup(self)
                    task_status.started()
                    await trio.sleep_forever()
        finally:
            try:
                self.plugins.shutdown(self)
            finally:
                if self.journal is not None:
                    with trio.CancelScope(shield=True):
                        await self.journal.aclose()

    def _plugin_failed(self, failure: HookFailure) -> None:
        self.publish(
            InternalError(where=failure.hook, message=failure.error, plugin=failure.plugin),
            source="busd.plugins",
        )

    def _service_failed(self, name: str, exc: BaseException, disabled: bool) -> None:
        state = "disabled after repeated failures" if disabled else "restarting"
        self.publish(
            InternalError(
                where=f"service {name}",
                message=f"{type(exc).__name__}: {exc} ({state})",
                plugin=name,
            ),
            source="busd.plugins",
        )

    def _plugin_key(self, envelope: Envelope[Event]) -> Hashable | None:
        if type(envelope.event) in _BUILTIN:
            return None
        return self.plugins.coalescing_key(envelope)

    @property
    def nursery(self) -> trio.Nursery:
        if self._nursery is None:
            raise RuntimeError("Daemon.run() is not running")
        return self._nursery

    # -- events in -------------------------------------------------------------

    def publish(
        self,
        event: Event,
        *,
        session_id: str | None = None,
        run_id: str | None = None,
        agent_id: str | None = None,
        source: str = "",
        parent_tool_call_id: str | None = None,
        event_id: str | None = None,
    ) -> Envelope[Event]:
        """Correlate, sequence and fan out one event (adapters, drivers, clients).

        ``event_id`` is for copies of events accepted elsewhere (a bridge):
        they keep their id; everything else gets a new one.
        """
        route = self.correlator.route(
            event,
            session_id=session_id,
            run_id=run_id,
            agent_id=agent_id,
            parent_tool_call_id=parent_tool_call_id,
        )
        return self.bus.publish(
            event,
            session_id=session_id,
            run_id=route.run_id,
            agent_id=route.agent_id,
            source=source,
            stale=route.stale,
            event_id=event_id,
        )

    def publish_frame(self, events: Sequence[Outgoing[Event]], *, source: str) -> None:
        """A client's events, already checked (:meth:`frame_refusal`): deltas in stretches.

        Consecutive deltas of one type from one place go through
        :meth:`Bus.publish_stretch`: one route, one sequencing and one call
        per handler for all of them (no handler of the daemon's publishes on a
        delta); everything else one by one.
        """
        correlator, publish_stretch = self.correlator, self.bus.publish_stretch
        start = 0
        for cls, same in groupby(map(type, map(_EVENT_OF, events))):
            stretch = events[start : start + len(list(same))]
            start += len(stretch)
            if cls not in _RUNS:
                for outgoing in stretch:
                    self.publish(
                        outgoing.event,
                        session_id=outgoing.session_id,
                        run_id=outgoing.run_id,
                        agent_id=outgoing.agent_id,
                        source=source,
                    )
                continue
            at = 0
            for (session_id, run_id, agent_id), here in groupby(map(_PLACE_OF, stretch)):
                count = len(list(here))
                where = correlator.route(
                    stretch[at].event,
                    session_id=session_id,
                    run_id=run_id,
                    agent_id=agent_id,
                    parent_tool_call_id=None,
                )
                correlator.route_again(where, count - 1)
                publish_stretch(
                    list(map(_EVENT_OF, stretch[at : at + count])),
                    session_id=session_id,
                    run_id=where.run_id,
                    agent_id=where.agent_id,
                    stale=where.stale,
                    source=source,
                )
                at += count

    def publish_frame_and_settle(self, events: Sequence[Outgoing[Event]], *, source: str) -> None:
        """:meth:`publish_frame` for the end of a publisher's burst, then :meth:`settle`.

        The fan-out's task is not woken for these events: the pass is here
        (at a steady rate, a task switch per burst that would find nothing),
        as soon as the frame's last event is in the fan-out's log: the
        bookkeeping after it (the replay ring, the journal, sessions,
        accounting, runs) is not between a publisher and its frontends.
        """
        self.fanout.hold(pass_with=events[-1].event if events else None)
        try:
            self.publish_frame(events, source=source)
            self.settle()
        finally:
            self.fanout.release()

    def publish_emitted(
        self, emitted: Emitted, *, source: str, run_id: str | None = None
    ) -> Envelope[Event] | None:
        """An adapter's event; one of a type nobody registered becomes an internal error."""
        try:
            return self.publish(
                emitted.event,
                session_id=emitted.session_id,
                run_id=run_id,
                agent_id=emitted.agent_id,
                parent_tool_call_id=emitted.parent_tool_call_id,
                source=source,
            )
        except BusdError as exc:
            self.publish(InternalError(where=f"adapter {source}", message=str(exc)))
            return None

    def client_refusal(self, outgoing: Outgoing[Event]) -> str | None:
        """Why a client may not publish this event (``None``: it may)."""
        name = event_type(outgoing.event)
        if name.startswith("busd."):
            return f"{name!r} events are derived by the daemon, not published"
        return None

    def frame_refusal(self, events: Sequence[Outgoing[Event]]) -> str | None:
        """Why a client may not publish this frame (``None``: it may), naming the event.

        A connection asks before publishing any of them: a frame is published
        whole or not at all. The answer depends on an event's type only, so
        each type is asked once.
        """
        if len(events) >= 16:  # a look at each type first: cheaper than a loop, for a big frame
            one_of_each = dict(zip(map(type, map(_EVENT_OF, events)), events, strict=True))
            if not any(map(self.client_refusal, one_of_each.values())):
                return None
        allowed: set[type[Event]] = set()
        for index, outgoing in enumerate(events):
            cls = type(outgoing.event)
            if cls in allowed:
                continue
            refusal = self.client_refusal(outgoing)
            if refusal is not None:
                return (
                    f"events[{index}]: {refusal}; none of the frame's {len(events)} events "
                    "was published"
                )
            allowed.add(cls)
        return None

    def settle(self) -> None:
        """A publisher's burst is over: deliver what needs no waiting, then the bookkeeping.

        The bookkeeping: account the deltas (in stretches), have the next
        burst's ids ready and stage what the journal holds (in a thread).

        A connection calls this before it waits for more input; anything
        else that publishes is covered by the fan-out's task and the
        accountant's own bounds. Delivery goes first: accounting emits
        nothing, and the subscribers can read while it runs.
        """
        self.fanout.flush_nowait()
        self._accounting.settle()
        self.bus.prepare_ids()  # the next burst's ids, formatted while nobody waits
        if self.journal is not None:
            self.journal.stage_now()

    def _on_events(self, envelopes: list[Envelope[Event]]) -> None:
        """:meth:`_on_event` for a run (of one type: deltas), in one call."""
        raws = encode_envelopes(envelopes)
        if isinstance(envelopes[0].event, PermissionRequested):
            for envelope in envelopes:
                self.broker.saw_request(cast(PermissionRequested, envelope.event).request_id)
        try:
            self.fanout.extend(envelopes, raws)  # the end of a burst: it goes out here
        finally:  # whatever the pass did: kept for replays, journaled and counted all the same
            self.history.extend(envelopes, raws)
            if self.journal is not None:
                self.journal.extend(envelopes, raws)
            self.sessions.observe_many(envelopes)

    def _on_event(self, envelope: Envelope[Event]) -> None:
        """Encode, deliver, then keep and book-keep: what no frontend waits for comes last."""
        raw = encode_envelope(envelope)
        event = envelope.event
        if isinstance(event, PermissionRequested):
            self.broker.saw_request(event.request_id)
        try:
            self.fanout.append(envelope, raw)  # the end of a burst: it goes out here
        finally:  # whatever the pass did: kept for replays, journaled and counted all the same
            self.history.append(envelope, raw)
            if self.journal is not None:
                self.journal.append(envelope, raw)
            self.sessions.observe(envelope)

    def raw(self, envelope: Envelope[Event]) -> msgspec.Raw:
        """The envelope's bytes: those the ring was given when it is a recent published one.

        A merged delta (a new envelope carrying an old seq), or one older
        than the ring's :data:`~busd.core.history.RECENT` envelopes, is encoded now.
        """
        raw = self.history.raw_of(envelope)
        return raw if raw is not None else encode_envelope(envelope)

    def raws(self, batch: list[Envelope[Event]]) -> list[msgspec.Raw]:
        """:meth:`raw` of each envelope: a subscription's batch going out."""
        raw_of = self.history.raw_of
        out = []
        for envelope in batch:
            raw = raw_of(envelope)
            out.append(raw if raw is not None else encode_envelope(envelope))
        return out

    # -- subscriptions ---------------------------------------------------------

    def add_subscription(self, subscription: Subscription) -> None:
        """Live from the next event on (its dispatcher holds them until it runs)."""
        self._subscriptions.append(subscription)
        self.fanout.join(subscription)

    def remove_subscription(self, subscription: Subscription) -> None:
        if subscription in self._subscriptions:
            self._subscriptions.remove(subscription)
            self.fanout.leave(subscription)

    def _drop_member(self, member: Member) -> None:
        assert isinstance(member, Subscription)
        self.remove_subscription(member)

    def replay(self, subscription: Subscription, since_seq: int) -> Resume:
        """What a resuming subscription missed (past the head: the ring from its start).

        What the ring no longer holds comes from the journal, if there is one;
        call this and register the subscription with no checkpoint between.
        """
        found = self.history.since(since_seq)
        ahead = found.ahead
        if ahead:
            found = self.history.since(0)
        gap = found.gap
        span = None
        if gap is not None and self.journal is not None and not ahead:
            span = self.journal.span(gap[0] - 1, gap[1])
            gap = None
        return Resume(since_seq, found.head_seq, found, gap, span)

    # -- connections -----------------------------------------------------------

    def connection_opened(self, uid: int) -> int:
        """Count a new connection (before its hello) and give it a client id."""
        self._next_client_id += 1
        self.counters.connections_total += 1
        self._connections[self._next_client_id] = ("", "", uid)
        return self._next_client_id

    def connection_identified(self, client_id: int, client: str, role: str) -> bool:
        """Admit a connection that said hello; ``False`` when its uid has too many already."""
        uid = self._connections[client_id][2]
        if self.connections_of(uid) >= self.config.max_connections_per_uid:
            return False
        self._connections[client_id] = (client, role, uid)
        return True

    def connection_closed(self, client_id: int) -> None:
        self._connections.pop(client_id, None)
        for subscription in [s for s in self._subscriptions if s.connection_id == client_id]:
            self.remove_subscription(subscription)

    def connections_of(self, uid: int) -> int:
        """Connections of ``uid`` past their hello (those still in it are not counted)."""
        return sum(1 for _, role, u in self._connections.values() if u == uid and role)

    # -- answers to requests ---------------------------------------------------

    def events_per_second(self) -> float:
        """Accepted events per second over the last ten seconds."""
        now = int(time.monotonic())
        head = self.bus.head_seq
        rate = self._rate
        if not rate or rate[-1][0] != now:
            rate.append((now, head))
        first_second, first_head = rate[0]
        span = max(1, now - first_second)
        return (head - first_head) / span

    def status(self) -> dict[str, Any]:
        bus = self.bus.statistics()
        roles: dict[str, int] = {}
        for _, role, _ in self._connections.values():
            if role:
                roles[role] = roles.get(role, 0) + 1
        return {
            "server": __version__,
            "socket": self.socket_path,
            "uptime_s": round(time.time() - self.counters.started, 3),
            "head_seq": bus.head_seq,
            "events_per_s": round(self.events_per_second(), 1),
            "clients": sum(roles.values()),
            "handshakes": len(self._connections) - sum(roles.values()),
            "clients_by_role": roles,
            "subscriptions": len(self._subscriptions),
            "sessions": self.sessions.statistics().sessions,
            "connections_total": self.counters.connections_total,
            "slow_consumer_disconnects": self.counters.slow_consumer_disconnects,
            "dropped_events": sum(s.dispatcher.statistics().dropped for s in self._subscriptions),
            "rejected_events": self.counters.rejected_events,
            "protocol_errors": self.counters.protocol_errors,
            "internal_errors": self.counters.internal_errors,
            "refused_peers": self.counters.refused_peers,
            "handshake_timeouts": self.counters.handshake_timeouts,
            "forbidden": self.counters.forbidden,
            "repeated_hellos": self.counters.repeated_hellos,
            "roles": {role: sorted(rights) for role, rights in self.config.grants.items()},
            "handler_errors": bus.handler_errors,
            "history": msgspec.to_builtins(self.history.statistics()),
            "gc": msgspec.to_builtins(self.gc.statistics()),
            "journal": None if self.journal is None else self.journal.statistics(),
            "adapters": sorted(self.adapters),
            "drivers": sorted(self.runs.drivers),
            "runs_active": sum(1 for r in self.runs.runs() if r["status"] == "running"),
            "runs_total": len(self.runs.runs()),
            "plugins": [info.name for info in self.plugins.plugins()],
            "plugin_failures": self.plugins.failure_count + len(self._startup_failures),
        }

    @property
    def accountant(self) -> Accountant:
        return self._accounting.accountant

    def session_stats(self, session_id: str) -> StreamingStats | None:
        """A session's streaming stats as of now (the thinking timer included)."""
        return self._accounting.accountant.session_stats(session_id, trio.current_time())

    def stats(self, session_id: str | None) -> Any:
        """A session's live stats (``None`` if unknown), or the daemon's component statistics."""
        if session_id is not None:
            return self.session_stats(session_id)
        return msgspec.to_builtins(
            {
                "bus": self.bus.statistics(),
                "correlation": self.correlator.statistics(),
                "history": self.history.statistics(),
                "sessions": self.sessions.statistics(),
                "fanout": self.fanout.statistics(),
                "tools": {m.name: m for m in self._accounting.accountant.tools.metrics()},
            }
        )
