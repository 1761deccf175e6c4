"""The Trio client library frontends and agents use to talk to the daemon.

    async with busd.connect(client="my-ui") as client:
        async with client.subscribe(["stream.>"], window_ms=16) as sub:
            async for batch in sub:
                for envelope in batch.events:
                    ...
        await client.publish(TextDelta(message_id="m1", text="hi"), session_id="s1")
        status = await client.request(Status())

Publishes are queued and the writer sends everything queued so far as one
``publish`` frame (the daemon still validates and sequences each event on
its own), so a fast publisher costs one syscall per burst, not per event.
With ``reconnect=True`` a lost connection is re-established with backoff and
every live subscription resumes from the last ``seq`` it delivered, so the
iterator carries on without a gap (or reports one, if the daemon no longer
holds the events).

Background tasks (reader, writer, reconnection) live in the nursery of the
``connect`` context manager: nothing outlives it. A task waiting in a
subscription's iterator reads the socket itself while nobody else does,
which saves a task switch per batch (``reading.py`` says how).
"""

from .connection import Client, ClientSubscription, connect
from .errors import (
    Acked,
    Batch,
    ClientStatistics,
    ConnectionLost,
    DaemonNotRunning,
    NotJournaled,
    RequestFailed,
    SubscribeFailed,
)

__all__ = [
    "Acked",
    "Batch",
    "Client",
    "ClientStatistics",
    "ClientSubscription",
    "ConnectionLost",
    "DaemonNotRunning",
    "NotJournaled",
    "RequestFailed",
    "SubscribeFailed",
    "connect",
]
