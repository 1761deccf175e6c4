"""The ``acp`` driver: run a prompt with any Agent Client Protocol agent, as a subprocess.

Each run starts the agent (``options["command"]``) in a process group of its
own (:mod:`.spawn`: Ctrl-C in a terminal reaches busd only, and nothing the
agent started outlives the run), speaks ACP to it (the ``agent-client-protocol``
SDK's client side: ``initialize``, then ``session/new``, or ``session/load`` to
continue an earlier run's session, then one ``session/prompt``) and stops it
when the prompt is answered. ``initialize`` asks for ACP ``notice``
updates (:mod:`.sdk_gaps`: the SDK's schema cannot), so an agent's warnings
reach the bus as ``stream.session.warning``, not as answer text. Examples of
``command``: ``["opencode", "acp"]``,
``["gemini", "--experimental-acp"]``, ``["goose", "acp"]``,
``["claude-agent-acp"]`` (npm ``@agentclientprotocol/claude-agent-acp``).

**The bridge.** The SDK is asyncio-only, so the conversation runs in a worker thread of its
own (``trio.to_thread.run_sync`` around ``asyncio.run``); the run's Trio task is the other
end. Every JSON-RPC message the SDK's connection sends or receives (its stream observer:
incoming messages as they are read, outgoing ones as soon as they are written, before a
reply can be read, so in wire order) crosses to Trio through ``TrioToken.run_sync_soon``
into a memory channel, and the Trio task feeds it, in that order, as the dict that crossed
the wire: the adapter sees both directions exactly as an ``acp`` ingest would.
A ``session/request_permission`` becomes a :class:`PermissionRequested` (``request_id``
``"acp-<JSON-RPC id>"``, built by a private :class:`AcpTranslator` over the same stream, so
it is the event the adapter published, tool name and input included) that a Trio child task
takes to :meth:`RunContext.request_permission`; the answer goes back with
``loop.call_soon_threadsafe`` as the offered option of the right kind (the one the decision
names, else ``*_once`` before ``*_always``), or ACP's ``cancelled`` outcome. Requests are
asked concurrently, and events keep flowing while one waits.

**Cancellation.** When Trio cancels :meth:`AcpDriver.run`, the agent is stopped the way ACP
prescribes: ``session/cancel``, then every pending permission request answered
``cancelled``, then up to ``cancel_timeout`` seconds for the prompt's answer (``stopReason:
"cancelled"``), which is still fed. Then, as after any run, its stdin is closed and it has
``shutdown_timeout`` seconds to exit before ``terminate``, then ``kill`` (one that ignored
``session/cancel`` is terminated at once), and so has what is left of its process group.
Meanwhile the Trio task keeps feeding, shielded, for a bounded time, and re-raises
``Cancelled`` once the thread is done. Before the prompt is sent, cancellation just ends the
conversation. Its stderr is drained (never blocking it); its end goes into errors.

What a :class:`~busd.RunRequest` means here:

- ``model``: no default (``default_model`` is ``""``): the agent uses its
  own. A model is set only if the agent offers a session config option of
  category ``model`` (``session/set_config_option``); otherwise it is
  ignored with a warning.
- ``system_prompt``: ACP has none; it goes as ``_meta.systemPrompt`` on
  ``session/new`` / ``session/load`` (what Claude Code's ACP agent reads;
  other agents ignore it).
- ``cwd``: the session's working directory and the agent process's; the
  daemon's own directory when not given.
- ``permission_mode``: an ACP session mode id (``session/set_mode``), or the
  value of a config option of category ``mode``; ignored with a warning if
  the agent offers neither.
- ``max_turns``: ACP has no such setting (an agent's own cap ends the turn
  with ``stopReason: "max_turn_requests"``); ignored.
- ``resume``: the ACP session id of an earlier run (set with
  :meth:`RunContext.set_sdk_session`), continued with ``session/load`` in a
  new agent process; an agent without ``loadSession`` fails the run. The
  history the agent replays while loading is not fed: the bus saw it when
  it happened.
- ``env``: the agent's (its starter's); without it, the SDK's trimmed copy
  of the daemon's: ``HOME``, ``PATH``, ``USER``, ``LOGNAME``, ``SHELL``, ``TERM``.
- ``options`` (see :class:`AcpOptions`): ``command`` (required), ``env``
  (added over that environment; pass API keys here), ``mcp_servers``
  (ACP ``McpServer`` objects, wire shape), ``additional_directories``,
  ``session_meta`` (``_meta`` of the session request), ``fs`` (answer
  ``fs/read_text_file`` and ``fs/write_text_file``, default true),
  ``cancel_timeout`` and ``shutdown_timeout`` (seconds, default 2).

Errors raise :class:`AcpAgentError`: an error answer (the adapter has
already reported it), a missing capability, or an agent that exits before
answering (with its exit code and the end of its stderr).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final, NamedTuple, cast

import msgspec
import trio

from busd import (
    BusdError,
    PermissionDecision,
    PermissionOption,
    PermissionRequested,
    RunContext,
    RunRequest,
    __version__,
)

from .sdk_gaps import initialize
from .spawn import spawn_agent
from .translator import AcpTranslator

if TYPE_CHECKING:
    from asyncio.subprocess import Process

    from acp.client.connection import ClientSideConnection
    from acp.connection import StreamEvent
    from acp.interfaces import Client
    from acp.schema import (
        LoadSessionResponse,
        NewSessionResponse,
        PromptResponse,
        ReadTextFileResponse,
        RequestPermissionResponse,
        SessionModeState,
        ToolCallUpdate,
        WriteTextFileResponse,
    )
    from acp.schema import PermissionOption as AcpPermissionOption

__all__ = ["AcpAgentError", "AcpDriver", "AcpOptions", "AcpOptionsError", "parse_options"]

logger = logging.getLogger("busd.acp")

_CANCELLED: Final = PermissionDecision(outcome="cancelled", by="busd", reason="the run stopped")
_STDERR_TAIL: Final = 2048  # bytes of the agent's stderr kept for an early exit's error
_EXAMPLE: Final = """give --option 'command=["opencode","acp"]' (the program and its arguments)"""


class AcpOptionsError(BusdError, ValueError):
    """``options`` the ``acp`` driver cannot use."""


class AcpAgentError(BusdError, RuntimeError):
    """The agent failed: an error answer, a missing capability, or an early exit."""


class AcpOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The ``options`` of an ``acp`` run (unknown keys are refused: they would do nothing)."""

    command: Annotated[list[str], msgspec.Meta(min_length=1)]
    """The agent's argv, e.g. ``["opencode", "acp"]``."""
    env: dict[str, str] = {}
    mcp_servers: list[dict[str, Any]] = []
    additional_directories: list[str] | None = None
    session_meta: dict[str, Any] = {}
    fs: bool = True
    cancel_timeout: Annotated[float, msgspec.Meta(ge=0)] = 2.0
    shutdown_timeout: Annotated[float, msgspec.Meta(ge=0)] = 2.0


def parse_options(options: Mapping[str, Any]) -> AcpOptions:
    """``RunRequest.options`` checked, or :class:`AcpOptionsError` saying what is wrong."""
    command = options.get("command")
    if not isinstance(command, list) or not command:
        said = "no command" if command is None else f"command {command!r} is not a JSON list"
        raise AcpOptionsError(f"the acp driver needs the agent's argv: {said}; {_EXAMPLE}")
    try:
        return msgspec.convert(dict(options), AcpOptions)
    except msgspec.ValidationError as exc:
        raise AcpOptionsError(f"acp driver options: {exc}") from None


# -- what crosses from the agent's thread to Trio, in wire order ---------------------


class _Feed(NamedTuple):
    message: dict[str, Any]


class _SdkSession(NamedTuple):
    session_id: str


class _Ask(NamedTuple):
    request: PermissionRequested  # from the request alone: Trio prefers the adapter's event
    reply: Callable[[PermissionDecision], None]  # thread-safe: settles it on the agent's loop


_Message = _Feed | _SdkSession | _Ask


# -- the Trio side ----------------------------------------------------------------------------


class AcpDriver:
    """Runs a prompt with an ACP agent subprocess (see the module docstring)."""

    name = "acp"
    default_model = ""
    """None: the agent uses its own model unless the run names one it offers."""

    async def run(self, context: RunContext) -> None:
        options = parse_options(context.request.options)
        send, receive = trio.open_memory_channel[_Message](math.inf)
        token = trio.lowlevel.current_trio_token()

        def post(message: _Message) -> None:  # called on the agent's thread
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(_deliver, send, message)

        side = _AgentSide(context.request, options, post)
        pump = _Pump(context, side)
        grace = options.cancel_timeout + 3 * options.shutdown_timeout + 1.0  # + its group
        with receive:
            try:
                async with trio.open_nursery() as nursery:
                    thread_scope = await nursery.start(pump.run_thread, send)
                    await pump.serve(receive, nursery, thread_scope, grace)
            except BaseExceptionGroup as group:
                # The children never raise, so the group holds the body's one exception.
                if len(group.exceptions) != 1:
                    raise
                raise group.exceptions[0] from None
        if pump.error is not None:
            raise pump.error


def _deliver(send: trio.MemorySendChannel[_Message], message: _Message) -> None:
    with contextlib.suppress(trio.ClosedResourceError, trio.BrokenResourceError):
        send.send_nowait(message)  # closed: the run ended without waiting for the thread


class _Pump:
    """The Trio half of a run: feeds what the agent's thread saw and asks for permissions."""

    def __init__(self, context: RunContext, side: _AgentSide) -> None:
        self.context = context
        self.side = side
        self.shadow = AcpTranslator(session_id=context.request.session_id)
        self.requested: dict[str, PermissionRequested] = {}
        self.asks: set[trio.CancelScope] = set()
        self.closed = False
        self.error: BaseException | None = None

    async def run_thread(
        self,
        send: trio.MemorySendChannel[_Message],
        *,
        task_status: trio.TaskStatus[trio.CancelScope] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        with send, trio.CancelScope(shield=True) as scope:  # only the pump's grace ends it early
            task_status.started(scope)
            try:
                await trio.to_thread.run_sync(
                    self.side.run, abandon_on_cancel=True, limiter=trio.CapacityLimiter(1)
                )
            except Exception as exc:
                if self.error is None:
                    self.error = exc
        if scope.cancelled_caught:
            logger.warning("the ACP agent's thread did not stop in time; abandoned")

    async def serve(
        self,
        receive: trio.MemoryReceiveChannel[_Message],
        nursery: trio.Nursery,
        thread_scope: trio.CancelScope,
        grace: float,
    ) -> None:
        try:
            async for message in receive:
                self.handle(message, nursery)
        except BaseException:
            # Cancelled (or broken here): stop the agent the ACP way and feed what it
            # says while it winds down, for a bounded time.
            self.side.stop()  # first, so the agent hears session/cancel before any answer
            self.close_asks()
            with trio.CancelScope(shield=True):
                thread_scope.deadline = min(thread_scope.deadline, trio.current_time() + grace)
                async for message in receive:
                    self.handle(message, None)
            raise
        finally:
            self.close_asks()  # the agent is gone: nobody waits for these answers

    def handle(self, message: _Message, nursery: trio.Nursery | None) -> None:
        if isinstance(message, _Feed):
            raw = message.message
            self.context.feed(raw)
            for item in self.shadow.feed(raw, trio.current_time()):
                if type(item.event) is PermissionRequested:
                    self.requested[item.event.request_id] = item.event
        elif isinstance(message, _SdkSession):
            self.context.set_sdk_session(message.session_id)
        elif nursery is None or self.closed:
            message.reply(_CANCELLED)
        else:
            nursery.start_soon(self.ask, message)

    async def ask(self, ask: _Ask) -> None:
        request = self.requested.pop(ask.request.request_id, ask.request)
        decision = _CANCELLED
        if not self.closed:
            # Shielded: close_asks() ends it, so the run's cancellation never escapes a child.
            with trio.CancelScope(shield=True) as scope:
                self.asks.add(scope)
                try:
                    decision = await self.context.request_permission(request)
                except Exception as exc:
                    logger.warning(
                        "permission request %s failed", request.request_id, exc_info=True
                    )
                    if self.error is None:
                        self.error = exc
                    self.side.stop()
                finally:
                    self.asks.discard(scope)
        ask.reply(decision)

    def close_asks(self) -> None:
        self.closed = True
        for scope in self.asks:
            scope.cancel()


# -- the asyncio side, in the agent's thread -----------------------------------------------


class _AgentSide:
    """The SDK's connection to the agent process, on an asyncio loop in a worker thread."""

    def __init__(
        self, request: RunRequest, options: AcpOptions, post: Callable[[_Message], None]
    ) -> None:
        self.request = request
        self.options = options
        self.post = post
        self.cwd = os.path.abspath(request.cwd or os.getcwd())
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_requested = False
        # Loop-thread state from here on.
        self._conversation: asyncio.Task[str | None] | None = None
        self._prompt: asyncio.Future[PromptResponse] | None = None
        self._stopping = False
        self._stop = asyncio.Event()
        self._asks: dict[asyncio.Future[PermissionDecision], None] = {}
        self._permissions: dict[Any, tuple[Any, Any] | None] = {}
        """The agent's unanswered session/request_permission ids: (session, tool call), or
        ``None`` once a handler claimed it (handlers get the params, not the id)."""
        self._loading: Any = None
        """The id of our session/load while the agent replays the session's history."""
        self._stderr_task: asyncio.Task[None] | None = None
        self._stderr = b""

    # -- called from the Trio thread --------------------------------------------------------

    def run(self) -> str | None:
        """The thread's body: the prompt's stop reason, ``None`` if stopped before it."""
        try:
            return asyncio.run(self._run())
        except asyncio.CancelledError:
            return None

    def stop(self) -> None:
        """Thread-safe: cancel the prompt (ACP's way), or end the conversation before it."""
        with self._lock:
            self._stop_requested = True
            loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nothing to stop
                loop.call_soon_threadsafe(self._on_stop)

    # -- on the loop ----------------------------------------------------------------------------

    def _on_stop(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        self._stop.set()
        if self._prompt is None and self._conversation is not None:
            # Only the conversation: the SDK's shutdown of the process must never be cut.
            self._conversation.cancel()

    async def _run(self) -> str | None:
        from acp import RequestError

        with self._lock:
            self._loop = asyncio.get_running_loop()
            if self._stop_requested:
                return None
        command, *args = self.options.command
        process: Process | None = None
        try:
            async with contextlib.AsyncExitStack() as stack:
                stack.push_async_callback(self._stderr_done)  # runs after the agent exited
                try:
                    conn, agent = await stack.enter_async_context(
                        spawn_agent(
                            cast("Client", _Client(self)),
                            command,
                            *args,
                            env=self.options.env,
                            base_env=self.request.env,
                            cwd=self.cwd,
                            shutdown_timeout=self.options.shutdown_timeout,
                            observers=[self._observe],
                        )
                    )
                except OSError as exc:
                    raise AcpAgentError(f"cannot start the agent {command!r}: {exc}") from exc
                process = agent
                if agent.stderr is not None:
                    self._stderr_task = asyncio.create_task(self._read_stderr(agent.stderr))
                self._conversation = asyncio.ensure_future(self._converse(conn, agent))
                try:
                    return await self._conversation
                except asyncio.CancelledError:
                    return None  # stopped before the prompt (nothing else cancels it)
        except ConnectionError as exc:  # the agent exited, or closed its end, mid-conversation
            code = "" if process is None else f" (exit code {process.returncode})"
            tail = self._stderr.decode(errors="replace").strip()
            detail = f"; its stderr ends with:\n{tail}" if tail else ""
            raise AcpAgentError(f"the agent exited before answering{code}{detail}") from exc
        except RequestError as exc:
            data = f" {exc.data}" if exc.data else ""
            raise AcpAgentError(f"the agent answered an error: {exc} ({exc.code}){data}") from exc

    async def _converse(self, conn: ClientSideConnection, process: Process) -> str | None:
        from acp import text_block

        request, options = self.request, self.options
        if self._stopping:  # stopped while the agent was starting
            return None
        init = await initialize(conn, fs=options.fs, name="busd", version=__version__)
        meta = dict(options.session_meta)
        if request.system_prompt is not None:
            meta["systemPrompt"] = request.system_prompt
        servers = cast(Any, options.mcp_servers)  # the SDK validates the wire shape
        opened: NewSessionResponse | LoadSessionResponse | None
        if request.resume is None:
            opened = await conn.new_session(
                cwd=self.cwd,
                mcp_servers=servers,
                additional_directories=options.additional_directories,
                **meta,
            )
            session_id = opened.session_id
        else:
            capabilities = init.agent_capabilities
            if capabilities is None or not capabilities.load_session:
                raise AcpAgentError(
                    f"the agent cannot continue session {request.resume!r}: no session/load"
                )
            session_id = request.resume
            opened = await conn.load_session(
                cwd=self.cwd,
                session_id=session_id,
                mcp_servers=servers,
                additional_directories=options.additional_directories,
                **meta,
            )
        self.post(_SdkSession(session_id))
        if opened is not None:
            await self._configure(conn, session_id, opened)
        # No await between here and _prompt being set: until then _on_stop cancels this task.
        self._prompt = prompt = asyncio.ensure_future(
            conn.prompt(session_id=session_id, prompt=[text_block(request.prompt)])
        )
        try:
            stopped = asyncio.ensure_future(self._stop.wait())
            await asyncio.wait((prompt, stopped), return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
            if not prompt.done():
                with contextlib.suppress(ConnectionError):  # the agent is gone: it stopped
                    await conn.cancel(session_id=session_id)
                for future in list(self._asks):
                    _settle(future, _CANCELLED)
                await asyncio.wait((prompt,), timeout=options.cancel_timeout)
                if not prompt.done():
                    logger.warning("the ACP agent did not answer session/cancel; terminating it")
                    with contextlib.suppress(ProcessLookupError):
                        process.terminate()
                    return "cancelled"
            return prompt.result().stop_reason
        finally:
            prompt.cancel()

    async def _configure(
        self,
        conn: ClientSideConnection,
        session_id: str,
        opened: NewSessionResponse | LoadSessionResponse,
    ) -> None:
        model, mode = self.request.model, self.request.permission_mode
        if model:
            option = _config_option(opened, "model")
            if option is None:
                logger.warning("the ACP agent offers no model option; %r not set", model)
            else:
                await conn.set_config_option(config_id=option, session_id=session_id, value=model)
        if mode:
            modes: SessionModeState | None = opened.modes
            if modes is not None and any(m.id == mode for m in modes.available_modes):
                if modes.current_mode_id != mode:
                    await conn.set_session_mode(session_id=session_id, mode_id=mode)
            elif (option := _config_option(opened, "mode")) is not None:
                await conn.set_config_option(config_id=option, session_id=session_id, value=mode)
            else:
                logger.warning("the ACP agent offers no mode %r; permission_mode not set", mode)

    def _observe(self, event: StreamEvent) -> None:
        """The SDK's stream observer: every message, as it crossed the wire, in order."""
        message = event.message
        method, rid = message.get("method"), message.get("id")
        if event.direction.value == "incoming":
            if method == "session/update" and self._loading is not None:
                return  # history replayed by session/load: the bus saw it when it happened
            if method == "session/request_permission":
                params = message.get("params") or {}
                call = params.get("toolCall") or {}
                self._permissions[rid] = (params.get("sessionId"), call.get("toolCallId"))
            elif method is None and self._loading is not None and rid == self._loading:
                self._loading = None
        elif method == "session/load":
            self._loading = rid
        elif method is None:
            self._permissions.pop(rid, None)  # our answer to one of the agent's requests
        self.post(_Feed(message))

    async def ask(
        self, session_id: str, tool_call: ToolCallUpdate, options: list[AcpPermissionOption]
    ) -> RequestPermissionResponse:
        """The SDK's ``request_permission`` callback: ask busd, answer the agent."""
        from acp import RequestError

        key = (session_id, tool_call.tool_call_id)
        rid = next((r for r, k in self._permissions.items() if k == key), None)
        if rid is None:
            raise RequestError.internal_error({"details": "busd lost this permission request"})
        self._permissions[rid] = None
        decision = _CANCELLED
        if not self._stopping:
            loop = asyncio.get_running_loop()
            future: asyncio.Future[PermissionDecision] = loop.create_future()
            self._asks[future] = None

            def reply(decision: PermissionDecision) -> None:  # from Trio
                with contextlib.suppress(RuntimeError):  # the loop is closed
                    loop.call_soon_threadsafe(self._answer, future, decision)

            try:
                self.post(_Ask(_permission_request(rid, tool_call, options), reply))
                decision = await future
            finally:
                del self._asks[future]
        return _permission_response(decision, options)

    def _answer(
        self, future: asyncio.Future[PermissionDecision], decision: PermissionDecision
    ) -> None:
        if not self._stopping:  # when stopping, _converse answers after session/cancel
            _settle(future, decision)

    async def _read_stderr(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(4096):
            self._stderr = (self._stderr + chunk)[-_STDERR_TAIL:]

    async def _stderr_done(self) -> None:
        task = self._stderr_task
        if task is not None:
            with contextlib.suppress(TimeoutError):  # a grandchild holds the pipe open
                await asyncio.wait_for(asyncio.shield(task), 1.0)
            task.cancel()

    def fs_path(self, path: str) -> Path:
        from acp import RequestError

        if not self.options.fs:
            raise RequestError.method_not_found("fs")
        if not os.path.isabs(path):
            raise RequestError.invalid_params({"path": path, "details": "not absolute"})
        return Path(path)


def _settle(future: asyncio.Future[PermissionDecision], decision: PermissionDecision) -> None:
    if not future.done():
        future.set_result(decision)


class _Client:
    """The SDK's ``Client`` interface: what the agent may call on busd."""

    def __init__(self, side: _AgentSide) -> None:
        self._side = side

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        return None  # already fed, in wire order, by the stream observer

    async def request_permission(
        self,
        session_id: str,
        tool_call: ToolCallUpdate,
        options: list[AcpPermissionOption],
        **kwargs: Any,
    ) -> RequestPermissionResponse:
        return await self._side.ask(session_id, tool_call, options)

    async def read_text_file(
        self,
        session_id: str,
        path: str,
        line: int | None = None,
        limit: int | None = None,
        **kwargs: Any,
    ) -> ReadTextFileResponse:
        from acp.schema import ReadTextFileResponse

        target = self._side.fs_path(path)
        with _fs_errors(path):
            content = await asyncio.to_thread(_read_text, target, line, limit)
        return ReadTextFileResponse(content=content)

    async def write_text_file(
        self, session_id: str, path: str, content: str, **kwargs: Any
    ) -> WriteTextFileResponse:
        from acp.schema import WriteTextFileResponse

        target = self._side.fs_path(path)
        with _fs_errors(path):
            await asyncio.to_thread(_write_text, target, content)
        return WriteTextFileResponse()


@contextlib.contextmanager
def _fs_errors(path: str) -> Iterator[None]:
    from acp import RequestError

    try:
        yield
    except FileNotFoundError:
        raise RequestError.resource_not_found(path) from None
    except OSError as exc:
        raise RequestError.internal_error({"path": path, "details": str(exc)}) from None


def _read_text(path: Path, line: int | None, limit: int | None) -> str:
    text = path.read_text(encoding="utf-8", errors="replace")
    if line is None and limit is None:
        return text
    start = max((line or 1) - 1, 0)  # ACP lines are 1-based
    lines = text.splitlines(keepends=True)
    return "".join(lines[start : None if limit is None else start + limit])


def _write_text(path: Path, content: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content, encoding="utf-8")


def _config_option(opened: NewSessionResponse | LoadSessionResponse, category: str) -> str | None:
    """The id of the agent's select config option of ``category`` (``model``, ``mode``)."""
    for option in opened.config_options or ():
        if option.type == "select" and option.category == category:
            return option.id
    return None


def _permission_request(
    rid: Any, tool_call: ToolCallUpdate, options: Sequence[AcpPermissionOption]
) -> PermissionRequested:
    """The request from its own params (the adapter's event, when there is one, is richer)."""
    raw = tool_call.raw_input
    tool_input = dict(raw) if isinstance(raw, Mapping) else {} if raw is None else {"input": raw}
    return PermissionRequested(
        request_id=f"acp-{rid}",
        tool=tool_call.title or tool_call.kind or "tool",
        input=tool_input,
        tool_call_id=tool_call.tool_call_id,
        category=tool_call.kind,
        options=[PermissionOption(id=o.option_id, label=o.name, kind=o.kind) for o in options],
    )


def _permission_response(
    decision: PermissionDecision, options: Sequence[AcpPermissionOption]
) -> RequestPermissionResponse:
    """The offered option that says ``decision``, or ACP's ``cancelled`` if none does."""
    from acp.schema import RequestPermissionResponse

    chosen = None
    if decision.outcome != "cancelled":
        family = "allow" if decision.allowed else "reject"
        kinds = {o.option_id: o.kind for o in options}
        if decision.option_id is not None and kinds.get(decision.option_id, "").startswith(family):
            chosen = decision.option_id
        else:
            ranked = [
                o for kind in ("_once", "_always") for o in options if o.kind == family + kind
            ]
            chosen = ranked[0].option_id if ranked else None
    if chosen is None:
        return RequestPermissionResponse.model_validate({"outcome": {"outcome": "cancelled"}})
    outcome = {"outcome": "selected", "optionId": chosen}
    return RequestPermissionResponse.model_validate({"outcome": outcome})
