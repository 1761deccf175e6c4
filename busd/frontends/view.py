"""What a frontend shows, folded from the event stream: one model for every UI.

``busd watch`` and ``busd web`` both fold the envelopes they receive into
:class:`Views` and render the result, so two frontends side by side cannot
disagree about a token count, a tool's status or who answered a permission:
the arithmetic happens once, here, sans-I/O. A view is plain msgspec data, so
the web bridge sends it to browsers as it is (``msgspec.json.encode``).

Live figures tick between the daemon's ``busd.stats`` reports: a view keeps
the accept time of the last report and extrapolates from the caller's clock
(``now``, seconds since the epoch, like ``Envelope.ts``) while the session is
busy. Events of a run that is no longer active (``stale``) are not shown.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import msgspec

from ..core.events import (
    AgentComplete,
    AgentStart,
    AgentUpdate,
    ContextUsage,
    Envelope,
    Event,
    PermissionOption,
    PermissionRequested,
    PermissionResolved,
    RunCancelled,
    RunFinished,
    RunStarted,
    SessionCompaction,
    SessionError,
    SessionIdle,
    SessionInfo,
    SessionStart,
    SessionTitleChanged,
    SessionWarning,
    StreamingStats,
    TextComplete,
    TextDelta,
    ThinkingComplete,
    ThinkingDelta,
    TokenUsage,
    ToolComplete,
    ToolPartialResult,
    ToolStart,
    ToolTimeout,
    TurnStart,
    Usage,
    UserPrompt,
)
from .humanize import format_duration, format_tokens, format_who, status_line, summary_line

__all__ = [
    "AgentView",
    "Block",
    "NoticeBlock",
    "PermissionBlock",
    "PromptBlock",
    "SessionView",
    "TextBlock",
    "ThinkingBlock",
    "ToolBlock",
    "Views",
    "models_line",
]

OUTPUT_LIMIT = 2000
"""Characters of a tool's output a view keeps (the tail; the rest is on the bus)."""


EXTRAPOLATE_LIMIT = 1.0
"""Seconds a live figure runs ahead of the last report (the daemon reports 4 times a
second while a session works; a silent daemon must not let a timer run away)."""


def models_line(models: dict[str, TokenUsage]) -> str | None:
    """``claude-sonnet-4-5 412 out · claude-haiku-4-5 3 out``; ``None`` for one model or none."""
    if len(models) < 2:
        return None
    return " · ".join(f"{name} {format_tokens(u.output_tokens)} out" for name, u in models.items())


class _Block(msgspec.Struct, kw_only=True, tag_field="kind"):
    pass


class PromptBlock(_Block, tag="prompt"):
    """What a run was asked."""

    text: str
    run_id: str | None = None


class TextBlock(_Block, tag="text"):
    message_id: str
    text: str = ""
    done: bool = False
    stopped: bool = False


class ThinkingBlock(_Block, tag="thinking"):
    """Reasoning: shown collapsed with its timer, which runs from the first delta."""

    message_id: str
    started_ts: float
    text: str = ""
    done: bool = False
    duration_s: float | None = None

    def elapsed(self, now: float) -> float:
        if self.duration_s is not None:
            return self.duration_s
        return max(0.0, now - self.started_ts)


class ToolBlock(_Block, tag="tool"):
    """A tool call. Its timer is the tool's own run time, the same for every adapter.

    It runs from the call, or from the answer to the call's permission request
    when it asked one (``started_ts`` moves there; ``waited_s`` is how long it
    waited), to its completion: the time spent waiting for a person is not
    the tool's. An SDK's own figure (``duration_s`` on ``stream.tool.complete``)
    is kept when it is shorter, since it may leave out other delays too.
    """

    tool_call_id: str
    name: str
    started_ts: float
    input: dict[str, Any] = {}
    status: Literal["running", "ok", "error", "cancelled", "timed_out"] = "running"
    duration_s: float | None = None
    output: str | None = None
    error: str | None = None
    timed_out: bool = False
    agents: list[str] = []
    """Sub-agents this call spawned, shown nested under it."""
    waiting: bool = False
    """Its permission request waits for an answer: the tool has not started running."""
    waited_s: float | None = None
    """How long it waited for the answer to its permission request (None: it asked none)."""

    def elapsed(self, now: float) -> float:
        if self.duration_s is not None:
            return self.duration_s
        if self.waiting:
            return 0.0
        return max(0.0, now - self.started_ts)

    def answered(self, ts: float) -> None:
        """Its permission request was answered at ``ts``: its own run time starts now."""
        if self.waited_s is None and self.status == "running":
            self.waited_s = max(0.0, ts - self.started_ts)
            self.started_ts = max(self.started_ts, ts)
        self.waiting = False

    def complete(self, ts: float, duration_s: float | None) -> None:
        """Stop the timer at ``ts``; an SDK's own ``duration_s`` wins when it is shorter."""
        self.waiting = False
        measured = max(0.0, ts - self.started_ts)
        if duration_s is None:
            self.duration_s = measured
        elif self.waited_s is not None:  # it may count the wait for permission: not ours
            self.duration_s = min(max(0.0, duration_s), measured)
        else:
            self.duration_s = max(0.0, duration_s)


class PermissionBlock(_Block, tag="permission"):
    request_id: str
    tool: str
    tool_call_id: str | None = None
    title: str | None = None
    input: dict[str, Any] = {}
    options: list[PermissionOption] = []
    state: Literal["pending", "allowed", "denied", "cancelled"] = "pending"
    by: str | None = None
    reason: str | None = None
    run_id: str | None = None


class AgentBlock(_Block, tag="agent"):
    """A sub-agent spawned outside any tool call (most are nested under their tool)."""

    agent_id: str


class NoticeBlock(_Block, tag="notice"):
    level: Literal["info", "warning", "error"]
    text: str


Block = (
    PromptBlock | TextBlock | ThinkingBlock | ToolBlock | PermissionBlock | AgentBlock | NoticeBlock
)


class AgentView(msgspec.Struct, kw_only=True):
    """The main chat (``agent_id`` None) or one sub-agent, with its blocks in order."""

    agent_id: str | None = None
    name: str = ""
    description: str | None = None
    status: str = "running"
    result: str | None = None
    blocks: list[Block] = []


class SessionView(msgspec.Struct, kw_only=True):
    session_id: str
    title: str | None = None
    model: str | None = None
    cwd: str | None = None
    adapter: str | None = None
    run_id: str | None = None
    run_status: Literal["running", "ok", "error", "cancelled", "timed_out"] | None = None
    cancelled_by: str | None = None
    busy: bool = False
    stats: StreamingStats | None = None
    stats_ts: float = 0.0
    usage: TokenUsage | None = None
    models: dict[str, TokenUsage] = {}
    """The session's running total per model (``stream.usage`` ``models``), for
    sessions busd only observes: a run's own share is in ``finished.models``."""
    context: ContextUsage | None = None
    finished: RunFinished | None = None
    run_output_base: int = 0
    """The session's live output count when the last run started (``stats`` are the
    session's): what the run itself produced, when its summary has no count."""
    last_seq: int = 0
    main: AgentView = msgspec.field(default_factory=AgentView)
    agents: dict[str, AgentView] = {}

    # -- what frontends show --------------------------------------------------------

    def live_stats(self, now: float) -> StreamingStats | None:
        """The last report, advanced to ``now`` while the session is busy."""
        stats = self.stats
        if stats is None or not self.busy:
            return stats
        ahead = min(max(0.0, now - self.stats_ts), EXTRAPOLATE_LIMIT)
        return msgspec.structs.replace(
            stats,
            elapsed_s=stats.elapsed_s + ahead,
            thinking_s=stats.thinking_s + (ahead if stats.thinking else 0.0),
        )

    def status_line(self, now: float) -> str | None:
        """``✶ Thinking… (12s · ↓ 1.2k tokens · thought for 3s)`` while busy, else None."""
        stats = self.live_stats(now)
        if not self.busy or stats is None:
            return None
        return status_line(stats, verb="Thinking…" if stats.thinking else "Working…")

    def summary_stats(self) -> StreamingStats | None:
        """The figures of the summary line once the work is done (None while busy).

        A finished run's own summary wins over the last live report: the
        provider's count, or busd's estimate where none covers the output
        (``output_estimated``: a run cut short after its last count). When
        the provider reported no output count for the run (ACP agents that
        send only ``usage_update``), the run's share of the live count, busd's
        estimate, stands in, marked estimated.
        """
        if self.busy:
            return None
        finished = self.finished
        if finished is None:
            return self.stats
        output, estimated = finished.usage.output_tokens, finished.output_estimated
        if output == 0 and self.stats is not None:
            output = max(0, self.stats.output_tokens - self.run_output_base)
            estimated = output > 0
        return StreamingStats(
            elapsed_s=finished.duration_s,
            output_tokens=output,
            output_estimated=estimated,
            thinking_s=finished.thinking_s,
        )

    def summary_line(self) -> str | None:
        """``✻ Worked for 18s · ↓ 1.4k tokens · thought for 5s`` once the work is done.

        When the run used more than one model, each model's share follows
        (``· sonnet 412 out · haiku 3 out``); for a session busd only observes
        (no run), each model's total so far.
        """
        stats = self.summary_stats()
        if stats is None:
            return None
        line = summary_line(stats)
        models = models_line(self.finished.models if self.finished is not None else self.models)
        return line if models is None else f"{line} · {models}"

    def tools_line(self) -> str | None:
        """``tools: Bash 3 calls, 1 error, mean 1.2s, last 0.4s · Read 2 calls, ...``.

        The last run's tool metrics (``busd.run.finished``), most called first:
        simse's tool metrics, shown once the run is over.
        """
        if self.busy or self.finished is None or not self.finished.tools:
            return None
        parts = []
        for m in sorted(self.finished.tools, key=lambda m: (-m.calls, m.name)):
            part = f"{m.name} {m.calls} call{'s' if m.calls != 1 else ''}"
            if m.errors:
                part += f", {m.errors} error{'s' if m.errors != 1 else ''}"
            if m.calls > 1 and m.mean_s:
                part += f", mean {m.mean_s:.1f}s"
            if m.last_s is not None:
                part += f", last {m.last_s:.1f}s"
            parts.append(part)
        return "tools: " + " · ".join(parts)

    def pending_permissions(self) -> list[PermissionBlock]:
        return [
            block
            for agent in (self.main, *self.agents.values())
            for block in agent.blocks
            if isinstance(block, PermissionBlock) and block.state == "pending"
        ]

    def context_line(self) -> str | None:
        """``context 23.4k / 200.0k (12%) · system 3.1k · ... · cache hit 85% · estimates ±3%``.

        The cache hit is the last call's share of its prompt read from the
        cache; the estimate error, how far the figures shown before calls
        were from their actual input on average (``busd.context``'s basis).

        A model whose window busd does not know: ``context 54.5k · window unknown · ...``.
        """
        ctx = self.context
        if ctx is None:
            return None
        approx = "~" if ctx.estimated else ""
        head = f"context {approx}{format_tokens(ctx.used)}"
        if ctx.window:
            head += f" / {format_tokens(ctx.window)}"
            if ctx.percent is not None:
                head += f" ({math.floor(ctx.percent)}%)"
        else:  # no share of anything: say so rather than leave the reader to guess
            head += " · window unknown"
        parts = [head]
        b = ctx.breakdown
        for name, value in (("system", b.system), ("tools", b.tools), ("messages", b.messages)):
            if value:
                parts.append(f"{name} {format_tokens(value)}")
        if b.free is not None:
            parts.append(f"free {format_tokens(b.free)}")
        basis = ctx.basis
        if basis.cache_hit_percent is not None:  # the last call's prompt, served from the cache
            parts.append(f"cache hit {math.floor(basis.cache_hit_percent)}%")
        error = basis.estimate_error_percent
        if error is not None:
            parts.append(f"estimates ±{math.floor(error)}%" if error >= 1 else "estimates ±<1%")
        return " · ".join(parts)

    def snapshot(self, now: float) -> dict[str, Any]:
        """The view as JSON-ready data, with the lines computed for ``now``."""
        data: dict[str, Any] = msgspec.to_builtins(self)
        data["status_line"] = self.status_line(now)
        data["summary_line"] = self.summary_line()
        data["tools_line"] = self.tools_line()
        data["context_line"] = self.context_line()
        data["now"] = now
        return data

    # -- folding --------------------------------------------------------------------

    def agent(self, agent_id: str | None) -> AgentView:
        if agent_id is None:
            return self.main
        view = self.agents.get(agent_id)
        if view is None:
            view = self.agents[agent_id] = AgentView(agent_id=agent_id, name=agent_id)
        return view

    def tool(self, tool_call_id: str) -> ToolBlock | None:
        for agent in (self.main, *self.agents.values()):
            for block in reversed(agent.blocks):
                if isinstance(block, ToolBlock) and block.tool_call_id == tool_call_id:
                    return block
        return None

    def _permission_of(self, tool_call_id: str) -> PermissionBlock | None:
        """The permission request of a tool call, if it asked one."""
        for agent in (self.main, *self.agents.values()):
            for block in agent.blocks:
                if isinstance(block, PermissionBlock) and block.tool_call_id == tool_call_id:
                    return block
        return None

    def permission(self, request_id: str) -> PermissionBlock | None:
        for agent in (self.main, *self.agents.values()):
            for block in reversed(agent.blocks):
                if isinstance(block, PermissionBlock) and block.request_id == request_id:
                    return block
        return None

    def apply(self, envelope: Envelope[Event]) -> None:
        was_busy = self.busy
        self._apply(envelope)
        if self.busy and not was_busy:
            self.stats_ts = envelope.ts  # busy time resumes now, not at the last report

    def _apply(self, envelope: Envelope[Event]) -> None:
        self.last_seq = envelope.seq
        event = envelope.event
        ts = envelope.ts
        if isinstance(event, StreamingStats):
            if envelope.agent_id is None:
                self.stats, self.stats_ts = event, ts
            return
        if isinstance(event, (AgentStart, AgentUpdate, AgentComplete)):
            self._apply_agent(event, envelope.agent_id)
            return
        agent = self.agent(envelope.agent_id)
        blocks = agent.blocks
        if isinstance(event, TextDelta):
            last = blocks[-1] if blocks else None
            if (
                isinstance(last, TextBlock)
                and last.message_id == event.message_id
                and not last.done
            ):
                last.text += event.text
            else:
                blocks.append(TextBlock(message_id=event.message_id, text=event.text))
            self.busy = True
        elif isinstance(event, TextComplete):
            block = _last_of(blocks, TextBlock, event.message_id)
            if block is None or block.done:
                blocks.append(
                    TextBlock(
                        message_id=event.message_id,
                        text=event.text,
                        done=True,
                        stopped=event.stopped,
                    )
                )
            else:
                block.text, block.done, block.stopped = event.text, True, event.stopped
        elif isinstance(event, ThinkingDelta):
            last = blocks[-1] if blocks else None
            if (
                isinstance(last, ThinkingBlock)
                and last.message_id == event.message_id
                and not last.done
            ):
                last.text += event.text
            else:
                blocks.append(
                    ThinkingBlock(message_id=event.message_id, started_ts=ts, text=event.text)
                )
            self.busy = True
        elif isinstance(event, ThinkingComplete):
            thinking = _last_of(blocks, ThinkingBlock, event.message_id)
            if thinking is None or thinking.done:
                thinking = ThinkingBlock(message_id=event.message_id, started_ts=ts)
                blocks.append(thinking)
            thinking.text, thinking.done = event.text, True
            thinking.duration_s = (
                event.duration_s
                if event.duration_s is not None
                else max(0.0, ts - thinking.started_ts)
            )
        elif isinstance(event, ToolStart):
            call = ToolBlock(
                tool_call_id=event.tool_call_id, name=event.name, input=event.input, started_ts=ts
            )
            blocks.append(call)
            asked = self._permission_of(event.tool_call_id)
            if asked is not None:  # asked before the call was shown (and maybe answered)
                call.waiting = asked.state == "pending"
                call.waited_s = None if call.waiting else 0.0
            self.busy = True
        elif isinstance(event, ToolPartialResult):
            tool = self.tool(event.tool_call_id)
            if tool is not None:
                tool.output = event.output[-OUTPUT_LIMIT:]
        elif isinstance(event, ToolComplete):
            tool = self.tool(event.tool_call_id)
            if tool is None:
                tool = ToolBlock(
                    tool_call_id=event.tool_call_id, name=event.name or "tool", started_ts=ts
                )
                blocks.append(tool)
            tool.status = event.status
            tool.complete(ts, event.duration_s)
            if event.output is not None:
                tool.output = event.output[-OUTPUT_LIMIT:]
            tool.error = event.error
        elif isinstance(event, ToolTimeout):
            tool = self.tool(event.tool_call_id)
            if tool is not None:
                tool.timed_out = True
            blocks.append(
                NoticeBlock(
                    level="warning",
                    text=f"{event.name} has run for {format_duration(event.elapsed_s)} "
                    f"(limit {format_duration(event.limit_s)})",
                )
            )
        elif isinstance(event, PermissionRequested):
            if self.permission(event.request_id) is None:
                blocks.append(
                    PermissionBlock(
                        request_id=event.request_id,
                        tool=event.tool,
                        tool_call_id=event.tool_call_id,
                        title=event.title,
                        input=event.input,
                        options=event.options,
                        run_id=envelope.run_id,
                    )
                )
                tool = self.tool(event.tool_call_id) if event.tool_call_id else None
                if tool is not None and tool.status == "running":
                    tool.waiting = True
        elif isinstance(event, PermissionResolved):
            request = self.permission(event.request_id)
            if request is not None and request.state == "pending":
                request.state, request.reason = event.outcome, event.reason
                request.by = format_who(event.by) if event.by else event.by
                tool = self.tool(request.tool_call_id) if request.tool_call_id else None
                if tool is not None:
                    tool.answered(ts)
        elif isinstance(event, Usage):
            if envelope.agent_id is None:
                self.usage = event.tokens
                if event.models:
                    self.models = event.models
        elif isinstance(event, ContextUsage):
            self.context = event
        elif isinstance(event, TurnStart):
            self.busy = True
        elif isinstance(event, SessionStart):
            self.title = event.title or self.title
            self.model = event.model or self.model
            self.cwd = event.cwd or self.cwd
        elif isinstance(event, SessionTitleChanged):
            self.title = event.title
        elif isinstance(event, SessionIdle):
            if envelope.agent_id is None:
                self.busy = False
        elif isinstance(event, SessionError):
            blocks.append(NoticeBlock(level="error", text=event.message))
        elif isinstance(event, SessionWarning):
            blocks.append(NoticeBlock(level="warning", text=event.message))
        elif isinstance(event, SessionInfo):
            blocks.append(NoticeBlock(level="info", text=event.message))
        elif isinstance(event, SessionCompaction):
            blocks.append(NoticeBlock(level="info", text="context compacted"))
        elif isinstance(event, RunStarted):
            self.run_id, self.run_status, self.adapter = envelope.run_id, "running", event.adapter
            self.model = event.model or self.model
            self.finished, self.cancelled_by, self.busy = None, None, True
            self.run_output_base = self.stats.output_tokens if self.stats is not None else 0
            if event.prompt:
                blocks.append(PromptBlock(text=event.prompt, run_id=envelope.run_id))
        elif isinstance(event, UserPrompt):
            blocks.append(PromptBlock(text=event.text, run_id=envelope.run_id))
        elif isinstance(event, RunCancelled):
            self.cancelled_by = format_who(event.by) if event.by else event.by
        elif isinstance(event, RunFinished):
            self.finished, self.run_status, self.busy = event, event.status, False
            if event.context is not None:
                self.context = event.context
            for pending in self.pending_permissions():
                if pending.run_id == envelope.run_id:
                    pending.state = "cancelled"
            for agent in (self.main, *self.agents.values()):
                for block in agent.blocks:  # nothing will complete them now: stop their timers
                    if isinstance(block, ToolBlock) and block.status == "running":
                        block.status = "cancelled"
                        block.complete(ts if not block.waiting else block.started_ts, None)

    def _apply_agent(
        self, event: AgentStart | AgentUpdate | AgentComplete, parent: str | None
    ) -> None:
        if isinstance(event, AgentStart):
            view = self.agent(event.agent_id)
            view.name = event.name or view.name
            view.description = event.description
            tool = self.tool(event.tool_call_id) if event.tool_call_id else None
            if tool is not None:
                if event.agent_id not in tool.agents:
                    tool.agents.append(event.agent_id)
            else:
                self.agent(event.parent_agent_id or parent).blocks.append(
                    AgentBlock(agent_id=event.agent_id)
                )
        elif isinstance(event, AgentUpdate):
            self.agent(event.agent_id).status = event.status
        else:
            view = self.agent(event.agent_id)
            view.status, view.result = event.status, event.result


def _last_of(blocks: list[Block], kind: type[Any], message_id: str) -> Any:
    for block in reversed(blocks):
        if isinstance(block, kind) and block.message_id == message_id:
            return block
    return None


class Views:
    """Every session seen, in the order first seen."""

    def __init__(self) -> None:
        self.sessions: dict[str, SessionView] = {}

    def apply(self, envelope: Envelope[Event]) -> SessionView | None:
        """Fold one envelope; returns the session it changed (None: not shown)."""
        session_id = envelope.session_id
        if session_id is None or envelope.stale:
            return None
        view = self.sessions.get(session_id)
        if view is None:
            view = self.sessions[session_id] = SessionView(session_id=session_id)
        view.apply(envelope)
        return view

    def apply_all(self, envelopes: list[Envelope[Event]]) -> set[str]:
        """Fold a batch; returns the ids of the sessions it changed."""
        changed: set[str] = set()
        for envelope in envelopes:
            view = self.apply(envelope)
            if view is not None:
                changed.add(view.session_id)
        return changed
