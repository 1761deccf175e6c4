"""The CLI as a new user reads it: whole summaries in ``--help``, no reprs, tables that line up."""

from __future__ import annotations

from click.testing import CliRunner

from busd.cli import main as cli
from busd.cli.history import session_table
from busd.cli.info import status_lines
from busd.core.events import TokenUsage
from busd.daemon.journalfile import SessionRecord


def test_no_command_summary_is_cut_after_an_abbreviation() -> None:
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    commands = result.output.split("Commands:\n", 1)[1].splitlines()
    assert len(commands) >= 15
    for line in commands:
        _name, summary = line.split(None, 1)
        assert not summary.rstrip(".").endswith(("e.g", "i.e", "etc", "vs")), line
        assert len(summary) > 20, line


def test_busd_status_shows_no_python_reprs() -> None:
    result = {
        "server": "0.1.0",
        "clients_by_role": {"frontend": 1, "admin": 1},
        "roles": {"observer": [], "agent": ["publish"]},
        "history": {"held": 3, "capacity": 10},
        "journal": {"path": "/j", "lost": 0, "max_size": None},
        "adapters": ["acp", "anthropic"],
        "nothing": None,
    }
    lines = status_lines(result)
    assert lines == [
        "server:                      0.1.0",
        "clients_by_role:             frontend 1, admin 1",
        "roles:",
        "  observer:                  -",
        "  agent:                     publish",
        "history:                     held 3, capacity 10",
        "journal:",
        "  path:                      /j",
        "  lost:                      0",
        "  max_size:                  -",
        "adapters:                    acp, anthropic",
        "nothing:                     -",
    ]


def test_busd_sessions_columns_are_as_wide_as_what_they_hold() -> None:
    usage = TokenUsage(
        input_tokens=4, output_tokens=1_234, cache_read_tokens=6_000, cost_usd=0.0312
    )
    long_id = "4142c389-504f-4e3a-948f-6a0aa3935eea"
    records = [
        SessionRecord(
            session_id=long_id,
            status="idle",
            model="claude-sonnet-4-5-20250929",
            first_seq=1,
            last_seq=9,
            first_ts=0.0,
            last_ts=0.0,
            events=9,
            usage=usage,
            title="fix the login",
        ),
        SessionRecord(
            session_id="s2",
            status="active",
            first_seq=10,
            last_seq=11,
            first_ts=0,
            last_ts=0,
            events=1,
        ),
    ]
    header, first, second = session_table(records)
    assert header.split() == [
        "SESSION", "LAST", "ACTIVE", "STATUS", "MODEL", "IN", "OUT", "CACHE", "COST", "TITLE"
    ]  # fmt: skip
    assert first.startswith(long_id + "  ")
    assert first.split()[-7:] == ["4", "1.2k", "6.0k", "$0.03", "fix", "the", "login"]
    assert second.split()[-4:] == ["-", "-", "-", "-"]  # no usage: no figures, no cost
    model = header.index("MODEL")
    assert first.index("claude-sonnet") == model
    assert second[model : model + 2] == "- "
