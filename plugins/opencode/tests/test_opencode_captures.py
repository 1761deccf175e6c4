"""The OpenCode adapter on real OpenCode 1.18.33 output, recorded against a stand-in model.

Both captures (tests/fixtures/sdk/opencode-*, provenance in the README there)
are the same conversation: one prompt, a ``bash`` call (``echo hello``), an
answer. The stand-in answered three calls: a title (call 1, which OpenCode
does not count in the session) and the two model calls of the turn, whose
usage it set to (input, cache write, cache read, output) = (12, 2000, 500,
22) and (13, 3000, 1000, 23). OpenCode reports each in its ``step-finish``
(one assistant message per model call), with the cost it priced.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

from busd_opencode import OpenCodeAdapter

from busd import (
    Emitted,
    Event,
    SessionError,
    SessionIdle,
    SessionStart,
    TextComplete,
    ToolComplete,
    ToolStart,
    TurnEnd,
    TurnStart,
    Usage,
)

E = TypeVar("E", bound=Event)
SDK = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "sdk"


def of(out: list[Emitted], cls: type[E]) -> list[E]:
    return [e.event for e in out if isinstance(e.event, cls)]


def feed(raws: list[dict[str, Any]]) -> tuple[list[Emitted], Any]:
    t = OpenCodeAdapter().translator()
    out: list[Emitted] = []
    for n, raw in enumerate(raws):
        out += t.feed(raw, n * 0.1)
    out += t.finish(len(raws) * 0.1)
    return out, t.statistics()


def assert_the_turn(out: list[Emitted]) -> None:
    """What both captures say: two model calls, the tool, the answer, the summed usage."""
    assert [e.finish_reason for e in of(out, TurnEnd)] == ["tool_use", "end_turn"]
    (start,) = of(out, ToolStart)
    assert (start.name, start.input) == (
        "bash",
        {"command": "echo hello", "description": "Print hello"},
    )
    (done,) = of(out, ToolComplete)
    assert (done.status, done.output) == ("ok", "hello\n")
    assert [t.text for t in of(out, TextComplete)] == ["The command printed hello."]
    final = of(out, Usage)[-1].tokens
    # Per call, then summed: input 12 + 13, output 22 + 23, cache write 2000 + 3000,
    # cache read 500 + 1000; cost as OpenCode priced each step, 0.008016 + 0.011934.
    assert final.input_tokens == 25
    assert final.output_tokens == 45
    assert final.cache_write_tokens == 5000
    assert final.cache_read_tokens == 1500
    assert final.reasoning_tokens == 0
    assert final.cost_usd is not None
    assert abs(final.cost_usd - 0.01995) < 1e-9
    assert of(out, SessionIdle) == [SessionIdle()]


def test_the_serve_event_stream_skips_the_registry_events_without_a_warning() -> None:
    """``plugin.added`` (45 here), ``catalog.updated``, ``reference.updated`` and
    ``integration.updated`` are known: they say nothing about the session."""
    text = (SDK / "opencode-serve-event.sse").read_text()
    raws = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
    kinds = [r["type"] for r in raws]
    assert kinds.count("plugin.added") == 45
    for kind in ("catalog.updated", "reference.updated", "integration.updated"):
        assert kind in kinds
    out, stats = feed(raws)
    assert (stats.unknown, stats.malformed, stats.duplicates) == ({}, {}, 0)
    assert_the_turn(out)
    assert of(out, SessionStart)[0].cwd == "/tmp/rec/ocproj"


def test_opencode_run_format_json_is_an_ingest_format() -> None:
    """``opencode run --format json`` prints finished parts only, one JSON object a line."""
    text = (SDK / "opencode-run-format-json.jsonl").read_text()
    raws = [json.loads(line) for line in text.splitlines() if line.strip()]
    assert [r["type"] for r in raws] == [
        "step_start",
        "tool_use",
        "step_finish",
        "step_start",
        "text",
        "step_finish",
    ]
    out, stats = feed(raws)
    assert (stats.unknown, stats.malformed, stats.duplicates) == ({}, {}, 0)
    assert_the_turn(out)
    # One turn per model call (assistant message), each closed by its step_finish.
    assert [t.turn_id for t in of(out, TurnStart)] == [
        "msg_21613d471001fJWu1SRK2Lf5QH",
        "msg_21613e3c2001gqPksVWFtIhJD3",
    ]
    assert {e.session_id for e in out} == {"ses_de9ec37c7ffegc9994A53R2amL"}


def test_an_error_line_of_the_run_format_is_a_session_error() -> None:
    """Constructed by hand (no capture of a failing run): the ``error`` line's shape is
    the one sst/opencode's run command prints, ``{"type": "error", "sessionID", "error"}``."""
    line = {
        "type": "error",
        "timestamp": 1,
        "sessionID": "ses_x",
        "error": {"name": "APIError", "data": {"message": "overloaded", "isRetryable": True}},
    }
    out, stats = feed([line])
    (error,) = of(out, SessionError)
    assert (error.message, error.code, error.retryable) == ("overloaded", "APIError", True)
    assert stats.unknown == {}


def test_a_message_announced_already_done_ends_its_turn_after_its_parts() -> None:
    """OpenCode 1.18 serializes a ``message.updated`` when it sends it, not when it is
    published: on a loaded machine the one announcing the answer's message already
    carries its end (``finish``, ``time.completed``, the call's tokens), ahead of the
    message's parts (seen live in 1 run of 4). The turn still ends after its text,
    and its usage still follows its text (else that text would count again, estimated)."""
    text = (SDK / "opencode-serve-event.sse").read_text()
    raws = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
    answer = of(feed(raws)[0], TurnStart)[-1].turn_id

    def said(raw: dict[str, Any]) -> bool:
        info = raw.get("properties", {}).get("info", {})
        return bool(raw["type"] == "message.updated" and info.get("id") == answer)

    first = next(i for i, raw in enumerate(raws) if said(raw))
    last = max(i for i, raw in enumerate(raws) if said(raw))
    assert "completed" not in raws[first]["properties"]["info"]["time"]  # in the recording
    early = [*raws[:first], {**raws[last], "id": "evt_early"}, *raws[first + 1 :]]

    out, stats = feed(early)
    assert (stats.unknown, stats.malformed) == ({}, {})
    assert_the_turn(out)
    assert [e.event for e in out] == [e.event for e in feed(raws)[0]]  # as if in order
