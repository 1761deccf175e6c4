"""Runs a prompt with the GitHub Copilot SDK (``github-copilot-sdk``).

The SDK starts the Copilot CLI (``copilot --headless --stdio``) as a child
process and speaks JSON-RPC to it over stdio; the CLI broadcasts a
``session.event`` notification for everything that happens, and each one is
fed, as the SDK's own ``SessionEvent``, to :meth:`RunContext.feed` (the
``copilot`` adapter translates it). A run creates a session (or resumes the
SDK session of the busd session's earlier run), sends the prompt and ends
when the main agent's ``session.idle`` arrives; a ``session.error``, a turn
aborted by someone else, or the CLI exiting makes :meth:`CopilotDriver.run`
raise :class:`CopilotRunError`.

**Bridge.** The SDK is asyncio-only, so each run owns a worker thread
(``trio.to_thread.run_sync(..., abandon_on_cancel=False)``) running its own
loop with ``asyncio.run``. The asyncio side calls back into Trio with
``trio.from_thread.run_sync``: events are fed in order, from the SDK's own
callback, before the next one is read. Permission requests do not block
that loop: the SDK's handler starts a Trio task in the run's nursery that
awaits :meth:`RunContext.request_permission` and settles an asyncio future
with the answer. A Trio cancellation of :meth:`~CopilotDriver.run` cancels
the asyncio task (``loop.call_soon_threadsafe(task.cancel)``), which calls
the SDK's ``session.abort()`` and then stops the client (its CLI process,
pipes and reader threads), each step bounded by ``stop_timeout`` seconds,
after which the client is force-stopped (the CLI is killed); ``run()``
returns once the thread has finished, so nothing outlives it. Two gaps of
the SDK are filled through its private attributes (each skipped if absent):
a CLI that exits mid-turn only fails pending requests, so the driver hooks
the JSON-RPC client's ``on_close`` to end the run; and ``stop()`` leaves the
child's pipes open, so they are closed once the child has exited.

**Process group.** The CLI leads a session of its own (a ``setsid()`` and
``exec`` one-liner in its place, same pid; the SDK has no option for it), so
Ctrl-C in the terminal of ``busd run`` reaches busd only, which aborts the
turn in order, instead of killing the CLI mid-turn.

**Options.** ``model`` defaults to ``claude-sonnet-4.5`` (the Copilot CLI's
usual default); ``system_prompt`` is *appended* to Copilot's own system
message (replacing it drops Copilot's guardrails: pass ``system_message``
in ``options`` to do that on purpose); ``cwd`` is the session's working
directory and the CLI's; ``permission_mode`` is the agent mode the prompt is
sent in (``interactive``, ``plan``, ``autopilot``, ``shell``; ``default`` or
none leaves Copilot's); ``max_turns`` bounds the main agent's model calls:
when the last allowed call asks for tools, the session is aborted and
:class:`MaxTurnsExceeded` raised. ``options`` are keyword arguments of
``CopilotClient.create_session`` / ``resume_session`` (they win over the
fields above), except ``options["send"]``: keyword arguments of
``CopilotSession.send`` (``attachments``, ``mode``...). Options are trusted
input (``mcp_servers`` start programs); the CLI itself is only chosen when
the run (``options["cli_path"]``), else when the driver is built
(``cli_path``), else by ``COPILOT_CLI_PATH`` in the run's environment, else
the SDK's bundled runtime. The CLI runs with the run's environment
(``request.env``, its starter's: keys and bring-your-own-key settings
included) under the driver's configured ``client_options["env"]``.

Permission answers go back in the SDK's terms: ``approve-once``,
``approve-for-session`` (scoped to the request's commands, reads or writes
where it has them), ``reject`` with the reason as feedback, and
``user-not-available`` when busd cancelled the request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import sys
import threading
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

import trio

from busd import BusdError, PermissionDecision, PermissionRequested, RunContext, RunRequest

from .translator import CopilotTranslator

if TYPE_CHECKING:
    from copilot import CopilotClient, CopilotSession, PermissionRequest, SessionEvent
    from copilot.session import PermissionInvocation, PermissionRequestResult

__all__ = ["DEFAULT_MODEL", "CopilotDriver", "CopilotRunError", "MaxTurnsExceeded"]

logger = logging.getLogger("busd.copilot")

DEFAULT_MODEL: Final = "claude-sonnet-4.5"

_AGENT_MODES: Final = frozenset({"interactive", "plan", "autopilot", "shell"})
_RESERVED: Final = frozenset({"on_permission_request", "on_event", "session_id"})
_WANTS_TOOLS: Final = frozenset({"tool_calls", "tool_use", "function_call"})
_SHADOWED: Final = frozenset(
    {
        "assistant.message",
        "tool.execution_start",
        "tool.execution_complete",
        "permission.requested",
        "permission.completed",
    }
)
"""Raw events that tell which tool a permission request is for."""


class CopilotRunError(BusdError, RuntimeError):
    """The Copilot agent failed the run: an error event, an aborted turn, or the CLI exited."""


class MaxTurnsExceeded(CopilotRunError):
    """The agent wanted more model calls than ``max_turns`` allows; its session was aborted."""


class CopilotDriver:
    """The ``copilot`` driver: one Copilot CLI process and SDK session per run.

    ``cli_path``/``cli_args`` choose the CLI the SDK starts (``None``: the
    SDK's ``COPILOT_CLI_PATH`` or bundled runtime); ``client_options`` are
    further ``CopilotClient`` keyword arguments (``github_token``, ``env``,
    ``log_level``...); ``stop_timeout`` bounds each step of stopping.
    """

    name = "copilot"
    default_model: str = DEFAULT_MODEL

    def __init__(
        self,
        *,
        cli_path: str | None = None,
        cli_args: Sequence[str] = (),
        client_options: Mapping[str, Any] | None = None,
        stop_timeout: float = 2.0,
    ) -> None:
        self.cli_path = cli_path
        self.cli_args = tuple(cli_args)
        self.client_options = dict(client_options or {})
        if {"connection", "working_directory"} & self.client_options.keys():
            raise ValueError("client_options cannot set 'connection' or 'working_directory'")
        self.stop_timeout = stop_timeout

    async def run(self, context: RunContext) -> None:
        """Run ``context.request`` to the main agent's idle; raise on an agent error."""
        await _Run(self, context).run()


class _Run:
    """One run: the Trio side, the asyncio side, and what they share (under ``_lock``)."""

    def __init__(self, driver: CopilotDriver, context: RunContext) -> None:
        request = context.request
        self.driver = driver
        self.context = context
        self.request = request
        self.session_kwargs, self.send_kwargs = _sdk_kwargs(request)
        self.nursery: trio.Nursery | None = None
        # Shared between the threads: who cancels whom.
        self._lock = threading.Lock()
        self._cancelled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        # The asyncio side's own state.
        self._done: asyncio.Future[None] | None = None
        self._error: BaseException | None = None
        self._sent = False
        self._calls = 0
        self._shadow = CopilotTranslator()
        self._asked: dict[str, tuple[object, PermissionRequested]] = {}

    # -- the Trio side ----------------------------------------------------------------

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            nursery.start_soon(self._relay_cancellation)
            # The thread lives as long as the run: keep it off the default limiter's tokens.
            error = await trio.to_thread.run_sync(
                self._thread,
                thread_name="busd copilot driver",
                abandon_on_cancel=False,
                limiter=trio.CapacityLimiter(1),
            )
            nursery.cancel_scope.cancel()
        if isinstance(error, asyncio.CancelledError):
            raise CopilotRunError("the Copilot session was cancelled") from error
        if error is not None:
            raise error

    async def _relay_cancellation(self) -> None:
        try:
            await trio.sleep_forever()
        finally:  # cancelled: by the caller, or by run() once the thread is done
            self._cancel_asyncio()

    def _cancel_asyncio(self) -> None:
        with self._lock:
            self._cancelled = True
            loop, task = self._loop, self._task
        if loop is not None and task is not None:
            with contextlib.suppress(RuntimeError):  # closed: the asyncio side is over
                loop.call_soon_threadsafe(task.cancel)

    async def _ask(self, asked: PermissionRequested, answer: asyncio.Future[Any]) -> None:
        """Trio task: get busd's decision for one request and hand it to the asyncio side."""
        try:
            decision = await self.context.request_permission(asked)
        except Exception as exc:
            logger.warning("copilot: permission request %s failed", asked.request_id, exc_info=exc)
            self._settle_soon(answer, exc)
            return
        except BaseException:
            self._settle_soon(answer, None)
            raise
        self._settle_soon(answer, decision)

    def _settle_soon(self, answer: asyncio.Future[Any], value: object) -> None:
        with contextlib.suppress(RuntimeError):  # closed: nobody waits for the answer
            answer.get_loop().call_soon_threadsafe(_settle, answer, value)

    # -- the worker thread --------------------------------------------------------------

    def _thread(self) -> BaseException | None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # handed to the Trio side, which raises it
            return exc
        return None

    async def _main(self) -> None:
        try:
            from copilot import CopilotClient, RuntimeConnection
        except ImportError as exc:
            raise CopilotRunError(
                "the copilot driver needs the GitHub Copilot SDK: "
                "pip install 'busd-copilot[driver]'"
            ) from exc
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._cancelled:
                return
            self._loop, self._task = loop, asyncio.current_task()
        self._done = loop.create_future()
        driver = self.driver
        env = client_env(driver, self.request)
        path, args = _own_session(driver, self.request, env)
        client = CopilotClient(
            connection=RuntimeConnection.for_stdio(path=path, args=args),
            working_directory=self.request.cwd,
            **{**driver.client_options, **({} if env is None else {"env": env})},
        )
        session: CopilotSession | None = None
        try:
            await client.start()
            self._watch_transport(client)
            session = await self._open_session(client)
            trio.from_thread.run_sync(self.context.set_sdk_session, session.session_id)
            self._sent = True
            await session.send(self.request.prompt, **self.send_kwargs)
            await self._done
            if self._error is not None:
                raise self._error
        except (asyncio.CancelledError, MaxTurnsExceeded):
            if session is not None:
                await self._abort(session)
            raise
        finally:
            await self._stop(client)

    async def _open_session(self, client: CopilotClient) -> CopilotSession:
        kwargs: dict[str, Any] = {
            **self.session_kwargs,
            "on_permission_request": self._on_permission,
            "on_event": self._on_event,
        }
        if self.request.resume is not None:
            return await client.resume_session(self.request.resume, **kwargs)
        return await client.create_session(**kwargs)

    def _watch_transport(self, client: CopilotClient) -> None:
        """End the run when the CLI goes away (the SDK only fails pending requests)."""
        rpc = getattr(client, "_client", None)
        if rpc is None or not hasattr(rpc, "on_close"):
            return
        previous = rpc.on_close
        loop = asyncio.get_running_loop()

        def closed() -> None:  # on the SDK's reader thread
            if previous is not None:
                previous()
            why = getattr(rpc, "_process_exit_error", None) or "the connection closed"
            error = CopilotRunError(f"the Copilot CLI went away: {why}")
            with contextlib.suppress(RuntimeError):  # closed: the run is over anyway
                loop.call_soon_threadsafe(self._finish, error)

        rpc.on_close = closed

    async def _abort(self, session: CopilotSession) -> None:
        try:
            await asyncio.wait_for(session.abort(), self.driver.stop_timeout)
        except Exception as exc:
            logger.debug("copilot: abort failed: %r", exc)

    async def _stop(self, client: CopilotClient) -> None:
        """Stop the client and its CLI within bounds; never raises (the run's error wins)."""
        process = getattr(client, "_cli_process", None)
        try:
            await asyncio.wait_for(client.stop(), self.driver.stop_timeout)
        except Exception as exc:
            logger.debug("copilot: graceful stop failed (%r); killing the CLI", exc)
            try:
                await client.force_stop()
            except Exception as exc2:
                logger.warning("copilot: could not stop the Copilot CLI: %r", exc2)
        # The SDK leaves the child's pipes open; close them once it has exited.
        if process is not None and process.poll() is not None:
            for pipe in (process.stdin, process.stdout, process.stderr):
                if pipe is not None:
                    pipe.close()

    def _finish(self, error: BaseException | None) -> None:
        """The run is over (first word wins): idle, an error, max turns, the CLI gone."""
        done = self._done
        if done is None or done.done():
            return
        self._error = error
        done.set_result(None)

    # -- SDK callbacks (on the asyncio loop) ------------------------------------------------

    def _on_event(self, event: SessionEvent) -> None:
        kind = event.type.value
        if kind in _SHADOWED:
            self._follow(event, kind)
        try:
            trio.from_thread.run_sync(self.context.feed, event)
        except BaseException as exc:
            self._finish(exc)
            return
        if event.agent_id or not self._sent:
            return  # a sub-agent's, or from before the prompt
        data: Any = event.data
        if kind == "session.idle":
            mode = getattr(data.mode, "value", data.mode)
            if mode == "autopilot":
                return  # autopilot carries on by itself
            aborted = data.aborted is True
            self._finish(CopilotRunError("the Copilot turn was aborted") if aborted else None)
        elif kind == "session.error":
            self._finish(CopilotRunError(f"Copilot {data.error_type} error: {data.message}"))
        elif kind == "assistant.usage":
            self._count_call(data.finish_reason)

    def _count_call(self, finish_reason: str | None) -> None:
        limit = self.request.max_turns
        self._calls += 1
        if limit is None:
            return
        if self._calls > limit or (self._calls == limit and finish_reason in _WANTS_TOOLS):
            self._finish(MaxTurnsExceeded(f"the agent wanted more than {limit} model calls"))

    def _follow(self, event: SessionEvent, kind: str) -> None:
        """Translate what permission requests need, to ask busd what the adapter published."""
        for item in self._shadow.feed(event, 0.0):
            if type(item.event) is PermissionRequested:
                data: Any = event.data
                self._asked[item.event.request_id] = (data.permission_request, item.event)
        if kind == "permission.completed":
            self._asked.pop(getattr(event.data, "request_id", ""), None)

    def _asked_for(self, request: PermissionRequest) -> PermissionRequested:
        for request_id, (seen, asked) in self._asked.items():
            if seen is request:
                del self._asked[request_id]
                return asked
        # Not broadcast as an event we saw: describe it under an id of our own.
        data = {"requestId": f"copilot-{uuid.uuid4().hex}", "permissionRequest": request.to_dict()}
        raw = {"type": "permission.requested", "data": data}
        made = CopilotTranslator().feed(raw, 0.0)
        return next(e.event for e in made if type(e.event) is PermissionRequested)

    async def _on_permission(
        self, request: PermissionRequest, invocation: PermissionInvocation
    ) -> PermissionRequestResult:
        nursery = self.nursery
        assert nursery is not None
        asked = self._asked_for(request)
        answer: asyncio.Future[PermissionDecision] = asyncio.get_running_loop().create_future()
        trio.from_thread.run_sync(nursery.start_soon, self._ask, asked, answer)
        return _sdk_decision(await answer, request)


_SETSID: Final = "import os, sys; os.setsid(); os.execvp(sys.argv[1], sys.argv[1:])"


def client_env(driver: CopilotDriver, request: RunRequest) -> dict[str, str] | None:
    """The CLI's environment: the run's (its starter's) under the driver's configured ``env``.

    ``None`` (the daemon's) only when the client sent none and none is configured.
    """
    configured = driver.client_options.get("env")
    if request.env is None:
        return None if configured is None else dict(configured)
    return {**request.env, **(configured or {})}


def _own_session(
    driver: CopilotDriver, request: RunRequest, env: Mapping[str, str] | None
) -> tuple[str | None, tuple[str, ...]]:
    """``(path, args)`` that start the CLI leading a session (and process group) of its own.

    The SDK starts it in busd's process group, with no option to do
    otherwise, so a terminal's Ctrl-C on ``busd run`` killed the CLI
    mid-turn instead of letting busd abort the turn and stop it in order.
    A Python one-liner calls ``setsid()`` and execs the CLI in its place
    (same pid, which the SDK watches). The CLI is the one the SDK would
    pick: the run's ``options["cli_path"]``, else the driver's ``cli_path``, else
    ``COPILOT_CLI_PATH`` in the CLI's environment ``env`` (the run's); with
    none, the SDK's own runtime starts as the SDK starts it. A relative path
    is the run's ``cwd``'s, as it would be in its starter's shell.
    """
    environ = os.environ if env is None else env
    given = request.options.get("cli_path")
    cli = (given if isinstance(given, str) else None) or driver.cli_path
    cli = cli or environ.get("COPILOT_CLI_PATH")
    if cli and os.sep in cli:
        cli = os.path.join(request.cwd or os.getcwd(), cli)
    found = (
        None
        if not cli
        else cli
        if os.path.exists(cli)
        else shutil.which(cli, path=environ.get("PATH"))
    )
    if found is None:
        return cli or None, driver.cli_args  # the SDK says what is missing
    command = ("node", found) if found.endswith(".js") else (found,)
    return sys.executable, ("-c", _SETSID, *command, *driver.cli_args)


def _settle(answer: asyncio.Future[Any], value: object) -> None:
    if answer.done():
        return
    if value is None:
        answer.cancel()
    elif isinstance(value, BaseException):
        answer.set_exception(value)
    else:
        answer.set_result(value)


def _sdk_kwargs(request: RunRequest) -> tuple[dict[str, Any], dict[str, Any]]:
    """``create_session`` and ``send`` keyword arguments for a request; raises on bad ones.

    Streaming is on unless the options say otherwise: without it the SDK
    sends each answer whole at the end, and live frontends show nothing
    until then.
    """
    session: dict[str, Any] = {"streaming": True}
    if request.model:
        session["model"] = request.model
    if request.system_prompt is not None:
        session["system_message"] = {"mode": "append", "content": request.system_prompt}
    if request.cwd is not None:
        session["working_directory"] = request.cwd
    options = dict(request.options)
    options.pop("cli_path", None)  # the CLI to start (see _own_session), not a session option
    send = options.pop("send", None) or {}
    if not isinstance(send, Mapping):
        raise TypeError("options['send'] must be a mapping of CopilotSession.send arguments")
    reserved = _RESERVED & options.keys()
    if reserved:
        raise ValueError(f"the copilot driver sets {sorted(reserved)} itself")
    session.update(options)
    send_kwargs = dict(send)
    mode = request.permission_mode
    if mode is not None and mode != "default":
        if mode not in _AGENT_MODES:
            known = ", ".join(sorted(_AGENT_MODES))
            raise ValueError(f"unknown permission_mode {mode!r} for copilot (one of: {known})")
        send_kwargs.setdefault("agent_mode", mode)
    if request.max_turns is not None and request.max_turns < 1:
        raise ValueError("max_turns must be at least 1")
    return session, send_kwargs


def _sdk_decision(
    decision: PermissionDecision, request: PermissionRequest
) -> PermissionRequestResult:
    """busd's decision in the SDK's terms (``copilot.generated.rpc.PermissionDecision*``)."""
    from copilot.generated import rpc

    if decision.outcome == "allowed":
        if decision.option_id != "approve-for-session":
            return rpc.PermissionDecisionApproveOnce()
        approval: Any = None
        kind = getattr(request, "kind", None)
        if kind == "shell":
            names = [c.identifier for c in getattr(request, "commands", None) or ()]
            approval = rpc.PermissionDecisionApproveForSessionApprovalCommands(names)
        elif kind == "read":
            approval = rpc.PermissionDecisionApproveForSessionApprovalRead()
        elif kind == "write":
            approval = rpc.PermissionDecisionApproveForSessionApprovalWrite()
        return rpc.PermissionDecisionApproveForSession(approval=approval)
    if decision.outcome == "denied":
        return rpc.PermissionDecisionReject(feedback=decision.reason)
    return rpc.PermissionDecisionUserNotAvailable()
