"""Runs a prompt on an OpenCode server with the ``opencode-ai`` SDK.

No bridge: the SDK's ``AsyncOpencode`` is httpx + anyio, and httpcore picks
its Trio backend through sniffio, so the driver awaits the SDK directly in
Trio (the tests drive the real SDK under pytest-trio).

A run subscribes to ``/event`` first and waits for its first event (the
subscription is then live, so nothing the prompt causes is missed), creates
an OpenCode session or reuses ``request.resume``, and sends the prompt
(``session.chat``, which answers only when the agent is done) while reading
the stream. The stream is read as raw payloads: the SDK's event models are an
older generation than the server's, and the adapter reads both. Every event
of the session and of its sub-agent sessions (children announced by
``session.created``/``session.updated`` with a ``parentID``) is fed to the
context; other sessions on the same server are not. The run ends when the
session goes idle, and raises :class:`OpenCodeRunError` if the session
reported an error (or the stream ended first), or the SDK's own
``opencode_ai.APIError`` if a request failed. A prompt is not idempotent,
so it is never retried.

Permission requests are built by a private :class:`OpenCodeTranslator` fed
the same events, so the request the driver awaits is exactly the one the
daemon's translator published. The answer goes back with
``POST /permission/{requestID}/reply`` (``POST
/session/{id}/permissions/{permissionID}`` for an older server's
``permission.updated``): ``always`` for an ``always``/``allow_always``
choice, ``once`` for any other allow, ``reject`` otherwise. A denial's
reason (a frontend's words, ``--deny bash``, the daemon's timeout) goes with
the ``reject`` as its ``message``: OpenCode tells the model that feedback
and goes on; a ``reject`` without one stops the turn, as OpenCode's own
Reject does. A request answered elsewhere (the OpenCode TUI) stops waiting.

Request fields:

- ``model``: ``"provider/model"``, split at the first ``/`` as OpenCode does
  (``openrouter/anthropic/claude-x`` is provider ``openrouter``); a bare name
  means provider ``anthropic``. Default ``anthropic/claude-sonnet-4-5``.
  Sent as the SDK's ``modelID``/``providerID`` and as current servers'
  ``model`` object.
- ``system_prompt``: the prompt's ``system``.
- ``cwd``: the ``directory`` query parameter of every request, which picks
  the project a (current) server works in.
- ``permission_mode``: ``None``/``"default"`` ask the daemon;
  ``"acceptEdits"`` answers ``edit`` requests ``once`` without asking;
  ``"bypassPermissions"`` answers every request ``once`` without asking;
  ``"plan"`` runs OpenCode's ``plan`` agent.
- ``max_turns``: one assistant message is one model call, one turn; when
  message ``max_turns + 1`` starts the session is aborted and the run ends
  (without error) at the idle that follows.
- ``options``: ``base_url`` (else ``$OPENCODE_BASE_URL``, else the SDK's
  default), ``timeout``, ``max_retries``, ``default_headers`` and
  ``default_query`` go to ``AsyncOpencode``; ``mode``, ``tools`` and
  ``message_id`` to ``session.chat``; anything else into the prompt's body
  as it is (``agent``, ``variant``, ...). ``timeout`` bounds the short calls
  only: the prompt and the stream never time out on reads (a silent agent
  is the daemon's watchdog's business).

No server: when nothing answers the run's first request (the ``/event``
subscription, not retried), the driver starts ``opencode serve`` itself on a
free localhost port, in ``cwd`` with the run's environment (its starter's,
else the daemon's: so the project's and the user's OpenCode config and API
keys apply; ``OPENCODE_BASE_URL`` is read from it too), runs the prompt on it and
stops it (its whole process group) when the run ends or is cancelled; see
:mod:`busd_opencode._serve`. Options: ``start_server`` (default true;
``false`` fails the run instead, naming the URL tried) and ``opencode_path``
(else ``$BUSD_OPENCODE_PATH``, else ``opencode`` on ``PATH``). A missing SDK
or an unreachable server fails with an error that says what to do.

Cancellation: Trio cancellation of :meth:`OpenCodeDriver.run` after the
prompt was sent has OpenCode abort the session (``POST
/session/{id}/abort``) and reads the stream on, shielded, until the
session's idle (at most :data:`ABORT_TIMEOUT` for the abort and
:data:`STOP_READING` for the rest): the bus gets OpenCode's own end of the
turn (``MessageAbortedError``, an idle that says ``aborted``, the partial
text ``stopped``), not only what busd closes itself, and the server has
stopped the model call before a server busd started is stopped. Then the
cancellation comes out; what failed meanwhile (the prompt's request, say)
is no error. Pending permission requests stop waiting at once. The stream
and the HTTP client are closed on the way out.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from contextlib import aclosing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, cast

import trio

from busd import (
    BusdError,
    PermissionDecision,
    PermissionRequested,
    PermissionResolved,
    RunContext,
    RunRequest,
)

from ._serve import find_opencode, serving, unreachable
from ._wire import field, ident, mapping, session_of
from .translator import OpenCodeTranslator

if TYPE_CHECKING:
    import httpx
    from opencode_ai import AsyncOpencode

__all__ = ["OpenCodeDriver", "OpenCodeRunError", "RunPlan", "UnsupportedOption", "plan_run"]

logger = logging.getLogger("busd.opencode")

DEFAULT_MODEL: Final = "anthropic/claude-sonnet-4-5"
DEFAULT_PROVIDER: Final = "anthropic"
ABORT_TIMEOUT: Final = 2.0
"""How long a cancelled run waits for the server to take its abort."""
STOP_READING: Final = 3.0
"""How long, after its abort was taken, a cancelled run reads on for the session's idle."""
PROMPT_GRACE: Final = 2.0
"""How long, after the idle, the run waits for the prompt request to answer."""
CONNECT_TIMEOUT: Final = 10.0

_CLIENT_KEYS: Final = frozenset(
    {"base_url", "timeout", "max_retries", "default_headers", "default_query"}
)
_CHAT_KEYS: Final = frozenset({"mode", "tools", "message_id"})
_SERVER_KEYS: Final = frozenset({"start_server", "opencode_path"})
DEFAULT_URL: Final = "http://localhost:54321"
"""The SDK's base URL when neither the option nor ``$OPENCODE_BASE_URL`` gives one."""
NO_SDK: Final = "the opencode driver needs the OpenCode SDK: pip install 'busd-opencode[driver]'"
_EDITS: Final = frozenset({"edit", "write"})
_MODES: Final = frozenset({"default", "acceptEdits", "bypassPermissions", "plan"})


class OpenCodeRunError(BusdError, RuntimeError):
    """The OpenCode session reported an error, or its event stream ended mid-run."""


class _Unreachable(Exception):
    """Nothing answered the run's first request: no server there, so far as the run knows."""


class UnsupportedOption(BusdError, ValueError):
    """A run request this driver cannot express to OpenCode."""


# -- the request, as the SDK's arguments (pure) -------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class RunPlan:
    """What :func:`plan_run` makes of a :class:`RunRequest` for the SDK."""

    provider: str
    model: str
    client: dict[str, Any]
    """``AsyncOpencode`` keyword arguments."""
    chat: dict[str, Any]
    """``session.chat`` keyword arguments (besides id, model and parts)."""
    auto_allow: frozenset[str] | None
    """Permission categories answered ``once`` without asking; ``None`` means all of them."""
    start_server: bool = True
    """Start ``opencode serve`` when nothing answers at the base URL."""
    opencode_path: str | None = None
    """The ``opencode`` binary to start (else ``$BUSD_OPENCODE_PATH``, else ``PATH``)."""


def split_model(name: str) -> tuple[str, str]:
    """``"provider/model"`` as OpenCode splits it (at the first ``/``)."""
    provider, sep, model = name.partition("/")
    if not sep:
        provider, model = DEFAULT_PROVIDER, name
    if not provider or not model:
        raise UnsupportedOption(f"model {name!r} is not 'provider/model'")
    return provider, model


def plan_run(request: RunRequest, default_model: str = DEFAULT_MODEL) -> RunPlan:
    mode = request.permission_mode
    if mode is not None and mode not in _MODES:
        raise UnsupportedOption(f"permission mode {mode!r} (known: {', '.join(sorted(_MODES))})")
    provider, model = split_model(request.model or default_model)
    client: dict[str, Any] = {}
    chat: dict[str, Any] = {}
    body: dict[str, Any] = {"model": {"providerID": provider, "modelID": model}}
    if mode == "plan":
        chat["mode"] = body["agent"] = "plan"
    server: dict[str, Any] = {}
    for key, value in request.options.items():
        if key in _SERVER_KEYS:
            server[key] = value
        elif key in _CLIENT_KEYS:
            client[key] = value
        elif key in _CHAT_KEYS:
            chat[key] = value
        else:
            body[key] = value
    if request.cwd is not None:
        client["default_query"] = {"directory": request.cwd, **client.get("default_query", {})}
    if request.system_prompt is not None:
        chat["system"] = request.system_prompt
    chat["extra_body"] = body
    auto: frozenset[str] | None = frozenset()
    if mode == "bypassPermissions":
        auto = None
    elif mode == "acceptEdits":
        auto = _EDITS
    start = server.get("start_server", True)
    path = server.get("opencode_path")
    if not isinstance(start, bool) or not (path is None or isinstance(path, str)):
        raise UnsupportedOption("start_server is true or false, opencode_path a path")
    return RunPlan(
        provider=provider,
        model=model,
        client=client,
        chat=chat,
        auto_allow=auto,
        start_server=start,
        opencode_path=path,
    )


def reply_for(decision: PermissionDecision) -> str:
    """The OpenCode reply (``once``, ``always``, ``reject``) for a daemon decision."""
    if not decision.allowed:
        return "reject"
    return "always" if decision.option_id in ("always", "allow_always") else "once"


def reply_request(
    request_id: str, sid: str, reply: str, message: str | None, *, current: bool
) -> tuple[str, dict[str, str]]:
    """``(path, body)`` of the answer: the current endpoint, or an older server's."""
    if not current:
        return f"/session/{sid}/permissions/{request_id}", {"response": reply}
    body = {"reply": reply}
    if reply == "reject" and message:
        body["message"] = message  # OpenCode's feedback to the model
    return f"/permission/{request_id}/reply", body


# -- the driver ---------------------------------------------------------------------


class OpenCodeDriver:
    """Runs prompts on an OpenCode server (see the module docstring)."""

    name = "opencode"
    default_model = DEFAULT_MODEL

    async def run(self, context: RunContext) -> None:
        try:
            import httpx
            import opencode_ai
        except ImportError as exc:
            raise OpenCodeRunError(NO_SDK) from exc

        plan = plan_run(context.request, self.default_model)
        environ = context.request.environ()  # the starter's, else the daemon's
        url = plan.client.get("base_url") or environ.get("OPENCODE_BASE_URL") or DEFAULT_URL
        try:
            try:
                await self._run(context, plan, str(url), httpx, opencode_ai)
            except _Unreachable:
                binary = find_opencode(plan.opencode_path, environ)
                if not plan.start_server or binary is None:
                    raise unreachable(str(url), start_server=plan.start_server) from None
                async with serving(binary, cwd=context.request.cwd, env=context.request.env) as url:
                    await self._run(context, plan, url, httpx, opencode_ai)
        except opencode_ai.APIConnectionError as exc:
            raise OpenCodeRunError(f"the OpenCode server at {url} stopped answering") from exc

    async def _run(
        self, context: RunContext, plan: RunPlan, url: str, httpx: Any, opencode_ai: Any
    ) -> None:
        unbounded = httpx.Timeout(None, connect=CONNECT_TIMEOUT)
        async with opencode_ai.AsyncOpencode(**{**plan.client, "base_url": url}) as client:
            try:
                stream = await client.get(
                    "/event",
                    cast_to=object,  # raw payloads: the SDK's models are an older generation
                    options={"timeout": unbounded, "max_retries": 0},
                    stream=True,
                    stream_cls=opencode_ai.AsyncStream[object],
                )
            except opencode_ai.APIConnectionError as exc:
                raise _Unreachable from exc
            raws = cast(AsyncGenerator[object, None], aiter(stream))
            async with stream, aclosing(raws):
                if await anext(raws, None) is None:
                    raise OpenCodeRunError("the event stream closed before it said anything")
                sid = context.request.resume or (await client.session.create()).id
                context.set_sdk_session(sid)
                run = _Run(client, context, plan, sid, unbounded)
                try:
                    await run.drive(raws)
                finally:
                    if run.prompted and not run.idle:
                        await _abort(client, sid)


def _is_idle_status(kind: object, props: Mapping[str, Any]) -> bool:
    """``session.status`` idle: ``{"type": "idle"}`` now, a bare ``"idle"`` in some versions."""
    if kind != "session.status":
        return False
    status = props.get("status")
    return status == "idle" or mapping(status).get("type") == "idle"


async def _abort(client: AsyncOpencode, sid: str) -> None:
    """Stop the agent: shielded from the cancellation that brought us here, but bounded."""
    from opencode_ai import APIError

    with trio.CancelScope(shield=True), trio.move_on_after(ABORT_TIMEOUT):
        try:
            await client.session.abort(sid, timeout=ABORT_TIMEOUT)
        except APIError as exc:
            logger.warning("opencode: could not abort session %s: %s", sid, exc)


class _Run:
    """One prompt on one session: reads the stream, answers permissions, ends at idle."""

    def __init__(
        self,
        client: AsyncOpencode,
        context: RunContext,
        plan: RunPlan,
        sid: str,
        unbounded: httpx.Timeout,
    ) -> None:
        self._client = client
        self._context = context
        self._plan = plan
        self._unbounded = unbounded
        self.sid = sid
        self._family = {sid}
        self._shadow = OpenCodeTranslator()  # builds permission requests like the daemon's
        self._waiting: dict[str, trio.CancelScope] = {}
        self._turns: set[str] = set()
        self._limited = False
        self.prompted = False
        self.idle = False
        self._error: Exception | None = None
        self._prompt_done = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._work = trio.CancelScope(shield=True)  # the run's cancellation only asks it to end
        self._over = False
        self.cancelled = False

    async def drive(self, raws: AsyncIterator[object]) -> None:
        """Prompt, and read until the idle; cancelled, abort and read on until the idle."""
        async with trio.open_nursery() as guard:
            guard.start_soon(self._until_cancelled)
            try:
                with self._work:
                    async with trio.open_nursery() as nursery:
                        self._nursery = nursery
                        nursery.start_soon(self._prompt)
                        try:
                            await self._read(raws)
                        except Exception as exc:  # the connection dropped, say: just the error
                            self._fail(exc)
                        if self.idle and not self.cancelled:
                            with trio.move_on_after(PROMPT_GRACE):
                                await self._prompt_done.wait()
                        nursery.cancel_scope.cancel()
            finally:
                self._over = True
                guard.cancel_scope.cancel()
        if self.cancelled:
            await trio.lowlevel.checkpoint()  # the run's cancellation comes out here
        if self._error is not None:
            raise self._error

    async def _until_cancelled(self) -> None:
        """Wait for the run's cancellation; then have the work abort and wrap up."""
        try:
            await trio.sleep_forever()
        finally:
            if not self._over:
                self._cancel()

    def _cancel(self) -> None:
        """The run is cancelled: abort the session and read on, bounded, until its idle."""
        self.cancelled = True
        for waiting in self._waiting.values():
            waiting.cancel()  # the abort answers them
        if self._nursery is None or not self.prompted:
            self._work.cancel()  # nothing asked of OpenCode yet: nothing to wait for
            return
        self._work.deadline = trio.current_time() + ABORT_TIMEOUT + STOP_READING
        self._nursery.start_soon(_abort, self._client, self.sid)

    def _fail(self, exc: Exception) -> None:
        """End the run with ``exc`` (the first failure wins); once cancelled, no failure."""
        if self.cancelled:
            logger.debug("opencode: after the cancel of session %s: %r", self.sid, exc)
            return
        if self._error is None:
            self._error = exc
        assert self._nursery is not None
        self._nursery.cancel_scope.cancel()

    # -- the prompt -------------------------------------------------------------------

    async def _prompt(self) -> None:
        request = self._context.request
        self.prompted = True
        try:
            await self._client.with_options(max_retries=0).session.chat(
                self.sid,
                model_id=self._plan.model,
                provider_id=self._plan.provider,
                parts=[{"type": "text", "text": request.prompt}],
                timeout=self._unbounded,
                **self._plan.chat,
            )
        except Exception as exc:  # the SDK's APIError, mostly: the run's outcome
            self._fail(exc)
        finally:
            self._prompt_done.set()

    # -- the stream -------------------------------------------------------------------

    async def _read(self, raws: AsyncIterator[object]) -> None:
        """Feed the stream until the session is idle.

        The stream is the SDK's chain of async generators (over httpx's); one
        left suspended is collected later with a ResourceWarning for each
        link. So at the idle the read is not left by ``return``: it is
        cancelled, and the cancellation, raised where the chain waits for the
        server, ends every link on its way out (events already buffered are
        read past).
        """
        with trio.CancelScope() as done:
            async for raw in raws:
                if isinstance(raw, Mapping) and not done.cancel_called:
                    self._on_event(raw)
                    if self.idle:
                        done.cancel()
        if not self.idle:
            self._error = self._error or OpenCodeRunError(
                f"the event stream of session {self.sid} ended before it went idle"
            )

    def _on_event(self, raw: Mapping[str, Any]) -> None:
        kind = raw.get("type")
        props = mapping(raw.get("properties"))
        info = mapping(props.get("info"))
        if isinstance(kind, str) and kind.startswith("session.") and ident(info.get("id")):
            sid = ident(info.get("id"))
            parent = ident(field(info, "parentID", "parent_id"))
            if parent in self._family and sid is not None:
                self._family.add(sid)  # a sub-agent's session
        else:
            sid = session_of(props, info, mapping(props.get("part")))
        if sid is None or sid not in self._family:
            return
        self._context.feed(raw)
        for emitted in self._shadow.feed(raw, trio.current_time()):
            event = emitted.event
            if isinstance(event, PermissionRequested) and not self.cancelled:
                assert self._nursery is not None
                current = kind == "permission.asked"
                self._nursery.start_soon(self._answer, event, sid, current)
            elif isinstance(event, PermissionResolved) and event.request_id in self._waiting:
                self._waiting[event.request_id].cancel()  # answered elsewhere
        if sid == self.sid:
            self._on_own(kind, props, info)

    def _on_own(self, kind: object, props: Mapping[str, Any], info: Mapping[str, Any]) -> None:
        """What the run's own session says about the run: turns, errors, idle."""
        if kind == "message.updated" and info.get("role") == "assistant":
            mid = ident(info.get("id"))
            limit = self._context.request.max_turns
            if mid is not None and mid not in self._turns:
                self._turns.add(mid)
                if limit is not None and len(self._turns) > limit and not self._limited:
                    self._limited = True
                    assert self._nursery is not None
                    self._nursery.start_soon(self._stop_at_limit)
        elif kind == "session.error":
            error = mapping(props.get("error"))
            name = ident(error.get("name")) or "UnknownError"
            if name == "MessageAbortedError" and self._limited:
                return
            message = ident(mapping(error.get("data")).get("message")) or ident(
                error.get("message")
            )
            if self._error is None:
                self._error = OpenCodeRunError(f"{name}: {message}" if message else name)
        elif self.prompted and (kind == "session.idle" or _is_idle_status(kind, props)):
            self.idle = True

    # -- permissions and limits -------------------------------------------------------

    async def _answer(self, request: PermissionRequested, sid: str, current: bool) -> None:
        from opencode_ai import APIStatusError

        auto = self._plan.auto_allow
        message: str | None = None
        try:
            if auto is None or (request.category or "") in auto:
                reply = "once"
            else:
                with trio.CancelScope() as scope:
                    self._waiting[request.request_id] = scope
                    try:
                        decision = await self._context.request_permission(request)
                    finally:
                        del self._waiting[request.request_id]
                if scope.cancelled_caught:
                    return
                reply = reply_for(decision)
                if decision.outcome == "denied":  # not cancelled: that stops the turn
                    message = decision.reason
            path, body = reply_request(request.request_id, sid, reply, message, current=current)
            await self._client.post(path, body=body, cast_to=object)
        except APIStatusError as exc:
            if exc.status_code != 404:  # 404: answered and gone already
                self._fail(exc)
        except Exception as exc:
            self._fail(exc)

    async def _stop_at_limit(self) -> None:
        logger.info("opencode: session %s reached max_turns; aborting it", self.sid)
        try:
            await self._client.session.abort(self.sid)
        except Exception as exc:
            self._fail(exc)
