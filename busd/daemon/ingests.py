"""One connection's ``ingest`` streams: a translator per (sdk, session id), finished at the end.

Raw SDK payloads are translated by the adapter the frame names and
published with ``source`` ``<identity>/<sdk>``. Translated events that
would land in a run the daemon drives are dropped and reported once per
frame (``forbidden``): the stream names its sessions, not the client.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from ..plugins.adapters import Emitted, Translator
from ..wire import FORBIDDEN, UNKNOWN_SDK, Error, Frame, Ingest
from .hub import Daemon

__all__ = ["Ingests"]


class Ingests:
    """The translators of one connection's ``ingest`` frames."""

    def __init__(self, daemon: Daemon, queue: Callable[[Frame], None]) -> None:
        self._daemon = daemon
        self._queue = queue  # the connection's
        self._translators: dict[tuple[str, str | None], Translator] = {}

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
        if why is None:
            self._daemon.publish_emitted(emitted, source=source)
        else:
            refused.append(why)

    def finish(self, *, name: str, failed: Callable[[Exception, str], None]) -> None:
        """A connection that ends mid-stream still gets its streams finished."""
        now = trio.current_time()
        translators, self._translators = self._translators, {}
        for (sdk, _), translator in translators.items():
            try:
                for emitted in translator.finish(now):
                    self._daemon.publish_emitted(emitted, source=f"{name}/{sdk}")
            except Exception as exc:  # a plugin's translator: this connection's failure
                failed(exc, f"finishing its {sdk!r} stream")
