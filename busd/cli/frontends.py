"""The frontends: ``busd watch``, ``busd web`` and ``busd demo``.

Each imports its frontend when it runs, so that ``busd --help`` stays fast.
"""

from __future__ import annotations

import logging
import sys
from functools import partial
from pathlib import Path

import click
import trio

from ._common import fail, resolve_socket, run_client, socket_option


@click.command()
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

    path = resolve_socket(socket_path)
    run_client(
        partial(
            run_watch,
            path,
            name=name or default_name(),
            sessions=sessions,
            plain=plain or not sys.stdout.isatty(),
            exit_when_idle=exit_when_idle,
        )
    )


@click.command()
@socket_option
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on (requests must name it or a loopback name as their Host).",
)
@click.option(
    "--port", type=click.IntRange(0, 65535), default=0, help="Port (default 0: a free one)."
)
@click.option("--name", default=None, help="Client name, the `by` of answers [web@host:pid].")
@click.option(
    "--read-only",
    is_flag=True,
    help="Only show: connect as an observer, no permission answers, no cancels.",
)
def web(socket_path: Path | None, host: str, port: int, name: str | None, read_only: bool) -> None:
    """Serve the sessions to browsers: prints the URL to open (with its access token)."""
    from ..frontends.web import run_web

    logging.basicConfig(level="WARNING", format="busd: %(name)s: %(message)s")
    path = resolve_socket(socket_path)

    def ready(url: str) -> None:
        click.echo(f"busd web: open {url}")

    try:
        run_client(
            partial(
                run_web,
                path,
                host=host,
                port=port,
                name=name,
                on_ready=ready,
                read_only=read_only,
            )
        )
    except OSError as exc:  # the address is taken or cannot be bound
        fail(f"cannot listen on {host}:{port}: {exc}")


@click.command()
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
    from ..daemon.embedded import serve_private
    from ..frontends.demo import BUNDLED, default_interactive, run_demo

    interactive = default_interactive() and not plain
    try:
        code = trio.run(
            partial(
                run_demo,
                lambda text: click.echo(text, nl=False),
                start_local=serve_private,
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
