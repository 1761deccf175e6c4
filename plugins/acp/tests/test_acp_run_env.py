"""The acp driver starts the agent with the run's environment, its starter's (issue 17, bug 6)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from busd_acp.driver import AcpDriver

from tests.daemon_helpers import load_module

HERE = Path(__file__).resolve().parent


def _load(name: str) -> Any:
    return load_module(HERE / f"{name}.py", f"acp_env_{name}")


driver_tests = _load("test_acp_driver")  # its fake agent, context and request helpers


async def _mark(tmp_path: Path, **fields: Any) -> tuple[str | None, str]:
    """The ``BUSD_FAKE_MARK`` and cwd the fake agent had."""
    run = driver_tests.request(tmp_path, driver_tests.WRITE_PROMPT, **fields)
    await AcpDriver().run(driver_tests.ScriptedContext(run, [driver_tests.ALLOW]))
    start = driver_tests.recorded(tmp_path)[0]
    return start["mark"], start["cwd"]


@pytest.fixture(autouse=True)
def daemons_mark(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BUSD_FAKE_MARK", "the-daemons")


async def test_the_agent_gets_the_starters_environment_not_the_daemons(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "BUSD_FAKE_MARK": "the-callers"}
    assert await _mark(tmp_path, env=env) == ("the-callers", str(tmp_path))


async def test_the_env_option_is_added_over_the_starters(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "BUSD_FAKE_MARK": "the-callers"}
    options = {"env": {"BUSD_FAKE_MARK": "the-options"}}
    assert await _mark(tmp_path, env=env, options=options) == ("the-options", str(tmp_path))


async def test_without_one_the_agent_gets_the_sdks_trimmed_copy_of_the_daemons(
    tmp_path: Path,
) -> None:
    assert await _mark(tmp_path) == (None, str(tmp_path))
