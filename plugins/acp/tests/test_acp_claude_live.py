"""busd's acp driver runs the real ``claude-agent-acp`` (issue 17).

The agent is the npm package ``@agentclientprotocol/claude-agent-acp``
pinned in contrib/agents. It wraps the TypeScript Claude Agent SDK, which
starts the Claude Code binary of its own platform package
(``@anthropic-ai/claude-agent-sdk-linux-x64``, installed with it; the
``CLAUDE_CODE_EXECUTABLE`` variable would choose another). It runs on the
Node.js the machine has (20; the package asks for 22 but works), isolated in
the test's own home, with ``ANTHROPIC_BASE_URL`` at the scripted stand-in
(``plugins/claude_code/tests/messages_stand_in.py``) and ``ANTHROPIC_MODEL``
naming a model busd's price table knows. Nothing is faked between the
daemon and the agent: the driver starts it through the ACP SDK.

What it reports: its prompt response's ``_meta.quota.model_usage`` counts
every call of the turn (the side call before it too), and ``usage_update``
the session's cost, priced by Claude Code itself: both must equal what the
stand-in served and busd's own price for it. Its tools carry their raw name
(``Write``) beside ACP's title (``Write hello.txt``) and kind (``edit``),
which is what rules match (bug 8). In its ``default`` mode (ACP
``session/set_mode``) a file write asks first. Its notices (a mode it cannot
serve) are warnings, not answer text (bug 9), and a continued session is
loaded in a new agent process (``session/load``) and adds up.
"""

from __future__ import annotations

import itertools
import json
import math
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio

from busd import TokenUsage, add_usage, cost_usd
from busd.core.events import (
    Envelope,
    Event,
    PermissionRequested,
    PermissionResolved,
    RunFinished,
    RunStarted,
    SessionWarning,
    TextComplete,
    ToolComplete,
    ToolStart,
    Usage,
)
from busd.core.permissions import PermissionRule
from busd.daemon.hub import Daemon, DaemonConfig
from busd.plugins.manager import PluginManager
from tests.daemon_helpers import load_module

ROOT = Path(__file__).resolve().parents[3]
AGENT = ROOT / "contrib/agents/node_modules/.bin/claude-agent-acp"
HELPERS = ROOT / "plugins/claude_code/tests"
NODE = shutil.which("node") or "node"
MODEL = "claude-sonnet-4-5-20250929"
PROMPT = "Write hello into hello.txt."

pytestmark = pytest.mark.skipif(
    not AGENT.exists(),
    reason=f"no claude-agent-acp at {AGENT} (install it: cd contrib/agents && npm install)",
)
E = TypeVar("E", bound=Event)


def _load(name: str) -> Any:
    return load_module(HELPERS / f"{name}.py", f"acp_claude_{name}")


standin_module = _load("messages_stand_in")
live = _load("live_processes")


def agent_env(root: Path, model_url: str) -> dict[str, str]:
    """What the agent gets beside the ACP SDK's trimmed environment: its own home, the model."""
    home = root / "home"
    home.mkdir(parents=True, exist_ok=True)
    return {
        "HOME": str(home),
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "TMPDIR": str(root),
        "ANTHROPIC_BASE_URL": model_url,
        "ANTHROPIC_API_KEY": "sk-ant-stand-in",
        "ANTHROPIC_MODEL": MODEL,
    }


def _tokens(served: Mapping[str, int]) -> TokenUsage:
    return TokenUsage(
        input_tokens=served["input_tokens"],
        output_tokens=served["output_tokens"],
        cache_read_tokens=served["cache_read_input_tokens"],
        cache_write_tokens=served["cache_creation_input_tokens"],
    )


def _counts(tokens: TokenUsage) -> tuple[int, int, int, int]:
    return (
        tokens.input_tokens,
        tokens.output_tokens,
        tokens.cache_read_tokens,
        tokens.cache_write_tokens,
    )


class Frontend:
    """A daemon with the installed plugins; its frontend answers what no rule decided."""

    def __init__(self, rules: tuple[PermissionRule, ...], *, allow: bool) -> None:
        plugins = PluginManager(environ={})
        plugins.load_entry_points()
        self.daemon = Daemon(DaemonConfig(permission_rules=rules), plugins=plugins)
        self.allow = allow
        self.seen: list[Envelope[Event]] = []
        self.finished = trio.Event()
        self.progress = trio.Event()
        self._send, self._requests = trio.open_memory_channel[PermissionRequested](16)
        self.daemon.bus.on_all(self._record)

    def _record(self, envelope: Envelope[Event]) -> None:
        self.seen.append(envelope)
        self.progress.set()
        match envelope.event:
            case PermissionRequested() as request:
                self._send.send_nowait(request)
            case RunFinished():
                self.finished.set()

    async def answer(self) -> None:
        async for request in self._requests:
            if not self.daemon.broker.is_resolved(request.request_id):
                self.daemon.broker.reply(request.request_id, by="frontend", allow=self.allow)

    def of(self, cls: type[E]) -> list[E]:
        return [e.event for e in self.seen if e.run_id is not None and isinstance(e.event, cls)]


@pytest.mark.parametrize(
    ("rules", "allowed", "by"),
    [
        ((PermissionRule(action="allow", tool="Write"),), True, "rule:0"),
        ((PermissionRule(action="deny", category="edit"),), False, "rule:0"),
        ((), True, "frontend"),
    ],
    ids=["allowed-by-its-name", "denied-by-its-kind", "allowed-by-a-frontend"],
)
async def test_claude_agent_acp_writes_a_file_when_allowed_and_counts_what_it_was_served(
    tmp_path: Path, rules: tuple[PermissionRule, ...], allowed: bool, by: str
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    target = project / "hello.txt"
    write = {"file_path": str(target), "content": "hello\n"}
    frontend = Frontend(rules, allow=True)
    with standin_module.StandIn(tool=("Write", write)) as standin:
        async with trio.open_nursery() as nursery:
            await nursery.start(frontend.daemon.run)
            nursery.start_soon(frontend.answer)
            frontend.daemon.runs.start(
                adapter="acp",
                prompt=PROMPT,
                started_by="test",
                cwd=str(project),
                permission_mode="default",  # Claude Code's "ask before edits"
                options={"command": [NODE, str(AGENT)], "env": agent_env(tmp_path, standin.url)},
            )
            with trio.fail_after(live.REACH):
                await frontend.finished.wait()
            nursery.cancel_scope.cancel()
    [finished] = frontend.of(RunFinished)
    assert finished.status == "ok", finished.error
    # The tool call, with its input, asked for under its own name, title and kind.
    [tool] = frontend.of(ToolStart)
    assert (tool.name, tool.input) == ("Write", write)
    [asked] = frontend.of(PermissionRequested)
    assert (asked.tool, asked.title, asked.category, asked.input) == (
        "Write",
        "Write hello.txt",
        "edit",
        write,
    )
    [resolved] = frontend.of(PermissionResolved)
    assert (resolved.outcome, resolved.by) == ("allowed" if allowed else "denied", by)
    [done] = frontend.of(ToolComplete)
    assert (done.tool_call_id, done.status) == (tool.tool_call_id, "ok" if allowed else "error")
    assert target.exists() is allowed
    if allowed:
        assert target.read_text() == "hello\n"
    assert standin_module.ANSWER in [t.text for t in frontend.of(TextComplete)]
    # Tokens: every call of the turn as served (the side call before it, the tool
    # call, the answer; a prompt suggestion may follow the turn and is not its own).
    kinds = standin.kinds()
    turn = standin.served[: kinds.index("answer") + 1]
    # One tool call and one answer; Claude Code's side requests (a title, sometimes a
    # second one) race with them: one or two land before the answer, and count.
    in_turn = [s.kind for s in turn]
    assert (in_turn.count("tool"), in_turn.count("answer")) == (1, 1)
    assert 1 <= in_turn.count("side") == len(in_turn) - 2
    served = TokenUsage()
    for call in turn:
        served = TokenUsage(
            input_tokens=served.input_tokens + call.usage["input_tokens"],
            output_tokens=served.output_tokens + call.usage["output_tokens"],
            cache_read_tokens=served.cache_read_tokens + call.usage["cache_read_input_tokens"],
            cache_write_tokens=served.cache_write_tokens
            + call.usage["cache_creation_input_tokens"],
        )
    assert _counts(finished.usage) == _counts(served)
    assert {model: _counts(t) for model, t in finished.models.items()} == {MODEL: _counts(served)}
    # Cost: Claude Code's own price (usage_update), equal to busd's table for the model.
    priced = cost_usd(MODEL, served)
    assert priced is not None
    assert finished.usage.cost_usd == pytest.approx(priced, rel=1e-9)
    assert frontend.of(Usage)[-1].tokens.cost_usd == finished.usage.cost_usd
    # ...and the model was told what came of it: the file written, or the refusal.
    told = json.dumps(standin.requests[kinds.index("answer")]["messages"][-1])
    said = "File created successfully" if allowed else "refused permission"
    assert said in told
    assert ('"is_error": true' in told) is not allowed


def _cancel_args(root: Path, model_url: str) -> list[Any]:
    """``busd run`` arguments for claude-agent-acp in ``root/project``, at the stand-in."""
    project = root / "project"
    project.mkdir()
    options = {"command": [NODE, str(AGENT)], "env": agent_env(root, model_url)}
    args: list[Any] = ["--adapter", "acp", "--cwd", project]
    for key, value in options.items():
        args += ["--option", f"{key}={json.dumps(value)}"]
    return [*args, "Count slowly to three."]


async def test_ctrl_c_on_busd_run_stops_claude_agent_acp_mid_answer(tmp_path: Path) -> None:
    """``busd run --adapter acp`` with its in-process daemon; Ctrl-C while the answer streams.

    The SIGINT goes to the whole job, as a terminal sends it: the agent runs
    in a process group of its own, so only busd hears it and cancels the ACP
    way (``session/cancel``: the prompt is answered ``cancelled``). The agent
    (``node``) and the Claude Code it started are gone when ``busd run`` exits.
    """
    with standin_module.StandIn(slow=True) as standin:
        midway = await live.ctrl_c_midway(
            tmp_path,
            standin,
            _cancel_args(tmp_path, standin.url),
            env=live.busd_env(tmp_path),
            agent="claude-agent-acp",
            last=standin_module.SLOW_WORDS[-1],
            job=True,
        )
    _assert_cancelled_cleanly(midway)


async def test_busd_cancel_stops_claude_agent_acp_mid_answer_through_busd_serve(
    tmp_path: Path,
) -> None:
    """The same run through a running ``busd serve``, cancelled by ``busd cancel RUN_ID``."""
    with standin_module.StandIn(slow=True) as standin:
        midway = await live.busd_cancel_midway(
            tmp_path,
            standin,
            _cancel_args(tmp_path, standin.url),
            env=live.busd_env(tmp_path),
            agent="claude-agent-acp",
            last=standin_module.SLOW_WORDS[-1],
        )
    assert midway.daemon_alive  # the daemon lives on; the agent's processes do not
    _assert_cancelled_cleanly(midway)


def _assert_cancelled_cleanly(midway: Any) -> None:
    midway.assert_stopped_cleanly("".join(standin_module.SLOW_WORDS))
    assert any("claude-agent-sdk" in command for command in midway.processes.values())


async def _run(frontend: Frontend, prompt: str, env: dict[str, str], **fields: Any) -> RunFinished:
    """One run of claude-agent-acp through the daemon, to its end."""
    done = len(frontend.of(RunFinished))
    state = frontend.daemon.runs.start(
        adapter="acp",
        prompt=prompt,
        started_by="test",
        options={"command": [NODE, str(AGENT)], "env": env},
        **fields,
    )
    with trio.fail_after(live.REACH):
        while len(frontend.of(RunFinished)) == done:
            await frontend.progress.wait()
            frontend.progress = trio.Event()
    [finished] = [
        e.event
        for e in frontend.seen
        if e.run_id == state.run_id and isinstance(e.event, RunFinished)
    ]
    return finished


async def test_claude_agent_acp_warns_of_a_mode_it_cannot_serve_beside_its_answer(
    tmp_path: Path,
) -> None:
    """Bug 9: asked for ``auto`` on a model without it, it falls back and says so.

    busd asks for ACP ``notice`` updates, so the notice is a
    ``stream.session.warning`` and the answer is only the model's.
    """
    project = tmp_path / "project"
    project.mkdir()
    frontend = Frontend((), allow=True)
    with standin_module.StandIn() as standin:
        async with trio.open_nursery() as nursery:
            await nursery.start(frontend.daemon.run)
            env = agent_env(tmp_path, standin.url)
            finished = await _run(
                frontend, "Say hello.", env, cwd=str(project), permission_mode="auto"
            )
            nursery.cancel_scope.cancel()
    assert finished.status == "ok", finished.error
    assert frontend.of(SessionWarning) == [
        SessionWarning(
            message="Auto mode unavailable: The selected model does not support Auto mode; "
            "using Accept edits instead."
        )
    ]
    assert [t.text for t in frontend.of(TextComplete)] == [standin_module.ANSWER]


async def test_a_continued_claude_agent_acp_session_remembers_and_adds_up_its_runs(
    tmp_path: Path,
) -> None:
    """Run 2 names run 1's session: the driver loads it (``session/load``) in a new agent.

    The model sees the earlier conversation again; each run counts its own
    calls, and the session's total is the sum of its runs (bug 1's rule).
    """
    project = tmp_path / "project"
    project.mkdir()
    frontend = Frontend((), allow=True)
    with standin_module.StandIn() as standin:
        async with trio.open_nursery() as nursery:
            await nursery.start(frontend.daemon.run)
            env = agent_env(tmp_path, standin.url)
            first = await _run(frontend, "Remember the word okra.", env, cwd=str(project))
            [started] = frontend.of(RunStarted)
            session_id = next(e.session_id for e in frontend.seen if e.event is started)
            assert session_id is not None
            served_first = len(standin.served)
            second = await _run(
                frontend, "Which word?", env, cwd=str(project), session_id=session_id
            )
            nursery.cancel_scope.cancel()
    assert (first.status, second.status) == ("ok", "ok"), (first.error, second.error)
    # The conversation went on: run 2's answer call carries run 1's prompt and answer.
    later = json.dumps([r["messages"] for r in standin.requests[served_first:]])
    assert "Remember the word okra." in later
    assert standin_module.ANSWER in later
    # Each run counts its own calls: claude-agent-acp's model_usage holds its answer
    # and some of the side calls racing with it (after a load, not the title), so the
    # counts are the sum of some of the run's calls, the answer among them (a call's
    # usage grows with its number: the sum says how many were counted and their numbers'
    # total).
    assert _some_of(standin.served[:served_first], first.usage)
    assert _some_of(standin.served[served_first:], second.usage)
    # Its cost: after the load the agent's cost is the session's, run 1's included
    # (priced by Claude Code as busd's table does, its title call too, which its
    # model_usage leaves out). The daemon takes it as the session's, so run 1's share
    # is the price of some of its calls, its answer among them (which side calls the
    # agent had counted when it last reported races, as above), and run 2's is the
    # price of some of its own calls, its answer among them, and of the run-1 calls
    # run 1's share left out: a side call still streaming when run 1 reported is in
    # the loaded session's cost, so it lands in run 2's share, once.
    assert second.usage.cost_usd is not None
    before, after = standin.served[:served_first], standin.served[served_first:]
    assert any(
        next(_priced(late + after, second.usage.cost_usd, answer_after=served_first), None)
        for run1 in _priced(before, first.usage.cost_usd)
        for late in [[call for call in before if call not in run1]]
    )
    # The session's totals are the sum of its runs (bug 1's rule), the cost too.
    snapshot = frontend.daemon.sessions.snapshot(session_id)
    assert snapshot is not None
    assert snapshot.usage is not None
    assert _counts(snapshot.usage) == _counts(add_usage(first.usage, second.usage))
    assert snapshot.usage.cost_usd == pytest.approx(
        (first.usage.cost_usd or 0.0) + second.usage.cost_usd, rel=1e-9
    )


def _priced(
    served: list[Any], cost: float | None, *, answer_after: int = 0
) -> Iterator[tuple[Any, ...]]:
    """Each set of the ``served`` calls whose price in busd's table is ``cost``, an answer
    numbered above ``answer_after`` among them (calls of the same count and number sum
    cost the same, so several sets can fit)."""
    if cost is None:
        return
    for size in range(1, len(served) + 1):
        for calls in itertools.combinations(served, size):
            if any(call.kind == "answer" and call.n > answer_after for call in calls) and (
                math.isclose(sum(cost_usd(c.model, _tokens(c.usage)) or 0.0 for c in calls), cost)
            ):
                yield calls


def _some_of(served: list[Any], usage: TokenUsage) -> bool:
    """Whether ``usage`` is the sum of some of the ``served`` calls, an answer among them."""
    return any(
        _counts(_sum(list(calls))) == _counts(usage)
        for size in range(1, len(served) + 1)
        for calls in itertools.combinations(served, size)
        if any(call.kind == "answer" for call in calls)
    )


def _sum(served: list[Any]) -> TokenUsage:
    total = TokenUsage()
    for call in served:
        total = add_usage(total, _tokens(call.usage))
    return total
