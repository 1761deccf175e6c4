"""Short human forms of token counts and durations, and the status lines built from them.

Everything here floors: a live counter must never show a token or a second
that has not happened yet, and flooring can never carry a figure into an
impossible form such as ``1000.0k`` or ``60s``. Widths stay stable while a
number ticks (``6m 05s``, ``1h 02m``), so a status line does not jitter.

::

    ✶ Thinking… (6m 22s · ↓ 16.7k tokens · thought for 54s)
    ✻ Worked for 18s · ↓ 1.4k tokens · thought for 5s
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

from ..core.events import StreamingStats

__all__ = [
    "clip",
    "format_duration",
    "format_tokens",
    "format_took",
    "format_who",
    "input_summary",
    "status_line",
    "summary_line",
    "tool_head",
]

_IDENTITY = re.compile(r"(?P<name>.+)\[pid=(?P<pid>\d+|\?),uid=(?P<uid>\d+|\?)\]")

_UNITS = (("B", 1_000_000_000), ("M", 1_000_000), ("k", 1_000))


def format_who(by: str) -> str:
    """A decider for people: ``watch (pid 4242)`` for ``watch[pid=4242,uid=1000]``.

    The daemon labels clients ``name[pid=…,uid=…]`` (docs/protocol.md); the
    uid is shown only when it is not ours. ``rule:0``, ``policy``, ``busd``
    and the like are the daemon's own and stay as they are.
    """
    match = _IDENTITY.fullmatch(by)
    if match is None:
        return by
    name, pid, uid = match["name"], match["pid"], match["uid"]
    if uid in ("?", str(os.getuid())):
        return name if pid == "?" else f"{name} (pid {pid})"
    return f"{name} (pid {pid}, uid {uid})"


def format_tokens(n: int) -> str:
    """``999``, ``1.0k``, ``16.7k``, ``999.9k``, ``1.0M``, ``2.5B``; negatives are ``0``.

    Below 1000 the exact count; above, one decimal, floored (1,999 is ``1.9k``).
    """
    if n < 1000:
        return str(n) if n > 0 else "0"
    unit, scale = next(pair for pair in _UNITS if n >= pair[1])
    tenths = n * 10 // scale
    return f"{tenths // 10}.{tenths % 10}{unit}"


def _whole_seconds(seconds: float) -> int:
    return math.floor(seconds) if seconds > 0 and math.isfinite(seconds) else 0


def format_duration(seconds: float) -> str:
    """``0s``, ``54s``, ``6m 05s``, ``1h 02m``: floored, zero-padded after the first unit.

    Seconds are dropped from an hour on. Negative, NaN or infinite is ``0s``.
    """
    total = _whole_seconds(seconds)
    if total < 60:
        return f"{total}s"
    minutes, secs = divmod(total, 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


def format_took(seconds: float) -> str:
    """How long something that is over took: ``<1s`` under a second, else :func:`format_duration`.

    ``Thought for 0s`` would read as no thinking at all; a running timer
    still counts up from ``0s``.
    """
    return "<1s" if _whole_seconds(seconds) == 0 else format_duration(seconds)


def _details(stats: StreamingStats) -> list[str]:
    """The token and thinking parts; each is left out while it would read zero."""
    parts = []
    n = stats.output_tokens
    if n > 0:
        approx = "~" if stats.output_estimated else ""
        noun = "token" if n == 1 else "tokens"
        parts.append(f"↓ {approx}{format_tokens(n)} {noun}")
    if _whole_seconds(stats.thinking_s) > 0:
        parts.append(f"thought for {format_duration(stats.thinking_s)}")
    return parts


def status_line(stats: StreamingStats, *, verb: str = "Thinking…", glyph: str = "✶") -> str:
    """The live line: ``✶ Thinking… (6m 22s · ↓ 16.7k tokens · thought for 54s)``.

    The verb is always the caller's (whether the agent is thinking right now,
    ``stats.thinking``, is the caller's to word); an estimated count reads
    ``~1.2k``; the thinking part appears once a whole second has been spent
    thinking.
    """
    head = f"{glyph} {verb}" if glyph else verb
    return f"{head} ({' · '.join([format_duration(stats.elapsed_s), *_details(stats)])})"


def summary_line(stats: StreamingStats, *, glyph: str = "✻") -> str:
    """The line left behind when a run is done: ``✻ Worked for 18s · ↓ 1.4k tokens``."""
    head = f"{glyph} Worked for" if glyph else "Worked for"
    return " · ".join([f"{head} {format_duration(stats.elapsed_s)}", *_details(stats)])


# -- tools, as every frontend names them ------------------------------------------

_PRIMARY_INPUT = (
    "command",
    "file_path",
    "filePath",
    "path",
    "pattern",
    "url",
    "query",
    "description",
    "prompt",
)


def clip(text: str, limit: int, *, more: bool = True) -> str:
    """The first line of ``text`` within ``limit``; `` …`` says (with ``more``) lines were cut."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    if len(line) > limit:
        return line[: limit - 1] + "…"
    return line + (" …" if more and line != text.strip() else "")


def input_summary(data: dict[str, Any], limit: int = 80) -> str:
    """The one thing worth reading in a tool's input (its command, path, pattern...)."""
    for key in _PRIMARY_INPUT:
        value = data.get(key)
        if isinstance(value, str) and value.strip():
            return clip(value, limit)
    parts = []
    for key, value in data.items():
        shown = value if isinstance(value, str) else repr(value)
        parts.append(f"{key}={clip(shown, 40)}")
    return clip(", ".join(parts), limit)


def tool_head(name: str, data: dict[str, Any], limit: int = 80) -> str:
    """``Write(path)``: the tool and the one thing worth reading in its input.

    An input that only repeats the name (ACP names a tool after its command)
    is left out.
    """
    summary = input_summary(data, limit)
    return f"{name}({summary})" if summary and summary != name else name
