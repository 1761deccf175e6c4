"""A session's conversation, folded from its events: what ``busd export`` writes.

The journal stores events, not messages; :func:`build_transcript` derives the
messages when asked, so the transcript of any journaled session can be
rebuilt by a newer busd with a better fold, and nothing is stored twice.
Pure: envelopes in (a session's, in ``seq`` order), structs out.

How events become messages, per agent (the main chat and each sub-agent
apart, every message tagged with its ``agent_id``):

- ``busd.run.started`` with a prompt: a ``user`` message.
- ``stream.turn.start`` opens an ``assistant`` message (one model call);
  thinking, text and tool calls go into the open one as parts, in the order
  they began. Text is the ``complete`` event's when there is one, else the
  deltas joined (``stopped`` when the stream was cut short). Reasoning keeps
  its ``signature`` verbatim and its ``message_id``, so the conversation can
  be sent back to the provider.
- ``stream.tool.complete``: a ``tool_result`` part in a ``tool`` message
  right after the assistant message that made the call; assistant output
  that follows opens a new assistant message (same ``turn_id``).
- ``stream.turn.end`` sets the open message's ``finish_reason``.
- ``stream.usage`` is cumulative per session and agent: a message's
  ``usage`` is how much the total grew from when it opened to its last
  report (a report after ``turn.end``, e.g. the final cost, still counts
  for it). Assistant messages with no parts are left out.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

import msgspec

from ..core.events import (
    Envelope,
    Event,
    PermissionRequested,
    PermissionResolved,
    RunFinished,
    RunStarted,
    SessionStart,
    TextComplete,
    TextDelta,
    ThinkingComplete,
    ThinkingDelta,
    TokenUsage,
    ToolComplete,
    ToolMetrics,
    ToolStart,
    TurnEnd,
    TurnStart,
    Usage,
)
from ..core.usage import merge_cumulative

__all__ = [
    "Message",
    "Part",
    "ReasoningPart",
    "RunRecord",
    "TextPart",
    "ToolCallPart",
    "ToolResultPart",
    "Transcript",
    "build_transcript",
    "export_document",
    "usage_growth",
]


class _Part(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag_field="type"):
    pass


class TextPart(_Part, frozen=True, tag="text"):
    text: str
    message_id: str | None = None
    stopped: bool = False


class ReasoningPart(_Part, frozen=True, tag="reasoning"):
    """Thinking; ``signature`` is the provider's, byte for byte."""

    text: str
    message_id: str | None = None
    signature: str | None = None
    duration_s: float | None = None
    stopped: bool = False


class ToolCallPart(_Part, frozen=True, tag="tool_call"):
    """A tool call; ``permission`` is how its permission request was answered, if it had one."""

    tool_call_id: str
    name: str
    input: dict[str, Any] = {}
    permission: str | None = None


class ToolResultPart(_Part, frozen=True, tag="tool_result"):
    tool_call_id: str
    name: str | None = None
    status: str = "ok"
    output: str | None = None
    error: str | None = None
    duration_s: float | None = None


Part: TypeAlias = TextPart | ReasoningPart | ToolCallPart | ToolResultPart

Role: TypeAlias = Literal["user", "assistant", "tool"]


class Message(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One message; ``seq``/``ts`` are those of the event that opened it."""

    role: Role
    parts: list[Part]
    seq: int
    ts: float
    agent_id: str | None = None
    run_id: str | None = None
    turn_id: str | None = None
    model: str | None = None
    finish_reason: str | None = None
    usage: TokenUsage | None = None


class RunRecord(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A run of the session, from ``busd.run.started`` and ``busd.run.finished``."""

    run_id: str | None
    adapter: str
    model: str | None = None
    prompt: str | None = None
    status: str | None = None
    """``None`` while the journal holds no ``busd.run.finished`` for it."""
    duration_s: float | None = None
    usage: TokenUsage | None = None
    output_estimated: bool = False
    """``usage.output_tokens`` includes busd's estimate (see ``busd.run.finished``)."""
    thinking_s: float = 0.0
    tools: list[ToolMetrics] = []
    error: str | None = None


class Transcript(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A session's messages and runs; ``usage`` is the main agent's final cumulative usage."""

    session_id: str
    messages: list[Message]
    runs: list[RunRecord] = []
    usage: TokenUsage | None = None
    events: int = 0


def usage_growth(now: TokenUsage, before: TokenUsage | None) -> TokenUsage:
    """How much a cumulative usage grew since ``before`` (field-wise, never negative)."""
    if before is None:
        return now
    cost: float | None = None
    if now.cost_usd is not None:
        cost = now.cost_usd - (before.cost_usd or 0.0)
    return TokenUsage(
        input_tokens=max(0, now.input_tokens - before.input_tokens),
        output_tokens=max(0, now.output_tokens - before.output_tokens),
        reasoning_tokens=max(0, now.reasoning_tokens - before.reasoning_tokens),
        cache_read_tokens=max(0, now.cache_read_tokens - before.cache_read_tokens),
        cache_write_tokens=max(0, now.cache_write_tokens - before.cache_write_tokens),
        cost_usd=None if cost is None else max(0.0, round(cost, 12)),
    )


# -- the fold ------------------------------------------------------------------


@dataclass(slots=True)
class _Block:
    """A text or reasoning part being assembled from deltas."""

    kind: Literal["text", "reasoning"]
    message_id: str
    deltas: list[str] = field(default_factory=list)
    complete: TextComplete | ThinkingComplete | None = None

    def part(self) -> Part:
        done = self.complete
        text = done.text if done is not None else "".join(self.deltas)
        if self.kind == "text":
            stopped = done.stopped if done is not None else True
            return TextPart(text=text, message_id=self.message_id, stopped=stopped)
        if isinstance(done, ThinkingComplete):
            return ReasoningPart(
                text=text,
                message_id=self.message_id,
                signature=done.signature,
                duration_s=done.duration_s,
                stopped=done.stopped,
            )
        return ReasoningPart(text=text, message_id=self.message_id, stopped=True)


_Item: TypeAlias = _Block | ToolStart | ToolComplete


@dataclass(slots=True)
class _Message:
    role: Role
    seq: int
    ts: float
    agent_id: str | None
    run_id: str | None
    turn_id: str | None = None
    model: str | None = None
    items: list[_Item] = field(default_factory=list)
    finish_reason: str | None = None
    baseline: TokenUsage | None = None
    usage: TokenUsage | None = None
    prompt: str | None = None


@dataclass(slots=True)
class _Agent:
    cumulative: TokenUsage | None = None
    turn_id: str | None = None
    model: str | None = None
    open: _Message | None = None  # the assistant message output goes to
    last: _Message | None = None  # this agent's latest message, any role
    last_assistant: _Message | None = None


class _Fold:
    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.messages: list[_Message] = []
        self.agents: dict[str | None, _Agent] = {}
        self.blocks: dict[tuple[str | None, str, str], _Block] = {}
        self.runs: dict[str | None, dict[str, Any]] = {}
        self.permissions: dict[str, str] = {}  # request id -> tool call id
        self.answers: dict[str, str] = {}  # tool call id -> outcome
        self.events = 0

    def agent(self, envelope: Envelope[Event]) -> tuple[str | None, _Agent]:
        key = envelope.agent_id if envelope.agent_id != envelope.session_id else None
        agent = self.agents.get(key)
        if agent is None:
            agent = self.agents[key] = _Agent()
        return key, agent

    def new(self, role: Role, envelope: Envelope[Event], key: str | None, a: _Agent) -> _Message:
        message = _Message(role, envelope.seq, envelope.ts, key, envelope.run_id)
        if role == "assistant":
            message.turn_id = a.turn_id
            message.model = a.model
            message.baseline = a.cumulative
            a.open = a.last_assistant = message
        else:
            a.open = None
        a.last = message
        self.messages.append(message)
        return message

    def assistant(self, envelope: Envelope[Event], key: str | None, a: _Agent) -> _Message:
        if a.open is not None and a.last is a.open:
            return a.open
        return self.new("assistant", envelope, key, a)

    def block(
        self, envelope: Envelope[Event], kind: Literal["text", "reasoning"], message_id: str
    ) -> _Block:
        key, a = self.agent(envelope)
        found = self.blocks.get((key, kind, message_id))
        if found is None:
            found = self.blocks[(key, kind, message_id)] = _Block(kind, message_id)
            self.assistant(envelope, key, a).items.append(found)
        return found

    def feed(self, envelope: Envelope[Event]) -> None:
        self.events += 1
        event = envelope.event
        if isinstance(event, TextDelta):
            self.block(envelope, "text", event.message_id).deltas.append(event.text)
        elif isinstance(event, ThinkingDelta):
            self.block(envelope, "reasoning", event.message_id).deltas.append(event.text)
        elif isinstance(event, TextComplete):
            self.block(envelope, "text", event.message_id).complete = event
        elif isinstance(event, ThinkingComplete):
            self.block(envelope, "reasoning", event.message_id).complete = event
        elif isinstance(event, ToolStart):
            key, a = self.agent(envelope)
            self.assistant(envelope, key, a).items.append(event)
        elif isinstance(event, ToolComplete):
            key, a = self.agent(envelope)
            last = a.last
            target = last if last is not None and last.role == "tool" else None
            if target is None:
                target = self.new("tool", envelope, key, a)
            target.items.append(event)
        elif isinstance(event, TurnStart):
            key, a = self.agent(envelope)
            a.turn_id = event.turn_id
            self.new("assistant", envelope, key, a)
        elif isinstance(event, TurnEnd):
            _, a = self.agent(envelope)
            if a.last_assistant is not None:
                a.last_assistant.finish_reason = event.finish_reason
            a.open = None
        elif isinstance(event, Usage):
            self.usage(envelope, event)
        elif isinstance(event, RunStarted):
            self.run_started(envelope, event)
        elif isinstance(event, RunFinished):
            run = self.runs.setdefault(envelope.run_id, {"run_id": envelope.run_id, "adapter": ""})
            run.update(
                status=event.status,
                duration_s=event.duration_s,
                usage=event.usage,
                output_estimated=event.output_estimated,
                thinking_s=event.thinking_s,
                tools=event.tools,
                error=event.error,
            )
        elif isinstance(event, SessionStart):
            _, a = self.agent(envelope)
            if event.model is not None:
                a.model = event.model
        elif isinstance(event, PermissionRequested):
            if event.tool_call_id is not None:
                self.permissions[event.request_id] = event.tool_call_id
        elif isinstance(event, PermissionResolved):
            call = self.permissions.get(event.request_id)
            if call is not None:
                self.answers[call] = event.outcome

    def usage(self, envelope: Envelope[Event], event: Usage) -> None:
        _, a = self.agent(envelope)
        before = a.cumulative
        total = event.tokens if before is None else merge_cumulative(before, event.tokens)
        a.cumulative = total
        if event.model is not None:
            a.model = event.model
        target = a.last_assistant
        if target is not None:
            target.usage = usage_growth(total, target.baseline)
            if target.model is None:
                target.model = a.model

    def run_started(self, envelope: Envelope[Event], event: RunStarted) -> None:
        key, a = self.agent(envelope)
        if event.model is not None:
            a.model = event.model
        self.runs[envelope.run_id] = {
            "run_id": envelope.run_id,
            "adapter": event.adapter,
            "model": event.model,
            "prompt": event.prompt,
        }
        if event.prompt is not None:
            self.new("user", envelope, key, a).prompt = event.prompt

    def build(self) -> Transcript:
        messages: list[Message] = []
        for m in self.messages:
            parts = self.parts(m)
            if not parts:
                continue
            messages.append(
                Message(
                    role=m.role,
                    parts=parts,
                    seq=m.seq,
                    ts=m.ts,
                    agent_id=m.agent_id,
                    run_id=m.run_id,
                    turn_id=m.turn_id,
                    model=m.model,
                    finish_reason=m.finish_reason,
                    usage=m.usage,
                )
            )
        main = self.agents.get(None)
        return Transcript(
            session_id=self.session_id,
            messages=messages,
            runs=[RunRecord(**r) for r in self.runs.values()],
            usage=None if main is None else main.cumulative,
            events=self.events,
        )

    def parts(self, m: _Message) -> list[Part]:
        if m.role == "user":
            return [TextPart(text=m.prompt)] if m.prompt is not None else []
        parts: list[Part] = []
        for item in m.items:
            if isinstance(item, _Block):
                parts.append(item.part())
            elif isinstance(item, ToolStart):
                parts.append(
                    ToolCallPart(
                        tool_call_id=item.tool_call_id,
                        name=item.name,
                        input=item.input,
                        permission=self.answers.get(item.tool_call_id),
                    )
                )
            else:
                parts.append(
                    ToolResultPart(
                        tool_call_id=item.tool_call_id,
                        name=item.name,
                        status=item.status,
                        output=item.output,
                        error=item.error,
                        duration_s=item.duration_s,
                    )
                )
        return parts


def build_transcript(session_id: str, envelopes: Iterable[Envelope[Event]]) -> Transcript:
    """The messages of ``session_id`` from its envelopes (in ``seq`` order; others are skipped)."""
    fold = _Fold(session_id)
    for envelope in envelopes:
        if envelope.session_id == session_id:
            fold.feed(envelope)
    return fold.build()


_encoder = msgspec.json.Encoder()


def export_document(session: msgspec.Struct, transcript: Transcript, *, lines: bool) -> bytes:
    """What ``busd export`` writes for a session record and its transcript.

    ``lines``: JSON Lines, a ``{"kind": "session", ...}`` line (the record
    and its runs), then a ``{"kind": "message", ...}`` line per message.
    Otherwise one indented document ``{"session", "runs", "messages"}``.
    """
    record = msgspec.to_builtins(session)
    if lines:
        out = [_encoder.encode({"kind": "session", **record, "runs": transcript.runs})]
        for message in transcript.messages:
            out.append(_encoder.encode({"kind": "message", **msgspec.to_builtins(message)}))
        return b"\n".join(out) + b"\n"
    document = {"session": record, "runs": transcript.runs, "messages": transcript.messages}
    return msgspec.json.format(_encoder.encode(document), indent=2) + b"\n"
