"""The subject layout: ``busd.<daemon>.<session>.<type>``, with every token made safe.

The event type's dots stay dots, so its parts are subject tokens and NATS
wildcards select by type as busd patterns do (``busd.*.*.stream.text.>``).
The daemon is a checked name (:mod:`busd_nats.options`). The session is
any string, so it is escaped: bytes outside ``[A-Za-z0-9_-]`` become
``%XX`` (UTF-8, upper-case hex), a session named ``_`` becomes ``%5F``
because a bare ``_`` means "no session", and the empty string becomes
``%``. The escape is one-to-one, so two sessions never share a subject; the
envelope, not the subject, is what the receiving daemon reads.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

from busd import Pattern

__all__ = [
    "PREFIX",
    "IngestFilter",
    "consumer_name",
    "escape_token",
    "origin_of",
    "subject_for",
]

PREFIX = "busd"
NO_SESSION = "_"
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


@lru_cache(maxsize=4096)
def escape_token(text: str) -> str:
    """``text`` as one subject token (see the module docstring)."""
    if not text:
        return "%"
    if text == NO_SESSION:
        return "%5F"
    if _UNSAFE.search(text) is None:
        return text
    return "".join(
        c if _UNSAFE.match(c) is None else "".join(f"%{b:02X}" for b in c.encode()) for c in text
    )


@lru_cache(maxsize=1024)
def _type_tokens(event_type: str) -> str:
    return ".".join(escape_token(part) for part in event_type.split("."))


def subject_for(daemon: str, session_id: str | None, event_type: str) -> str:
    """Where daemon ``daemon`` publishes an event of ``event_type`` in ``session_id``."""
    session = NO_SESSION if session_id is None else escape_token(session_id)
    return f"{PREFIX}.{daemon}.{session}.{_type_tokens(event_type)}"


def origin_of(subject: str) -> str | None:
    """The daemon that published on ``subject``; None if it is not a busd subject."""
    parts = subject.split(".", 3)
    if len(parts) < 4 or parts[0] != PREFIX or not parts[1]:
        return None
    return parts[1]


def consumer_name(daemon: str) -> str:
    """The durable JetStream consumer of ``daemon``: it resumes where it left off."""
    return f"busd-{daemon}"


class IngestFilter:
    """Which subjects a daemon ingests: the server-side filter and the check on each message.

    JetStream 2.9 filters a consumer by one subject, so one configured subject
    is the server's filter; several (or the default) filter ``busd.>`` on the
    server and are matched here. A daemon's own subjects are always skipped,
    whatever is configured: it never ingests its own events back.
    """

    def __init__(self, daemon: str, subjects: Sequence[str] | None) -> None:
        self.daemon = daemon
        self.subjects = tuple(subjects) if subjects else (f"{PREFIX}.>",)
        self.server_filter = self.subjects[0] if len(self.subjects) == 1 else f"{PREFIX}.>"
        self._patterns = [Pattern(s) for s in self.subjects]
        self._check = len(self._patterns) > 1

    def wants(self, subject: str) -> bool:
        if origin_of(subject) == self.daemon:
            return False
        return not self._check or any(p.matches(subject) for p in self._patterns)
