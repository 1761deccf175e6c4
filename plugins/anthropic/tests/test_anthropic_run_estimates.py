"""A run's summary says when its output count is busd's estimate (issue 16), through the daemon.

The ``anthropic`` driver runs the real ``anthropic`` SDK inside an in-process
daemon against :class:`FakeMessagesAPI`, which replays recorded streams:

- ``tests/fixtures/sdk/anthropic-text.recorded.jsonl``, held before its
  ``content_block_stop`` while the run is cancelled: the call never reports
  its final count (``message_start`` said 1), so the summary is the live
  estimate, flagged, the figure the live line (``busd.stats``) showed last;
- the second call of ``final-at-start.partial.jsonl`` (the Claude Code
  capture's ``stream_event`` payloads, see its README): ``message_start``
  already holds the final 22, so the run ends exact at 22, live line and
  summary alike;
- the text capture with ``message_start`` output 0 and the API's documented
  ``overloaded_error`` after three deltas (constructed here): the failed call
  ends at its count, 0, exact.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from fake_anthropic import FakeMessagesAPI

from busd import Envelope, Event, RunFinished, StreamingStats, TextDelta
from busd.daemon.hub import Daemon, DaemonConfig
from busd.frontends.headless import summary_lines
from busd.frontends.view import Views
from busd.plugins.manager import PluginManager

HERE = Path(__file__).resolve().parent
TEXT = HERE.parents[2] / "tests" / "fixtures" / "sdk" / "anthropic-text.recorded.jsonl"
FINAL_AT_START = (
    HERE.parents[1] / "claude_code" / "tests" / "fixtures" / "final-at-start.partial.jsonl"
)
KEY = "sk-test-not-a-key"


def recorded_text() -> list[dict[str, Any]]:
    return [json.loads(line) for line in TEXT.read_text().splitlines() if line.strip()]


def second_call_of_final_at_start() -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in FINAL_AT_START.read_text().splitlines()]
    events = [line["event"] for line in lines if line["type"] == "stream_event"]
    first = [i for i, e in enumerate(events) if e["type"] == "message_start"][1]
    return events[first:]


@pytest.fixture(autouse=True)
def no_real_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("API_KEY", "AUTH_TOKEN", "BASE_URL", "PROFILE", "CUSTOM_HEADERS"):
        monkeypatch.delenv(f"ANTHROPIC_{name}", raising=False)
    monkeypatch.setenv("ANTHROPIC_CONFIG_DIR", str(tmp_path))


class Run:
    """One anthropic run in a fresh daemon; what it published, in order."""

    def __init__(self, server: FakeMessagesAPI) -> None:
        plugins = PluginManager(environ={})
        plugins.load_entry_points()
        self.daemon = Daemon(DaemonConfig(), plugins=plugins)
        self.server = server
        self.seen: list[Envelope[Event]] = []
        self.finished = trio.Event()
        self.deltas = 0
        self.text_seen = trio.Event()
        self.want_deltas = 0
        self.daemon.bus.on_all(self._record)
        self.run_id = ""

    def _record(self, envelope: Envelope[Event]) -> None:
        self.seen.append(envelope)
        if type(envelope.event) is TextDelta:
            self.deltas += 1
            if self.deltas == self.want_deltas:
                self.text_seen.set()
        elif type(envelope.event) is RunFinished:
            self.finished.set()

    def start(self) -> None:
        state = self.daemon.runs.start(
            adapter="anthropic",
            prompt="Hello, how are you?",
            started_by="test",
            model="claude-sonnet-4-6",
            options={"base_url": self.server.base_url, "api_key": KEY},
        )
        self.run_id = state.run_id

    async def to_the_end(self, midway: Callable[[], Awaitable[None]] | None = None) -> None:
        """Serve, run the daemon, start the run (then ``midway``), and wait for its end."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self.server.serve)
            await nursery.start(self.daemon.run)
            self.start()
            with trio.fail_after(10):
                if midway is not None:
                    await midway()
                await self.finished.wait()
            nursery.cancel_scope.cancel()

    def summary(self) -> RunFinished:
        [finished] = [e.event for e in self.seen if type(e.event) is RunFinished]
        return finished

    def last_live(self) -> StreamingStats:
        """The last ``busd.stats`` of the run's session: what the live line showed last."""
        return [e.event for e in self.seen if type(e.event) is StreamingStats][-1]

    def summary_line(self) -> str | None:
        views = Views()
        views.apply_all(self.seen)
        [view] = views.sessions.values()
        return view.summary_line()


async def test_a_run_cancelled_mid_answer_ends_with_the_live_estimate_flagged() -> None:
    events = recorded_text()
    stop = next(i for i, e in enumerate(events) if e["type"] == "content_block_stop")
    server = FakeMessagesAPI(events, pause_at=stop)
    run = Run(server)
    run.want_deltas = sum(1 for e in events[:stop] if e["type"] == "content_block_delta")

    async def cancel_mid_answer() -> None:
        await server.paused.wait()
        await run.text_seen.wait()
        run.daemon.runs.cancel(run.run_id, by="test")

    await run.to_the_end(cancel_mid_answer)
    finished, live = run.summary(), run.last_live()
    assert finished.status == "cancelled"
    assert live.output_estimated
    assert live.output_tokens > 1  # message_start's 1 and the six deltas' estimate
    assert (finished.usage.output_tokens, finished.output_estimated) == (live.output_tokens, True)
    assert finished.usage.input_tokens == 12  # message_start's count, exact
    n = live.output_tokens
    first, second = summary_lines(finished)
    assert f"↓ ~{n} tokens" in first
    assert second == f"cancelled · 12 in · ~{n} out"
    line = run.summary_line()
    assert line is not None
    assert f"↓ ~{n} tokens" in line


async def test_a_run_whose_message_start_had_the_final_count_ends_exact() -> None:
    server = FakeMessagesAPI(second_call_of_final_at_start())
    run = Run(server)
    await run.to_the_end()
    finished, live = run.summary(), run.last_live()
    assert finished.status == "ok"
    assert (live.output_tokens, live.output_estimated) == (22, False)
    assert (finished.usage.output_tokens, finished.output_estimated) == (22, False)
    first, second = summary_lines(finished)
    assert "↓ 22 tokens" in first
    assert "~" not in first
    assert second.startswith("ok · 12 in · 22 out")
    line = run.summary_line()
    assert line is not None
    assert "↓ 22 tokens" in line
    assert "~" not in line


# The SDK raises out of its stream on an error event, leaving its async generators
# to the garbage collector (as in test_anthropic_driver.py); collected here.
@pytest.mark.filterwarnings("ignore:Async generator '[^']*' was garbage collected:ResourceWarning")
async def test_a_run_whose_call_failed_after_a_zero_count_ends_at_zero() -> None:
    recorded = recorded_text()
    recorded[0]["message"]["usage"]["output_tokens"] = 0
    deltas = [e for e in recorded if e["type"] == "content_block_delta"][:3]
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    server = FakeMessagesAPI([recorded[0], recorded[1], *deltas, error])
    run = Run(server)
    await run.to_the_end()
    finished, live = run.summary(), run.last_live()
    assert finished.status == "error"
    assert (live.output_tokens, live.output_estimated) == (0, False)
    assert (finished.usage.output_tokens, finished.output_estimated) == (0, False)
    gc.collect()
