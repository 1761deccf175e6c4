from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from busd.cli import main
from busd.core.events import PermissionRequested
from busd.core.permissions import match_rule
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


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[permissions]\ntimout = 3\n", "timout"),  # a typo must not weaken a policy silently
        ("[[permissions.rules]]\naction = 'maybe'\n", "action"),
        ("[[permissions.rules]]\naction = 'deny'\ntoool = 'Bash'\n", "toool"),
        ("[runs\n", "not valid TOML"),
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
