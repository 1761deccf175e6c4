"""``busd run``: one headless agent run, its outcome as the exit code; ``busd cancel``: stop one."""

from __future__ import annotations

import logging
import os
import re
import sys
from decimal import Decimal
from functools import partial
from pathlib import Path
from typing import Any, Final

import click

from ._common import fail, resolve_socket, run_client, socket_option


@click.command("run")
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
    "--context-window",
    "context_window",
    metavar="TOKENS",
    default=None,
    help="The session's context window (200000, 200k, 1m): over the model table and config.",
)
@click.option(
    "--no-env",
    "send_env",
    flag_value=False,
    default=True,
    help="Run the agent with the daemon's environment, not this shell's.",
)
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
    context_window: str | None,
    send_env: bool,
    options: tuple[str, ...],
    watchdog: float | None,
    log_level: str,
) -> None:
    """Run PROMPT with an agent and exit with its outcome (`-`: read the prompt from stdin).

    Uses the daemon at the socket, or starts one in-process for this run.
    Either way the agent runs in --cwd with this shell's environment
    (API keys, CLI paths), unless --no-env.
    Permission requests are decided by --deny, then --allow; a tool no rule
    matches is denied. The rules travel with the run: the daemon applies
    them after its own rules and before any attached frontend is asked.
    Exit codes: 0 ok, 1 agent error, 2 usage error, 124 watchdog timeout,
    130 cancelled (SIGINT/SIGTERM cancel the run).
    """
    from ..daemon.embedded import serve_private
    from ..frontends.headless import HeadlessRun, ToolRules, parse_option, run_headless
    from ..frontends.watch import silence

    window = None if context_window is None else parse_tokens(context_window, "--context-window")
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
        env=dict(os.environ) if send_env else None,
        rules=ToolRules(allow=allow, deny=deny),
        watchdog=watchdog,
        socket_path=None if socket_path is None else str(socket_path),
        context_window=window,
    )
    pretty = fmt == "pretty" or (fmt is None and sys.stdout.isatty())
    out, err = sys.stdout, sys.stderr
    reading = True

    def write(text: str) -> None:
        nonlocal reading
        if not reading:
            return
        try:
            out.write(text)
            out.flush()
        except BrokenPipeError:  # `busd run ... | head`: the reader has had enough; the run goes on
            reading = False
            silence(out)

    def note(text: str) -> None:
        err.write(text)
        err.flush()

    run_client(
        partial(run_headless, spec, out=write, err=note, pretty=pretty, start_local=serve_private)
    )


_TOKENS: Final = re.compile(r"(\d+(?:\.\d+)?)([km]?)")
_SCALE: Final = {"": 1, "k": 1_000, "m": 1_000_000}


def parse_tokens(text: str, flag: str) -> int:
    """A positive token count, as people write it: ``200000``, ``200_000``, ``200k``, ``1m``.

    Anything else is a usage error: one line, exit 2.
    """
    match = _TOKENS.fullmatch(text.strip().lower().replace("_", "").replace(",", ""))
    if match is not None:
        number = Decimal(match[1]) * _SCALE[match[2]]
        if number >= 1 and number == int(number):
            return int(number)
    fail(f"error: {flag}: {text!r} is not a positive token count (200000, 200k, 1m)", 2)


@click.command("cancel")
@socket_option
@click.argument("run_id")
@click.option("--reason", default=None, help="Why, for busd.run.cancelled (default: none).")
def cancel_command(socket_path: Path | None, run_id: str, reason: str | None) -> None:
    """Cancel the run RUN_ID the daemon drives (a `busd run` following it exits 130).

    The run ends with status `cancelled`; its partial text stays. Exit 1
    when the daemon has no such run or it already ended.
    """
    from ..client import RequestFailed, connect

    path = resolve_socket(socket_path)

    async def cancel() -> int:
        async with connect(path, client="busd-cancel") as client:
            try:
                await client.cancel_run(run_id, reason=reason)
            except RequestFailed as exc:
                fail(str(exc))  # unknown_run, run_finished, forbidden
        return 0

    run_client(cancel)
