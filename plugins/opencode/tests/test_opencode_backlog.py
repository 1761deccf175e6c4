"""What the attacher sends for sessions that existed before it: the backlog, on a real recording.

``fixtures/serve-thinking-tool.*`` is the real ``opencode serve`` 1.18.33
answering one prompt against the stand-in (thinking, a sentence and a
``bash`` call, then thinking and the answer): its ``/event`` stream
verbatim and what its HTTP API reported once the session was idle (see
fixtures/README.md). The backlog built from the API must say what the
stream said, and the stream repeating it must count nothing twice.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, TypeVar

import pytest
from busd_opencode import OpenCodeAdapter, OpenCodeTranslator
from busd_opencode._server import (
    MAX_EVENT,
    Families,
    SSEDecoder,
    backlog,
    dump_points,
    event_session,
    fingerprint,
    load_points,
)
from opencode_standin import ANSWER, SAID, THOUGHT

from busd import (
    Emitted,
    Event,
    PermissionRequested,
    SessionIdle,
    SessionStart,
    TextComplete,
    TextDelta,
    ThinkingComplete,
    TokenUsage,
    ToolComplete,
    ToolStart,
    TurnEnd,
    TurnStart,
    Usage,
)

E = TypeVar("E", bound=Event)
FIXTURES = Path(__file__).resolve().parent / "fixtures"
SSE = (FIXTURES / "serve-thinking-tool.event.sse").read_bytes()
API: dict[str, Any] = json.loads((FIXTURES / "serve-thinking-tool.api.json").read_text())
SID = API["session"]["id"]


def stream(size: int = 4096) -> list[dict[str, Any]]:
    """The recorded ``/event`` payloads, read with the attacher's own SSE decoder."""
    decoder = SSEDecoder()
    found = [d for i in range(0, len(SSE), size) for d in decoder.feed(SSE[i : i + size])]
    return [json.loads(data) for data in found]


def feed(t: OpenCodeTranslator, raws: list[dict[str, Any]]) -> list[Emitted]:
    out: list[Emitted] = []
    for n, raw in enumerate(raws):
        out += t.feed(raw, n * 0.01)
    return out


def of(out: list[Emitted], cls: type[E]) -> list[E]:
    return [e.event for e in out if isinstance(e.event, cls)]


def reported() -> TokenUsage:
    """The session's totals as OpenCode's ``GET /session/{id}`` reported them."""
    session = API["session"]
    tokens = session["tokens"]
    return TokenUsage(
        input_tokens=tokens["input"],
        output_tokens=tokens["output"],
        reasoning_tokens=tokens["reasoning"],
        cache_read_tokens=tokens["cache"]["read"],
        cache_write_tokens=tokens["cache"]["write"],
        cost_usd=session["cost"],
    )


def same(a: TokenUsage, b: TokenUsage) -> bool:
    counts = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")
    return all(getattr(a, n) == getattr(b, n) for n in counts) and (
        abs((a.cost_usd or 0) - (b.cost_usd or 0)) < 1e-12
    )


def the_turns(out: list[Emitted]) -> list[tuple[str, Any]]:
    """What a reader of the session sees, without deltas: turns, thoughts, texts, tools."""
    said: list[tuple[str, Any]] = []
    for e in out:
        match e.event:
            case TurnStart(turn_id=turn):
                said.append(("turn", turn))
            case ThinkingComplete(text=text, signature=sig, stopped=stopped):
                said.append(("thought", (text, sig, stopped)))
            case TextComplete(text=text, stopped=stopped):
                said.append(("text", (text, stopped)))
            case ToolStart(name=name, input=tool_input):
                said.append(("tool", (name, tool_input)))
            case ToolComplete(status=status, output=output):
                said.append(("done", (status, output)))
            case TurnEnd(finish_reason=reason):
                said.append(("end", reason))
            case SessionIdle(aborted=aborted):
                said.append(("idle", aborted))
    return said


def test_the_recorded_stream_and_what_opencode_reports_agree() -> None:
    """The live stream alone: thinking, a tool, the answer, and OpenCode's own totals."""
    raws = stream()
    assert len(raws) == SSE.count(b"\ndata: ") + SSE.startswith(b"data: ")
    assert stream(size=7) == raws == stream(size=len(SSE))  # however the bytes come
    t = OpenCodeAdapter().translator()
    out = feed(t, raws)
    stats = t.statistics()
    assert (stats.unknown, stats.malformed) == ({}, {})
    assert [k for k, _ in the_turns(out)] == [
        *("turn", "thought", "text", "tool", "done", "end"),
        *("turn", "thought", "text", "end", "idle"),
    ]
    assert ("thought", (THOUGHT, "sig-standin", False)) in the_turns(out)
    assert [t.text for t in of(out, TextComplete)] == [SAID, ANSWER]
    assert ("done", ("ok", "hello\n")) in the_turns(out)
    # The stand-in's calls 2 and 3 (call 1 was the title, which OpenCode does not count).
    served = [s["usage"] for s in API["served"] if s["kind"] != "title"]
    final = of(out, Usage)[-1].tokens
    assert final.input_tokens == sum(u["input_tokens"] for u in served) == 25
    assert final.output_tokens == sum(u["output_tokens"] for u in served) == 45
    assert final.cache_write_tokens == sum(u["cache_creation_input_tokens"] for u in served)
    assert final.cache_read_tokens == sum(u["cache_read_input_tokens"] for u in served)
    assert same(final, reported())


def test_the_backlog_of_a_finished_session_says_what_the_stream_said() -> None:
    events = backlog(API["session"], API["messages"], status=API["status"].get(SID))
    t = OpenCodeAdapter().translator(session_id=SID)
    out = feed(t, events)
    assert (t.statistics().unknown, t.statistics().malformed) == ({}, {})
    live = feed(OpenCodeAdapter().translator(), stream())
    assert the_turns(out) == the_turns(live)
    (start,) = of(out, SessionStart)
    assert (start.title, start.cwd) == ("Echo hello", API["session"]["directory"])
    assert same(of(out, Usage)[-1].tokens, reported())
    assert {e.session_id for e in out} == {SID}


def test_the_stream_repeating_the_backlog_counts_nothing_twice() -> None:
    """The attacher subscribes, then reads the API: the stream may repeat all of it."""
    t = OpenCodeAdapter().translator(session_id=SID)
    first = feed(t, backlog(API["session"], API["messages"]))
    again = feed(t, stream())
    # Every turn, part and tool was told already; only the status (a state, not
    # a count) is said again: the stream's own busy, then idle.
    assert the_turns(again) == [("idle", False)]
    assert same(of(first, Usage)[-1].tokens, reported())
    assert all(same(u.tokens, reported()) for u in of(again, Usage))


def mid_answer() -> list[dict[str, Any]]:
    """The API's messages while the answer streams: the tool call done, the answer open."""
    messages: list[dict[str, Any]] = copy.deepcopy(API["messages"])
    info = messages[-1]["info"]
    del info["finish"], info["time"]["completed"]
    info["cost"] = 0  # as OpenCode announces a message: its usage comes at its end
    info["tokens"] = {"input": 0, "output": 0, "reasoning": 0, "cache": {"read": 0, "write": 0}}
    parts = [p for p in messages[-1]["parts"] if p["type"] != "step-finish"]
    text = next(p for p in parts if p["type"] == "text")
    text["text"] = ANSWER[:11]
    del text["time"]["end"]
    messages[-1]["parts"] = parts
    return messages


def test_a_backlog_taken_mid_answer_is_finished_by_the_stream() -> None:
    """Attached while the answer streams: the API has the message open, the stream ends it."""
    t = OpenCodeAdapter().translator(session_id=SID)
    out = feed(t, backlog(API["session"], mid_answer(), status={"type": "busy"}))
    assert not of(out, SessionIdle)
    assert [e.finish_reason for e in of(out, TurnEnd)] == ["tool_use"]  # the answer is open
    out += feed(t, stream())  # subscribed before the read: it repeats the answer's start
    assert [c.text for c in of(out, TextComplete)] == [SAID, ANSWER]
    pid = of(out, TextComplete)[-1].message_id
    assert "".join(d.text for d in of(out, TextDelta) if d.message_id == pid) == ANSWER
    assert [e.finish_reason for e in of(out, TurnEnd)] == ["tool_use", "end_turn"]
    assert len(of(out, SessionIdle)) == 1
    assert same(of(out, Usage)[-1].tokens, reported())


def test_a_stream_that_does_not_repeat_what_the_backlog_told_is_not_skipped() -> None:
    """Only a replay of the told text is left out; a delta that differs is said whole."""
    t = OpenCodeAdapter().translator(session_id=SID)
    feed(t, backlog(API["session"], mid_answer(), status={"type": "busy"}))
    part = next(p for p in mid_answer()[-1]["parts"] if p["type"] == "text")
    announced = {
        "type": "message.part.updated",
        "properties": {"sessionID": SID, "part": {**part, "text": ""}},
    }

    def delta(text: str) -> dict[str, Any]:
        said = {"partID": part["id"], "messageID": part["messageID"], "field": "text"}
        return {"type": "message.part.delta", "properties": {**said, "delta": text}}

    out = feed(t, [announced, delta(ANSWER[:4]), delta(ANSWER[4:15]), delta(" twice")])
    assert [d.text for d in of(out, TextDelta)] == [ANSWER[11:15], " twice"]
    out = feed(t, [announced, delta("No")])  # the same start again, then something else
    assert [d.text for d in of(out, TextDelta)] == ["No"]


def test_pending_permissions_and_a_busy_status_are_part_of_the_backlog() -> None:
    request = {
        "id": "per_1",
        "sessionID": SID,
        "permission": "bash",
        "patterns": ["rm -rf build"],
        "metadata": {},
        "always": ["rm *"],
        "tool": {"messageID": "msg_x", "callID": "toolu_x"},
    }
    events = backlog(API["session"], [], status={"type": "busy"}, permissions=[request])
    assert [e["type"] for e in events] == ["session.updated", "permission.asked", "session.status"]
    out = feed(OpenCodeAdapter().translator(session_id=SID), events)
    (asked,) = of(out, PermissionRequested)
    assert (asked.request_id, asked.category, asked.title) == (
        "per_1",
        "execute",
        "bash: rm -rf build",
    )
    assert not of(out, SessionIdle)


def test_every_recorded_event_about_a_session_names_it() -> None:
    """Routing: what is about the session says so; the rest is the server's own news."""
    for raw in stream():
        sid = event_session(raw)
        if raw["type"].startswith(("server.", "plugin.", "catalog.", "reference.", "integ")):
            assert sid is None, raw["type"]
        else:
            assert sid == SID, raw["type"]


def test_the_sse_decoder_reads_what_the_format_allows() -> None:
    decoder = SSEDecoder()
    said = b": keep-alive\r\nevent: x\r\ndata: {\ndata:}\nid: 7\n\n\ndata: \xc3"
    assert decoder.feed(said) == ["{\n}"]  # a blank line with no data dispatches nothing
    assert decoder.feed(b"\xa9\n") == []  # a character split between chunks
    assert decoder.feed(b"\n") == ["\u00e9"]
    with pytest.raises(ValueError, match="over"):
        decoder.feed(b"data: " + b"x" * (MAX_EVENT + 1))


def test_families_route_sub_agents_to_their_root() -> None:
    families = Families()
    families.learn({"id": "child", "parentID": "root"})
    families.learn({"id": "grandchild", "parentID": "child"})
    families.learn({"id": "a", "parentID": "b"})
    families.learn({"id": "b", "parentID": "a"})  # a cycle does not hang
    assert [families.root(s) for s in ("grandchild", "child", "root", "other")] == [
        "root",
        "root",
        "root",
        "other",
    ]
    assert families.root("a") in ("a", "b")
    families.forget("child")
    assert families.root("grandchild") == "child"


def test_a_fingerprint_changes_with_the_session_and_points_survive_junk() -> None:
    info = API["session"]
    later = {**info, "time": {**info["time"], "updated": info["time"]["updated"] + 1}}
    costlier = {**info, "cost": info["cost"] * 2}
    assert len({fingerprint(info), fingerprint(later), fingerprint(costlier)}) == 3
    points = {SID: fingerprint(info)}
    assert load_points(dump_points(points)) == points
    for junk in ("", "[]", '{"sessions": 3}', "{", '{"sessions": {"a": 1}}'):
        assert load_points(junk) == {}


def test_an_answer_told_as_cut_ends_once_however_often_it_is_told() -> None:
    """Each catch-up after a restart tells the cut answer again: one end, as an error."""
    messages = mid_answer()
    cut = messages[-1]["info"]["id"]
    t = OpenCodeAdapter().translator(session_id=SID)
    out = feed(t, backlog(API["session"], messages, cut=cut))
    out += feed(t, backlog(API["session"], messages, cut=cut))
    assert [e.finish_reason for e in of(out, TurnEnd)] == ["tool_use", "error"]
    assert [(c.text, c.stopped) for c in of(out, TextComplete)] == [
        (SAID, False),
        (ANSWER[:11], True),
    ]
    assert len(of(out, SessionIdle)) == 1
