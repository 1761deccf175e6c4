"""Issue 16: late events of an ended run, and sessions that never say idle.

The stream is the real recorded Anthropic reply in ``tests/fixtures/sdk/``
(``anthropic-text.recorded.jsonl``, see its README), through the real
Anthropic translator and an in-process daemon (correlator, bus, accountant).
The *late* text delta after the run ended is constructed here: it stands
for the tail of a stream that a cancelled driver still delivers.
"""

from __future__ import annotations

import json
from pathlib import Path

import trio
import trio.testing
from busd_anthropic import AnthropicAdapter

from busd.core.accounting import QUIET_AFTER_S, Accountant
from busd.core.events import (
    Envelope,
    Event,
    RunFinished,
    StreamingStats,
    TextDelta,
    TokenUsage,
    ToolStart,
    Usage,
)
from busd.daemon.hub import Daemon

CAPTURE = Path(__file__).resolve().parent / "fixtures" / "sdk" / "anthropic-text.recorded.jsonl"
SESSION = "s1"
RUN = "r1"


def _replay(daemon: Daemon, *, finish: bool) -> None:
    """Publish the capture, translated, as run ``r1`` of session ``s1``."""
    translator = AnthropicAdapter().translator(session_id=SESSION)
    now = trio.current_time()
    emitted = []
    for line in CAPTURE.read_text().splitlines():
        emitted += translator.feed(json.loads(line), now)
    if finish:
        emitted += translator.finish(now)
    for item in emitted:
        daemon.publish(item.event, session_id=item.session_id or SESSION, run_id=RUN)


def _stats(seen: list[Envelope[Event]]) -> list[StreamingStats]:
    return [e.event for e in seen if isinstance(e.event, StreamingStats)]


async def test_a_late_event_after_the_run_ended_changes_no_figure_and_ticks_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    daemon = Daemon(accountant=Accountant(tick_interval=0.25))
    seen: list[Envelope[Event]] = []
    daemon.bus.on("busd.stats", seen.append)
    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.run)
        daemon.correlator.start_run(RUN, session_id=SESSION)
        _replay(daemon, finish=True)
        await trio.sleep(1)
        daemon.publish(RunFinished(status="ok", duration_s=1.0), session_id=SESSION, run_id=RUN)
        daemon.correlator.end_run(RUN)
        final = daemon.session_stats(SESSION)
        assert final is not None
        # message_delta's usage is cumulative: output 30 (README), exact.
        assert (final.output_tokens, final.output_estimated) == (30, False)
        published = len(_stats(seen))

        late = daemon.publish(TextDelta(message_id="late", text="x" * 400), session_id=SESSION)
        assert late.stale
        assert late.run_id == RUN
        await trio.sleep(30)
        assert len(_stats(seen)) == published  # the clock did not restart: nothing ticks
        after = daemon.session_stats(SESSION)
        assert after == final  # elapsed not climbing, the late text not counted
        assert daemon.accountant.stale_events == 1
        nursery.cancel_scope.cancel()


async def test_a_session_that_never_says_idle_stops_ticking_after_the_quiet_bound(
    autojump_clock: trio.testing.MockClock,
) -> None:
    daemon = Daemon(accountant=Accountant(tick_interval=0.25))
    seen: list[Envelope[Event]] = []
    daemon.bus.on("busd.stats", seen.append)
    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.run)
        daemon.correlator.start_run(RUN, session_id=SESSION)
        _replay(daemon, finish=False)  # the stream stops: no idle, no run end
        start = trio.current_time()
        await trio.sleep(10 * QUIET_AFTER_S)
        ticks = _stats(seen)
        # At most one tick per interval until QUIET_AFTER_S passed without an event.
        assert 0 < len(ticks) <= QUIET_AFTER_S / 0.25 + 2
        published = len(ticks)
        assert daemon.accountant.next_wakeup() is None
        assert trio.current_time() - start >= 10 * QUIET_AFTER_S

        # The next event resumes the ticks, and they stop again.
        daemon.publish(TextDelta(message_id="m2", text="more"), session_id=SESSION, run_id=RUN)
        await trio.sleep(10 * QUIET_AFTER_S)
        assert published < len(_stats(seen)) <= 2 * published + 2
        nursery.cancel_scope.cancel()


def test_stale_events_reach_neither_the_tool_tracker_nor_the_context() -> None:
    """A late tool start of an ended run never times out; a late usage moves no context.

    Constructed envelopes (``stale=True`` as the correlator stamps them).
    """
    accountant = Accountant(tool_timeout_s=1.0)
    late_tool = ToolStart(tool_call_id="t1", name="Bash")
    late_usage = Usage(tokens=TokenUsage(input_tokens=5_000, output_tokens=10), model="m")
    for seq, event in enumerate((late_tool, late_usage), start=1):
        envelope: Envelope[Event] = Envelope(seq, 0.0, event, session_id=SESSION, stale=True)
        assert accountant.observe(envelope, 0.0) == []
    assert accountant.tick(100.0) == []
    assert accountant.tools.open_calls == 0
    assert accountant.context.get(SESSION) is None
    assert accountant.next_wakeup() is None
