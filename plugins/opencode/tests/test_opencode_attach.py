"""``busd attach opencode``: the attacher against the real ``opencode serve`` (issue 21).

The server is the npm package pinned in contrib/agents, isolated in the
test's own home, its model the local stand-in (``opencode_standin.py``:
thinking, a sentence and a ``bash`` call, then thinking and the answer,
each call with its own usage). Prompts go to OpenCode's own HTTP API, as
the TUI sends them; busd learns of them only through the attacher. The
daemon is a private one; a second client watches the bus as ``busd watch``
would. Totals are compared with what OpenCode's ``GET /session/{id}``
reports and with what the stand-in served.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import trio
from busd_opencode import OpenCodeAttacher
from busd_opencode.attach import OpenCodeAttachError, server_url
from opencode_standin import (
    ANSWER,
    MODEL,
    OPENCODE,
    SAID,
    THOUGHT,
    OpenCodeServer,
    StandIn,
)
from opencode_standin import answer as kind_of_call  # ``answer`` names a reply below

import busd
from busd import (
    AttachOptions,
    Envelope,
    Event,
    PermissionRequested,
    PermissionResolved,
    SessionIdle,
    SessionStart,
    TextComplete,
    TextDelta,
    ThinkingComplete,
    TokenUsage,
    ToolComplete,
    ToolStart,
    TurnEnd,
)
from busd.cli.attach import ClientSink
from busd.daemon.embedded import serve_private
from busd.daemon.hub import DaemonConfig
from busd.wire import Sessions
from tests.daemon_helpers import quiet_port

E = TypeVar("E", bound=Event)
BUSD = Path(sys.executable).parent / "busd"
PROMPT = "Run echo hello in the shell and tell me what it printed."
needs_opencode = pytest.mark.skipif(
    not OPENCODE.exists(),
    reason=f"no opencode at {OPENCODE} (install it: cd contrib/agents && npm ci)",
)


# -- the pieces -------------------------------------------------------------------


@pytest.fixture
def standin() -> Iterator[StandIn]:
    with StandIn() as served:
        yield served


@pytest.fixture
async def opencode(tmp_path: Path, standin: StandIn) -> AsyncIterator[OpenCodeServer]:
    """A started ``opencode serve`` of this test (function-scoped: each test its own)."""
    server = OpenCodeServer(tmp_path / "oc", standin.url)
    await server.start(port=quiet_port())  # a test may start it again there
    try:
        yield server
    finally:
        await server.stop()


class RecordingSink(ClientSink):
    """``busd attach``'s own sink, with the notes kept for the test to wait on."""

    def __init__(self, client: busd.Client, *, max_frame: int) -> None:
        super().__init__(client, max_frame=max_frame)
        self.notes: list[str] = []
        self.noted = trio.Event()

    def note(self, message: str) -> None:
        self.notes.append(message)
        self.noted.set()
        self.noted = trio.Event()

    async def until_note(self, text: str, within: float = 30) -> str:
        with trio.fail_after(within):
            while not any(text in n for n in self.notes):
                await self.noted.wait()
        return next(n for n in self.notes if text in n)


class Bus:
    """A private daemon, what a watching client saw on it, and a sink for the attacher."""

    def __init__(self, path: Path, watcher: busd.Client, agent: busd.Client) -> None:
        self.path = path
        self.watcher = watcher
        self.sink = RecordingSink(agent, max_frame=agent.limits.max_frame)
        self.seen: list[Envelope[Event]] = []
        self._changed = trio.Event()

    async def watch(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with self.watcher.subscribe(["stream.>"]) as subscription:
            task_status.started()
            async for batch in subscription:
                self.seen += batch.events
                self._changed.set()
                self._changed = trio.Event()

    async def until(self, condition: Callable[[], object], within: float = 30) -> None:
        with trio.fail_after(within):
            while not condition():
                await self._changed.wait()

    def of(self, sid: str, cls: type[E]) -> list[E]:
        return [e.event for e in self.seen if e.session_id == sid and isinstance(e.event, cls)]

    def answered(self, sid: str, times: int) -> bool:
        """``sid`` ended ``times`` turns with ``end_turn`` and went idle after the last."""
        ends = [e.seq for e in self.seen if e.session_id == sid and _is_end_turn(e.event)]
        idles = [
            e.seq for e in self.seen if e.session_id == sid and isinstance(e.event, SessionIdle)
        ]
        return len(ends) >= times and bool(idles) and idles[-1] > ends[-1]

    async def usage(self, sid: str) -> TokenUsage:
        """The session's totals as busd's ``sessions`` reply has them."""
        listed = await self.watcher.request(Sessions())
        (found,) = [s for s in listed if s["session_id"] == sid]
        return TokenUsage(**found["usage"])


def _is_end_turn(event: Event) -> bool:
    return isinstance(event, TurnEnd) and event.finish_reason == "end_turn"


@asynccontextmanager
async def bus(journal: Path | None = None) -> AsyncIterator[Bus]:
    config = DaemonConfig(journal=str(journal)) if journal is not None else None
    async with (
        serve_private(config) as daemon,
        busd.connect(daemon.path, client="test-watch", role="observer") as watcher,
        busd.connect(daemon.path, client="busd-attach-opencode", role="agent") as agent,
        trio.open_nursery() as nursery,
    ):
        found = Bus(daemon.path, watcher, agent)
        await nursery.start(found.watch)
        yield found
        nursery.cancel_scope.cancel()


async def new_session(url: str) -> str:
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        reply = await http.post("/session", json={})
        reply.raise_for_status()
        sid: str = reply.json()["id"]
        return sid


async def prompt(url: str, sid: str, text: str = PROMPT) -> None:
    """Send a prompt as the TUI does; OpenCode answers when the agent is done."""
    body = {
        "parts": [{"type": "text", "text": text}],
        "model": {"providerID": "anthropic", "modelID": MODEL},
    }
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        (await http.post(f"/session/{sid}/message", json=body)).raise_for_status()


async def reported(url: str, sid: str) -> TokenUsage:
    """The session's totals as OpenCode's own ``GET /session/{id}`` reports them."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        info = (await http.get(f"/session/{sid}")).json()
    tokens = info["tokens"]
    return TokenUsage(
        input_tokens=tokens["input"],
        output_tokens=tokens["output"],
        reasoning_tokens=tokens["reasoning"],
        cache_read_tokens=tokens["cache"]["read"],
        cache_write_tokens=tokens["cache"]["write"],
        cost_usd=info["cost"],
    )


def assert_same(busd_total: TokenUsage, opencode_total: TokenUsage, standin: StandIn) -> None:
    """busd's totals are OpenCode's, and OpenCode's are what the stand-in served."""
    counts = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")
    ours = tuple(getattr(busd_total, n) for n in counts)
    assert ours == tuple(getattr(opencode_total, n) for n in counts)
    served = standin.counted()
    assert ours == (
        served["input_tokens"],
        served["output_tokens"],
        served["cache_read_input_tokens"],
        served["cache_creation_input_tokens"],
    )
    assert busd_total.cost_usd is not None
    assert opencode_total.cost_usd is not None
    assert abs(busd_total.cost_usd - opencode_total.cost_usd) < 1e-12


# -- following --------------------------------------------------------------------


@needs_opencode
async def test_a_prompt_sent_to_opencode_is_followed_live_with_opencodes_totals(
    tmp_path: Path, opencode: OpenCodeServer, standin: StandIn
) -> None:
    assert opencode.url is not None
    sid = await new_session(opencode.url)
    options = AttachOptions(state_dir=tmp_path / "state", url=opencode.url)
    async with bus() as b, trio.open_nursery() as nursery:
        nursery.start_soon(OpenCodeAttacher().attach, b.sink, options)
        await b.until(lambda: b.of(sid, SessionIdle))  # the API read: the attacher is live
        assert b.of(sid, SessionStart)[0].cwd == str(opencode.project)
        await prompt(opencode.url, sid)
        await b.until(lambda: b.answered(sid, 1))
        totals = await b.usage(sid)
        nursery.cancel_scope.cancel()
    assert [t.text for t in b.of(sid, ThinkingComplete)] == [THOUGHT, THOUGHT]
    assert [t.text for t in b.of(sid, TextComplete)] == [SAID, ANSWER]
    (tool,) = b.of(sid, ToolStart)
    assert (tool.name, tool.input["command"]) == ("bash", "echo hello")
    (done,) = b.of(sid, ToolComplete)
    assert (done.status, done.output) == ("ok", "hello\n")
    # Streamed as it happened: the deltas came from the live stream, not a backlog.
    assert SAID in "".join(d.text for d in b.of(sid, TextDelta))
    assert_same(totals, await reported(opencode.url, sid), standin)
    assert b.sink.notes == []


@needs_opencode
async def test_the_server_restarting_is_followed_and_nothing_counts_twice(
    tmp_path: Path, opencode: OpenCodeServer, standin: StandIn
) -> None:
    assert opencode.url is not None
    url = opencode.url
    options = AttachOptions(state_dir=tmp_path / "state", url=url)
    async with bus() as b, trio.open_nursery() as nursery:
        nursery.start_soon(OpenCodeAttacher().attach, b.sink, options)
        sid = await new_session(url)
        await prompt(url, sid)
        await b.until(lambda: b.answered(sid, 1))
        await opencode.stop()
        lost = await b.sink.until_note("lost")
        assert lost == f"opencode: lost {url} (the connection closed); retrying"
        await opencode.start(port=opencode.port)  # the same port, the same home: its sessions
        assert await b.sink.until_note("is back;") == f"opencode: {url} is back; catching up"
        await prompt(url, sid, "And again, please.")
        await b.until(lambda: b.answered(sid, 2))
        totals = await b.usage(sid)
        nursery.cancel_scope.cancel()
    # The re-read of the API after the restart repeated the first prompt: told once.
    assert [t.text for t in b.of(sid, TextComplete)] == [SAID, ANSWER, SAID, ANSWER]
    assert len(b.of(sid, ToolStart)) == 2
    assert_same(totals, await reported(url, sid), standin)
    assert len(b.sink.notes) == 2


class SlowStandIn(StandIn):
    """The stand-in whose answer after the tool waits for :attr:`release`."""

    def __init__(self) -> None:
        super().__init__()
        self.answering = threading.Event()
        self.release = threading.Event()

    def respond(self, body: Mapping[str, Any]) -> bytes:
        data = super().respond(body)
        if kind_of_call(body)[0] == "answer":
            self.answering.set()
            self.release.wait(60)
        return data


@needs_opencode
async def test_an_answer_cut_by_the_server_restarting_ends_there(tmp_path: Path) -> None:
    """Stopped while the model answers, OpenCode lists the answer open for good, idle."""
    with SlowStandIn() as standin:
        server = OpenCodeServer(tmp_path / "oc", standin.url)
        try:
            url = await server.start(port=quiet_port())  # started again there below
            sid = await new_session(url)
            async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                body = {"parts": [{"type": "text", "text": PROMPT}]}
                (await http.post(f"/session/{sid}/prompt_async", json=body)).raise_for_status()
            assert await trio.to_thread.run_sync(standin.answering.wait, 30)  # a thread's event
            await server.stop()
            await server.start(port=server.port)
            options = AttachOptions(state_dir=tmp_path / "state", url=url)
            async with bus() as b, trio.open_nursery() as nursery:
                nursery.start_soon(OpenCodeAttacher().attach, b.sink, options)
                said = await b.sink.until_note("it ends there")
                await b.until(lambda: b.of(sid, SessionIdle))
                nursery.cancel_scope.cancel()
        finally:
            standin.release.set()
            await server.stop()
    assert said == (
        f"opencode: session {sid}: the server stopped while an answer was being written;"
        " it ends there"
    )
    assert [e.finish_reason for e in b.of(sid, TurnEnd)] == ["tool_use", "error"]
    assert [t.text for t in b.of(sid, TextComplete)] == [SAID]
    (done,) = b.of(sid, ToolComplete)
    assert (done.status, done.output) == ("ok", "hello\n")
    assert isinstance(b.seen[-1].event, SessionIdle)


@needs_opencode
async def test_attached_mid_answer_the_pending_permission_is_on_the_bus(
    tmp_path: Path, standin: StandIn
) -> None:
    """The session was waiting for a person before busd attached: the API says so."""
    server = OpenCodeServer(tmp_path / "oc", standin.url, bash="ask")
    url = await server.start()
    try:
        sid = await new_session(url)
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            body = {"parts": [{"type": "text", "text": PROMPT}]}
            (await http.post(f"/session/{sid}/prompt_async", json=body)).raise_for_status()
            with trio.fail_after(30):
                # OpenCode's own state, in another program: nothing to wait on but polling.
                while not (await http.get("/permission")).json():  # noqa: ASYNC110
                    await trio.sleep(0.05)
            options = AttachOptions(state_dir=tmp_path / "state", url=url)
            async with bus() as b, trio.open_nursery() as nursery:
                nursery.start_soon(OpenCodeAttacher().attach, b.sink, options)
                await b.until(lambda: b.of(sid, PermissionRequested))
                (asked,) = b.of(sid, PermissionRequested)
                assert (asked.tool, asked.input["command"]) == ("bash", "echo hello")
                assert (asked.title, asked.category) == ("bash: echo hello", "execute")
                assert b.of(sid, TextComplete)[0].text == SAID  # the open message, so far
                reply = {"reply": "once"}
                answer = await http.post(f"/permission/{asked.request_id}/reply", json=reply)
                answer.raise_for_status()
                await b.until(lambda: b.answered(sid, 1))
                totals = await b.usage(sid)
                nursery.cancel_scope.cancel()
        (resolved,) = b.of(sid, PermissionResolved)
        assert (resolved.request_id, resolved.outcome) == (asked.request_id, "allowed")
        assert [t.text for t in b.of(sid, TextComplete)] == [SAID, ANSWER]
        (done,) = b.of(sid, ToolComplete)
        assert (done.status, done.output) == ("ok", "hello\n")
        assert_same(totals, await reported(url, sid), standin)
    finally:
        await server.stop()


# -- --once -----------------------------------------------------------------------


async def attach_once(b: Bus, url: str, state: Path) -> str:
    """``busd attach opencode --once`` as a user runs it; its stderr."""
    command = [str(BUSD), "attach", "opencode", "--once", "--url", url]
    command += ["--socket", str(b.path), "--state-dir", str(state)]
    done = await trio.run_process(command, capture_stdout=True, capture_stderr=True, check=False)
    stderr: str = done.stderr.decode()
    assert done.returncode == 0, stderr
    return stderr


@needs_opencode
async def test_once_then_resume_points_send_each_session_once_and_whole(
    tmp_path: Path, opencode: OpenCodeServer, standin: StandIn
) -> None:
    """``--once`` sends the sessions there are; again (the daemon journals: resume
    points), nothing. A follower started later leaves them out until one stirs,
    then sends that one whole: its total is OpenCode's, not the part that came after."""
    assert opencode.url is not None
    url, state = opencode.url, tmp_path / "state"
    first = await new_session(url)
    await prompt(url, first)
    empty = await new_session(url)
    async with bus(journal=tmp_path / "journal.sqlite3") as b:
        said = await attach_once(b, url, state)
        assert said.endswith("from 2 session(s)\n"), said
        await b.until(lambda: b.answered(first, 1) and b.of(empty, SessionIdle))
        assert_same(await b.usage(first), await reported(url, first), standin)
        assert "done: 0 payload(s) from 0 session(s)" in await attach_once(b, url, state)
        options = AttachOptions(state_dir=state, url=url)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(OpenCodeAttacher().attach, b.sink, options)
            probe = await new_session(url)  # seen begin on the live stream: the follower is live
            await b.until(lambda: b.of(probe, SessionStart))
            await prompt(url, first, "And again, please.")
            # Its first turn's end as --once sent it, again as the follower sent it, the new one.
            await b.until(lambda: b.answered(first, 3))
            totals = await b.usage(first)
            nursery.cancel_scope.cancel()
    assert_same(totals, await reported(url, first), standin)
    assert [t.text for t in b.of(first, TextComplete)].count(ANSWER) == 3
    assert len(b.of(empty, SessionStart)) == 1  # unchanged: never sent again


# -- what cannot be attached to ---------------------------------------------------


class ListSink:
    """A sink without a daemon: what was sent, and the notes."""

    def __init__(self) -> None:
        self.sent: list[tuple[str | None, Sequence[object], bool]] = []
        self.notes: list[str] = []
        self.noted = trio.Event()

    async def ingest(
        self, sdk: str, session_id: str | None, events: Sequence[object], *, end: bool = False
    ) -> None:
        self.sent.append((session_id, events, end))

    async def checkpoint(self) -> bool:
        return False

    def note(self, message: str) -> None:
        self.notes.append(message)
        self.noted.set()


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("ftp://127.0.0.1:4096", "--url 'ftp://127.0.0.1:4096' is not an http:// URL"),
        ("http://[::1", "--url 'http://[::1' is not a URL"),
        ("127.0.0.1:4096", "is not an http:// URL of an OpenCode server"),
        ("ftp://me:secret@host", "--url 'ftp://me:***@host' is not"),
    ],
)
async def test_a_bad_url_is_a_one_line_error(tmp_path: Path, url: str, said: str) -> None:
    options = AttachOptions(state_dir=tmp_path, url=url, once=True)
    with pytest.raises(OpenCodeAttachError, match=r"^[^\n]*$") as raised:
        await OpenCodeAttacher().attach(ListSink(), options)
    assert said in str(raised.value)


async def test_once_with_no_server_fails_saying_where_it_looked(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{quiet_port()}"
    with pytest.raises(OpenCodeAttachError) as raised:
        await OpenCodeAttacher().attach(
            ListSink(), AttachOptions(state_dir=tmp_path, url=url, once=True)
        )
    assert str(raised.value) == f"no OpenCode server at {url} (connection refused)"


async def test_a_server_that_is_not_opencode_is_named(tmp_path: Path, standin: StandIn) -> None:
    """The model stand-in is HTTP, but has no ``/event``."""
    options = AttachOptions(state_dir=tmp_path, url=standin.url, once=True)
    with pytest.raises(OpenCodeAttachError, match=r"no OpenCode server at .*HTTP 501"):
        await OpenCodeAttacher().attach(ListSink(), options)


async def test_following_waits_for_a_server_that_is_not_there_yet(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{quiet_port()}"
    sink = ListSink()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                OpenCodeAttacher().attach, sink, AttachOptions(state_dir=tmp_path, url=url)
            )
            await sink.noted.wait()
            nursery.cancel_scope.cancel()
    assert sink.notes == [f"opencode: nothing answers at {url} (connection refused); retrying"]
    assert sink.sent == []


def test_credentials_leave_the_url_for_basic_auth(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENCODE_SERVER_PASSWORD", raising=False)
    assert server_url("http://127.0.0.1:4096/") == ("http://127.0.0.1:4096", None)
    assert server_url("http://me:pw@127.0.0.1:4096") == ("http://127.0.0.1:4096", ("me", "pw"))
    monkeypatch.setenv("OPENCODE_SERVER_PASSWORD", "secret")
    assert server_url("http://h:1") == ("http://h:1", ("opencode", "secret"))
    monkeypatch.setenv("OPENCODE_SERVER_USERNAME", "ann")
    assert server_url("https://h") == ("https://h", ("ann", "secret"))
