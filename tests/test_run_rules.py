"""A run's own permission rules (``start_run.permission_rules``) bind before any frontend.

Issue 17, bug 5: ``busd run --deny Write`` answered as one more frontend and
lost the race to a frontend that allows everything at once. Now the rules
travel with the run and the broker decides by them as the request is
published: plugin policy, the daemon's rules, the run's rules, then people.
The frontend here answers every request it sees the instant it sees it, and
the driver waits for that answer to have been given before it asks: in the
old design the frontend won every time; here the run's rules win every time.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from busd.client import Client, RequestFailed, connect
from busd.core.events import Envelope, Event, PermissionRequested, PermissionResolved
from busd.core.permissions import PermissionRule
from busd.daemon.broker import PermissionBroker
from busd.daemon.hub import DaemonConfig
from busd.frontends.headless import EXIT_OK, HeadlessRun, ToolRules, run_headless
from busd.plugins.drivers import PermissionDecision, RunContext
from busd.wire import MALFORMED_FRAME, Reply

from .daemon_helpers import BUSD, RawClient, read_line
from .test_headless import Place, lines, of_type, place
from .test_runs import OPTIONS, ScriptDriver, Watcher, make_daemon, serving, sock_path

__all__ = ["place", "sock_path"]  # the fixtures, used by name

ME = f"[pid={os.getpid()},uid={os.getuid()}]"


class AskingDriver(ScriptDriver):
    """``tools:Write*20,Read,Bash``: asks for each tool in turn, as an SDK would.

    Each request is put on the bus first (as the Claude Code CLI announces
    it on its stream), then the driver waits until ``answered`` says the
    frontend has replied to it, and only then asks the broker: the eager
    frontend's answer is always in before the driver's question.
    """

    def __init__(self, answered: Callable[[str], Any]) -> None:
        super().__init__()
        self.answered = answered

    async def run(self, context: RunContext) -> None:
        tools = [
            name
            for item in context.request.prompt.removeprefix("tools:").split(",")
            for name in [item.partition("*")[0]] * int(item.partition("*")[2] or 1)
        ]
        for index, tool in enumerate(tools):
            request = PermissionRequested(
                request_id=f"p{index}", tool=tool, input={"file_path": "x"}, options=OPTIONS
            )
            context.feed(request)
            await self.answered(f"{context.run_id}/p{index}")
            self.decisions.append(await context.request_permission(request))


class EagerFrontend:
    """Allows every request the instant it sees it; remembers how each answer went."""

    def __init__(self) -> None:
        self.replies: dict[str, str] = {}
        self._done: dict[str, trio.Event] = {}

    async def answered(self, request_id: str) -> None:
        with trio.fail_after(10):
            await self._done.setdefault(request_id, trio.Event()).wait()

    async def serve(self, client: Client, *, task_status: Any) -> None:
        async with client.subscribe(["stream.permission.requested"], window_ms=0) as sub:
            task_status.started()
            async for batch in sub:
                for envelope in batch.events:
                    request_id = envelope.event.request_id  # type: ignore[attr-defined]
                    try:
                        outcome = (await client.reply_permission(request_id, allow=True))["outcome"]
                    except RequestFailed as exc:
                        outcome = exc.code
                    self.replies[request_id] = outcome
                    self._done.setdefault(request_id, trio.Event()).set()


async def _driven(
    path: Path,
    prompt: str,
    rules: Sequence[PermissionRule],
    config: DaemonConfig | None = None,
) -> tuple[AskingDriver, EagerFrontend, list[PermissionResolved]]:
    """Start ``prompt`` with ``rules`` (client ``starter``), an eager frontend attached."""
    eager = EagerFrontend()
    driver = AskingDriver(eager.answered)
    daemon = make_daemon(driver, config)
    watcher = Watcher(daemon)
    async with (
        serving(path, daemon),
        connect(path, client="eager") as frontend,
        connect(path, client="starter") as starter,
        trio.open_nursery() as nursery,
    ):
        await nursery.start(eager.serve, frontend)
        started = await starter.start_run("script", prompt, permission_rules=rules)
        finished = await watcher.finished(started["run_id"])
        assert finished.status == "ok"
        nursery.cancel_scope.cancel()
    resolved = [e.event for e in watcher.seen if isinstance(e.event, PermissionResolved)]
    return driver, eager, resolved


async def test_a_runs_deny_rule_beats_a_frontend_that_allows_at_once(sock_path: Path) -> None:
    rules = [
        PermissionRule(action="deny", tool="Write", reason="--deny Write"),
        PermissionRule(action="allow", tool="Read"),
    ]
    driver, eager, resolved = await _driven(sock_path, "tools:Write*20,Read,Bash", rules)
    writes, (read, bash) = driver.decisions[:20], driver.decisions[20:]
    for decision in writes:
        assert (decision.outcome, decision.by, decision.reason, decision.option_id) == (
            "denied",
            f"starter{ME}",
            "--deny Write",
            "reject",
        )
    assert (read.outcome, read.by, read.reason) == (
        "allowed",
        f"starter{ME}",
        "rule 1 of the run: allow",
    )
    assert (bash.outcome, bash.by) == ("allowed", f"eager{ME}")  # no run rule: people decide
    assert list(eager.replies.values()) == ["already_resolved"] * 21 + ["allowed"]
    assert len(resolved) == 22  # every decision on the bus, once, saying who
    assert [(r.outcome, r.by) for r in resolved] == [(d.outcome, d.by) for d in driver.decisions]


async def test_a_runs_rule_does_not_override_the_daemons(sock_path: Path) -> None:
    daemon_rules = (
        PermissionRule(action="deny", tool="Write"),
        PermissionRule(action="ask", tool="Edit"),
    )
    config = DaemonConfig(permission_rules=daemon_rules)
    run_rules = [PermissionRule(action="allow", tool="*", reason="the starter allows all")]
    driver, _, _ = await _driven(sock_path, "tools:Write,Edit,Read", run_rules, config)
    write, edit, read = driver.decisions
    assert (write.outcome, write.by) == ("denied", "rule:0")  # the daemon's deny stands
    assert (edit.outcome, edit.by) == ("allowed", f"starter{ME}")  # a daemon `ask`: run rules
    assert (read.outcome, read.reason) == ("allowed", "the starter allows all")


async def test_a_run_without_rules_is_left_to_people(sock_path: Path) -> None:
    driver, eager, _ = await _driven(sock_path, "tools:Write", [])
    [write] = driver.decisions
    assert (write.outcome, write.by) == ("allowed", f"eager{ME}")
    assert list(eager.replies.values()) == ["allowed"]


async def test_busd_run_deny_binds_on_a_shared_daemon_twenty_times(sock_path: Path) -> None:
    """``busd run --allow '*' --deny Write``'s own code path, an eager frontend attached."""
    eager = EagerFrontend()
    driver = AskingDriver(eager.answered)
    daemon = make_daemon(driver)
    spec = HeadlessRun(
        adapter="script",
        prompt="tools:Write,Read",
        rules=ToolRules(allow=("*",), deny=("Write",)),
        socket_path=str(sock_path),
    )

    def unused(**_: object) -> Any:
        raise AssertionError("a daemon listens: no in-process one")

    async with (
        serving(sock_path, daemon),
        connect(sock_path, client="eager") as frontend,
        trio.open_nursery() as nursery,
    ):
        await nursery.start(eager.serve, frontend)
        for _ in range(20):
            out: list[str] = []
            code = await run_headless(
                spec, out=out.append, err=out.append, pretty=False, start_local=unused
            )
            assert code == EXIT_OK, out
        nursery.cancel_scope.cancel()
    assert [d.outcome for d in driver.decisions] == ["denied", "allowed"] * 20
    assert {d.reason for d in driver.decisions} == {"--deny Write", "--allow *"}
    assert all(d.by is not None and d.by.startswith("busd-run[pid=") for d in driver.decisions)
    assert set(eager.replies.values()) == {"already_resolved"}


def _start_run(rules: object) -> bytes:
    command = {"cmd": "start_run", "adapter": "script", "prompt": "p", "permission_rules": rules}
    body = msgspec.msgpack.encode({"op": "request", "id": 7, "command": command})
    return struct.pack(">I", len(body)) + body


@pytest.mark.parametrize(
    ("rules", "words"),
    [
        ([{"action": "maybe"}], "$.command.permission_rules[0].action"),
        ([{"action": "deny", "tool": []}], "tool is an empty list"),
        ([{"action": "deny", "command": "("}], "is not a regular expression"),
        ([{"action": "deny", "tools": "Write"}], "unknown field `tools`"),
        ({"action": "deny"}, "Expected `array`"),
    ],
)
async def test_bad_rules_get_an_error_reply(sock_path: Path, rules: object, words: str) -> None:
    daemon = make_daemon(ScriptDriver())
    async with serving(sock_path, daemon):
        raw = await RawClient.open(sock_path, role="frontend")
        await raw.send_bytes(_start_run(rules))
        with trio.fail_after(10):
            reply = await raw.receive()
        assert isinstance(reply, Reply), reply
        assert reply.error is not None, reply
        assert (reply.id, reply.ok, reply.error.code) == (7, False, MALFORMED_FRAME)
        assert words in reply.error.message
        assert daemon.runs.runs() == []  # nothing started
        await raw.aclose()


# -- the order, as a property ------------------------------------------------------------

TOOLS = ("Write", "Read", "Bash")
rule_lists = st.lists(
    st.builds(
        PermissionRule,
        action=st.sampled_from(["allow", "deny", "ask"]),
        tool=st.sampled_from(["*", "W*", *TOOLS]),
    ),
    max_size=4,
)


def _model(daemon: list[PermissionRule], run: list[PermissionRule], tool: str) -> str | None:
    """Who decides, by the documented order: the first matching rule of each list in turn."""
    for source, rules in (("daemon", daemon), ("run", run)):
        for rule in rules:
            if rule.matches(PermissionRequested(request_id="r", tool=tool)):
                if rule.action != "ask":
                    return f"{source}:{rule.action}"
                break
    return None


@given(daemon=rule_lists, run=rule_lists, tool=st.sampled_from(TOOLS))
def test_the_daemons_rules_then_the_runs(
    daemon: list[PermissionRule], run: list[PermissionRule], tool: str
) -> None:
    published: list[Event] = []

    def publish(event: Event, **where: Any) -> Envelope[Event]:
        published.append(event)
        return Envelope(len(published), 0.0, event, where.get("session_id"), where.get("run_id"))

    broker = PermissionBroker(publish, rules=daemon)
    broker.bind_run("run-1", run, by="starter")
    request = PermissionRequested(request_id="run-1/p", tool=tool, options=OPTIONS)
    broker.expect(Envelope(1, 0.0, request, "s", "run-1"))
    decided: PermissionDecision | None = None
    if broker.is_resolved("run-1/p"):
        [resolved] = published
        assert isinstance(resolved, PermissionResolved)
        decided = PermissionDecision(outcome=resolved.outcome, by=resolved.by)
    expected = _model(daemon, run, tool)
    if expected is None:
        assert decided is None
        return
    assert decided is not None
    source, action = expected.split(":")
    assert decided.outcome == ("allowed" if action == "allow" else "denied")
    assert (decided.by == "starter") == (source == "run")
    broker.release_run("run-1")
    other = PermissionRequested(request_id="run-1/q", tool=tool, options=OPTIONS)
    broker.expect(Envelope(2, 0.0, other, "s", "run-1"))  # the run's rules are gone
    assert broker.is_resolved("run-1/q") == (source == "daemon")


# -- real processes: `busd serve`, `busd run`, the Claude Code stand-in ----------------------


async def test_busd_run_deny_binds_against_busd_serve_with_an_eager_frontend(
    place: Place,
) -> None:
    """The issue's case: a shared daemon, a frontend allowing at once, ``--deny Write``."""
    cli, record = place.fake_claude()
    place.socket.parent.mkdir()
    serve = await trio.lowlevel.open_process(
        [*BUSD, "serve", "--socket", str(place.socket)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=place.env,
        cwd=place.root,
    )
    eager = EagerFrontend()
    try:
        assert serve.stdout is not None
        with trio.fail_after(20):
            line = await read_line(serve.stdout)
        assert f"listening on {place.socket}" in line, line
        async with (
            connect(place.socket, client="eager") as frontend,
            trio.open_nursery() as nursery,
        ):
            await nursery.start(eager.serve, frontend)
            for _ in range(3):
                result = await place.run(
                    "--adapter", "claude-code", "--json", "--allow", "*", "--deny", "Write",
                    "--option", f"cli_path={cli}", "write hello",
                )  # fmt: skip
                assert result.returncode == 0, result.stderr.decode()
                [resolved] = of_type(lines(result.stdout), "stream.permission.resolved")
                assert (resolved["outcome"], resolved["reason"]) == ("denied", "--deny Write")
                assert resolved["by"].startswith("busd-run[pid="), resolved["by"]
            nursery.cancel_scope.cancel()
    finally:
        serve.kill()
        with trio.fail_after(20):
            await serve.wait()
    recorded = [json.loads(text) for text in record.read_text().splitlines()]
    answers = [
        entry["permission"]["response"]["behavior"] for entry in recorded if "permission" in entry
    ]
    assert answers == ["deny"] * 3  # what the agent was told, every time
    assert set(eager.replies.values()) == {"already_resolved"}
    assert len(eager.replies) == 3
