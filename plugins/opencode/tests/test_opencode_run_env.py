"""The opencode driver takes the run's environment, its starter's (issue 17, bug 6)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from busd_opencode._serve import PATH_ENV, ServerFailed
from busd_opencode.driver import OpenCodeDriver

from busd import RunRequest
from tests.daemon_helpers import quiet_port


class Context:
    """Just enough of a RunContext: this run fails before the driver feeds anything."""

    def __init__(self, request: RunRequest) -> None:
        self.request = request
        self.run_id = "run-1"

    def feed(self, raw: object) -> list[Any]:
        raise AssertionError(f"nothing is fed: {raw!r}")


async def test_the_server_it_starts_has_the_runs_environment_and_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """URL, binary and the server's environment all come from ``request.env``."""
    fake = tmp_path / "opencode-fake"
    fake.write_text('#!/bin/sh\necho "$WHO $PWD" > "$OUT"\necho "Error: no" >&2\nexit 1\n')
    fake.chmod(0o755)
    project = tmp_path / "project"
    project.mkdir()
    out = tmp_path / "seen"
    # The daemon's environment names another server and binary; neither is used.
    monkeypatch.setenv("OPENCODE_BASE_URL", "http://127.0.0.1:9/daemons")
    monkeypatch.setenv(PATH_ENV, str(tmp_path / "the-daemons-opencode"))
    env = {
        "PATH": "/usr/bin:/bin",
        "WHO": "the-caller",
        "OUT": str(out),
        "OPENCODE_BASE_URL": f"http://127.0.0.1:{quiet_port()}",
        PATH_ENV: str(fake),
    }
    request = RunRequest(
        adapter="opencode", prompt="hi", session_id="s-1", cwd=str(project), env=env
    )
    with trio.fail_after(10), pytest.raises(ServerFailed, match="serve exited: Error: no"):
        await OpenCodeDriver().run(Context(request))  # type: ignore[arg-type]
    assert out.read_text().split() == ["the-caller", str(project)]
