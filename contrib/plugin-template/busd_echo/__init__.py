"""busd-echo: the smallest complete busd adapter plugin.

Raw input, one JSON object per line::

    {"type": "say", "text": "Hello"}

becomes one streamed assistant answer: ``stream.session.start`` before the
first piece, a ``stream.text.delta`` per line, and at the end of the stream
``stream.text.complete`` with the whole text and ``stream.session.idle``.

Copy this package, rename it, and replace :class:`EchoTranslator` with your
SDK's state machine; ``docs/plugins.md`` in busd says what to emit.
"""

from __future__ import annotations

from collections.abc import Sequence

# A plugin imports from `busd` only: the modules behind these names are internal.
from busd import (
    Adapter,
    Emitted,
    SessionIdle,
    SessionStart,
    TextComplete,
    TextDelta,
    Translator,
    as_mapping,
    hookimpl,
)

__all__ = ["EchoAdapter", "EchoTranslator", "busd_adapters"]

MESSAGE_ID = "echo-1"
"""Echo has one message per stream; a real SDK gives you its own ids."""


class EchoTranslator(Translator):
    """One stream's state: whether the session has started, and the text so far."""

    def __init__(self, *, session_id: str | None = None) -> None:
        super().__init__(session_id=session_id, adapter="echo")
        self._started = False
        self._text: list[str] = []

    def translate(self, raw: object, now: float) -> list[Emitted]:
        event = as_mapping(raw)  # TypeError for a non-object: feed() counts it as malformed
        kind = event.get("type")
        if kind != "say":
            self.unknown(str(kind))
            return []
        text = event["text"]  # KeyError when missing: malformed, counted, skipped
        if not isinstance(text, str):
            raise TypeError(f"text must be a string, not {type(text).__name__}")
        out: list[Emitted] = []
        if not self._started:
            self._started = True
            out.append(self.emit(SessionStart(model="echo")))
        self._text.append(text)
        out.append(self.emit(TextDelta(message_id=MESSAGE_ID, text=text)))
        return out

    def close(self, now: float) -> list[Emitted]:
        if not self._started:
            return []  # nothing was said: the stream implies nothing
        return [
            self.emit(TextComplete(message_id=MESSAGE_ID, text="".join(self._text))),
            self.emit(SessionIdle()),
        ]


class EchoAdapter:
    """What ``busd ingest --sdk echo`` and ``ingest`` frames with ``sdk="echo"`` select."""

    name = "echo"

    def translator(self, *, session_id: str | None = None) -> Translator:
        return EchoTranslator(session_id=session_id)


@hookimpl
def busd_adapters() -> Sequence[Adapter]:
    return [EchoAdapter()]
