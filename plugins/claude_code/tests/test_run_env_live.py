"""A run through a running daemon has its starter's environment and cwd (issue 17, bug 6).

``busd serve`` runs as a subprocess in an ``env -i``-like environment with no
API key and no model URL, in a directory of its own. ``busd run --socket``
starts from another directory, with ``ANTHROPIC_API_KEY`` and
``ANTHROPIC_BASE_URL`` pointing at ``messages_stand_in.py``, which records
the key of every request. The run must succeed with the caller's key, and
the real Claude Code CLI's tool must run in the caller's directory. A run
that fails (``--no-env``: the daemon's environment has no key) costs the
daemon's terminal one line, never a traceback.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import claude_agent_sdk
import pytest
import trio

from tests.daemon_helpers import load_module

CLI = Path(claude_agent_sdk.__file__).parent / "_bundled" / "claude"
HERE = Path(__file__).resolve().parent
MODEL = "claude-sonnet-4-5-20250929"
CALLER_KEY = "sk-ant-the-caller"

pytestmark = pytest.mark.skipif(not CLI.exists(), reason=f"no bundled Claude Code CLI at {CLI}")


def _load(name: str) -> Any:
    return load_module(HERE / f"{name}.py", f"cc_env_{name}")


standin_module = _load("messages_stand_in")
live = _load("live_processes")


class KeyedStandIn(standin_module.StandIn):  # type: ignore[misc,name-defined]
    """The scripted model, also recording the API key each ``POST`` came with.

    Claude Code sends it as ``x-api-key``, the anthropic SDK 2.x as a bearer token.
    """

    def __init__(self, **kwargs: Any) -> None:
        self.keys: list[str] = []
        super().__init__(**kwargs)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        base: Any = super()._handler()
        keys = self.keys

        class Handler(base):  # type: ignore[misc]
            def do_POST(self) -> None:
                bearer = (self.headers.get("authorization") or "").removeprefix("Bearer ")
                keys.append(self.headers.get("x-api-key") or bearer)
                super().do_POST()

        return Handler


@pytest.fixture
def standin() -> Iterator[Any]:
    where = "pwd > where.txt"
    with KeyedStandIn(tool=("Bash", {"command": where, "description": "Where am I"})) as served:
        yield served


@asynccontextmanager
async def serving(root: Path) -> AsyncIterator[tuple[Path, Any]]:
    """``busd serve`` in ``root/daemon`` with an environment that has no key and no model URL."""
    home = root / "daemon"
    home.mkdir()
    socket = home / "run" / "bus.sock"
    argv = [live.BUSD, "serve", "--socket", socket, "--no-journal", "--log-level", "warning"]
    serve = await live.Program.start("busd-serve", argv, env=live.busd_env(home), cwd=home)
    try:
        with trio.fail_after(30):
            await serve.wait_line(lambda line: "listening on" in line)
        yield socket, serve
    finally:
        await serve.stop()


async def busd_run(caller: Path, socket: Path, env: dict[str, str], *args: str) -> Any:
    run = await live.Program.start(
        "busd-run", [live.BUSD, "run", "--json", "--socket", socket, *args], env=env, cwd=caller
    )
    with trio.fail_after(60):
        await run.finish()
    return run


async def test_a_run_through_busd_serve_has_the_callers_key_and_cwd(
    tmp_path: Path, standin: Any
) -> None:
    caller = tmp_path / "caller"
    caller.mkdir()
    env = live.busd_env(caller, ANTHROPIC_BASE_URL=standin.url, ANTHROPIC_API_KEY=CALLER_KEY)
    async with serving(tmp_path) as (socket, serve):
        argv = ["--adapter", "claude-code", "--model", MODEL, "--allow", "Bash", "Where are you?"]
        run = await busd_run(caller, socket, env, *argv)
        assert run.process.returncode == 0, run.stderr
        # The CLI's tool ran in the caller's directory, not the daemon's.
        assert (caller / "where.txt").read_text().strip() == str(caller)
        assert not (tmp_path / "daemon" / "where.txt").exists()
        assert "tool" in standin.kinds()
        assert standin.keys
        assert set(standin.keys) == {CALLER_KEY}
        [finished] = [e for e in run.envelopes() if e["event"]["type"] == "busd.run.finished"]
        assert finished["event"]["status"] == "ok"

        # The same run without the caller's environment: the daemon has no key.
        asked = len(standin.keys)
        failed = await busd_run(caller, socket, env, "--no-env", *argv)
        assert failed.process.returncode == 1, failed.stderr
        assert "busd: error:" in failed.stderr
        assert len(standin.keys) == asked  # the CLI never reached the model
    assert "Traceback" not in serve.stderr
    [line] = [line for line in serve.stderr.splitlines() if "failed" in line]
    assert line.startswith("busd: busd.runs: run run-"), line
    assert "ClaudeCodeError" in line
    assert "Not logged in" in line


async def test_an_anthropic_run_through_busd_serve_uses_the_callers_key(
    tmp_path: Path, standin: Any
) -> None:
    caller = tmp_path / "caller"
    caller.mkdir()
    env = live.busd_env(caller, ANTHROPIC_BASE_URL=standin.url, ANTHROPIC_API_KEY=CALLER_KEY)
    async with serving(tmp_path) as (socket, serve):
        run = await busd_run(caller, socket, env, "--adapter", "anthropic", "Say hi")
        assert run.process.returncode == 0, run.stderr
        assert standin.keys == [CALLER_KEY]
        assert standin.kinds() == ["side"]  # no tools offered: the scripted plain answer

        failed = await busd_run(caller, socket, env, "--no-env", "--adapter", "anthropic", "Hi")
        assert failed.process.returncode == 1, failed.stderr
        assert "no Anthropic credentials" in failed.stderr
        assert standin.keys == [CALLER_KEY]
    lines = serve.stderr.splitlines()
    assert "Traceback" not in serve.stderr
    [line] = [line for line in lines if "failed" in line]
    assert "AnthropicRunError: no Anthropic credentials" in line
