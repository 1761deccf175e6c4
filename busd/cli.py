"""The ``busd`` command line."""

from __future__ import annotations

import click
import msgspec

from . import __version__
from .catalog import Catalog
from .catalogdoc import render_markdown


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
