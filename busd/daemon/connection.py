"""One client connection: handshake, a reader task, a writer task.

The reader decodes frames and answers them synchronously against the
:class:`~busd.daemon.hub.Daemon`; everything to send goes through one outbox,
drained by the writer in as few ``send_all`` calls as it can. The outbox is
capped in bytes (queued plus in flight): a client that stops reading is told
``goodbye(slow_consumer, resume_seq)`` and closed, and nobody else waits for
it. Works over any Trio stream, so tests can use memory streams.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections import deque
from dataclasses import dataclass
from typing import Any

import msgspec
import trio

from .._version import __version__
from ..core.errors import InvalidPattern
from ..core.events import Envelope, Event
from ..core.permissions import PermissionRejected
from ..plugins.adapters import Translator
from ..wire import (
    BAD_HANDSHAKE,
    BYE,
    FRAME_TOO_LARGE,
    INTERNAL,
    INVALID_EVENT,
    INVALID_PATTERN,
    SEQ_AHEAD,
    SHUTDOWN,
    SLOW_CONSUMER,
    TOO_MANY_REQUESTS,
    TOO_MANY_SUBSCRIPTIONS,
    UNKNOWN_COMMAND,
    UNKNOWN_SDK,
    UNKNOWN_SESSION,
    UNKNOWN_SUBSCRIPTION,
    Bye,
    CancelRun,
    Encoder,
    Error,
    ErrorInfo,
    Events,
    Frame,
    Gap,
    Goodbye,
    Hello,
    Ingest,
    PermissionReply,
    Ping,
    Pong,
    ProtocolError,
    Publish,
    Reply,
    Request,
    Runs,
    ServerHandshake,
    Sessions,
    Snapshot,
    StartRun,
    Stats,
    Status,
    Subscribe,
    Unsubscribe,
    client_frame_decoder,
)
from .batching import BatchDispatcher
from .hub import Daemon, PublishRejected, Resume, Subscription
from .journal import JournalSpan, Missing
from .runs import RunRejected

__all__ = ["Connection", "close_gracefully"]

logger = logging.getLogger("busd.connection")

_RECEIVE = 65_536
_YIELD_EVERY = 64  # published events between two checkpoints of the reader
_EVENTS_OVERHEAD = 64  # an events frame's bytes besides its envelopes
_GOODBYE_TIMEOUT = 1.0  # how long a closing connection may take to write its last frames


@dataclass(slots=True)
class _Out:
    data: bytes
    first_seq: int | None = None  # for events frames: the oldest seq they carry
    reply: bool = False


class _Failed(Exception):
    """A reply that is an error (code, message)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def _sorted(sessions: frozenset[str] | None) -> list[str] | None:
    return None if sessions is None else sorted(sessions)


async def close_gracefully(stream: trio.abc.Stream) -> None:
    """Half-close, drain what the peer still sends, then close.

    Closing a Unix socket with unread bytes in it makes the kernel reset the
    connection, and the peer may lose the last frames we wrote (the error
    that says why it is being closed). The drain is bounded (one second).
    """
    with trio.move_on_after(_GOODBYE_TIMEOUT):
        try:
            if isinstance(stream, trio.abc.HalfCloseableStream):
                await stream.send_eof()
            while await stream.receive_some(_RECEIVE):
                pass
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
    await trio.aclose_forcefully(stream)


class Connection:
    """Serves one client until it leaves, breaks the protocol, falls behind or we stop."""

    def __init__(self, daemon: Daemon, stream: trio.abc.Stream, *, uid: int) -> None:
        self.daemon = daemon
        self.stream = stream
        self.uid = uid
        self.client_id = daemon.connection_opened(uid)
        self.name = f"client-{self.client_id}"
        config = daemon.config
        self._decoder = client_frame_decoder(daemon.catalog, max_frame=config.max_frame)
        self._encoder = Encoder(max_frame=config.max_frame)
        self._out: deque[_Out] = deque()
        self._out_bytes = 0
        self._inflight: list[_Out] = []
        self._inflight_bytes = 0
        self._replies = 0  # replies queued or being written
        self._out_ready = trio.Event()
        self._progress = trio.Event()  # set whenever the writer has written something
        self._closing = False
        self._subs: dict[int, Subscription] = {}
        self._translators: dict[tuple[str, str | None], Translator] = {}
        self._reader_scope = trio.CancelScope()
        self._writer_done = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._pending_goodbye: str | None = None
        self._unyielded = 0  # events published since the reader last let others run
        # Write-through: while the writer is parked with nothing queued, a frame
        # is written to the socket at once (non-blocking) instead of waking it.
        self._fd = stream.socket.fileno() if isinstance(stream, trio.SocketStream) else None
        self._writer_parked = False

    # -- life --------------------------------------------------------------------

    async def serve(self) -> None:
        try:
            hello = await self._handshake()
            if hello is None:
                return
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._writer)
                if self._pending_goodbye is not None:  # the daemon began stopping meanwhile
                    self._close_with(
                        Goodbye(reason=self._pending_goodbye, resume_seq=self.daemon.bus.head_seq)
                    )
                with self._reader_scope:
                    await self._reader()
                if self._closing:  # let the last frames (goodbye, error) go out
                    with trio.move_on_after(self.daemon.config.goodbye_timeout):
                        await self._writer_done.wait()
                nursery.cancel_scope.cancel()
        finally:
            self._fd = None  # the descriptor is about to be closed (and maybe reused)
            self._finish_translators()
            for sub in self._subs.values():
                self.daemon.remove_subscription(sub)
            self._subs.clear()
            self.daemon.connection_closed(self.client_id)
            with trio.CancelScope(shield=True):
                await close_gracefully(self.stream)

    async def goodbye(self, reason: str = SHUTDOWN, *, deadline: float | None = None) -> None:
        """Flush every subscription, say goodbye with the resume seq, and close.

        Before the handshake is done, the goodbye follows the welcome.
        """
        if self._nursery is None:
            self._pending_goodbye = reason
            return
        if self._closing:
            self._reader_scope.cancel()
            return
        with trio.move_on_at(deadline if deadline is not None else trio.current_time() + 1.0):
            for sub in list(self._subs.values()):
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    await sub.dispatcher.flush()
        self._close_with(Goodbye(reason=reason, resume_seq=self.daemon.bus.head_seq))

    def _close_with(self, frame: Frame) -> None:
        """Queue a last frame and stop reading; the writer drains what is queued."""
        if self._closing:
            return
        self._queue(frame)
        self._closing = True
        self._out_ready.set()
        self._progress.set()
        self._reader_scope.cancel()

    # -- handshake ---------------------------------------------------------------

    async def _handshake(self) -> Hello | None:
        handshake = ServerHandshake(
            server=__version__, client_id=self.client_id, limits=self.daemon.config.limits()
        )
        reply: Frame | None = None
        frame: object = None
        with trio.move_on_after(self.daemon.config.handshake_timeout) as scope:
            while frame is None:
                try:
                    frame = self._decoder.next_frame()
                except ProtocolError as exc:
                    reply = handshake.receive_error(exc)
                    break
                if frame is None:
                    data = await self._receive()
                    if not data:
                        return None
                    self._decoder.feed(data)
        if scope.cancelled_caught:
            reply = handshake.timed_out()
        elif reply is None:
            reply = handshake.receive(frame, head_seq=self.daemon.bus.head_seq)
        await self._send_now(reply)
        if not isinstance(frame, Hello) or handshake.state != "done":
            if isinstance(reply, Error) and reply.code != "handshake_timeout":
                self.daemon.counters.protocol_errors += 1
            return None
        self.name = frame.client or self.name
        self.daemon.connection_identified(self.client_id, frame.client, frame.role)
        return frame

    async def _receive(self) -> bytes:
        try:
            return bytes(await self.stream.receive_some(_RECEIVE))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return b""

    async def _send_now(self, frame: Frame) -> None:
        with trio.move_on_after(_GOODBYE_TIMEOUT):
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await self.stream.send_all(self._encoder.encode(frame))

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
                        self._close_with(exc.to_frame())
                        return
                    self._protocol_error(exc)
                    continue
                if frame is None:
                    break
                if isinstance(frame, Bye):
                    await self.goodbye(BYE)
                    return
                if isinstance(frame, Publish):
                    await self._publish(frame)
                    continue
                if isinstance(frame, Ingest):
                    await self._journal_room()
                try:
                    self._handle(frame)
                except Exception:
                    logger.exception("%s: failed to handle %r", self.name, frame)
                    self._queue(Error(code=INTERNAL, message="the daemon failed on this frame"))
            # What this chunk published is accounted and goes out before we wait
            # for the next one, not after a task switch (latency at a steady rate).
            self.daemon.settle()
            data = await self._receive()
            if not data:
                return  # the client went away
            decoder.feed(data)

    async def _publish(self, frame: Publish[Event]) -> None:
        """Sequence a publish frame's events, letting subscribers drain every so often.

        One frame can carry thousands of small events; publishing them in one
        go would land them all in every subscriber's buffer before any of them
        gets to send.
        """
        for index, outgoing in enumerate(frame.events):
            try:
                self.daemon.publish_from_client(outgoing, source=self.name)
            except PublishRejected as exc:
                self._queue(Error(code=INVALID_EVENT, message=f"events[{index}]: {exc}"))
            self._unyielded += 1
            if self._unyielded >= _YIELD_EVERY:  # counted across frames: small ones add up
                self._unyielded = 0
                await self._journal_room()
                await trio.lowlevel.checkpoint()

    async def _journal_room(self) -> None:
        """A publisher waits while the journal's disk is behind (bounded: Journal.room)."""
        journal = self.daemon.journal
        if journal is not None and journal.congested:
            await journal.room()

    def _protocol_error(self, exc: ProtocolError) -> None:
        if exc.op == "request" and exc.ref is not None:
            error = ErrorInfo(code=exc.code, message=exc.message)
            self._queue(Reply(id=exc.ref, ok=False, error=error), reply=True)
        else:
            self._queue(exc.to_frame())

    def _handle(self, frame: Any) -> None:
        if isinstance(frame, Subscribe):
            self._subscribe(frame)
        elif isinstance(frame, Request):
            self._request(frame)
        elif isinstance(frame, Ping):
            self._queue(Pong(nonce=frame.nonce))
        elif isinstance(frame, Unsubscribe):
            sub = self._subs.pop(frame.id, None)
            if sub is None:
                self._queue(
                    Error(
                        code=UNKNOWN_SUBSCRIPTION,
                        message=f"no subscription {frame.id}",
                        ref=frame.id,
                    )
                )
            else:
                self._drop(sub)
        elif isinstance(frame, Ingest):
            self._ingest(frame)
        elif isinstance(frame, Hello):
            self._queue(Error(code=BAD_HANDSHAKE, message="hello was already received"))

    # -- ingest ------------------------------------------------------------------

    def _ingest(self, frame: Ingest) -> None:
        key = (frame.sdk, frame.session_id)
        translator = self._translators.get(key)
        if translator is None:
            adapter = self.daemon.adapters.get(frame.sdk)
            if adapter is None:
                loaded = ", ".join(sorted(self.daemon.adapters)) or "none"
                message = f"no adapter for sdk {frame.sdk!r} is loaded (loaded: {loaded})"
                self._queue(Error(code=UNKNOWN_SDK, message=message))
                return
            translator = adapter.translator(session_id=frame.session_id)
            self._translators[key] = translator
        now = trio.current_time()
        source = f"{self.name}/{frame.sdk}"
        for raw in frame.events:
            for emitted in translator.feed(raw, now):
                self.daemon.publish_emitted(emitted, source=source)
        if frame.end:
            del self._translators[key]
            for emitted in translator.finish(now):
                self.daemon.publish_emitted(emitted, source=source)

    def _finish_translators(self) -> None:
        """A connection that ends mid-stream still gets its streams finished."""
        now = trio.current_time()
        for (sdk, _), translator in self._translators.items():
            for emitted in translator.finish(now):
                self.daemon.publish_emitted(emitted, source=f"{self.name}/{sdk}")
        self._translators.clear()

    # -- subscriptions -----------------------------------------------------------

    def _subscribe(self, frame: Subscribe) -> None:
        old = self._subs.pop(frame.id, None)
        if old is not None:
            self._drop(old)
        elif len(self._subs) >= self.daemon.config.max_subscriptions:
            self._queue(
                Error(
                    code=TOO_MANY_SUBSCRIPTIONS,
                    message=f"at most {self.daemon.config.max_subscriptions} subscriptions",
                    ref=frame.id,
                )
            )
            return
        sub_id = frame.id

        async def send(batch: list[Envelope[Event]]) -> None:
            await self._send_events(sub_id, [e.seq for e in batch], self.daemon.raws(batch))

        def send_nowait(batch: list[Envelope[Event]]) -> bool:
            return self._send_events_nowait(sub_id, batch)

        flusher = self.daemon.flusher
        direct = flusher.running
        dispatcher = BatchDispatcher(
            send,
            window=frame.window_ms / 1000,
            merge_deltas=frame.deltas == "merged",
            max_merged_chars=self.daemon.config.max_frame // 8,  # a merged delta fits a frame
            keyer=self.daemon.keyer,
            max_events=self.daemon.config.subscription_buffer,
            send_nowait=send_nowait if direct else None,
            flusher=flusher if direct else None,
        )
        try:
            sub = Subscription(
                self.client_id,
                sub_id,
                frame.patterns,
                sessions=frame.sessions,
                owned_only=frame.owned_only,
                dispatcher=dispatcher,
            )
        except InvalidPattern as exc:
            self._queue(Error(code=INVALID_PATTERN, message=str(exc), ref=sub_id))
            return
        resume: Resume | None = None
        if frame.since_seq is not None:
            # Synchronous from here to add_subscription: nothing is missed or doubled.
            # Live events wait in the dispatcher until the replay is queued.
            resume = self.daemon.replay(sub, frame.since_seq)
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
        self._nursery.start_soon(self._deliver, sub, resume)

    async def _deliver(self, sub: Subscription, resume: Resume | None) -> None:
        """Replay first (journal, then ring, with backpressure), then live batches."""
        if resume is not None:
            if resume.journal is not None:
                await self._replay_journal(sub, resume.journal)
            if resume.raws and self._subs.get(sub.id) is sub:
                await self._send_events(sub.id, resume.seqs, resume.raws)
        await sub.dispatcher.run()
        overflow = sub.dispatcher.overflow
        if overflow is not None and self._subs.get(sub.id) is sub:
            self._slow_consumer(overflow.resume_seq)

    async def _replay_journal(self, sub: Subscription, span: JournalSpan) -> None:
        """What the ring no longer holds, read from the journal page by page, gaps in place."""
        items = span.read(sub.wants_row, sub.wants, sessions=_sorted(sub.sessions))
        async with contextlib.aclosing(items):
            async for item in items:
                if self._subs.get(sub.id) is not sub or self._closing:
                    return  # unsubscribed or replaced meanwhile
                if isinstance(item, Missing):
                    self._queue(Gap(sub=sub.id, from_seq=item.from_seq, to_seq=item.to_seq))
                else:
                    await self._send_events(sub.id, item.seqs, item.raws)

    def _drop(self, sub: Subscription) -> None:
        self.daemon.remove_subscription(sub)
        sub.dispatcher.close_nowait()

    # -- requests ----------------------------------------------------------------

    def _request(self, frame: Request) -> None:
        limit = self.daemon.config.max_requests
        if self._replies >= limit:
            error = ErrorInfo(
                code=TOO_MANY_REQUESTS,
                message=f"more than {limit} replies are waiting to be read",
            )
            self._queue(Reply(id=frame.id, ok=False, error=error), reply=True)
            return
        try:
            result = self._answer(frame.command)
        except _Failed as failed:
            error = ErrorInfo(code=failed.code, message=str(failed))
            self._queue(Reply(id=frame.id, ok=False, error=error), reply=True)
            return
        self._queue(Reply(id=frame.id, ok=True, result=result), reply=True)

    def _answer(self, command: object) -> Any:
        daemon = self.daemon
        if isinstance(command, Status):
            return daemon.status()
        if isinstance(command, Sessions):
            return daemon.sessions.list(command.limit)
        if isinstance(command, Snapshot):
            snapshot = daemon.sessions.snapshot(
                command.session_id, stats=daemon.session_stats(command.session_id)
            )
            if snapshot is None:
                raise _Failed(UNKNOWN_SESSION, f"no session {command.session_id!r}")
            return snapshot
        if isinstance(command, Stats):
            stats = daemon.stats(command.session_id)
            if stats is None:
                raise _Failed(UNKNOWN_SESSION, f"no stats for session {command.session_id!r}")
            return stats
        if isinstance(command, StartRun):
            try:
                state = daemon.runs.start(
                    adapter=command.adapter,
                    prompt=command.prompt,
                    started_by=self.name,
                    session_id=command.session_id,
                    model=command.model,
                    system_prompt=command.system_prompt,
                    cwd=command.cwd,
                    permission_mode=command.permission_mode,
                    max_turns=command.max_turns,
                    options=command.options,
                    driver=command.driver,
                )
            except RunRejected as exc:
                raise _Failed(exc.code, str(exc)) from None
            return {"run_id": state.run_id, "session_id": state.request.session_id}
        if isinstance(command, CancelRun):
            try:
                state = daemon.runs.cancel(command.run_id, by=self.name, reason=command.reason)
            except RunRejected as exc:
                raise _Failed(exc.code, str(exc)) from None
            return state.summary()
        if isinstance(command, PermissionReply):
            try:
                decision = daemon.broker.reply(
                    command.request_id,
                    by=self.name,
                    option_id=command.option_id,
                    allow=command.allow,
                    reason=command.reason,
                )
            except PermissionRejected as exc:
                raise _Failed(exc.code, str(exc)) from None
            return msgspec.to_builtins(decision)
        if isinstance(command, Runs):
            return daemon.runs.runs()
        raise _Failed(UNKNOWN_COMMAND, f"unknown command {type(command).__name__}")

    # -- writing -----------------------------------------------------------------

    def _queue(self, frame: Frame, *, reply: bool = False) -> None:
        self._push(_Out(self._encoder.encode(frame), reply=reply))

    async def _send_events(self, sub_id: int, seqs: list[int], raws: list[msgspec.Raw]) -> None:
        """Events frames for ``raws`` (split under the frame cap), waiting for outbox room.

        A subscriber that reads keeps the outbox under ``outbound_cap``; one
        that does not makes this wait, while its subscription keeps
        coalescing, until its buffer overflows too: then it is a slow consumer.
        Each frame remembers the seq of its first event, so a client dropped
        with frames still queued is told to resume before the oldest of them.
        """
        cap = self.daemon.config.max_frame - _EVENTS_OVERHEAD
        limit = self.daemon.config.outbound_cap
        start = 0
        while start < len(raws) and not self._closing:
            if len(raws[start]) > cap:
                self._too_large(sub_id, seqs[start], len(raws[start]))
                start += 1
                continue
            end, size = start, 0
            while end < len(raws) and size + len(raws[end]) <= cap:
                size += len(raws[end])
                end += 1
            data = self._encoder.encode(Events(sub=sub_id, events=raws[start:end]))
            while self._out_bytes + self._inflight_bytes + len(data) > limit and (
                self._out or self._inflight
            ):
                self._progress = trio.Event()
                await self._progress.wait()
                if self._closing:
                    return
            self._push(_Out(data, seqs[start]))
            start = end

    def _too_large(self, sub_id: int, seq: int, size: int) -> None:
        """An envelope no events frame can carry (an event published right at the cap)."""
        message = (
            f"event seq {seq} is {size} bytes as an envelope, over what one events frame "
            f"carries (max_frame {self.daemon.config.max_frame}): not delivered"
        )
        logger.warning("%s: %s", self.name, message)
        self._queue(Error(code=FRAME_TOO_LARGE, message=message, ref=sub_id))

    def _send_events_nowait(self, sub_id: int, batch: list[Envelope[Event]]) -> bool:
        """:meth:`_send_events` for a batch that fits one frame and the outbox: no waiting.

        ``False`` when it would have to split or wait; the async path does that.
        """
        if self._closing:
            return True  # as the async path: nothing goes out any more
        raws = self.daemon.raws(batch)
        size = sum(map(len, raws)) + _EVENTS_OVERHEAD  # at most: checked before encoding
        if size > self.daemon.config.max_frame:
            return False
        if (self._out or self._inflight) and (
            self._out_bytes + self._inflight_bytes + size > self.daemon.config.outbound_cap
        ):
            return False
        self._push(_Out(self._encoder.encode(Events(sub=sub_id, events=raws)), batch[0].seq))
        return True

    def _push(self, out: _Out) -> None:
        if self._closing:
            return
        if self._writer_parked and not self._out and self._fd is not None:
            data = out.data
            try:
                written = os.write(self._fd, data)
            except BlockingIOError:
                written = 0
            except OSError:  # the peer is gone: as the writer does
                self._writer_broke()
                return
            if written == len(data):
                return
            out = _Out(data[written:], out.first_seq, reply=out.reply)  # the writer goes on
        self._out.append(out)
        self._out_bytes += len(out.data)
        if out.reply:
            self._replies += 1
        if self._out_bytes + self._inflight_bytes > 2 * self.daemon.config.outbound_cap:
            self._slow_consumer()  # a client that asks and asks but never reads
        self._out_ready.set()

    def _slow_consumer(self, overflowed_at: int | None = None) -> None:
        """The client cannot keep up: drop what is queued, say where to resume, close."""
        pending = [o.first_seq for o in (*self._inflight, *self._out) if o.first_seq is not None]
        pending += [
            seq for sub in self._subs.values() if (seq := sub.dispatcher.pending_seq()) is not None
        ]
        if overflowed_at is not None:
            pending.append(overflowed_at)
        resume = min(pending) - 1 if pending else self.daemon.bus.head_seq
        self.daemon.counters.slow_consumer_disconnects += 1
        logger.warning("%s: slow consumer, disconnected (resume after seq %d)", self.name, resume)
        self._out.clear()
        self._out_bytes = 0
        for sub in self._subs.values():
            self._drop(sub)
        self._subs.clear()
        self._close_with(Goodbye(reason=SLOW_CONSUMER, resume_seq=resume))

    def _writer_broke(self) -> None:
        """The client is gone: stop reading, release anyone waiting for room."""
        self._closing = True
        self._reader_scope.cancel()
        self._progress.set()
        self._out_ready.set()

    async def _writer(self) -> None:
        try:
            while True:
                if not self._out:
                    if self._closing:
                        return
                    self._out_ready = trio.Event()
                    self._writer_parked = True
                    try:
                        await self._out_ready.wait()
                    finally:
                        self._writer_parked = False
                    continue
                batch = list(self._out)
                self._out.clear()
                self._inflight = batch
                self._inflight_bytes = self._out_bytes
                self._out_bytes = 0
                try:
                    await self.stream.send_all(b"".join(o.data for o in batch))
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    self._writer_broke()
                    return
                self._replies -= sum(1 for o in batch if o.reply)
                self._inflight = []
                self._inflight_bytes = 0
                self._progress.set()
        finally:
            self._writer_done.set()
