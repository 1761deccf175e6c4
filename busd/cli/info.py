"""What busd knows and runs: ``busd catalog``, ``schema``, ``status`` and ``plugins``."""

from __future__ import annotations

from pathlib import Path

import click
import msgspec

from ..client import connect as busd_connect
from ..core.catalog import Catalog
from ..core.catalogdoc import render_markdown
from ..core.errors import BusdError
from ..plugins.manager import PluginManager
from ..wire.frames import Status
from ..wire.schema import protocol_schema
from ._common import resolve_socket, run_client, socket_option


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


@click.command()
@socket_option
@click.option("--json", "as_json", is_flag=True, help="The raw status as JSON.")
def status(socket_path: Path | None, as_json: bool) -> None:
    """Show the daemon's uptime, clients, subscriptions, sessions and rates."""
    path = resolve_socket(socket_path)

    async def run() -> int:
        async with busd_connect(path, client="busd-status", role="admin") as client:
            result = await client.request(Status())
        if as_json:
            click.echo(msgspec.json.format(msgspec.json.encode(result), indent=2))
        else:
            for key, value in result.items():
                click.echo(f"{key + ':':<28} {value}")
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
    if as_json:
        click.echo(
            msgspec.json.encode(
                {
                    "plugins": infos,
                    "adapters": sorted(adapters),
                    "drivers": sorted(drivers),
                    "attachers": sorted(attachers),
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
    for failure in manager.failures:
        click.echo(f"FAILED {failure.plugin}: {failure.hook}: {failure.error}", err=True)
