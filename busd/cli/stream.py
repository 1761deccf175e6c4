"""The event stream from the shell: ``busd tail``, ``busd publish``, ``busd ingest``."""

from __future__ import annotations

import json
import math
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
from ..wire.frames import Ingest, Status
from ._common import fail, resolve_socket, run_client, socket_option


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
    """Publish one event, e.g. `busd publish stream.session.info --field message=hi`."""
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
    """Feed raw SDK events (JSON Lines, from SOURCE or stdin) through an adapter in the daemon."""
    path = resolve_socket(socket_path)
    decoder = msgspec.json.Decoder()

    async def run() -> int:
        sent = malformed = 0
        async with busd_connect(path, client="busd-ingest", role="agent") as client:
            status = await client.request(Status())
            if sdk not in status["adapters"]:
                loaded = ", ".join(status["adapters"]) or "none"
                fail(f"the daemon has no adapter {sdk!r} (loaded: {loaded})", 2)
            batch: list[Any] = []
            size = 0
            line_number = 0
            while True:
                line = await trio.to_thread.run_sync(source.readline)
                if not line:
                    if not follow:
                        break
                    if batch:  # nothing new yet: send what we have, then wait
                        await client.send_frame(Ingest(sdk=sdk, events=batch, session_id=session))
                        sent += len(batch)
                        batch, size = [], 0
                    await trio.sleep(0.2)
                    continue
                line_number += 1
                if not line.strip():
                    continue
                try:
                    batch.append(decoder.decode(line))
                except msgspec.DecodeError as exc:
                    malformed += 1
                    click.echo(f"busd: line {line_number}: not JSON ({exc}); skipped", err=True)
                    continue
                size += len(line)
                if size >= _INGEST_CHUNK:
                    await client.send_frame(Ingest(sdk=sdk, events=batch, session_id=session))
                    sent += len(batch)
                    batch, size = [], 0
            await client.send_frame(Ingest(sdk=sdk, events=batch, session_id=session, end=True))
            sent += len(batch)
            try:  # one ack answers for everything this connection published
                acked = await client.acknowledge()
            except NotJournaled as exc:
                fail(f"ingested, but not journaled: {exc}", NOT_JOURNALED_EXIT)
            except RequestFailed as exc:
                fail(f"the daemon refused the stream: {exc}")
        skipped = f", {malformed} malformed line(s) skipped" if malformed else ""
        click.echo(f"busd: ingested {sent} {sdk} event(s){skipped}", err=True)
        _say_durable(acked, "the stream")
        return 0

    run_client(run)
