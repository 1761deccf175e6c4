"""The ``anthropic`` driver: one Messages API call, streamed, with the ``anthropic`` SDK.

The SDK's async client (``anthropic.AsyncAnthropic``) runs on httpx (httpx2
in anthropic 2.x), whose transport detects the running library, so it runs
under Trio directly: no thread, no second event loop. Every raw stream event the SDK yields
(``RawMessageStreamEvent`` objects) goes to :meth:`RunContext.feed` as it
is; the ``anthropic`` adapter translates them.

What a :class:`~busd.RunRequest` means here:

- ``model``: defaults to :data:`DEFAULT_MODEL` (``claude-sonnet-4-6``; the SDK
  warns that ``claude-sonnet-4-5`` is deprecated).
- ``system_prompt``: the request's ``system`` (it wins over ``options["system"]``).
- ``max_turns``: a run is always one model call. The Messages API has no
  tool loop: a ``tool_use`` block ends the call (``stop_reason`` is
  ``tool_use``) and running the tool is the caller's business. For the same
  reason the driver never asks for permission, and ``cwd`` and
  ``permission_mode`` mean nothing to it.
- ``resume``: the API keeps no session, so there is nothing to resume; earlier
  turns go in ``options["messages"]``, and the prompt is appended to them as
  the last user message.
- ``options``: ``api_key``, ``auth_token``, ``base_url``, ``max_retries`` and
  ``default_headers`` configure the client (without them
  ``ANTHROPIC_API_KEY`` or ``ANTHROPIC_AUTH_TOKEN``, and then
  ``ANTHROPIC_BASE_URL``, come from the run's environment, ``request.env``,
  its starter's; else the SDK reads the daemon's, and its profiles);
  ``count_tokens: true`` counts the request's input with
  ``/v1/messages/count_tokens`` before the call and publishes the count as
  ``stream.session.context``, so the context figure shown while the call runs
  is the API's own, not an estimate (a failed count is logged and skipped);
  every other key goes to ``messages.create`` as it is (``max_tokens``,
  default :data:`DEFAULT_MAX_TOKENS`; ``thinking``, ``tools``,
  ``temperature``, ...).

Before the call the driver publishes ``stream.session.context_parts``: the
request's ``system`` and ``tools`` as token estimates (and the tools'
names), which only the driver sees. They make the ``system`` and ``tools``
parts of the session's context breakdown.

Errors are the SDK's own exceptions, except two that say what to do
(:class:`AnthropicRunError`): the SDK is not installed (:data:`NO_SDK`), or
no credentials were found (:data:`NO_KEY`; the SDK raises a ``TypeError``).
An ``error`` event in the stream, which the SDK raises as
``APIStatusError``, is fed first (so the run's events say
why it ended); a stream that ends without ``message_stop`` raises
:class:`StreamIncomplete`. Cancellation closes the HTTP response and the
client (the API's only abort), shielded and bounded.

Known wart: the SDK raises an ``error`` event from inside its stream
generator and leaves the generators under it suspended. The response is
closed all the same; Trio finalizes them when they are collected, with a
``ResourceWarning`` (hidden by default) that asyncio would not give.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import trio

from busd import (
    BusdError,
    RunContext,
    RunRequest,
    SessionContext,
    SessionContextParts,
    estimate_json_tokens,
    estimate_tokens,
)

__all__ = [
    "API_URL",
    "CLIENT_OPTIONS",
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_MODEL",
    "NO_KEY",
    "NO_SDK",
    "AnthropicDriver",
    "AnthropicRunError",
    "StreamIncomplete",
    "call_arguments",
    "context_parts",
]

DEFAULT_MODEL: Final = "claude-sonnet-4-6"
API_URL: Final = "https://api.anthropic.com"
"""The SDK's own default, used when the run's environment names no other."""
DEFAULT_MAX_TOKENS: Final = 4096
"""``max_tokens`` is required by the API; this is sent when ``options`` has none."""

CLIENT_OPTIONS: Final = frozenset(
    {"api_key", "auth_token", "base_url", "max_retries", "default_headers"}
)
"""``options`` keys that configure ``AsyncAnthropic`` rather than the call."""

NO_SDK: Final = "the anthropic driver needs the Anthropic SDK: pip install 'busd-anthropic[driver]'"
NO_KEY: Final = (
    "no Anthropic credentials: set ANTHROPIC_API_KEY (or ANTHROPIC_AUTH_TOKEN), "
    "or pass --option api_key=KEY"
)

_CLOSE_TIMEOUT: Final = 2.0

logger = logging.getLogger("busd.anthropic")


class AnthropicRunError(BusdError, RuntimeError):
    """The driver cannot start: its SDK is missing, or no credentials are set."""


class StreamIncomplete(BusdError, RuntimeError):
    """The response ended before ``message_stop``: the call was cut short."""


class AnthropicDriver:
    """Runs a prompt as one streamed Messages API call (see the module docstring)."""

    name = "anthropic"
    default_model = DEFAULT_MODEL

    async def run(self, context: RunContext) -> None:
        try:
            from anthropic import APIStatusError, AsyncAnthropic
        except ImportError as exc:
            raise AnthropicRunError(NO_SDK) from exc

        client_options, params = call_arguments(context.request)
        count = bool(params.pop("count_tokens", False))
        parts = context_parts(params)
        client = AsyncAnthropic(**client_options)
        try:
            if count:
                await _count_tokens(client, params, context)
            if parts is not None:  # within the API's count, if there is one
                context.publish(parts)
            stream = await client.messages.create(**params, stream=True)
            stopped = False
            try:
                # ``feed`` is synchronous, so a cancellation lands in the SDK's
                # own awaits and unwinds all of its generators.
                async for event in stream:
                    context.feed(event)
                    stopped = event.type == "message_stop"
            except APIStatusError as exc:
                if _is_error_event(exc.body):
                    context.feed(exc.body)
                raise
            finally:
                await _shielded(stream.close)
            if not stopped:
                raise StreamIncomplete("the Messages API stream ended before message_stop")
        except TypeError as exc:  # the SDK's only way of saying "no credentials"
            if "authentication method" not in str(exc):
                raise
            raise AnthropicRunError(NO_KEY) from exc
        finally:
            await _shielded(client.close)


_CREDENTIALS: Final = (("api_key", "ANTHROPIC_API_KEY"), ("auth_token", "ANTHROPIC_AUTH_TOKEN"))
"""Client options the SDK would read from ``os.environ``: read from the run's environment."""


def call_arguments(request: RunRequest) -> tuple[dict[str, Any], dict[str, Any]]:
    """The client's keyword arguments and ``messages.create``'s, for one run request.

    With the starter's environment (``request.env``) its key or token is the
    client's, with its ``ANTHROPIC_BASE_URL`` (else the API's own URL, never
    the daemon's). A starter with neither leaves credentials to the SDK,
    which reads the daemon's environment and profiles.
    """
    params = dict(request.options)
    client_options = {key: params.pop(key) for key in CLIENT_OPTIONS if key in params}
    env = request.env or {}
    found = {option: env[name] for option, name in _CREDENTIALS if env.get(name)}
    if found and not {"api_key", "auth_token"} & client_options.keys():
        client_options.update(found)
        client_options.setdefault("base_url", env.get("ANTHROPIC_BASE_URL") or API_URL)
    params.pop("stream", None)
    params.setdefault("max_tokens", DEFAULT_MAX_TOKENS)
    params["model"] = request.model or DEFAULT_MODEL
    params["messages"] = [
        *params.get("messages", ()),
        {"role": "user", "content": request.prompt},
    ]
    if request.system_prompt is not None:
        params["system"] = request.system_prompt
    return client_options, params


def context_parts(params: Mapping[str, Any]) -> SessionContextParts | None:
    """The call's system prompt and tool specs as token estimates (``None``: it has neither).

    The driver is the one place that sees them: the API's stream never
    repeats the request. What is counted is what the API tokenizes: the
    system text (a string, or its text blocks) and each tool as sent.
    """
    system, tools = params.get("system"), params.get("tools")
    if not system and not tools:
        return None
    if isinstance(system, str):
        system_tokens = estimate_tokens(system)
    elif isinstance(system, list):
        system_tokens = sum(
            estimate_tokens(str(block.get("text", ""))) if isinstance(block, Mapping) else 0
            for block in system
        )
    else:
        system_tokens = 0
    specs = list(tools) if isinstance(tools, list | tuple) else []
    return SessionContextParts(
        system=system_tokens,
        tools=sum(estimate_json_tokens(spec) for spec in specs),
        tool_names=[
            str(spec["name"]) for spec in specs if isinstance(spec, Mapping) and "name" in spec
        ],
    )


_COUNTED: Final = ("model", "messages", "system", "tools", "tool_choice", "thinking", "mcp_servers")
"""The ``messages.create`` arguments ``count_tokens`` takes: what makes up the input."""


async def _count_tokens(client: Any, params: Mapping[str, Any], context: RunContext) -> None:
    """The API's count of the call's input, as the session's context figure (if it answers)."""
    from anthropic import AnthropicError

    try:
        counted = await client.messages.count_tokens(
            **{key: params[key] for key in _COUNTED if key in params}
        )
    except AnthropicError as exc:  # a proxy without the endpoint: estimate as before
        logger.warning("count_tokens failed (%s); the context figure stays an estimate", exc)
        return
    context.publish(SessionContext(used=counted.input_tokens))


def _is_error_event(body: object) -> bool:
    return isinstance(body, Mapping) and body.get("type") == "error"


async def _shielded(close: Callable[[], Awaitable[None]]) -> None:
    """Release a resource even when the run is cancelled, within a bounded time."""
    with trio.move_on_after(_CLOSE_TIMEOUT, shield=True):
        await close()
