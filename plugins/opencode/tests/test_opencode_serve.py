"""The opencode driver without a server: it starts ``opencode serve`` itself, or says what to do.

Issue 17: errors that name the fix (bug 7), and the driver starting
``opencode serve`` when none answers. The CLI tests run the real
``busd run`` in a subprocess (``env -i``-like, an unused socket so the run
gets its own in-process daemon) and check what the user sees: one
``busd: error:`` line, exit 1, no traceback, and the same words in
``busd.run.finished``'s error. The live test starts nothing itself: busd
starts the real ``opencode serve`` (contrib/agents, found on ``PATH``)
against the model stand-in.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from busd_opencode._serve import (
    PATH_ENV,
    ServerFailed,
    find_opencode,
    listening_url,
    serving,
)
from busd_opencode.driver import NO_SDK
from opencode_standin import MODEL, OPENCODE, StandIn, opencode_config, opencode_env

BUSD = Path(sys.executable).with_name("busd")
PROMPT = "Run echo hello in the shell and tell me what it printed."
NOWHERE = "http://127.0.0.1:9"  # the discard port: nothing answers there


def busd_run(home: Path, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """One ``busd run --json --adapter opencode``: exit code, stderr, run.finished."""
    environ = {"PATH": "/usr/bin:/bin", "HOME": str(home), **(env or {})}
    environ["BUSD_SOCKET"] = str(home / "no.sock")
    done = subprocess.run(
        [str(BUSD), "run", "--json", "--adapter", "opencode", *args],
        env=environ,
        cwd=home,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    events = [json.loads(line)["event"] for line in done.stdout.splitlines()]
    (finished,) = [e for e in events if e["type"] == "busd.run.finished"]
    return {"code": done.returncode, "stderr": done.stderr, "finished": finished}


def assert_one_error_line(run: dict[str, Any], error: str) -> None:
    assert run["code"] == 1
    assert run["finished"]["error"] == error
    lines = [line for line in run["stderr"].splitlines() if line.startswith("busd: error:")]
    assert lines == [f"busd: error: {error}"]
    assert "Traceback" not in run["stderr"]


# -- errors that name the fix -----------------------------------------------------------


@pytest.mark.parametrize("module", ["opencode_ai", "httpx"])
def test_a_missing_sdk_names_the_extra_to_install(tmp_path: Path, module: str) -> None:
    hidden = tmp_path / "hide" / module
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text(
        f"raise ModuleNotFoundError(\"No module named '{module}'\", name='{module}')\n"
    )
    run = busd_run(tmp_path, "hi", env={"PYTHONPATH": str(hidden.parent)})
    assert_one_error_line(run, f"OpenCodeRunError: {NO_SDK}")


def test_no_server_and_start_server_off_names_the_url_and_how_to_start_one(
    tmp_path: Path,
) -> None:
    run = busd_run(
        tmp_path, "--option", f"base_url={NOWHERE}", "--option", "start_server=false", "hi"
    )
    assert_one_error_line(
        run,
        f"NoServer: no OpenCode server answers at {NOWHERE}: start one (opencode serve "
        "--port 4096, then --option base_url=http://127.0.0.1:4096), "
        "or drop start_server=false to let busd start it",
    )


def test_no_server_and_no_opencode_says_how_to_install_it(tmp_path: Path) -> None:
    run = busd_run(tmp_path, "hi", env={"OPENCODE_BASE_URL": NOWHERE})
    error = run["finished"]["error"]
    assert error.startswith(
        f"NoServer: no OpenCode server answers at {NOWHERE}, and busd cannot start one: "
        "no opencode on PATH (install it: npm install -g opencode-ai; "
        f"or --option opencode_path=/path/to/opencode, or ${PATH_ENV})"
    )
    assert_one_error_line(run, error)


# -- starting and stopping a server (pure parts, then a stand-in binary) ----------------


def test_the_url_is_read_from_what_opencode_serve_prints() -> None:
    said = "Warning: x\nopencode server listening on http://127.0.0.1:40123/\n"
    assert listening_url(said) == "http://127.0.0.1:40123"
    assert listening_url("opencode server starting\n") is None


def test_the_binary_is_the_option_then_the_environment_then_path(tmp_path: Path) -> None:
    (tmp_path / "opencode").write_text("#!/bin/sh\n")
    (tmp_path / "opencode").chmod(0o755)
    path = {"PATH": str(tmp_path)}
    assert find_opencode("/opt/oc", {PATH_ENV: "/env/oc", **path}) == "/opt/oc"
    assert find_opencode(None, {PATH_ENV: "/env/oc", **path}) == "/env/oc"
    assert find_opencode(None, path) == str(tmp_path / "opencode")
    assert find_opencode(None, {"PATH": str(tmp_path / "none")}) is None


def gone(pid: int) -> bool:
    """No such process (a zombie waiting for its reaper counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state == "Z"


@pytest.mark.parametrize("cancelled", [False, True])
async def test_the_server_and_what_it_started_are_stopped_with_the_run(
    tmp_path: Path, cancelled: bool
) -> None:
    """A stand-in ``opencode`` that starts a child of its own: both end with the block."""
    fake = tmp_path / "opencode"
    fake.write_text(
        '#!/bin/sh\nsleep 300 &\necho $$ $! > "$PWD/pids"\n'
        "echo 'opencode server listening on http://127.0.0.1:1'\nwait\n"
    )
    fake.chmod(0o755)
    with trio.CancelScope() as scope:
        async with serving(str(fake), cwd=str(tmp_path)) as url:
            assert url == "http://127.0.0.1:1"
            pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
            assert not any(gone(pid) for pid in pids)
            if cancelled:
                scope.cancel()
                await trio.sleep_forever()
    assert scope.cancelled_caught is cancelled
    with trio.fail_after(5):
        while True:  # the orphaned child is reaped by a reaper outside the test
            if all(gone(pid) for pid in pids):
                break
            await trio.sleep(0.02)


async def test_a_server_that_exits_at_once_is_an_error_with_its_output(tmp_path: Path) -> None:
    fake = tmp_path / "opencode"
    fake.write_text("#!/bin/sh\necho 'Error: port in use' >&2\nexit 1\n")
    fake.chmod(0o755)
    with trio.fail_after(10), pytest.raises(ServerFailed, match="serve exited: Error: port in use"):
        async with serving(str(fake), cwd=str(tmp_path)):
            raise AssertionError("not reached")


# -- the real opencode serve, started by busd -------------------------------------------


@pytest.mark.skipif(
    not OPENCODE.exists(), reason=f"no opencode at {OPENCODE} (cd contrib/agents && npm ci)"
)
def test_busd_run_starts_opencode_serve_and_stops_it(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    with StandIn() as standin:
        (project / "opencode.json").write_text(json.dumps(opencode_config(standin.url)))
        env = opencode_env(tmp_path)
        env["PATH"] = f"{OPENCODE.parent}:{env['PATH']}"
        env["OPENCODE_BASE_URL"] = NOWHERE
        run = busd_run(
            tmp_path,
            *("--model", f"anthropic/{MODEL}", "--cwd", str(project), "--log-level", "info"),
            PROMPT,
            env=env,
        )
        served = [s.usage for s in standin.served if s.counted]
        kinds = [s.kind for s in standin.served if s.counted]
    assert (run["code"], run["finished"]["status"]) == (0, "ok"), run["stderr"]
    usage = run["finished"]["usage"]
    assert kinds == ["tool", "answer"]  # the title call, wherever it came, is not counted
    assert (
        usage["input_tokens"],
        usage["output_tokens"],
        usage["cache_read_tokens"],
        usage["cache_write_tokens"],
    ) == (
        sum(u["input_tokens"] for u in served),
        sum(u["output_tokens"] for u in served),
        sum(u["cache_read_input_tokens"] for u in served),
        sum(u["cache_creation_input_tokens"] for u in served),
    )
    started = re.search(
        r"started \S+ serve at http://127\.0\.0\.1:\d+ \(pid (\d+)\)", run["stderr"]
    )
    assert started is not None, run["stderr"]
    pid = int(started.group(1))
    assert gone(pid)
    left = [p for p in os.listdir("/proc") if p.isdigit() and _cwd(p).startswith(str(tmp_path))]
    assert left == []


def _cwd(pid: str) -> str:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return ""
