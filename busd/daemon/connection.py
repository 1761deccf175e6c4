"""One client connection: handshake, a reader task, a writer task, one task per subscription.

The reader decodes frames and answers them synchronously against the
:class:`~busd.daemon.hub.Daemon`; everything to send goes through one
:class:`~busd.daemon.outbox.Outbox`, drained by the writer in as few
``send_all`` calls as it can. The outbox is capped in bytes (queued plus in
flight): a client that stops reading is told ``goodbye(slow_consumer,
resume_seq)`` and closed, and nobody else waits for it. Works over any Trio
stream, so tests can use memory streams.

Containment: every task of a connection runs in the connection's own
nursery, guarded; so does whatever other tasks (the fan-out, a publisher)
call into it. Whatever raises ends this connection only, with
``goodbye(internal_error, resume_seq)``, its traceback logged once and
counted in ``status`` (``internal_errors``); :meth:`Connection.serve` never
raises but Trio's own cancellation.

Resume points: every goodbye carries the ``since_seq`` from which resuming
misses nothing that this connection's subscriptions matched
(:meth:`Connection.resume_seq`), however far behind its client was.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from functools import partial

import msgspec
import trio

from .._version import __version__
from ..core.cohorts import SharedBatch
from ..core.errors import InvalidPattern
from ..core.events import Envelope, Event
from ..transport import Receiver
from ..wire import (
    BAD_HANDSHAKE,
    BYE,
    FORBIDDEN,
    FRAME_TOO_LARGE,
    HANDSHAKE_TIMEOUT,
    INTERNAL_ERROR,
    INVALID_EVENT,
    INVALID_PATTERN,
    RIGHTS,
    SEQ_AHEAD,
    SHUTDOWN,
    SLOW_CONSUMER,
    TOO_MANY_CONNECTIONS,
    TOO_MANY_REQUESTS,
    TOO_MANY_SUBSCRIPTIONS,
    UNKNOWN_SUBSCRIPTION,
    AskPermission,
    Bye,
    Encoder,
    Error,
    ErrorInfo,
    Events,
    Frame,
    Gap,
    Goodbye,
    Hello,
    Ingest,
    Ping,
    Pong,
    ProtocolError,
    Publish,
    Reply,
    Request,
    Right,
    Role,
    ServerHandshake,
    Subscribe,
    Unsubscribe,
    Welcome,
    client_frame_decoder,
    identity,
)
from .acks import Acks
from .asks import Asks
from .authority import Vetted, forbidden, refusal
from .batching import BatchDispatcher
from .commands import Failed, answer
from .fanout import shared_parts
from .hub import Daemon, Resume, Subscription
from .ingests import Ingests
from .journal import JournalSpan, Missing
from .outbox import Outbox, close_gracefully

__all__ = ["Connection"]

logger = logging.getLogger("busd.connection")

_RECEIVE = 65_536
_YIELD_EVERY = 256  # published events between two checkpoints of the reader (~1 ms)
_EVENTS_OVERHEAD = 64  # an events frame's bytes besides its envelopes
_REPLAY_CHUNK = 2048  # ring events cut and filtered between two checkpoints of a replay (~1 ms)
_GOODBYE_TIMEOUT = 1.0  # how long a closing connection may take to write its last frames
_FLUSH_TIMEOUT = 1.0  # how long a goodbye waits for the subscriptions to flush


def _sorted(sessions: frozenset[str] | None) -> list[str] | None:
    return None if sessions is None else sorted(sessions)


class Connection:
    """Serves one client until it leaves, breaks the protocol, falls behind or we stop."""

    def __init__(
        self, daemon: Daemon, stream: trio.abc.Stream, *, uid: int, pid: int | None = None
    ) -> None:
        self.daemon = daemon
        self.stream = stream
        self.uid = uid
        self.pid = pid
        self.client_id = daemon.connection_opened(uid)
        self.name = f"client-{self.client_id}"
        """Its identity once it said hello: what ``source`` and ``by`` carry (wire.roles)."""
        self.role: Role = "frontend"
        self._rights: frozenset[Right] = frozenset()  # nothing before the hello
        self._vetted = Vetted()  # what its publishes were allowed, while the runs allow it
        self._covered: Publish[Event] | None = None  # the frame _forbidden found vetted
        self._settled = False  # what came in ended with a publish that settled its burst
        config = daemon.config
        self._decoder = client_frame_decoder(daemon.catalog, max_frame=config.max_frame)
        self._encoder = Encoder(max_frame=config.max_frame)
        self._receiver = Receiver(stream, _RECEIVE)
        self._reader_scope = trio.CancelScope()
        self._outbox = Outbox(
            stream,
            cap=config.outbound_cap,
            hard_cap=2 * config.outbound_cap + config.max_frame,  # events wait under the cap
            on_overflow=self._slow_consumer,
            on_broken=self._reader_scope.cancel,
        )
        self._subs: dict[int, Subscription] = {}
        # Per subscription whose events are being queued (a replay, a batch split
        # over frames): the seq up to which they are queued, its resume point.
        self._since: dict[Subscription, int] = {}
        self._ingests = Ingests(daemon, self._queue)
        self._nursery: trio.Nursery | None = None
        self._pending_goodbye: str | None = None
        self.in_handshake = True
        """Accepted, no hello answered yet (the server keeps few of these per uid)."""
        self._handshake_scope = trio.CancelScope()
        self._evicted: str | None = None  # why the server closed us before our hello
        self._unyielded = 0  # events published since the reader last let others run
        self._acks = Acks(daemon, self._queue, self._start_guarded)  # publish's ack: ID
        self._asks = Asks(daemon, self._queue, self._start_guarded)  # ask_permission

    # -- life --------------------------------------------------------------------

    async def serve(self) -> None:
        """Serve the client to the end; raises nothing but Trio's cancellation."""
        try:
            if await self._handshake():
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    nursery.start_soon(self._guarded, self._outbox.run, "writing")
                    if self._pending_goodbye is not None:  # the daemon began stopping meanwhile
                        self._end(self._pending_goodbye)
                    with self._reader_scope:
                        await self._guarded(self._reader, "reading")
                    if self._closing:  # let the last frames (goodbye, error) go out
                        with trio.move_on_after(self.daemon.config.goodbye_timeout):
                            await self._outbox.done.wait()
                    nursery.cancel_scope.cancel()
        except Exception as exc:  # outside the guarded tasks: the handshake, the glue
            self._failed(exc, "serving")
            if self._nursery is None:  # no writer yet: say it directly
                await self._send_now(self._goodbye(INTERNAL_ERROR))
        finally:
            self._outbox.detach()  # the descriptor is about to be closed (and maybe reused)
            self._acks.detach()  # their tasks ended with the nursery
            self._asks.detach()
            self.in_handshake = False
            self._ingests.finish(name=self.name, failed=self._failed)
            for sub in self._subs.values():
                self.daemon.remove_subscription(sub)
            self._subs.clear()
            self.daemon.connection_closed(self.client_id)
            with trio.CancelScope(shield=True):
                await close_gracefully(self.stream)

    async def goodbye(self, reason: str = SHUTDOWN, *, deadline: float | None = None) -> None:
        """Flush every subscription (for a second at most), say goodbye with the resume point.

        Before the handshake is done, the goodbye follows the welcome. The
        flush ends at ``deadline`` if that is sooner; the goodbye is queued
        either way.
        """
        if self._nursery is None:
            self._pending_goodbye = reason
            return
        if self._closing:
            self._reader_scope.cancel()
            return
        flush_until = trio.current_time() + _FLUSH_TIMEOUT
        with trio.move_on_at(flush_until if deadline is None else min(deadline, flush_until)):
            for sub in list(self._subs.values()):
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    await self.daemon.fanout.flush(sub)
            await self._acks.answered()  # acks go before the goodbye (writes every 50 ms)
        self._end(reason)

    def evict(self, why: str) -> None:
        """Close a connection still waiting for its hello, to make room for a newer one."""
        if self.in_handshake:
            self._evicted = why
            self._handshake_scope.cancel()

    def resume_seq(self, *, outbox_delivered: bool = True) -> int:
        """The ``since_seq`` from which this client misses nothing its subscriptions matched.

        The lowest point over the subscriptions: where a replay or a batch
        being queued has got to, else just before the oldest event a
        dispatcher holds (or lost, overflowing); the head when everything
        was delivered. With ``outbox_delivered=False`` (a slow consumer's
        outbox is dropped) the events frames still queued count as not
        delivered. Events merged into one delta resume from before the
        first of them.
        """
        points = [self.daemon.bus.head_seq]
        if not outbox_delivered:
            points += self._outbox.undelivered()
        for sub in self._subs.values():
            since = self._since.get(sub)  # its replay or its batch in flight got this far
            if since is None:
                overflow = sub.dispatcher.overflow
                pending = sub.dispatcher.pending_seq() if overflow is None else overflow.resume_seq
                if pending is None:  # what its cohort has not taken yet
                    pending = self.daemon.fanout.pending_seq(sub)
                since = None if pending is None else pending - 1
            if since is not None:
                points.append(since)
        return min(points)

    def _goodbye(self, reason: str, *, outbox_delivered: bool = True) -> Goodbye:
        return Goodbye(reason=reason, resume_seq=self.resume_seq(outbox_delivered=outbox_delivered))

    def _end(self, reason: str) -> None:
        self._close_with(self._goodbye(reason))

    def _fatal(self, error: Error) -> None:
        """A fatal error, then the goodbye with the resume point (its reason: the code)."""
        self._close_with(error, self._goodbye(error.code))

    def _close_with(self, *frames: Frame) -> None:
        """Queue the last frames and stop reading; the writer drains what is queued."""
        if self._closing:
            self._reader_scope.cancel()
            return
        for frame in frames:
            self._queue(frame)
        self._outbox.close()
        self._reader_scope.cancel()

    @property
    def _closing(self) -> bool:
        """Ending: nothing more is queued, the writer drains what is."""
        return self._outbox.closing

    # -- containment -------------------------------------------------------------

    async def _guarded(self, task: Callable[[], Awaitable[object]], what: str) -> None:
        """Run one of this connection's tasks; what it raises ends this connection only."""
        try:
            await task()
        except Exception as exc:
            self._failed(exc, what)

    def _start_guarded(self, task: Callable[[], Awaitable[object]], what: str) -> bool:
        """Start ``task`` in this connection's scope, guarded; ``False`` before it serves."""
        if self._nursery is None:
            return False
        self._nursery.start_soon(self._guarded, task, what)
        return True

    def _failed(self, exc: BaseException, what: str) -> None:
        """Log and count a failure serving this client, then end its connection."""
        self._internal_error(exc, what)
        self._end(INTERNAL_ERROR)

    def _internal_error(self, exc: BaseException, what: str) -> None:
        self.daemon.counters.internal_errors += 1
        logger.error("%s: failed %s (the daemon goes on)", self.name, what, exc_info=exc)

    # -- handshake ---------------------------------------------------------------

    async def _handshake(self) -> bool:
        """Answer the hello; ``False`` when the connection ends here (after saying why)."""
        handshake = ServerHandshake(
            server=__version__, client_id=self.client_id, limits=self.daemon.config.limits()
        )
        reply: Welcome | Error | None = None
        frame: object = None
        self._handshake_scope.relative_deadline = self.daemon.config.handshake_timeout
        with self._handshake_scope:
            while frame is None:
                try:
                    frame = self._decoder.next_frame()
                except ProtocolError as exc:
                    reply = handshake.receive_error(exc)
                    break
                if frame is None:
                    data = await self._receive()
                    if not data:
                        return False
                    self._decoder.feed(data)
        self.in_handshake = False
        if self._evicted is not None:
            reply = Error(code=TOO_MANY_CONNECTIONS, message=self._evicted, fatal=True)
        elif self._handshake_scope.cancelled_caught:
            reply = handshake.timed_out()
        elif reply is None:
            reply = handshake.receive(frame, head_seq=self.daemon.bus.head_seq)
            if isinstance(reply, Welcome) and not self._admitted(frame):
                limit = self.daemon.config.max_connections_per_uid
                message = f"uid {self.uid} already has {limit} connections"
                reply = Error(code=TOO_MANY_CONNECTIONS, message=message, fatal=True)
        if isinstance(reply, Error):
            counters = self.daemon.counters
            if reply.code == HANDSHAKE_TIMEOUT:
                counters.handshake_timeouts += 1
            elif reply.code == FORBIDDEN:
                counters.forbidden += 1
            elif reply.code != TOO_MANY_CONNECTIONS:
                counters.protocol_errors += 1
            await self._send_now(reply, self._goodbye(reply.code))
            return False
        assert isinstance(frame, Hello)
        self.name = identity(frame.client, pid=self.pid, uid=self.uid)
        self.role = frame.role
        self._rights = self.daemon.config.grants.get(frame.role, frozenset())
        rights = tuple(r for r in RIGHTS if r in self._rights)
        await self._send_now(msgspec.structs.replace(reply, identity=self.name, rights=rights))
        return True

    def _admitted(self, hello: object) -> bool:
        """Count a connection that said hello toward its uid's limit, if there is room."""
        assert isinstance(hello, Hello)
        return self.daemon.connection_identified(self.client_id, hello.client, hello.role)

    async def _receive(self) -> bytes:
        try:
            return await self._receiver.receive()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return b""

    async def _send_now(self, *frames: Frame) -> None:
        with trio.move_on_after(_GOODBYE_TIMEOUT):
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await self.stream.send_all(b"".join(self._encoder.encode(f) for f in frames))

    # -- reading -----------------------------------------------------------------

    async def _reader(self) -> None:
        decoder = self._decoder
        while True:
            while True:
                try:
                    frame = decoder.next_frame()
                except ProtocolError as exc:
                    self.daemon.counters.protocol_errors += 1
                    if exc.fatal:
                        self._fatal(exc.to_frame())
                        return
                    self._protocol_error(exc)
                    continue
                if frame is not None and (why := self._forbidden(frame)) is not None:
                    self._refuse(frame, why)
                    continue
                match frame:
                    case None:
                        break
                    case Bye():
                        await self.goodbye(BYE)
                        return
                    case Publish():
                        await self._acks.around(frame, self._publish(frame))
                    case Ingest():
                        await self._journal_room()
                        self._acks.around_sync(frame, partial(self._ingests.ingest, name=self.name))
                    case Subscribe():
                        self._subscribe(frame)
                    case Unsubscribe():
                        self._unsubscribe(frame)
                    case Request():
                        self._request(frame)
                    case Ping():
                        self._queue(Pong(nonce=frame.nonce))
                    case Hello():
                        self.daemon.counters.repeated_hellos += 1
                        self._queue(Error(code=BAD_HANDSHAKE, message="hello was already received"))
            # What this chunk published is accounted and goes out before we wait
            # for the next one, not after a task switch (latency at a steady rate).
            if not self._settled:
                self.daemon.settle()
            self._settled = False
            data = await self._receive()
            if not data:
                return  # the client went away
            decoder.feed(data)

    async def _publish(self, frame: Publish[Event]) -> None:
        """Sequence a publish frame's events, all or none (each is checked first).

        A frame can carry thousands of small events: the reader yields every
        so often (never inside a small frame), so that subscribers drain meanwhile.
        """
        events = frame.events
        if frame is not self._covered:  # judged whole: _forbidden has passed it, then this
            refusal = self.daemon.frame_refusal(events)
            if refusal is not None:
                self.daemon.counters.rejected_events += len(events)
                self._queue(Error(code=INVALID_EVENT, message=refusal))
                return
            self._vetted.add(events, self.daemon.runs.authority_epoch)
        self._covered = None
        start = 0
        while start < len(events):  # checked above: published as they are, deltas as runs
            chunk = events[start : start + _YIELD_EVERY]
            start += len(chunk)
            if start == len(events) and not self._decoder.complete:  # what came in ends here
                self.daemon.publish_frame_and_settle(chunk, source=self.name)
                self._settled = True  # the reader need not settle it again
            else:
                self.daemon.publish_frame(chunk, source=self.name)
            self._unyielded += len(chunk)
            if self._unyielded >= _YIELD_EVERY:  # counted across frames, after whole ones
                self._unyielded = 0
                await self._journal_room()
                await trio.lowlevel.checkpoint()

    async def _journal_room(self) -> None:
        """A publisher waits while the journal's disk is behind (bounded: Journal.room)."""
        journal = self.daemon.journal
        if journal is not None and journal.congested:
            await journal.room()

    def _forbidden(self, frame: Frame) -> str | None:
        runs = self.daemon.runs
        if frame.__class__ is Publish and self._vetted.covers(frame.events, runs.authority_epoch):
            self._covered = frame
            return None
        return forbidden(frame, role=self.role, rights=self._rights, runs=runs)

    def _refuse(self, frame: Frame, message: str) -> None:
        self.daemon.counters.forbidden += 1
        logger.info("%s: forbidden: %s", self.name, message)
        answer, reply = refusal(frame, message)
        self._queue(answer, reply=reply)

    def _protocol_error(self, exc: ProtocolError) -> None:
        if exc.op in ("request", "publish", "ingest") and exc.ref is not None:  # ref: id, ack
            error = ErrorInfo(code=exc.code, message=exc.message)
            self._queue(Reply(id=exc.ref, ok=False, error=error), reply=True)
        else:
            self._queue(exc.to_frame())

    # -- subscriptions -----------------------------------------------------------

    def _subscribe(self, frame: Subscribe) -> None:
        """Make subscription ``frame.id``, replacing a live one; a refused one changes nothing."""
        sub_id = frame.id
        old = self._subs.get(sub_id)
        if old is None and len(self._subs) >= self.daemon.config.max_subscriptions:
            self._queue(
                Error(
                    code=TOO_MANY_SUBSCRIPTIONS,
                    message=f"at most {self.daemon.config.max_subscriptions} subscriptions",
                    ref=sub_id,
                )
            )
            return

        async def send(batch: list[Envelope[Event]]) -> None:
            since = dispatcher.since(batch)
            self._since[sub] = since
            await self._send_events(sub, [e.seq for e in batch], self.daemon.raws(batch), since)
            self._since.pop(sub, None)  # not on failure: its resume point stays

        config, outbox, events_head = self.daemon.config, self._outbox, self._encoder.events_head
        outbound_cap, parts_cap = config.outbound_cap, config.max_frame - _EVENTS_OVERHEAD

        def send_shared(batch: SharedBatch) -> bool:
            """A cohort's batch as ``events`` frames, written now; ``False`` if it must wait.

            The fan-out's pass calls it once per member (from anyone's task: a
            failure is ours, not theirs). The array is packed once per batch, its
            head once per subscription id; nothing else is made or called per
            member that need not be (docs/performance.md, "The code a burst runs").
            """
            try:
                if outbox.closing:  # the connection is ending (``_closing``)
                    return True  # as the async path: nothing goes out any more
                if batch.size > outbound_cap or not outbox.fits(batch.size):
                    return False  # the subscription's loop sends it, waiting for room
                parts = batch.parts or shared_parts(batch, parts_cap)
                if parts is None:
                    return False  # an envelope over the cap: the loop says so
                for part in parts:
                    head = part.heads.get(sub_id)
                    if head is None:
                        head = part.heads[sub_id] = events_head(sub_id, part.body)
                    outbox.push(head, part.body, since=part.since)
                return True
            except Exception as exc:
                self._failed(exc, f"delivering to subscription {sub_id}")
                return True

        dispatcher = BatchDispatcher(
            send,
            window=frame.window_ms / 1000,
            merge_deltas=frame.deltas == "merged",
            max_merged_chars=self.daemon.config.max_frame // 8,  # a merged delta fits a frame
            keyer=self.daemon.keyer,
            max_events=self.daemon.config.subscription_buffer,
            send_shared=send_shared,
        )
        try:
            sub = Subscription(
                self.client_id,
                sub_id,
                frame.patterns,
                sessions=frame.sessions,
                owned_only=frame.owned_only,
                dispatcher=dispatcher,
                owned=self.daemon.runs.started_by(self.name) if frame.owned_only else frozenset(),
            )
        except InvalidPattern as exc:
            self._queue(Error(code=INVALID_PATTERN, message=str(exc), ref=sub_id))
            return
        sub.on_error = partial(self._failed, what=f"adding to subscription {sub_id}")
        if old is not None:
            del self._subs[sub_id]
            self._drop(old)
        resume: Resume | None = None
        if frame.since_seq is not None:
            # Synchronous from here to add_subscription: nothing is missed or doubled.
            # Live events wait in the dispatcher until the replay is queued.
            resume = self.daemon.replay(sub, frame.since_seq)
            self._since[sub] = 0 if resume.ahead else resume.since_seq
            if resume.ahead:
                message = (
                    f"since_seq {frame.since_seq} is past this daemon's head {resume.head_seq} "
                    "(it restarted): replaying from the oldest event held"
                )
                self._queue(Error(code=SEQ_AHEAD, message=message, ref=sub_id))
            if resume.gap is not None:
                self._queue(Gap(sub=sub_id, from_seq=resume.gap[0], to_seq=resume.gap[1]))
        self.daemon.add_subscription(sub)
        self._subs[sub_id] = sub
        assert self._nursery is not None
        what = f"delivering to subscription {sub_id}"
        self._nursery.start_soon(self._guarded, partial(self._deliver, sub, resume), what)

    def _live(self, sub: Subscription) -> bool:
        """Still subscribed: not unsubscribed, replaced or dropped meanwhile."""
        return self._subs.get(sub.id) is sub and not self._closing

    async def _deliver(self, sub: Subscription, resume: Resume | None) -> None:
        """Replay first (journal, then ring, with backpressure), then live batches."""
        if resume is not None:
            if resume.journal is not None:
                await self._replay_journal(sub, resume.journal)
            for seqs, raws in resume.ring.chunks(_REPLAY_CHUNK):
                if not self._live(sub):
                    break
                seqs, raws = sub.wanted(seqs, raws)
                if seqs:
                    await self._send_events(sub, seqs, raws, self._since[sub])
                await trio.lowlevel.checkpoint()  # a long replay: the others go on meanwhile
            self._since.pop(sub, None)
        if not self._live(sub):
            return  # its dispatcher is closed, or is about to be: it never runs
        await sub.dispatcher.run()
        if sub.dispatcher.overflow is not None and self._live(sub):
            self._slow_consumer()

    async def _replay_journal(self, sub: Subscription, span: JournalSpan) -> None:
        """What the ring no longer holds, read from the journal page by page, gaps in place."""
        items = span.read(sub.wants_row, sub.wants, sessions=_sorted(sub.sessions))
        async with contextlib.aclosing(items):
            async for item in items:
                if not self._live(sub):
                    return
                if isinstance(item, Missing):
                    self._queue(Gap(sub=sub.id, from_seq=item.from_seq, to_seq=item.to_seq))
                    self._since[sub] = max(self._since[sub], item.to_seq)
                else:
                    await self._send_events(sub, item.seqs, item.raws, self._since[sub])

    def _unsubscribe(self, frame: Unsubscribe) -> None:
        sub = self._subs.pop(frame.id, None)
        if sub is None:
            message = f"no subscription {frame.id}"
            self._queue(Error(code=UNKNOWN_SUBSCRIPTION, message=message, ref=frame.id))
        else:
            self._drop(sub)

    def _drop(self, sub: Subscription) -> None:
        self.daemon.remove_subscription(sub)
        sub.dispatcher.close_nowait()
        self._since.pop(sub, None)

    # -- requests ----------------------------------------------------------------

    def _request(self, frame: Request) -> None:
        """Answer a request; one that fails unexpectedly gets ``internal_error``, and we go on."""
        limit = self.daemon.config.max_requests
        if self._outbox.replies >= limit:
            error = ErrorInfo(
                code=TOO_MANY_REQUESTS,
                message=f"more than {limit} replies are waiting to be read",
            )
            self._queue(Reply(id=frame.id, ok=False, error=error), reply=True)
            return
        if isinstance(frame.command, AskPermission):
            self._asks.ask(frame.id, frame.command, source=self.name, rights=self._rights)
            return
        try:
            result = answer(self.daemon, frame.command, by=self.name)
            self._queue(Reply(id=frame.id, ok=True, result=result), reply=True)
            return
        except Failed as failed:
            error = ErrorInfo(code=failed.code, message=str(failed))
        except ProtocolError as exc:  # the answer does not fit a frame
            error = ErrorInfo(code=exc.code, message=f"the answer is too large: {exc.message}")
        except Exception as exc:  # a request changes nothing of this connection: go on
            self._internal_error(exc, f"answering request {frame.id}")
            message = f"the daemon failed answering this request ({type(exc).__name__})"
            error = ErrorInfo(code=INTERNAL_ERROR, message=message)
        self._queue(Reply(id=frame.id, ok=False, error=error), reply=True)

    # -- writing -----------------------------------------------------------------

    def _queue(self, frame: Frame, *, reply: bool = False) -> None:
        self._outbox.push(self._encoder.encode(frame), reply=reply)

    async def _send_events(
        self, sub: Subscription, seqs: list[int], raws: list[msgspec.Raw], since: int
    ) -> None:
        """Events frames for ``raws`` (split under the frame cap), waiting for outbox room.

        A subscriber that reads keeps the outbox under ``outbound_cap``; one
        that does not makes this wait, while its subscription keeps
        coalescing, until its buffer overflows too: then it is a slow
        consumer. Frames are split to fit the cap too (an envelope larger
        than it goes alone). ``since`` is the resume point before the first
        of them; each frame remembers it, and ``_since[sub]`` (when tracked)
        follows what is queued.
        """
        config = self.daemon.config
        frame_cap = config.max_frame - _EVENTS_OVERHEAD
        split = min(frame_cap, config.outbound_cap - _EVENTS_OVERHEAD)
        start = 0
        while start < len(raws) and not self._closing:
            if len(raws[start]) > frame_cap:
                self._too_large(sub.id, seqs[start], len(raws[start]))
            else:
                end, size = start + 1, len(raws[start])
                while end < len(raws) and size + len(raws[end]) <= split:
                    size += len(raws[end])
                    end += 1
                data = self._encoder.encode(Events(sub=sub.id, events=raws[start:end]))
                if not await self._outbox.room(len(data)):
                    return
                self._outbox.push(data, since=since)
                start = end - 1
            since = seqs[start]
            start += 1
            if sub in self._since:
                self._since[sub] = since

    def _too_large(self, sub_id: int, seq: int, size: int) -> None:
        """An envelope no events frame can carry (an event published right at the cap)."""
        message = (
            f"event seq {seq} is {size} bytes as an envelope, over what one events frame "
            f"carries (max_frame {self.daemon.config.max_frame}): not delivered"
        )
        logger.warning("%s: %s", self.name, message)
        self._queue(Error(code=FRAME_TOO_LARGE, message=message, ref=sub_id))

    def _slow_consumer(self) -> None:
        """The client cannot keep up: drop what is queued, say where to resume, close."""
        goodbye = self._goodbye(SLOW_CONSUMER, outbox_delivered=False)
        self.daemon.counters.slow_consumer_disconnects += 1
        logger.warning(
            "%s: slow consumer, disconnected (resume after seq %d)", self.name, goodbye.resume_seq
        )
        self._outbox.drop_queued()
        for sub in self._subs.values():
            self._drop(sub)
        self._subs.clear()
        self._close_with(goodbye)
