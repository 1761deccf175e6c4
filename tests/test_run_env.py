"""A run has its starter's environment (issue 17, bug 6): the wire, the daemon, its log.

The drivers' use of ``RunRequest.env`` is tested in plugins/*/tests
(``test_*_run_env.py``), and end to end with ``busd serve`` and the real
Claude Code CLI in plugins/claude_code/tests/test_run_env_live.py.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import msgspec
import pytest
import trio

from busd.client import connect
from busd.daemon.runs import failure
from busd.plugins.drivers import RunContext, RunRequest
from busd.wire.frames import Status

from .test_runs import ScriptDriver, Watcher, make_daemon, serving, sock_path

__all__ = ["sock_path"]  # the fixture, imported to be used

SECRET = "sk-ant-not-for-the-bus"


class RecordingDriver(ScriptDriver):
    """The script driver, keeping each run's request."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[RunRequest] = []

    async def run(self, context: RunContext) -> None:
        self.requests.append(context.request)
        await super().run(context)


async def test_start_run_carries_the_env_to_the_driver_and_never_onto_the_bus(
    sock_path: Path,
) -> None:
    driver = RecordingDriver()
    daemon = make_daemon(driver)
    watcher = Watcher(daemon)
    env = {"ANTHROPIC_API_KEY": SECRET, "PATH": "/usr/bin"}
    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.run)
        async with serving(sock_path, daemon), connect(sock_path, client="t") as client:
            given = await client.start_run("script", "ok", env=env, cwd="/work/there")
            await watcher.finished(given["run_id"])
            plain = await client.start_run("script", "ok")
            await watcher.finished(plain["run_id"])
            status = await client.request(Status())
        nursery.cancel_scope.cancel()
    first, second = driver.requests
    assert (first.env, first.cwd) == (env, "/work/there")
    assert first.environ() == env
    assert second.env is None
    assert second.environ() is os.environ  # a client that sends none: the daemon's
    published = b"".join(msgspec.json.encode(e) for e in watcher.seen)
    assert SECRET.encode() not in published
    assert SECRET not in repr(status)


async def test_a_failed_run_is_one_line_in_the_daemons_log(
    caplog: pytest.LogCaptureFixture, autojump_clock: trio.abc.Clock
) -> None:
    daemon = make_daemon(ScriptDriver())
    watcher = Watcher(daemon)
    caplog.set_level(logging.INFO)
    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.run)
        state = daemon.runs.start(adapter="script", prompt="fail", started_by="t")
        summary = await watcher.finished(state.run_id)
        nursery.cancel_scope.cancel()
    assert summary.error == "RuntimeError: the agent crashed"
    failed = [r for r in caplog.records if "failed" in r.getMessage()]
    assert [(r.levelno, r.getMessage(), r.exc_info) for r in failed] == [
        (logging.WARNING, f"run {state.run_id} failed: RuntimeError: the agent crashed", None)
    ]
    assert "Traceback" not in caplog.text


def test_a_failure_is_its_one_exception_through_groups_of_one() -> None:
    inner = ValueError("bad key")
    assert failure(ExceptionGroup("nursery", [ExceptionGroup("inner", [inner])])) == (
        "ValueError: bad key"
    )
    two = ExceptionGroup("nursery", [inner, KeyError("k")])
    assert failure(two).startswith("ExceptionGroup: nursery")
