"""Laws of coalescing: order kept, nothing meaningful lost, deltas lossless."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from busd.core.coalesce import LIFECYCLE_TYPES, Accumulator, coalescing_key
from busd.core.events import (
    AgentUpdate,
    Envelope,
    Event,
    RunFinished,
    SessionIdle,
    SessionStart,
    SessionTitleChanged,
    StreamingStats,
    TextComplete,
    TextDelta,
    ThinkingDelta,
    TokenUsage,
    ToolComplete,
    ToolPartialResult,
    ToolStart,
    TurnEnd,
    Usage,
)

DRAIN = None
Item = Envelope[Event] | None

SESSIONS = ("s1", "s2")
AGENTS = (None, "a1")
# (session, agent, run, stale): mostly the live run, sometimes a second or a stale one
ORIGINS = [
    *((s, a, "r1", False) for s in SESSIONS for a in AGENTS for _ in range(3)),
    ("s1", None, "r2", False),
    ("s1", None, "r1", True),
]
PIECES = ("", "a", "b", "ab", " ", "✶", "\n", "cd e")
MESSAGES = ("m1", "m2")
TOOLS = ("t1", "t2")
KINDS = (
    "text",
    "text",
    "text",
    "thinking",
    "thinking",
    "usage",
    "tool.start",
    "tool.partial",
    "tool.complete",
    "agent",
    "text.complete",
    "title",
    "stats",
    "session.start",
    "session.idle",
    "turn.end",
    "run.finished",
    "drain",
)


@st.composite
def streams(draw: st.DrawFn) -> list[Item]:
    """Envelopes with strictly increasing seq, interleaved with drain points."""
    items: list[Item] = []
    texts: dict[tuple[str, str | None, str], str] = {}
    output: dict[tuple[str, str | None], int] = {}
    seq = draw(st.integers(0, 1000))
    for _ in range(draw(st.integers(0, 80))):
        kind = draw(st.sampled_from(KINDS))
        if kind == "drain":
            items.append(DRAIN)
            continue
        session, agent, run, stale = draw(st.sampled_from(ORIGINS))
        event: Event
        if kind in ("text", "thinking"):
            message = draw(st.sampled_from(MESSAGES))
            piece = draw(st.sampled_from(PIECES))
            cls = TextDelta if kind == "text" else ThinkingDelta
            texts[kind, session, message] = texts.get((kind, session, message), "") + piece
            event = cls(message_id=message, text=piece)
        elif kind == "usage":
            n = output[session, agent] = output.get((session, agent), 0) + draw(st.integers(0, 9))
            event = Usage(tokens=TokenUsage(input_tokens=100, output_tokens=n))
        elif kind == "tool.start":
            event = ToolStart(tool_call_id=draw(st.sampled_from(TOOLS)), name="Bash")
        elif kind == "tool.partial":
            tool = draw(st.sampled_from(TOOLS))
            event = ToolPartialResult(tool_call_id=tool, output=draw(st.sampled_from(PIECES)))
        elif kind == "tool.complete":
            tool = draw(st.sampled_from(TOOLS))
            outcome = draw(st.sampled_from(["ok", "error"]))
            event = ToolComplete(
                tool_call_id=tool, status="ok" if outcome == "ok" else "error", output=outcome
            )
        elif kind == "agent":
            status = draw(st.sampled_from(["reading", "writing", "done"]))
            event = AgentUpdate(agent_id=draw(st.sampled_from(("a1", "a2"))), status=status)
        elif kind == "text.complete":
            message = draw(st.sampled_from(MESSAGES))
            event = TextComplete(message_id=message, text=texts.get(("text", session, message), ""))
        elif kind == "title":
            event = SessionTitleChanged(title=draw(st.sampled_from(["a", "b"])))
        elif kind == "stats":
            event = StreamingStats(elapsed_s=float(seq))
        elif kind == "session.start":
            event = SessionStart()
        elif kind == "session.idle":
            event = SessionIdle()
        elif kind == "turn.end":
            event = TurnEnd()
        else:
            event = RunFinished(status="ok", duration_s=1.0)
        seq += 1
        items.append(
            Envelope(
                seq=seq,
                ts=seq / 1000,
                event=event,
                session_id=session,
                agent_id=agent,
                run_id=run,
                stale=stale,
            )
        )
    return items


def inputs(items: list[Item]) -> list[Envelope[Event]]:
    return [e for e in items if e is not None]


def coalesce_batches(items: list[Item], *, merge: bool) -> list[list[Envelope[Event]]]:
    """Feed ``items`` through one accumulator, draining at each drain point and at the end."""
    acc = Accumulator(merge_deltas=merge)
    batches: list[list[Envelope[Event]]] = []
    for item in items:
        if item is DRAIN:
            batches.append(acc.drain())
        else:
            acc.add(item)
    batches.append(acc.drain())
    return batches


def coalesce(items: list[Item], *, merge: bool) -> list[Envelope[Event]]:
    return [e for batch in coalesce_batches(items, merge=merge) for e in batch]


def reference_windows(items: list[Item]) -> list[list[Envelope[Event]]]:
    """The raw-mode specification, written the slow obvious way.

    Within each window, an event survives unless a later event of the same
    window has the same (non-None) key; survivors keep their input order.
    """
    windows: list[list[Envelope[Event]]] = [[]]
    for item in items:
        if item is DRAIN:
            windows.append([])
        else:
            windows[-1].append(item)
    return [
        [
            e
            for i, e in enumerate(window)
            if (key := coalescing_key(e)) is None
            or all(coalescing_key(later) != key for later in window[i + 1 :])
        ]
        for window in windows
    ]


def mergeable(a: Envelope[Event], b: Envelope[Event]) -> bool:
    return (
        type(a.event) is type(b.event)
        and isinstance(a.event, TextDelta | ThinkingDelta)
        and isinstance(b.event, TextDelta | ThinkingDelta)
        and a.event.message_id == b.event.message_id
        and (a.session_id, a.agent_id, a.run_id, a.source, a.stale)
        == (b.session_id, b.agent_id, b.run_id, b.source, b.stale)
    )


@dataclass
class Folded:
    """What a frontend ends up showing after applying a stream."""

    usage: dict[Hashable, TokenUsage] = field(default_factory=dict)
    final_text: dict[tuple[str | None, str], str] = field(default_factory=dict)
    tools: dict[Hashable, dict[str, Any]] = field(default_factory=dict)
    agents: dict[Hashable, str] = field(default_factory=dict)
    titles: dict[Hashable, str] = field(default_factory=dict)
    lifecycle: list[Envelope[Event]] = field(default_factory=list)
    deltas: dict[Hashable, str] = field(default_factory=dict)


def fold(stream: list[Envelope[Event]]) -> Folded:
    state = Folded()
    for e in stream:
        ev = e.event
        match ev:
            case Usage():
                state.usage[e.session_id, e.agent_id] = ev.tokens
            case TextComplete():
                state.final_text[e.session_id, ev.message_id] = ev.text
            case ToolStart() | ToolPartialResult() | ToolComplete():
                tool = state.tools.setdefault((e.session_id, ev.tool_call_id), {})
                match ev:
                    case ToolStart():
                        tool["name"] = ev.name
                    case ToolPartialResult():
                        tool["output"] = ev.output
                    case ToolComplete():
                        tool["status"] = ev.status
                        tool["output"] = ev.output
            case AgentUpdate():
                state.agents[e.session_id, ev.agent_id] = ev.status
            case SessionTitleChanged():
                state.titles[e.session_id] = ev.title
            case TextDelta() | ThinkingDelta():
                key = (type(ev), e.session_id, ev.message_id)
                state.deltas[key] = state.deltas.get(key, "") + ev.text
            case _ if type(ev) in LIFECYCLE_TYPES:
                state.lifecycle.append(e)
    return state


MODES = st.booleans()


@given(streams(), MODES)
def test_survivors_are_inputs_in_their_original_order(items: list[Item], merge: bool) -> None:
    out = coalesce(items, merge=merge)
    seqs = [e.seq for e in out]
    assert seqs == sorted(set(seqs))
    by_seq = {e.seq: e for e in inputs(items)}
    for e in out:
        original = by_seq[e.seq]
        if e is not original:
            assert merge
            assert mergeable(e, original)
            assert e == msgspec.structs.replace(original, event=e.event)


@given(streams())
def test_raw_mode_is_exactly_the_reference(items: list[Item]) -> None:
    for batch, window in zip(
        coalesce_batches(items, merge=False), reference_windows(items), strict=True
    ):
        assert [e.seq for e in batch] == [e.seq for e in window]
        assert all(a is b for a, b in zip(batch, window, strict=True))


@given(streams())
def test_merged_mode_is_the_reference_with_adjacent_deltas_joined(items: list[Item]) -> None:
    for batch, ref in zip(
        coalesce_batches(items, merge=True), reference_windows(items), strict=True
    ):
        i = 0
        for e in batch:
            if ref[i] is e:
                i += 1
                continue
            # e stands for a run ref[i..j] of two or more mergeable deltas ending at e.seq
            j = i
            while ref[j].seq != e.seq:
                j += 1
            run = ref[i : j + 1]
            assert len(run) >= 2
            assert all(mergeable(r, e) for r in run)
            assert isinstance(e.event, TextDelta | ThinkingDelta)
            texts = [r.event.text for r in run if isinstance(r.event, TextDelta | ThinkingDelta)]
            assert e.event.text == "".join(texts)
            assert e.ts == run[-1].ts
            i = j + 1
        assert i == len(ref)


@given(streams(), MODES)
def test_folding_the_coalesced_stream_gives_the_same_final_state(
    items: list[Item], merge: bool
) -> None:
    original = fold(inputs(items))
    coalesced = fold(coalesce(items, merge=merge))
    assert coalesced == original
    assert [e.seq for e in coalesced.lifecycle] == [
        e.seq for e in inputs(items) if type(e.event) in LIFECYCLE_TYPES
    ]


@given(streams(), MODES)
def test_deltas_per_message_reproduce_the_full_text(items: list[Item], merge: bool) -> None:
    full: dict[Hashable, str] = {}
    for e in inputs(items):
        if isinstance(e.event, TextDelta | ThinkingDelta):
            key = (type(e.event), e.session_id, e.event.message_id)
            full[key] = full.get(key, "") + e.event.text
    assert fold(coalesce(items, merge=merge)).deltas == full
    # and text.complete, which carries the text so far, still agrees with the deltas
    for (session, message), text in fold(coalesce(items, merge=merge)).final_text.items():
        assert full.get((TextDelta, session, message), "").startswith(text)
