"""``busd serve``: the daemon, its options and the config file merged into one config."""

from __future__ import annotations

import logging
import os
import sys
from functools import partial
from pathlib import Path
from typing import Any

import click
import trio

from .._version import __version__
from ..core.accounting import Accountant
from ..core.errors import PluginConfigError
from ..daemon.broker import DEFAULT_PERMISSION_TIMEOUT
from ..daemon.config import ConfigError, FileConfig, load_config
from ..daemon.endpoint import AlreadyRunning
from ..daemon.gcwatch import freeze_startup_heap
from ..daemon.hub import Daemon, DaemonConfig
from ..daemon.journalfile import DEFAULT_MAX_AGE, DEFAULT_MAX_SIZE, JournalError, parse_duration
from ..daemon.server import serve as serve_forever
from ..plugins.manager import PluginManager
from ..wire.address import EndpointError
from ._common import Duration, Size, default_journal_path, fail, resolve_socket, socket_option

_DEFAULTS = DaemonConfig()
logger = logging.getLogger("busd.serve")
UNJOURNALED = 3
"""Exit code of a daemon that stopped with events it could not journal (the disk failed)."""


@click.command()
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
    help="Bytes of frames queued for one client; past it its batches wait (and coalesce), "
    "and it is dropped when a subscription's buffer of events overflows too.",
)
@click.option(
    "--send-buffer",
    type=click.IntRange(0),
    default=_DEFAULTS.send_buffer,
    show_default=True,
    help="Each client socket's kernel send buffer in bytes (SO_SNDBUF, capped by the "
    "sysctl net.core.wmem_max); 0 keeps the system's default.",
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
    type=Duration(),
    default=None,
    help="Remove journaled events older than this (e.g. 30d, 12h; 0: keep) [default: 30d].",
)
@click.option(
    "--journal-max-size",
    type=Size(),
    default=None,
    help="Remove the oldest events while the journal is over this (e.g. 1GiB; 0: no limit) "
    "[default: 1GiB].",
)
@click.option(
    "--journal-staging/--no-journal-staging",
    default=True,
    show_default=True,
    help="Insert a batch's events into its transaction while it gathers, once 32 wait, at "
    "most every 10 ms (it still commits every 50 ms): the journal's CPU in small pieces, a "
    "shorter latency tail for some more CPU at high rates.",
)
@click.option(
    "--tool-timeout",
    type=Duration(),
    default=None,
    help="End a tool call with a 'timed out' error when it has no result after this long "
    "(e.g. 10m; 0: no limit) [default: the config file's [tools] timeout, else none].",
)
@click.option(
    "--tool-limit",
    "tool_limits",
    multiple=True,
    metavar="NAME=DURATION",
    help="A limit for one tool, over --tool-timeout (e.g. Bash=30m; 0: no limit; repeatable).",
)
@click.option(
    "--permission-timeout",
    type=Duration(),
    default=None,
    help="Deny a driven run's permission request that nobody answered in this long "
    "(e.g. 90s, 10m; 0: wait for ever) [default: the config file's [permissions] timeout, "
    "else 5m].",
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
@click.option(
    "--gc-freeze/--no-gc-freeze",
    default=True,
    show_default=True,
    help="Leave the startup heap (imports, plugins, the journal's recovery) out of "
    "garbage collections once the daemon is made "
    "(full collections then pause the daemon for far less).",
)
def serve(
    socket_path: Path | None,
    config_path: Path | None,
    journal_path: Path | None,
    no_journal: bool,
    journal_max_age: float | None,
    journal_max_size: int | None,
    journal_staging: bool,
    tool_timeout: float | None,
    tool_limits: tuple[str, ...],
    permission_timeout: float | None,
    nats_url: str | None,
    nats_stream: str | None,
    nats_subjects: tuple[str, ...],
    nats_creds: Path | None,
    max_frame: int,
    outbound_cap: int,
    send_buffer: int,
    handshake_timeout: float,
    replay: int,
    max_subscriptions: int,
    max_requests: int,
    max_connections_per_uid: int,
    log_level: str,
    gc_freeze: bool,
) -> None:
    """Run the daemon until SIGTERM or SIGINT."""
    logging.basicConfig(level=log_level.upper(), format="busd: %(name)s: %(message)s")
    try:
        policy = load_config(config_path) if config_path is not None else FileConfig()
    except ConfigError as exc:
        fail(str(exc), 2)
    age_from_file, size_from_file = policy.journal.limits()  # checked by load_config
    default_limit, limits = _tool_limits(policy, tool_timeout, tool_limits)
    config = DaemonConfig(
        watchdog=policy.runs.watchdog,
        permission_rules=tuple(policy.permissions.rules),
        grants=policy.grants(),
        permission_timeout=permission_wait(policy, permission_timeout),
        max_frame=max_frame,
        outbound_cap=outbound_cap,
        send_buffer=send_buffer,
        handshake_timeout=handshake_timeout,
        replay=max(replay, 1),
        max_subscriptions=max_subscriptions,
        max_requests=max_requests,
        max_connections_per_uid=max_connections_per_uid,
        journal=None if no_journal else str(journal_path or _file_journal(policy)),
        journal_max_age=_limit(journal_max_age, age_from_file, DEFAULT_MAX_AGE),
        journal_max_size=_limit(journal_max_size, size_from_file, DEFAULT_MAX_SIZE),
        journal_staging=journal_staging,
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
    path = resolve_socket(socket_path)

    def ready(where: str) -> None:
        click.echo(f"busd {__version__}: listening on {where}")

    plugins = PluginManager()
    plugins.load_entry_points()
    made: list[Daemon] = []

    def make() -> Daemon:
        accountant = Accountant(
            tool_timeout_s=default_limit,
            tool_limits=limits,
            model_windows=policy.context.model_windows(),  # checked by load_config
        )
        daemon = Daemon(config, plugins=plugins, accountant=accountant)
        made.append(daemon)
        if gc_freeze:  # imports, plugins, the journal's recovery: full collections skip them
            daemon.gc.frozen = freeze_startup_heap()
            logger.debug("%d objects frozen out of garbage collection", daemon.gc.frozen)
        return daemon

    try:
        # The daemon (and its journal) is made once the socket is ours.
        trio.run(partial(serve_forever, path, make, on_ready=ready))
    except AlreadyRunning as exc:
        fail(str(exc))
    except EndpointError as exc:
        fail(str(exc))
    except JournalError as exc:
        fail(f"{exc} (--journal PATH puts it elsewhere, --no-journal runs without one)")
    except PluginConfigError as exc:
        fail(str(exc), 2)
    except BaseExceptionGroup as group:
        refused = _leaf(group, PluginConfigError)
        if refused is None:
            raise
        fail(str(refused), 2)
    journal = made[0].journal if made else None
    if journal is not None and journal.unjournaled:
        sys.exit(UNJOURNALED)  # the log said how many events and which seqs


def _leaf(group: BaseExceptionGroup[BaseException], kind: type[Exception]) -> Exception | None:
    """The first ``kind`` exception inside nested groups (a service's, out of the nurseries)."""
    matched, _ = group.split(kind)
    while isinstance(matched, BaseExceptionGroup):
        matched = matched.exceptions[0]  # type: ignore[assignment]
    return matched


def _tool_limits(
    policy: FileConfig, flag: float | None, per_tool: tuple[str, ...]
) -> tuple[float | None, dict[str, float | None]]:
    """Tool limits: the flags over the config file's ``[tools]``; 0 means none."""
    default, limits = policy.tools.seconds()  # checked by load_config
    if flag is not None:
        if flag < 0:
            fail(f"--tool-timeout cannot be negative: {flag:g} (0: no limit)", 2)
        default = flag or None
    for item in per_tool:
        name, sep, value = item.partition("=")
        try:
            if not sep or not name.strip():
                raise ValueError("expected NAME=DURATION")
            seconds = parse_duration(value.strip())
            if seconds < 0:
                raise ValueError("a limit cannot be negative")
        except ValueError as exc:
            fail(f"--tool-limit {item!r}: {exc}", 2)
        limits[name.strip()] = seconds or None
    return default, limits


def permission_wait(policy: FileConfig, flag: float | None) -> float | None:
    """How long a request waits for a person: the flag, else the file, else the default.

    0 waits for ever (``None``).
    """
    if flag is not None and flag < 0:
        fail(f"--permission-timeout cannot be negative: {flag:g} (0: wait for ever)", 2)
    from_file = policy.permissions.timeout_s()  # checked by load_config
    given = flag if flag is not None else from_file
    seconds = given if given is not None else DEFAULT_PERMISSION_TIMEOUT
    return seconds or None


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
