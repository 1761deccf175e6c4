"""Anthropic message streams as catalog events: the state machine both adapters share.

One :class:`MessageStream` follows one agent's model calls, one after
another: the Messages API stream events of each call (``message_start``,
``content_block_*``, ``message_delta``, ``message_stop``, ``ping``,
``error``) and, for SDKs that hand over whole messages instead, message
snapshots (:meth:`MessageStream.snapshot`). The bare Anthropic adapter wraps
one; the Claude Code adapter keeps one per agent (main and each sub-agent).

Content blocks become parts whose ``message_id`` is ``f"{message_id}:{index}"``.
A tool call is announced at its ``content_block_stop``, when its streamed
input JSON is complete. Thinking lasts from its block's start to its stop,
by the ``now`` values the caller passes.

``message_start.message`` may already hold whole content blocks and a
``stop_reason`` (programmatic tool calling sends most of its ``tool_use``
blocks that way, with no ``message_delta`` after): they count exactly as if
streamed.

Usage: ``message_start`` and ``message_delta`` carry the call's counts so far
(``message_delta`` is cumulative: 30 means 30, never 1 + 30), recorded as
cumulative snapshots of that call in a :class:`~busd.UsageLedger`, whose
session total the ``stream.usage`` events carry. With ``usage.iterations``
(server-side compaction) the top-level figures are the last iteration's only:
the call is billed the sum over the iterations, and the context after it is
the last iteration's input plus output (``stream.session.context``). A
``compaction`` block becomes ``stream.session.compaction``. An owner with an
authoritative total (Claude Code's ``result``) raises a floor under it with
:meth:`MessageStream.raise_floor`. A call that ends on the provider's terms
(a stop reason, an ``error``, a final snapshot with current usage) ends with
``stream.usage`` even when its count did not change (``message_start`` may
already carry the final output, or 0): that count covers what it streamed,
so a live estimate gives way to it. A call cut short (cancelled) says
nothing more: its tail stays an estimate.

Pure and synchronous: no clock, no I/O.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Mapping
from functools import reduce
from typing import Any, Final, Protocol

from msgspec.structs import replace

from busd import (
    Event,
    SessionCompaction,
    SessionContext,
    SessionError,
    TextComplete,
    TextDelta,
    ThinkingComplete,
    ThinkingDelta,
    TokenUsage,
    ToolComplete,
    ToolStart,
    TurnEnd,
    TurnStart,
    Usage,
    UsageLedger,
    add_usage,
    merge_cumulative,
    normalize_usage,
)

__all__ = [
    "RETRYABLE_ERRORS",
    "TOOL_USE_BLOCKS",
    "MessageStream",
    "Reporter",
    "finish_reason",
    "result_text",
]

TOOL_USE_BLOCKS: Final = frozenset({"tool_use", "server_tool_use", "mcp_tool_use"})
"""Content blocks that are a tool call (client, server-run or MCP)."""

RETRYABLE_ERRORS: Final = frozenset(
    {"overloaded_error", "api_error", "rate_limit_error", "timeout_error"}
)
"""``error.type`` values worth retrying (the API's own advice)."""

_FINISH_REASONS: Final = {"model_context_window_exceeded": "max_tokens"}
_IGNORED_DELTAS: Final = frozenset({"citations_delta"})
_ZERO: Final = TokenUsage()

# Block kinds (small ints: compared on every delta).
_TEXT: Final = 0
_THINKING: Final = 1
_REDACTED: Final = 2
_TOOL: Final = 3
_RESULT: Final = 4
_IGNORED: Final = 5
_COMPACTION: Final = 6


class Reporter(Protocol):
    """Where a stream reports input it cannot use (a :class:`busd.Translator`)."""

    def unknown(self, kind: str) -> None: ...

    def malformed(self, kind: str, why: str) -> None: ...

    def duplicate(self) -> None: ...


def finish_reason(raw: object) -> str:
    """The catalog's finish reason for an Anthropic ``stop_reason`` (unknown ones kept)."""
    if not isinstance(raw, str) or not raw:
        return "end_turn"
    return _FINISH_REASONS.get(raw, raw)


def result_text(content: object) -> str:
    """A tool result's content as text: strings as they are, text blocks joined, rest as JSON."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list):
        parts: list[str] = []
        for block in content:
            if isinstance(block, Mapping) and block.get("type") == "text":
                text = block.get("text")
                parts.append(text if isinstance(text, str) else "")
            elif isinstance(block, str):
                parts.append(block)
            else:
                parts.append(_dumps(block))
        return "\n".join(parts)
    return _dumps(content)


def _dumps(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _context_input(usage: TokenUsage) -> int:
    """Everything a call read: uncached input plus cache reads and writes."""
    return usage.input_tokens + usage.cache_read_tokens + usage.cache_write_tokens


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


class _Block:
    """One content block being streamed."""

    __slots__ = ("chunks", "input", "kind", "name", "part_id", "signature", "started", "tool_id")

    def __init__(self, kind: int, part_id: str, started: float) -> None:
        self.kind = kind
        self.part_id = part_id
        self.started = started
        self.chunks: list[str] = []
        self.signature: str | None = None
        self.tool_id = ""
        self.name = ""
        self.input: object = None


class MessageStream:
    """One agent's model calls, streamed or as snapshots, turned into catalog events.

    ``reporter`` counts unknown, malformed and duplicate input; ``ledger``
    (shared by the agents of one translator) keeps usage under
    ``ledger_key``; ``parent_tool_call_id`` goes on every ``stream.tool.start``
    (the tool call that spawned this agent, if any). Message ids seen are
    remembered (the last ``remember``) so a replayed call is dropped whole.
    """

    __slots__ = (
        "_blocks",
        "_call",
        "_call_tools",
        "_calls",
        "_counted",
        "_floor",
        "_has_tool",
        "_ledger",
        "_ledger_key",
        "_remember",
        "_reported",
        "_reporter",
        "_seen",
        "_skipping",
        "_snapshot_parts",
        "_start_input",
        "_stop_reason",
        "_streamed",
        "_unreported",
        "model",
        "parent_tool_call_id",
    )

    def __init__(
        self,
        reporter: Reporter,
        *,
        ledger: UsageLedger | None = None,
        ledger_key: str = "",
        parent_tool_call_id: str | None = None,
        model: str | None = None,
        remember: int = 1024,
    ) -> None:
        self._reporter = reporter
        self._ledger = ledger if ledger is not None else UsageLedger()
        self._ledger_key = ledger_key
        self.parent_tool_call_id = parent_tool_call_id
        self.model = model
        self._remember = remember
        self._seen: OrderedDict[str, bool] = OrderedDict()  # message id -> was it streamed
        self._call: str | None = None
        self._streamed = False
        self._stop_reason: str | None = None
        self._blocks: dict[int, _Block] = {}
        self._call_tools: dict[str, str] = {}
        self._has_tool = False
        self._snapshot_parts = 0
        self._start_input: int | None = None
        self._calls = 0
        self._skipping = False
        self._floor = _ZERO
        self._reported: TokenUsage | None = None
        self._counted = False  # the open call's usage was recorded (a current count)
        self._unreported = False  # output was emitted after the last stream.usage

    # -- state the owner may ask about ---------------------------------------

    @property
    def open(self) -> bool:
        """Whether a model call has started and not ended."""
        return self._call is not None

    @property
    def streaming(self) -> bool:
        """Whether the open call is a streamed one (not built from snapshots)."""
        return self._call is not None and self._streamed

    @property
    def cut(self) -> bool:
        """Whether ending now would cut a call short (streamed, and no stop reason yet)."""
        return self._call is not None and self._streamed and self._stop_reason is None

    def total(self) -> TokenUsage:
        """This agent's running usage total (the ledger's, raised to the floor)."""
        return merge_cumulative(self._ledger.session_total(self._ledger_key), self._floor)

    # -- input -------------------------------------------------------------------

    def handle(self, event: Mapping[str, Any], now: float) -> list[Event]:
        """Events for one Messages API stream event seen at ``now``."""
        kind = event.get("type")
        if self._skipping:
            self._reporter.duplicate()
            if kind == "message_stop":
                self._skipping = False
            return []
        out: list[Event] = []
        if kind == "content_block_delta":
            self._delta(event, out)
        elif kind == "content_block_start":
            self._block_start(event, now, out)
        elif kind == "content_block_stop":
            self._block_stop(event, now, out)
        elif kind == "message_start":
            self._message_start(event, now, out)
        elif kind == "message_delta":
            self._message_delta(event, out)
        elif kind == "message_stop":
            if self._call is None:
                self._reporter.malformed("message_stop", "no message is open")
            else:
                self._finish_call(out, now, finish_reason(self._stop_reason), cut=False)
        elif kind == "error":
            self._error(event, now, out)
        elif kind != "ping":
            self._reporter.unknown(kind if isinstance(kind, str) else "<no type>")
        return out

    def snapshot(
        self, message: Mapping[str, Any], now: float, *, usage: bool, final: bool
    ) -> list[Event]:
        """Events for a whole (or per-block) assistant message that was not streamed.

        A message whose id was streamed is ignored (it said all this already).
        Blocks of several snapshots with the same id extend one turn, which
        stays open until ``final``, another call, or :meth:`settle`. ``usage``
        says whether the message's usage is current (a full Messages API
        response) or a stale snapshot never to be reported (Claude Code's).
        """
        message_id = _str(message.get("id"))
        if message_id is None:
            self._calls += 1
            message_id = f"#snapshot-{self._calls}"
        out: list[Event] = []
        if message_id != self._call or self._streamed:
            streamed = self._seen.get(message_id)
            if streamed is not None:
                if not streamed:  # a snapshot turn that already ended: a replay
                    self._reporter.duplicate()
                return out
            if self._call is not None:
                self._settle(out, now, cancelled=False)
            self._open(message_id, message.get("model"), streamed=False, out=out)
        content = message.get("content")
        if isinstance(content, list):
            for block in content:
                if isinstance(block, Mapping):
                    self._whole_block(block, out)
                else:
                    self._reporter.malformed("content_block", "not an object")
        stop = message.get("stop_reason")
        if isinstance(stop, str):
            self._stop_reason = stop
        payload = message.get("usage")
        if usage and isinstance(payload, Mapping):
            self._record(payload, out)
        if final:
            self._finish_call(out, now, self._snapshot_reason(), cut=False)
        return out

    def settle(self, now: float, *, cancelled: bool = False) -> list[Event]:
        """End the open call, if any: normally if it said how it stops, else cut short."""
        out: list[Event] = []
        self._settle(out, now, cancelled=cancelled)
        return out

    def raise_floor(self, usage: TokenUsage, *, final: bool = False) -> list[Event]:
        """Raise the total to at least ``usage``; ``final``: it covers all output so far."""
        self._floor = merge_cumulative(self._floor, usage)
        out: list[Event] = []
        self._report(out, final=final)
        return out

    # -- calls -------------------------------------------------------------------

    def _open(self, message_id: str, model: object, *, streamed: bool, out: list[Event]) -> None:
        self._call = message_id
        self._streamed = streamed
        self._stop_reason = None
        self._has_tool = False
        self._snapshot_parts = 0
        self._start_input = None
        self._counted = False
        seen = self._seen
        seen[message_id] = streamed
        if len(seen) > self._remember:
            seen.popitem(last=False)
        if isinstance(model, str) and model:
            self.model = model
        out.append(TurnStart(turn_id=message_id))

    def _message_start(self, event: Mapping[str, Any], now: float, out: list[Event]) -> None:
        message = event.get("message")
        if not isinstance(message, Mapping):
            self._reporter.malformed("message_start", "no message")
            return
        message_id = _str(message.get("id"))
        if message_id is None:
            self._calls += 1
            message_id = f"#call-{self._calls}"
        elif message_id in self._seen:
            self._reporter.duplicate()
            self._skipping = True
            return
        if self._call is not None:
            self._settle(out, now, cancelled=False)
        self._open(message_id, message.get("model"), streamed=True, out=out)
        payload = message.get("usage")
        if isinstance(payload, Mapping):
            self._start_input = _context_input(normalize_usage(payload, provider="anthropic"))
            self._record(payload, out)
        stop = message.get("stop_reason")
        if isinstance(stop, str):
            self._stop_reason = stop  # a message_delta may still override it
        content = message.get("content")
        if isinstance(content, list):
            for index, data in enumerate(content):
                if isinstance(data, Mapping):
                    self._open_block(index, data, now, out)
                    self._finish_block(self._blocks.pop(index), now, out, stopped=False)
                else:
                    self._reporter.malformed("message_start", "content block not an object")

    def _message_delta(self, event: Mapping[str, Any], out: list[Event]) -> None:
        if self._call is None:
            self._reporter.malformed("message_delta", "no message is open")
            return
        delta = event.get("delta")
        if isinstance(delta, Mapping):
            stop = delta.get("stop_reason")
            if isinstance(stop, str):
                self._stop_reason = stop
        payload = event.get("usage")
        if isinstance(payload, Mapping):
            self._record(payload, out)

    def _error(self, event: Mapping[str, Any], now: float, out: list[Event]) -> None:
        error = event.get("error")
        code = message = None
        if isinstance(error, Mapping):
            code = _str(error.get("type"))
            message = _str(error.get("message"))
        if self._call is not None:
            self._finish_call(out, now, "error", cut=True)
        out.append(
            SessionError(
                message=message or code or "stream error",
                code=code,
                retryable=code in RETRYABLE_ERRORS,
            )
        )

    def _settle(self, out: list[Event], now: float, *, cancelled: bool) -> None:
        if self._call is None:
            return
        if cancelled:
            self._finish_call(out, now, "cancelled", cut=True)
        elif not self._streamed:
            self._finish_call(out, now, self._snapshot_reason(), cut=False)
        elif self._stop_reason is not None:
            self._finish_call(out, now, finish_reason(self._stop_reason), cut=False)
        else:
            self._finish_call(out, now, "cancelled", cut=True)

    def _snapshot_reason(self) -> str:
        if self._stop_reason is not None:
            return finish_reason(self._stop_reason)
        return "tool_use" if self._has_tool else "end_turn"

    def _finish_call(self, out: list[Event], now: float, reason: str, *, cut: bool) -> None:
        """Complete the open blocks (``stopped`` if ``cut``) and end the turn."""
        blocks = self._blocks
        if blocks:
            for index in sorted(blocks):
                self._finish_block(blocks[index], now, out, stopped=cut)
            blocks.clear()
        if self._counted and (not cut or reason == "error"):
            self._report(out, final=True)  # the call's last count is its final one
        out.append(TurnEnd(turn_id=self._call, finish_reason=reason))
        self._call = None
        self._stop_reason = None
        self._call_tools.clear()

    # -- blocks ------------------------------------------------------------------

    def _index(self, event: Mapping[str, Any], kind: str) -> int | None:
        index = event.get("index")
        if not isinstance(index, int) or isinstance(index, bool):
            self._reporter.malformed(kind, "no block index")
            return None
        if self._call is None or not self._streamed:
            self._reporter.malformed(kind, "no message is open")
            return None
        return index

    def _block_start(self, event: Mapping[str, Any], now: float, out: list[Event]) -> None:
        index = self._index(event, "content_block_start")
        if index is None:
            return
        data = event.get("content_block")
        if not isinstance(data, Mapping):
            self._reporter.malformed("content_block_start", "no content_block")
            return
        self._open_block(index, data, now, out)

    def _open_block(
        self, index: int, data: Mapping[str, Any], now: float, out: list[Event]
    ) -> None:
        """Start block ``index`` of the open call from its ``content_block``."""
        if index in self._blocks:  # a restart of an open index: finish the old one first
            self._finish_block(self._blocks.pop(index), now, out, stopped=True)
        btype = _str(data.get("type"))
        block = _Block(_IGNORED, f"{self._call}:{index}", now)
        self._blocks[index] = block
        if btype == "text":
            block.kind = _TEXT
            self._append(block, data.get("text"), out)
        elif btype == "thinking":
            block.kind = _THINKING
            self._append(block, data.get("thinking"), out)
            block.signature = _str(data.get("signature")) or None
        elif btype == "redacted_thinking":
            block.kind = _REDACTED
        elif btype in TOOL_USE_BLOCKS:
            block.kind = _TOOL
            block.tool_id = _str(data.get("id")) or block.part_id
            block.name = _str(data.get("name")) or ""
            block.input = data.get("input")
            self._has_tool = True
            self._call_tools[block.tool_id] = block.name
        elif btype is not None and btype.endswith("_tool_result"):
            block.kind = _RESULT
            block.tool_id = _str(data.get("tool_use_id")) or ""
            block.input = data
        elif btype == "compaction":
            block.kind = _COMPACTION
            summary = data.get("content")
            if isinstance(summary, str) and summary:
                block.chunks.append(summary)
        else:
            self._reporter.unknown(f"content_block.{btype}")

    def _append(self, block: _Block, text: object, out: list[Event]) -> None:
        if not isinstance(text, str) or not text:
            return
        block.chunks.append(text)
        self._unreported = True
        if block.kind == _TEXT:
            out.append(TextDelta(message_id=block.part_id, text=text))
        else:
            out.append(ThinkingDelta(message_id=block.part_id, text=text))

    def _delta(self, event: Mapping[str, Any], out: list[Event]) -> None:
        index = self._index(event, "content_block_delta")
        if index is None:
            return
        block = self._blocks.get(index)
        delta = event.get("delta")
        if block is None or not isinstance(delta, Mapping):
            self._reporter.malformed("content_block_delta", "no open block or no delta")
            return
        dtype = _str(delta.get("type"))
        kind = block.kind
        if dtype == "text_delta" and kind == _TEXT:
            self._append(block, delta.get("text"), out)
        elif dtype == "thinking_delta" and kind == _THINKING:
            self._append(block, delta.get("thinking"), out)
        elif dtype == "input_json_delta" and kind == _TOOL:
            partial = delta.get("partial_json")
            if isinstance(partial, str) and partial:
                block.chunks.append(partial)
        elif dtype == "compaction_delta" and kind == _COMPACTION:
            summary = delta.get("content")
            if isinstance(summary, str) and summary:
                block.chunks.append(summary)
        elif dtype == "signature_delta" and kind == _THINKING:
            signature = _str(delta.get("signature")) or ""
            block.signature = signature if block.signature is None else block.signature + signature
        elif kind == _IGNORED or dtype in _IGNORED_DELTAS:
            pass
        elif dtype in ("text_delta", "thinking_delta", "input_json_delta", "signature_delta"):
            self._reporter.malformed("content_block_delta", f"{dtype} in a different block")
        else:
            self._reporter.unknown(f"delta.{dtype}")

    def _block_stop(self, event: Mapping[str, Any], now: float, out: list[Event]) -> None:
        index = self._index(event, "content_block_stop")
        if index is None:
            return
        block = self._blocks.pop(index, None)
        if block is None:
            self._reporter.malformed("content_block_stop", "no open block")
            return
        self._finish_block(block, now, out, stopped=False)

    def _finish_block(self, block: _Block, now: float, out: list[Event], *, stopped: bool) -> None:
        kind = block.kind
        self._unreported = True
        if kind == _TEXT:
            text = "".join(block.chunks)
            out.append(TextComplete(message_id=block.part_id, text=text, stopped=stopped))
        elif kind in (_THINKING, _REDACTED):
            out.append(
                ThinkingComplete(
                    message_id=block.part_id,
                    text="".join(block.chunks),
                    duration_s=now - block.started,
                    signature=block.signature,
                    stopped=stopped,
                )
            )
        elif kind == _TOOL:
            if not stopped:  # an input cut short was never a call
                out.append(self._tool_start(block.tool_id, block.name, block))
        elif kind == _RESULT:
            out.append(self._tool_result(block.tool_id, block.input))
        elif kind == _COMPACTION and not stopped:
            out.append(SessionCompaction(tokens_before=self._start_input))

    def _tool_start(self, tool_id: str, name: str, block: _Block) -> ToolStart:
        raw = "".join(block.chunks)
        value: object = block.input
        if raw:
            try:
                value = json.loads(raw)
            except ValueError as exc:
                self._reporter.malformed("input_json_delta", f"tool input is not JSON: {exc}")
                value = None
        if value is None:
            value = {}
        if not isinstance(value, dict):
            self._reporter.malformed("tool_use", "tool input is not an object")
            value = {}
        return ToolStart(
            tool_call_id=tool_id,
            name=name,
            input=value,
            parent_tool_call_id=self.parent_tool_call_id,
        )

    def _tool_result(self, tool_id: str, data: object) -> ToolComplete:
        content: object = None
        failed = False
        if isinstance(data, Mapping):
            content = data.get("content")
            failed = data.get("is_error") is True
        if isinstance(content, Mapping):
            ctype = content.get("type")
            failed = failed or (isinstance(ctype, str) and ctype.endswith("_error"))
        text = result_text(content)
        return ToolComplete(
            tool_call_id=tool_id,
            name=self._call_tools.get(tool_id),
            status="error" if failed else "ok",
            output=None if failed else text,
            error=text if failed else None,
        )

    def _whole_block(self, data: Mapping[str, Any], out: list[Event]) -> None:
        """A complete content block of a snapshot: its deltas and completion at once."""
        btype = _str(data.get("type"))
        part_id = f"{self._call}:{self._snapshot_parts}"
        self._unreported = True
        if btype == "text":
            text = _str(data.get("text")) or ""
            if text:
                self._snapshot_parts += 1
                out.append(TextDelta(message_id=part_id, text=text))
                out.append(TextComplete(message_id=part_id, text=text))
        elif btype in ("thinking", "redacted_thinking"):
            self._snapshot_parts += 1
            text = _str(data.get("thinking")) or ""
            if text:
                out.append(ThinkingDelta(message_id=part_id, text=text))
            signature = _str(data.get("signature")) or None
            out.append(ThinkingComplete(message_id=part_id, text=text, signature=signature))
        elif btype in TOOL_USE_BLOCKS:
            tool_id = _str(data.get("id")) or part_id
            if tool_id in self._call_tools:
                return  # a later snapshot repeating the call
            self._snapshot_parts += 1
            block = _Block(_TOOL, part_id, 0.0)
            block.input = data.get("input")
            name = _str(data.get("name")) or ""
            self._has_tool = True
            self._call_tools[tool_id] = name
            out.append(self._tool_start(tool_id, name, block))
        elif btype is not None and btype.endswith("_tool_result"):
            self._snapshot_parts += 1
            out.append(self._tool_result(_str(data.get("tool_use_id")) or "", data))
        elif btype == "compaction":
            self._snapshot_parts += 1
            out.append(SessionCompaction())
        else:
            self._reporter.unknown(f"content_block.{btype}")

    # -- usage -------------------------------------------------------------------

    def _record(self, payload: Mapping[str, Any], out: list[Event]) -> None:
        tokens = normalize_usage(payload, provider="anthropic")
        iterations = payload.get("iterations")
        listed = iterations if isinstance(iterations, list) else []
        steps = [normalize_usage(s, provider="anthropic") for s in listed if isinstance(s, Mapping)]
        several = len(steps) > 1
        if several:  # the top level is the last iteration only; the call is billed for all
            summed = reduce(add_usage, steps)
            reasoning = max(tokens.reasoning_tokens, summed.reasoning_tokens)
            tokens = replace(summed, reasoning_tokens=reasoning, cost_usd=tokens.cost_usd)
        changed = self._ledger.record(
            session_id=self._ledger_key,
            run_id=None,
            turn_id=self._call or "",
            usage=tokens,
            cumulative=True,
        )
        self._counted = True
        if changed:
            self._report(out)
        if several:  # earlier iterations (a compaction) are no longer context
            last = steps[-1]
            out.append(SessionContext(used=_context_input(last) + last.output_tokens))

    def _report(self, out: list[Event], *, final: bool = False) -> None:
        """The running total when it changed (not to zeros), or ``final`` after new output."""
        total = self.total()
        changed = total != self._reported
        if not ((changed and total != _ZERO) or (final and (changed or self._unreported))):
            return
        self._reported = total
        self._unreported = False
        out.append(Usage(tokens=total, model=self.model))
