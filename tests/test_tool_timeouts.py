"""Tool-call limits users can reach: config, flags, and the error result on the bus (issue 16).

The stream is the real recorded Anthropic tool call in ``tests/fixtures/sdk/``
(``anthropic-tool.recorded.jsonl``: one ``tool_use`` block, tool ``json``,
see its README). The Messages API stream never carries the tool's result, so
the call stays open until busd's limit ends it.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from busd_anthropic import AnthropicAdapter
from click.testing import CliRunner

from busd.cli import main
from busd.core.accounting import TIMED_OUT, Accountant
from busd.core.events import Envelope, Event, ToolComplete, ToolStart, ToolTimeout
from busd.daemon.config import ConfigError, load_config
from busd.daemon.hub import Daemon

CAPTURE = Path(__file__).resolve().parent / "fixtures" / "sdk" / "anthropic-tool.recorded.jsonl"
CALL = "toolu_01KFbKqPYSuAKujiL6mTfzYA"


async def test_an_overdue_call_ends_on_the_bus_with_a_timed_out_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    daemon = Daemon(accountant=Accountant(tool_timeout_s=60.0, tool_limits={"json": 5.0}))
    seen: list[Envelope[Event]] = []
    daemon.bus.on_all(seen.append)
    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.run)
        daemon.correlator.start_run("r1", session_id="s1")
        translator = AnthropicAdapter().translator(session_id="s1")
        for line in CAPTURE.read_text().splitlines():
            for item in translator.feed(json.loads(line), trio.current_time()):
                daemon.publish(item.event, session_id="s1", run_id="r1")
        assert [e.event.tool_call_id for e in seen if isinstance(e.event, ToolStart)] == [CALL]

        await trio.sleep(4.9)
        assert not [e for e in seen if isinstance(e.event, ToolComplete | ToolTimeout)]
        await trio.sleep(100)

        timeouts = [e.event for e in seen if isinstance(e.event, ToolTimeout)]
        completes = [e for e in seen if isinstance(e.event, ToolComplete)]
        assert [t.limit_s for t in timeouts] == [5.0]  # the per-tool limit, once
        assert len(completes) == 1
        complete = completes[0]
        assert isinstance(complete.event, ToolComplete)
        assert (complete.event.tool_call_id, complete.event.status) == (CALL, "timed_out")
        assert complete.event.error is not None
        assert complete.event.error.startswith(TIMED_OUT)
        assert complete.event.duration_s == pytest.approx(5.0)
        assert (complete.session_id, complete.run_id) == ("s1", "r1")

        # The call is over: a late real result is a duplicate for the metrics.
        daemon.publish(
            ToolComplete(tool_call_id=CALL, name="json", output="{}"), session_id="s1", run_id="r1"
        )
        metric = daemon.accountant.tools.metric("json")
        assert metric is not None
        assert (metric.calls, metric.errors, metric.timed_out) == (1, 1, 1)
        assert metric.total_s == pytest.approx(5.0)
        assert daemon.accountant.tools.open_calls == 0
        nursery.cancel_scope.cancel()


def test_the_config_file_sets_a_default_and_per_tool_limits(tmp_path: Path) -> None:
    path = tmp_path / "busd.toml"
    path.write_text(
        '[tools]\ntimeout = "10m"\n[tools.limits]\nBash = "30m"\nRead = 0\nWebFetch = 60\n'
    )
    default, limits = load_config(path).tools.seconds()
    assert default == 600.0
    assert limits == {"Bash": 1800.0, "Read": None, "WebFetch": 60.0}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[tools]\ntimout = 3\n", "timout"),
        ("[tools]\ntimeout = -1\n", "tool limit"),
        ("[tools]\ntimeout = inf\n", "tool limit"),
        ('[tools.limits]\nBash = "soon"\n', "not a duration"),
    ],
)
def test_bad_tool_limits_in_the_file_are_clear_errors(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "busd.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def _served_accountant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *args: str
) -> tuple[int, str, Accountant | None]:
    """Run ``busd serve ARGS`` up to the point it makes its daemon; return its accountant."""
    made: list[Daemon] = []

    def fake_run(job: partial[Any]) -> None:
        make = job.args[1]
        made.append(make())

    monkeypatch.setattr("busd.cli.serve.trio.run", fake_run)
    result = CliRunner().invoke(
        main, ["serve", "--socket", str(tmp_path / "bus.sock"), "--no-journal", *args]
    )
    return result.exit_code, result.output, made[0].accountant if made else None


def test_flags_set_the_limits_over_the_config_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "busd.toml"
    path.write_text('[tools]\ntimeout = "10m"\n[tools.limits]\nBash = "30m"\nRead = 20\n')
    code, output, accountant = _served_accountant(
        tmp_path,
        monkeypatch,
        "--config",
        str(path),
        "--tool-timeout",
        "2m",
        "--tool-limit",
        "Bash=1h",
        "--tool-limit",
        "Grep=0",
    )
    assert code == 0, output
    assert accountant is not None
    tools = accountant.tools
    assert tools.limit_for("Edit") == 120.0  # the flag's default
    assert tools.limit_for("Bash") == 3600.0  # the flag's, over the file's
    assert tools.limit_for("Read") == 20.0  # the file's per-tool limit
    assert tools.limit_for("Grep") is None  # 0: no limit


@pytest.mark.parametrize("bad", ["Bash", "=5", "Bash=soon", "Bash=-5"])
def test_a_bad_tool_limit_flag_is_refused_before_listening(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bad: str
) -> None:
    code, output, accountant = _served_accountant(tmp_path, monkeypatch, "--tool-limit", bad)
    assert code == 2
    assert "--tool-limit" in output
    assert accountant is None
