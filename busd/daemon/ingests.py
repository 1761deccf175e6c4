"""One connection's ``ingest`` streams: a translator per (sdk, session id), finished at the end.

Raw SDK payloads are translated by the adapter the frame names and
published with ``source`` ``<identity>/<sdk>``. Translated events that
would land in a run the daemon drives are dropped and reported once per
frame (``forbidden``): the stream names its sessions, not the client.

One agent can be observed twice at once: Claude Code's hooks report each
tool call live, its transcript again (``busd attach claude-code``). So a
``stream.tool.start`` or ``stream.tool.complete`` whose (session, tool call
id, type) some ingest stream of this daemon already published is dropped,
whichever connection sends it: each call shows once, as the first to report
it had it. The same holds for a ``stream.session.prompt`` with a prompt id
(both carry Claude Code's). The memory is daemon-wide and bounded
(:data:`TOOL_CALLS_KEPT`).
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Callable

import trio

from ..core.events import ToolComplete, ToolStart, UserPrompt
from ..plugins.adapters import Emitted, Translator
from ..wire import FORBIDDEN, UNKNOWN_SDK, Error, Frame, Ingest
from .hub import Daemon
from .outbox import ignore

__all__ = ["TOOL_CALLS_KEPT", "Ingests", "ToolCallsSeen"]

TOOL_CALLS_KEPT = 65_536
"""How many (session, tool call, type) keys the daemon remembers (the oldest go first)."""


class ToolCallsSeen:
    """Tool events and prompts ingest streams have published, daemon-wide: each goes out once."""

    def __init__(self, capacity: int = TOOL_CALLS_KEPT) -> None:
        self._keys: OrderedDict[tuple[str | None, str, str], None] = OrderedDict()
        self._capacity = capacity
        self.dropped = 0

    def first(self, emitted: Emitted) -> bool:
        """Whether ``emitted`` may go out: not a tool event or prompt an ingest stream sent."""
        event = emitted.event
        if isinstance(event, ToolStart | ToolComplete):
            key = (emitted.session_id, event.tool_call_id, type(event).__name__)
        elif isinstance(event, UserPrompt) and event.prompt_id is not None:
            key = (emitted.session_id, event.prompt_id, "UserPrompt")
        else:
            return True
        if key in self._keys:
            self.dropped += 1
            return False
        self._keys[key] = None
        if len(self._keys) > self._capacity:
            self._keys.popitem(last=False)
        return True


_SEEN: weakref.WeakKeyDictionary[Daemon, ToolCallsSeen] = weakref.WeakKeyDictionary()


def tool_calls_seen(daemon: Daemon) -> ToolCallsSeen:
    """The daemon's one :class:`ToolCallsSeen`, shared by all its connections."""
    seen = _SEEN.get(daemon)
    if seen is None:
        seen = _SEEN[daemon] = ToolCallsSeen()
    return seen


class Ingests:
    """The translators of one connection's ``ingest`` frames."""

    def __init__(self, daemon: Daemon, queue: Callable[[Frame], None]) -> None:
        self._daemon = daemon
        self._queue = queue  # the connection's
        self._translators: dict[tuple[str, str | None], Translator] = {}
        self._seen = tool_calls_seen(daemon)

    def ingest(self, frame: Ingest, *, name: str) -> None:
        """Translate and publish one frame for the connection labelled ``name``."""
        daemon = self._daemon
        key = (frame.sdk, frame.session_id)
        translator = self._translators.get(key)
        if translator is None:
            adapter = daemon.adapters.get(frame.sdk)
            if adapter is None:
                loaded = ", ".join(sorted(daemon.adapters)) or "none"
                message = f"no adapter for sdk {frame.sdk!r} is loaded (loaded: {loaded})"
                self._queue(Error(code=UNKNOWN_SDK, message=message))
                return
            translator = adapter.translator(session_id=frame.session_id)
            self._translators[key] = translator
        now = trio.current_time()
        source = f"{name}/{frame.sdk}"
        refused: list[str] = []
        for raw in frame.events:
            for emitted in translator.feed(raw, now):
                self._publish(emitted, source, refused)
        if frame.end:
            del self._translators[key]
            for emitted in translator.finish(now):
                self._publish(emitted, source, refused)
        if refused:
            daemon.counters.forbidden += 1
            message = f"{len(refused)} events were not ingested: {refused[0]}"
            self._queue(Error(code=FORBIDDEN, message=message))

    def _publish(self, emitted: Emitted, source: str, refused: list[str]) -> None:
        event, session_id = emitted.event, emitted.session_id
        why = self._daemon.runs.authority(event, session_id=session_id, run_id=None)
        if why is not None:
            refused.append(why)
        elif self._seen.first(emitted):
            self._daemon.publish_emitted(emitted, source=source)

    def finish(self, *, name: str, failed: Callable[[Exception, str], None]) -> None:
        """A connection that ends mid-stream still gets its streams finished.

        It is over: its ``queue`` (a cycle left to the collector) is dropped.
        """
        self._queue = ignore
        now = trio.current_time()
        translators, self._translators = self._translators, {}
        for (sdk, _), translator in translators.items():
            try:
                for emitted in translator.finish(now):
                    if self._seen.first(emitted):
                        self._daemon.publish_emitted(emitted, source=f"{name}/{sdk}")
            except Exception as exc:  # a plugin's translator: this connection's failure
                failed(exc, f"finishing its {sdk!r} stream")
