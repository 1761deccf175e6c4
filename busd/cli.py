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


@main.command()
@click.option(
    "--speed",
    type=click.FloatRange(min=0),
    default=1.0,
    show_default=True,
    help="Replay speed: 2 is twice as fast, 0 is instant (durations stay the recorded ones).",
)
@click.option(
    "--window-ms",
    type=click.IntRange(min=0, max=10_000),
    default=16,
    show_default=True,
    help="The frontend's coalescing window (0: every event in its own frame).",
)
def demo(speed: float, window_ms: int) -> None:
    """Replay a recorded agent session through bus, correlation, coalescing and accounting."""
    from .demo import run_demo

    run_demo(lambda text: click.echo(text, nl=False), speed=speed, window=window_ms / 1000)
