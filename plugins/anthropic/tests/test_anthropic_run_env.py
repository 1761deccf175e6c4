"""The anthropic driver's credentials and URL come from the run's environment (issue 17, bug 6)."""

from __future__ import annotations

import pytest
from busd_anthropic.driver import API_URL, call_arguments

from busd import RunRequest


def request(env: dict[str, str] | None, **options: object) -> RunRequest:
    return RunRequest(adapter="anthropic", prompt="hi", session_id="s", env=env, options=options)


def test_the_starters_key_and_url_configure_the_client(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-the-daemons")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://daemon.invalid")
    env = {"ANTHROPIC_API_KEY": "sk-caller", "ANTHROPIC_BASE_URL": "http://127.0.0.1:1"}
    client, _ = call_arguments(request(env))
    assert client == {"api_key": "sk-caller", "base_url": "http://127.0.0.1:1"}


def test_options_win_over_the_environment() -> None:
    env = {"ANTHROPIC_API_KEY": "sk-caller", "ANTHROPIC_BASE_URL": "http://127.0.0.1:1"}
    client, params = call_arguments(request(env, api_key="sk-opt", base_url="http://o"))
    assert client == {"api_key": "sk-opt", "base_url": "http://o"}
    assert "api_key" not in params


def test_a_token_counts_and_the_default_url_is_not_the_daemons(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://daemon.invalid")
    client, _ = call_arguments(request({"ANTHROPIC_AUTH_TOKEN": "tok"}))
    assert client == {"auth_token": "tok", "base_url": API_URL}


def test_a_starter_without_credentials_leaves_them_to_the_sdk() -> None:
    """The SDK then reads the daemon's environment and its credential profiles."""
    client, _ = call_arguments(request({"PATH": "/bin", "ANTHROPIC_BASE_URL": "http://c"}))
    assert client == {}


def test_a_key_option_keeps_the_options_url() -> None:
    client, _ = call_arguments(request({"ANTHROPIC_API_KEY": "sk-caller"}, api_key="sk-opt"))
    assert client == {"api_key": "sk-opt"}


def test_without_an_environment_the_sdk_reads_the_daemons() -> None:
    client, _ = call_arguments(request(None))
    assert client == {}
