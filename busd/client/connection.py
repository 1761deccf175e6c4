"""The connection: :class:`Client`, its subscriptions, and :func:`connect`."""

from __future__ import annotations

import itertools
import logging
import os
import socket
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any, Literal

import msgspec
import trio

from .._version import __version__
from ..core.catalog import Catalog
from ..core.events import Envelope, Event
from ..transport import send_eagerly
from ..wire import (
    BYE,
    PROTOCOL_VERSION,
    Bye,
    Command,
    Encoder,
    Error,
    ErrorInfo,
    Frame,
    Goodbye,
    Hello,
    Limits,
    Outgoing,
    Ping,
    Pong,
    ProtocolError,
    Publish,
    Reply,
    Request,
    Role,
    Subscribe,
    Unsubscribe,
    Welcome,
    encode_frame,
    server_frame_decoder,
)
from ..wire.address import resolve_socket_path, untrusted_server
from .commands import Commands
from .errors import (
    Acked,
    Batch,
    ClientStatistics,
    ConnectionLost,
    NotJournaled,
    RequestFailed,
    SubscribeFailed,
    connect_error,
)
from .reading import RECEIVE, Inbox

__all__ = ["Client", "ClientSubscription", "connect"]

logger = logging.getLogger("busd.client")

_PUBLISH_QUEUE = 10_000
_checkpoint_if_cancelled = trio.lowlevel.checkpoint_if_cancelled
_Queued = Frame | list[Outgoing[Event]]  # what the writer sends: a run of publishes is one frame


class ClientSubscription:
    """A live subscription: iterate it for batches (``events()`` for single envelopes).

    ``last_seq`` is the seq of the last envelope delivered: what a resume
    (automatic with ``reconnect=True``) starts after. Iterating is a
    checkpoint; a task waiting for the next batch reads the socket itself
    when no other task does (``reading.py`` says why).
    """

    def __init__(self, client: Client, sub_id: int, frame: Subscribe) -> None:
        self.client = client
        self.id = sub_id
        self.frame = frame
        self.last_seq: int | None = None
        self._send, self._receive = trio.open_memory_channel[Batch | ConnectionLost](256)
        self._hungry = 0  # tasks in __anext__ that wait for another task's read, not yet fed

    def __aiter__(self) -> ClientSubscription:
        return self

    async def __anext__(self) -> Batch:
        await _checkpoint_if_cancelled()
        try:
            item = self._receive.receive_nowait()
        except trio.WouldBlock:
            item = await self._wait()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None
        else:  # it was queued: still a scheduling point, as a channel's receive is
            await trio.lowlevel.cancel_shielded_checkpoint()
        if isinstance(item, ConnectionLost):
            raise item
        return item

    async def _wait(self) -> Batch | ConnectionLost:
        """Read for the next batch while nobody else reads, else wait for the task that does."""
        while (inbox := self.client._inbox) is not None and await inbox.read_for_iterator():
            try:
                return self._receive.receive_nowait()
            except trio.WouldBlock:
                continue  # that read brought other frames: read again
            except trio.EndOfChannel:
                raise StopAsyncIteration from None
        # Another task reads (it wakes the reader task for us when it stops), a batch
        # is held (the reader task delivers it, then reads), or there is no connection.
        self._hungry += 1
        self.client._hungry += 1
        fed = False
        try:
            item = await self._receive.receive()
            fed = not isinstance(item, ConnectionLost)  # a batch: _fed() counted it
            return item
        except trio.EndOfChannel:
            raise StopAsyncIteration from None
        finally:
            if not fed:
                self._fed()

    async def events(self) -> AsyncIterator[Envelope[Event]]:
        """Every envelope, one at a time (gaps are logged and skipped)."""
        async for batch in self:
            if batch.gap is not None:
                logger.warning("subscription %d: events %d..%d are lost", self.id, *batch.gap)
            for envelope in batch.events:
                yield envelope

    def _offer(self, batch: Batch) -> bool:
        """Queue ``batch`` if the channel has room; False when it is full (the reader waits)."""
        try:
            self._send.send_nowait(batch)
        except trio.WouldBlock:
            return False
        except trio.ClosedResourceError:
            return True  # the application left the subscription: nobody wants it
        if batch.events:
            self.last_seq = batch.events[-1].seq
        if self._hungry:
            self._fed()
        return True

    async def _deliver(self, batch: Batch) -> None:
        """Queue ``batch``, waiting for room: the application is behind."""
        if batch.events:
            self.last_seq = batch.events[-1].seq
        with suppress(trio.ClosedResourceError):  # it left the subscription meanwhile
            await self._send.send(batch)
            if self._hungry:
                self._fed()

    def _fed(self) -> None:
        """One waiting task has its batch (or stopped waiting): nobody need read for it."""
        self._hungry -= 1
        self.client._hungry -= 1

    def _end(self, error: ConnectionLost | None) -> None:
        if error is not None:
            with suppress(trio.WouldBlock, trio.ClosedResourceError):
                self._send.send_nowait(error)
        self._send.close()


class Client(Commands):
    """A connection to the daemon; make one with :func:`connect`."""

    def __init__(
        self,
        path: Path,
        *,
        client: str,
        role: Role,
        catalog: Catalog,
        reconnect: bool,
    ) -> None:
        self.path = path
        self.name = client
        self.role = role
        self.catalog = catalog
        self.reconnect = reconnect
        self.welcome: Welcome | None = None
        self.errors: list[Error] = []  # non-fatal errors the daemon reported
        self._stream: trio.SocketStream | None = None
        self._encoder = Encoder()
        self._frames: list[_Queued] = []
        self._group: list[Outgoing[Event]] | None = None  # the run at the tail of _frames
        self._pending_publishes = 0
        self._publishable: set[type] = set()  # the catalog accepted them (it only grows)
        self._wake_writer = trio.Event()
        self._room = trio.Event()
        self._ids = itertools.count(1)
        self._replies: dict[int, tuple[trio.Event, list[Reply]]] = {}
        self._pongs: dict[int, trio.Event] = {}
        self._subs: dict[int, ClientSubscription] = {}
        self._inbox: Inbox | None = None  # the connection's incoming side, while it is served
        self._hungry = 0  # tasks in a subscription's __anext__ that wait for another's read
        self._sub_errors: dict[int, Error] = {}
        self._lost: ConnectionLost | None = None
        self._closing = False
        self._connected = trio.Event()
        self._state_changed = trio.Event()
        self._reconnects = 0
        self._last_lost: ConnectionLost | None = None

    @property
    def limits(self) -> Limits:
        return self.welcome.limits if self.welcome is not None else Limits()

    def statistics(self) -> ClientStatistics:
        """Whether the daemon is reachable now, and how often it was lost (for a UI to show)."""
        return ClientStatistics(
            connected=self._connected.is_set(),
            reconnects=self._reconnects,
            last_lost=str(self._last_lost) if self._last_lost is not None else None,
            subscriptions=len(self._subs),
        )

    async def wait_connection_change(self) -> ClientStatistics:
        """Return at the next loss or re-establishment of the connection (``reconnect=True``)."""
        await self._state_changed.wait()
        return self.statistics()

    def _changed(self) -> None:
        self._state_changed.set()
        self._state_changed = trio.Event()

    # -- connection life ---------------------------------------------------------

    async def _open(self) -> trio.SocketStream:
        """Connect and say hello: :class:`DaemonNotRunning` or :class:`ConnectionLost` if not."""
        path = os.fspath(self.path)
        deadline = trio.current_time() + 2.0  # for a full listen queue
        while True:  # without blocking: Trio's connect takes EAGAIN (a full queue) for EINPROGRESS
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.setblocking(False)
                sock.connect(path)  # a Unix socket connects at once or not at all
                break
            except OSError as exc:
                sock.close()
                if not isinstance(exc, BlockingIOError) or trio.current_time() >= deadline:
                    raise connect_error(path, exc) from exc
                await trio.sleep(0.01)  # a full listen queue drains fast
        stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
        try:  # not a byte, the hello included, to a server run by another uid (not root)
            if (refusal := untrusted_server(stream.socket, path)) is not None:
                raise ConnectionLost("forbidden", refusal)
            return await self._hello(stream)
        except BaseException as exc:
            await trio.aclose_forcefully(stream)
            if isinstance(exc, trio.BrokenResourceError | trio.ClosedResourceError | ProtocolError):
                raise ConnectionLost("closed", f"the connection broke at hello: {exc}") from exc
            raise

    async def _hello(self, stream: trio.SocketStream) -> trio.SocketStream:
        decoder = server_frame_decoder(self.catalog)
        hello = Hello(protocol=PROTOCOL_VERSION, client=self.name, role=self.role)
        await stream.send_all(encode_frame(hello))
        while (frame := decoder.next_frame()) is None:
            data = await stream.receive_some(RECEIVE)
            if not data:
                raise ConnectionLost("closed", "the daemon closed the connection at hello")
            decoder.feed(data)
        if isinstance(frame, Error):
            raise ConnectionLost(frame.code, frame.message)
        if not isinstance(frame, Welcome):
            raise ConnectionLost("bad_handshake", f"expected welcome, got {type(frame).__name__}")
        self.welcome = frame
        self._encoder = Encoder(max_frame=frame.limits.max_frame)
        self._decoder = server_frame_decoder(self.catalog, max_frame=frame.limits.max_frame)
        for leftover in decoder:
            self._handle(leftover)
        return stream

    async def _run(self, stream: trio.SocketStream, task_status: trio.TaskStatus[None]) -> None:
        """Serve one connection, and with ``reconnect`` its successors."""
        backoff = 0.1
        first = True
        while True:
            self._stream = stream
            self._lost = None
            self._connected.set()
            if first:
                task_status.started()
                first = False
            try:
                lost = await self._serve(stream)
            finally:  # cancelled too: the socket is closed, not left to the collector
                self._connected = trio.Event()
                await trio.aclose_forcefully(stream)
            self._last_lost = lost
            self._changed()
            if self._closing or not self.reconnect or lost.reason in (BYE, "forbidden"):
                self._fail_everything(lost)
                return
            logger.info("connection lost (%s); reconnecting", lost)  # wait_connection_change
            while True:
                await trio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                try:
                    stream = await self._open()
                except (OSError, ConnectionLost) as exc:  # a stranger at the path: say so loudly
                    loud = isinstance(exc, ConnectionLost) and exc.reason == "forbidden"
                    (logger.warning if loud else logger.info)("reconnect failed: %s", exc)
                    continue
                break
            backoff = 0.1
            self._reconnects += 1
            self._resubscribe()
            self._connected.set()  # before the loop sets it again: say so now, in order
            self._changed()

    def _resubscribe(self) -> None:
        # Queued ahead of anything else: each resumes where its iterator stopped.
        frames: list[_Queued] = []
        for sub in self._subs.values():
            since = sub.last_seq if sub.last_seq is not None else sub.frame.since_seq
            frames.append(msgspec.structs.replace(sub.frame, since_seq=since))
        self._frames[:0] = frames
        self._wake_writer.set()

    async def _serve(self, stream: trio.SocketStream) -> ConnectionLost:
        inbox = Inbox(
            stream,
            self._decoder,
            subs=self._subs,
            handle=self._handle,
            needed=self._reader_needed,
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._writer, stream)
            self._inbox = inbox
            try:
                lost = await inbox.run()
            finally:
                self._inbox = None
            nursery.cancel_scope.cancel()
        self._lost = lost
        for event, _ in self._replies.values():
            event.set()
        for pong in self._pongs.values():
            pong.set()
        self._room.set()
        return lost

    def _fail_everything(self, lost: ConnectionLost) -> None:
        self._lost = lost
        for sub in self._subs.values():
            sub._end(None if lost.reason == BYE else lost)
        self._subs.clear()

    # -- reading -----------------------------------------------------------------

    def _reader_needed(self) -> bool:
        """Whether a task waits for a frame that no iterator's read is sure to bring."""
        return bool(self._hungry or self._pongs or self._replies or self._closing)

    def _nudge(self) -> None:
        if self._inbox is not None:
            self._inbox.nudge()

    def _handle(self, frame: object) -> ConnectionLost | None:
        if isinstance(frame, Reply):
            waiter = self._replies.get(frame.id)
            if waiter is not None:
                waiter[1].append(frame)
                waiter[0].set()
        elif isinstance(frame, Pong):
            pong = self._pongs.pop(frame.nonce, None)
            if pong is not None:
                pong.set()
        elif isinstance(frame, Error):
            if frame.fatal:
                return ConnectionLost(frame.code, frame.message)
            if frame.ref is not None and frame.ref in self._subs:
                self._sub_errors[frame.ref] = frame
            self.errors.append(frame)
            logger.warning("daemon error %s: %s", frame.code, frame.message)
        elif isinstance(frame, Goodbye):
            return ConnectionLost(frame.reason, "the daemon said goodbye", frame.resume_seq)
        return None

    # -- writing -----------------------------------------------------------------

    async def _writer(self, stream: trio.SocketStream) -> None:
        # It waits on an empty queue only, so only what makes it non-empty need wake it.
        while True:
            if not self._frames:
                self._wake_writer = trio.Event()
                await self._wake_writer.wait()
                continue
            frames, self._frames = self._frames, []
            self._group = None
            out = bytearray()
            published = 0
            for item in frames:
                if isinstance(item, list):
                    published += len(item)
                    self._encode_publish(item, out)
                else:
                    self._encoder.encode_into(item, out)
            self._pending_publishes -= published
            self._room.set()
            try:  # not a checkpoint when the socket takes it all: the wait above is one
                await send_eagerly(stream, out)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return

    def _encode_publish(self, group: list[Outgoing[Event]], out: bytearray) -> None:
        if not group:
            return
        try:
            self._encoder.encode_into(Publish(events=group), out)
        except ProtocolError:
            if len(group) == 1:
                logger.error("event too large to publish, dropped: %r", type(group[0].event))
                return
            half = len(group) // 2
            self._encode_publish(group[:half], out)
            self._encode_publish(group[half:], out)

    def _push(self, item: Frame) -> None:
        self._check_open()
        self._frames.append(item)
        self._group = None  # publishes after it go in a frame of their own
        self._wake_writer.set()

    def _check_open(self) -> None:
        if self._closing:
            raise trio.ClosedResourceError("the client is closed")
        if self._lost is not None and not self.reconnect:
            raise self._lost

    # -- the public API ----------------------------------------------------------

    def publish_nowait(
        self,
        event: Event,
        *,
        session_id: str | None = None,
        run_id: str | None = None,
        agent_id: str | None = None,
    ) -> None:
        """Queue ``event``; raises :class:`trio.WouldBlock` when the queue is full."""
        if type(event) not in self._publishable:
            self.catalog.check(event)  # UnknownEventType for a class it lacks
            self._publishable.add(type(event))
        if self._pending_publishes >= _PUBLISH_QUEUE:
            raise trio.WouldBlock
        self._check_open()
        self._pending_publishes += 1
        outgoing = Outgoing(event=event, session_id=session_id, run_id=run_id, agent_id=agent_id)
        if (group := self._group) is None:  # the first since the writer took the queue
            self._group = group = []
            self._frames.append(group)
            self._wake_writer.set()
        group.append(outgoing)

    async def publish(
        self,
        event: Event,
        *,
        session_id: str | None = None,
        run_id: str | None = None,
        agent_id: str | None = None,
        ack: bool = False,
    ) -> Acked | None:
        """Queue ``event`` for the next ``publish`` frame, waiting while the queue is full.

        Only a full queue makes it wait (and let the writer run); otherwise it
        is a cancellation point but not a scheduling point, so a publisher in
        a tight loop fills frames instead of paying a task switch per event.
        ``ack=True`` then waits for :meth:`acknowledge`: the event (and every
        one before it) is in the daemon's journal, or :class:`NotJournaled`.
        """
        if (  # the hot path: publish_nowait inlined, for the common case only
            (group := self._group) is not None
            and type(event) in self._publishable
            and self._pending_publishes < _PUBLISH_QUEUE
            and not self._closing
            and self._lost is None
        ):
            self._pending_publishes += 1
            group.append(
                Outgoing(event=event, session_id=session_id, run_id=run_id, agent_id=agent_id)
            )
        else:
            ids = {"session_id": session_id, "run_id": run_id, "agent_id": agent_id}
            while True:
                try:
                    self.publish_nowait(event, **ids)
                    break
                except trio.WouldBlock:
                    self._room = trio.Event()
                    await self._room.wait()
        if ack:
            return await self.acknowledge()
        await _checkpoint_if_cancelled()
        return None

    async def acknowledge(self) -> Acked:
        """Wait until every event this connection has published is in the daemon's journal.

        A ``publish`` with ``ack`` and no events, like JetStream's PubAck
        (docs/journal.md): :class:`NotJournaled` if some are not (lost, or the
        disk fails now); :class:`RequestFailed` if the daemon refused one.
        """
        refused = len(self.errors)
        result = await self._ask(lambda ack: Publish(events=[], ack=ack))
        for frame in self.errors[refused:]:  # error frames come before the reply
            if frame.ref is None and frame.code in ("invalid_event", "unknown_sdk", "forbidden"):
                raise RequestFailed(frame.code, frame.message)
        return Acked(result["first_seq"], result["last_seq"], result["journaled"])

    async def send_frame(self, frame: Frame) -> None:
        """Queue any client frame (after the publishes queued before it)."""
        self._push(frame)
        await trio.lowlevel.checkpoint()

    async def flush(self) -> None:
        """Return once everything queued was written and the daemon has processed it."""
        await self.ping()

    async def ping(self) -> None:
        """A round trip: every frame sent before it has been handled by the daemon."""
        nonce = next(self._ids)
        pong = trio.Event()
        self._pongs[nonce] = pong
        self._push(Ping(nonce=nonce))
        self._nudge()
        await pong.wait()
        if nonce in self._pongs:  # woken by a lost connection, not by the pong
            del self._pongs[nonce]
            self._check_open()
            raise self._lost or ConnectionLost("closed")

    async def request(self, command: Command) -> Any:
        """Send a command and return its result; :class:`RequestFailed` on an error reply."""
        return await self._ask(lambda request_id: Request(id=request_id, command=command))  # type: ignore[arg-type]

    async def _ask(self, frame: Callable[[int], Frame]) -> Any:
        """Send ``frame(id)`` and return the result of the ``reply`` with that id."""
        request_id = next(self._ids)
        done = trio.Event()
        box: list[Reply] = []
        self._replies[request_id] = (done, box)
        try:
            self._push(frame(request_id))
            self._nudge()
            await done.wait()
        finally:
            del self._replies[request_id]
        if not box:
            raise self._lost or ConnectionLost("closed")
        reply = box[0]
        if not reply.ok:
            error = reply.error or ErrorInfo(code="internal_error", message="")
            kind = NotJournaled if error.code == "not_journaled" else RequestFailed
            raise kind(error.code, error.message)
        return reply.result

    @asynccontextmanager
    async def subscribe(
        self,
        patterns: Sequence[str] = (">",),
        *,
        sessions: Sequence[str] | None = None,
        owned_only: bool = False,
        window_ms: int = 16,
        deltas: Literal["merged", "raw"] = "merged",
        since_seq: int | None = None,
    ) -> AsyncIterator[ClientSubscription]:
        """Subscribe; live once this returns (the daemon has confirmed it in order)."""
        sub_id = next(self._ids)
        frame = Subscribe(
            id=sub_id,
            patterns=tuple(patterns),
            sessions=tuple(sessions) if sessions is not None else None,
            owned_only=owned_only,
            window_ms=window_ms,
            deltas=deltas,
            since_seq=since_seq,
        )
        sub = ClientSubscription(self, sub_id, frame)
        self._subs[sub_id] = sub
        try:
            self._push(frame)
            await self.ping()
            error = self._sub_errors.pop(sub_id, None)
            if error is not None and error.code != "seq_ahead":
                raise SubscribeFailed(error.code, error.message)
            yield sub
        finally:
            if self._subs.pop(sub_id, None) is not None and self._lost is None:
                self._push(Unsubscribe(id=sub_id))
            sub._send.close()

    async def aclose(self) -> None:
        """Say bye and wait (briefly) for the daemon's goodbye."""
        if self._closing:
            return
        if self._lost is None:
            with trio.move_on_after(2.0):
                self._push(Bye())
                self._closing = True
                self._nudge()  # the goodbye must be read, if no iterator reads now
                while self._lost is None:
                    self._room = trio.Event()
                    await self._room.wait()
        self._closing = True


@asynccontextmanager
async def connect(
    path: str | os.PathLike[str] | None = None,
    *,
    client: str = f"busd-python/{__version__}",
    role: Role = "frontend",
    catalog: Catalog | None = None,
    reconnect: bool = False,
) -> AsyncIterator[Client]:
    """Connect to the daemon at ``path`` (``--socket``, ``$BUSD_SOCKET``, default).

    :raises DaemonNotRunning: nobody listens there.
    :raises ConnectionLost: the daemon refused the handshake.
    """
    resolved = resolve_socket_path(path)
    instance = Client(
        resolved,
        client=client,
        role=role,
        catalog=catalog if catalog is not None else Catalog(),
        reconnect=reconnect,
    )
    stream = await instance._open()
    raised: BaseException | None = None
    cancelled = False
    async with trio.open_nursery() as nursery:
        await nursery.start(instance._run, stream)
        try:
            yield instance
        except BaseException as exc:
            if isinstance(exc, trio.Cancelled):
                cancelled = True
                raise  # Trio's own: the nursery must see it
            raised = exc  # re-raised below, not wrapped in the nursery's group
        finally:
            if not cancelled:  # cancelled, our reader and writer are too: just close
                with trio.CancelScope(shield=True):
                    await instance.aclose()
            nursery.cancel_scope.cancel()
    if raised is not None:
        raise raised
