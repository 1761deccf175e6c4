"""Feed the translator a recorded stream and assert what it says: no daemon needed."""

from __future__ import annotations

from busd import Adapter, SessionIdle, SessionStart, TextComplete, TextDelta

from busd_echo import MESSAGE_ID, busd_adapters


def test_say_lines_become_one_streamed_answer() -> None:
    (adapter,) = busd_adapters()
    assert isinstance(adapter, Adapter)
    assert adapter.name == "echo"
    translator = adapter.translator(session_id="s1")
    lines = [
        {"type": "say", "text": "Hello"},
        {"type": "shout", "text": "unknown kinds are counted, not raised"},
        {"type": "say"},  # malformed: counted, skipped
        {"type": "say", "text": ", world"},
    ]

    emitted = [e for now, line in enumerate(lines) for e in translator.feed(line, float(now))]
    emitted += translator.finish(10.0)

    assert [e.event for e in emitted] == [
        SessionStart(model="echo"),
        TextDelta(message_id=MESSAGE_ID, text="Hello"),
        TextDelta(message_id=MESSAGE_ID, text=", world"),
        TextComplete(message_id=MESSAGE_ID, text="Hello, world"),
        SessionIdle(),
    ]
    assert {e.session_id for e in emitted} == {"s1"}
    stats = translator.statistics()
    assert stats.unknown == {"shout": 1}
    assert stats.malformed == {"say": 1}
    assert translator.finish(11.0) == []  # finishing twice says nothing more
