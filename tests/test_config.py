from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from busd.cli import main
from busd.cli.serve import permission_wait
from busd.core.events import PermissionRequested
from busd.core.permissions import match_rule
from busd.daemon.broker import DEFAULT_PERMISSION_TIMEOUT
from busd.daemon.config import ConfigError, load_config

GOOD = """
[runs]
watchdog = 30

[permissions]
timeout = 120

[[permissions.rules]]
action = "allow"
tool = "Read"

[[permissions.rules]]
action = "deny"
category = "execute"
command = "rm -rf"

[[permissions.rules]]
action = "ask"
"""


def test_a_policy_file_becomes_rules_in_order(tmp_path: Path) -> None:
    path = tmp_path / "busd.toml"
    path.write_text(GOOD)
    config = load_config(path)
    assert config.runs.watchdog == 30
    assert config.permissions.timeout == 120
    rules = config.permissions.rules
    assert [r.action for r in rules] == ["allow", "deny", "ask"]
    rm = PermissionRequested(
        request_id="p", tool="Bash", category="execute", input={"command": "rm -rf /"}
    )
    ls = PermissionRequested(
        request_id="p", tool="Bash", category="execute", input={"command": "ls"}
    )
    assert match_rule(rules, rm) == (1, rules[1])
    assert match_rule(rules, ls) == (2, rules[2])
    assert match_rule(rules, PermissionRequested(request_id="p", tool="Read")) == (0, rules[0])


def test_a_rule_may_list_several_categories_and_tools(tmp_path: Path) -> None:
    """As simse's rules do: one rule for read and search, one for two shells (issue 22)."""
    path = tmp_path / "busd.toml"
    path.write_text(
        "[[permissions.rules]]\naction = 'allow'\ncategory = ['read', 'search']\n"
        "[[permissions.rules]]\naction = 'deny'\ntool = ['Bash', 'mcp__shell__*']\n"
        "[[permissions.rules]]\naction = 'ask'\n"
    )
    rules = load_config(path).permissions.rules

    def decided(tool: str, category: str | None = None) -> int | None:
        match = match_rule(rules, PermissionRequested(request_id="p", tool=tool, category=category))
        return None if match is None else match[0]

    assert decided("Grep", "search") == 0
    assert decided("Read", "read") == 0
    assert decided("Write", "edit") == 2
    assert decided("Write") == 2  # no category: a category rule does not match
    assert decided("Bash", "execute") == 1
    assert decided("mcp__shell__run") == 1
    assert decided("mcp__files__read") == 2


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[permissions.rules]]\naction = 'deny'\ncategory = []\n", "category is an empty list"),
        ("[[permissions.rules]]\naction = 'deny'\ntool = []\n", "tool is an empty list"),
        ("[[permissions.rules]]\naction = 'deny'\ntool = ['Bash', 3]\n", "tool"),
        ("[permissions]\ntimout = 3\n", "timout"),  # a typo must not weaken a policy silently
        ("[[permissions.rules]]\naction = 'maybe'\n", "action"),
        ("[[permissions.rules]]\naction = 'deny'\ntoool = 'Bash'\n", "toool"),
        ("[runs\n", "not valid TOML"),
        ("[permissions]\ntimeout = -5\n", r"\[permissions\]: timeout is a duration"),
        ("[permissions]\ntimeout = 'soon'\n", r"\[permissions\]: 'soon' is not a duration"),
    ],
)
def test_a_bad_policy_file_is_a_clear_error(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "busd.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def test_serve_refuses_a_bad_policy_file_before_listening(tmp_path: Path) -> None:
    path = tmp_path / "busd.toml"
    path.write_text("[permissions]\nrules = 'all'\n")
    result = CliRunner().invoke(
        main, ["serve", "--socket", str(tmp_path / "bus.sock"), "--config", str(path)]
    )
    assert result.exit_code == 2
    assert "rules" in result.output
    assert not (tmp_path / "bus.sock").exists()
    missing = CliRunner().invoke(main, ["serve", "--config", str(tmp_path / "nope.toml")])
    assert missing.exit_code == 2
    assert "cannot read" in missing.output


@pytest.mark.parametrize(
    ("text", "flag", "seconds"),
    [
        ("", None, DEFAULT_PERMISSION_TIMEOUT),  # nothing said: 5 minutes, not for ever
        ("[permissions]\ntimeout = 120\n", None, 120.0),
        ("[permissions]\ntimeout = '2m'\n", None, 120.0),
        ("[permissions]\ntimeout = 0\n", None, None),  # 0: wait for ever
        ("[permissions]\ntimeout = '2m'\n", 30.0, 30.0),  # the flag wins
        ("[permissions]\ntimeout = '2m'\n", 0.0, None),
        ("", 45.0, 45.0),
    ],
)
def test_how_long_a_permission_waits_for_a_person(
    tmp_path: Path, text: str, flag: float | None, seconds: float | None
) -> None:
    path = tmp_path / "busd.toml"
    path.write_text(text)
    assert DEFAULT_PERMISSION_TIMEOUT == 300.0
    assert permission_wait(load_config(path), flag) == seconds


def test_serve_refuses_a_permission_timeout_that_is_not_a_duration(tmp_path: Path) -> None:
    for value in ("-1", "soon"):
        result = CliRunner().invoke(
            main, ["serve", "--socket", str(tmp_path / "bus.sock"), "--permission-timeout", value]
        )
        assert result.exit_code == 2, result.output
        assert "--permission-timeout" in result.output
        assert "is not a duration" in result.output
        assert not (tmp_path / "bus.sock").exists()
