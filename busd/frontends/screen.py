"""The live screen of ``busd watch``, laid out to the terminal's size (sans-I/O).

From the top: the title, a header line (``busd demo`` says there how to
attach more frontends), the session list in columns that use the width
(a state is shortened before a title is cut, and titles get what is
left), the focused session's transcript, what stays pinned under it (the
permission prompt, the status and context lines), a rule that says where
the transcript is scrolled to, the message line and the key help, packed
into as many lines as the width needs. At 80x24 nothing is cut that a
person needs to act.

The transcript is rendered lazily, a block at a time, only as far as the
page needs, whether it follows the newest lines or is scrolled back
(:class:`Viewport`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.segment import Segment
from rich.text import Text

from ..core.events import StreamingStats
from .humanize import format_duration, format_tokens
from .tui import clip, outcome_line, pinned, render_block
from .view import PromptBlock, SessionView, Views

__all__ = ["Screen", "Viewport", "session_line", "session_rows"]

MAX_LISTED = 6
"""Sessions listed above the transcript (fewer in a short terminal); more are scrolled so
the focused one shows."""
LABEL = 32
"""Columns a session's title keeps in the list before its state is shortened."""
MIN_LABEL = 16
"""Columns a session's title keeps in the list before its shortened state is cut."""

Lines = list[list[Segment]]


# -- the session list -----------------------------------------------------------------


def _short_outcome(view: SessionView) -> str | None:
    return {"cancelled": "⊘ cancelled", "error": "✗ failed", "timed_out": "✗ timed out"}.get(
        view.run_status or ""
    )


def _label(view: SessionView) -> str:
    if view.title:
        return view.title
    prompt = next((b for b in view.main.blocks if isinstance(b, PromptBlock)), None)
    return clip(prompt.text, 500, more=False) if prompt is not None else ""


def _brief(stats: StreamingStats | None, glyph: str) -> str:
    """``✶ 12s · ↓ ~1.2k``: a status or summary line for a narrow column."""
    if stats is None:
        return ""
    text = f"{glyph} {format_duration(stats.elapsed_s)}"
    if stats.output_tokens > 0:
        approx = "~" if stats.output_estimated else ""
        text += f" · ↓ {approx}{format_tokens(stats.output_tokens)}"
    return text


def _state(view: SessionView, now: float, *, short: bool) -> Text:
    """What a session is doing: waiting for an answer, its status or summary, how it ended."""
    state = Text()
    pending = len(view.pending_permissions())
    if pending:
        noun = "permission" if pending == 1 else "permissions"
        state.append(f"⚠ {pending} {noun}" + ("" if short else " waiting"), style="bold yellow")
    if view.busy:
        line = _brief(view.live_stats(now), "✶") if short else view.status_line(now)
        style = "magenta"
    else:
        line = _brief(view.summary_stats(), "✻") if short else view.summary_line()
        style = "dim"
    if line:
        state.append("  " if state else "")
        state.append(line, style=style)
    outcome = _short_outcome(view) if short else outcome_line(view)
    if outcome and not view.busy:
        state.append("  " if state else "")
        state.append(outcome, style="red")
    return state


def _cut(text: Text, width: int) -> Text:
    text = text.copy()
    if text.cell_len > width:
        text.truncate(max(1, width), overflow="ellipsis")
    return text


def _label_text(view: SessionView, width: int | None) -> Text:
    """Title and adapter; the adapter goes first when they do not fit, then the title is cut."""
    title = _label(view)
    adapter = (f" · {view.adapter}" if title else view.adapter) if view.adapter else ""
    if width is not None and cell_len(title + adapter) > width:
        adapter = ""
    text = Text(title)
    text.append(adapter, style="dim")
    return text if width is None else _cut(text, width)


def session_line(view: SessionView, now: float, *, focused: bool = False) -> Text:
    """One line of the session list, as long as it takes: id, title, adapter, state."""
    return _session_row(view, now, focused=focused, id_width=None, label_width=None)


def _session_row(
    view: SessionView,
    now: float,
    *,
    focused: bool,
    id_width: int | None,
    label_width: int | None,
    state: Text | None = None,
) -> Text:
    line = Text("▸ " if focused else "  ", style="bold cyan" if focused else "")
    sid = Text(view.session_id, style="bold" if focused else "cyan")
    if id_width is not None:
        sid = _cut(sid, id_width)
        sid.pad_right(id_width - sid.cell_len)
    line.append_text(sid)
    label = _label_text(view, label_width)
    if label_width is not None:
        label.pad_right(label_width - label.cell_len)
    if label or label_width:
        line.append("  ")
        line.append_text(label)
    state = _state(view, now, short=False) if state is None else state
    if state:
        line.append("  ")
        line.append_text(state)
    line.no_wrap = True
    line.overflow = "ellipsis"
    return line


def session_rows(views: list[SessionView], now: float, focus: str | None, width: int) -> list[Text]:
    """The session list in columns that use ``width``: the state before the title is cut.

    Ids line up (a long one is cut); a state is shortened (``✶ 12s · ↓ 1.2k``)
    when it would leave the titles less than :data:`LABEL` columns, and cut
    only below :data:`MIN_LABEL`; the titles get what is left.
    """
    if not views:
        return []
    id_width = min(max(len(v.session_id) for v in views), max(8, width // 4))
    rest = width - 2 - id_width - 2
    longest = max(_label_text(v, None).cell_len for v in views)
    roomy = rest - min(LABEL, longest) - 2
    budget = max(8, rest - min(MIN_LABEL, longest) - 2)
    states = []
    for view in views:
        state = _state(view, now, short=False)
        if state.cell_len > roomy:
            state = _cut(_state(view, now, short=True), budget)
        states.append(state)
    state_width = max(state.cell_len for state in states)
    label_width = max(0, min(longest, rest - (state_width + 2 if state_width else 0)))
    return [
        _session_row(
            view,
            now,
            focused=view.session_id == focus,
            id_width=id_width,
            label_width=label_width,
            state=state,
        )
        for view, state in zip(views, states, strict=True)
    ]


# -- the screen -----------------------------------------------------------------------


def _window(count: int, index: int, size: int) -> range:
    """``size`` consecutive indexes out of ``count`` that include ``index``."""
    if count <= size:
        return range(count)
    start = min(max(0, index - size // 2), count - size)
    return range(start, start + size)


@dataclass
class Viewport:
    """Where the focused transcript is scrolled to: the keys move it, the screen resolves it.

    ``top`` is the first line shown, as (block index, line in that block):
    blocks are only ever appended, so it stays on the same text while new
    output arrives below. ``None`` follows the newest lines.
    """

    top: tuple[int, int] | None = None
    pending: int = 0
    """Lines to move by at the next draw (negative: back), from the keys."""
    room: int = 10
    """Transcript lines the last draw had: a page."""

    def scroll(self, lines: int) -> None:
        self.pending += lines

    def page(self, pages: int) -> None:
        self.pending += pages * max(1, self.room - 1)

    def home(self) -> None:
        self.top, self.pending = (0, 0), 0

    def end(self) -> None:
        self.top, self.pending = None, 0

    @property
    def following(self) -> bool:
        return self.top is None and self.pending >= 0


class _Transcript:
    """The focused session's blocks rendered lazily, only as far as a page needs."""

    def __init__(self, console: Console, options: ConsoleOptions, view: SessionView, now: float):
        self._console, self._options, self._view, self._now = console, options, view, now
        self.count = len(view.main.blocks)
        self._lines: dict[int, Lines] = {}

    def lines(self, index: int) -> Lines:
        lines = self._lines.get(index)
        if lines is None:
            block = render_block(self._view, self._view.main.blocks[index], self._now)
            lines = self._lines[index] = self._console.render_lines(block, self._options, pad=False)
        return lines

    def newest(self, room: int) -> tuple[tuple[int, int], Lines]:
        """The last ``room`` lines, and where they start."""
        body: Lines = []
        index = self.count
        while index > 0 and len(body) < room:
            index -= 1
            body[:0] = self.lines(index)
        skip = max(0, len(body) - room)
        return (index, skip), body[skip:]

    def move(self, top: tuple[int, int], lines: int) -> tuple[int, int]:
        index, line = min(top[0], self.count), top[1] + lines
        while line < 0 and index > 0:
            index -= 1
            line += len(self.lines(index))
        line = max(0, line)
        while index < self.count and line >= len(self.lines(index)):
            line -= len(self.lines(index))
            index += 1
        return index, line

    def page(self, top: tuple[int, int], room: int) -> Lines | None:
        """``room`` lines from ``top``; None when fewer are left (the newest page shows)."""
        index, skip = top
        body: Lines = []
        while index < self.count and len(body) <= room + skip:
            body += self.lines(index)
            index += 1
        body = body[skip:]
        if len(body) <= room and index >= self.count:
            return None
        return body[:room]


def _rule(width: int, label: str | None = None) -> Text:
    if not label:
        return Text("─" * width, style="dim")
    text = Text("── ", style="dim")
    text.append(label, style="bold")
    text.append(" " + "─" * max(0, width - cell_len(label) - 4), style="dim")
    text.truncate(width)
    return text


@dataclass
class Screen:
    """The live screen, laid out to the console's size.

    From the top: the title, a header (``busd demo`` says there how to attach
    more frontends), the session list, the focused session's transcript
    (its newest lines, or where the viewport is scrolled to), what is pinned
    under it (permission prompt, status and context lines), a rule that says
    where the transcript is scrolled to, the message line and the key help.
    """

    views: Views
    sessions: Sequence[str]
    """The ids shown, in order (the filter applied)."""
    focus: str | None
    now: float
    message: str | None = None
    keys: bool = True
    """Whether the permission prompt offers its keys (stdin is a terminal)."""
    title: str = "busd watch"
    help: list[tuple[str, str]] = field(default_factory=list)
    """The footer's (key, what it does) pairs; none: no footer line."""
    header: str | None = None
    viewport: Viewport = field(default_factory=Viewport)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        height = max(8, (options.height or options.size.height) - 1)
        opts = options.update(width=width, height=None)

        def lines(*renderables: RenderableType) -> Lines:
            return [ln for r in renderables for ln in console.render_lines(r, opts, pad=False)]

        head = lines(*self._top(width, height))
        focused = self.views.sessions.get(self.focus) if self.focus is not None else None
        under = lines(*pinned(focused, self.now, keys=self.keys)) if focused else []
        bottom: list[RenderableType] = []
        if self.message:
            bottom.append(Text(self.message, style="bold", no_wrap=True, overflow="ellipsis"))
        bottom += _help_lines(self.help, width)
        foot = lines(*bottom)
        over = len(head) + len(under) + len(foot) + 2 - height
        if over > 0:  # a very short terminal: the footer and the keys must stay
            under = under[over:]
        room = max(1, height - len(head) - len(under) - len(foot) - 1)
        body, where = self._body(console, opts, focused, room)
        blank: Lines = [[] for _ in range(room - len(body))]
        for line in (*head, *body, *under, *blank, *lines(_rule(width, where)), *foot):
            yield from line
            yield Segment.line()

    def _top(self, width: int, height: int) -> list[RenderableType]:
        top: list[RenderableType] = [self._title()]
        if self.header:
            top.append(Text(self.header, style="dim"))
        ids = [s for s in self.sessions if s in self.views.sessions]
        index = ids.index(self.focus) if self.focus in ids else 0
        shown = _window(len(ids), index, max(2, min(MAX_LISTED, (height - 12) // 2)))
        views = [self.views.sessions[ids[i]] for i in shown]
        top += session_rows(views, self.now, self.focus, width)
        if len(ids) > len(shown):
            top.append(Text(f"  … {len(ids) - len(shown)} more (Tab to switch)", style="dim"))
        if not ids:
            top.append(Text("  no sessions yet: waiting for events", style="dim"))
        top.append(_rule(width))
        return top

    def _body(
        self, console: Console, opts: ConsoleOptions, view: SessionView | None, room: int
    ) -> tuple[Lines, str | None]:
        """The transcript's lines for this page, and what the rule under it says."""
        viewport = self.viewport
        viewport.room = room
        if view is None:
            viewport.end()
            return [], None
        transcript = _Transcript(console, opts, view, self.now)
        top, pending = viewport.top, viewport.pending
        viewport.pending = 0
        if top is None and pending < 0:
            top = transcript.newest(room)[0]
        if top is not None:
            top = transcript.move(top, pending)
            body = transcript.page(top, room)
            if body is not None:
                viewport.top = top
                percent = math.floor(100 * top[0] / max(1, transcript.count))
                where = "top" if top == (0, 0) else f"{percent}%"
                return body, f"scrolled back ({where}) · End: the newest"
        viewport.top = None
        start, body = transcript.newest(room)
        return body, "↑ earlier lines: PgUp" if start != (0, 0) else None

    def _title(self) -> Text:
        line = Text(self.title, style="bold")
        count = len([s for s in self.sessions if s in self.views.sessions])
        line.append(f" · {count} session{'s' if count != 1 else ''}", style="dim")
        line.no_wrap = True
        return line


def _help_lines(items: list[tuple[str, str]], width: int) -> list[Text]:
    """The key help, packed into as many lines as the width needs (never cut mid-key)."""
    lines: list[Text] = []
    line = Text(no_wrap=True, overflow="ellipsis")
    for key, label in items:
        size = cell_len(f" {key}  {label}")
        if line and line.cell_len + size > width:
            lines.append(line)
            line = Text(no_wrap=True, overflow="ellipsis")
        line.append(f" {key} ", style="reverse")
        line.append(f" {label}  ", style="dim")
    if line:
        lines.append(line)
    for text in lines:
        text.rstrip()
    return lines
