"""The anthropic driver's errors name the fix, as `busd run` shows them (issue 17, bug 7).

Each test runs the real ``busd run`` in a subprocess with an ``env -i``-like
environment and an unused socket (so the run gets its own in-process
daemon): one line on stderr, exit 1, no traceback, and the same message as
``busd.run.finished``'s error.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from busd_anthropic.driver import NO_KEY, NO_SDK

BUSD = Path(sys.executable).with_name("busd")


def busd_run(home: Path, *args: str, **env: str) -> tuple[int, list[str], str | None]:
    """``(exit code, stderr lines, busd.run.finished's error)`` of one ``busd run --json``."""
    environ = {"PATH": "/usr/bin:/bin", "HOME": str(home), "BUSD_SOCKET": str(home / "no.sock")}
    done = subprocess.run(
        [str(BUSD), "run", "--json", *args, "hi"],
        env={**environ, **env},
        cwd=home,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    errors = [
        json.loads(line)["event"].get("error")
        for line in done.stdout.splitlines()
        if json.loads(line)["event"]["type"] == "busd.run.finished"
    ]
    assert len(errors) == 1, done.stdout
    return done.returncode, done.stderr.splitlines(), errors[0]


def failed_with(home: Path, message: str, *args: str, **env: str) -> None:
    code, stderr, error = busd_run(home, "--adapter", "anthropic", *args, **env)
    assert code == 1
    assert error == f"AnthropicRunError: {message}"
    assert [line for line in stderr if line.startswith("busd: error:")] == [f"busd: error: {error}"]
    assert not any("Traceback" in line for line in stderr)


def test_no_credentials_says_to_set_the_key(tmp_path: Path) -> None:
    failed_with(tmp_path, NO_KEY, "--option", "base_url=http://127.0.0.1:9")


def test_a_missing_sdk_names_the_extra_to_install(tmp_path: Path) -> None:
    hidden = tmp_path / "hide" / "anthropic"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'anthropic'\", name='anthropic')\n"
    )
    failed_with(tmp_path, NO_SDK, ANTHROPIC_API_KEY="sk-x", PYTHONPATH=str(hidden.parent))
