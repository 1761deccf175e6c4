"""The asyncio half of the bridge: nats-py's connection, the publisher and the consumer.

It runs on its own event loop in the bridge's worker thread
(:mod:`busd_nats.bridge` says why) and talks to the Trio half only through
two doors: the Trio side calls :meth:`NatsWorker.accept` and
:meth:`NatsWorker.stop` with ``loop.call_soon_threadsafe``, and this side
calls the :class:`TrioSide` methods through ``to_trio`` (Trio's
``run_sync_soon``). Neither ever blocks the other's thread.

**Publishing, in order.** Events wait in :class:`~busd_nats.outbox.Lanes`,
one lane per session. A lane has at most one event in flight: the next is
sent once JetStream has acknowledged the one before (or said it already had
it). Lanes go in parallel, up to ``workers`` at once. Sending a session's
events back to back without waiting would be faster, but it cannot keep
their order through a failure: a publish that fails (the connection drops
with it in the socket, or JetStream is not up yet after a restart) can be
followed by later ones that succeed (nats-py re-sends its unflushed buffer
after reconnecting), and the retry then lands after them. One in flight per
session means a retry is always of the session's oldest event. A retry is the
same message with the same ``Nats-Msg-Id``, so one that was stored after all
is dropped by JetStream's duplicate window. Retries back off up to
``retry_max`` seconds and go on until they succeed: nothing is given up
while the daemon runs, except what the server refuses outright (too large,
for instance), which is reported.

**Consuming.** A durable pull consumer fetches a batch, hands it to the Trio
side and waits until every message of it was published locally (or
skipped), then acknowledges them all at once (the consumer's ack policy is
"all": acknowledging the last acknowledges the batch). The next fetch comes
only after that, so the batches are ordered and at most one is between the
threads. Our own events come back too (a JetStream 2.9 consumer takes one
filter subject, and none says "all but mine"): they are acknowledged here
and never cross. What is not acknowledged (the daemon stopped, the
connection dropped) is delivered again, and the Trio side's memory of event
ids drops the copies. A fetch may bring nothing at all, not even a timeout
(nats-py returns an empty list when the server's 408 beats its own timer):
nothing to acknowledge, it fetches again.

**The name.** Nothing is sent or fetched before this daemon holds its name
(:mod:`busd_nats.claim`), and after a reconnection the consumer waits until
the claim is renewed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, MutableMapping
from typing import Any, Protocol

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StorageType, StreamConfig

from .claim import Holder, NameClaim
from .errors import NatsBridgeError
from .ingest import Incoming
from .options import BridgeOptions
from .outbox import Lanes, Outgoing
from .subjects import PREFIX, IngestFilter, consumer_name

__all__ = ["NamedLog", "NatsBridgeError", "NatsWorker", "TrioSide"]

logger = logging.getLogger("busd.nats")


class NamedLog(logging.LoggerAdapter[logging.Logger]):
    """``nats <daemon>: …``: which daemon's bridge said it, when several share one log."""

    def __init__(self, name: str) -> None:
        super().__init__(logger)
        self.daemon = name

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        return f"nats {self.daemon}: {msg}", kwargs


API_TIMEOUT = 2.0
"""Seconds to wait for a JetStream API answer (stream and consumer set-up)."""
FETCH_WAIT = 2.0
"""Seconds a fetch waits for messages; also how soon a pull lost in an outage is renewed."""
REPORT_DELAY = 0.005
"""Seconds the publisher gathers confirmations before it tells the Trio side."""
ACK_WAIT = 30.0
"""Seconds JetStream waits for our acknowledgement before it delivers again."""


class TrioSide(Protocol):
    """What the asyncio side tells the Trio side; each runs in the Trio thread."""

    def nats_ready(self) -> None:
        """The stream and this daemon's consumer are in place."""

    def nats_connected(self, connected: bool) -> None: ...

    def nats_sent(self, event_ids: list[str]) -> None:
        """These events left the lanes (stored, or refused and reported): room for more."""

    def nats_refused(self, event_id: str, reason: str) -> None: ...

    def nats_delivered(self, batch: list[Incoming], done: Callable[[bool], None]) -> None:
        """Publish ``batch`` locally, then call ``done(True)``; ``done(False)``: not taken."""


ToTrio = Callable[..., bool]
"""``to_trio(fn, *args)`` runs ``fn(*args)`` in the Trio thread soon; False if Trio is gone."""


class NatsWorker:
    """Connects, keeps the stream and consumer, publishes the lanes, feeds the consumer."""

    def __init__(
        self,
        options: BridgeOptions,
        wanted: IngestFilter,
        side: TrioSide,
        to_trio: ToTrio,
        *,
        holder: Holder,
        workers: int = 64,
        fetch_batch: int = 256,
        fetch_wait: float = FETCH_WAIT,
        ack_timeout: float = 2.0,
        retry_max: float = 2.0,
        drain_timeout: float = 2.0,
    ) -> None:
        self.options = options
        self._wanted = wanted
        self._side = side
        self._to_trio = to_trio
        self._workers = workers
        self._fetch_batch = fetch_batch
        self._fetch_wait = fetch_wait
        self._ack_timeout = ack_timeout
        self._retry_max = retry_max
        self._drain_timeout = drain_timeout
        self._lanes = Lanes()
        self._ready: asyncio.Queue[None] = asyncio.Queue()  # one token per lane ready to send
        self._idle = asyncio.Event()
        self._idle.set()
        self._stopping = asyncio.Event()
        self._sent: list[str] = []
        self._nc: Client | None = None
        self._ingest_task: asyncio.Task[None] | None = None
        self._handing_over = False
        self._stream_lock = asyncio.Lock()
        self._trouble: str | None = None
        self._log = NamedLog(options.name)
        self._claim = NameClaim(
            options.stream,
            options.name,
            holder,
            log=self._log,
            on_trouble=self._note_trouble,
            retry_max=retry_max,
        )

    # -- the doors, called from the Trio thread via call_soon_threadsafe -----------

    def accept(self, items: list[Outgoing]) -> None:
        """Queue ``items`` (in order) on their lanes."""
        for _ in range(self._lanes.add(items)):
            self._ready.put_nowait(None)
        self._idle.clear()

    def stop(self) -> None:
        """Finish what was accepted (within ``drain_timeout``), then close."""
        self._stopping.set()

    # -- the loop ----------------------------------------------------------------

    async def run(self) -> None:
        """Until :meth:`stop`; raises :class:`NatsBridgeError` when it cannot work."""
        main = asyncio.create_task(self._main())
        stopping = asyncio.create_task(self._stopping.wait())
        try:
            await asyncio.wait({main, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if main.done():
                main.result()
                raise NatsBridgeError("the NATS side ended by itself")
            await self._drain()
        finally:
            main.cancel()
            stopping.cancel()
            await asyncio.gather(main, stopping, return_exceptions=True)
            self._stopping.set()  # failing counts as stopping: the disconnection is no news
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._claim.release(), 1.0)
            await self._close()

    async def _main(self) -> None:
        nc = await self._connect()
        js = nc.jetstream(timeout=API_TIMEOUT)
        await self._ensure_stream(js)
        await self._claim.acquire(js)  # before anything is sent or taken under the name
        tasks = [asyncio.create_task(self._export(js)) for _ in range(self._workers)]
        tasks.append(asyncio.create_task(self._claim.keep()))
        self._ingest_task = asyncio.create_task(self._ingest(js))
        tasks.append(self._ingest_task)
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                error = None if task.cancelled() else task.exception()
                if error is not None:
                    raise error
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _drain(self) -> None:
        """Let the batch the Trio side holds be acknowledged, and the lanes empty; bounded."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._drain_timeout
        ingest = self._ingest_task
        if ingest is not None:
            if not self._handing_over:
                ingest.cancel()
            await asyncio.wait({ingest}, timeout=max(0.0, deadline - loop.time()))
            ingest.cancel()
        nc = self._nc
        if len(self._lanes) and nc is not None and nc.is_connected:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), max(0.0, deadline - loop.time()))
        if len(self._lanes):
            self._log.warning(
                "stopping with %d events not confirmed by JetStream", len(self._lanes)
            )

    async def _close(self) -> None:
        nc = self._nc
        if nc is None or nc.is_closed:
            return
        if nc.is_connected:  # what was written (acks, publishes) reaches the server
            with contextlib.suppress(Exception):
                await asyncio.wait_for(nc.flush(timeout=1), 1.5)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(nc.close(), 2.0)

    # -- connection ----------------------------------------------------------------

    async def _connect(self) -> Client:
        """Connected, however long the server takes to come up (nats-py retries forever)."""
        nc = self._nc = Client()
        options: dict[str, Any] = {
            "servers": [url.strip() for url in self.options.url.split(",")],
            "name": f"busd {self.options.name}",
            "max_reconnect_attempts": -1,
            "reconnect_time_wait": 1,
            "connect_timeout": 2,
            "error_cb": self._on_error,
            "disconnected_cb": self._on_disconnected,
            "reconnected_cb": self._on_reconnected,
        }
        if self.options.creds is not None:
            options["user_credentials"] = self.options.creds
        await nc.connect(**options)
        self._log.info("connected to %s", _where(nc))
        self._trouble = None
        self._to_trio(self._side.nats_connected, True)
        return nc

    async def _on_error(self, exc: Exception) -> None:
        self._note_trouble(exc)

    async def _on_disconnected(self) -> None:
        if not self._stopping.is_set():
            self._log.warning("disconnected; reconnecting (events are kept meanwhile)")
        self._claim.disconnected()
        self._to_trio(self._side.nats_connected, False)

    async def _on_reconnected(self) -> None:
        self._log.info("reconnected to %s", _where(self._nc))
        self._claim.reconnected()
        self._trouble = None
        self._to_trio(self._side.nats_connected, True)

    def _note_trouble(self, exc: BaseException) -> None:
        """Log the first error of a kind until things work again, not every retry."""
        kind = type(exc).__name__
        if self._trouble != kind and not self._stopping.is_set():
            self._trouble = kind
            self._log.warning("%s: %s (retrying; said once)", kind, exc or "no detail")

    # -- the stream ---------------------------------------------------------------

    async def _ensure_stream(self, js: JetStreamContext) -> None:
        delay = 0.05
        while not await self._try_stream(js):
            await asyncio.sleep(delay)
            delay = min(delay * 2, self._retry_max)

    async def _try_stream(self, js: JetStreamContext) -> bool:
        """One attempt to find or create the stream; False: try again later."""
        name = self.options.stream
        async with self._stream_lock:
            try:
                try:
                    info = await js.stream_info(name)
                except nats.js.errors.NotFoundError:
                    await js.add_stream(
                        StreamConfig(
                            name=name,
                            subjects=[f"{PREFIX}.>"],
                            storage=StorageType.FILE,
                            duplicate_window=self.options.duplicate_window,
                            max_age=self.options.max_age or None,
                        )
                    )
                    self._log.info("created stream %s for %s.>", name, PREFIX)
                    return True
            except nats.js.errors.BadRequestError as exc:
                raise NatsBridgeError(f"cannot create stream {name!r}: {exc}") from exc
            except (nats.errors.Error, OSError, TimeoutError) as exc:
                self._note_trouble(exc)
                return False
        subjects = info.config.subjects or []
        if f"{PREFIX}.>" not in subjects and ">" not in subjects:
            raise NatsBridgeError(
                f"stream {name!r} takes {subjects}, not {PREFIX}.>: name another stream"
            )
        return True

    # -- publishing ----------------------------------------------------------------

    async def _export(self, js: JetStreamContext) -> None:
        lanes = self._lanes
        while True:
            await self._ready.get()  # a worker per ready lane, none woken for nothing
            item = lanes.next()
            assert item is not None
            await self._publish(js, item)
            if lanes.done(item):
                self._ready.put_nowait(None)
            self._count_sent(item.id)

    async def _publish(self, js: JetStreamContext, item: Outgoing) -> None:
        """Until JetStream has ``item``, or refuses it for good."""
        delay = 0.05
        headers = {"Nats-Msg-Id": item.id}
        while True:
            try:
                await js.publish(
                    item.subject, item.payload, timeout=self._ack_timeout, headers=headers
                )
                self._trouble = None  # working again: the next trouble is news
                return
            except (nats.errors.MaxPayloadError, nats.js.errors.BadRequestError) as exc:
                reason = f"{type(exc).__name__}: {exc}"
                self._log.error("JetStream refused event %s: %s", item.id, reason)
                self._to_trio(self._side.nats_refused, item.id, reason)
                return
            except nats.js.errors.NoStreamResponseError as exc:
                self._note_trouble(exc)  # JetStream not up yet, or the stream is gone
                await self._try_stream(js)
            except (nats.errors.Error, OSError, TimeoutError) as exc:
                self._note_trouble(exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, self._retry_max)

    def _count_sent(self, event_id: str) -> None:
        """Say so to Trio, in one call per ``REPORT_DELAY`` (a wake-up each costs the GIL)."""
        sent = self._sent
        if not sent:
            asyncio.get_running_loop().call_later(REPORT_DELAY, self._report_sent)
        sent.append(event_id)
        if not len(self._lanes):
            self._idle.set()
            self._report_sent()

    def _report_sent(self) -> None:
        if self._sent:
            sent, self._sent = self._sent, []
            self._to_trio(self._side.nats_sent, sent)

    # -- consuming ----------------------------------------------------------------

    async def _ingest(self, js: JetStreamContext) -> None:
        sub: JetStreamContext.PullSubscription | None = None
        ready = False
        delay = 0.05
        while not self._stopping.is_set():
            await self._claim.held.wait()  # never under a name another may have taken
            try:
                if sub is None:
                    sub = await self._subscribe(js)
                    if not ready:
                        ready = True
                        self._to_trio(self._side.nats_ready)
                msgs = await sub.fetch(self._fetch_batch, timeout=self._fetch_wait)
            except TimeoutError:  # nats-py's own TimeoutError is one too
                continue  # nothing new (or no server to say so: nats-py reconnects)
            except nats.js.errors.BadRequestError as exc:
                raise NatsBridgeError(
                    f"cannot consume from {self.options.stream!r}: {exc}"
                ) from exc
            except (nats.errors.Error, OSError) as exc:
                self._note_trouble(exc)
                if isinstance(exc, nats.js.errors.APIError) and sub is not None:
                    with contextlib.suppress(Exception):
                        await sub.unsubscribe()
                    sub = None  # the consumer may be gone: make sure of it again
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._retry_max)
                continue
            delay = 0.05
            if not msgs:
                continue  # the server's 408 beat nats-py's timeout: nothing came, nothing to ack
            # Our own events come back with everyone's (one filter subject on 2.9):
            # acknowledged here, without a trip through the Trio side.
            wanted = [msg for msg in msgs if self._wanted.wants(msg.subject)]
            if not wanted or await self._hand_over(wanted):
                with contextlib.suppress(nats.errors.Error):
                    await msgs[-1].ack()  # AckPolicy.ALL: the whole batch, in one message

    async def _subscribe(self, js: JetStreamContext) -> JetStreamContext.PullSubscription:
        """Bind to this daemon's durable consumer, created (from now on) if it is missing."""
        stream = self.options.stream
        durable = consumer_name(self.options.name)
        wanted = self._wanted.server_filter
        try:
            info = await js.consumer_info(stream, durable)
            if (info.config.filter_subject, info.config.ack_policy) != (wanted, AckPolicy.ALL):
                self._log.warning(
                    "consumer %s filtered %s, now %s: made anew from now on",
                    durable,
                    info.config.filter_subject,
                    wanted,
                )
                await js.delete_consumer(stream, durable)
                raise nats.js.errors.NotFoundError
        except nats.js.errors.NotFoundError:
            await js.add_consumer(
                stream,
                ConsumerConfig(
                    durable_name=durable,
                    deliver_policy=DeliverPolicy.NEW,
                    ack_policy=AckPolicy.ALL,
                    ack_wait=ACK_WAIT,
                    filter_subject=wanted,
                    max_ack_pending=10 * self._fetch_batch,
                ),
            )
            self._log.info("consumer %s on %s takes %s from now on", durable, stream, wanted)
        return await js.pull_subscribe_bind(durable=durable, stream=stream)

    async def _hand_over(self, msgs: list[Msg]) -> bool:
        """Give ``msgs`` to the Trio side; True once all were published there."""
        loop = asyncio.get_running_loop()
        taken: asyncio.Future[bool] = loop.create_future()

        def done(published: bool) -> None:  # in the Trio thread
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(_settle, taken, published)

        batch = [Incoming(msg.subject, msg.data) for msg in msgs]
        if not self._to_trio(self._side.nats_delivered, batch, done):
            return False
        self._handing_over = True
        try:
            return await taken
        finally:
            self._handing_over = False


def _where(nc: Client | None) -> str:
    url = nc.connected_url if nc is not None else None
    return url.netloc if url is not None else "?"


def _settle(future: asyncio.Future[bool], value: bool) -> None:
    if not future.done():
        future.set_result(value)
