"""The Trio half of the bridge, and how it runs nats-py's asyncio half beside it.

**Why a thread, not trio-asyncio.** nats-py is asyncio code with its own
tasks (reader, flusher, pinger, reconnect loop). trio-asyncio would run
them inside the daemon's Trio loop: it is a shim with a history of lagging
Trio releases and of breaking on their internals, and any slow callback in
nats-py would then stall the bus for every client. Instead the service owns
one worker thread with a plain asyncio loop (``asyncio.Runner``), started
when the service starts and joined before it returns: no task outlives it.
The two loops meet at two doors, each non-blocking and batched:

- Trio → asyncio: ``loop.call_soon_threadsafe`` (:class:`AsyncioThread`),
  carrying batches of events to publish and the request to stop;
- asyncio → Trio: ``TrioToken.run_sync_soon``, carrying acknowledgements
  and batches of ingested messages, which a Trio task publishes locally.

Both directions are bounded: at most ``handoff`` events are on the asyncio
side (the rest wait in the :class:`~busd_nats.outbox.Outbox`, itself
bounded), and at most one ingested batch is between the threads (the
consumer fetches the next only after this side has published the last).

**Shutdown.** When the service is cancelled, the events not yet handed over
are handed over (if connected), the asyncio side gets ``stop``: it lets the batch in hand
be acknowledged, waits (up to ``drain_timeout``) for JetStream to confirm
what it holds, flushes and closes the connection, and the thread ends; the
Trio task waits for that, uncancellably but bounded.

**Failure.** The connection is nats-py's to keep: it reconnects forever,
events wait meanwhile, and publishes are retried with their ids (see
:mod:`busd_nats.nats_side`). If the asyncio side raises (the stream cannot
be made, say), the service raises and busd's guard restarts it; the events
it had handed over and not seen confirmed go back to the head of the outbox.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, NoReturn

import msgspec
import trio

from busd import Envelope, Event, InternalError, event_type

from .claim import Holder
from .errors import NameTaken, NatsBridgeError
from .ingest import LOCAL_ONLY, Incoming, Ingestor, IngestStatistics
from .nats_side import NamedLog, NatsWorker, ToTrio
from .options import BridgeOptions
from .outbox import Outbox, Outgoing
from .subjects import IngestFilter, subject_for

if TYPE_CHECKING:
    from busd import PluginHost

__all__ = ["AsyncioThread", "Bridge", "BridgeStatistics"]

REPORT_EVERY = 1.0
"""Seconds over which drops are added up into one ``busd.internal.error``."""


class BridgeStatistics(msgspec.Struct, frozen=True, kw_only=True):
    connected: bool
    exported: int
    """Events JetStream confirmed (stored, or known already)."""
    refused: int
    dropped: int
    """Events dropped because the outbox was full (NATS unreachable for long)."""
    waiting: int
    """Events in the outbox, not yet handed to the asyncio side."""
    in_flight: int
    """Events on the asyncio side, not yet confirmed."""
    ingest: IngestStatistics
    disabled: str | None = None
    """Why the bridge turned itself off until the daemon restarts (another live daemon
    holds its name), as its ``busd.internal.error`` said; None while it is on."""


class AsyncioThread:
    """One asyncio loop in one worker thread, owned by the Trio task in :meth:`run`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.started = trio.Event()

    async def run(self, main: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run ``main()`` on a fresh loop in a worker thread; return (or raise) when it does.

        Not cancellable: cancel by making ``main`` return (through :meth:`call_soon`).
        """
        to_trio = trio_poster(trio.lowlevel.current_trio_token())

        def work() -> None:
            with asyncio.Runner() as runner:
                with self._lock:
                    self._loop = runner.get_loop()
                to_trio(self.started.set)
                try:
                    runner.run(main())
                finally:
                    with self._lock:
                        self._loop = None

        await trio.to_thread.run_sync(work, limiter=trio.CapacityLimiter(1))

    def call_soon(self, fn: Callable[..., object], *args: Any) -> bool:
        """Run ``fn(*args)`` on the loop soon (from any thread); False if it has ended."""
        with self._lock:
            if self._loop is None:
                return False
            self._loop.call_soon_threadsafe(fn, *args)
            return True


def trio_poster(token: trio.lowlevel.TrioToken) -> ToTrio:
    """``post(fn, *args)``: run ``fn(*args)`` in Trio's thread soon; False once Trio is gone."""

    def post(fn: Callable[..., object], *args: Any) -> bool:
        try:
            token.run_sync_soon(fn, *args)
        except trio.RunFinishedError:
            return False
        return True

    return post


Delivery = tuple[list[Incoming], Callable[[bool], None]]


class Bridge:
    """The ``nats`` service of one daemon: export its events, ingest the others'."""

    def __init__(
        self,
        daemon: PluginHost,
        options: BridgeOptions,
        *,
        socket_path: str | None = None,
        handoff: int = 4096,
        **worker: Any,
    ) -> None:
        """``socket_path``, the daemon's, says who holds the name (:mod:`busd_nats.claim`);
        ``worker`` goes to :class:`~busd_nats.nats_side.NatsWorker`."""
        self.daemon = daemon
        self.options = options
        self.holder = Holder.this_process(socket_path)
        self.wanted = IngestFilter(options.name, options.subjects)
        self.ingestor = Ingestor(daemon.publish, daemon.catalog, self.wanted, seen=options.seen)
        self.outbox = Outbox(options.buffer)
        self.ready = trio.Event()
        """Set once the stream and this daemon's consumer are in place (first run)."""
        self.connected = False
        self.disabled: str | None = None
        self._handoff = handoff
        self._worker_options = worker
        self._handed: dict[str, Outgoing] = {}
        self._sent = 0
        self._refused = 0
        self._refusals: list[str] = []
        self._wake = trio.Event()
        self._sent_all = trio.Event()
        self._report = trio.Event()
        self._deliveries: trio.MemorySendChannel[Delivery] | None = None
        self._reporting = False
        self._log = NamedLog(options.name)
        # From now on, not from when run() starts: the events of the daemon's first
        # moments, and of a restart's back-off, go out too.
        self._handle = daemon.bus.on_all(self._on_event)

    def close(self) -> None:
        """Stop taking the daemon's events (its shutdown)."""
        self._handle.unsubscribe()

    # -- the service ------------------------------------------------------------------

    async def run(self) -> None:
        thread = AsyncioThread()
        worker = NatsWorker(
            self.options,
            self.wanted,
            self,
            trio_poster(trio.lowlevel.current_trio_token()),
            holder=self.holder,
            **self._worker_options,
        )
        send, receive = trio.open_memory_channel[Delivery](1)
        self._deliveries = send
        try:
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(thread.run, worker.run)
                    await thread.started.wait()
                    nursery.start_soon(self._pump, thread, worker)
                    nursery.start_soon(self._ingest, receive)
                    nursery.start_soon(self._reporter)
                    nursery.start_soon(self._stop_when_cancelled, thread, worker)
            except BaseExceptionGroup as group:
                _raise_single(group)
        except NameTaken as exc:
            self._disable(str(exc))  # and return: the guard does not restart it
        except Exception:
            self._take_back()
            raise
        finally:
            self._deliveries = None
            self.connected = False
            if self._handed:
                self._log.warning("%d events handed to NATS were not confirmed", len(self._handed))

    async def wait_sent(self) -> None:
        """Return once every event so far is confirmed by JetStream (or refused, or dropped)."""
        while self.outbox or self._handed:
            self._sent_all = trio.Event()
            await self._sent_all.wait()

    def statistics(self) -> BridgeStatistics:
        return BridgeStatistics(
            connected=self.connected,
            exported=self._sent - self._refused,
            refused=self._refused,
            dropped=self.outbox.dropped_total,
            waiting=len(self.outbox),
            in_flight=len(self._handed),
            ingest=self.ingestor.statistics(),
            disabled=self.disabled,
        )

    def _disable(self, reason: str) -> None:
        """Off until the daemon restarts: take no more events, drop those held, say so."""
        self.close()
        self._take_back()
        unsent = len(self.outbox.take(len(self.outbox)))
        self.outbox.take_dropped()  # said here, not again by the reporter
        self.disabled = f"{reason}; the bridge is off until the daemon restarts"
        if unsent:
            self.disabled += f" ({unsent} event{'s' if unsent > 1 else ''} not sent)"
        self._internal_error(self.disabled)

    # -- export: bus → outbox → asyncio ------------------------------------------------

    def _on_event(self, envelope: Envelope[Event]) -> None:
        """Every local event (a bus handler: never blocks)."""
        if self.ingestor.seen(envelope.id) or self._reporting:
            return  # it came from NATS (sending it back would echo), or is our own report
        name = event_type(envelope.event)
        if name in LOCAL_ONLY:
            return
        outbox = self.outbox
        dropped = outbox.dropped_total
        outbox.put(
            Outgoing(
                envelope.id,
                subject_for(self.options.name, envelope.session_id, name),
                bytes(self.daemon.raw(envelope)),
                envelope.session_id,
            )
        )
        if outbox.dropped_total != dropped:
            self._report.set()
        self._wake.set()

    async def _pump(self, thread: AsyncioThread, worker: NatsWorker) -> None:
        """Hand the outbox over in order, keeping at most ``handoff`` on the other side."""
        outbox = self.outbox
        while True:
            room = self._handoff - len(self._handed)
            if not outbox or room <= 0:
                self._wake = trio.Event()
                await self._wake.wait()
                continue
            items = outbox.take(room)
            for item in items:
                self._handed[item.id] = item
            if not thread.call_soon(worker.accept, items):
                raise NatsBridgeError("the NATS thread has ended")
            await trio.lowlevel.checkpoint()

    def _take_back(self) -> None:
        """After a failure: what was handed over and not confirmed goes out again first."""
        if self._handed:
            self.outbox.restore(list(self._handed.values()))
            self._handed.clear()

    async def _stop_when_cancelled(self, thread: AsyncioThread, worker: NatsWorker) -> None:
        try:
            await trio.sleep_forever()
        finally:
            if self.connected and self.outbox:
                items = self.outbox.take(len(self.outbox))
                for item in items:
                    self._handed[item.id] = item
                if not thread.call_soon(worker.accept, items):
                    self._take_back()
            thread.call_soon(worker.stop)

    async def _reporter(self) -> None:
        """Drops and refusals as ``busd.internal.error`` events, added up, never per event."""
        while True:
            await self._report.wait()
            await trio.sleep(REPORT_EVERY)
            self._report = trio.Event()
            dropped = self.outbox.take_dropped()
            if dropped:
                self._internal_error(
                    f"dropped the {dropped} oldest events: NATS was unreachable and "
                    f"{self.options.buffer} were waiting (option buffer)"
                )
            refusals, self._refusals = self._refusals, []
            for reason in refusals:
                self._internal_error(reason)

    def _internal_error(self, message: str) -> None:
        """Said locally only: it is about this daemon's link, and would wait behind it."""
        self._log.error("%s", message)
        self._reporting = True
        try:
            self.daemon.publish(
                InternalError(where="nats bridge", message=message, plugin="nats"),
                source="busd.plugins",
            )
        finally:
            self._reporting = False

    # -- ingest: asyncio → channel → local bus --------------------------------------

    async def _ingest(self, receive: trio.MemoryReceiveChannel[Delivery]) -> None:
        ingest = self.ingestor.ingest
        try:
            async for batch, done in receive:
                for message in batch:
                    ingest(message)
                done(True)
        finally:
            while True:  # batches given and not taken are not acknowledged: redelivered
                try:
                    _, done = receive.receive_nowait()
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
                done(False)
            receive.close()  # and any that come now are refused at once

    # -- TrioSide: called by the asyncio side, in this thread --------------------------

    def nats_ready(self) -> None:
        self.ready.set()

    def nats_connected(self, connected: bool) -> None:
        self.connected = connected

    def nats_sent(self, event_ids: list[str]) -> None:
        handed = self._handed
        for event_id in event_ids:
            if handed.pop(event_id, None) is not None:
                self._sent += 1
        self._wake.set()
        if not handed and not self.outbox:
            self._sent_all.set()

    def nats_refused(self, event_id: str, reason: str) -> None:
        self._refused += 1  # nats_sent counts it too
        self._refusals.append(f"JetStream refused event {event_id}: {reason}")
        self._report.set()

    def nats_delivered(self, batch: list[Incoming], done: Callable[[bool], None]) -> None:
        send = self._deliveries
        try:
            if send is None:
                raise trio.ClosedResourceError
            send.send_nowait((batch, done))
        except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
            done(False)


def _raise_single(group: BaseExceptionGroup[BaseException]) -> NoReturn:
    """A nursery's group of one is that one exception (a service should not raise groups)."""
    leaves: list[BaseException] = []

    def collect(exc: BaseException) -> None:
        if isinstance(exc, BaseExceptionGroup):
            for inner in exc.exceptions:
                collect(inner)
        else:
            leaves.append(exc)

    collect(group)
    if len(leaves) == 1:
        raise leaves[0] from None
    raise group
