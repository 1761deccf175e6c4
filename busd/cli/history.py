"""The journal, read directly (daemon running or not): ``busd sessions``, ``busd export``."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click
import msgspec

from ..core.catalog import Catalog
from ..core.events import Envelope, Event
from ..daemon.journalfile import JournalError, JournalReader, SessionRecord
from ..frontends.humanize import format_tokens
from ..frontends.transcript import build_transcript, export_document
from ._common import default_journal_path, fail

journal_option = click.option(
    "--journal",
    "journal_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The journal to read (default: $XDG_STATE_HOME/busd/journal.sqlite3).",
)


def _reader(path: Path | None) -> JournalReader:
    try:
        return JournalReader(path or default_journal_path())
    except JournalError as exc:
        fail(str(exc))


@click.command("sessions")
@journal_option
@click.option("--limit", type=click.IntRange(1), default=None, help="The N most recent only.")
@click.option("--json", "as_json", is_flag=True, help="A JSON array of session records.")
def sessions_command(journal_path: Path | None, limit: int | None, as_json: bool) -> None:
    """List the journaled sessions, most recently active first, with their final usage.

    Reads the journal directly: works whether the daemon runs or not.
    """
    with _reader(journal_path) as reader:
        records = reader.sessions(limit)
    if as_json:
        click.echo(msgspec.json.encode(records))
        return
    if not records:
        click.echo(f"no sessions in {reader.path}", err=True)
        return
    for line in session_table(records):
        click.echo(line)


def session_table(records: list[SessionRecord]) -> list[str]:
    """The table ``busd sessions`` prints: columns as wide as what they hold.

    ``IN`` is uncached input and ``CACHE`` the cache reads and writes beside
    it (busd's meaning of input: docs/usage.md), so ``IN + CACHE`` is the
    whole prompt; ``COST`` is ``-`` where the source said none.
    """
    header = ("SESSION", "LAST ACTIVE", "STATUS", "MODEL", "IN", "OUT", "CACHE", "COST", "TITLE")
    rows: list[tuple[str, ...]] = []
    for r in records:
        usage = r.usage
        cost = usage.cost_usd if usage is not None else None
        rows.append(
            (
                r.session_id,
                time.strftime("%Y-%m-%d %H:%M", time.localtime(r.last_ts)),
                r.status,
                r.model or r.adapter or "-",
                "-" if usage is None else format_tokens(usage.input_tokens),
                "-" if usage is None else format_tokens(usage.output_tokens),
                "-"
                if usage is None
                else format_tokens(usage.cache_read_tokens + usage.cache_write_tokens),
                "-" if cost is None else f"${cost:.2f}",
                (r.title or "") + (" (oldest events removed)" if r.truncated else ""),
            )
        )
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header) - 1)]
    right = {4, 5, 6, 7}  # the figures
    lines = []
    for row in [header, *rows]:
        cells = [
            cell.rjust(width) if i in right else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=False))
        ]
        lines.append(("  ".join(cells) + "  " + row[-1]).rstrip())
    return lines


@click.command()
@journal_option
@click.argument("session_id", metavar="SESSION")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["jsonl", "json"]),
    default="jsonl",
    show_default=True,
    help="jsonl: the session, then one message per line; json: one document.",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    default=None,
    help="Write to this file (default: standard output).",
)
def export(journal_path: Path | None, session_id: str, fmt: str, output: Path | None) -> None:
    """Write a journaled session's transcript: messages with their parts, runs, usage.

    Reasoning keeps its provider signature, tool calls their input and
    results; the format is in docs/journal.md.
    """
    decoder = msgspec.msgpack.Decoder(Catalog().envelope_type())
    envelopes: list[Envelope[Event]] = []
    skipped = 0
    with _reader(journal_path) as reader:
        record = reader.session(session_id)
        if record is None:
            fail(f"no session {session_id!r} in {reader.path} (see `busd sessions`)")
        for blob in reader.session_events(session_id):
            try:
                envelopes.append(decoder.decode(blob))
            except (msgspec.DecodeError, msgspec.ValidationError):
                skipped += 1  # an event type of a plugin this busd does not load
    transcript = build_transcript(session_id, envelopes)
    data = export_document(record, transcript, lines=fmt == "jsonl")
    if output is None:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    else:
        try:
            output.write_bytes(data)
        except OSError as exc:
            fail(f"cannot write {output}: {exc.strerror or exc}")
    if skipped:
        click.echo(f"busd: {skipped} event(s) of unknown types left out", err=True)
