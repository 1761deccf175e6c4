"""The journal's lock file: one writer at a time, and a seq reservation that needs no free space.

``PATH.lock`` is held with ``flock`` by the daemon that writes the journal.
It holds one fixed-size record: the holder's pid and a seq reservation (no
seq above it has been given). The database keeps its own reservation
(``meta.reserved``), written with every batch; this one is the fallback
for when the database cannot be written at all (a full disk, an I/O
error): rewriting a 64-byte record in place needs no new block, so it
still works when SQLite's writes fail. A daemon that opens the journal
starts after both.
"""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = ["RECORD_SIZE", "JournalLock", "LockHeld"]

RECORD_SIZE: Final = 64
"""Bytes of the record: ``PID\\nRESERVED\\n``, padded with spaces."""


class LockHeld(Exception):
    """Another process holds the lock (``pid``, when its record says)."""

    def __init__(self, pid: int | None) -> None:
        super().__init__(pid)
        self.pid = pid


def _parse(data: bytes) -> tuple[int | None, int]:
    """(pid, reservation) from a record; what cannot be read is None and 0."""
    fields = data.split(b"\n")
    pid: int | None = None
    reserved = 0
    try:
        pid = int(fields[0])
        reserved = int(fields[1]) if len(fields) > 1 and fields[1].strip() else 0
    except ValueError:
        pass
    return pid, max(reserved, 0)


@dataclass(slots=True)
class JournalLock:
    """The held lock file; :meth:`reserve` rewrites its record in place."""

    path: Path
    fd: int
    previous: int
    """The reservation the last holder left (0: none)."""

    @classmethod
    def acquire(cls, journal: Path) -> JournalLock:
        """Take ``JOURNAL.lock`` (:class:`LockHeld` if taken, ``OSError`` if it cannot be)."""
        path = journal.with_name(journal.name + ".lock")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid, _ = _parse(os.pread(fd, RECORD_SIZE, 0))
            os.close(fd)
            raise LockHeld(pid) from None
        except BaseException:
            os.close(fd)
            raise
        lock = cls(path, fd, _parse(os.pread(fd, RECORD_SIZE, 0))[1])
        try:  # the whole record now, while there is room: later rewrites need none
            lock.reserve(lock.previous)
        except BaseException:
            os.close(fd)
            raise
        return lock

    def reserve(self, seq: int) -> None:
        """Record that no seq above ``seq`` was given (``OSError`` if the write fails)."""
        record = f"{os.getpid()}\n{seq}\n".encode().ljust(RECORD_SIZE - 1) + b"\n"
        if os.pwrite(self.fd, record, 0) != RECORD_SIZE:
            raise OSError(f"short write to {self.path}")

    def close(self) -> None:
        os.close(self.fd)
