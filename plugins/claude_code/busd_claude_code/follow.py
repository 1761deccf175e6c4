"""The pure half of ``busd attach claude-code``: what to read and send, and resume points.

No I/O here: :mod:`.attach` scans the directories, reads the bytes, sends
and writes the state file; :class:`Follower` decides.

- **Files.** ``projects/<project>/<sessionId>.jsonl`` is a session's
  transcript; any ``*.jsonl`` under ``projects/<project>/<sessionId>/``
  (``subagents/agent-<agentId>.jsonl``) belongs to that session too. A file
  is read from where the last round stopped, by complete lines only: a last
  line without its newline waits for it (with ``--once``, a last line that is
  a whole JSON object is taken as ccusage takes it). A file that shrank or
  was replaced (another inode) is read again from its start; one that went
  away is forgotten, and a session with no file left is finished.
- **Which sessions.** With ``--once``, all of them. When following, a
  session is read (from its start) once one of its files was modified within
  ``window`` seconds, so starting to follow does not replay every session
  ever written, and a session resumed later is read whole when it moves.
- **Order.** Sessions go in the order of their files' earliest timestamps
  (ccusage's order, which decides which session a response copied into
  another, by ``--fork-session``, counts in); a session's new lines from all
  its files are merged by their timestamps, so a sub-agent's work sits
  between its start and its result.
- **Counting.** A :class:`~.tally.Tally` per session counts what the
  translator will count; a response already counted (in another session, or
  before a restart) is announced with ``busd.counted`` before its lines.
- **Resume points** (:class:`State`): per file its inode and the offset
  after the last line sent; per session its totals per model, the keys of
  its counted responses, its cwd and model. The first batch of a session on
  a new connection starts with ``busd.resume``, so the daemon's new
  translator goes on from those totals instead of zero.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Iterator, Mapping
from typing import Any, Final

import msgspec

from busd import TokenUsage

from .tally import SYNTHETIC, Tally, entry
from .transcript import line_time, worth_sending

__all__ = [
    "SDK",
    "Batch",
    "FileMark",
    "Follower",
    "Place",
    "Read",
    "SessionMark",
    "Stat",
    "State",
    "place_of",
    "split_lines",
]

SDK: Final = "claude-code-transcript"
"""The adapter the attacher's payloads are for."""


class Stat(msgspec.Struct, frozen=True):
    """What a scan saw of one file."""

    inode: int
    size: int
    mtime: float


class Place(msgspec.Struct, frozen=True):
    """The session a transcript file belongs to, and its sub-agent's id when it is one's."""

    session: str
    agent: str | None = None


class FileMark(msgspec.Struct, kw_only=True):
    """A file's resume point: read up to ``offset`` (the end of a complete line)."""

    inode: int
    offset: int
    session: str
    agent: str | None = None


class SessionMark(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A session's resume point: what was counted, and its context."""

    models: dict[str, TokenUsage] = {}
    keys: list[str] = []
    cwd: str | None = None
    model: str | None = None


class State(msgspec.Struct, kw_only=True):
    """Everything the attacher keeps between runs (``claude-code.json`` in its state dir)."""

    version: int = 1
    files: dict[str, FileMark] = {}
    sessions: dict[str, SessionMark] = {}


class Read(msgspec.Struct, frozen=True):
    """Read ``path`` from ``offset`` to its end; ``meta``: its sub-agent's ``meta.json`` too."""

    path: str
    offset: int
    meta: bool = False


class Batch(msgspec.Struct, frozen=True):
    """Payloads for one session's translator; ``end`` finishes it."""

    session: str
    payloads: list[Any]
    end: bool = False


def place_of(parts: tuple[str, ...]) -> Place | None:
    """The session of ``projects/<parts...>``, or ``None`` for a file in no session."""
    if not parts or not parts[-1].endswith(".jsonl"):
        return None
    if len(parts) == 2:
        return Place(parts[1].removesuffix(".jsonl"))
    if len(parts) >= 3:
        name = parts[-1].removesuffix(".jsonl")
        agent = name.removeprefix("agent-") if name.startswith("agent-") else None
        return Place(parts[1], agent or None)
    return None


def split_lines(data: bytes, *, final: bool) -> tuple[list[bytes], int]:
    """The complete lines of ``data`` and how many bytes they span.

    A last piece without a newline is held back (not counted), unless
    ``final`` and it is a whole JSON value.
    """
    end = data.rfind(b"\n") + 1
    lines = data[:end].split(b"\n")[:-1] if end else []
    tail = data[end:]
    if final and tail.strip():
        try:
            json.loads(tail)
        except ValueError:
            return lines, end
        return [*lines, tail], len(data)
    return lines, end


class _Book:
    """The attacher's view of one session: its count, cwd and model."""

    __slots__ = ("cwd", "model", "tally")

    def __init__(self, mark: SessionMark | None = None) -> None:
        self.tally = Tally()
        self.cwd: str | None = None if mark is None else mark.cwd
        self.model: str | None = None if mark is None else mark.model
        if mark is not None:
            self.tally.restore(mark.models)
            self.tally.mark(mark.keys)

    def mark(self) -> SessionMark:
        return SessionMark(
            models=self.tally.models(),
            keys=sorted(self.tally.keys()),
            cwd=self.cwd,
            model=self.model,
        )


class Follower:
    """Decides, round by round, what to read and what to send; keeps the resume points."""

    def __init__(self, state: State, *, once: bool, window: float) -> None:
        self._once = once
        self._window = window
        self._files: dict[str, FileMark] = dict(state.files)
        self._books = {sid: _Book(mark) for sid, mark in state.sessions.items()}
        self._counted: set[str] = set()
        for book in self._books.values():
            self._counted |= book.tally.keys()
        self._resumed: set[str] = set()  # sessions whose translator heard busd.resume
        self._first: dict[str, float] = {}  # file -> its earliest timestamp
        self._last: dict[str, float] = {}  # file -> its latest timestamp (merge key)
        self._lines: dict[str, dict[str, list[tuple[float, dict[str, Any]]]]] = {}
        self._metas: dict[str, list[dict[str, Any]]] = {}
        self._ended: list[str] = []
        self.notes: list[str] = []

    # -- a round ---------------------------------------------------------------------

    def plan(self, scan: Mapping[str, tuple[Stat, Place]], now: float) -> list[Read]:
        """What to read this round, given every transcript file there now."""
        for path in sorted(set(self._files) - set(scan)):
            mark = self._files.pop(path)
            self.notes.append(f"{path}: went away")
            if not any(m.session == mark.session for m in self._files.values()):
                self._ended.append(mark.session)
        recent = now - self._window
        sessions = {
            place.session
            for path, (stat, place) in scan.items()
            if self._once or path in self._files or stat.mtime >= recent
        }
        reads: list[Read] = []
        for path in sorted(scan):
            stat, place = scan[path]
            if place.session not in sessions:
                continue
            known = self._files.get(path)
            if known is None:
                mark = FileMark(
                    inode=stat.inode, offset=0, session=place.session, agent=place.agent
                )
                self._files[path] = mark
                self._books.setdefault(place.session, _Book())
            elif known.inode != stat.inode or stat.size < known.offset:
                mark = known
                why = "was replaced" if mark.inode != stat.inode else "shrank"
                self.notes.append(f"{path}: {why}; reading it again from the start")
                mark.inode, mark.offset = stat.inode, 0
            else:
                mark = known
            if stat.size > mark.offset:
                # A sub-agent's meta.json goes before its first lines on each connection.
                fresh = mark.offset == 0 or place.session not in self._resumed
                meta = place.agent is not None and fresh
                reads.append(Read(path, mark.offset, meta))
        return reads

    def take(self, read: Read, data: bytes, meta: Mapping[str, Any] | None = None) -> None:
        """What was read for ``read`` (``meta``: the sub-agent's ``meta.json``, if found)."""
        mark = self._files.get(read.path)
        if mark is None:
            return
        lines, used = split_lines(data, final=self._once)
        mark.offset = read.offset + used
        if meta is not None and mark.agent is not None:
            payload = {"type": "busd.subagent", "agentId": mark.agent, "meta": dict(meta)}
            self._metas.setdefault(mark.session, []).append(payload)
        taken = self._lines.setdefault(mark.session, {}).setdefault(read.path, [])
        bad = 0
        for raw in lines:
            if not raw.strip():
                continue
            try:
                line = json.loads(raw)
            except ValueError:
                line = None
            if not isinstance(line, dict):
                bad += 1
                continue
            when = line_time(line)
            if when is not None:
                self._first[read.path] = min(self._first.get(read.path, when), when)
                self._last[read.path] = max(self._last.get(read.path, when), when)
            taken.append((self._last.get(read.path, 0.0), line))
        if bad:
            self.notes.append(f"{read.path}: skipped {bad} line(s) that are not JSON objects")

    def batches(self) -> list[Batch]:
        """This round's payloads, session by session (in ccusage's order)."""
        out: list[Batch] = []
        for session in self._ended:
            self._books.pop(session, None)
            self._lines.pop(session, None)
            if session in self._resumed:
                self._resumed.discard(session)
                out.append(Batch(session, [], end=True))
        self._ended.clear()
        pending, self._lines = self._lines, {}
        metas, self._metas = self._metas, {}

        def first(session: str) -> tuple[float, str]:
            files = pending[session]
            return min((self._first.get(p, float("inf")) for p in files), default=0.0), session

        for session in sorted(pending, key=first):
            files = pending[session]
            ordered = sorted(files, key=lambda p: (self._files[p].agent is not None, p))
            lines = [line for _, line in heapq.merge(*(files[p] for p in ordered), key=_key)]
            payloads = self._payloads(session, lines, metas.pop(session, []))
            if payloads or self._once:
                out.append(Batch(session, payloads, end=self._once))
        return out

    def _payloads(
        self, session: str, lines: list[dict[str, Any]], metas: list[dict[str, Any]]
    ) -> list[Any]:
        book = self._books.setdefault(session, _Book())
        head: list[Any] = []
        if session not in self._resumed:
            self._resumed.add(session)
            if book.tally.models() or book.cwd is not None:
                resume = {"type": "busd.resume", "models": msgspec.to_builtins(book.tally.models())}
                resume.update(cwd=book.cwd, model=book.model)
                head.append(resume)
        head.extend(metas)
        told: list[str] = []
        sent: list[Any] = []
        for line in lines:
            self._note(book, line)
            found = entry(line)
            if found is not None:
                if found.key is not None and found.key in self._counted:
                    told.append(found.key)  # counted before this batch: the translator may not know
                else:
                    book.tally.count(found)
            if worth_sending(line):
                sent.append(line)
        self._counted |= book.tally.keys()
        if told:
            head.append({"type": "busd.counted", "keys": sorted(set(told))})
        if not sent and not head:
            return []
        return [*head, *sent, {"type": "busd.caught-up"}]

    @staticmethod
    def _note(book: _Book, line: Mapping[str, Any]) -> None:
        """The session's cwd and main model, as the translator will know them."""
        if line.get("isSidechain") is True:
            return
        cwd = line.get("cwd")
        if isinstance(cwd, str) and cwd:
            book.cwd = cwd
        message = line.get("message")
        model = message.get("model") if isinstance(message, Mapping) else None
        if line.get("type") == "assistant" and isinstance(model, str) and model != SYNTHETIC:
            book.model = model or book.model

    # -- resume points -----------------------------------------------------------------

    def state(self) -> State:
        """The resume points as of now (write them after the daemon took what was sent)."""
        sessions = {m.session for m in self._files.values()}
        return State(
            files={path: msgspec.structs.replace(mark) for path, mark in self._files.items()},
            sessions={sid: book.mark() for sid, book in self._books.items() if sid in sessions},
        )

    def drain_notes(self) -> Iterator[str]:
        """The notes for the user gathered since the last call."""
        notes, self.notes = self.notes, []
        yield from notes


def _key(item: tuple[float, dict[str, Any]]) -> float:
    return item[0]
