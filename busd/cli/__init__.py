"""The ``busd`` command line."""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any, NoReturn

import click
import msgspec
import trio

from .._version import __version__
from ..client import ConnectionLost, DaemonNotRunning
from ..client import connect as busd_connect
from ..core.catalog import Catalog
from ..core.catalogdoc import render_markdown
from ..core.errors import BusdError, PluginConfigError
from ..core.events import Envelope, Event, event_type
from ..core.patterns import Pattern, is_pattern
from ..daemon.config import ConfigError, FileConfig, load_config
from ..daemon.endpoint import AlreadyRunning, EndpointError, resolve_socket_path
from ..daemon.hub import Daemon, DaemonConfig
from ..daemon.journalfile import (
    DEFAULT_MAX_AGE,
    DEFAULT_MAX_SIZE,
    JournalError,
    JournalReader,
    parse_duration,
    parse_size,
)
from ..daemon.server import serve as serve_forever
from ..frontends.humanize import format_tokens
from ..frontends.transcript import build_transcript, export_document
from ..plugins.manager import PluginManager
from ..wire.frames import Ingest, Status


@click.group()
@click.version_option(__version__, prog_name="busd")
def main() -> None:
    """busd: one ordered, typed, coalesced event stream for AI coding agents."""


@main.command()
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["names", "markdown", "schema"]),
    default="names",
    show_default=True,
    help="names: one type per line; markdown: docs/events.md; schema: JSON Schema.",
)
def catalog(fmt: str) -> None:
    """Print the event catalog (for docs, or for clients in other languages)."""
    types = Catalog()
    if fmt == "markdown":
        click.echo(render_markdown(types), nl=False)
    elif fmt == "schema":
        click.echo(msgspec.json.format(msgspec.json.encode(types.json_schema()), indent=2))
    else:
        for name in types.names():
            click.echo(name)


@main.command()
@click.option(
    "--speed",
    type=click.FloatRange(min=0),
    default=1.0,
    show_default=True,
    help="Replay speed: 2 is twice as fast, 0 is as fast as it goes.",
)
@click.option("--plain", is_flag=True, help="Log lines instead of the live screen.")
@click.option(
    "--yes/--ask",
    "auto_approve",
    default=None,
    help="Answer permission requests automatically (default: ask when at a terminal).",
)
@click.option("--keep", is_flag=True, help="Keep serving after the runs end (until Ctrl-C).")
@click.option(
    "--only",
    "names",
    multiple=True,
    type=click.Choice(["claude_code", "copilot", "opencode", "acp"]),
    help="Replay only this recording (repeatable; default: all four).",
)
def demo(
    speed: float, plain: bool, auto_approve: bool | None, keep: bool, names: tuple[str, ...]
) -> None:
    """Start a daemon, replay recorded agent runs through it, and watch them."""
    from ..frontends.demo import BUNDLED, default_interactive, run_demo

    interactive = default_interactive() and not plain
    try:
        code = trio.run(
            partial(
                run_demo,
                lambda text: click.echo(text, nl=False),
                speed=speed,
                plain=plain,
                auto_approve=not interactive if auto_approve is None else auto_approve,
                keep=keep,
                names=names or BUNDLED,
            )
        )
    except KeyboardInterrupt:
        sys.exit(130)
    sys.exit(code)


# -- the daemon and its clients ----------------------------------------------

_DEFAULTS = DaemonConfig()

socket_option = click.option(
    "--socket",
    "socket_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The daemon's socket (default: $BUSD_SOCKET, else $XDG_RUNTIME_DIR/busd/bus.sock).",
)


def _fail(message: str, code: int = 1) -> NoReturn:
    click.echo(f"busd: {message}", err=True)
    sys.exit(code)


def _socket(path: Path | None) -> Path:
    try:
        return resolve_socket_path(path)
    except EndpointError as exc:
        _fail(str(exc))


def _run_client(main_fn: Callable[[], Awaitable[int]]) -> NoReturn:
    """Run a client command; daemon trouble becomes a message and exit 1."""
    try:
        code = trio.run(main_fn)
    except DaemonNotRunning as exc:
        _fail(str(exc))
    except ConnectionLost as exc:
        _fail(f"lost the daemon ({exc})")
    except KeyboardInterrupt:
        sys.exit(130)
    sys.exit(code)


class _Duration(click.ParamType[float, Any]):
    """``30d``, ``12h``, ``90m``, ``3600``: seconds."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            return parse_duration(value) if isinstance(value, str) else float(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class _Size(click.ParamType[int, Any]):
    """``1GiB``, ``500MiB``, ``1048576``: bytes."""

    name = "size"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            return parse_size(value) if isinstance(value, str) else int(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


@main.command()
@socket_option
@click.option(
    "--max-frame",
    type=click.IntRange(1024),
    default=_DEFAULTS.max_frame,
    show_default=True,
    help="Largest frame accepted or sent, in bytes.",
)
@click.option(
    "--outbound-cap",
    type=click.IntRange(1024),
    default=_DEFAULTS.outbound_cap,
    show_default=True,
    help="Bytes queued for one client before it is dropped.",
)
@click.option(
    "--handshake-timeout",
    type=click.FloatRange(0.01),
    default=_DEFAULTS.handshake_timeout,
    show_default=True,
    help="Seconds a new client has to say hello.",
)
@click.option(
    "--replay",
    type=click.IntRange(0),
    default=_DEFAULTS.replay,
    show_default=True,
    help="Events kept in memory for resuming clients.",
)
@click.option(
    "--max-subscriptions",
    type=click.IntRange(1),
    default=_DEFAULTS.max_subscriptions,
    show_default=True,
    help="Subscriptions per connection.",
)
@click.option(
    "--max-requests",
    type=click.IntRange(1),
    default=_DEFAULTS.max_requests,
    show_default=True,
    help="Replies a connection may leave unread.",
)
@click.option(
    "--max-connections-per-uid",
    type=click.IntRange(1),
    default=_DEFAULTS.max_connections_per_uid,
    show_default=True,
    help="Connections one user may hold.",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="A TOML file with run and permission policy (see docs/runs.md).",
)
@click.option(
    "--journal",
    "journal_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The SQLite journal (default: the config file's [journal] path, else "
    "$XDG_STATE_HOME/busd/journal.sqlite3).",
)
@click.option("--no-journal", is_flag=True, help="Keep history in memory only.")
@click.option(
    "--journal-max-age",
    type=_Duration(),
    default=None,
    help="Remove journaled events older than this (e.g. 30d, 12h; 0: keep) [default: 30d].",
)
@click.option(
    "--journal-max-size",
    type=_Size(),
    default=None,
    help="Remove the oldest events while the journal is over this (e.g. 1GiB; 0: no limit) "
    "[default: 1GiB].",
)
@click.option(
    "--nats",
    "nats_url",
    default=None,
    metavar="URL",
    help="Bridge events through NATS JetStream at URL (the nats plugin; docs/scaling.md).",
)
@click.option("--nats-stream", default=None, help="The JetStream stream (default: BUSD).")
@click.option(
    "--nats-subject",
    "nats_subjects",
    multiple=True,
    help="Subjects to ingest from other daemons (repeatable; default: all of the stream).",
)
@click.option(
    "--nats-creds",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=None,
    help="A NATS credentials file.",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="info",
    show_default=True,
)
def serve(
    socket_path: Path | None,
    config_path: Path | None,
    journal_path: Path | None,
    no_journal: bool,
    journal_max_age: float | None,
    journal_max_size: int | None,
    nats_url: str | None,
    nats_stream: str | None,
    nats_subjects: tuple[str, ...],
    nats_creds: Path | None,
    max_frame: int,
    outbound_cap: int,
    handshake_timeout: float,
    replay: int,
    max_subscriptions: int,
    max_requests: int,
    max_connections_per_uid: int,
    log_level: str,
) -> None:
    """Run the daemon until SIGTERM or SIGINT."""
    logging.basicConfig(level=log_level.upper(), format="busd: %(name)s: %(message)s")
    try:
        policy = load_config(config_path) if config_path is not None else FileConfig()
    except ConfigError as exc:
        _fail(str(exc), 2)
    age_from_file, size_from_file = policy.journal.limits()  # checked by load_config
    config = DaemonConfig(
        watchdog=policy.runs.watchdog,
        permission_rules=tuple(policy.permissions.rules),
        permission_timeout=policy.permissions.timeout,
        max_frame=max_frame,
        outbound_cap=outbound_cap,
        handshake_timeout=handshake_timeout,
        replay=max(replay, 1),
        max_subscriptions=max_subscriptions,
        max_requests=max_requests,
        max_connections_per_uid=max_connections_per_uid,
        journal=None if no_journal else str(journal_path or _file_journal(policy)),
        journal_max_age=_limit(journal_max_age, age_from_file, DEFAULT_MAX_AGE),
        journal_max_size=_limit(journal_max_size, size_from_file, DEFAULT_MAX_SIZE),
        plugin_options=_plugin_options(
            policy.plugins,
            nats={
                "url": nats_url,
                "stream": nats_stream,
                "subjects": list(nats_subjects) or None,
                "creds": str(nats_creds) if nats_creds else None,
            },
        ),
    )
    path = _socket(socket_path)

    def ready(where: str) -> None:
        click.echo(f"busd {__version__}: listening on {where}")

    plugins = PluginManager()
    plugins.load_entry_points()
    try:
        # The daemon (and its journal) is made once the socket is ours.
        trio.run(
            partial(serve_forever, path, partial(Daemon, config, plugins=plugins), on_ready=ready)
        )
    except AlreadyRunning as exc:
        _fail(str(exc))
    except EndpointError as exc:
        _fail(str(exc))
    except JournalError as exc:
        _fail(f"{exc} (--journal PATH puts it elsewhere, --no-journal runs without one)")
    except PluginConfigError as exc:
        _fail(str(exc), 2)
    except BaseExceptionGroup as group:
        refused = _leaf(group, PluginConfigError)
        if refused is None:
            raise
        _fail(str(refused), 2)


def _leaf(group: BaseExceptionGroup[BaseException], kind: type[Exception]) -> Exception | None:
    """The first ``kind`` exception inside nested groups (a service's, out of the nurseries)."""
    matched, _ = group.split(kind)
    while isinstance(matched, BaseExceptionGroup):
        matched = matched.exceptions[0]  # type: ignore[assignment]
    return matched


def default_journal_path() -> Path:
    """``$XDG_STATE_HOME/busd/journal.sqlite3`` (``~/.local/state`` when unset)."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(state) / "busd" / "journal.sqlite3"


def _file_journal(policy: FileConfig) -> Path:
    """The config file's ``[journal] path``, else the default."""
    given = policy.journal.path
    return Path(os.path.expanduser(given)) if given else default_journal_path()


def _limit(flag: float | None, from_file: float | None, default: float) -> Any:
    """A retention limit: the flag, else the file, else the default; 0 means none."""
    value = flag if flag is not None else from_file if from_file is not None else default
    return value or None


def _plugin_options(
    from_file: dict[str, dict[str, Any]], **flags: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    """The config file's ``[plugins.NAME]`` tables, with the flags given on top."""
    merged = {name: dict(options) for name, options in from_file.items()}
    for name, options in flags.items():
        given = {key: value for key, value in options.items() if value is not None}
        if given:
            merged.setdefault(name, {}).update(given)
    return merged


def _summary(event: Event) -> str:
    fields = msgspec.to_builtins(event)
    fields.pop("type", None)
    text = " ".join(f"{k}={v!r}" for k, v in fields.items())
    return text if len(text) <= 160 else text[:157] + "..."


@main.command()
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
    path = _socket(socket_path)
    as_json = fmt == "json" or (fmt is None and not sys.stdout.isatty())
    try:
        stop = Pattern(until) if until is not None and is_pattern(until) else None
        if until is not None and stop is None:
            Catalog().get(until)
        for pattern in patterns:
            Pattern(pattern)
    except BusdError as exc:
        _fail(str(exc), 2)
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
            _fail("the daemon closed the connection")
        if scope.cancelled_caught:
            _fail(f"timed out after {timeout}s", 124)
        return 0

    _run_client(run)


@main.command()
@socket_option
@click.option("--session", "sessions", multiple=True, help="Only this session (repeatable).")
@click.option("--plain", is_flag=True, help="Log lines, no screen, no keys (default when piped).")
@click.option("--name", default=None, help="Client name, the `by` of answers [watch@host:pid].")
@click.option("--exit-when-idle", is_flag=True, help="Exit 0 once every session shown is at rest.")
def watch(
    socket_path: Path | None,
    sessions: tuple[str, ...],
    plain: bool,
    name: str | None,
    exit_when_idle: bool,
) -> None:
    """Show the sessions live: text, thinking, tools, sub-agents, permission prompts, usage."""
    from ..frontends.watch import default_name
    from ..frontends.watch import watch as run_watch

    path = _socket(socket_path)
    _run_client(
        partial(
            run_watch,
            path,
            name=name or default_name(),
            sessions=sessions,
            plain=plain or not sys.stdout.isatty(),
            exit_when_idle=exit_when_idle,
        )
    )


@main.command()
@socket_option
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on (the page still wants the token from the printed URL).",
)
@click.option(
    "--port", type=click.IntRange(0, 65535), default=0, help="Port (default 0: a free one)."
)
@click.option("--name", default=None, help="Client name, the `by` of answers [web@host:pid].")
def web(socket_path: Path | None, host: str, port: int, name: str | None) -> None:
    """Serve the sessions to browsers: prints the URL to open (with its access token)."""
    from ..frontends.web import run_web

    logging.basicConfig(level="WARNING", format="busd: %(name)s: %(message)s")
    path = _socket(socket_path)

    def ready(url: str) -> None:
        click.echo(f"busd web: open {url}")

    try:
        _run_client(partial(run_web, path, host=host, port=port, name=name, on_ready=ready))
    except OSError as exc:  # the address is taken or cannot be bound
        _fail(f"cannot listen on {host}:{port}: {exc}")


def _parse_field(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise click.BadParameter(f"{text!r} is not key=value", param_hint="--field")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


@main.command()
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
        _fail("give --field or --json, not both", 2)
    try:
        cls = Catalog().get(event_type_name)
        data: Any = json.loads(payload) if payload is not None else dict(map(_parse_field, fields))
        if not isinstance(data, dict):
            _fail("--json must be a JSON object", 2)
        data["type"] = event_type_name
        event = msgspec.convert(data, cls)
    except (BusdError, json.JSONDecodeError, msgspec.ValidationError) as exc:
        _fail(f"invalid {event_type_name} event: {exc}", 2)
    path = _socket(socket_path)

    async def run() -> int:
        async with busd_connect(path, client="busd-publish", role="agent") as client:
            await client.publish(event, session_id=session, run_id=run_id, agent_id=agent)
            await client.flush()
            for error in client.errors:
                _fail(f"the daemon refused it: {error.code}: {error.message}")
        return 0

    _run_client(run)


@main.command()
@socket_option
@click.option("--json", "as_json", is_flag=True, help="The raw status as JSON.")
def status(socket_path: Path | None, as_json: bool) -> None:
    """Show the daemon's uptime, clients, subscriptions, sessions and rates."""
    path = _socket(socket_path)

    async def run() -> int:
        async with busd_connect(path, client="busd-status", role="admin") as client:
            result = await client.request(Status())
        if as_json:
            click.echo(msgspec.json.format(msgspec.json.encode(result), indent=2))
        else:
            for key, value in result.items():
                click.echo(f"{key + ':':<28} {value}")
        return 0

    _run_client(run)


journal_option = click.option(
    "--journal",
    "journal_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The journal to read (default: $XDG_STATE_HOME/busd/journal.sqlite3).",
)


def _reader(path: Path | None) -> JournalReader:
    try:
        return JournalReader(path or default_journal_path())
    except JournalError as exc:
        _fail(str(exc))


@main.command("sessions")
@journal_option
@click.option("--limit", type=click.IntRange(1), default=None, help="The N most recent only.")
@click.option("--json", "as_json", is_flag=True, help="A JSON array of session records.")
def sessions_command(journal_path: Path | None, limit: int | None, as_json: bool) -> None:
    """List the journaled sessions, most recently active first, with their final usage.

    Reads the journal directly: works whether the daemon runs or not.
    """
    with _reader(journal_path) as reader:
        records = reader.sessions(limit)
    if as_json:
        click.echo(msgspec.json.encode(records))
        return
    if not records:
        click.echo(f"no sessions in {reader.path}", err=True)
        return
    click.echo(
        f"{'SESSION':<22} {'LAST ACTIVE':<16} {'STATUS':<6} {'ADAPTER/MODEL':<32} "
        f"{'EVENTS':>7} {'IN':>7} {'OUT':>7}  TITLE"
    )
    for r in records:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(r.last_ts))
        agent = "/".join(part for part in (r.adapter, r.model) if part) or "-"
        usage = r.usage
        tokens_in = "-" if usage is None else format_tokens(usage.input_tokens)
        tokens_out = "-" if usage is None else format_tokens(usage.output_tokens)
        title = (r.title or "") + (" (oldest events removed)" if r.truncated else "")
        click.echo(
            f"{r.session_id:<22} {when:<16} {r.status:<6} {agent[:32]:<32} "
            f"{r.events:>7} {tokens_in:>7} {tokens_out:>7}  {title}".rstrip()
        )


@main.command()
@journal_option
@click.argument("session_id", metavar="SESSION")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["jsonl", "json"]),
    default="jsonl",
    show_default=True,
    help="jsonl: the session, then one message per line; json: one document.",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    default=None,
    help="Write to this file (default: standard output).",
)
def export(journal_path: Path | None, session_id: str, fmt: str, output: Path | None) -> None:
    """Write a journaled session's transcript: messages with their parts, runs, usage.

    Reasoning keeps its provider signature, tool calls their input and
    results; the format is in docs/journal.md.
    """
    decoder = msgspec.msgpack.Decoder(Catalog().envelope_type())
    envelopes: list[Envelope[Event]] = []
    skipped = 0
    with _reader(journal_path) as reader:
        record = reader.session(session_id)
        if record is None:
            _fail(f"no session {session_id!r} in {reader.path} (see `busd sessions`)")
        for blob in reader.session_events(session_id):
            try:
                envelopes.append(decoder.decode(blob))
            except (msgspec.DecodeError, msgspec.ValidationError):
                skipped += 1  # an event type of a plugin this busd does not load
    transcript = build_transcript(session_id, envelopes)
    data = export_document(record, transcript, lines=fmt == "jsonl")
    if output is None:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    else:
        try:
            output.write_bytes(data)
        except OSError as exc:
            _fail(f"cannot write {output}: {exc.strerror or exc}")
    if skipped:
        click.echo(f"busd: {skipped} event(s) of unknown types left out", err=True)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="As JSON.")
def plugins(as_json: bool) -> None:
    """List the plugins busd loads (its own and group `busd`), hooks, adapters, drivers."""
    manager = PluginManager()
    manager.load_entry_points()
    infos = manager.plugins()
    adapters = manager.adapters()
    drivers = manager.drivers()
    if as_json:
        click.echo(
            msgspec.json.encode(
                {
                    "plugins": infos,
                    "adapters": sorted(adapters),
                    "drivers": sorted(drivers),
                    "failures": manager.failures,
                    "autoload_disabled": manager.autoload_disabled,
                    "blocked": sorted(manager.blocked),
                }
            )
        )
        return
    if manager.autoload_disabled:
        click.echo("plugin autoload is disabled (BUSD_DISABLE_PLUGIN_AUTOLOAD)")
    for info in infos:
        dist = f"{info.distribution} {info.version}" if info.distribution else info.module
        click.echo(f"{info.name:<16} {dist:<28} {', '.join(info.hooks)}")
    if adapters:
        click.echo(f"adapters: {', '.join(sorted(adapters))}")
    if drivers:
        click.echo(f"drivers:  {', '.join(sorted(drivers))}")
    for failure in manager.failures:
        click.echo(f"FAILED {failure.plugin}: {failure.hook}: {failure.error}", err=True)


_INGEST_CHUNK = 256 << 10  # raw bytes per ingest frame, well under the frame cap


@main.command()
@socket_option
@click.option("--sdk", required=True, help="The adapter to translate with (see `busd plugins`).")
@click.argument("source", type=click.File("rb"), default="-")
@click.option("--session", default=None, help="Session id for SDKs whose events carry none.")
@click.option("--follow", is_flag=True, help="Keep reading as the file grows (like tail -f).")
def ingest(
    socket_path: Path | None, sdk: str, source: Any, session: str | None, follow: bool
) -> None:
    """Feed raw SDK events (JSON Lines, from SOURCE or stdin) through an adapter in the daemon."""
    path = _socket(socket_path)
    decoder = msgspec.json.Decoder()

    async def run() -> int:
        sent = malformed = 0
        async with busd_connect(path, client="busd-ingest", role="agent") as client:
            status = await client.request(Status())
            if sdk not in status["adapters"]:
                loaded = ", ".join(status["adapters"]) or "none"
                _fail(f"the daemon has no adapter {sdk!r} (loaded: {loaded})", 2)
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
            await client.flush()
            for error in client.errors:
                _fail(f"the daemon refused the stream: {error.code}: {error.message}")
        skipped = f", {malformed} malformed line(s) skipped" if malformed else ""
        click.echo(f"busd: ingested {sent} {sdk} event(s){skipped}", err=True)
        return 0

    _run_client(run)


@main.command("run")
@socket_option
@click.argument("prompt")
@click.option("--adapter", required=True, help="The SDK's adapter (see `busd plugins`).")
@click.option(
    "--driver",
    default=None,
    help="The driver (default: the adapter's own; `replay` plays --option recording=...).",
)
@click.option("--model", default=None, help="The model (default: the driver's own).")
@click.option(
    "--json", "fmt", flag_value="json", help="JSON Lines of envelopes (default when piped)."
)
@click.option("--pretty", "fmt", flag_value="pretty", help="Readable text (default on a terminal).")
@click.option(
    "--allow",
    "allow",
    multiple=True,
    metavar="PATTERN",
    help="Allow tools whose name matches this glob (repeatable).",
)
@click.option(
    "--deny",
    "deny",
    multiple=True,
    metavar="PATTERN",
    help="Deny tools whose name matches this glob; checked first (repeatable).",
)
@click.option("--session", default=None, help="Continue this busd session.")
@click.option("--system-prompt", default=None, help="Replace the agent's system prompt.")
@click.option(
    "--cwd",
    type=click.Path(file_okay=False, exists=True, resolve_path=True),
    default=".",
    show_default=True,
    help="The agent's working directory.",
)
@click.option("--max-turns", type=click.IntRange(1), default=None, help="Stop after N turns.")
@click.option(
    "--option",
    "options",
    multiple=True,
    metavar="KEY=VALUE",
    help="A driver option (value parsed as JSON when it is JSON); repeatable.",
)
@click.option(
    "--watchdog",
    type=click.FloatRange(0, min_open=True),
    default=None,
    help="End the run after S seconds without an event (in-process daemon only).",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="error",
    show_default=True,
    help="The in-process daemon's log (the run's own events already say why it failed).",
)
def run_command(
    socket_path: Path | None,
    prompt: str,
    adapter: str,
    driver: str | None,
    model: str | None,
    fmt: str | None,
    allow: tuple[str, ...],
    deny: tuple[str, ...],
    session: str | None,
    system_prompt: str | None,
    cwd: str,
    max_turns: int | None,
    options: tuple[str, ...],
    watchdog: float | None,
    log_level: str,
) -> None:
    """Run PROMPT with an agent and exit with its outcome (`-`: read the prompt from stdin).

    Uses the daemon at the socket, or starts one in-process for this run.
    Permission requests are answered from --deny, then --allow; a tool no
    rule matches is denied. Exit codes: 0 ok, 1 agent error, 2 usage error,
    124 watchdog timeout, 130 cancelled (SIGINT/SIGTERM cancel the run).
    """
    from ..frontends.headless import HeadlessRun, ToolRules, parse_option, run_headless

    logging.basicConfig(level=log_level.upper(), format="busd: %(name)s: %(message)s")
    parsed: dict[str, Any] = {}
    for text in options:
        try:
            key, value = parse_option(text)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--option") from None
        parsed[key] = value
    if prompt == "-":
        prompt = sys.stdin.read()
    spec = HeadlessRun(
        adapter=adapter,
        prompt=prompt,
        driver=driver,
        model=model,
        session_id=session,
        system_prompt=system_prompt,
        cwd=cwd,
        max_turns=max_turns,
        options=parsed,
        rules=ToolRules(allow=allow, deny=deny),
        watchdog=watchdog,
        socket_path=None if socket_path is None else str(socket_path),
    )
    pretty = fmt == "pretty" or (fmt is None and sys.stdout.isatty())
    out, err = sys.stdout, sys.stderr

    def write(text: str) -> None:
        out.write(text)
        out.flush()

    def note(text: str) -> None:
        err.write(text)
        err.flush()

    _run_client(partial(run_headless, spec, out=write, err=note, pretty=pretty))
