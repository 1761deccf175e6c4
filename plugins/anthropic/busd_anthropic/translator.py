"""The ``anthropic`` adapter: Messages API stream events (the SSE ``data:`` payloads).

Feed it the events of one or more consecutive message streams, as dicts or
as the ``anthropic`` SDK's own event objects (``RawMessageStreamEvent``);
a whole non-streamed ``Message`` response (``{"type": "message", ...}``) is
taken too. Each stream is one model call: ``stream.turn.start`` /
``stream.turn.end`` with the message id as ``turn_id``; ``stream.usage``
carries the running total over all of them.

The Messages API has no session of its own: ``stream.session.start`` comes
with the first ``message_start`` and ``stream.session.idle`` only from
:meth:`~busd.Translator.finish` (the API never says the agent is
done), with ``aborted=True`` when the last call was cut short. After an
``error`` event nothing says idle: ``stream.session.error`` is the last
word, until the next ``message_start`` shows work again.
"""

from __future__ import annotations

from busd import Emitted, Event, SessionIdle, SessionStart, Translator, as_mapping

from .stream import MessageStream

__all__ = ["AnthropicAdapter", "AnthropicTranslator"]


class AnthropicTranslator(Translator):
    """Anthropic Messages API stream events to catalog events, for one conversation."""

    def __init__(self, *, session_id: str | None = None) -> None:
        super().__init__(session_id=session_id, adapter="anthropic")
        self._stream = MessageStream(self, ledger_key=session_id or "")
        self._started = False
        self._failed = False

    def translate(self, raw: object, now: float) -> list[Emitted]:
        event = as_mapping(raw)
        kind = event.get("type")
        if kind == "message":
            events = self._stream.snapshot(event, now, usage=True, final=True)
        else:
            events = self._stream.handle(event, now)
        if not events:
            return []
        out: list[Emitted] = []
        if kind == "message_start" or kind == "message":
            self._failed = False
            if not self._started:
                self._started = True
                out.append(self.emit(SessionStart(model=self._stream.model)))
        elif kind == "error":
            self._failed = True
        emit = self.emit
        out.extend(emit(e) for e in events)
        return out

    def close(self, now: float) -> list[Emitted]:
        aborted = self._stream.cut
        events: list[Event] = self._stream.settle(now)
        if self._started and not self._failed:
            events.append(SessionIdle(aborted=aborted))
        return [self.emit(e) for e in events]


class AnthropicAdapter:
    """The ``anthropic`` adapter: a fresh :class:`AnthropicTranslator` per stream."""

    name = "anthropic"

    def translator(self, *, session_id: str | None = None) -> Translator:
        return AnthropicTranslator(session_id=session_id)
