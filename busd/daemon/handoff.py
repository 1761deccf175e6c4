"""A job in a worker thread whose answer the event loop takes as it passes by.

``trio.to_thread.run_sync`` parks a task until the thread is done, and an
answer posted with ``run_sync_soon`` wakes the loop for it: both cost the
loop a wake-up per job. The journal stages rows and starts its writes at a
publisher's burst's end, where nobody waits for the answer: the next
burst's end takes it, and the loop is woken only when somebody does wait
(the writer before it uses the file, an acknowledged publish for its
write: :meth:`Handoff.want`). docs/performance.md, "Where the daemon's CPU
lands" and "The journal's write from a burst's end", has what those
wake-ups cost the loop between bursts.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

import outcome
import trio

__all__ = ["Handoff"]

T = TypeVar("T")


class Handoff(Generic[T]):
    """One job at a time in a worker thread; its answer goes to ``answer`` in Trio's thread.

    The answer is given when the loop takes it: :meth:`take` (cheap, when
    passing by) or :meth:`wait`. Only the thread and the waiting loop touch
    the answer's slot, under one lock, so a wake-up asked for is never lost.
    """

    __slots__ = ("_job", "_lock", "_result", "_wanted")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._result: outcome.Outcome[T] | None = None  # the thread's, until taken
        self._wanted = False  # the loop waits: the thread wakes it
        # A job in flight, or its answer not taken yet: set once taken, and who gets it.
        self._job: tuple[trio.Event, Callable[[outcome.Outcome[T]], None]] | None = None

    @property
    def busy(self) -> bool:
        """A job is in its thread, or its answer was not taken yet."""
        return self._job is not None

    def start(
        self,
        job: Callable[[], T],
        answer: Callable[[outcome.Outcome[T]], None],
        *,
        token: trio.lowlevel.TrioToken,
    ) -> None:
        """Run ``job`` in a worker thread; ``answer(its outcome)`` once the loop takes it.

        Raises :class:`RuntimeError` when busy, or when no thread can be
        started (then nothing started).
        """
        if self._job is not None:
            raise RuntimeError("a job is already in its thread")

        def deliver(result: outcome.Outcome[T]) -> None:  # in the worker thread
            with self._lock:
                self._result = result
                wanted = self._wanted
            if wanted:
                with contextlib.suppress(trio.RunFinishedError):
                    token.run_sync_soon(self.take)

        self._job = (trio.Event(), answer)
        try:
            trio.lowlevel.start_thread_soon(job, deliver)
        except BaseException:
            self._job = None
            raise

    def take(self) -> bool:
        """Give the finished job's answer now; ``False`` if it is still in its thread."""
        with self._lock:
            result, self._result = self._result, None
        job = self._job
        if result is None or job is None:
            return False  # a wake-up asked for by a waiter stays asked for
        self._job, self._wanted = None, False
        done, answer = job
        done.set()
        answer(result)
        return True

    def want(self) -> trio.Event | None:
        """The answer is wanted: given now if it is there, else the thread wakes the loop
        for it. ``None`` when no job is left, else an event set once the answer is given."""
        while (job := self._job) is not None:
            with self._lock:
                ready = self._result is not None
                self._wanted = not ready
            if not ready:
                return job[0]
            self.take()
        return None

    async def wait(self) -> None:
        """Until no job is in flight (the answer given); the thread wakes the loop for it."""
        while (done := self.want()) is not None:
            await done.wait()
