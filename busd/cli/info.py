"""What busd knows and runs: ``busd catalog``, ``schema``, ``status`` and ``plugins``.

``busd status --line`` prints one session's state in one line, for tmux and
shell prompts; Claude Code's status line gets the same line
(``busd statusline claude-code``, :mod:`.hooks`), built by :func:`session_line`.
"""

from __future__ import annotations

import math
import sys
from functools import partial
from pathlib import Path
from typing import Any

import click
import msgspec
import trio

from ..client import Client, ConnectionLost, DaemonNotRunning, RequestFailed
from ..client import connect as busd_connect
from ..core.catalog import Catalog
from ..core.catalogdoc import render_markdown
from ..core.errors import BusdError
from ..core.sessions import SessionSnapshot, SessionSummary
from ..frontends.humanize import format_tokens, status_line, summary_line
from ..plugins.manager import PluginManager
from ..wire.frames import Sessions, Snapshot, Status
from ..wire.schema import protocol_schema
from ._common import resolve_socket, run_client, socket_option

LINE_TIMEOUT = 2.0
"""Seconds a status line waits for the daemon before it says so (a prompt must not hang)."""


@click.command()
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


@click.command()
def schema() -> None:
    """Print the protocol's JSON Schema: every frame, result and event (docs/protocol.md).

    The events of the plugins installed are in it, as in the daemon's catalog.
    """
    types = Catalog()
    manager = PluginManager()
    manager.load_entry_points()
    for plugin, cls in manager.event_types():
        try:
            types.register(cls)
        except BusdError as exc:  # the daemon reports it too, and starts without it
            click.echo(f"busd: plugin {plugin}: {exc}", err=True)
    text = msgspec.json.format(msgspec.json.encode(protocol_schema(types)), indent=2)
    click.echo(text.decode())


def _cost(usd: float) -> str:
    return f"${usd:.2f}" if usd >= 0.1 else f"${usd:.3f}"


def session_line(snapshot: SessionSnapshot) -> str:
    """One session in one line: what it does, tokens, cost, context fill, pending permissions.

    ``fix-login ✶ Working… (12s · ↓ 1.2k tokens) · Bash · $0.42 · ctx 23% · ⚠ 1 permission``;
    the same parts busd's frontends show (busd/frontends/humanize.py).
    """
    label = snapshot.title or snapshot.session_id[:8]
    stats = snapshot.stats
    if snapshot.status == "active":
        verb = "Thinking…" if stats is not None and stats.thinking else "Working…"
        state = status_line(stats, verb=verb) if stats is not None else f"✶ {verb}"
    elif snapshot.status == "error":
        state = f"✗ {snapshot.error or 'error'}"
    else:
        state = summary_line(stats) if stats is not None and stats.elapsed_s >= 1 else "idle"
    parts = [f"{label} {state}"]
    if snapshot.status == "active" and snapshot.tools:
        parts.append(", ".join(sorted(set(snapshot.tools.values()))))
    usage = snapshot.usage
    if usage is not None and usage.cost_usd is not None:
        parts.append(_cost(usage.cost_usd))
    context = snapshot.context
    if context is not None and context.percent is not None:
        parts.append(f"ctx {'~' if context.estimated else ''}{math.floor(context.percent)}%")
    elif context is not None and context.used:
        parts.append(f"ctx {format_tokens(context.used)}")
    if snapshot.permissions:
        count = len(snapshot.permissions)
        tools = ", ".join(sorted({p.event.tool for p in snapshot.permissions}))
        parts.append(f"⚠ {count} permission{'s' if count > 1 else ''} ({tools})")
    return " · ".join(parts)


def daemon_line(sessions: list[SessionSummary]) -> str:
    """The line when no session is active: how many the daemon knows."""
    if not sessions:
        return "busd: no sessions"
    return f"busd: no active session ({len(sessions)} known)"


async def line_of(client: Client, session_id: str | None) -> str:
    """The status line of ``session_id``, else of the most recent active session.

    :raises RequestFailed: ``unknown_session`` for a session the daemon does not know.
    """
    if session_id is None:
        listed = msgspec.convert(await client.request(Sessions(limit=50)), list[SessionSummary])
        active = next((s for s in listed if s.status == "active"), None)
        if active is None:
            return daemon_line(listed)
        session_id = active.session_id
    result = await client.request(Snapshot(session_id=session_id))
    return session_line(msgspec.convert(result, SessionSnapshot))


async def print_line(
    path: Path, session_id: str | None, *, client: str, unknown: str | None = None
) -> int:
    """Print a status line; on trouble a short ``busd: …`` line, and 1.

    ``unknown``: the line for a session the daemon does not know (else trouble).
    """
    try:
        with trio.fail_after(LINE_TIMEOUT):
            async with busd_connect(path, client=client, role="observer") as connected:
                line = await line_of(connected, session_id)
    except DaemonNotRunning:
        line = "busd: not running"
    except ConnectionLost as exc:
        line = f"busd: {exc.reason}"
    except trio.TooSlowError:
        line = "busd: not answering"
    except RequestFailed as exc:
        if exc.code == "unknown_session" and unknown is not None:
            click.echo(unknown)
            return 0
        line = f"busd: {exc.code}"
    else:
        click.echo(line)
        return 0
    click.echo(line)
    return 1


@click.command()
@socket_option
@click.option("--json", "as_json", is_flag=True, help="The raw status as JSON.")
@click.option(
    "--line",
    "one_line",
    is_flag=True,
    help="One line for tmux and shell prompts: the most recent active session (or --session).",
)
@click.option("--session", "session_id", default=None, help="With --line: this session.")
def status(socket_path: Path | None, as_json: bool, one_line: bool, session_id: str | None) -> None:
    """Show the daemon's uptime, clients, subscriptions, sessions and rates."""
    path = resolve_socket(socket_path)
    if session_id is not None and not one_line:
        raise click.UsageError("--session goes with --line")
    if one_line:
        sys.exit(trio.run(partial(print_line, path, session_id, client="busd-status-line")))

    async def run() -> int:
        async with busd_connect(path, client="busd-status", role="admin") as client:
            result = await client.request(Status())
        if as_json:
            click.echo(msgspec.json.format(msgspec.json.encode(result), indent=2))
        else:
            for line in status_lines(result):
                click.echo(line)
        return 0

    run_client(run)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="As JSON.")
def plugins(as_json: bool) -> None:
    """List the plugins busd loads (its own and group `busd`) and what they provide."""
    manager = PluginManager()
    manager.load_entry_points()
    infos = manager.plugins()
    adapters = manager.adapters()
    drivers = manager.drivers()
    attachers = manager.attachers()
    agent_hooks = manager.agent_hooks()
    if as_json:
        click.echo(
            msgspec.json.encode(
                {
                    "plugins": infos,
                    "adapters": sorted(adapters),
                    "drivers": sorted(drivers),
                    "attachers": sorted(attachers),
                    "agent_hooks": sorted(agent_hooks),
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
    if attachers:
        click.echo(f"attachers: {', '.join(sorted(attachers))}")
    if agent_hooks:
        click.echo(f"agent hooks: {', '.join(sorted(agent_hooks))}")
    for failure in manager.failures:
        click.echo(f"FAILED {failure.plugin}: {failure.hook}: {failure.error}", err=True)


def status_lines(result: dict[str, Any], indent: str = "") -> list[str]:
    """``busd status`` for people: one line per figure, tables nested, lists joined."""
    lines: list[str] = []
    width = 28 - len(indent)
    for key, value in result.items():
        label = f"{indent}{key + ':':<{width}}"
        if isinstance(value, dict) and value:
            if all(isinstance(v, list) for v in value.values()):  # roles: role -> rights
                lines.append(label.rstrip())
                lines += [
                    f"{indent}  {name + ':':<{width - 2}} {', '.join(map(str, v)) or '-'}"
                    for name, v in value.items()
                ]
            elif all(isinstance(v, (int, float)) for v in value.values()):  # counts
                lines.append(f"{label} {', '.join(f'{k} {v}' for k, v in value.items())}")
            else:
                lines.append(label.rstrip())
                lines += status_lines(value, indent + "  ")
        elif isinstance(value, list):
            lines.append(f"{label} {', '.join(map(str, value)) or '-'}")
        elif isinstance(value, dict) or value is None:
            lines.append(f"{label} -")
        else:
            lines.append(f"{label} {value}")
    return lines
