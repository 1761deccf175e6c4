"""``busd hook``, ``busd hooks`` and ``busd statusline``: an agent's own hooks report to busd.

``busd hooks NAME --install`` writes busd's entries into the agent's
settings (the plugin of ``busd_agent_hooks`` NAME knows the file and its
shape); the agent then runs ``busd hook NAME`` with a JSON payload on stdin
at each point of its life, and ``busd statusline NAME`` for its status line.

A hook must never break the agent: whatever goes wrong (no daemon, a
refused connection, a payload that is not the agent's, a plugin missing),
``busd hook`` says so in one line on stderr and exits 0 without a decision,
so the agent carries on as if busd were not there. docs/claude-code-hooks.md
describes Claude Code's.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any, NoReturn

import click
import trio

from ..client import Client, ConnectionLost, DaemonNotRunning, RequestFailed
from ..client import connect as busd_connect
from ..plugins.agenthooks import AgentHooks, Ask, HookCommands, Report, Settled
from ..plugins.manager import PluginManager
from ..wire import AskPermission, Ingest
from ..wire.address import EndpointError, resolve_socket_path
from ._common import fail, socket_option
from .info import print_line

__all__ = ["hook", "hooks", "statusline"]

ASK_TIMEOUT = 55.0
"""Seconds ``busd hook`` waits for a frontend's answer by default."""
MARGIN = 5.0
"""Seconds the agent's hook timeout adds to the wait (connecting, starting Python)."""
REPORT_DEADLINE = 5.0
"""Seconds a reporting hook may take, all told, before it gives up (the agent waits for it)."""
MAX_STDIN = 64 << 20
"""Bytes of a hook payload read at most (Claude Code's are JSON objects, usually small)."""


def _note(name: str, message: str) -> None:
    click.echo(f"busd: hook {name}: {message}", err=True)


def _agent_hooks(name: str) -> AgentHooks | None:
    manager = PluginManager()
    manager.load_entry_points()
    return manager.agent_hooks().get(name)


def _known(name: str) -> AgentHooks:
    found = _agent_hooks(name)
    if found is None:
        manager = PluginManager()
        manager.load_entry_points()
        loaded = ", ".join(sorted(manager.agent_hooks())) or "none"
        fail(f"no agent hooks named {name!r} (loaded: {loaded})")
    return found


def _read_payload() -> dict[str, Any]:
    """The JSON object on stdin; ``ValueError`` says what is wrong with it."""
    data = sys.stdin.buffer.read(MAX_STDIN + 1)
    if len(data) > MAX_STDIN:
        raise ValueError(f"the payload is over {MAX_STDIN >> 20} MiB")
    try:
        payload = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"the payload on stdin is not JSON ({exc})") from None
    if not isinstance(payload, dict):
        raise ValueError(f"the payload on stdin is not a JSON object but {type(payload).__name__}")
    return payload


async def _report(client: Client, report: Report) -> str | None:
    """Send a hook's events; a refusal is returned for the user, never raised."""
    frame = Ingest(sdk=report.sdk, events=report.events, session_id=report.session_id, end=True)
    await client.send_frame(frame)
    await client.ping()  # the daemon handled the ingest (frames are handled in order)
    if client.errors:
        error = client.errors[0]
        return f"the daemon refused the events: {error.code}: {error.message}"
    return None


async def _ask(client: Client, ask: Ask, patience: float) -> Settled | None:
    command = AskPermission(
        session_id=ask.session_id,
        tool=ask.tool,
        input=ask.input,
        tool_call_id=ask.tool_call_id,
        agent_id=ask.agent_id,
        title=ask.title,
        category=ask.category,
        options=ask.options,
        timeout=patience,
    )
    result = await client.request(command)
    if result.get("outcome") not in ("allowed", "denied"):
        return None
    return Settled(
        outcome=result["outcome"],
        option_id=result.get("option_id"),
        by=result.get("by"),
        reason=result.get("reason"),
    )


async def _run_hook(
    name: str, agent: AgentHooks, payload: dict[str, Any], path: Path, patience: float
) -> str:
    """What to print on stdout; trouble is noted on stderr and prints nothing."""
    call = agent.read(payload)
    if call is None:
        return ""
    deadline = patience + MARGIN if isinstance(call, Ask) else REPORT_DEADLINE
    try:
        with trio.fail_after(deadline):
            async with busd_connect(path, client=f"busd-hook-{name}", role="agent") as client:
                if isinstance(call, Report):
                    refused = await _report(client, call)
                    if refused is not None:
                        _note(name, refused)
                    return ""
                decision = await _ask(client, call, patience)
    except DaemonNotRunning as exc:
        _note(name, f"{exc}; the agent decides")
        return ""
    except ConnectionLost as exc:
        _note(name, f"the daemon refused or dropped the connection ({exc.reason}: {exc})")
        return ""
    except RequestFailed as exc:
        _note(name, f"the daemon refused the request ({exc.code}: {exc}); the agent decides")
        return ""
    except trio.TooSlowError:
        _note(name, f"no answer from the daemon within {deadline:g}s; the agent decides")
        return ""
    return agent.answer(payload, decision)


def _patience(given: str | None, name: str) -> float:
    """``--timeout``: a bad value is noted and the default used (a hook never fails on it)."""
    if given is None:
        return ASK_TIMEOUT
    try:
        seconds = float(given)
    except ValueError:
        seconds = -1.0
    if not 0.1 <= seconds <= 86_400:
        _note(name, f"--timeout {given!r} is not 0.1 to 86400 seconds: {ASK_TIMEOUT:g} used")
        return ASK_TIMEOUT
    return seconds


# Claude Code reads exit code 2 as "block this", so not even a usage error may exit 2:
# unknown options are ignored, a missing NAME and a bad --timeout are noted.
@click.command(
    "hook",
    short_help="Run as an agent's hook, as busd hooks installs it.",
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
)
@click.argument("name", required=False)
@click.option(
    "--timeout",
    "given_timeout",
    default=None,
    metavar="SECONDS",
    help=f"Seconds to wait for a frontend to answer a permission; then the agent decides "
    f"(default: {ASK_TIMEOUT:g}).",
)
@socket_option
def hook(name: str | None, given_timeout: str | None, socket_path: Path | None) -> NoReturn:
    """Run as agent NAME's hook: read its JSON on stdin, report to busd or ask busd.

    Installed by `busd hooks NAME --install`. Never fails the agent: on any
    trouble it says why on stderr and exits 0 with no decision.
    """
    label = name or "?"
    try:
        if name is None:
            raise ValueError("no agent named (busd hook NAME, e.g. busd hook claude-code)")
        patience = _patience(given_timeout, name)
        path = resolve_socket_path(socket_path)
        agent = _agent_hooks(name)
        if agent is None:
            raise ValueError(f"no agent hooks named {name!r} are installed")
        payload = _read_payload()
        text = trio.run(partial(_run_hook, name, agent, payload, path, patience))
    except (ValueError, EndpointError) as exc:
        _note(label, str(exc))
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:  # never a traceback into the agent's screen, never its failure
        _note(label, f"failed: {type(exc).__name__}: {exc}")
    else:
        if text:
            click.echo(text)
    sys.exit(0)


def busd_command() -> str:
    """How the agent's settings should run this busd: its absolute path, shell-quoted."""
    argv0 = Path(sys.argv[0])
    if argv0.name == "busd" and argv0.exists():
        return shlex.quote(str(argv0.resolve()))
    found = shutil.which("busd")
    if found is not None:
        return shlex.quote(str(Path(found).resolve()))
    return f"{shlex.quote(sys.executable)} -m busd"


def commands_for(name: str, *, timeout: float, socket_path: Path | None) -> HookCommands:
    """The command lines of agent ``name``'s settings, for this busd."""
    busd = busd_command()
    socket = f" --socket {shlex.quote(str(socket_path.resolve()))}" if socket_path else ""
    quoted = shlex.quote(name)
    return HookCommands(
        hook=f"{busd} hook {quoted}{socket}",
        permission=f"{busd} hook {quoted} --timeout {timeout:g}{socket}",
        permission_timeout=timeout + MARGIN,
        statusline=f"{busd} statusline {quoted}{socket}",
    )


def _load_settings(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        fail(f"cannot read {path}: {exc.strerror}")
    try:
        settings = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as exc:
        fail(f"{path} is not valid JSON (line {exc.lineno}): left as it is")
    if not isinstance(settings, dict):
        fail(f"{path} does not hold a JSON object: left as it is")
    return settings


def _write_settings(path: Path, settings: dict[str, Any]) -> Path | None:
    """Write ``settings`` to ``path`` atomically, after a backup of what was there."""
    backup = None
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        stamp = time.strftime("%Y%m%dT%H%M%S")
        backup = path.with_name(f"{path.name}.busd-{stamp}.bak")
        shutil.copy2(path, backup)
    temporary = path.with_name(f".{path.name}.busd-{os.getpid()}.tmp")
    temporary.write_text(json.dumps(settings, indent=2, ensure_ascii=False) + "\n")
    if backup is not None:
        shutil.copymode(backup, temporary)
    os.replace(temporary, path)
    return backup


@click.command("hooks", short_help="Print, install or remove busd's hooks in an agent's settings.")
@click.argument("name")
@click.option("--install", "action", flag_value="install", help="Merge them into the settings.")
@click.option("--uninstall", "action", flag_value="uninstall", help="Remove busd's entries only.")
@click.option(
    "--settings",
    "settings_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The settings file (Claude Code: $CLAUDE_CONFIG_DIR/settings.json, else ~/.claude/).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=1, max=3600),
    default=ASK_TIMEOUT,
    show_default=True,
    help="Seconds a permission waits for a frontend before the agent's own prompt decides.",
)
@click.option(
    "--socket",
    "socket_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Put this socket in the commands (default: they use $BUSD_SOCKET or the default).",
)
def hooks(
    name: str,
    action: str | None,
    settings_path: Path | None,
    timeout: float,
    socket_path: Path | None,
) -> None:
    """Print agent NAME's settings that run busd's hooks; --install merges them in.

    Installing keeps every key and hook already there, writes a backup first,
    and twice is the same as once; --uninstall removes busd's entries only.
    """
    agent = _known(name)
    commands = commands_for(name, timeout=timeout, socket_path=socket_path)
    if action is None:
        fragment = agent.install({}, commands)
        click.echo(json.dumps(fragment, indent=2, ensure_ascii=False))
        return
    path = settings_path if settings_path is not None else agent.settings_path(None)
    current = _load_settings(path)
    try:
        if action == "install":
            for line in agent.notes(current, commands):
                click.echo(f"busd: {line}", err=True)
            changed = agent.install(current, commands)
        else:
            changed = agent.uninstall(current)
    except ValueError as exc:
        fail(f"{path}: {exc}: left as it is")
    if changed == current:
        state = "installed" if action == "install" else "not installed"
        click.echo(f"busd: {name} hooks already {state} in {path}: nothing to change")
        return
    try:
        backup = _write_settings(path, changed)
    except OSError as exc:
        fail(f"cannot write {path}: {exc}")
    saved = f" (backup: {backup})" if backup is not None else ""
    done = "installed into" if action == "install" else "removed from"
    click.echo(f"busd: {name} hooks {done} {path}{saved}")


@click.command("statusline", short_help="Print busd's line for an agent's status line.")
@click.argument("name")
@socket_option
def statusline(name: str, socket_path: Path | None) -> NoReturn:
    """Print busd's line for agent NAME's status line (its JSON on stdin).

    Always exits 0, so the agent's screen never shows an error for it.
    """
    try:
        path = resolve_socket_path(socket_path)
        agent = _agent_hooks(name)
        if agent is None:
            raise ValueError(f"no agent hooks named {name!r}")
        session_id = agent.status_session(_read_payload())
        run = partial(
            print_line, path, session_id, client=f"busd-statusline-{name}", unknown="busd: …"
        )
        trio.run(run)
    except (ValueError, EndpointError) as exc:
        click.echo(f"busd: {exc}")
    except Exception as exc:  # the agent's status line shows this, never a traceback
        click.echo(f"busd: {type(exc).__name__}")
    sys.exit(0)
