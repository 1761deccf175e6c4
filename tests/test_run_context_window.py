"""A run's own context window (``start_run.context_window``, issue 16).

The window given with a run sizes its session's context over the model
table and the daemon's ``[context.windows]``: ``busd.context`` and the
run's summary compute ``percent`` and ``free`` on it. Tested through a real
daemon on its Unix socket; the driver is the scripted one of
``tests/test_runs.py`` (its model ``script-1`` is in no table, so only
the config or the run can give it a window). ``busd run --context-window``
with a real agent is in ``plugins/anthropic/tests/test_anthropic_context_parts.py``.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from busd.client import connect
from busd.core.accounting import Accountant
from busd.core.events import (
    ContextUsage,
    Envelope,
    Event,
    RunFinished,
    RunStarted,
    SessionStart,
    Usage,
)
from busd.core.events import TokenUsage as Tokens
from busd.daemon.hub import Daemon
from busd.plugins.manager import PluginManager
from busd.wire import MALFORMED_FRAME, Reply

from .daemon_helpers import RawClient
from .test_runs import ScriptDriver, ScriptPlugin, Watcher, serving, sock_path

__all__ = ["sock_path"]  # the fixture, used by name


def script_daemon(accountant: Accountant) -> tuple[Daemon, Watcher]:
    plugins = PluginManager(environ={})
    plugins.register(ScriptPlugin(ScriptDriver()), name="script")
    daemon = Daemon(plugins=plugins, accountant=accountant)
    return daemon, Watcher(daemon)


def window_of(summary: RunFinished) -> int | None:
    assert summary.status == "ok", summary.error
    assert summary.context is not None
    return summary.context.window


def contexts(watcher: Watcher, run_id: str) -> list[ContextUsage]:
    return [
        e.event for e in watcher.seen if e.run_id == run_id and isinstance(e.event, ContextUsage)
    ]


async def test_a_runs_window_wins_over_the_config_and_holds_for_the_session(
    sock_path: Path,
) -> None:
    daemon, watcher = script_daemon(Accountant(model_windows={"script": 50_000}))
    async with serving(sock_path, daemon), connect(sock_path, client="window-test") as client:
        plain = await client.start_run("script", "ok")
        assert window_of(await watcher.finished(plain["run_id"])) == 50_000

        own = await client.start_run("script", "ok", context_window=2_000, output_reserve=300)
        summary = await watcher.finished(own["run_id"])
        shown = contexts(watcher, own["run_id"])
        assert shown, "the run's usage moved the context figure"
        for context in [*shown, summary.context]:
            assert context is not None
            assert context.window == 2_000
            assert context.percent == pytest.approx(100 * context.used / 2_000)
            assert context.breakdown.free == 2_000 - context.used - 300
        assert summary.context is not None
        assert summary.context.used > 0

        # The session's next run gives no window: the session keeps the one it has.
        again = await client.start_run("script", "ok", session_id=own["session_id"])
        assert window_of(await watcher.finished(again["run_id"])) == 2_000


async def test_without_a_reserve_the_tables_reserve_stays_when_it_fits() -> None:
    """claude-sonnet-4's table entry: 200,000 with 64,000 for output."""
    accountant = Accountant()
    usage = Usage(tokens=Tokens(input_tokens=1_000, output_tokens=200), model="claude-sonnet-4-5")

    def feed(session_id: str, event: Event) -> ContextUsage | None:
        derived = accountant.observe(Envelope(1, 0.0, event, session_id=session_id), 0.0)
        return next((d.event for d in derived if isinstance(d.event, ContextUsage)), None)

    feed("wide", SessionStart(model="claude-sonnet-4-5"))
    accountant.set_context_window("wide", 100_000)  # after the model was named: keeps 64,000
    wide = feed("wide", usage)
    assert wide is not None
    assert (wide.window, wide.breakdown.free) == (100_000, 100_000 - 1_200 - 64_000)

    accountant.set_context_window("narrow", 50_000)  # before: the model's reserve does not fit
    feed("narrow", RunStarted(adapter="anthropic", model="claude-sonnet-4-5"))
    narrow = feed("narrow", usage)
    assert narrow is not None
    assert (narrow.window, narrow.breakdown.free) == (50_000, 50_000 - 1_200)

    accountant.set_context_window("fits", 100_000)  # before, and it fits: the model's reserve
    feed("fits", RunStarted(adapter="anthropic", model="claude-sonnet-4-5"))
    fits = feed("fits", usage)
    assert fits is not None
    assert (fits.window, fits.breakdown.free) == (100_000, 100_000 - 1_200 - 64_000)


def _start_run(**fields: Any) -> bytes:
    command = {"cmd": "start_run", "adapter": "script", "prompt": "ok", **fields}
    body = msgspec.msgpack.encode({"op": "request", "id": 9, "command": command})
    return struct.pack(">I", len(body)) + body


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"context_window": 0}, "`int` >= 1 - at `$.command.context_window`"),
        ({"context_window": -5}, "at `$.command.context_window`"),
        ({"context_window": "200k"}, "got `str` - at `$.command.context_window`"),
        ({"context_window": True}, "got `bool` - at `$.command.context_window`"),
        ({"context_window": 1.5}, "at `$.command.context_window`"),
        ({"context_window": 100, "output_reserve": -1}, "at `$.command.output_reserve`"),
        ({"context_window": 100, "output_reserve": 100}, "output_reserve needs a context_window"),
        ({"output_reserve": 10}, "output_reserve needs a context_window"),
    ],
)
async def test_a_bad_window_is_a_malformed_frame_naming_the_field(
    sock_path: Path, fields: dict[str, Any], words: str
) -> None:
    daemon, _ = script_daemon(Accountant())
    async with serving(sock_path, daemon):
        raw = await RawClient.open(sock_path, role="frontend")
        await raw.send_bytes(_start_run(**fields))
        with trio.fail_after(10):
            reply = await raw.receive()
        assert isinstance(reply, Reply), reply
        assert reply.error is not None, reply
        assert (reply.id, reply.ok, reply.error.code) == (9, False, MALFORMED_FRAME)
        assert words in reply.error.message
        assert daemon.runs.runs() == []  # nothing started
        await raw.aclose()
