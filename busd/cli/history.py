"""The journal, read directly (daemon running or not): ``busd sessions``, ``busd export``."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click
import msgspec

from ..core.catalog import Catalog
from ..core.events import Envelope, Event
from ..daemon.journalfile import JournalError, JournalReader
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
    click.echo(
        f"{'SESSION':<22} {'LAST ACTIVE':<16} {'STATUS':<6} {'ADAPTER/MODEL':<32} "
        f"{'EVENTS':>7} {'IN':>7} {'OUT':>7}  TITLE"
    )
    for r in records:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(r.last_ts))
        agent = "/".join(part for part in (r.adapter, r.model) if part) or "-"
        usage = r.usage
        tokens_in = "-" if usage is None else format_tokens(usage.input_tokens)
        tokens_out = "-" if usage is None else format_tokens(usage.output_tokens)
        title = (r.title or "") + (" (oldest events removed)" if r.truncated else "")
        click.echo(
            f"{r.session_id:<22} {when:<16} {r.status:<6} {agent[:32]:<32} "
            f"{r.events:>7} {tokens_in:>7} {tokens_out:>7}  {title}".rstrip()
        )


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
