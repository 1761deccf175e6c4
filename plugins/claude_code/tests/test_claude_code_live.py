"""busd drives the real Claude Code CLI against a local stand-in model (issue 17).

The CLI is the one bundled in the claude-agent-sdk wheel; the model is
``fixtures/record_stand_in.py`` (a sub-agent on haiku, then an answer),
served in this process. Nothing is faked between the daemon and the CLI: the
claude-code driver starts it through the SDK and the adapter translates what
it writes.
"""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import claude_agent_sdk
import pytest
import trio

from busd import TokenUsage, add_usage
from busd.core.events import (
    Envelope,
    Event,
    RunFinished,
    SessionContext,
    TextComplete,
    ToolStart,
)
from busd.daemon.hub import Daemon, DaemonConfig
from busd.plugins.manager import PluginManager

CLI = Path(claude_agent_sdk.__file__).parent / "_bundled" / "claude"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
MODEL = "claude-sonnet-4-5-20250929"

pytestmark = pytest.mark.skipif(not CLI.exists(), reason=f"no bundled Claude Code CLI at {CLI}")


def _stand_in_module() -> Any:
    spec = importlib.util.spec_from_file_location(
        "record_stand_in", FIXTURES / "record_stand_in.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.served = []  # (model, usage, output tokens) of every answer, in order
    sse = module._sse

    def served(model: str, ident: str, usage: dict[str, int], out: int, *rest: Any) -> bytes:
        module.served.append((model, usage, out))
        data: bytes = sse(model, ident, usage, out, *rest)
        return data

    module._sse = served
    return module


@pytest.fixture
def stand_in() -> Iterator[tuple[str, Any]]:
    """The stand-in Messages API on a free port: ``(base URL, its module)``."""
    module = _stand_in_module()
    server = ThreadingHTTPServer(("127.0.0.1", 0), module.Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", module
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


class Runs:
    """A daemon with the installed plugins, recording what it publishes."""

    def __init__(self, home: Path, base_url: str) -> None:
        plugins = PluginManager(environ={})
        plugins.load_entry_points()
        self.daemon = Daemon(DaemonConfig(), plugins=plugins)
        self.seen: list[Envelope[Event]] = []
        self._finished: dict[str, trio.Event] = {}
        self.daemon.bus.on_all(self._record)
        self.home = home
        self.env = {"ANTHROPIC_BASE_URL": base_url, "ANTHROPIC_API_KEY": "sk-ant-stand-in"}
        self.last: str | None = None

    def _record(self, envelope: Envelope[Event]) -> None:
        self.seen.append(envelope)
        if isinstance(envelope.event, RunFinished) and envelope.run_id is not None:
            self._finished.setdefault(envelope.run_id, trio.Event()).set()

    async def run(self, prompt: str, session_id: str | None = None) -> tuple[str, RunFinished]:
        """Run ``prompt`` to its end; ``(session id, summary)``; ``self.last`` is its run id."""
        state = self.daemon.runs.start(
            adapter="claude-code",
            prompt=prompt,
            started_by="test",
            session_id=session_id,
            model=MODEL,
            cwd=str(self.home),
            options={"cli_path": str(CLI), "env": {**self.env, "HOME": str(self.home)}},
        )
        self.last = state.run_id
        with trio.fail_after(120):
            await self._finished.setdefault(state.run_id, trio.Event()).wait()
        [finished] = [
            e.event
            for e in self.seen
            if e.run_id == state.run_id and isinstance(e.event, RunFinished)
        ]
        return state.request.session_id, finished

    def of(self, run_id: str | None, cls: type[Any]) -> list[Any]:
        return [e.event for e in self.seen if e.run_id == run_id and isinstance(e.event, cls)]


def _total(models: dict[str, TokenUsage]) -> TokenUsage:
    total = TokenUsage()
    for usage in models.values():
        total = add_usage(total, usage)
    return total


def _same(a: TokenUsage, b: TokenUsage) -> bool:
    counts = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")
    costs = (a.cost_usd or 0.0, b.cost_usd or 0.0)
    same_counts = all(getattr(a, name) == getattr(b, name) for name in counts)
    return same_counts and abs(costs[0] - costs[1]) < 1e-9


async def test_busd_drives_the_real_cli_and_gets_every_model(
    tmp_path: Path, stand_in: tuple[str, Any]
) -> None:
    base_url, model = stand_in
    runs = Runs(tmp_path, base_url)
    async with trio.open_nursery() as nursery:
        await nursery.start(runs.daemon.run)
        session_id, finished = await runs.run("Ask a sub-agent on haiku what six times seven is.")
        nursery.cancel_scope.cancel()
    run_id = runs.last
    assert (finished.status, finished.error) == ("ok", None)
    [agent] = [t for t in runs.of(run_id, ToolStart) if t.name == "Agent"]
    assert agent.input["model"] == "haiku"
    texts = [t.text for t in runs.of(run_id, TextComplete)]
    assert "The sub-agent says: it is 42." in texts
    # Per model, exactly what the stand-in served (the main model's two calls,
    # a second answer after the background sub-agent's notice, side calls).
    for name, tokens in finished.models.items():
        calls = [(usage, out) for m, usage, out in model.served if m == name]
        assert calls, name
        assert tokens.input_tokens == sum(u["input_tokens"] for u, _ in calls), name
        assert tokens.output_tokens == sum(out for _, out in calls), name
        writes = sum(u["cache_creation_input_tokens"] for u, _ in calls)
        assert tokens.cache_write_tokens == writes, name
        assert tokens.cache_read_tokens == sum(u["cache_read_input_tokens"] for u, _ in calls)
    assert set(finished.models) == {MODEL, "claude-haiku-5-5"}
    # The run's total is every model's, cost included.
    assert _same(finished.usage, _total(finished.models)), (finished.usage, finished.models)
    # The context after the run: the main model's last call, 1 + 300 + 5,000 in, 146 out.
    context = runs.of(run_id, SessionContext)[-1]
    assert (context.used, context.window) == (1 + 300 + 5_000 + 146, 200_000)
    snapshot = runs.daemon.sessions.snapshot(session_id)
    assert snapshot is not None
    assert snapshot.usage is not None
    assert _same(snapshot.usage, finished.usage)


async def test_a_continued_session_adds_up_its_runs_with_the_real_cli(
    tmp_path: Path, stand_in: tuple[str, Any]
) -> None:
    """Run 2 resumes the CLI's session; its tokens are its own, the session's the sum."""
    base_url, _ = stand_in
    runs = Runs(tmp_path, base_url)
    async with trio.open_nursery() as nursery:
        await nursery.start(runs.daemon.run)
        session_id, first = await runs.run("Ask a sub-agent on haiku what six times seven is.")
        again, second = await runs.run("And seven times six?", session_id=session_id)
        nursery.cancel_scope.cancel()
    assert again == session_id
    assert (first.status, second.status) == ("ok", "ok")
    # Run 2 is one call: the stand-in's last answer (the resumed CLI's own totals
    # include run 1, restored from its transcript: nothing may count twice).
    (model, last_usage, last_out) = stand_in[1].served[-1]
    assert model == MODEL
    assert (second.usage.output_tokens, second.usage.input_tokens) == (
        last_out,
        last_usage["input_tokens"],
    )
    snapshot = runs.daemon.sessions.snapshot(session_id)
    assert snapshot is not None
    assert snapshot.usage is not None
    assert _same(snapshot.usage, add_usage(first.usage, second.usage))
    served_out = sum(out for _, _, out in stand_in[1].served)
    assert snapshot.usage.output_tokens == served_out
