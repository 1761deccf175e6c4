"""Where the journal's SQLite work runs: a worker thread, or a process of its own.

In a worker thread each write's statements hand the GIL back and forth
with the event loop, which then stalls three or four times a write for
0.2-1 ms: the late events of window 0 with the journal on
(docs/performance.md, "At window 0 the journal shows in the tail"). A
process shares no GIL: the event loop only hands it the bytes it already
encoded for fan-out, and the inserts run beside it.

:class:`ThreadWriter` is :class:`~.journalfile.JournalFile` in
``trio.to_thread``; :class:`ProcessWriter` runs :func:`main` in a new
Python (``python -c ... JOURNAL``) and speaks to it over its stdin and
stdout: msgpack frames, each after its length (4 bytes, big-endian), one
reply per request, in order. The process

- opens the file with :meth:`JournalFile.attach`: the daemon opened,
  checked and recovered it, and holds its lock;
- inherits the lock's descriptor, so the lock stays held while the process
  may still write, even if the daemon was killed;
- is in a session of its own and ignores SIGINT and SIGTERM: a Ctrl-C or a
  service manager's SIGTERM reaches the daemon, which then writes what is
  left through it;
- exits when its stdin closes (the daemon stopped, or died).

A process that dies is a failed write (:class:`WriterGone`, retried like
any other); the next request starts a new one. A write the dead process
committed is written again, and its rows ignored as duplicates.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, Literal, Protocol, TypeAlias

import msgspec
import trio

from ..core.events import Envelope, Event
from .journalfile import JournalError, JournalFile, Retention, SessionRow, Written

__all__ = [
    "ProcessWriter",
    "ThreadWriter",
    "Writer",
    "WriterError",
    "WriterGone",
    "WriterKind",
    "serve_one",
]

logger = logging.getLogger("busd.journal")

WriterKind: TypeAlias = Literal["process", "thread"]

_CLOSE_WITHIN: Final = 30.0  # seconds a stopping writer may take for its last statements
_PIPE_SIZE: Final = 1 << 20  # a batch of 4,096 events is ~1-2 MiB: few wake-ups to send it
_HEADER: Final = 4
_MAIN: Final = (
    "import sys; from busd.daemon.journalwriter import main; sys.exit(main(sys.argv[1:]))"
)
"""Not ``-m``: the package imports this module before ``-m`` would run it (a second copy)."""
_PACKAGE: Final = str(Path(__file__).resolve().parents[2])
"""The directory this busd is imported from: the process imports the same one."""


class WriterError(OSError):
    """The writer process could not do a request (not an SQLite error: a bug, or bad input)."""


class WriterGone(WriterError):
    """The writer process is not there any more (it died, or could not be started)."""


class Writer(Protocol):
    """What :class:`~.journal.Journal` asks of wherever its writes run."""

    kind: WriterKind
    restarts: int

    async def start(self) -> None: ...

    async def write(
        self,
        envelopes: Sequence[Envelope[Event]],
        raws: Sequence[msgspec.Raw],
        lost: Sequence[tuple[int, int, str]],
        sessions: Sequence[SessionRow],
        *,
        head: int,
        reserved: int,
    ) -> Written: ...

    async def prune_target(self, retention: Retention, now: float, *, again: bool) -> int: ...

    async def prune_step(self, target: int) -> tuple[int, int]: ...

    async def vacuum(self) -> int: ...

    async def release(self, head: int, unwritten: Sequence[tuple[int, int]]) -> None: ...

    async def aclose(self) -> None: ...


class ThreadWriter:
    """The file's methods in Trio's worker threads (the embedded daemon's default)."""

    kind: WriterKind = "thread"
    restarts = 0

    def __init__(self, file: JournalFile) -> None:
        self.file = file

    async def start(self) -> None:
        pass

    async def write(
        self,
        envelopes: Sequence[Envelope[Event]],
        raws: Sequence[msgspec.Raw],
        lost: Sequence[tuple[int, int, str]],
        sessions: Sequence[SessionRow],
        *,
        head: int,
        reserved: int,
    ) -> Written:
        file = self.file  # its methods are looked up in the thread: tests replace them
        return await trio.to_thread.run_sync(
            lambda: file.write(envelopes, raws, lost, sessions, head=head, reserved=reserved)
        )

    async def prune_target(self, retention: Retention, now: float, *, again: bool) -> int:
        file = self.file
        return await trio.to_thread.run_sync(lambda: file.prune_target(retention, now, again=again))

    async def prune_step(self, target: int) -> tuple[int, int]:
        return await trio.to_thread.run_sync(self.file.prune_step, target)

    async def vacuum(self) -> int:
        return await trio.to_thread.run_sync(self.file.vacuum)

    async def release(self, head: int, unwritten: Sequence[tuple[int, int]]) -> None:
        await trio.to_thread.run_sync(self.file.release, head, unwritten)

    async def aclose(self) -> None:
        pass


# -- the protocol ----------------------------------------------------------------------


class _Write(msgspec.Struct, frozen=True, array_like=True, tag="write"):
    raws: list[msgspec.Raw]
    lost: list[tuple[int, int, str]]
    sessions: list[tuple[Any, ...]]
    head: int
    reserved: int


class _PruneTarget(msgspec.Struct, frozen=True, array_like=True, tag="prune_target"):
    max_age: float | None
    max_size: int | None
    now: float
    again: bool


class _PruneStep(msgspec.Struct, frozen=True, array_like=True, tag="prune_step"):
    target: int


class _Vacuum(msgspec.Struct, frozen=True, array_like=True, tag="vacuum"):
    pass


class _Release(msgspec.Struct, frozen=True, array_like=True, tag="release"):
    head: int
    unwritten: list[tuple[int, int]]


_Request: TypeAlias = _Write | _PruneTarget | _PruneStep | _Vacuum | _Release


class _Done(msgspec.Struct, frozen=True, array_like=True, tag="done"):
    value: Any


class _Failed(msgspec.Struct, frozen=True, array_like=True, tag="failed"):
    sqlite: bool
    """An SQLite error (the caller raises :class:`sqlite3.DatabaseError`), else a WriterError."""
    message: str


_Reply: TypeAlias = _Done | _Failed

_encoder = msgspec.msgpack.Encoder()
_requests = msgspec.msgpack.Decoder(_Request)
_replies = msgspec.msgpack.Decoder(_Reply)


def _frame(message: msgspec.Struct) -> bytearray:
    buffer = bytearray(_HEADER)
    _encoder.encode_into(message, buffer, _HEADER)
    buffer[:_HEADER] = (len(buffer) - _HEADER).to_bytes(_HEADER, "big")
    return buffer


def _handle(file: JournalFile, request: _Request) -> Any:
    match request:
        case _Write():
            written = file.write_raws(
                request.raws,
                request.lost,
                request.sessions,
                head=request.head,
                reserved=request.reserved,
            )
            return (written.inserted, written.bytes)
        case _PruneTarget():
            retention = Retention(max_age=request.max_age, max_size=request.max_size)
            return file.prune_target(retention, request.now, again=request.again)
        case _PruneStep():
            return file.prune_step(request.target)
        case _Vacuum():
            return file.vacuum()
        case _Release():
            file.release(request.head, request.unwritten)
            return None


def serve_one(file: JournalFile, payload: bytes) -> bytearray:
    """The writer process's work for one request frame's payload: the reply frame."""
    reply: _Reply
    try:
        reply = _Done(_handle(file, _requests.decode(payload)))
    except sqlite3.Error as exc:
        reply = _Failed(True, str(exc))
    except Exception as exc:  # an OSError, or a bug: the daemon reports it, and retries
        reply = _Failed(False, f"{type(exc).__name__}: {exc}")
    return _frame(reply)


# -- the daemon's side ------------------------------------------------------------------


def _exit_status(code: int | None) -> str:
    if code is None:
        return "is not answering"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


class ProcessWriter:
    """The journal's writes in a process of its own (``busd serve``'s default)."""

    kind: WriterKind = "process"

    def __init__(self, file: JournalFile) -> None:
        self.file = file
        """The daemon's own view of the journal: it holds the lock and its reservation."""
        self.restarts = 0
        """Processes started after the first (each after one died)."""
        self._process: trio.Process | None = None
        self._started = 0
        self._received = bytearray()
        self._lock = trio.Lock()

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    async def start(self) -> None:
        """Start the process now (it imports while the daemon gets ready); failures wait for
        the first write, which reports them."""
        try:
            async with self._lock:
                await self._ensure()
        except WriterGone as exc:
            logger.error("%s", exc)

    async def _ensure(self) -> trio.Process:
        if self._process is not None:
            return self._process
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PACKAGE, env.get("PYTHONPATH")]))
        try:
            process = await trio.lowlevel.open_process(
                [sys.executable, "-c", _MAIN, str(self.file.path)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                pass_fds=(self.file.lock_fd,),
                start_new_session=True,
                env=env,
            )
        except OSError as exc:
            raise WriterGone(f"cannot start the journal writer: {exc}") from None
        assert process.stdin is not None
        if isinstance(process.stdin, trio.lowlevel.FdStream):
            with contextlib.suppress(OSError):  # the default 64 KiB only means more wake-ups
                fcntl.fcntl(process.stdin.fileno(), fcntl.F_SETPIPE_SZ, _PIPE_SIZE)
        if self._started:
            self.restarts += 1
        self._started += 1
        self._process = process
        self._received.clear()
        return process

    async def _call(self, request: msgspec.Struct) -> Any:
        frame = _frame(request)
        async with self._lock:
            # Like a worker thread's, a request runs to its end: the reply must be read.
            with trio.CancelScope(shield=True):
                process = await self._ensure()
                try:
                    assert process.stdin is not None
                    await process.stdin.send_all(frame)
                    reply = await self._receive(process)
                except (trio.BrokenResourceError, trio.ClosedResourceError, EOFError):
                    raise WriterGone(await self._reap(process)) from None
        match reply:
            case _Done():
                return reply.value
            case _Failed(sqlite=True):
                raise sqlite3.DatabaseError(reply.message)
            case _Failed():
                raise WriterError(f"the journal writer failed: {reply.message}")

    async def _receive(self, process: trio.Process) -> _Reply:
        assert process.stdout is not None
        buffer = self._received
        while True:
            if len(buffer) >= _HEADER:
                size = int.from_bytes(buffer[:_HEADER], "big") + _HEADER
                if len(buffer) >= size:
                    reply: _Reply = _replies.decode(memoryview(buffer)[_HEADER:size])
                    del buffer[:size]
                    return reply
            data = await process.stdout.receive_some()
            if not data:
                raise EOFError
            buffer += data

    async def _reap(self, process: trio.Process) -> str:
        """The process stopped answering: make sure it is gone; why, for the report."""
        self._process = None
        if process.returncode is None:
            with trio.move_on_after(_CLOSE_WITHIN):
                await process.wait()  # its stdout closed: it is exiting
            if process.returncode is None:
                process.kill()
                await process.wait()
        await _close_pipes(process)
        return f"the journal writer (pid {process.pid}) {_exit_status(process.returncode)}"

    async def write(
        self,
        envelopes: Sequence[Envelope[Event]],
        raws: Sequence[msgspec.Raw],
        lost: Sequence[tuple[int, int, str]],
        sessions: Sequence[SessionRow],
        *,
        head: int,
        reserved: int,
    ) -> Written:
        request = _Write(list(raws), list(lost), list(sessions), head, reserved)
        inserted, size = await self._call(request)
        return Written(inserted, size)

    async def prune_target(self, retention: Retention, now: float, *, again: bool) -> int:
        request = _PruneTarget(retention.max_age, retention.max_size, now, again)
        return int(await self._call(request))

    async def prune_step(self, target: int) -> tuple[int, int]:
        floor, removed = await self._call(_PruneStep(target))
        return int(floor), int(removed)

    async def vacuum(self) -> int:
        return int(await self._call(_Vacuum()))

    async def release(self, head: int, unwritten: Sequence[tuple[int, int]]) -> None:
        await self._call(_Release(head, list(unwritten)))
        self.file.reserve_beside(head)  # the process cannot: the lock's record is ours

    async def aclose(self) -> None:
        """Close its stdin and wait for it to finish its statements and exit."""
        with trio.CancelScope(shield=True):
            async with self._lock:
                process, self._process = self._process, None
                if process is None:
                    return
                assert process.stdin is not None
                await process.stdin.aclose()
                with trio.move_on_after(_CLOSE_WITHIN):
                    await process.wait()
                if process.returncode is None:
                    logger.error("the journal writer (pid %d) did not exit: killed", process.pid)
                    process.kill()
                    await process.wait()
                elif process.returncode != 0:
                    logger.error(
                        "the journal writer (pid %d) %s",
                        process.pid,
                        _exit_status(process.returncode),
                    )
                await _close_pipes(process)


async def _close_pipes(process: trio.Process) -> None:
    for stream in (process.stdin, process.stdout):
        if stream is not None:
            await stream.aclose()


# -- the process ----------------------------------------------------------------------


def _read(stream: Any, size: int) -> bytes | None:
    data = stream.read(size)
    return data if len(data) == size else None


def main(argv: Sequence[str]) -> int:
    """The writer process: serve requests from stdin until it closes."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)  # the daemon decides when this stops
    replies = os.dup(1)
    try:
        os.dup2(2, 1)  # a stray print goes to the log, not into a reply
    except OSError:  # no stderr
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    if len(argv) != 1:
        print("usage: busd.daemon.journalwriter.main([JOURNAL])", file=sys.stderr)
        return 2
    try:
        file = JournalFile.attach(argv[0])
    except JournalError as exc:
        print(f"busd journal writer: {exc}", file=sys.stderr)
        return 1
    requests = sys.stdin.buffer
    try:
        while (header := _read(requests, _HEADER)) is not None:
            payload = _read(requests, int.from_bytes(header, "big"))
            if payload is None:
                break
            reply = memoryview(serve_one(file, payload))
            while reply:
                reply = reply[os.write(replies, reply) :]
    except BrokenPipeError:
        pass  # the daemon is gone
    finally:
        file.close()
    return 0
