"""The daemon's per-event CPU cost, in process: no sockets, no other processes.

``bench_fanout.py`` measures busd end to end against its peers; on a shared
2-core machine its figures move with the load. This one isolates the part
that busd's own code decides: a ``Daemon`` receives ``publish`` frames
(bytes, decoded as the connection decodes them) and fans every event out to
N subscriptions whose sends encode ``events`` frames exactly as a
connection does, minus the socket write. The peer, run in the same command,
is the floor of the same work: decode the frame, encode each event once,
build N ``events`` frames from the bytes.

    .venv/bin/python contrib/bench/bench_daemon.py                  # 4 subscriptions
    .venv/bin/python contrib/bench/bench_daemon.py --profile out.prof
"""

from __future__ import annotations

import argparse
import cProfile
import time
from collections.abc import Iterator
from typing import Any

import trio

from busd.core.catalog import Catalog
from busd.core.cohorts import SharedBatch
from busd.core.events import Envelope, Event, TextDelta
from busd.daemon.batching import BatchDispatcher
from busd.daemon.hub import Daemon, DaemonConfig, Subscription
from busd.plugins.manager import PluginManager
from busd.wire import (
    ClientFrame,
    Encoder,
    Events,
    FrameDecoder,
    Outgoing,
    Publish,
    client_frame_decoder,
    encode_envelope,
    pack_events,
)

TEXT_LENGTH = 100
_FILLER = "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor " * 2


def make_frames(events: int, per_frame: int) -> list[bytes]:
    """``publish`` frames as the client library writes them (length prefix included)."""
    encoder = Encoder()
    frames = []
    for start in range(0, events, per_frame):
        batch = []
        for index in range(start, min(events, start + per_frame)):
            head = f"{index:09d} {time.monotonic_ns():019d} "
            text = head + _FILLER[: TEXT_LENGTH - len(head)]
            batch.append(Outgoing(event=TextDelta(message_id="m1", text=text), session_id="s1"))
        frames.append(encoder.encode(Publish(events=batch)))
    return frames


def publishes(frames: list[bytes], decoder: FrameDecoder[ClientFrame]) -> Iterator[Publish[Any]]:
    """Each frame's bytes through the decoder, as a connection reads them."""
    for data in frames:
        decoder.feed(data)
        frame = decoder.next_frame()
        assert isinstance(frame, Publish)
        yield frame


async def busd_run(frames: list[bytes], subscribers: int, window: float) -> tuple[float, int]:
    """Seconds of process CPU for the daemon's share, and the events delivered."""
    daemon = Daemon(DaemonConfig(journal=None), plugins=PluginManager(environ={}))
    decoder = client_frame_decoder(daemon.catalog)
    encoder = Encoder()
    delivered = 0

    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.run)
        subs = []
        for sub_id in range(subscribers):

            async def send(batch: list[Envelope[Event]], sub_id: int = sub_id) -> None:
                nonlocal delivered
                seqs = [e.seq for e in batch]
                encoder.encode(Events(sub=sub_id, events=daemon.raws(batch)))
                delivered += len(seqs)
                await trio.lowlevel.checkpoint()

            def send_shared(batch: SharedBatch, sub_id: int = sub_id) -> bool:
                # As a connection does: the array packed once, a head per subscription id.
                nonlocal delivered
                if batch.body is None:
                    batch.body = pack_events(batch.raws)
                batch.heads[sub_id] = encoder.events_head(sub_id, batch.body)
                delivered += len(batch)
                return True

            dispatcher = BatchDispatcher(
                send, window=window, merge_deltas=False, send_shared=send_shared
            )
            sub = Subscription(
                1,
                sub_id,
                ["stream.text.delta"],
                sessions=None,
                owned_only=False,
                dispatcher=dispatcher,
            )
            daemon.add_subscription(sub)
            await nursery.start(dispatcher.run)
            subs.append(sub)
        started = time.process_time()
        for frame in publishes(frames, decoder):
            for outgoing in frame.events:
                daemon.publish_from_client(outgoing, source="bench")
            daemon.settle()  # as a connection does before it reads on
            await trio.lowlevel.checkpoint()
        for sub in subs:
            await daemon.fanout.flush(sub)
        cpu = time.process_time() - started
        nursery.cancel_scope.cancel()
    return cpu, delivered


def floor_run(frames: list[bytes], subscribers: int) -> float:
    """The least any broker with this wire format does: decode, encode once, frame N times."""
    decoder = client_frame_decoder(Catalog())
    encoder = Encoder()
    started = time.process_time()
    seq = 0
    for frame in publishes(frames, decoder):
        raws = []
        for outgoing in frame.events:
            seq += 1
            raws.append(
                encode_envelope(
                    Envelope(
                        seq=seq,
                        ts=time.time(),
                        session_id=outgoing.session_id,
                        event=outgoing.event,
                    )
                )
            )
        for sub_id in range(subscribers):
            encoder.encode(Events(sub=sub_id, events=raws))
    return time.process_time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--subscribers", type=int, default=4)
    parser.add_argument("--window-ms", type=float, default=16)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--profile", help="cProfile the busd runs to this file")
    args = parser.parse_args()
    frames = make_frames(args.events, 256)
    best_busd = best_floor = float("inf")
    profiler = cProfile.Profile() if args.profile else None
    for _ in range(args.repeat):
        if profiler is not None:
            profiler.enable()
        cpu, delivered = trio.run(busd_run, frames, args.subscribers, args.window_ms / 1000)
        if profiler is not None:
            profiler.disable()
        assert delivered == args.events * args.subscribers, delivered
        best_busd = min(best_busd, cpu)
        best_floor = min(best_floor, floor_run(frames, args.subscribers))
    if profiler is not None:
        profiler.dump_stats(args.profile)
    per_busd = best_busd / args.events * 1e6
    per_floor = best_floor / args.events * 1e6
    print(
        f"{args.events:,} events, {args.subscribers} subscriptions, window "
        f"{args.window_ms:g} ms, best of {args.repeat}\n"
        f"busd daemon: {per_busd:.2f} us/event "
        f"({args.events / best_busd:,.0f} events/s of one core)\n"
        f"floor (decode, encode once, frame): {per_floor:.2f} us/event\n"
        f"busd / floor: {per_busd / per_floor:.1f}x"
    )


if __name__ == "__main__":
    main()
