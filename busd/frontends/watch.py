"""``busd watch``: the terminal frontend, a thin Trio shell over :mod:`busd.frontends.screen`.

It subscribes to everything the daemon still holds (``since_seq=0``), so a
frontend attached late shows the runs already under way, folds each batch
into :class:`~busd.frontends.view.Views` (through a daemon restart: the
client reconnects and resumes) and draws them: a rich ``Live`` screen
refreshed by a Trio task (no rich thread), or log lines (``--plain``, and
whenever stdout is not a terminal).

What the keys do is decided sans-I/O by :class:`WatchState`: answers, a
cancel that asks first, scrolling (a :class:`~busd.frontends.screen.Viewport`
the screen resolves), switching sessions, and where the focus goes.

Keys are read from the terminal in cbreak mode through a
:class:`trio.lowlevel.FdStream`. Trio puts the file it reads in
non-blocking mode, and in a terminal stdin and stdout usually share one open
file, so a plain ``dup`` of stdin would make rich's writes to stdout
non-blocking too; the tty is therefore opened afresh by name (its own open
file), falling back to a ``dup`` when it has no name.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import termios
import time
import tty
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import trio
from rich.console import Console
from rich.live import Live

from ..client import Client, ClientSubscription, ConnectionLost, RequestFailed
from ..client import connect as busd_connect
from ..core.events import Envelope, Event, RunFinished, SessionIdle
from .screen import Screen, Viewport
from .tui import PlainLog, reply_keys
from .view import SessionView, Views

__all__ = [
    "Cancel",
    "Quit",
    "Reply",
    "WatchState",
    "default_name",
    "help_for",
    "parse_keys",
    "silence",
    "watch",
]

REFRESH_S = 0.1
"""The live screen is redrawn at most this often (and only while something changes)."""
STATUS_TICK_S = 0.25
"""How often plain mode looks whether a status line moved on."""
MESSAGE_S = 8.0
"""How long a message (an answer, a refusal) stays on the screen."""


def default_name() -> str:
    """``watch@host:pid``: the name others see as ``by`` when this frontend answers."""
    return f"watch@{socket.gethostname()}:{os.getpid()}"


# -- keys and what they do (sans-I/O) -------------------------------------------------

_ESCAPES = {
    b"\x1b[Z": "backtab",
    b"\x1b[C": "right",
    b"\x1b[D": "left",
    b"\x1b[A": "up",
    b"\x1b[B": "down",
    b"\x1bOA": "up",
    b"\x1bOB": "down",
    b"\x1b[5~": "pageup",
    b"\x1b[6~": "pagedown",
    **dict.fromkeys((b"\x1b[H", b"\x1bOH", b"\x1b[1~", b"\x1b[7~"), "home"),
    **dict.fromkeys((b"\x1b[F", b"\x1bOF", b"\x1b[4~", b"\x1b[8~"), "end"),
}


def parse_keys(data: bytes) -> list[str]:
    """Key names from what the terminal sent: ``y``, ``tab``, ``backtab``, ``]``, ...

    Escape sequences are consumed whole (so the ``[`` of an arrow key is not
    taken for the ``[`` key); unknown ones are dropped.
    """
    keys: list[str] = []
    i = 0
    while i < len(data):
        if data[i] == 0x1B:
            if data[i + 1 : i + 2] in (b"[", b"O"):
                j = i + 2
                while j < len(data) and not 0x40 <= data[j] <= 0x7E:
                    j += 1
                sequence = data[i : j + 1]
                name = _ESCAPES.get(sequence)
                if name is not None:
                    keys.append(name)
                i = j + 1
                continue
            keys.append("escape")
            i += 1
            continue
        char = data[i]
        i += 1
        if char == 0x09:
            keys.append("tab")
        elif char in (0x0D, 0x0A):
            keys.append("enter")
        elif 0x20 <= char < 0x7F:
            keys.append(chr(char))
    return keys


@dataclass(frozen=True, slots=True)
class Reply:
    request_id: str
    tool: str
    label: str
    option_id: str | None = None
    allow: bool | None = None


@dataclass(frozen=True, slots=True)
class Cancel:
    run_id: str
    session_id: str


@dataclass(frozen=True, slots=True)
class Quit:
    pass


Action = Reply | Cancel | Quit

HELP = [
    ("y", "allow"),
    ("a", "allow always"),
    ("n", "deny"),
    ("c", "cancel run"),
    ("Tab ] [", "session"),
    ("↑↓ PgUp PgDn Home End", "scroll"),
    ("q", "quit"),
]
"""Every key of the footer; it shows those that do something in the focused session."""

_SCROLL = {
    "up": ("scroll", -1),
    "k": ("scroll", -1),
    "down": ("scroll", 1),
    "j": ("scroll", 1),
    "pageup": ("page", -1),
    "pagedown": ("page", 1),
    " ": ("page", 1),
}


def help_for(state: WatchState, views: Views) -> list[tuple[str, str]]:
    """The keys that do something now: answers while a request waits, ``c`` while a run runs."""
    if state.confirm is not None:
        return [("c y", "yes, cancel the run"), ("any other key", "keep it running")]
    view = state.focused(views)
    pending = view.pending_permissions() if view is not None else []
    offered = {key.key for key in reply_keys(pending[0])} if pending else set()
    running = view is not None and view.run_status == "running"
    several = len(state.visible(views)) > 1
    return [
        (key, label)
        for key, label in HELP
        if (key not in ("y", "a", "n") or key in offered)
        and (key != "c" or running)
        and (key != "Tab ] [" or several)
    ]


@dataclass
class WatchState:
    """Which sessions are shown, which one has the focus, the scroll and the message line."""

    only: tuple[str, ...] = ()
    focus: str | None = None
    follow: bool = True
    """Until the user switches, answers, cancels or scrolls, the focus follows the work."""
    message: str | None = None
    message_until: float = 0.0
    offline: str | None = None
    """While the daemon is away: why, shown until it is back (it does not time out)."""
    viewport: Viewport = field(default_factory=Viewport)
    """Where the focused session's transcript is scrolled to."""
    confirm: Cancel | None = None
    """A cancel asked for with ``c``, waiting for ``c`` or ``y`` (any other key: not)."""
    cancelling: dict[str, str] = field(default_factory=dict)
    """Runs cancelled from here, by run id, until their end event: what the message says."""

    def visible(self, views: Views) -> list[str]:
        if not self.only:
            return list(views.sessions)
        return [s for s in views.sessions if s in self.only]

    def focused(self, views: Views) -> SessionView | None:
        return views.sessions.get(self.focus) if self.focus is not None else None

    def say(self, text: str, now: float) -> None:
        self.message, self.message_until = text, now + MESSAGE_S

    def current_message(self, now: float) -> str | None:
        """What the message line says: the lasting states first, then the last message."""
        if self.offline is not None:
            return self.offline
        if self.confirm is not None:
            return f"cancel {self.confirm.run_id}? c or y: cancel it · any other key: keep it"
        if self.cancelling:
            return f"cancelling {', '.join(self.cancelling)}…"
        return self.message if now < self.message_until else None

    def lasting(self) -> bool:
        """A message that stays until something happens is showing."""
        return self.offline is not None or self.confirm is not None or bool(self.cancelling)

    def ended(self, run_ids: set[str]) -> None:
        """These runs ended: a cancel of theirs is no longer under way."""
        for run_id in run_ids & set(self.cancelling):
            del self.cancelling[run_id]
        if self.confirm is not None and self.confirm.run_id in run_ids:
            self.confirm = None

    def settle(self, views: Views, changed: set[str]) -> None:
        """Keep the focus on a shown session; while following, move it where it is needed.

        A session asking for permission wins, then one that is working,
        unless the focused session itself still waits for an answer.
        """
        ids = self.visible(views)
        if not ids:
            self._focus(None)
            return
        if self.focus not in ids:
            self._focus(ids[0])
        if not self.follow:
            return
        current = views.sessions[self.focus] if self.focus is not None else None
        if current is not None and current.pending_permissions():
            return
        candidates = [s for s in ids if s in changed]
        asking = [s for s in candidates if views.sessions[s].pending_permissions()]
        if asking:
            self._focus(asking[-1])
        elif current is None or not current.busy:
            busy = [s for s in candidates if views.sessions[s].busy]
            if busy:
                self._focus(busy[-1])

    def _focus(self, session_id: str | None) -> None:
        if session_id != self.focus:
            self.focus = session_id
            self.viewport.end()  # another transcript: its newest lines

    def switch(self, views: Views, step: int) -> None:
        ids = self.visible(views)
        if not ids:
            return
        self.follow = False
        index = ids.index(self.focus) if self.focus in ids else 0
        self._focus(ids[(index + step) % len(ids)])

    def action_for(self, key: str, views: Views, now: float) -> Action | None:
        """What ``key`` asks for; switching, scrolling and refusals are handled here.

        Acting on the focused session (answering, cancelling, scrolling) stops
        the focus from following the work elsewhere: it stays where the user is.
        """
        if self.confirm is not None:
            return self._confirmed(key, views, now)
        if key in ("q", "Q"):
            return Quit()
        if key in ("tab", "]", "right"):
            self.switch(views, 1)
            return None
        if key in ("backtab", "[", "left"):
            self.switch(views, -1)
            return None
        if key in _SCROLL or key in ("home", "g", "end", "G"):
            self.follow = False
            how, step = _SCROLL.get(key, ("", 0))
            if how == "scroll":
                self.viewport.scroll(step)
            elif how == "page":
                self.viewport.page(step)
            elif key in ("home", "g"):
                self.viewport.home()
            else:
                self.viewport.end()
            return None
        view = self.focused(views)
        if key in ("y", "a", "n"):
            pending = view.pending_permissions() if view is not None else []
            if not pending:
                self.say("no permission request waiting in this session", now)
                return None
            block = pending[0]
            for choice in reply_keys(block):
                if choice.key == key:
                    self.follow = False
                    return Reply(
                        request_id=block.request_id,
                        tool=block.tool,
                        label=choice.label,
                        option_id=choice.option_id,
                        allow=choice.allow,
                    )
            self.say(f"{block.tool}: this request offers no “allow always”", now)
            return None
        if key == "c":
            if view is None or view.run_status != "running" or view.run_id is None:
                self.say("no run in progress in this session", now)
                return None
            self.follow, self.message = False, None  # the question replaces any message
            self.confirm = Cancel(run_id=view.run_id, session_id=view.session_id)
        return None

    def _confirmed(self, key: str, views: Views, now: float) -> Action | None:
        cancel, self.confirm = self.confirm, None
        assert cancel is not None
        if key not in ("c", "y"):
            self.say(f"{cancel.run_id} keeps running", now)
            return None
        view = views.sessions.get(cancel.session_id)
        if view is None or view.run_id != cancel.run_id or view.run_status != "running":
            self.say(f"{cancel.run_id} has already ended", now)
            return None
        self.cancelling[cancel.run_id] = cancel.session_id
        self.message = None
        return cancel


# -- the shell ------------------------------------------------------------------------


@dataclass
class _Watcher:
    client: Client
    sub: ClientSubscription
    state: WatchState
    exit_when_idle: bool
    views: Views = field(default_factory=Views)
    changed: trio.Event = field(default_factory=trio.Event)
    code: int = 0
    error: ConnectionLost | None = None
    head: int = 0

    async def receive(
        self, fold: Callable[[list[Envelope[Event]]], set[str]], done: trio.CancelScope
    ) -> None:
        """Fold every batch with ``fold``; a lost daemon is kept in ``error`` for the caller."""
        try:
            async for batch in self.sub:
                if batch.gap is not None:
                    start, end = batch.gap
                    self.state.say(f"events {start}..{end} are no longer held", time.time())
                if batch.events and batch.events[0].seq <= self.head:
                    self.views = Views()  # a daemon without a journal came back: it numbers afresh
                    self.state.say("the daemon restarted without its history", time.time())
                if batch.events:
                    self.head = batch.events[-1].seq
                changed = fold(batch.events)
                self.state.settle(self.views, changed)
                self.state.ended(
                    {
                        e.run_id
                        for e in batch.events
                        if isinstance(e.event, RunFinished) and e.run_id
                    }
                )
                self.changed.set()
                if self.exit_when_idle and self._went_idle(batch.events):
                    self.code = 0
                    done.cancel()
                    return
        except ConnectionLost as exc:
            self.error = exc
        else:
            self.error = ConnectionLost("closed", "the daemon closed the connection")
        done.cancel()

    def _went_idle(self, envelopes: list[Envelope[Event]]) -> bool:
        """After a run ends or a session goes idle, is every shown session at rest?"""
        shown = set(self.state.visible(self.views))
        ended = any(
            isinstance(e.event, RunFinished | SessionIdle) and e.session_id in shown
            for e in envelopes
        )
        if not ended:
            return False
        return all(
            not view.busy and not view.pending_permissions() and view.run_status != "running"
            for sid, view in self.views.sessions.items()
            if sid in shown
        )

    async def connection(self, note: Callable[[str], None]) -> None:
        """Say when the daemon goes away and when it is back (the client reconnects)."""
        while True:
            stats = await self.client.wait_connection_change()
            if stats.connected:
                self.state.offline = None
                self.state.say("the daemon is back", time.time())
                note("busd: the daemon is back")
            else:
                why = stats.last_lost or "closed"
                self.state.offline = f"lost the daemon ({why}); reconnecting…"
                note(f"busd: {self.state.offline}")
            self.changed.set()

    def busy(self) -> bool:
        shown = self.state.visible(self.views)
        return any(self.views.sessions[s].busy for s in shown)

    async def signals(self, done: trio.CancelScope) -> None:
        """Ctrl-C and SIGTERM end the watch cleanly; a resized terminal is redrawn."""
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGWINCH) as received:
            async for signum in received:
                if signum == signal.SIGWINCH:
                    self.changed.set()
                    continue
                self.code = 130 if signum == signal.SIGINT else 143
                done.cancel()
                return


async def watch(
    path: Path,
    *,
    name: str,
    sessions: tuple[str, ...] = (),
    plain: bool = False,
    exit_when_idle: bool = False,
    out: TextIO | None = None,
    header: str | None = None,
) -> int:
    """Watch until ``q``, a signal or (with ``exit_when_idle``) the end of the work.

    Output that is not a terminal gets plain lines whatever ``plain`` says.
    ``header`` is a line the live screen keeps under its title (plain mode
    leaves it to the caller).

    When the daemon goes away the watch says so and reconnects, resuming
    from the last ``seq`` it showed (a daemon that lost its history starts
    the screen afresh).

    :raises DaemonNotRunning: nobody listens at ``path``.
    :raises ConnectionLost: the daemon refused the connection.
    """
    stream = out if out is not None else sys.stdout
    plain = plain or not stream.isatty()
    state = WatchState(only=sessions)
    async with (
        busd_connect(path, client=name, reconnect=True) as client,
        client.subscribe(
            [">"], sessions=sessions or None, since_seq=0, window_ms=33, deltas="merged"
        ) as sub,
    ):
        watcher = _Watcher(client, sub, state, exit_when_idle)
        if plain:
            await _plain(watcher, stream)
        else:
            await _live(watcher, stream, header)
    if watcher.error is not None:
        raise watcher.error
    return watcher.code


async def _plain(watcher: _Watcher, stream: TextIO) -> None:
    log = PlainLog()
    done = trio.CancelScope()

    def write(lines: list[str]) -> None:
        if lines and not done.cancel_called:
            try:
                stream.write("".join(f"{line}\n" for line in lines))
                stream.flush()
            except BrokenPipeError:  # `busd watch --plain | head`: the reader has had enough
                silence(stream)
                done.cancel()

    def fold(envelopes: list[Envelope[Event]]) -> set[str]:
        """Fold and log one envelope at a time, so the lines keep the events' order."""
        changed: set[str] = set()
        lines: list[str] = []
        only = watcher.state.only
        now = time.time()
        for envelope in envelopes:
            view = watcher.views.apply(envelope)
            if view is not None and (not only or view.session_id in only):
                changed.add(view.session_id)
                lines += log.lines(watcher.views, [view.session_id], now)
        write(lines)
        return changed

    async def ticker() -> None:
        while True:
            if watcher.busy():
                with trio.move_on_after(STATUS_TICK_S):
                    await watcher.changed.wait()
            else:
                await watcher.changed.wait()
            watcher.changed = trio.Event()
            shown = watcher.state.visible(watcher.views)
            write(log.status_lines(watcher.views, shown, time.time()))

    with done:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watcher.signals, nursery.cancel_scope)
            nursery.start_soon(ticker)
            nursery.start_soon(watcher.connection, _to_stderr)
            nursery.start_soon(watcher.receive, fold, nursery.cancel_scope)


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def silence(stream: TextIO) -> None:
    """After a broken pipe, send what is still buffered nowhere (no error at exit)."""
    with contextlib.suppress(OSError, ValueError):  # not a real file: nothing to silence
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)


async def _live(watcher: _Watcher, stream: TextIO, header: str | None) -> None:
    state = watcher.state
    keyboard = _open_keyboard()
    console = Console(file=stream)

    def screen() -> Screen:
        now = time.time()
        return Screen(
            watcher.views,
            state.visible(watcher.views),
            state.focus,
            now,
            message=state.current_message(now),
            keys=keyboard is not None,
            help=help_for(state, watcher.views) if keyboard is not None else [("Ctrl-C", "quit")],
            header=header,
            viewport=state.viewport,
        )

    async def refresher(live: Live) -> None:
        while True:
            if watcher.busy() or time.time() < state.message_until:
                with trio.move_on_after(REFRESH_S):
                    await watcher.changed.wait()
            else:
                await watcher.changed.wait()
            watcher.changed = trio.Event()
            live.refresh()
            await trio.sleep(REFRESH_S)

    async def perform(action: Action) -> None:
        client = watcher.client
        try:
            if isinstance(action, Reply):
                await client.reply_permission(
                    action.request_id, option_id=action.option_id, allow=action.allow
                )
                state.say(_answered(action, state, watcher.views), time.time())
            elif isinstance(action, Cancel):
                await client.cancel_run(action.run_id)  # the message says so until it ends
        except RequestFailed as exc:
            if isinstance(action, Cancel):
                state.cancelling.pop(action.run_id, None)
            state.say(_refusal(action, exc), time.time())
        except ConnectionLost:  # the receiver reports it; whether it was cancelled is unknown
            if isinstance(action, Cancel):
                state.cancelling.pop(action.run_id, None)
        watcher.changed.set()

    async def keys(stream: trio.lowlevel.FdStream, nursery: trio.Nursery) -> None:
        while True:
            data = await stream.receive_some(64)
            if not data:
                return  # the terminal closed: keep showing, without keys
            for key in parse_keys(data):
                action = state.action_for(key, watcher.views, time.time())
                if isinstance(action, Quit):
                    nursery.cancel_scope.cancel()
                    return
                if action is not None:
                    nursery.start_soon(perform, action)
            watcher.changed.set()

    watcher.changed.set()  # draw at once, events or not
    try:
        with (
            _cbreak(keyboard),
            Live(
                console=console,
                auto_refresh=False,
                get_renderable=screen,
                redirect_stdout=False,
                redirect_stderr=False,
                vertical_overflow="crop",
            ) as live,
        ):
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(watcher.signals, nursery.cancel_scope)
                    nursery.start_soon(refresher, live)
                    nursery.start_soon(watcher.connection, lambda _: None)  # on the screen
                    nursery.start_soon(
                        watcher.receive,
                        lambda envelopes: watcher.views.apply_all(envelopes),
                        nursery.cancel_scope,
                    )
                    if keyboard is not None:
                        nursery.start_soon(keys, keyboard, nursery)
            finally:
                live.refresh()  # the final state stays on the screen
    finally:
        if keyboard is not None:
            keyboard.close()


def _answered(action: Reply, state: WatchState, views: Views) -> str:
    """``Write: answered “allow”``, and where else an answer is awaited (the focus stays)."""
    others = [
        s
        for s in state.visible(views)
        if s != state.focus and views.sessions[s].pending_permissions()
    ]
    text = f"{action.tool}: answered “{action.label}”"
    if others:
        noun = "session waits" if len(others) == 1 else "sessions wait"
        text += f" · {len(others)} more {noun} for an answer (Tab)"
    return text


def _refusal(action: Action, exc: RequestFailed) -> str:
    if isinstance(action, Reply):
        if exc.code == "already_resolved":
            return f"{action.tool}: already answered ({exc})"
        return f"{action.tool}: could not answer ({exc})"
    return f"could not cancel ({exc})"


def _open_keyboard() -> trio.lowlevel.FdStream | None:
    """The terminal to read keys from, in its own open file (see the module doc)."""
    if not os.isatty(0):
        return None
    try:
        fd = os.open(os.ttyname(0), os.O_RDONLY | os.O_NOCTTY)
    except OSError:
        fd = os.dup(0)
    return trio.lowlevel.FdStream(fd)


@contextmanager
def _cbreak(keyboard: trio.lowlevel.FdStream | None) -> Iterator[None]:
    """Keys arrive one at a time, unechoed; the terminal is restored however we leave."""
    if keyboard is None:
        yield
        return
    fd = keyboard.fileno()
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
