"""The copilot driver starts the CLI from and with the run's environment (issue 17, bug 6)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

import pytest
from busd_copilot import CopilotDriver

from busd import SessionIdle
from tests.daemon_helpers import load_module

HERE = Path(__file__).resolve().parent


def _load(name: str) -> Any:
    return load_module(HERE / f"{name}.py", f"copilot_env_{name}")


driver_tests = _load("test_copilot_driver")  # its fake CLI, context and request helpers


def wrapper(tmp_path: Path) -> tuple[Path, Path]:
    """A ``copilot`` that notes ``$WHO`` and runs the fake CLI: (the program, its note)."""
    note = tmp_path / "who"
    record = tmp_path / "cli-record.jsonl"
    fake = [sys.executable, driver_tests.FAKE, "--fixture", driver_tests.FIXTURE]
    argv = " ".join(shlex.quote(str(a)) for a in [*fake, "--record", record])
    program = tmp_path / "copilot"
    program.write_text(f'#!/bin/sh\necho "$WHO" > {shlex.quote(str(note))}\nexec {argv} "$@"\n')
    program.chmod(0o755)
    return program, note


async def _run(request: Any) -> Any:
    context = driver_tests.ScriptedContext(request, [driver_tests.ALLOW])
    await CopilotDriver().run(context)
    assert context.of(SessionIdle) == [SessionIdle()]
    return context


async def test_the_cli_is_the_starters_copilot_cli_path_with_the_starters_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COPILOT_CLI_PATH", str(tmp_path / "the-daemons-copilot"))
    monkeypatch.setenv("WHO", "the-daemon")
    program, note = wrapper(tmp_path)
    env = {"PATH": "/usr/bin:/bin", "WHO": "the-caller", "COPILOT_CLI_PATH": str(program)}
    await _run(driver_tests.request(env=env))
    assert note.read_text().strip() == "the-caller"


async def test_a_cli_path_option_picks_the_cli_for_one_run(tmp_path: Path) -> None:
    program, note = wrapper(tmp_path)
    env = {"PATH": "/usr/bin:/bin", "WHO": "the-caller"}
    await _run(driver_tests.request(env=env, options={"cli_path": str(program)}))
    assert note.read_text().strip() == "the-caller"


async def test_the_drivers_configured_env_is_added_over_the_starters(tmp_path: Path) -> None:
    program, note = wrapper(tmp_path)
    driver = CopilotDriver(client_options={"env": {"WHO": "configured"}})
    env = {"PATH": "/usr/bin:/bin", "WHO": "the-caller", "COPILOT_CLI_PATH": str(program)}
    context = driver_tests.ScriptedContext(driver_tests.request(env=env), [driver_tests.ALLOW])
    await driver.run(context)
    assert note.read_text().strip() == "configured"
