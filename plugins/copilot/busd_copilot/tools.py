"""What a running Copilot tool shows, and how it ends, as the catalog tells it.

Three events tell a running tool's output: snapshots of it so far
(``tool.execution_partial_result``), the shell's append-only chunks
(``tool.shell_output``) and status lines (``tool.execution_progress``).
:func:`tool_output` keeps one source per tool, so the same output is not
shown twice, and lets no status line replace real output.

``tool.execution_complete`` says on its own whether the call succeeded,
what it returned and why it failed; the translator adds what only it knows:
the call it started (its name, and when it began running) and whether the
session was aborted, which makes any failure a cancellation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

from busd import ToolComplete

from .payloads import Stamp, elapsed, field, field_map, field_str
from .state import Tool
from .vocabulary import CANCEL_CODES

PROGRESS_KEYS: Final[Mapping[str, str]] = {
    "tool.execution_partial_result": "partialOutput",
    "tool.shell_output": "text",
    "tool.execution_progress": "progressMessage",
}
"""The field holding the text of each kind of progress event."""


def tool_output(kind: str, tool: Tool, text: str) -> str | None:
    """The output so far that a progress event of ``kind`` shows (and ``tool`` now holds),
    or ``None`` when another of its sources tells it already."""
    match kind:
        case "tool.execution_partial_result":
            if tool.source == "shell":
                return None  # the append-only stream tells the same output
            tool.source = "partial"
            tool.output = text
        case "tool.shell_output":
            if tool.source == "partial":
                return None  # the snapshots tell the same output
            tool.source = "shell"
            tool.output += text
        case _:
            return None if tool.source else text  # a status line never replaces output
    return tool.output


def tool_complete(
    tool_call_id: str,
    data: Mapping[str, Any],
    tool: Tool | None,
    stamp: Stamp,
    *,
    aborted: bool,
) -> ToolComplete:
    """The end of ``tool`` (``None`` when it was never seen starting), told at ``stamp``."""
    error = field_map(data, "error")
    flag = field(data, "success")
    success = flag if isinstance(flag, bool) else error is None
    result = field_map(data, "result")
    output = field_str(result, "content") or field_str(result, "detailedContent")
    status: Literal["ok", "error", "cancelled"] = "ok"
    message = None
    if not success:
        message = field_str(error, "message")
        code = field_str(error, "code")
        cancelled = aborted or (code is not None and code.lower() in CANCEL_CODES)
        status = "cancelled" if cancelled else "error"
    duration = None
    if tool is not None and tool.started is not None:
        duration = elapsed(tool.started, stamp)
    return ToolComplete(
        tool_call_id=tool_call_id,
        name=None if tool is None else tool.name,
        status=status,
        output=output,
        error=message,
        duration_s=duration,
    )
