"""What ``busd watch`` draws, from :mod:`busd.view`: rich renderables and plain log lines.

Sans-I/O: everything here takes folded :class:`~busd.frontends.view.Views` and a clock
reading (``now``, seconds since the epoch) and returns something to draw, so
the screen is tested without a terminal. The numbers come from the view
(status, summary and context lines, timers, durations); this module only
lays them out.

Here are the pieces: a block of the transcript (:func:`render_block`), the
permission prompt, what stays pinned under the transcript (:func:`pinned`).
:mod:`busd.frontends.screen` lays them out on the live screen.
:class:`PlainLog` turns the same views into log lines, one per change worth
a line, for pipes and terminals without cursor control.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.padding import Padding
from rich.panel import Panel
from rich.text import Text

from .humanize import clip, format_duration, format_took, input_summary, tool_head
from .view import (
    AgentBlock,
    AgentView,
    Block,
    NoticeBlock,
    PermissionBlock,
    PromptBlock,
    SessionView,
    TextBlock,
    ThinkingBlock,
    ToolBlock,
    Views,
)

__all__ = [
    "PlainLog",
    "ReplyKey",
    "clip",
    "context_text",
    "input_summary",
    "outcome_line",
    "permission_prompt",
    "pinned",
    "render_block",
    "render_session",
    "reply_keys",
]

CONTEXT_BAR = 10
"""Cells of the context bar (drawn only when the window is known)."""
MAX_DEPTH = 4
"""Sub-agents nested deeper than this are listed, not expanded."""
_TEXT_TAIL = 400
"""Source lines of one text block rendered on the live screen (the screen shows fewer)."""

# -- small pieces ---------------------------------------------------------------------


def tool_duration(seconds: float) -> str:
    """``0.4s`` under a minute (tools are often quick), then ``1m 05s``; floored."""
    if seconds < 60:
        return f"{math.floor(max(0.0, seconds) * 10) / 10:.1f}s"
    return format_duration(seconds)


@dataclass(frozen=True)
class _Line:
    """One line that fits the width it is given: ``head`` is cut (``…``) so ``tail`` shows."""

    head: Text
    tail: Text

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield _fit(self.head, self.tail, options.max_width)


def _fit(head: Text, tail: Text, width: int) -> Text:
    line = head.copy()
    room = max(1, width - tail.cell_len)
    if line.cell_len > room:
        line.truncate(room, overflow="ellipsis")
    line.append_text(tail)
    line.truncate(width, overflow="ellipsis")
    line.no_wrap = True
    return line


@dataclass(frozen=True, slots=True)
class ReplyKey:
    """One key that answers a permission prompt, and the reply it sends."""

    key: str
    label: str
    option_id: str | None = None
    allow: bool | None = None


def reply_keys(block: PermissionBlock) -> list[ReplyKey]:
    """``y`` allow (once), ``a`` allow always when offered, ``n`` deny.

    ``allow`` lets the daemon pick the request's matching one-time option;
    "always" has no such shortcut, so it names the offered option.
    """
    keys = [ReplyKey("y", "allow", allow=True)]
    always = next((o for o in block.options if o.kind == "allow_always"), None)
    if always is not None:
        keys.append(ReplyKey("a", "allow always", option_id=always.id))
    keys.append(ReplyKey("n", "deny", allow=False))
    return keys


def resolution(block: PermissionBlock) -> str:
    """``✓ allowed by watch-a``, ``✗ denied by rule:0 (reason)``, ``⊘ cancelled``."""
    glyph = {"allowed": "✓", "denied": "✗", "cancelled": "⊘"}.get(block.state, "?")
    text = f"{glyph} {block.state}"
    if block.by:
        text += f" by {block.by}"
    if block.reason:
        text += f" ({block.reason})"
    return text


def outcome_line(view: SessionView) -> str | None:
    """How the last run ended, when that is not simply ``ok``."""
    if view.run_status == "cancelled":
        return "⊘ cancelled" + (f" by {view.cancelled_by}" if view.cancelled_by else "")
    if view.run_status == "error":
        error = view.finished.error if view.finished is not None else None
        return "✗ run failed" + (f": {clip(error, 100)}" if error else "")
    if view.run_status == "timed_out":
        return "✗ run timed out"
    return None


# -- the transcript -------------------------------------------------------------------


def render_block(view: SessionView, block: Block, now: float, *, depth: int = 0) -> RenderableType:
    """One block of the transcript (a pending permission is one line: its prompt is pinned)."""
    if isinstance(block, PromptBlock):
        return Text(f"❯ {block.text}", style="bold")
    if isinstance(block, TextBlock):
        text = block.text
        lines = text.splitlines()
        if len(lines) > _TEXT_TAIL:
            text = "…\n" + "\n".join(lines[-_TEXT_TAIL:])
        body = Text(text.rstrip("\n"))
        if block.stopped:
            body.append("\n⊘ stopped", style="dim red")
        return body
    if isinstance(block, ThinkingBlock):
        if block.done:
            return Text(f"∴ Thought for {format_took(block.elapsed(now))}", style="dim italic")
        return Text(f"∴ Thinking… {format_duration(block.elapsed(now))}", style="italic magenta")
    if isinstance(block, ToolBlock):
        return _render_tool(view, block, now, depth=depth)
    if isinstance(block, PermissionBlock):
        return _permission_line(block)
    if isinstance(block, AgentBlock):
        return _render_agent(view, view.agent(block.agent_id), now, depth)
    return _render_notice(block)


def _render_notice(block: NoticeBlock) -> Text:
    glyph, style = {
        "info": ("ℹ", "dim"),
        "warning": ("⚠", "yellow"),
        "error": ("✗", "bold red"),
    }[block.level]
    return Text(f"{glyph} {block.text}", style=style)


def _render_tool(view: SessionView, block: ToolBlock, now: float, *, depth: int) -> RenderableType:
    head, tail = Text(), Text()
    if block.status == "running":
        head.append("⏺ ", style="yellow")
        if block.waiting:
            tail.append("  ⋯ waiting for permission", style="yellow")
        else:
            tail.append(f"  ⋯ running {tool_duration(block.elapsed(now))}", style="yellow")
    else:
        glyph, style = {
            "ok": ("✓", "green"),
            "error": ("✗", "red"),
            "cancelled": ("⊘", "dim"),
            "timed_out": ("✗", "red"),  # busd ended it at its limit (an error)
        }[block.status]
        head.append(f"{glyph} ", style=style)
        word = "" if block.status == "ok" else f"{block.status.replace('_', ' ')} "
        tail.append(f"  {word}{tool_duration(block.elapsed(now))}", style=style)
    head.append(tool_head(block.name, block.input, 1000), style="bold")
    if block.timed_out:
        tail.append("  ⏱ over its time limit", style="yellow")
    parts: list[RenderableType] = [_Line(head, tail)]
    failed = block.status in ("error", "timed_out")
    detail = block.error if failed and block.error else block.output
    if detail and detail.strip():
        rest = len(detail.strip().splitlines()) - 1
        more = f" (+{rest} lines)" if rest > 0 else ""
        style = "red" if failed else "dim"
        first = Text(f"  └ {clip(detail, 1000, more=False)}", style=style)
        parts.append(_Line(first, Text(more, style=style)))
    for agent_id in block.agents:
        nested = _render_agent(view, view.agent(agent_id), now, depth + 1)
        parts.append(Padding(nested, (0, 0, 0, 4)))
    return Group(*parts)


def _render_agent(view: SessionView, agent: AgentView, now: float, depth: int) -> RenderableType:
    head = Text("↳ ", style="cyan")
    head.append(agent.name or agent.agent_id or "agent", style="bold cyan")
    if agent.description:
        head.append(f" — {clip(agent.description, 80)}")
    style = {"ok": "green", "error": "red", "cancelled": "dim"}.get(agent.status, "yellow")
    head.append(f"  {agent.status}", style=style)
    if depth > MAX_DEPTH:
        return head
    parts = [render_block(view, block, now, depth=depth) for block in agent.blocks]
    if agent.result and agent.status != "running":
        parts.append(Text(f"└ {clip(agent.result, 100)}", style="dim"))
    return Group(head, Padding(Group(*parts), (0, 0, 0, 2)))


def _permission_line(block: PermissionBlock) -> _Line:
    """Where a request sits in the transcript: waiting, or how it was answered and by whom."""
    line = Text("⚑ ", style="bold yellow" if block.state == "pending" else "")
    line.append(block.tool, style="bold")
    if block.title:
        line.append(f" · {clip(block.title, 1000)}")
    if block.state == "pending":
        return _Line(line, Text("  waiting for an answer", style="yellow"))
    style = {"allowed": "green", "denied": "red"}.get(block.state, "dim")
    return _Line(line, Text(f"  {resolution(block)}", style=style))


def permission_prompt(block: PermissionBlock, *, keys: bool = True) -> Panel:
    """The prompt for the request the keys answer: tool, title, input and the keys."""
    body = Text()
    body.append(block.tool, style="bold")
    if block.title:
        body.append(f" · {block.title}")
    summary = input_summary(block.input, 100)
    if summary:
        body.append(f"\n{summary}", style="dim")
    body.append("\n")
    if keys:
        for n, key in enumerate(reply_keys(block)):
            body.append("  " if n else "")
            body.append(f"[{key.key}]", style="bold reverse")
            body.append(f" {key.label}")
    else:
        body.append("answer it from a frontend with keys", style="dim")
    return Panel(
        body,
        title="Permission requested",
        title_align="left",
        border_style="bold yellow",
        expand=False,
    )


def render_session(view: SessionView, now: float, *, keys: bool = True) -> Group:
    """The whole transcript of ``view`` with its status or summary line underneath."""
    blocks = [render_block(view, block, now) for block in view.main.blocks]
    return Group(*blocks, *pinned(view, now, keys=keys))


def pinned(view: SessionView, now: float, *, keys: bool = True) -> list[RenderableType]:
    """What stays under the transcript however it scrolls: the oldest pending request's
    prompt (so text streaming in from elsewhere cannot push it away), then the status
    or summary line, how the run ended and the context line."""
    parts: list[RenderableType] = []
    pending = view.pending_permissions()
    if pending:
        parts.append(permission_prompt(pending[0], keys=keys))
    if view.busy:
        status = view.status_line(now)
        if status:
            parts.append(Text(status, style="bold magenta"))
    else:
        summary = view.summary_line()
        if summary:
            parts.append(Text(summary, style="bold"))
        tools = view.tools_line()
        if tools:
            parts.append(Text(tools, style="dim"))
        outcome = outcome_line(view)
        if outcome:
            parts.append(Text(outcome, style="red"))
    context = context_text(view)
    if context is not None:
        parts.append(context)
    return parts


def context_text(view: SessionView) -> Text | None:
    """The context line, after a bar of how full the window is: no window known, no bar."""
    line, ctx = view.context_line(), view.context
    if line is None or ctx is None:
        return None
    text = Text()
    if ctx.window:
        share = min(1.0, max(0.0, ctx.used / ctx.window))
        filled = min(CONTEXT_BAR, math.floor(share * CONTEXT_BAR))
        style = "red" if share >= 0.9 else "yellow" if share >= 0.7 else "cyan"
        text.append("█" * filled, style=style)
        text.append("░" * (CONTEXT_BAR - filled) + " ", style="dim")
    text.append(line, style="dim")
    return text


# -- plain log lines ------------------------------------------------------------------


@dataclass
class _Printed:
    """What was already printed of one block."""

    chars: int = 0
    started: bool = False
    ended: bool = False


class PlainLog:
    """Log lines from views: one per block change worth a line, text flushed per line.

    Blocks only ever grow in place or get appended, so a block is known by
    its position; what was printed of each is remembered, and blocks with
    nothing more to say are skipped from then on. Calling :meth:`lines`
    after each envelope (not each batch) keeps the lines in event order: a
    replayed history arrives as one batch. Status lines come from
    :meth:`status_lines`, which the caller ticks.
    """

    def __init__(self) -> None:
        self._printed: dict[tuple[str, str | None, int], _Printed] = {}
        self._first: dict[tuple[str, str | None], int] = {}
        self._status: dict[str, tuple[str, float]] = {}
        self._summary: dict[str, str | None] = {}
        self._outcome: dict[str, str | None] = {}
        self._agents: dict[tuple[str, str], str] = {}
        self._announced: set[tuple[str, str]] = set()

    def lines(self, views: Views, sessions: Iterable[str], now: float) -> list[str]:
        """New lines for the blocks of ``sessions`` (call after folding each envelope).

        Sub-agents are walked where they hang (under their tool call), so a
        batch that ends a sub-agent and its tool call reads in that order.
        """
        out: list[str] = []
        for session_id in sessions:
            view = views.sessions.get(session_id)
            if view is None:
                continue
            walked: set[str | None] = set()
            self._walk(view, view.main, out, walked)
            for agent in view.agents.values():  # sub-agents nobody started in view
                if agent.agent_id not in walked:
                    self._walk(view, agent, out, walked)
            if not view.busy and view.run_status != "running":  # a run: its own summary
                summary = view.summary_line()
                outcome = outcome_line(view)
                if summary is not None and summary != self._summary.get(session_id):
                    out.append(f"[{session_id}] {summary}")
                    self._summary[session_id] = summary
                    tools = view.tools_line()
                    if tools is not None:
                        out.append(f"[{session_id}] {tools}")
                if outcome is not None and outcome != self._outcome.get(session_id):
                    out.append(f"[{session_id}] {outcome}")
                self._outcome[session_id] = outcome
            else:
                self._summary[session_id] = None
                self._outcome[session_id] = None
        return out

    def _walk(
        self, view: SessionView, agent: AgentView, out: list[str], walked: set[str | None]
    ) -> None:
        walked.add(agent.agent_id)
        session_id = view.session_id
        prefix = f"[{session_id}]"
        if agent.agent_id is not None:
            prefix = f"[{session_id} ↳ {agent.name or agent.agent_id}]"
        blocks = agent.blocks
        first = self._first.get((session_id, agent.agent_id), 0)
        for index in range(first, len(blocks)):
            block = blocks[index]
            key = (session_id, agent.agent_id, index)
            printed = self._printed.get(key)
            if printed is None:
                printed = self._printed[key] = _Printed()
            lines = [_printable(line) for line in _block_lines(block, printed)]
            if printed.ended and index == first:  # done with: never walked again
                first += 1
                del self._printed[key]
            nested = block.agents if isinstance(block, ToolBlock) else []
            if isinstance(block, AgentBlock):
                nested = [block.agent_id]
            if nested and lines and isinstance(block, ToolBlock) and block.status != "running":
                # the end line goes after what the sub-agents did
                out.extend(f"{prefix} {line}" for line in lines[:-1])
                lines = lines[-1:]
            else:
                out.extend(f"{prefix} {line}" for line in lines)
                lines = []
            for agent_id in nested:
                sub = view.agents.get(agent_id)
                if agent_id in walked or sub is None:
                    continue
                if (session_id, agent_id) not in self._announced:
                    self._announced.add((session_id, agent_id))
                    about = f" — {clip(sub.description, 80)}" if sub.description else ""
                    out.append(f"{prefix} ↳ sub-agent {sub.name or agent_id}{about}")
                self._walk(view, sub, out, walked)
            out.extend(f"{prefix} {line}" for line in lines)
        self._first[session_id, agent.agent_id] = first
        key2 = (session_id, agent.agent_id or "")
        if agent.agent_id is not None and self._agents.get(key2) != agent.status:
            self._agents[key2] = agent.status
            if agent.status != "running":
                result = f": {clip(agent.result, 120)}" if agent.result else ""
                out.append(f"{prefix} ↳ {agent.status}{result}")

    def status_lines(self, views: Views, sessions: Iterable[str], now: float) -> list[str]:
        """Each busy session's status line when it changed, at most once a second."""
        out: list[str] = []
        for session_id in sessions:
            view = views.sessions.get(session_id)
            line = view.status_line(now) if view is not None else None
            if line is None:
                continue
            last, when = self._status.get(session_id, ("", -math.inf))
            if line != last and now - when >= 1.0:
                self._status[session_id] = (line, now)
                out.append(f"[{session_id}] {line}")
        return out


_CONTROLS = dict.fromkeys([*range(0x00, 0x09), *range(0x0A, 0x20), 0x7F, 0x9B])


def _printable(line: str) -> str:
    """No terminal control characters from an agent's text reach the log (tabs stay)."""
    return line.translate(_CONTROLS)


def _block_lines(block: Block, printed: _Printed) -> list[str]:
    if isinstance(block, TextBlock):
        if printed.ended:
            return []
        text = block.text
        end = len(text) if block.done else text.rfind("\n") + 1
        lines = text[printed.chars : end].splitlines() if end > printed.chars else []
        printed.chars = max(printed.chars, end)
        if block.done:
            printed.ended = True
            if block.stopped:
                lines.append("⊘ stopped")
        return lines
    if printed.ended:
        return []
    if isinstance(block, PromptBlock):
        printed.ended = True
        return [f"❯ {clip(block.text, 200)}"]
    if isinstance(block, ThinkingBlock):
        if block.done:
            printed.ended = True
            return [f"∴ Thought for {format_took(block.elapsed(0.0))}"]
        if not printed.started:
            printed.started = True
            return ["∴ Thinking…"]
        return []
    if isinstance(block, ToolBlock):
        lines = []
        if not printed.started:
            printed.started = True
            lines.append(f"⏺ {tool_head(block.name, block.input)}")
        if block.status != "running":
            printed.ended = True
            glyph = {"ok": "✓", "error": "✗", "cancelled": "⊘", "timed_out": "✗"}[block.status]
            word = "" if block.status == "ok" else f" {block.status.replace('_', ' ')}"
            line = f"{glyph} {block.name}{word} {tool_duration(block.elapsed(0.0))}"
            if block.status in ("error", "timed_out") and block.error:
                line += f": {clip(block.error, 120)}"
            lines.append(line)
        return lines
    if isinstance(block, PermissionBlock):
        lines = []
        if not printed.started:
            printed.started = True
            title = f" · {block.title}" if block.title else ""
            summary = input_summary(block.input)
            detail = f" · {summary}" if summary else ""
            lines.append(f"⚠ permission requested: {block.tool}{title}{detail}")
        if block.state != "pending":
            printed.ended = True
            lines.append(f"⚑ {block.tool}: {resolution(block)}")
        return lines
    if isinstance(block, AgentBlock):
        return []  # announced by the walk, which knows its name
    printed.ended = True
    return _render_notice(block).plain.splitlines()  # a plan is several lines
