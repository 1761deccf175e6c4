"""The ``claude-code`` driver: runs a prompt with the Claude Agent SDK.

It drives the ``claude`` CLI through the SDK's own :class:`ClaudeSDKClient`
(``pip install 'busd-claude-code[driver]'``; imported lazily, so the adapter
works without it) and feeds every message to the paired ``claude-code``
adapter.

Decisions a user should know:

- **No bridge.** The SDK is anyio-based and supports Trio itself (its
  background reader and control-request handlers are Trio system tasks), so
  the driver awaits it directly in the run's task.
- **Model.** ``claude-sonnet-4-5`` when the request names none
  (:data:`DEFAULT_MODEL`).
- **System prompt.** Without one, Claude Code's own (the ``claude_code``
  preset), as the ``claude`` command behaves; a given one replaces it. To
  append instead, pass ``options={"system_prompt": {"type": "preset",
  "preset": "claude_code", "append": "..."}}``.
- **Options.** ``request.options`` are :class:`ClaudeAgentOptions` fields
  (``cli_path``, ``env``, ``allowed_tools``, ``max_budget_usd``...); the
  request's own fields (model, system prompt, cwd, permission mode, max
  turns, resume) override them when set. Partial messages are on unless
  ``include_partial_messages`` says otherwise. ``can_use_tool`` is the
  driver's own and cannot be passed.
- **Environment.** The run's (``request.env``, its starter's) goes to the
  CLI as ``options["env"]`` (whose own keys win). The SDK adds it over the
  daemon's environment and cannot remove any, so a variable the starter
  lacks may still come from the daemon's.
- **What is fed.** ``system`` lines are fed as the CLI wrote them
  (``SystemMessage.data``); the others are rebuilt in the ``stream-json``
  shape from the SDK's dataclasses (:func:`stream_json`), since the SDK
  keeps no raw copy of them: a ``stream_event`` carries the API event as
  the CLI sent it (``StreamEvent.event``) and the envelope fields the SDK
  keeps; fields the SDK drops (``ttft_ms``, ``timestamp``) are not fed.
  The CLI's ``control_request`` lines never reach the caller of the SDK:
  permission requests come through ``can_use_tool``.
- **Permissions.** Each ``can_use_tool`` call becomes a
  ``PermissionRequested`` (request id = the tool call id) answered by
  :meth:`RunContext.request_permission`. It is asked only once the fed
  stream has announced the tool call, so it never overtakes its
  ``stream.tool.start`` (the SDK answers control requests from another
  task than the one that reads the stream; a safety net of one second
  asks anyway). ``allow_always`` applies Claude Code's permission
  suggestions; a cancelled request denies and interrupts the turn.
- **End of the run.** The prompt goes in as a one-message stream, so the
  SDK closes stdin once the turn's ``result`` is in and the run ends when
  the CLI exits. An error result, or a CLI that fails or exits without a
  result, raises :class:`ClaudeCodeError` (with the tail of its stderr).
- **Cancellation.** The SDK's ``interrupt()`` is sent (shielded, at most
  ``interrupt_timeout`` seconds, which also covers reading the interrupted
  turn's ``result``), then the client disconnects, which ends the CLI
  (stdin closed; terminated, then killed, if it lingers).
"""

from __future__ import annotations

import logging
import uuid
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from contextlib import aclosing, suppress
from typing import TYPE_CHECKING, Any, Final, cast

import trio

from busd import BusdError, PermissionDecision, PermissionRequested, RunContext, RunRequest

from .permissions import ALLOW_ALWAYS, category, permission_options

if TYPE_CHECKING:
    from collections.abc import Callable

    from claude_agent_sdk import (
        CanUseTool,
        ClaudeAgentOptions,
        ClaudeSDKClient,
        PermissionResultAllow,
        PermissionResultDeny,
        ResultMessage,
        ToolPermissionContext,
    )

__all__ = [
    "DEFAULT_MODEL",
    "ClaudeCodeDriver",
    "ClaudeCodeError",
    "InvalidDriverOptions",
    "agent_options",
    "stream_json",
]

logger = logging.getLogger("busd_claude_code.driver")

DEFAULT_MODEL: Final = "claude-sonnet-4-5"
"""The model a run uses when the request names none."""

_OWN_OPTIONS: Final = frozenset({"can_use_tool", "permission_prompt_tool_name"})
_FENCE_TIMEOUT: Final = 1.0
"""How long a permission request waits for its tool call's start (a safety net)."""
_STDERR_LINES: Final = 20


class ClaudeCodeError(BusdError, RuntimeError):
    """Claude Code failed: the CLI exited with an error, or reported one in its result."""


class InvalidDriverOptions(BusdError, ValueError):
    """``options`` that are not :class:`ClaudeAgentOptions` fields, or are the driver's own."""


class ClaudeCodeDriver:
    """Runs prompts with the Claude Agent SDK; pairs with the ``claude-code`` adapter."""

    name = "claude-code"
    default_model = DEFAULT_MODEL

    def __init__(self, *, interrupt_timeout: float = 2.0) -> None:
        self.interrupt_timeout = interrupt_timeout

    async def run(self, context: RunContext) -> None:
        try:
            from claude_agent_sdk import ClaudeSDKClient, ClaudeSDKError
        except ImportError as exc:
            raise ClaudeCodeError(
                "the claude-code driver needs the Claude Agent SDK: "
                "pip install 'busd-claude-code[driver]'"
            ) from exc
        run = _Run(context)
        client = ClaudeSDKClient(
            agent_options(
                context.request,
                default_model=self.default_model,
                can_use_tool=run.can_use_tool,
                stderr=run.stderr,
            )
        )
        connected = False
        try:
            await client.connect(_prompt(context.request.prompt))
            connected = True
            await run.consume(client)
        except trio.Cancelled:
            if connected:
                await self._interrupt(client, run)
            raise
        except ClaudeSDKError as exc:
            raise ClaudeCodeError(run.explain(str(exc))) from exc
        finally:
            run.close()
            with trio.CancelScope(shield=True):
                await client.disconnect()  # bounded by the SDK itself
        run.check()

    async def _interrupt(self, client: ClaudeSDKClient, run: _Run) -> None:
        """Stop the agent, and read what it says about it, within the time allowed."""
        with trio.move_on_after(self.interrupt_timeout, shield=True), suppress(Exception):
            await client.interrupt()
            await run.consume(client)


async def _prompt(text: str) -> AsyncIterator[dict[str, Any]]:
    """The prompt as a one-message stream: the SDK then ends input after the result."""
    yield {
        "type": "user",
        "message": {"role": "user", "content": text},
        "parent_tool_use_id": None,
        "session_id": "",
    }


class _Run:
    """One run's state: what was fed, the SDK session, the CLI's last words."""

    def __init__(self, context: RunContext) -> None:
        self.context = context
        self.session: str | None = None
        self.result: ResultMessage | None = None
        self.stderr_tail: deque[str] = deque(maxlen=_STDERR_LINES)
        self._announced = _Announced()
        self._waiting: dict[str, trio.Event] = {}
        self._closed = False

    # -- the stream -------------------------------------------------------------------

    async def consume(self, client: ClaudeSDKClient) -> None:
        # An async generator (typed as an iterator): closed here, never left to the GC.
        messages = cast("AsyncGenerator[object, None]", client.receive_messages())
        async with aclosing(messages):
            async for message in messages:
                self.feed(message)

    def feed(self, message: object) -> None:
        from claude_agent_sdk import ResultMessage, SystemMessage

        line = stream_json(message)
        self.context.feed(line)
        if isinstance(message, ResultMessage):
            self.result = message
            self._session(message.session_id)
        elif isinstance(message, SystemMessage) and message.subtype == "init":
            sid = message.data.get("session_id")
            if isinstance(sid, str):
                self._session(sid)
        for call in self._announced.see(line):
            event = self._waiting.pop(call, None)
            if event is not None:
                event.set()

    def _session(self, sid: str) -> None:
        if sid and sid != self.session:
            self.session = sid
            self.context.set_sdk_session(sid)

    def stderr(self, line: str) -> None:
        self.stderr_tail.append(line)
        logger.debug("claude: %s", line)

    def explain(self, message: str) -> str:
        if not self.stderr_tail:
            return message
        return f"{message}\nstderr:\n" + "\n".join(self.stderr_tail)

    def check(self) -> None:
        """Raise if the run did not end with a successful result."""
        result = self.result
        if result is None:
            raise ClaudeCodeError(self.explain("Claude Code exited without a result"))
        if result.is_error:
            what = "; ".join(result.errors or ()) or result.result or result.subtype
            raise ClaudeCodeError(self.explain(f"Claude Code reported an error: {what}"))

    def close(self) -> None:
        self._closed = True
        for event in self._waiting.values():
            event.set()
        self._waiting.clear()

    # -- permissions ------------------------------------------------------------------

    async def can_use_tool(
        self, tool_name: str, tool_input: dict[str, Any], ctx: ToolPermissionContext
    ) -> PermissionResultAllow | PermissionResultDeny:
        call = ctx.tool_use_id
        suggestions = _suggestions(ctx)
        annotations: dict[str, Any] = {
            "display_name": ctx.display_name,
            "permission_suggestions": suggestions or None,
            "blocked_path": ctx.blocked_path,
            "decision_reason": ctx.decision_reason,
            "agent_id": ctx.agent_id,
        }
        request = PermissionRequested(
            request_id=call or f"claude-code-{uuid.uuid4().hex}",
            tool=tool_name,
            input=dict(tool_input),
            tool_call_id=call,
            title=ctx.title or ctx.description,
            category=category(tool_name),
            annotations={k: v for k, v in annotations.items() if v is not None},
            options=permission_options(suggestions),
        )
        if call is not None:
            await self._fed(call)
        return _answer(await self.context.request_permission(request), ctx)

    async def _fed(self, call: str) -> None:
        """Wait until the tool call was announced, so its request comes after its start."""
        if self._closed or call in self._announced:
            return
        event = self._waiting.setdefault(call, trio.Event())
        with trio.move_on_after(_FENCE_TIMEOUT):
            await event.wait()
        self._waiting.pop(call, None)


def _answer(
    decision: PermissionDecision, ctx: ToolPermissionContext
) -> PermissionResultAllow | PermissionResultDeny:
    """The SDK's answer for ``decision``: always-allow applies Claude Code's suggestions."""
    from claude_agent_sdk import PermissionResultAllow, PermissionResultDeny

    if decision.outcome == "allowed":
        if decision.option_id == ALLOW_ALWAYS and ctx.suggestions:
            return PermissionResultAllow(updated_permissions=list(ctx.suggestions))
        return PermissionResultAllow()
    if decision.outcome == "denied":
        by = decision.by or "the user"
        return PermissionResultDeny(message=decision.reason or f"Denied by {by}")
    return PermissionResultDeny(
        message=decision.reason or "The permission request was cancelled", interrupt=True
    )


def _suggestions(ctx: ToolPermissionContext) -> list[dict[str, Any]]:
    out = []
    for suggestion in ctx.suggestions:
        with suppress(ValueError):  # a kind this SDK cannot send back
            out.append(suggestion.to_dict())
    return out


class _Announced:
    """Which tool calls the adapter has announced (``stream.tool.start``) so far.

    A streamed call is announced at its ``content_block_stop`` (its input is
    complete then); a call in an ``assistant`` snapshot of a message that was
    not streamed, at that snapshot.
    """

    __slots__ = ("_calls", "_open", "_streamed")

    def __init__(self) -> None:
        self._calls: set[str] = set()
        self._open: dict[tuple[object, object, object], str] = {}  # (session, parent, index)
        self._streamed: set[str] = set()

    def __contains__(self, call: str) -> bool:
        return call in self._calls

    def see(self, line: object) -> list[str]:
        """The calls ``line`` announces (and remember them)."""
        if not isinstance(line, Mapping):
            return []
        kind = line.get("type")
        found: list[str] = []
        if kind == "stream_event":
            event = line.get("event")
            if not isinstance(event, Mapping):
                return []
            lane = (line.get("session_id"), line.get("parent_tool_use_id"), event.get("index"))
            what = event.get("type")
            if what == "message_start":
                message = event.get("message")
                if isinstance(message, Mapping) and isinstance(message.get("id"), str):
                    self._streamed.add(message["id"])
            elif what == "content_block_start":
                block = event.get("content_block")
                if (
                    isinstance(block, Mapping)
                    and block.get("type") == "tool_use"
                    and isinstance(block.get("id"), str)
                ):
                    self._open[lane] = block["id"]
            elif what == "content_block_stop" and lane in self._open:
                found.append(self._open.pop(lane))
        elif kind == "assistant":
            message = line.get("message")
            if not isinstance(message, Mapping) or message.get("id") in self._streamed:
                return []
            content = message.get("content")
            if isinstance(content, list):
                found = [
                    block["id"]
                    for block in content
                    if isinstance(block, Mapping)
                    and block.get("type") == "tool_use"
                    and isinstance(block.get("id"), str)
                ]
        self._calls.update(found)
        return found


# -- options ------------------------------------------------------------------------------


def agent_options(
    request: RunRequest,
    *,
    default_model: str = DEFAULT_MODEL,
    can_use_tool: CanUseTool | None = None,
    stderr: Callable[[str], None] | None = None,
) -> ClaudeAgentOptions:
    """The SDK's options for ``request``: its fields over ``request.options``."""
    from claude_agent_sdk import ClaudeAgentOptions

    fields = dict(request.options)
    own = _OWN_OPTIONS & fields.keys()
    if own:
        raise InvalidDriverOptions(f"the claude-code driver sets {', '.join(sorted(own))} itself")
    explicit = {
        "model": request.model,
        "system_prompt": request.system_prompt,
        "cwd": request.cwd,
        "permission_mode": request.permission_mode,
        "max_turns": request.max_turns,
        "resume": request.resume,
    }
    fields.update((key, value) for key, value in explicit.items() if value is not None)
    if request.env is not None:
        # The SDK adds these over the daemon's os.environ; it cannot remove any.
        fields["env"] = {**request.env, **(fields.get("env") or {})}
    fields.setdefault("model", default_model)
    fields.setdefault("system_prompt", {"type": "preset", "preset": "claude_code"})
    fields.setdefault("include_partial_messages", True)
    if stderr is not None:
        fields.setdefault("stderr", stderr)
    if can_use_tool is not None:
        fields["can_use_tool"] = can_use_tool
    try:
        return ClaudeAgentOptions(**fields)
    except TypeError as exc:
        raise InvalidDriverOptions(f"invalid claude-code driver options: {exc}") from exc


# -- the SDK's messages as stream-json lines ---------------------------------------------


def stream_json(message: object) -> object:
    """One SDK message as the ``stream-json`` line the CLI wrote (what the adapter reads).

    ``system`` lines are the CLI's own dicts; the others are rebuilt from the
    SDK's dataclasses, with the fields the SDK keeps.
    Anything else is returned as it is (the adapter dumps and counts it).
    """
    from claude_agent_sdk import (
        AssistantMessage,
        ConversationResetMessage,
        RateLimitEvent,
        ResultMessage,
        StreamEvent,
        SystemMessage,
        UserMessage,
    )

    if isinstance(message, StreamEvent):
        return _present(
            {
                "type": "stream_event",
                "event": message.event,
                "session_id": message.session_id,
                "parent_tool_use_id": message.parent_tool_use_id,
                "uuid": message.uuid,
            },
            keep=("parent_tool_use_id",),
        )
    if isinstance(message, AssistantMessage):
        body = _present(
            {
                "id": message.message_id,
                "type": "message",
                "role": "assistant",
                "model": message.model,
                "content": [_block(block) for block in message.content],
                "stop_reason": message.stop_reason,
                "usage": message.usage,
            }
        )
        return _present(
            {
                "type": "assistant",
                "message": body,
                "parent_tool_use_id": message.parent_tool_use_id,
                "session_id": message.session_id,
                "uuid": message.uuid,
                "error": message.error,
            },
            keep=("parent_tool_use_id",),
        )
    if isinstance(message, UserMessage):
        content: object = message.content
        if isinstance(content, list):
            content = [_block(block) for block in content]
        return _present(
            {
                "type": "user",
                "message": {"role": "user", "content": content},
                "parent_tool_use_id": message.parent_tool_use_id,
                "uuid": message.uuid,
                "tool_use_result": message.tool_use_result,
                "origin": message.origin,
            },
            keep=("parent_tool_use_id",),
        )
    if isinstance(message, SystemMessage):
        return message.data
    if isinstance(message, ResultMessage):
        deferred = message.deferred_tool_use
        return _present(
            {
                "type": "result",
                "subtype": message.subtype,
                "is_error": message.is_error,
                "duration_ms": message.duration_ms,
                "duration_api_ms": message.duration_api_ms,
                "num_turns": message.num_turns,
                "result": message.result,
                "stop_reason": message.stop_reason,
                "session_id": message.session_id,
                "total_cost_usd": message.total_cost_usd,
                "usage": message.usage,
                "modelUsage": message.model_usage,
                "permission_denials": message.permission_denials,
                "errors": message.errors,
                "api_error_status": message.api_error_status,
                "terminal_reason": message.terminal_reason,
                "structured_output": message.structured_output,
                "deferred_tool_use": None
                if deferred is None
                else {"id": deferred.id, "name": deferred.name, "input": deferred.input},
                "origin": message.origin,
                "uuid": message.uuid,
            }
        )
    if isinstance(message, RateLimitEvent):
        return {
            "type": "rate_limit_event",
            "rate_limit_info": message.rate_limit_info.raw,
            "uuid": message.uuid,
            "session_id": message.session_id,
        }
    if isinstance(message, ConversationResetMessage):
        return {
            "type": "conversation_reset",
            "new_conversation_id": message.new_conversation_id,
            "uuid": message.uuid,
            "session_id": message.session_id,
        }
    return message


def _block(block: object) -> object:
    from claude_agent_sdk import (
        ServerToolResultBlock,
        ServerToolUseBlock,
        TextBlock,
        ThinkingBlock,
        ToolResultBlock,
        ToolUseBlock,
    )

    if isinstance(block, TextBlock):
        return {"type": "text", "text": block.text}
    if isinstance(block, ThinkingBlock):
        return {"type": "thinking", "thinking": block.thinking, "signature": block.signature}
    if isinstance(block, ToolUseBlock):
        return {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}
    if isinstance(block, ToolResultBlock):
        return _present(
            {
                "type": "tool_result",
                "tool_use_id": block.tool_use_id,
                "content": block.content,
                "is_error": block.is_error,
            }
        )
    if isinstance(block, ServerToolUseBlock):
        return {"type": "server_tool_use", "id": block.id, "name": block.name, "input": block.input}
    if isinstance(block, ServerToolResultBlock):
        return {
            "type": "advisor_tool_result",
            "tool_use_id": block.tool_use_id,
            "content": block.content,
        }
    return block


def _present(fields: dict[str, Any], keep: tuple[str, ...] = ()) -> dict[str, Any]:
    """``fields`` without the ``None`` values the SDK filled in for absent keys."""
    return {k: v for k, v in fields.items() if v is not None or k in keep}
