"""The replay driver: a recorded raw SDK stream played as a live driven run.

``start_run`` with ``driver="replay"`` plays a recording through the run's
own adapter, with the recorded timing, so frontends, the accountant and
permission handling see exactly what a live run of that SDK would give them,
without an agent, a network or credentials (``busd demo`` and the frontend
tests use it). A recording is JSON Lines: a header naming the adapter, then
one raw SDK event per line with its offset in seconds (docs/runs.md,
"Replaying a recording"). Four come with busd, one per agent SDK adapter
(:data:`BUNDLED`), made from the adapters' test fixtures.

When a fed event is a permission request, the driver asks for it like any
driver and waits; the recording's clock stops meanwhile. A recording cannot
change course, so an answer other than "allowed" ends the replay there.

The driver is a built-in plugin (:data:`busd.plugins.manager.BUILTIN_PLUGINS`): every
daemon has it, whatever plugins are installed. Parsing is pure
(:func:`parse_recording`); only :meth:`ReplayDriver.run` touches files and clocks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Final

import msgspec
import trio

from ..core.errors import BusdError
from ..core.events import PermissionRequested
from .drivers import Driver, RunContext
from .hookspecs import hookimpl

__all__ = [
    "BUNDLED",
    "FORMAT_VERSION",
    "RecordedEvent",
    "Recording",
    "RecordingHeader",
    "ReplayDriver",
    "ReplayError",
    "bundled_recording",
    "busd_drivers",
    "load_recording",
    "parse_recording",
    "play",
]

FORMAT_VERSION: Final = 1
"""The ``busd_recording`` value of the header this busd plays."""

BUNDLED: Final = ("acp", "claude_code", "copilot", "opencode")
"""The recordings in ``busd/data/recordings/``, by the name ``options.recording`` takes."""

_OPTIONS: Final = frozenset({"recording", "speed"})


class ReplayError(BusdError, ValueError):
    """A recording or replay option that cannot be played; the message says where and why."""


class RecordingHeader(msgspec.Struct, frozen=True, kw_only=True):
    """The first line of a recording."""

    busd_recording: int
    adapter: str
    """The adapter that translates the raw events (the run's adapter must be this one)."""
    title: str | None = None
    prompt: str | None = None
    """The prompt that produced the recording, for a frontend to start the run with."""


class RecordedEvent(msgspec.Struct, frozen=True):
    """One raw SDK event and when it came, in seconds from the start of the recording."""

    at: Annotated[float, msgspec.Meta(ge=0)]
    raw: Any


class Recording(msgspec.Struct, frozen=True, kw_only=True):
    """A parsed recording; ``source`` names it in error messages."""

    header: RecordingHeader
    events: tuple[RecordedEvent, ...]
    source: str

    @property
    def duration(self) -> float:
        """Seconds from the start to the last event, at speed 1."""
        return self.events[-1].at if self.events else 0.0


_header_decoder = msgspec.json.Decoder(RecordingHeader)
_event_decoder = msgspec.json.Decoder(RecordedEvent)


def parse_recording(data: bytes, *, source: str) -> Recording:
    """Parse and check a whole recording (nothing is played from a broken one).

    :raises ReplayError: no header, an unsupported version, a line that is
        not ``{"at": seconds, "raw": ...}``, or an ``at`` before the one above it.
    """
    lines = [(n, line) for n, line in enumerate(data.splitlines(), 1) if line.strip()]
    if not lines:
        raise ReplayError(f"recording {source} is empty: it needs a header line")
    number, first = lines[0]
    try:
        header = _header_decoder.decode(first)
    except msgspec.DecodeError as exc:
        raise ReplayError(
            f"recording {source} line {number} is not a busd recording header"
            f' ({{"busd_recording": 1, "adapter": ...}}): {exc}'
        ) from None
    if header.busd_recording != FORMAT_VERSION:
        raise ReplayError(
            f"recording {source} is format {header.busd_recording}; this busd plays"
            f" format {FORMAT_VERSION}"
        )
    events: list[RecordedEvent] = []
    last = 0.0
    for number, line in lines[1:]:
        try:
            event = _event_decoder.decode(line)
        except msgspec.DecodeError as exc:
            raise ReplayError(
                f'recording {source} line {number} is not {{"at": seconds, "raw": event}}: {exc}'
            ) from None
        if not math.isfinite(event.at):
            raise ReplayError(f"recording {source} line {number}: at must be finite")
        if event.at < last:
            raise ReplayError(
                f"recording {source} line {number}: at {event.at:g} comes before"
                f" the line above it ({last:g})"
            )
        last = event.at
        events.append(event)
    return Recording(header=header, events=tuple(events), source=source)


def bundled_recording(name: str) -> Recording:
    """One of the recordings that come with busd (see :data:`BUNDLED`)."""
    if name not in BUNDLED:
        raise ReplayError(f"no bundled recording {name!r} (bundled: {', '.join(BUNDLED)})")
    data = (resources.files("busd") / "data" / "recordings" / f"{name}.jsonl").read_bytes()
    return parse_recording(data, source=name)


def load_recording(recording: str, *, cwd: str | None = None) -> Recording:
    """A bundled recording by name, else the file at that path (relative to ``cwd``).

    Blocking file I/O: the driver calls it in a worker thread.
    """
    if recording in BUNDLED:
        return bundled_recording(recording)
    path = Path(recording).expanduser()
    if not path.is_absolute() and cwd is not None:
        path = Path(cwd) / path
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ReplayError(
            f"cannot read recording {str(path)!r}: {exc.strerror or exc}"
            f" (bundled recordings: {', '.join(BUNDLED)})"
        ) from None
    return parse_recording(data, source=repr(str(path)))


def _options(options: Mapping[str, Any]) -> tuple[str, float]:
    unknown = sorted(set(options) - _OPTIONS)
    if unknown:
        raise ReplayError(
            f"unknown replay option {', '.join(map(repr, unknown))} (it takes recording and speed)"
        )
    recording = options.get("recording")
    if not isinstance(recording, str) or not recording:
        raise ReplayError(
            "options.recording is required: a bundled recording"
            f" ({', '.join(BUNDLED)}) or the path of a recording file"
        )
    speed = options.get("speed", 1.0)
    if isinstance(speed, bool) or not isinstance(speed, int | float) or not speed >= 0:
        raise ReplayError(f"options.speed must be a number >= 0 (0: no waiting), not {speed!r}")
    return recording, float(speed)


class ReplayDriver:
    """Plays ``options.recording`` through the run's adapter at ``options.speed`` (default 1).

    Speed 0 plays without waiting at all. ``model`` and the other run
    fields are ignored: the recording says what the agent did.
    """

    name: str = "replay"
    default_model: str = ""

    async def run(self, context: RunContext) -> None:
        request = context.request
        where, speed = _options(request.options)
        recording = await trio.to_thread.run_sync(lambda: load_recording(where, cwd=request.cwd))
        if recording.header.adapter != request.adapter:
            raise ReplayError(
                f"recording {recording.source} is a {recording.header.adapter!r} stream;"
                f" start the run with adapter={recording.header.adapter!r},"
                f" not {request.adapter!r}"
            )
        await play(context, recording.events, speed)


async def play(context: RunContext, events: Sequence[RecordedEvent], speed: float) -> None:
    """Feed ``events`` at ``start + at / speed``, asking for each permission request fed.

    The clock stops while a permission waits for its answer, so what comes
    after it keeps its recorded distance from the answer. An answer other
    than "allowed" ends the replay: the recording cannot change course.
    """
    start = trio.current_time()
    for event in events:
        if speed > 0:
            await trio.sleep_until(start + event.at / speed)
        else:
            await trio.lowlevel.checkpoint()
        for published in context.feed(event.raw):
            if type(published) is PermissionRequested:
                asked = trio.current_time()
                decision = await context.request_permission(published)
                if not decision.allowed:
                    return
                start += trio.current_time() - asked


@hookimpl
def busd_drivers() -> Sequence[Driver]:
    return [ReplayDriver()]
