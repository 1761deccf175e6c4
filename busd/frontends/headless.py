"""Headless runs: ``busd run`` for CI jobs and scripts.

One prompt, one run, one exit code. :func:`run_headless` talks to the daemon
at the usual socket, or, when nobody listens there, to a daemon it starts in
its own nursery on a private temporary socket (:func:`in_process_daemon`):
either way through the same client code path, so a CI job and a developer's
terminal see the same events. It subscribes before it starts the run (no
event of the run can slip past), prints the run's events (JSON Lines of
envelopes, or readable text with :class:`PrettyPrinter`) until
``busd.run.finished``. Its ``--deny``/``--allow`` tool-name globs
(:class:`ToolRules`: deny rules first, and a tool no rule names is denied,
so an unattended agent fails closed) travel with ``start_run`` as the run's
permission rules: the daemon decides every request by them before any
frontend is asked, so an attached frontend that allows everything cannot
win a race against ``--deny``. It still answers each request it sees from
the same rules, for a daemon of an older busd that ignores the run's rules
(with a current one that answer is ``already_resolved`` and says nothing).
SIGINT and SIGTERM cancel the run and still wait for its summary.

The pure parts (rules, option picking, exit codes, rendering) take no I/O
and are tested on their own; the Trio shell is :func:`run_headless`.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import signal
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import AsyncExitStack
from typing import Any, Final

import msgspec
import trio

from ..client import Client, ConnectionLost, DaemonNotRunning, RequestFailed, connect
from ..core.events import (
    Envelope,
    Event,
    PermissionRequested,
    PermissionResolved,
    RunCancelled,
    RunFinished,
    RunStarted,
    SessionError,
    SessionRetry,
    SessionWarning,
    StreamingStats,
    TextComplete,
    TextDelta,
    ThinkingComplete,
    ThinkingDelta,
    ToolComplete,
    ToolStart,
)
from ..core.permissions import PermissionRule
from ..wire.address import EndpointError, resolve_socket_path
from .humanize import format_tokens, format_took, format_who, summary_line
from .local import StartLocal
from .view import models_line

__all__ = [
    "CLIENT_NAME",
    "EXIT_AGENT_ERROR",
    "EXIT_CANCELLED",
    "EXIT_OK",
    "EXIT_TIMED_OUT",
    "EXIT_USAGE",
    "HeadlessRun",
    "PrettyPrinter",
    "RunView",
    "ToolRules",
    "Verdict",
    "exit_code",
    "parse_option",
    "reply_for",
    "run_headless",
    "summary_lines",
]

logger = logging.getLogger("busd.headless")

CLIENT_NAME: Final = "busd-run"
"""The client name ``busd run`` connects with (``by`` of the decisions it makes)."""

EXIT_OK: Final = 0
EXIT_AGENT_ERROR: Final = 1
"""The run ended ``error`` (or busd itself failed: the daemon went away, ...)."""
EXIT_USAGE: Final = 2
"""Bad flags, or the daemon refused to start the run (unknown adapter, busy session)."""
EXIT_TIMED_OUT: Final = 124
"""The watchdog ended the run, as coreutils' ``timeout`` exits."""
EXIT_CANCELLED: Final = 130
"""Cancelled (SIGINT, SIGTERM, or another client), as a shell reports a Ctrl-C."""

_EXIT_CODES: Final = {
    "ok": EXIT_OK,
    "error": EXIT_AGENT_ERROR,
    "timed_out": EXIT_TIMED_OUT,
    "cancelled": EXIT_CANCELLED,
}
_WINDOW_MS: Final = 16


def exit_code(status: str) -> int:
    """The process exit code for a ``busd.run.finished`` status."""
    return _EXIT_CODES.get(status, EXIT_AGENT_ERROR)


def parse_option(text: str) -> tuple[str, Any]:
    """``key=value``, the value parsed as JSON when it is JSON (``max_tokens=512`` is an int).

    :raises ValueError: no ``=``, or an empty key.
    """
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"{text!r} is not key=value")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


# -- permissions -------------------------------------------------------------------------


class Verdict(msgspec.Struct, frozen=True):
    """A rule decision: whether the tool may run, and why, in the words of the flags."""

    allowed: bool
    reason: str


class ToolRules(msgspec.Struct, frozen=True, kw_only=True):
    """``--deny`` and ``--allow`` tool-name globs (``Bash``, ``mcp__*``).

    Deny rules are checked first; then allow rules; a tool that no rule
    names is denied. Globs are case-sensitive, as tool names are.
    """

    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()

    def decide(self, tool: str) -> Verdict:
        for pattern in self.deny:
            if fnmatch.fnmatchcase(tool, pattern):
                return Verdict(False, f"--deny {pattern}")
        for pattern in self.allow:
            if fnmatch.fnmatchcase(tool, pattern):
                return Verdict(True, f"--allow {pattern}")
        return Verdict(False, f"no --allow rule matches {tool}: busd run fails closed")

    def permission_rules(self) -> tuple[PermissionRule, ...]:
        """The same decisions as daemon rules, for ``start_run``: they bind the run.

        Deny globs, then allow globs, then a rule that denies the rest (fail closed).
        """
        return (
            *(PermissionRule(action="deny", tool=p, reason=f"--deny {p}") for p in self.deny),
            *(PermissionRule(action="allow", tool=p, reason=f"--allow {p}") for p in self.allow),
            PermissionRule(action="deny", reason="no --allow rule matches: busd run fails closed"),
        )


def reply_for(request: PermissionRequested, allowed: bool) -> tuple[str | None, bool | None]:
    """``(option_id, allow)`` for ``permission_reply``: the one-time option, else ``allow=``.

    Only ``allow_once``/``reject_once`` are chosen: a headless run never
    grants "always" on the user's behalf.
    """
    kind = "allow_once" if allowed else "reject_once"
    for option in request.options:
        if option.kind == kind:
            return option.id, None
    return None, allowed


# -- which events are ours -----------------------------------------------------------------


class RunView:
    """Picks the envelopes of one run out of a subscription, before and after its id is known.

    The subscription is live before ``start_run`` is sent, so the run's first
    events may arrive before its id does: they are held (only envelopes that
    belong to some run) and handed over by :meth:`start`.
    """

    __slots__ = ("_early", "finished", "run_id")

    def __init__(self) -> None:
        self.run_id: str | None = None
        self.finished: RunFinished | None = None
        self._early: list[Envelope[Event]] = []

    def start(self, run_id: str) -> list[Envelope[Event]]:
        """The run's id is known: its envelopes that came early, in order."""
        self.run_id = run_id
        early, self._early = self._early, []
        return self._ours(early)

    def observe(self, envelopes: Iterable[Envelope[Event]]) -> list[Envelope[Event]]:
        """The run's envelopes among ``envelopes`` (none after its ``busd.run.finished``)."""
        if self.run_id is None:
            self._early.extend(e for e in envelopes if e.run_id is not None)
            return []
        return self._ours(envelopes)

    def _ours(self, envelopes: Iterable[Envelope[Event]]) -> list[Envelope[Event]]:
        out: list[Envelope[Event]] = []
        run_id = self.run_id
        for envelope in envelopes:
            if self.finished is not None:
                break
            if envelope.run_id != run_id:
                continue
            out.append(envelope)
            if type(envelope.event) is RunFinished:
                self.finished = envelope.event
        return out


# -- rendering -------------------------------------------------------------------------------


def summary_lines(finished: RunFinished) -> list[str]:
    """``✻ Worked for 3s · ↓ 112 tokens`` and ``ok · 69 in · 112 out · $0.0012``.

    An output count that includes busd's estimate (a run cut short after its
    last count) reads ``~``, as on the live line: ``↓ ~16 tokens``, ``~16 out``.
    A run that used more than one model gets one more line, each model's
    share: ``claude-sonnet-4-5 412 out · claude-haiku-4-5 3 out``.
    """
    usage = finished.usage
    stats = StreamingStats(
        elapsed_s=finished.duration_s,
        output_tokens=usage.output_tokens,
        output_estimated=finished.output_estimated,
        thinking_s=finished.thinking_s,
    )
    approx = "~" if finished.output_estimated else ""
    parts = [finished.status.replace("_", " ")]
    parts.append(f"{format_tokens(usage.input_tokens)} in")
    parts.append(f"{approx}{format_tokens(usage.output_tokens)} out")
    if usage.reasoning_tokens:
        parts.append(f"{format_tokens(usage.reasoning_tokens)} reasoning")
    if usage.cache_read_tokens:
        parts.append(f"{format_tokens(usage.cache_read_tokens)} cache read")
    if usage.cache_write_tokens:
        parts.append(f"{format_tokens(usage.cache_write_tokens)} cache write")
    if usage.cost_usd is not None:
        parts.append(f"${usage.cost_usd:.4f}")
    lines = [summary_line(stats), " · ".join(parts)]
    models = models_line(finished.models)
    if models is not None:
        lines.append(models)
    if finished.error:
        lines.append(f"error: {finished.error}")
    return lines


def _brief(value: object, limit: int = 80) -> str:
    text = value if isinstance(value, str) else msgspec.json.encode(value).decode()
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class PrettyPrinter:
    """One run's envelopes as a terminal transcript: text as it streams, tools, permissions.

    :meth:`render` returns what to write for one envelope (often ``""``); text
    deltas are written as they come, and anything else starts on a fresh line.
    """

    __slots__ = ("_mid_line", "_requests", "_thinking", "_tools")

    def __init__(self) -> None:
        self._mid_line = False
        self._requests: dict[str, PermissionRequested] = {}
        self._tools: dict[str, str] = {}
        self._thinking: set[str] = set()

    def render(self, envelope: Envelope[Event]) -> str:
        event = envelope.event
        if type(event) is TextDelta:
            if not event.text:
                return ""
            self._mid_line = not event.text.endswith("\n")
            return event.text
        if type(event) is TextComplete:
            return self._lines("[stopped]" if event.stopped else None)
        return self._lines(*self._describe(event))

    def remember(self, request: PermissionRequested) -> None:
        """Note a request's tool, so its decision can name it (JSON output renders nothing)."""
        self._requests[request.request_id] = request

    def decision(self, resolved: PermissionResolved) -> str:
        """``allowed Read (by busd-run: --allow Read)``: one line, without the glyph."""
        request = self._requests.get(resolved.request_id)
        tool = request.tool if request is not None else resolved.request_id
        who = format_who(resolved.by) if resolved.by else None
        why = ": ".join(part for part in (who, resolved.reason) if part)
        return f"{resolved.outcome} {tool}" + (f" ({'by ' + why})" if why else "")

    def _lines(self, *lines: str | None) -> str:
        text = "".join(f"{line}\n" for line in lines if line is not None)
        if not text:
            return ""
        if self._mid_line:
            self._mid_line = False
            return "\n" + text
        return text

    def _describe(self, event: Event) -> list[str | None]:
        if type(event) is ThinkingDelta:
            if event.message_id in self._thinking:
                return []
            self._thinking.add(event.message_id)
            return ["✶ Thinking…"]
        if type(event) is ThinkingComplete:
            if event.duration_s is None or event.duration_s < 1:
                return []
            return [f"✻ Thought for {format_took(event.duration_s)}"]
        if type(event) is ToolStart:
            self._tools[event.tool_call_id] = event.name
            return [f"⏺ {event.name}({_brief(event.input) if event.input else ''})"]
        if type(event) is ToolComplete:
            name = event.name or self._tools.get(event.tool_call_id, event.tool_call_id)
            took = f" in {event.duration_s:.1f}s" if event.duration_s is not None else ""
            if event.status == "ok":
                return [f"  ⎿ {name} ok{took}"]
            detail = f": {_brief(event.error)}" if event.error else ""
            return [f"  ⎿ {name} {event.status.replace('_', ' ')}{took}{detail}"]
        if type(event) is PermissionRequested:
            self.remember(event)
            what = event.title or (_brief(event.input) if event.input else "")
            return [f"? {event.tool} asks permission" + (f": {what}" if what else "")]
        if type(event) is PermissionResolved:
            glyph = "✓" if event.outcome == "allowed" else "✗"
            return [f"{glyph} {self.decision(event)}"]
        if type(event) is SessionError:
            return [f"✗ error: {event.message}"]
        if type(event) is SessionWarning:
            return [f"! {event.message}"]
        if type(event) is SessionRetry:
            return [f"↻ retry {event.attempt}" + (f": {event.message}" if event.message else "")]
        if type(event) is RunStarted:
            model = f" ({event.model})" if event.model else ""
            return [f"▶ {event.adapter}{model}"]
        if type(event) is RunCancelled:
            return [f"⏹ cancelled by {format_who(event.by or 'busd')}"]
        if type(event) is RunFinished:
            return list(summary_lines(event))
        return []


# -- the Trio shell ------------------------------------------------------------------------------


class HeadlessRun(msgspec.Struct, frozen=True, kw_only=True):
    """What ``busd run`` was asked to do (its flags)."""

    adapter: str
    prompt: str
    driver: str | None = None
    """``None``: the driver named like the adapter."""
    model: str | None = None
    session_id: str | None = None
    system_prompt: str | None = None
    cwd: str | None = None
    max_turns: int | None = None
    options: dict[str, Any] = {}
    env: dict[str, str] | None = None
    """The agent's environment (``busd run``'s own); ``None``: the daemon's."""
    context_window: int | None = None
    """The session's context window (``--context-window``); ``None``: the model table's."""
    rules: ToolRules = ToolRules()
    watchdog: float | None = None
    """For the in-process daemon only; a running daemon keeps its own."""
    socket_path: str | None = None


Write = Callable[[str], None]


async def run_headless(
    spec: HeadlessRun, *, out: Write, err: Write, pretty: bool, start_local: StartLocal
) -> int:
    """Run ``spec`` to its end and return the exit code (see the ``EXIT_*`` constants).

    When no daemon listens at the socket, ``start_local`` serves one for the
    run (the CLI passes :func:`busd.daemon.embedded.serve_private`).

    ``out`` gets the transcript; ``err`` gets notes (with JSON output also
    the permission decisions and the summary, so a CI log stays readable
    while stdout stays pure JSON Lines).

    :raises ConnectionLost: the daemon went away mid-run.
    """
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with AsyncExitStack() as stack:
            try:
                path = resolve_socket_path(spec.socket_path)
            except EndpointError as exc:
                if spec.socket_path is not None:
                    err(f"busd: {exc}\n")
                    return EXIT_USAGE
                path = None  # no default socket here (no XDG_RUNTIME_DIR): nothing runs
            client: Client | None = None
            if path is not None:
                try:
                    client = await stack.enter_async_context(connect(path, client=CLIENT_NAME))
                except DaemonNotRunning:
                    client = None
            if client is None:
                try:
                    private = await stack.enter_async_context(start_local(watchdog=spec.watchdog))
                except EndpointError as exc:
                    err(f"busd: cannot start an in-process daemon: {exc}\n")
                    return EXIT_AGENT_ERROR
                client = await stack.enter_async_context(connect(private.path, client=CLIENT_NAME))
            elif spec.watchdog is not None:
                err(f"busd: --watchdog ignored: the daemon at {path} keeps its own\n")
            follower = _Follower(client, spec, out=out, err=err, pretty=pretty)
            return await follower.run(signals)


class _Follower:
    """Starts the run, prints its events, answers its permissions, handles signals."""

    def __init__(
        self, client: Client, spec: HeadlessRun, *, out: Write, err: Write, pretty: bool
    ) -> None:
        self.client = client
        self.spec = spec
        self.out = out
        self.err = err
        self.printer = PrettyPrinter()
        self.pretty = pretty
        self.view = RunView()
        self.refused: RequestFailed | None = None
        self.interrupted = 0
        self.following = trio.CancelScope()
        self._encoder = msgspec.json.Encoder()
        self._nursery: trio.Nursery | None = None

    async def run(self, signals: AsyncIterator[int]) -> int:
        lost: ConnectionLost | None = None
        async with (
            self.client.subscribe([">"], owned_only=True, window_ms=_WINDOW_MS) as sub,
            trio.open_nursery() as nursery,
        ):
            self._nursery = nursery
            nursery.start_soon(self._start)
            nursery.start_soon(self._on_signals, signals)
            try:
                with self.following:
                    async for batch in sub:
                        self._show(self.view.observe(batch.events))
                        if self.view.finished is not None:
                            break
            except ConnectionLost as exc:
                lost = exc  # raised below, not wrapped in the nursery's group
            nursery.cancel_scope.cancel()
        if lost is not None:
            raise lost
        if self.refused is not None:
            self.err(f"busd: the daemon refused the run: {self.refused}\n")
            return EXIT_USAGE
        finished = self.view.finished
        if finished is None:
            if self.interrupted:
                self.err("busd: interrupted again: not waiting for the run to finish\n")
                return EXIT_CANCELLED
            raise ConnectionLost("closed", "the subscription ended before the run did")
        if not self.pretty:
            self.err("".join(f"busd: {line}\n" for line in summary_lines(finished)))
        return exit_code(finished.status)

    async def _start(self) -> None:
        spec = self.spec
        try:
            started = await self.client.start_run(
                spec.adapter,
                spec.prompt,
                driver=spec.driver,
                session_id=spec.session_id,
                model=spec.model,
                system_prompt=spec.system_prompt,
                cwd=spec.cwd,
                max_turns=spec.max_turns,
                options=spec.options,
                permission_rules=spec.rules.permission_rules(),
                env=spec.env,
                context_window=spec.context_window,
            )
        except RequestFailed as exc:
            self.refused = exc
            self.following.cancel()
            return
        except ConnectionLost:
            return  # the subscription says so too
        self._show(self.view.start(started["run_id"]))
        if self.interrupted:
            await self._cancel()

    async def _on_signals(self, signals: AsyncIterator[int]) -> None:
        async for signum in signals:
            self.interrupted += 1
            if self.interrupted > 1:
                self.following.cancel()
                return
            name = signal.Signals(signum).name
            self.err(f"busd: {name}: cancelling the run (again to stop waiting)\n")
            if self.view.run_id is not None:
                await self._cancel()

    async def _cancel(self) -> None:
        assert self.view.run_id is not None
        try:
            await self.client.cancel_run(self.view.run_id, reason="busd run was interrupted")
        except RequestFailed as exc:
            logger.debug("cancel_run: %s", exc)  # it ended meanwhile: its summary follows
        except ConnectionLost:
            pass

    def _show(self, envelopes: Sequence[Envelope[Event]]) -> None:
        if not envelopes:
            return
        chunks: list[str] = []
        for envelope in envelopes:
            event = envelope.event
            if self.pretty:
                chunks.append(self.printer.render(envelope))
            else:
                chunks.append(self._encoder.encode(envelope).decode())
                chunks.append("\n")
                if type(event) is PermissionRequested:
                    self.printer.remember(event)
                elif type(event) is PermissionResolved:
                    self.err(f"busd: permission {self.printer.decision(event)}\n")
            if type(event) is PermissionRequested:
                assert self._nursery is not None
                self._nursery.start_soon(self._answer, event)
        self.out("".join(chunks))

    async def _answer(self, request: PermissionRequested) -> None:
        """Answer from the rules, for a daemon that ignored them (see the module docstring)."""
        verdict = self.spec.rules.decide(request.tool)
        option_id, allow = reply_for(request, verdict.allowed)
        try:
            await self.client.reply_permission(
                request.request_id, option_id=option_id, allow=allow, reason=verdict.reason
            )
        except RequestFailed as exc:  # another answer won: normal; anything else is said
            if exc.code != "already_resolved":
                self.err(f"busd: could not answer {request.request_id}: {exc}\n")
        except ConnectionLost:
            pass
