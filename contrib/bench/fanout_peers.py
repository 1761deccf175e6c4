"""The processes of the fanout benchmark: one publisher or subscriber of one system each.

Started by ``bench_fanout.py``, one process per role, never by hand:

    python fanout_peers.py sub SYSTEM ADDRESS --events N [--window-ms W] [--latency]
    python fanout_peers.py pub SYSTEM ADDRESS --events N [--rate R]
    python fanout_peers.py forwarder SOCKET
    python fanout_peers.py lean SOCKET
    python fanout_peers.py idle SOCKET --clients 100

SYSTEM is ``busd``, ``busd-lean``, ``redis``, ``nats``, ``nats-js`` or
``forwarder`` (``nats-js``: a NATS server whose JetStream stores every
event on disk, as busd's journal does, its subscribers NATS's;
``busd-lean``: the ``lean`` server, busd's protocol with only what
delivery needs, its clients busd's). Every process
speaks JSON lines on stdout: ``{"ready": true}`` once it is connected (and,
for a subscriber, subscribed: the server has confirmed it), then one result.
A publisher waits for a line on stdin before its first send, so the
orchestrator can start the clock only once every subscriber is live.

Every system carries the same event: a ``TextDelta`` whose 100-character text
starts with the event's index and the publisher's ``time.monotonic_ns()``
at send time. ``CLOCK_MONOTONIC`` is system-wide on Linux, so a subscriber
in another process computes publish-to-receive latency from it, and checks
from the index that nothing was lost or reordered. The peers carry it as
msgpack bytes and their subscribers decode it back into a ``TextDelta`` with
msgspec, so every subscriber ends with the same typed object busd delivers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import struct
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import msgspec
import trio

from busd.core.events import TextDelta

CHANNEL = "bench.fanout"  # the Redis channel and the NATS subject
STREAM = "BENCH"  # the JetStream stream that stores CHANNEL (nats-js)
STORED_TIMEOUT = 60.0  # seconds a nats-js publisher waits for the stream to hold its events
EVENT_TYPE = "stream.text.delta"
SESSION = "bench"
MESSAGE_ID = "msg_01JB7X"
TEXT_LENGTH = 100
IDLE_TIMEOUT = 10.0  # a subscriber that hears nothing for this long reports what it has
# Before the first event, longer: the orchestrator starts the publisher only once every
# subscriber is ready, and 64 of them take a while to start on 2 cores.
FIRST_TIMEOUT = 180.0
TICK = 0.001  # a paced publisher wakes every millisecond and sends what is due
PIPELINE = 1_000  # Redis publishes per pipeline round trip
WRITE_BUFFER = 64 << 10  # bytes the forwarder's publisher gathers per write
LEAN_FRAME_EVENTS = 2_048  # the lean server's events per frame: well under busd's max_frame

_FILLER = (
    "The agent streams its answer one small piece at a time, and every frontend shows it. " * 2
)
_PREFIX = struct.Struct(">I")


def make_text(index: int, sent_ns: int) -> str:
    """The event's text: ``index``, the send time, then filler up to 100 characters."""
    head = f"{index:09d} {sent_ns:019d} "
    return head + _FILLER[: TEXT_LENGTH - len(head)]


def make_event(index: int, sent_ns: int) -> TextDelta:
    return TextDelta(message_id=MESSAGE_ID, text=make_text(index, sent_ns))


def say(**fields: Any) -> None:
    """One JSON line to the orchestrator."""
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def cpu(since: float) -> float:
    """This process's CPU seconds (user and system, all threads) since ``since``."""
    return time.process_time() - since


def wait_for_go() -> None:
    if not sys.stdin.readline():
        raise SystemExit("the orchestrator went away before the start")


class Tally:
    """What a subscriber received: count, order, receive times and (optionally) latencies."""

    __slots__ = ("count", "cpu_start", "events", "first_ns", "last_ns", "latencies", "ordered")

    def __init__(self, events: int, *, latency: bool) -> None:
        self.events = events
        self.count = 0
        self.ordered = True
        self.first_ns = 0
        self.last_ns = 0
        self.latencies: list[int] | None = [] if latency else None
        self.cpu_start = 0.0

    def ready(self) -> None:
        """Subscribed: tell the orchestrator, and start counting this process's CPU time."""
        self.cpu_start = time.process_time()
        say(ready=True)

    @property
    def done(self) -> bool:
        return self.count >= self.events

    @property
    def timeout(self) -> float:
        """How long to wait for the next event before giving up on the rest."""
        return IDLE_TIMEOUT if self.count else FIRST_TIMEOUT

    def observe(self, text: str, now_ns: int) -> None:
        """One event received at ``now_ns``: its index must be the next one."""
        if int(text[:9]) != self.count:
            self.ordered = False
        if self.count == 0:
            self.first_ns = now_ns
        self.count += 1
        self.last_ns = now_ns
        if self.latencies is not None:
            self.latencies.append(now_ns - int(text[10:29]))

    def report(self) -> None:
        say(
            cpu_s=time.process_time() - self.cpu_start,
            count=self.count,
            ordered=self.ordered,
            first_ns=self.first_ns,
            last_ns=self.last_ns,
            latencies_ns=self.latencies,
        )


async def paced(
    events: int,
    rate: float,
    send: Callable[[int], Awaitable[None]],
    sleep: Callable[[float], Awaitable[object]],
) -> None:
    """Send ``events`` at ``rate`` per second on a monotonic schedule, waking every tick.

    Each wake-up sends every event that is due by then (about 5 at 5,000/s),
    each stamped when it is handed to the client library.
    """
    start = time.monotonic_ns()
    period = 1e9 / rate
    index = 0
    while index < events:
        due = min(events, int((time.monotonic_ns() - start) / period) + 1)
        while index < due:
            await send(index)
            index += 1
        await sleep(TICK)


# -- busd --------------------------------------------------------------------


def busd_batch(tally: Tally, batch: Any, last_seq: int, now_ns: int) -> int:
    """A busd ``Batch`` received at ``now_ns``, checked for order; returns the last seq seen."""
    if batch.gap is not None:
        tally.ordered = False
    for envelope in batch.events:
        if envelope.seq <= last_seq:
            tally.ordered = False
        last_seq = envelope.seq
        event = envelope.event
        assert isinstance(event, TextDelta)
        tally.observe(event.text, now_ns)
    return last_seq


async def busd_subscriber(address: str, events: int, window_ms: int, latency: bool) -> None:
    from busd.client import connect

    tally = Tally(events, latency=latency)
    last_seq = 0
    async with (
        connect(address, client="bench-subscriber", role="frontend") as client,
        client.subscribe([EVENT_TYPE], window_ms=window_ms, deltas="raw") as subscription,
        trio.open_nursery() as nursery,
    ):
        tally.ready()
        # A watchdog, as the NATS subscriber has: no cancel scope per batch.
        nursery.start_soon(watchdog, tally, nursery.cancel_scope)
        while not tally.done:
            batch = await anext(subscription, None)
            if batch is None:
                break
            last_seq = busd_batch(tally, batch, last_seq, time.monotonic_ns())
        nursery.cancel_scope.cancel()
    tally.report()


async def watchdog(tally: Tally, scope: trio.CancelScope) -> None:
    """Cancel ``scope`` once no event came for ``tally.timeout`` seconds."""
    seen, quiet = -1, 0.0
    while True:
        if tally.count != seen:
            seen, quiet = tally.count, 0.0
        elif quiet >= tally.timeout:
            scope.cancel()
            return
        await trio.sleep(1.0)
        quiet += 1.0


async def busd_publisher(address: str, events: int, rate: float | None) -> None:
    from busd.client import connect

    async with connect(address, client="bench-publisher", role="agent") as client:
        publish = client.publish
        await client.flush()
        say(ready=True)
        await trio.to_thread.run_sync(wait_for_go)
        cpu_start = time.process_time()
        start = time.monotonic_ns()
        if rate is None:
            for index in range(events):
                await publish(make_event(index, time.monotonic_ns()), session_id=SESSION)
        else:

            async def send(index: int) -> None:
                await publish(make_event(index, time.monotonic_ns()), session_id=SESSION)

            await paced(events, rate, send, trio.sleep)
        sent = time.monotonic_ns()
        await client.flush()
        say(start_ns=start, sent_ns=sent, flushed_ns=time.monotonic_ns(), cpu_s=cpu(cpu_start))


# -- Redis pub/sub -----------------------------------------------------------


def redis_subscriber(address: str, events: int, latency: bool) -> None:
    import redis  # type: ignore[import-not-found, unused-ignore]

    decode = msgspec.msgpack.Decoder(TextDelta).decode
    tally = Tally(events, latency=latency)
    connection = redis.Redis(unix_socket_path=address)
    pubsub = connection.pubsub()  # type: ignore[no-untyped-call, unused-ignore]
    pubsub.subscribe(CHANNEL)
    confirmed = pubsub.get_message(timeout=10.0)
    if confirmed is None or confirmed["type"] != "subscribe":
        raise SystemExit(f"redis did not confirm the subscription: {confirmed!r}")
    tally.ready()
    get_message = pubsub.get_message
    while not tally.done:
        message = get_message(timeout=tally.timeout)
        if message is None:
            break
        tally.observe(decode(message["data"]).text, time.monotonic_ns())
    tally.report()
    pubsub.close()
    connection.close()


def redis_publisher(address: str, events: int, rate: float | None) -> None:
    import redis  # type: ignore[import-not-found, unused-ignore]

    encode = msgspec.msgpack.Encoder().encode
    connection = redis.Redis(unix_socket_path=address)
    connection.ping()
    say(ready=True)
    wait_for_go()
    cpu_start = time.process_time()
    start = time.monotonic_ns()
    if rate is None:
        pipeline = connection.pipeline(transaction=False)
        for index in range(events):
            pipeline.publish(CHANNEL, encode(make_event(index, time.monotonic_ns())))
            if index % PIPELINE == PIPELINE - 1:
                pipeline.execute()
        pipeline.execute()
    else:
        period = 1e9 / rate
        index = 0
        while index < events:
            due = min(events, int((time.monotonic_ns() - start) / period) + 1)
            while index < due:
                connection.publish(CHANNEL, encode(make_event(index, time.monotonic_ns())))
                index += 1
            time.sleep(TICK)
    sent = time.monotonic_ns()
    say(start_ns=start, sent_ns=sent, flushed_ns=sent, cpu_s=cpu(cpu_start))
    connection.close()


# -- NATS --------------------------------------------------------------------


async def nats_subscriber(address: str, events: int, latency: bool) -> None:
    import nats  # type: ignore[import-not-found, unused-ignore]

    decode = msgspec.msgpack.Decoder(TextDelta).decode
    tally = Tally(events, latency=latency)
    finished = asyncio.Event()

    async def received(message: Any) -> None:
        tally.observe(decode(message.data).text, time.monotonic_ns())
        if tally.done:
            finished.set()

    client = await nats.connect(address, allow_reconnect=False)
    await client.subscribe(
        CHANNEL, cb=received, pending_msgs_limit=10 * events, pending_bytes_limit=1 << 30
    )
    await client.flush()  # a round trip: the server has the subscription
    tally.ready()
    seen, quiet = -1, 0.0  # seconds without a new event
    while not finished.is_set():
        if tally.count != seen:
            seen, quiet = tally.count, 0.0
        elif quiet >= tally.timeout:
            break
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(finished.wait(), IDLE_TIMEOUT)
        quiet += IDLE_TIMEOUT
    tally.report()
    await client.close()


async def nats_publisher(
    address: str, events: int, rate: float | None, *, jetstream: bool = False
) -> None:
    """NATS's publisher; with ``jetstream``, the server also stores every event in a stream.

    It publishes the same way (core NATS, no per-message ack: like busd's
    default publish, acknowledged by nothing but the journal's watermark),
    and after its flush waits until the stream holds every event, so a
    round counts only if the server stored them all (``stored``).
    """
    import nats  # type: ignore[import-not-found, unused-ignore]

    encode = msgspec.msgpack.Encoder().encode
    client = await nats.connect(address, allow_reconnect=False)
    stream = None
    stored_before = 0
    if jetstream:
        from nats.js.api import StorageType, StreamConfig  # type: ignore[import-not-found, unused-ignore]

        stream = client.jetstream()
        config = StreamConfig(name=STREAM, subjects=[CHANNEL], storage=StorageType.FILE)
        info = await stream.add_stream(config)  # the same config again: a no-op
        stored_before = info.state.last_seq
    await client.flush()
    say(ready=True)
    await asyncio.get_running_loop().run_in_executor(None, wait_for_go)
    publish = client.publish
    cpu_start = time.process_time()
    start = time.monotonic_ns()
    if rate is None:
        for index in range(events):
            await publish(CHANNEL, encode(make_event(index, time.monotonic_ns())))
    else:

        async def send(index: int) -> None:
            await publish(CHANNEL, encode(make_event(index, time.monotonic_ns())))

        await paced(events, rate, send, asyncio.sleep)
    sent = time.monotonic_ns()
    await client.flush()
    flushed = time.monotonic_ns()
    cpu_s = cpu(cpu_start)  # the publishing; not the polling below
    stored = None
    if stream is not None:
        deadline = time.monotonic() + STORED_TIMEOUT
        while True:
            stored = (await stream.stream_info(STREAM)).state.last_seq - stored_before
            if stored >= events or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.01)
    say(start_ns=start, sent_ns=sent, flushed_ns=flushed, cpu_s=cpu_s, stored=stored)
    await client.close()


# -- the bare Python forwarder -----------------------------------------------


class _ForwarderConnection(asyncio.Protocol):
    """First byte ``P``: a publisher, whose bytes go to every ``S`` (subscriber) as they come.

    It copies whole reads without looking inside: the length-prefixed frames
    arrive intact because a byte stream keeps their order. Nothing a Python
    forwarder does per event can cost less than that.
    """

    def __init__(self, subscribers: list[asyncio.Transport]) -> None:
        self.subscribers = subscribers
        self.transport: asyncio.Transport | None = None
        self.role = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if not self.role:
            self.role, data = data[:1], data[1:]
            if self.role == b"S":
                assert self.transport is not None
                self.subscribers.append(self.transport)
                self.transport.write(b"!")
        if self.role == b"P" and data:
            for subscriber in self.subscribers:
                subscriber.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport in self.subscribers:
            self.subscribers.remove(self.transport)


async def forwarder(path: str) -> None:
    subscribers: list[asyncio.Transport] = []
    loop = asyncio.get_running_loop()
    server = await loop.create_unix_server(lambda: _ForwarderConnection(subscribers), path)
    say(ready=True)
    async with server:
        await server.serve_forever()


def _unix_connect(path: str, role: bytes) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    sock.sendall(role)
    return sock


def forwarder_subscriber(address: str, events: int, latency: bool) -> None:
    decode = msgspec.msgpack.Decoder(TextDelta).decode
    unpack = _PREFIX.unpack_from
    tally = Tally(events, latency=latency)
    sock = _unix_connect(address, b"S")
    if sock.recv(1) != b"!":
        raise SystemExit("the forwarder did not confirm the subscription")
    tally.ready()
    buffer = b""
    while not tally.done:
        sock.settimeout(tally.timeout)
        try:
            data = sock.recv(1 << 18)
        except TimeoutError:
            break
        if not data:
            break
        now = time.monotonic_ns()
        buffer = buffer + data if buffer else data
        view = memoryview(buffer)
        position, size = 0, len(buffer)
        while size - position >= 4:
            end = position + 4 + unpack(buffer, position)[0]
            if end > size:
                break
            tally.observe(decode(view[position + 4 : end]).text, now)
            position = end
        view.release()
        buffer = buffer[position:]
    tally.report()
    sock.close()


def forwarder_publisher(address: str, events: int, rate: float | None) -> None:
    encode_into = msgspec.msgpack.Encoder().encode_into
    pack_into = _PREFIX.pack_into
    sock = _unix_connect(address, b"P")
    say(ready=True)
    wait_for_go()
    out = bytearray()

    def frame(index: int) -> None:
        start = len(out)
        encode_into(make_event(index, time.monotonic_ns()), out, start + 4)
        pack_into(out, start, len(out) - start - 4)

    cpu_start = time.process_time()
    start = time.monotonic_ns()
    if rate is None:
        for index in range(events):
            frame(index)
            if len(out) >= WRITE_BUFFER:
                sock.sendall(out)
                out.clear()
        sock.sendall(out)
    else:
        period = 1e9 / rate
        index = 0
        while index < events:
            due = min(events, int((time.monotonic_ns() - start) / period) + 1)
            while index < due:
                frame(index)
                sock.sendall(out)
                out.clear()
                index += 1
            time.sleep(TICK)
    sent = time.monotonic_ns()
    say(start_ns=start, sent_ns=sent, flushed_ns=sent, cpu_s=cpu(cpu_start))
    sock.close()


# -- a lean busd server: the floor of a daemon in Python and Trio -----------


class _LeanConnection:
    """One client of the lean server: its stream, and its writes kept whole and in order."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.fd = stream.socket.fileno()
        self.subs: set[int] = set()
        self.busy = False  # a write is waiting for room: later ones queue behind it
        self.queued: list[bytes] = []

    async def send(self, head: bytes, body: bytes = b"") -> None:
        """Write ``head`` then ``body`` now if the socket takes them, else wait (backpressure)."""
        if self.busy:
            self.queued.append(head + body)
            return
        try:
            written = os.writev(self.fd, (head, body)) if body else os.write(self.fd, head)
        except BlockingIOError:
            written = 0
        if written == len(head) + len(body):
            return
        self.busy = True
        try:
            await self.stream.send_all((head + body)[written:])
            while self.queued:
                rest, self.queued = b"".join(self.queued), []
                await self.stream.send_all(rest)
        finally:
            self.busy = False


@dataclass(frozen=True)
class LeanLoad:
    """Busy CPU the lean server adds to a burst: where a daemon's own work would land.

    ``before_us`` of it after the events are encoded, before the writes;
    ``after_us`` after the last write; each on one ``publish`` frame in
    ``every`` (1: all of them). The same average as one spread over every
    burst or as a lump on a few tells what a daemon's p99 follows
    (docs/performance.md, "Where the daemon's CPU lands").
    """

    before_us: int = 0
    after_us: int = 0
    every: int = 1

    def __post_init__(self) -> None:
        if self.before_us < 0 or self.after_us < 0 or self.every < 1:
            raise ValueError(f"not a load: {self}")

    def applies(self, frame: int) -> bool:
        """Whether the ``frame``-th ``publish`` frame (from 1) gets the load."""
        return frame % self.every == 0 and bool(self.before_us or self.after_us)

    def __str__(self) -> str:
        parts = [
            f"{us} µs {at}"
            for us, at in ((self.before_us, "before"), (self.after_us, "after"))
            if us
        ]
        if not parts:
            return "none"
        burst = "every burst" if self.every == 1 else f"1 burst in {self.every}"
        return f"{' and '.join(parts)} the writes, {burst}"


NO_LOAD = LeanLoad()


def _busy(us: int) -> None:
    """Spend ``us`` µs of this thread's CPU (not wall time: preemption does not shorten it)."""
    end = time.thread_time_ns() + us * 1_000
    while time.thread_time_ns() < end:
        pass


async def lean_server(
    path: str,
    *,
    load: LeanLoad = NO_LOAD,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """busd's protocol, and per ``publish`` frame only what delivery needs.

    Decode the frame, give each event a ``seq``, an id and a time, encode
    the envelopes once, and write one ``events`` frame to every
    subscription at once (window 0, raw deltas, every event to every
    subscription: the benchmark subscribes to its one type). No rights, no
    correlation, no replay ring, journal, sessions or accounting: what
    busd's daemon spends beyond this server is what those cost a burst.
    The clients are busd's own. It has no queue per subscriber: a full
    socket holds up the publisher until it drains, so flat out with many
    subscribers it is no ceiling; at a steady rate it is the floor.
    """
    from busd.core.catalog import Catalog
    from busd.core.events import Envelope
    from busd.core.ids import EventIds
    from busd.transport import Receiver
    from busd.wire import (
        PROTOCOL_VERSION,
        Bye,
        Encoder,
        Goodbye,
        Hello,
        Limits,
        Ping,
        Pong,
        Publish,
        Subscribe,
        Unsubscribe,
        Welcome,
        client_frame_decoder,
        encode_envelopes,
        pack_events,
    )

    catalog, encoder, ids = Catalog(), Encoder(), EventIds()
    subscribed: list[_LeanConnection] = []
    head = 0
    clients = 0
    frames = 0  # publish frames: every ``load.every``-th gets the load

    async def serve(stream: trio.SocketStream) -> None:
        nonlocal head, clients, frames
        clients += 1
        me, receiver = _LeanConnection(stream), Receiver(stream)
        decoder = client_frame_decoder(catalog)
        try:
            while True:
                while (frame := decoder.next_frame()) is not None:
                    match frame:
                        case Publish(events=events):
                            now = time.time()
                            envelopes = []
                            made = ids.many(len(events))
                            for outgoing, event_id in zip(events, made, strict=True):
                                head += 1
                                envelopes.append(
                                    Envelope(
                                        seq=head,
                                        ts=now,
                                        event=outgoing.event,
                                        session_id=outgoing.session_id,
                                        source="lean",
                                        id=event_id,
                                    )
                                )
                            raws = encode_envelopes(envelopes)
                            frames += 1
                            loaded = load.applies(frames)
                            if loaded and load.before_us:
                                _busy(load.before_us)
                            for start in range(0, len(raws), LEAN_FRAME_EVENTS):
                                packed = pack_events(raws[start : start + LEAN_FRAME_EVENTS])
                                for peer in tuple(subscribed):
                                    try:
                                        for sub in tuple(peer.subs):
                                            head_bytes = encoder.events_head(sub, packed)
                                            await peer.send(head_bytes, packed)
                                    except (trio.BrokenResourceError, OSError):
                                        if peer in subscribed:  # that subscriber is gone
                                            subscribed.remove(peer)
                            if loaded and load.after_us:
                                _busy(load.after_us)
                        case Hello():
                            welcome = Welcome(
                                server="lean",
                                protocol=PROTOCOL_VERSION,
                                client_id=clients,
                                head_seq=head,
                                limits=Limits(),
                            )
                            await me.send(encoder.encode(welcome))
                        case Subscribe(id=sub):
                            me.subs.add(sub)
                            if me not in subscribed:
                                subscribed.append(me)
                        case Unsubscribe(id=sub):
                            me.subs.discard(sub)
                        case Ping(nonce=nonce):
                            await me.send(encoder.encode(Pong(nonce=nonce)))
                        case Bye():
                            await me.send(encoder.encode(Goodbye(reason="bye", resume_seq=head)))
                            return
                data = await receiver.receive()
                if not data:
                    return
                decoder.feed(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            if me in subscribed:
                subscribed.remove(me)
            await trio.aclose_forcefully(stream)

    listener = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await listener.bind(path)
    listener.listen(256)
    task_status.started()
    say(ready=True)
    await trio.serve_listeners(serve, [trio.SocketListener(listener)])


# -- idle frontends ----------------------------------------------------------


async def idle_frontends(address: str, clients: int) -> None:
    """``clients`` busd connections, each subscribed to everything, doing nothing."""
    from busd.client import connect

    async with contextlib.AsyncExitStack() as stack:
        for number in range(clients):
            client = await stack.enter_async_context(
                connect(address, client=f"bench-idle-{number}", role="frontend")
            )
            await stack.enter_async_context(client.subscribe([">"]))
        say(ready=True)
        await trio.to_thread.run_sync(sys.stdin.readline)


# -- entry point -------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", choices=("sub", "pub", "forwarder", "lean", "idle"))
    parser.add_argument("rest", nargs="+", help="SYSTEM ADDRESS, or SOCKET")
    parser.add_argument("--events", type=int, default=0)
    parser.add_argument("--rate", type=float, default=None, help="events/s (default: flat out)")
    parser.add_argument("--window-ms", type=int, default=16)
    parser.add_argument("--latency", action="store_true", help="report every event's latency")
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--cpu-before-us", type=int, default=0, help="lean: CPU before writes")
    parser.add_argument("--cpu-after-us", type=int, default=0, help="lean: CPU after writes")
    parser.add_argument("--cpu-every", type=int, default=1, help="lean: on 1 frame in N")
    args = parser.parse_args()

    if args.role == "forwarder":
        asyncio.run(forwarder(args.rest[0]))
        return
    if args.role == "lean":
        load = LeanLoad(args.cpu_before_us, args.cpu_after_us, args.cpu_every)
        trio.run(partial(lean_server, args.rest[0], load=load))
        return
    if args.role == "idle":
        trio.run(idle_frontends, args.rest[0], args.clients)
        return
    system, address = args.rest
    if args.role == "sub":
        if system in ("busd", "busd-lean"):
            trio.run(busd_subscriber, address, args.events, args.window_ms, args.latency)
        elif system == "redis":
            redis_subscriber(address, args.events, args.latency)
        elif system in ("nats", "nats-js"):
            asyncio.run(nats_subscriber(address, args.events, args.latency))
        else:
            forwarder_subscriber(address, args.events, args.latency)
    elif system in ("busd", "busd-lean"):
        trio.run(busd_publisher, address, args.events, args.rate)
    elif system == "redis":
        redis_publisher(address, args.events, args.rate)
    elif system in ("nats", "nats-js"):
        jetstream = system == "nats-js"
        asyncio.run(nats_publisher(address, args.events, args.rate, jetstream=jetstream))
    else:
        forwarder_publisher(address, args.events, args.rate)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt, BrokenPipeError):
        main()
