"""One name, one live daemon: a daemon's claim on its name, in a JetStream key-value bucket.

A daemon's name is its subject token and its durable consumer. Two live
daemons with one name would bind the same consumer, each taking a part of
the stream, and each would drop the other's events as its own: both lose
events, and nothing says so. So before it binds the consumer or publishes
anything, a daemon claims its name: the key ``<stream>.<name>`` in the
bucket ``busd-names``, holding who it is (:class:`Holder`).

- **Claim**: ``create`` stores the key only if it holds nothing, atomically
  on the server, so of two daemons starting at once one wins.
- **Keep**: every third of the bucket's TTL the holder renews its claim with
  ``update`` on the revision it last wrote (compare and set). The server
  removes a claim one TTL after its last renewal, so the claim of a daemon
  that died without giving it back (``kill -9``, a lost machine) lapses.
- **Held by another**: the claimant cannot tell a live holder from a dead
  one at a glance, so it watches the key for up to one TTL: renewed means
  alive, and the name is refused (:class:`~busd_nats.errors.NameTaken`);
  gone means dead, and the name is claimed. A daemon restarted after a crash
  thus bridges at most one TTL late; its events wait meanwhile.
- **Lost**: a renewal that finds another holder (this daemon was cut off from
  NATS for longer than the TTL, and another took the name) raises
  :class:`~busd_nats.errors.NameTaken` too. After a reconnect the consumer
  waits for a renewal (:attr:`NameClaim.held`), so it never fetches under a
  name that another daemon may have taken meanwhile.
- **Release**: a daemon that stops deletes its claim, so the next one with
  its name need not wait.

The bucket is made with a TTL of :data:`NAME_TTL` if it is missing; an
existing one is used with its own TTL (make it yourself for another).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable

import msgspec
import nats.errors
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig
from nats.js.kv import KeyValue

from .errors import NameTaken, NatsBridgeError

__all__ = ["NAMES_BUCKET", "NAME_TTL", "Holder", "NameClaim"]

NAMES_BUCKET = "busd-names"
NAME_TTL = 15.0
"""Seconds a claim outlives its holder's last renewal, in a bucket this plugin makes."""

_TROUBLE = (nats.errors.Error, OSError, TimeoutError)
"""The connection's failures: retried, not fatal."""


class Holder(msgspec.Struct, frozen=True):
    """Who claims a name: the value of its key, JSON, for people reading the bucket too."""

    host: str
    socket: str | None
    pid: int
    since: float
    """Unix time the bridge was made."""
    instance: str
    """Random per bridge: tells this bridge's own claim (a renewal whose reply was lost,
    a restart of the service) from another daemon's."""

    @classmethod
    def this_process(cls, socket_path: str | None) -> Holder:
        return cls(
            host=socket.gethostname(),
            socket=socket_path,
            pid=os.getpid(),
            since=time.time(),
            instance=secrets.token_hex(8),
        )

    def describe(self) -> str:
        where = f", socket {self.socket}" if self.socket else ""
        since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.since))
        return f"pid {self.pid} on {self.host}{where}, since {since}"


def _describe(value: bytes | None) -> str:
    try:
        return msgspec.json.decode(value or b"", type=Holder).describe()
    except msgspec.DecodeError:
        return f"a claim busd cannot read: {value!r}"


def _instance(value: bytes | None) -> str | None:
    try:
        return msgspec.json.decode(value or b"", type=Holder).instance
    except msgspec.DecodeError:
        return None


class NameClaim:
    """This daemon's claim on ``name`` in ``stream``: :meth:`acquire`, :meth:`keep`,
    :meth:`release`. Runs on the bridge's asyncio loop."""

    def __init__(
        self,
        stream: str,
        name: str,
        holder: Holder,
        *,
        log: logging.LoggerAdapter[logging.Logger],
        on_trouble: Callable[[BaseException], None],
        retry_max: float = 2.0,
    ) -> None:
        self.stream = stream
        self.name = name
        self.key = f"{stream}.{name}"
        self.holder = holder
        self.held = asyncio.Event()
        """Set while the claim is known to be this daemon's (cleared at a disconnection,
        set again by the renewal after the reconnection)."""
        self._value = msgspec.json.encode(holder)
        self._log = log
        self._on_trouble = on_trouble
        self._retry_max = retry_max
        self._kv: KeyValue | None = None
        self._revision = 0
        self._ttl = NAME_TTL
        self._wake = asyncio.Event()

    # -- claim --------------------------------------------------------------------

    async def acquire(self, js: JetStreamContext) -> None:
        """Return once the name is this daemon's; connection trouble is retried.

        :raises NameTaken: a live daemon holds it (it renewed its claim while we watched).
        :raises NatsBridgeError: the bucket keeps claims for ever (no TTL).
        """
        delay = 0.05
        while True:
            try:
                await self._acquire(js)
                return
            except nats.js.errors.BadRequestError as exc:  # a permission, a bad key
                raise NatsBridgeError(f"cannot claim name {self.name!r}: {exc}") from exc
            except _TROUBLE as exc:
                self._on_trouble(exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, self._retry_max)

    async def _acquire(self, js: JetStreamContext) -> None:
        kv = self._kv = await self._bucket(js)
        loop = asyncio.get_running_loop()
        watched: tuple[int, float] | None = None  # the other's revision, since when
        while True:
            with contextlib.suppress(nats.js.errors.KeyWrongLastSequenceError):
                self._revision = await kv.create(self.key, self._value)
                self.held.set()
                return
            try:
                entry = await kv.get(self.key)
            except nats.js.errors.KeyNotFoundError:
                await asyncio.sleep(0.01)  # given back or lapsed in between: claim it
                continue
            if _instance(entry.value) == self.holder.instance:
                self._revision = entry.revision or 0  # ours already (a lost reply, a restart)
                self.held.set()
                return
            now = loop.time()
            if watched is None:
                watched = (entry.revision or 0, now)
                self._log.warning(
                    "name %r is held by %s; watching for up to %g s whether that daemon is "
                    "alive (it renews its claim) or gone (the claim lapses)",
                    self.name,
                    _describe(entry.value),
                    self._ttl,
                )
            elif entry.revision != watched[0]:
                raise NameTaken(
                    f"name {self.name!r} on stream {self.stream!r} is held by another daemon "
                    f"({_describe(entry.value)}), which renews it: two daemons with one name "
                    "would share one durable consumer and drop each other's events; give this "
                    "one another name ([plugins.nats] name) or stop the other"
                )
            elif now - watched[1] > 1.5 * self._ttl:
                # The server should have removed it by now; take it over (compare and set).
                with contextlib.suppress(nats.js.errors.KeyWrongLastSequenceError):
                    self._revision = await kv.update(self.key, self._value, last=watched[0])
                    self.held.set()
                    return
            await asyncio.sleep(self._ttl / 6)

    async def _bucket(self, js: JetStreamContext) -> KeyValue:
        try:
            kv = await js.key_value(NAMES_BUCKET)
        except nats.js.errors.BucketNotFoundError:
            try:
                kv = await js.create_key_value(
                    KeyValueConfig(bucket=NAMES_BUCKET, ttl=NAME_TTL, history=1)
                )
            except nats.js.errors.BadRequestError as exc:
                try:
                    kv = await js.key_value(NAMES_BUCKET)  # another daemon made it meanwhile
                except nats.js.errors.BucketNotFoundError:
                    raise NatsBridgeError(
                        f"cannot make bucket {NAMES_BUCKET!r} (for the daemons' names): {exc}"
                    ) from exc
        ttl = (await kv.status()).ttl
        if not ttl:
            raise NatsBridgeError(
                f"bucket {NAMES_BUCKET!r} keeps names for ever (no TTL), so the name of a "
                "daemon that died would never be free: remove it (the plugin makes it with "
                f"a TTL of {NAME_TTL:.0f} s) or give it a TTL"
            )
        self._ttl = ttl
        return kv

    # -- keep -----------------------------------------------------------------------

    async def keep(self) -> None:
        """Renew every third of the TTL, and at once after :meth:`reconnected`.

        :raises NameTaken: another daemon holds the name now.
        """
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._ttl / 3)
            self._wake.clear()
            try:
                await self._renew()
            except _TROUBLE as exc:
                self._on_trouble(exc)  # tried again at the next tick
                continue
            self.held.set()

    async def _renew(self) -> None:
        kv = self._kv
        assert kv is not None, "acquire() first"
        try:
            self._revision = await kv.update(self.key, self._value, last=self._revision)
            return
        except nats.js.errors.KeyWrongLastSequenceError:
            pass
        try:
            entry = await kv.get(self.key)
        except nats.js.errors.KeyNotFoundError:  # lapsed while we were away; nobody took it
            with contextlib.suppress(nats.js.errors.KeyWrongLastSequenceError):
                self._revision = await kv.create(self.key, self._value)
                return
            entry = await kv.get(self.key)  # somebody did, just now
        if _instance(entry.value) == self.holder.instance:
            self._revision = entry.revision or 0  # our last renewal's reply was lost
            return
        self.held.clear()  # nothing to give back at the stop
        raise NameTaken(
            f"name {self.name!r} on stream {self.stream!r} was taken by another daemon "
            f"({_describe(entry.value)}) while this one could not renew its claim (cut off "
            f"from NATS for longer than {self._ttl:g} s?): two daemons with one name would "
            "share one durable consumer; give one of them another name ([plugins.nats] name)"
        )

    def disconnected(self) -> None:
        """The claim may lapse now: the consumer waits until it is renewed."""
        self.held.clear()

    def reconnected(self) -> None:
        self._wake.set()

    # -- release ----------------------------------------------------------------------

    async def release(self) -> None:
        """Give the name back (a clean stop), if it is still ours; best effort."""
        kv, self._kv = self._kv, None
        if kv is None or not self.held.is_set():
            return
        self.held.clear()
        with contextlib.suppress(*_TROUBLE):
            await kv.delete(self.key, last=self._revision)
