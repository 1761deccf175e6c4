"""``busd demo``: a recorded session through the whole core, in one process.

The replay publishes the bundled session (``busd/data/demo_session.jsonl``)
through correlation and the bus; the accountant derives stats, context and
tool metrics; a coalescing batch dispatcher plays the part of an attached
frontend and renders what it receives. Time is Trio's ``MockClock`` running
at ``speed`` times real time (``speed=0``: instantly, in virtual time), so
every duration shown is the recorded one whatever the speed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import resources
from typing import Generic

import msgspec
import trio
import trio.testing

from .accounting import Accountant, AccountingService
from .batching import BatchDispatcher
from .bus import Bus
from .catalog import Catalog
from .correlation import Correlator
from .events import (
    ContextUsage,
    E,
    Envelope,
    Event,
    RunFinished,
    RunStarted,
    SessionStart,
    StreamingStats,
    TextComplete,
    TextDelta,
    ThinkingComplete,
    ThinkingDelta,
    TokenUsage,
    ToolComplete,
    ToolStart,
    Usage,
)
from .humanize import format_duration, format_tokens, status_line, summary_line

__all__ = ["Recorded", "load_recording", "run_demo"]

Echo = Callable[[str], None]


class Recorded(msgspec.Struct, Generic[E], frozen=True):
    """One line of a recording: an event, its offset in seconds, its envelope fields."""

    at: float
    event: E
    session_id: str | None = None
    agent_id: str | None = None


def load_recording(text: str, catalog: Catalog | None = None) -> Iterator[Recorded[Event]]:
    """Decode a JSON Lines recording; a bad line raises ``msgspec.ValidationError``."""
    union = (catalog if catalog is not None else Catalog()).union()
    decoder = msgspec.json.Decoder(Recorded[union])  # type: ignore[valid-type]
    for line in text.splitlines():
        if line.strip():
            yield decoder.decode(line)


def _window_for(model: str) -> int | None:
    return 200_000 if model.startswith("claude") else None


@dataclass
class _Screen:
    """Renders batches the way a plain terminal frontend would."""

    echo: Echo
    in_text: bool = False
    thinking: set[str] = field(default_factory=set)
    events: int = 0
    frames: int = 0
    last_stats: StreamingStats | None = None
    last_shown: str = ""
    last_usage: Usage | None = None
    last_context: ContextUsage | None = None
    finished: RunFinished | None = None

    def line(self, text: str) -> None:
        if self.in_text:
            self.echo("\n")
            self.in_text = False
        self.echo(text + "\n")

    async def send(self, batch: list[Envelope[Event]]) -> None:
        self.frames += 1
        for envelope in batch:
            self.events += 1
            self.show(envelope.event)

    def show(self, event: Event) -> None:
        if isinstance(event, SessionStart):
            self.line(f"● {event.title or 'session'} · {event.model or 'unknown model'}")
        elif isinstance(event, ThinkingDelta):
            if event.message_id not in self.thinking:
                self.thinking.add(event.message_id)
                self.line("✶ Thinking…")
        elif isinstance(event, ThinkingComplete):
            took = f" for {format_duration(event.duration_s)}" if event.duration_s else ""
            self.line(f"  ⎿ thought{took} (collapsed, {len(event.text)} chars)")
        elif isinstance(event, TextDelta):
            if not self.in_text:
                self.echo("⏺ ")
                self.in_text = True
            self.echo(event.text)
        elif isinstance(event, TextComplete):
            if self.in_text:
                self.echo("\n")
                self.in_text = False
        elif isinstance(event, ToolStart):
            args = json.dumps(event.input, ensure_ascii=False)
            self.line(f"⏺ {event.name}({args})")
        elif isinstance(event, ToolComplete):
            took = f" in {format_duration(event.duration_s)}" if event.duration_s else ""
            self.line(f"  ⎿ {event.status}{took}: {event.output or event.error or ''}")
        elif isinstance(event, StreamingStats):
            self.last_stats = event
            shown = status_line(event)
            if event.thinking and shown != self.last_shown:
                self.last_shown = shown
                self.line("  " + shown)
        elif isinstance(event, Usage):
            self.last_usage = event
        elif isinstance(event, ContextUsage):
            self.last_context = event
        elif isinstance(event, RunFinished):
            self.finished = event


async def _replay(
    rows: list[Recorded[Event]], echo: Echo, *, window: float, run_id: str = "run-demo"
) -> _Screen:
    bus = Bus()
    correlator = Correlator()
    accountant = Accountant(window_for=_window_for, tool_timeout_s=60.0)
    screen = _Screen(echo)
    frontend = BatchDispatcher(screen.send, window=window)
    bus.on_all(frontend.add)
    session_ids = {row.session_id for row in rows if row.session_id}

    def publish(event: Event, session_id: str | None, agent_id: str | None = None) -> None:
        route = correlator.route(event, session_id=session_id, run_id=run_id, agent_id=agent_id)
        bus.publish(
            event,
            session_id=session_id,
            run_id=route.run_id,
            agent_id=route.agent_id,
            source="busd.demo",
            stale=route.stale,
        )

    async with trio.open_nursery() as nursery:
        await nursery.start(frontend.run)
        await nursery.start(AccountingService(bus, accountant).run)
        start = trio.current_time()
        for session_id in session_ids:
            correlator.start_run(run_id, session_id=session_id)
            publish(RunStarted(adapter="recording", prompt="What's the weather in SF?"), session_id)
        for row in rows:
            await trio.sleep_until(start + row.at)
            publish(row.event, row.session_id, row.agent_id)
        end = trio.current_time()
        for session_id in session_ids:
            stats = accountant.session_stats(session_id, end)
            usage = screen.last_usage.tokens if screen.last_usage else None
            publish(
                RunFinished(
                    status="ok",
                    duration_s=end - start,
                    usage=usage if usage is not None else TokenUsage(),
                    thinking_s=stats.thinking_s if stats else 0.0,
                    tools=accountant.tools.metrics(),
                    context=screen.last_context,
                ),
                session_id,
            )
            correlator.end_run(run_id, "ok")
        await frontend.aclose()
        nursery.cancel_scope.cancel()
    return screen


def _report(screen: _Screen, echo: Echo, window: float) -> None:
    if screen.last_stats is not None:
        echo(summary_line(screen.last_stats) + "\n")
    finished = screen.finished
    if finished is not None:
        u = finished.usage
        cost = "unknown" if u.cost_usd is None else f"${u.cost_usd:.4f}"
        echo(
            f"  usage: input {u.input_tokens} · output {u.output_tokens} · "
            f"cache read {u.cache_read_tokens} · cost {cost}\n"
        )
        for tool in finished.tools:
            echo(
                f"  tool {tool.name}: {tool.calls} call(s), {tool.errors} error(s), "
                f"mean {tool.mean_s:.1f}s\n"
            )
        context = finished.context
        if context is not None and context.window:
            echo(
                f"  context: {format_tokens(context.used)} of {format_tokens(context.window)}"
                f" ({context.percent or 0:.1f}%){' ~estimated' if context.estimated else ''}\n"
            )
    echo(
        f"  delivery: {screen.events} events in {screen.frames} frames "
        f"(coalescing window {window * 1000:.0f} ms)\n"
    )


def run_demo(echo: Echo, *, speed: float = 1.0, window: float = 0.016) -> None:
    """Replay the bundled session; ``speed`` scales time, 0 means instantly."""
    text = (resources.files("busd") / "data" / "demo_session.jsonl").read_text("utf-8")
    rows = list(load_recording(text))
    clock = trio.testing.MockClock(rate=speed) if speed > 0 else trio.testing.MockClock()
    if speed == 0:
        clock.autojump_threshold = 0
    screen = trio.run(lambda: _replay(rows, echo, window=window), clock=clock)
    _report(screen, echo, window)
