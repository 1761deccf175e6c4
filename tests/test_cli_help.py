"""``busd --help`` as a new user reads it: every command's summary says something whole."""

from __future__ import annotations

from click.testing import CliRunner

from busd.cli import main as cli


def test_no_command_summary_is_cut_after_an_abbreviation() -> None:
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    commands = result.output.split("Commands:\n", 1)[1].splitlines()
    assert len(commands) >= 15
    for line in commands:
        _name, summary = line.split(None, 1)
        assert not summary.rstrip(".").endswith(("e.g", "i.e", "etc", "vs")), line
        assert len(summary) > 20, line
