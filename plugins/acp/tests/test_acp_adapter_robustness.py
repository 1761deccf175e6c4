"""The ACP adapter never raises on broken or damaged streams, and counts what it skipped."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from busd_acp import AcpTranslator
from hypothesis import given, settings
from hypothesis import strategies as st

from busd import TextComplete, ThinkingComplete, ToolComplete, ToolStart
from tests.daemon_helpers import load_module

HERE = Path(__file__).resolve().parent
messages = load_module(HERE / "acp_messages.py", "acp_robustness_messages")
fixture, run = messages.fixture, messages.run
prompt, update, permission, answer = (
    messages.prompt,
    messages.update,
    messages.permission,
    messages.answer,
)


def test_broken_messages_never_raise_and_are_counted() -> None:
    t = AcpTranslator()
    broken: list[Any] = [
        42,
        "session/prompt",
        {},
        {"jsonrpc": "2.0", "method": "session/update"},
        update("agent_message_chunk"),
        update("agent_message_chunk", content={"type": "text", "text": 3}),
        update("tool_call", title="no id"),
        update("usage_update", used="lots"),
        update("teleport"),
        {"jsonrpc": "2.0", "id": [1], "method": "session/prompt", "params": {}},
        {"jsonrpc": "2.0", "id": 3, "result": {}},
        {"jsonrpc": "2.0", "method": "vendor/thing"},
        prompt(1),
        permission(2, "c1"),
        answer(2, outcome={"outcome": "maybe"}),
    ]
    run(broken, t)
    stats = t.statistics()
    assert stats.raw_events == len(broken)
    assert stats.malformed == {
        "int": 1,
        "str": 1,
        "session/update": 1,
        "session/update:agent_message_chunk": 2,
        "session/update:tool_call": 1,
        "session/update:usage_update": 1,
        "session/prompt": 1,
        "session/request_permission": 1,
    }
    assert stats.unknown == {
        "<not JSON-RPC>": 1,
        "session/update:teleport": 1,
        "response to an unseen request": 1,
        "vendor/thing": 1,
    }


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, child in value.items():
            found += _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            found += _paths(child, (*prefix, i))
    return found


JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True),
    st.text(max_size=5),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_damaged_fixture_streams_never_raise_and_keep_their_invariants(data: st.DataObject) -> None:
    messages = fixture()
    for _ in range(data.draw(st.integers(min_value=1, max_value=6))):
        line = data.draw(st.integers(min_value=0, max_value=len(messages) - 1))
        message = messages[line] = copy.deepcopy(messages[line])
        paths = _paths(message)
        if not paths:
            continue
        path = data.draw(st.sampled_from(paths))
        parent = message
        for step in path[:-1]:
            parent = parent[step]
        if data.draw(st.booleans()) and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = data.draw(JUNK)
    if data.draw(st.booleans()):  # repeat a few lines, as a flaky transport would
        repeated = data.draw(st.lists(st.integers(0, len(messages) - 1), max_size=4))
        for line in repeated:
            messages.insert(line, messages[line])
    t = AcpTranslator()
    out = run(messages, t)
    assert t.statistics().raw_events == len(messages)
    assert t.finish(99.0) == []
    started: set[tuple[str | None, str]] = set()
    completed: set[tuple[str | None, str]] = set()
    for e in out:
        ev = e.event
        if isinstance(ev, ToolStart):
            assert (e.session_id, ev.tool_call_id) not in started
            started.add((e.session_id, ev.tool_call_id))
        elif isinstance(ev, ToolComplete):
            assert (e.session_id, ev.tool_call_id) in started
            assert (e.session_id, ev.tool_call_id) not in completed
            completed.add((e.session_id, ev.tool_call_id))
    for cls in (TextComplete, ThinkingComplete):
        ids = [(e.session_id, e.event.message_id) for e in out if isinstance(e.event, cls)]
        assert len(ids) == len(set(ids))
