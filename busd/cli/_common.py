"""What the command modules share: the socket option, failing, running a client."""

from __future__ import annotations

import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, NoReturn

import click
import trio

from ..client import ConnectionLost, DaemonNotRunning
from ..daemon.journalfile import parse_duration, parse_size
from ..wire.address import EndpointError, resolve_socket_path

socket_option = click.option(
    "--socket",
    "socket_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The daemon's socket (default: $BUSD_SOCKET, else $XDG_RUNTIME_DIR/busd/bus.sock).",
)


def fail(message: str, code: int = 1) -> NoReturn:
    click.echo(f"busd: {message}", err=True)
    sys.exit(code)


def resolve_socket(path: Path | None) -> Path:
    try:
        return resolve_socket_path(path)
    except EndpointError as exc:
        fail(str(exc))


def run_client(main_fn: Callable[[], Awaitable[int]]) -> NoReturn:
    """Run a client command; daemon trouble becomes a message and exit 1."""
    try:
        code = trio.run(main_fn)
    except DaemonNotRunning as exc:
        fail(str(exc))
    except ConnectionLost as exc:  # refused at the door is not lost: say just why
        fail(str(exc) if exc.reason == "forbidden" else f"lost the daemon ({exc})")
    except KeyboardInterrupt:
        sys.exit(130)
    sys.exit(code)


class Duration(click.ParamType[float, Any]):
    """``30d``, ``12h``, ``90m``, ``3600``: seconds."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            return parse_duration(value) if isinstance(value, str) else float(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class Size(click.ParamType[int, Any]):
    """``1GiB``, ``500MiB``, ``1048576``: bytes."""

    name = "size"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            return parse_size(value) if isinstance(value, str) else int(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def default_journal_path() -> Path:
    """``$XDG_STATE_HOME/busd/journal.sqlite3`` (``~/.local/state`` when unset)."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(state) / "busd" / "journal.sqlite3"
