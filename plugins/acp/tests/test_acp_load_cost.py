"""A session continued with ``session/load`` counts its cost once (issue 17, a continued session).

The recordings (fixtures/README.md): claude-agent-acp 0.101.0, one run on
a new session, then a new agent process that loads it and answers one more
prompt. The second run's ``usage_update`` cost (0.106866) is Claude Code's
restored session total: the first run's 0.024048 again, plus this run's
calls (its title call too, which its ``model_usage`` leaves out). Its counts
are this run's only. ``opencode acp`` 1.18.33 (``opencode-acp-load-*.jsonl``)
does the same: after a load its cost 0.055572 is run 1's 0.01995 plus this
run's calls, its usage its last message's.

So after a load the translator says its cost spans the runs
(``cost_spans_runs``), and the daemon takes that cost as the session's and
adds only the counts: run 2's share is 0.106866 - 0.024048 = 0.082818, and
0.055572 - 0.01995 = 0.035622, as each agent priced its calls.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
import trio
from busd_acp import AcpAdapter

from busd import SessionWarning, TokenUsage, Translator, Usage, add_usage
from busd.client import connect
from busd.core.events import RunFinished
from busd.plugins.manager import PluginManager
from tests.daemon_helpers import running_daemon

FIXTURES = Path(__file__).resolve().parent / "fixtures"
MODEL = "claude-sonnet-4-5-20250929"


def translated(name: str) -> tuple[list[Any], Translator]:
    lines = [json.loads(line) for line in (FIXTURES / name).read_text().splitlines() if line]
    translator = AcpAdapter().translator(session_id="s1")
    out: list[Any] = []
    for i, line in enumerate(lines):
        out += [e.event for e in translator.feed(line, float(i))]
    return out, translator


def events(name: str) -> list[Any]:
    return translated(name)[0]


def last_usage(name: str) -> Usage:
    return [e for e in events(name) if isinstance(e, Usage)][-1]


def counts(tokens: TokenUsage) -> tuple[int, int, int, int]:
    return (
        tokens.input_tokens,
        tokens.output_tokens,
        tokens.cache_read_tokens,
        tokens.cache_write_tokens,
    )


def test_a_new_session_takes_the_agents_cost() -> None:
    usage = last_usage("claude-agent-acp-load-1.jsonl")
    assert counts(usage.tokens) == (36, 66, 1500, 6000)  # the stand-in's calls 1 to 3
    assert usage.tokens.cost_usd == 0.024048  # Claude Code's price, as it said it


def test_a_loaded_session_says_its_cost_spans_the_earlier_runs() -> None:
    out, translator = translated("claude-agent-acp-load-2.jsonl")
    usage = [e for e in out if isinstance(e, Usage)][-1]
    assert counts(usage.tokens) == (35, 55, 6500, 15000)  # calls 7 and 8
    assert usage.tokens.cost_usd == pytest.approx(0.106866)  # the agent's: run 1's 0.024048 within
    assert translator.cost_spans_runs
    assert not translated("claude-agent-acp-load-1.jsonl")[1].cost_spans_runs


def test_opencode_acp_on_a_new_session_takes_its_cost_for_every_call() -> None:
    usage = last_usage("opencode-acp-load-1.jsonl")
    assert counts(usage.tokens) == (13, 23, 1000, 3000)  # its last message: call 3
    assert usage.tokens.cost_usd == 0.019950000000000002  # calls 2 and 3, as OpenCode said


def test_opencode_acp_after_a_load_says_its_cost_spans_the_earlier_runs() -> None:
    out, translator = translated("opencode-acp-load-2.jsonl")
    [usage] = [e for e in out if isinstance(e, Usage)]
    assert counts(usage.tokens) == (15, 25, 2000, 5000)  # its last message: call 5
    assert usage.tokens.cost_usd == pytest.approx(0.055572)  # run 1's 0.01995 within
    assert translator.cost_spans_runs
    assert [e for e in out if isinstance(e, SessionWarning)] == []


# -- through a daemon: two runs of one session, replayed -----------------------------------


def recording(tmp_path: Path, name: str) -> Path:
    """A ``replay`` recording of a fixture: its lines as they were, all at once."""
    path = tmp_path / f"{name}.replay.jsonl"
    header = {"busd_recording": 1, "adapter": "acp", "title": name, "prompt": name}
    lines = [json.dumps(header)] + [
        json.dumps({"at": 0.0, "raw": json.loads(line)})
        for line in (FIXTURES / name).read_text().splitlines()
        if line
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


async def finished_run(client: Any, path: Path, session_id: str | None) -> tuple[str, RunFinished]:
    async with client.subscribe(["busd.run.finished"], window_ms=0) as sub:
        started = await client.start_run(
            "acp",
            "replay",
            driver="replay",
            session_id=session_id,
            options={"recording": str(path), "speed": 0},
        )
        with trio.fail_after(30):
            async for batch in sub:
                for envelope in batch.events:
                    if envelope.run_id == started["run_id"]:
                        assert isinstance(envelope.event, RunFinished)
                        return started["session_id"], envelope.event
    raise AssertionError("no busd.run.finished")


@pytest.mark.parametrize(
    ("agent", "first_cost", "session_cost"),
    [("claude-agent-acp", 0.024048, 0.106866), ("opencode-acp", 0.01995, 0.055572)],
)
async def test_the_second_runs_cost_is_the_agents_less_the_first_runs(
    tmp_path: Path, agent: str, first_cost: float, session_cost: float
) -> None:
    sock = Path(tempfile.mkdtemp(prefix="busd-load-")) / "bus.sock"
    manager = PluginManager(environ={})
    manager.load_entry_points()
    async with (
        running_daemon(sock, plugins=manager) as server,
        connect(sock, client="test") as client,
    ):
        session_id, first = await finished_run(
            client, recording(tmp_path, f"{agent}-load-1.jsonl"), None
        )
        _, second = await finished_run(
            client, recording(tmp_path, f"{agent}-load-2.jsonl"), session_id
        )
        snapshot = server.daemon.sessions.snapshot(session_id)
    assert (first.status, second.status) == ("ok", "ok")
    assert first.usage.cost_usd == pytest.approx(first_cost, rel=1e-9)
    assert second.usage.cost_usd == pytest.approx(session_cost - first_cost, rel=1e-9)
    assert snapshot is not None
    assert snapshot.usage is not None
    assert snapshot.usage.cost_usd == pytest.approx(session_cost, rel=1e-9)
    assert counts(snapshot.usage) == counts(add_usage(first.usage, second.usage))
