"""``busd journal check`` and ``busd journal recover``: a damaged journal, and the way out."""

from __future__ import annotations

from pathlib import Path

import click

from ..daemon.journalfile import JournalError
from ..daemon.journalrecover import check as check_file
from ..daemon.journalrecover import recover as recover_file
from ._common import default_journal_path, fail
from .history import journal_option


@click.group("journal")
def journal_group() -> None:
    """Check a journal, or rebuild a damaged one from what is readable (docs/journal.md)."""


@journal_group.command("check")
@journal_option
def check(journal_path: Path | None) -> None:
    """SQLite's full integrity check of the journal: exit 0 if intact, 1 if damaged.

    Reads the file; works whether the daemon runs or not.
    """
    path = journal_path or default_journal_path()
    try:
        problems = check_file(path)
    except JournalError as exc:
        fail(str(exc))
    if problems == ["ok"]:
        click.echo(f"busd: the journal {path} is intact")
        return
    click.echo(f"busd: the journal {path} is damaged:", err=True)
    for problem in problems:
        click.echo(f"  {problem}", err=True)
    fail(f"`busd journal recover --journal {path}` keeps what is readable")


@journal_group.command("recover")
@journal_option
def recover(journal_path: Path | None) -> None:
    """Move the journal aside (PATH.damaged-TIMESTAMP) and rebuild it from what is readable.

    Seqs that cannot be read are recorded as lost (a resuming client gets a
    gap); the next daemon continues after every seq the old journal knew.
    The daemon must be stopped.
    """
    path = journal_path or default_journal_path()
    try:
        result = recover_file(path)
    except JournalError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot recover {path}: {exc.strerror or exc}")
    click.echo(f"busd: moved the damaged journal to {result.aside}")
    click.echo(
        f"busd: kept {result.events} events and {result.sessions} sessions in {path}; "
        f"the next daemon continues after seq {result.head}"
    )
    if result.damaged:
        lost = ", ".join(f"{a}..{b}" if a != b else str(a) for a, b in result.damaged[:10])
        more = f" and {len(result.damaged) - 10} more ranges" if len(result.damaged) > 10 else ""
        count = sum(b - a + 1 for a, b in result.damaged)
        click.echo(f"busd: {count} seqs could not be read ({lost}{more}): recorded as lost")
