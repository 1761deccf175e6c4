"""The event stream from the shell: ``busd tail``, ``busd publish``, ``busd ingest``."""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import click
import msgspec
import trio

from ..client import Acked, NotJournaled, RequestFailed
from ..client import connect as busd_connect
from ..core.catalog import Catalog
from ..core.errors import BusdError
from ..core.events import Envelope, Event, event_type
from ..core.patterns import Pattern, is_pattern
from ..wire.frames import Status
from ._common import fail, resolve_socket, run_client, socket_option
from .attach import ClientSink


def _summary(event: Event) -> str:
    fields = msgspec.to_builtins(event)
    fields.pop("type", None)
    text = " ".join(f"{k}={v!r}" for k, v in fields.items())
    return text if len(text) <= 160 else text[:157] + "..."


@click.command()
@socket_option
@click.argument("patterns", nargs=-1)
@click.option("--session", "sessions", multiple=True, help="Only this session (repeatable).")
@click.option(
    "--since", type=click.IntRange(0), default=None, help="Replay what came after this seq first."
)
@click.option(
    "--until", default=None, help="Exit 0 after the first event of this type (or pattern)."
)
@click.option("--count", type=click.IntRange(1), default=None, help="Exit 0 after N events.")
@click.option(
    "--timeout",
    type=click.FloatRange(0),
    default=None,
    help="Exit 124 if --until/--count is not met within S seconds.",
)
@click.option("--raw-deltas", is_flag=True, help="One frame per delta (no merging).")
@click.option("--json", "fmt", flag_value="json", help="JSON Lines (default when piped).")
@click.option("--pretty", "fmt", flag_value="pretty", help="One readable line per event.")
def tail(
    socket_path: Path | None,
    patterns: tuple[str, ...],
    sessions: tuple[str, ...],
    since: int | None,
    until: str | None,
    count: int | None,
    timeout: float | None,
    raw_deltas: bool,
    fmt: str | None,
) -> None:
    """Print events as they are published (all of them without PATTERNs)."""
    path = resolve_socket(socket_path)
    as_json = fmt == "json" or (fmt is None and not sys.stdout.isatty())
    try:
        stop = Pattern(until) if until is not None and is_pattern(until) else None
        if until is not None and stop is None:
            Catalog().get(until)
        for pattern in patterns:
            Pattern(pattern)
    except BusdError as exc:
        fail(str(exc), 2)
    out = sys.stdout

    def show(envelope: Envelope[Event]) -> None:
        if as_json:
            out.write(msgspec.json.encode(envelope).decode() + "\n")
        else:
            name = event_type(envelope.event)
            stamp = time.strftime("%H:%M:%S", time.localtime(envelope.ts))
            out.write(
                f"{envelope.seq:>8} {stamp} {envelope.session_id or '-':<12} {name:<30} "
                f"{_summary(envelope.event)}\n"
            )
        out.flush()

    def done(envelope: Envelope[Event]) -> bool:
        name = event_type(envelope.event)
        return until is not None and (stop.matches(name) if stop else name == until)

    async def run() -> int:
        seen = 0
        with trio.move_on_after(timeout if timeout is not None else math.inf) as scope:
            async with (
                busd_connect(path, client="busd-tail") as client,
                client.subscribe(
                    patterns or (">",),
                    sessions=sessions or None,
                    since_seq=since,
                    deltas="raw" if raw_deltas else "merged",
                ) as sub,
            ):
                async for batch in sub:
                    if batch.gap is not None:
                        click.echo(
                            f"busd: events {batch.gap[0]}..{batch.gap[1]} are no longer held",
                            err=True,
                        )
                    for envelope in batch.events:
                        show(envelope)
                        seen += 1
                        if done(envelope) or (count is not None and seen >= count):
                            return 0
            fail("the daemon closed the connection")
        if scope.cancelled_caught:
            fail(f"timed out after {timeout}s", 124)
        return 0

    run_client(run)


def _parse_field(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise click.BadParameter(f"{text!r} is not key=value", param_hint="--field")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


@click.command()
@socket_option
@click.argument("event_type_name", metavar="TYPE")
@click.option("--session", default=None, help="The event's session id.")
@click.option("--run", "run_id", default=None, help="The event's run id.")
@click.option("--agent", default=None, help="The sub-agent that produced it.")
@click.option(
    "--field",
    "fields",
    multiple=True,
    help="key=value (value parsed as JSON when it is JSON); repeatable.",
)
@click.option("--json", "payload", default=None, help="All fields as one JSON object.")
def publish(
    socket_path: Path | None,
    event_type_name: str,
    session: str | None,
    run_id: str | None,
    agent: str | None,
    fields: tuple[str, ...],
    payload: str | None,
) -> None:
    """Publish one event, as in `busd publish stream.session.info --field message=hi`."""
    if fields and payload is not None:
        fail("give --field or --json, not both", 2)
    try:
        cls = Catalog().get(event_type_name)
        data: Any = json.loads(payload) if payload is not None else dict(map(_parse_field, fields))
        if not isinstance(data, dict):
            fail("--json must be a JSON object", 2)
        data["type"] = event_type_name
        event = msgspec.convert(data, cls)
    except (BusdError, json.JSONDecodeError, msgspec.ValidationError) as exc:
        fail(f"invalid {event_type_name} event: {exc}", 2)
    path = resolve_socket(socket_path)

    async def run() -> int:
        async with busd_connect(path, client="busd-publish", role="agent") as client:
            try:
                acked = await client.publish(
                    event, session_id=session, run_id=run_id, agent_id=agent, ack=True
                )
            except NotJournaled as exc:
                fail(f"published, but not journaled: {exc}", NOT_JOURNALED_EXIT)
            except RequestFailed as exc:
                fail(f"the daemon refused it: {exc}")
        assert acked is not None
        _say_durable(acked, "the event")
        return 0

    run_client(run)


_INGEST_CHUNK = 256 << 10  # raw bytes per ingest frame, well under the frame cap
NOT_JOURNALED_EXIT = 3
"""Exit code of ``publish`` and ``ingest`` when the daemon accepted events it could not journal."""


def _say_durable(acked: Acked, what: str) -> None:
    """Nothing when journaled; a note when the daemon keeps its history in memory only."""
    if not acked.journaled:
        click.echo(f"busd: the daemon runs without a journal: {what} is not durable", err=True)


@click.command()
@socket_option
@click.option("--sdk", required=True, help="The adapter to translate with (see `busd plugins`).")
@click.argument("source", type=click.File("rb"), default="-")
@click.option("--session", default=None, help="Session id for SDKs whose events carry none.")
@click.option("--follow", is_flag=True, help="Keep reading as the file grows (like tail -f).")
def ingest(
    socket_path: Path | None, sdk: str, source: Any, session: str | None, follow: bool
) -> None:
    """Feed raw SDK events (JSON Lines, from SOURCE or stdin) through an adapter in the daemon.

    Each line is one JSON object; other lines are skipped with a message, and
    the rest is ingested. From a terminal each line is sent as it is typed;
    Ctrl-C (or Ctrl-D) stops reading and sends what was read.
    """
    path = resolve_socket(socket_path)
    decoder = msgspec.json.Decoder()

    async def run() -> int:
        skipped = 0
        async with busd_connect(path, client="busd-ingest", role="agent") as client:
            status = await client.request(Status())
            if sdk not in status["adapters"]:
                loaded = ", ".join(status["adapters"]) or "none"
                fail(f"the daemon has no adapter {sdk!r} (loaded: {loaded})", 2)
            sink = ClientSink(client, max_frame=client.limits.max_frame)
            lines = _Lines(source.fileno(), limit=client.limits.max_frame)
            interactive = source.isatty()  # a person types: each line goes at once
            batch: list[Any] = []
            size = 0

            def take(line: bytes | int) -> Any:
                """The line's event, or ``None`` (said why) when it is none."""
                nonlocal skipped
                why: str | None
                if isinstance(line, int):
                    why = f"{line} bytes, over the daemon's frame cap of {client.limits.max_frame}"
                elif not line.strip():
                    return None
                else:
                    value, why = _json_object(decoder, line)
                    if why is None:
                        return value
                skipped += 1
                click.echo(f"busd: line {lines.number}: {why}; skipped", err=True)
                return None

            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_cancel_on_signal, signals, nursery.cancel_scope)
                    while True:
                        line = await lines.next()
                        if line is None:
                            if follow:
                                if batch:  # nothing new yet: send what we have, then wait
                                    await sink.ingest(sdk, session, batch)
                                    batch, size = [], 0
                                await trio.sleep(0.2)
                                continue
                            line = lines.rest()
                            if line is None:
                                break
                        value = take(line)
                        if value is None:
                            continue
                        batch.append(value)
                        size += len(line) if isinstance(line, bytes) else 0
                        if size >= _INGEST_CHUNK or interactive:
                            await sink.ingest(sdk, session, batch)
                            batch, size = [], 0
                    nursery.cancel_scope.cancel()
            await sink.ingest(sdk, session, batch, end=True)
            try:  # one ack answers for everything this connection published
                acked = await client.acknowledge()
            except NotJournaled as exc:
                fail(f"ingested, but not journaled: {exc}", NOT_JOURNALED_EXIT)
            except RequestFailed as exc:
                fail(f"the daemon refused the stream: {exc}")
        skipped += sink.skipped
        note = f", {skipped} line(s) skipped" if skipped else ""
        click.echo(f"busd: ingested {sink.events} {sdk} event(s){note}", err=True)
        _say_durable(acked, "the stream")
        return 0

    run_client(run)


async def _cancel_on_signal(signals: Any, scope: trio.CancelScope) -> None:
    async for _ in signals:
        scope.cancel()
        return


def _json_object(decoder: msgspec.json.Decoder[Any], line: bytes) -> tuple[Any, str | None]:
    """``(the object, None)``, or ``(None, why it is no event)``: not JSON, or not an object."""
    try:
        value = decoder.decode(line)
    except msgspec.DecodeError as exc:
        return None, f"not JSON ({exc})"
    if not isinstance(value, dict):
        return None, f"not a JSON object ({_JSON_NAMES.get(type(value), 'a value')})"
    return value, None


_JSON_NAMES = {
    list: "an array",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "true or false",
}


class _Lines:
    """Lines of a file or pipe read with ``os.read`` in a thread that Ctrl-C abandons.

    ``os.read`` rather than the buffered reader: a thread abandoned in the
    buffered reader holds its lock, and the interpreter aborts at exit. A
    line over ``limit`` bytes is read through and returned as its length, so
    one huge line is skipped and the lines after it are still read. A last
    line without its newline waits (the writer may not be done) until
    :meth:`rest`.
    """

    def __init__(self, fd: int, *, limit: int) -> None:
        self._fd = fd
        self._limit = limit
        self._buffer = bytearray()
        self._skipped = 0  # bytes of an over-long line read so far
        self.number = 0

    async def next(self) -> bytes | int | None:
        """The next line, its length when over the limit, or ``None`` at the end for now."""
        while True:
            newline = self._buffer.find(b"\n")
            if newline >= 0:
                line = bytes(self._buffer[: newline + 1])
                del self._buffer[: newline + 1]
                self.number += 1
                if self._skipped:
                    length, self._skipped = self._skipped + len(line), 0
                    return length
                return line
            if len(self._buffer) > self._limit:
                self._skipped += len(self._buffer)
                self._buffer.clear()
            chunk = await trio.to_thread.run_sync(
                os.read, self._fd, 1 << 16, abandon_on_cancel=True
            )
            if not chunk:
                return None
            self._buffer += chunk

    def rest(self) -> bytes | int | None:
        """At the very end: the last line if it had no newline (as :meth:`next` returns it)."""
        if not self._buffer and not self._skipped:
            return None
        self.number += 1
        line, length = bytes(self._buffer), self._skipped + len(self._buffer)
        self._buffer.clear()
        self._skipped = 0
        return length if length > self._limit else line
