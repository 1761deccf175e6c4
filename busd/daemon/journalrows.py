"""The journal's rows: the SQLite schema, and a session's row written and read back.

Split from :mod:`.journalfile` (the file and its reader) so that what is
stored can be read in one place. A session's ``usage`` column holds its
:class:`~busd.core.events.TokenUsage` with the per-model breakdown beside
the counts (``by_model``): an older busd decodes the counts and ignores the
breakdown, a newer one reads a file without it as an empty breakdown, so
the schema version did not change.

Events are stored as :mod:`.journalstore` says: since schema 3, a row per
write (its first and last seq and the msgpack array of its envelopes) and
each event's id beside it. Readers get the rest (type, session, run, time)
from each envelope's head (:func:`event_head`). What an index by session
would give, ``spans`` gives once per session and write: each session's
first and last seq in the file, so a reader of one session reads only that
stretch. Schemas 1 and 2 stored a row per event (schema 1 with the head's
fields as columns and an index by session); a writer rebuilds such a file
as schema 3 when it opens it; readers read all three.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, TypeAlias, cast

import msgspec

from ..core.events import ContextUsage, Envelope, Event, StreamingStats, TokenUsage
from ..core.sessions import SessionState, SessionStatus, SessionSummary

__all__ = [
    "APPLICATION_ID",
    "BATCH_TABLES",
    "READS_VERSIONS",
    "SCHEMA_VERSION",
    "SPANS_TABLE",
    "UPSERT_SPAN",
    "EventHead",
    "SessionRecord",
    "SessionRow",
    "event_head",
    "session_row",
]

SCHEMA_VERSION: Final = 3
"""``PRAGMA user_version`` of the files this busd writes; it refuses newer ones."""
READS_VERSIONS: Final = (1, 2, 3)
"""Versions a reader reads as they are (a writer first rebuilds a 1 or a 2 as a 3)."""
APPLICATION_ID: Final = 0x62757364
"""``PRAGMA application_id``: "busd", so a stranger's SQLite file is not mistaken for ours."""

# -- what is stored --------------------------------------------------------------

BATCH_TABLES: Final = """
CREATE TABLE batches (
    first_seq INTEGER PRIMARY KEY,
    last_seq INTEGER NOT NULL,
    envelopes BLOB NOT NULL
);
CREATE TABLE ids (
    id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL
) WITHOUT ROWID;
"""
"""Schema 3's events (:mod:`.journalstore`): a row per write, and every event's id."""

SPANS_TABLE: Final = """
CREATE TABLE spans (
    session_id TEXT PRIMARY KEY,
    first_seq INTEGER NOT NULL,
    last_seq INTEGER NOT NULL
) WITHOUT ROWID;
"""

_SCHEMA = f"""
BEGIN;
{BATCH_TABLES}
CREATE TABLE lost (
    from_seq INTEGER PRIMARY KEY,
    to_seq INTEGER NOT NULL,
    reason TEXT NOT NULL
);
CREATE TABLE sessions (
    session_id TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    title TEXT,
    model TEXT,
    adapter TEXT,
    cwd TEXT,
    parent_session_id TEXT,
    run_id TEXT,
    error TEXT,
    first_seq INTEGER NOT NULL,
    last_seq INTEGER NOT NULL,
    first_ts REAL NOT NULL,
    last_ts REAL NOT NULL,
    events INTEGER NOT NULL,
    usage BLOB,
    stats BLOB,
    context BLOB
);
CREATE INDEX sessions_by_last_seq ON sessions (last_seq);
{SPANS_TABLE}
CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
INSERT INTO meta VALUES ('head', 0), ('reserved', 0), ('floor', 0), ('events', 0);
PRAGMA application_id = {APPLICATION_ID};
PRAGMA user_version = {SCHEMA_VERSION};
COMMIT;
"""

UPSERT_SPAN: Final = """
INSERT INTO spans VALUES (?, ?, ?) ON CONFLICT (session_id) DO UPDATE SET
    first_seq = min(first_seq, excluded.first_seq), last_seq = max(last_seq, excluded.last_seq)
"""


def _spans(envelopes: Sequence[Envelope[Event]]) -> list[tuple[str, int, int]]:
    """Each session's first and last seq among ``envelopes`` (one ``spans`` upsert each)."""
    spans: dict[str, list[int]] = {}
    for envelope in envelopes:
        session_id = envelope.session_id
        if session_id is not None:
            seq = envelope.seq
            span = spans.get(session_id)
            if span is None:
                spans[session_id] = [seq, seq]
            elif seq > span[1]:
                span[1] = seq
            elif seq < span[0]:
                span[0] = seq
    return [(session_id, first, last) for session_id, (first, last) in spans.items()]


_SESSION_COLUMNS = (
    "session_id, status, title, model, adapter, cwd, parent_session_id, run_id, error, "
    "first_seq, last_seq, first_ts, last_ts, events, usage, stats, context"
)
_UPSERT_SESSION = f"""
INSERT INTO sessions ({_SESSION_COLUMNS}) VALUES ({", ".join("?" * 17)})
ON CONFLICT (session_id) DO UPDATE SET
    status = excluded.status, title = excluded.title, model = excluded.model,
    adapter = excluded.adapter, cwd = excluded.cwd,
    parent_session_id = excluded.parent_session_id, run_id = excluded.run_id,
    error = excluded.error, first_seq = min(first_seq, excluded.first_seq),
    last_seq = excluded.last_seq, first_ts = min(first_ts, excluded.first_ts),
    last_ts = excluded.last_ts, events = max(events, excluded.events),
    usage = excluded.usage, stats = excluded.stats, context = excluded.context
"""

_json = msgspec.json.Encoder()


def _blob(value: msgspec.Struct | None) -> bytes | None:
    return None if value is None else _json.encode(value)


class _Tag(msgspec.Struct, frozen=True, gc=False):
    type: str


class EventHead(msgspec.Struct, frozen=True, gc=False):
    """What readers filter on, decoded from an envelope's bytes without its event's body."""

    seq: int
    ts: float
    event: _Tag
    session_id: str | None = None
    run_id: str | None = None
    stale: bool = False


event_head: Final = msgspec.msgpack.Decoder(EventHead).decode
"""An envelope's :class:`EventHead` (``msgspec.DecodeError`` if the bytes are not one)."""


SessionRow: TypeAlias = tuple[Any, ...]


def session_row(state: SessionState) -> SessionRow:
    """The ``sessions`` row of a live session."""
    return (
        state.session_id,
        state.status,
        state.title,
        state.model,
        state.adapter,
        state.cwd,
        state.parent_session_id,
        state.run_id,
        state.error,
        state.first_seq,
        state.last_seq,
        state.first_ts,
        state.last_ts,
        state.events,
        _usage_blob(state.usage, state.usage_by_model),
        _blob(state.stats),
        _blob(state.context),
    )


class SessionRecord(SessionSummary, frozen=True, kw_only=True, omit_defaults=True):
    """A journaled session: its summary as last written, its final stats and context.

    ``truncated`` is true when retention has removed its oldest events.
    """

    stats: StreamingStats | None = None
    context: ContextUsage | None = None
    truncated: bool = False


class _StoredUsage(TokenUsage, frozen=True, kw_only=True, omit_defaults=True):
    """The ``usage`` column: the session's total, with its per-model breakdown beside it."""

    by_model: dict[str, TokenUsage] = msgspec.field(default_factory=dict)


def _usage_blob(usage: TokenUsage | None, by_model: dict[str, TokenUsage]) -> bytes | None:
    if usage is None:
        return None
    fields = msgspec.structs.asdict(usage)
    return _json.encode(_StoredUsage(**fields, by_model=by_model))


def _usage(blob: bytes | None) -> tuple[TokenUsage | None, dict[str, TokenUsage]]:
    if blob is None:
        return None, {}
    stored = _usage_decoder.decode(blob)
    fields = msgspec.structs.asdict(stored)
    del fields["by_model"]
    return TokenUsage(**fields), stored.by_model


_usage_decoder = msgspec.json.Decoder(_StoredUsage)
_stats_decoder = msgspec.json.Decoder(StreamingStats)
_context_decoder = msgspec.json.Decoder(ContextUsage)


def _record(row: Sequence[Any], floor: int) -> SessionRecord:
    (sid, status, title, model, adapter, cwd, parent, run_id, error) = row[:9]
    first_seq, last_seq, first_ts, last_ts, events, usage, stats, context = row[9:]
    total, by_model = _usage(usage)
    return SessionRecord(
        session_id=sid,
        status=cast(SessionStatus, status if status in ("active", "idle", "error") else "idle"),
        title=title,
        model=model,
        adapter=adapter,
        cwd=cwd,
        parent_session_id=parent,
        run_id=run_id,
        error=error,
        first_seq=first_seq,
        last_seq=last_seq,
        first_ts=first_ts,
        last_ts=last_ts,
        events=events,
        usage=total,
        usage_by_model=by_model,
        stats=None if stats is None else _stats_decoder.decode(stats),
        context=None if context is None else _context_decoder.decode(context),
        truncated=first_seq <= floor,
    )
