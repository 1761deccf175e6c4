"""Event ids: UUIDv7 strings, unique across daemons and ordered by time.

``seq`` orders events within one daemon; the id recognizes the same event
wherever it travels (a journal, a NATS bridge, another daemon), so copies
can be de-duplicated. Python 3.11 has no ``uuid.uuid7``; this is RFC 9562's
layout (48 bits of Unix milliseconds, the version, 74 more bits), with the
74 bits drawn as a per-generator random base plus a counter, as RFC 9562
section 6.2 allows: ids from one generator never repeat and sort in the
order they were made, ids from two generators differ by their random base,
and making one costs no system call.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable

__all__ = ["EventIds", "new_event_id"]

_LOW = (1 << 74) - 1
_LAST_GROUP = (1 << 48) - 1
_RAND_B = (1 << 62) - 1
_VARIANT = 1 << 63


_HEX2 = tuple(f"{i:02x}" for i in range(256))
_READY = 64  # last groups formatted ahead by EventIds.prepare


class EventIds:
    """A source of UUIDv7 strings (one per daemon).

    Everything but the last group (the counter's low 48 bits) is formatted
    once a millisecond, or when the counter carries into it, from parts
    kept formatted: an id costs one clock read and one 12-digit format.
    :meth:`prepare` formats the last groups of the next ids ahead, so that
    an id is then only joined: the daemon calls it after a burst went out,
    where no frontend waits (a burst's ids cost 14 µs of its path to the
    first write, formatted then, with cold caches; docs/performance.md).
    ``base`` and ``clock`` (Unix nanoseconds) are for tests.
    """

    def __init__(self, *, base: int | None = None, clock: Callable[[], int] = time.time_ns) -> None:
        self._base = secrets.randbits(74) if base is None else base & _LOW
        self._clock = clock
        self._count = 0  # ids made so far
        self._ms = -1
        self._high = -1
        self._upper = ""  # the first group and its dash: the milliseconds >> 16
        self._lower = ""  # from the third group's dash on, up to the last group
        self._prefix = ""
        self._ready: list[str] = []  # the last groups of the next ids, from _ready_from on
        self._ready_from = -1

    def __call__(self) -> str:
        ms = self._clock() // 1_000_000
        self._count += 1
        count = self._base + self._count
        low = count & _LOW
        if ms > self._ms or low >> 48 != self._high:
            self._format_prefix(max(ms, self._ms), low)  # the time part never goes backwards
        if self._ready and self._ready_from == count:
            self._ready_from += 1
            return self._prefix + self._ready.pop(0)
        return f"{self._prefix}{low & _LAST_GROUP:012x}"

    def many(self, n: int) -> list[str]:
        """``n`` ids in a row, as ``n`` calls would give them, for one clock read.

        Ids up to the next carry into the cached part share its prefix, so
        each is a join of a tail to the last group's upper digits (formatted
        once per 256 values), or none when it was prepared.
        """
        ms = self._clock() // 1_000_000
        first = self._base + self._count + 1
        self._count += n
        ready = self._ready
        if n <= len(ready) and self._ready_from == first:  # prepared: no carry among them
            low = first & _LOW
            if ms > self._ms or low >> 48 != self._high:
                self._format_prefix(max(ms, self._ms), low)
            self._ready_from += n
            out = list(map(self._prefix.__add__, ready[:n]))
            del ready[:n]
            return out
        out = []
        while n > 0:  # a format per 256 values (a carry comes at one of them), then joins
            low = first & _LOW
            if ms > self._ms or low >> 48 != self._high:
                self._format_prefix(max(ms, self._ms), low)
            group = low & _LAST_GROUP
            tail = group & 0xFF
            take = min(n, 256 - tail)
            out += map(f"{self._prefix}{group >> 8:010x}".__add__, _HEX2[tail : tail + take])
            first += take
            n -= take
        return out

    def prepare(self) -> None:
        """Format the last groups of the next ids, up to the next carry, once half are used."""
        first = self._base + self._count + 1
        if self._ready_from == first and len(self._ready) >= _READY // 2:
            return
        group = first & _LAST_GROUP
        end = group + min(_READY, _LAST_GROUP - group + 1)
        ready: list[str] = []
        while group < end:  # a format per 256 values, then only joins (the lump was 64 formats)
            low = group & 0xFF
            take = min(end - group, 256 - low)
            ready += map(f"{group >> 8:010x}".__add__, _HEX2[low : low + take])
            group += take
        self._ready = ready
        self._ready_from = first

    def _format_prefix(self, ms: int, low: int) -> None:
        high = low >> 48
        if high != self._high:
            self._high = high
            tail = f"{_VARIANT | (low & _RAND_B):016x}"
            self._lower = f"-7{low >> 62:03x}-{tail[:4]}-"
        if ms >> 16 != self._ms >> 16:
            self._upper = f"{(ms >> 16) & 0xFFFF_FFFF:08x}-"
        self._ms = ms
        self._prefix = self._upper + _HEX2[(ms >> 8) & 0xFF] + _HEX2[ms & 0xFF] + self._lower


new_event_id = EventIds()
"""The process-wide generator, for code that has no daemon at hand."""
