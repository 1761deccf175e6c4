"""The claude-code driver gives the CLI the run's environment, its starter's (issue 17, bug 6)."""

from __future__ import annotations

from busd_claude_code.driver import agent_options

from busd import RunRequest


def request(**fields: object) -> RunRequest:
    return RunRequest(adapter="claude-code", prompt="hi", session_id="s", **fields)  # type: ignore[arg-type]


def test_the_starters_environment_and_cwd_go_to_the_cli() -> None:
    env = {"ANTHROPIC_API_KEY": "sk-caller", "PATH": "/usr/bin"}
    options = agent_options(request(env=env, cwd="/work/project"))
    assert options.env == env
    assert str(options.cwd) == "/work/project"


def test_the_env_option_is_added_over_the_starters() -> None:
    env = {"ANTHROPIC_API_KEY": "sk-caller", "ANTHROPIC_BASE_URL": "http://a"}
    options = agent_options(request(env=env, options={"env": {"ANTHROPIC_BASE_URL": "http://b"}}))
    assert options.env == {"ANTHROPIC_API_KEY": "sk-caller", "ANTHROPIC_BASE_URL": "http://b"}


def test_without_one_the_options_env_is_all() -> None:
    assert agent_options(request()).env == {}
    assert agent_options(request(options={"env": {"A": "1"}})).env == {"A": "1"}
