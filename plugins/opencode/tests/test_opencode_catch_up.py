"""The attacher's catch-up racing a run: every instant a prompt can start and end (model-based).

When the attacher (re)connects it subscribes to ``/event``, then reads the
sessions from the HTTP API, request by request, and only then reads the
events the subscription buffered meanwhile. A prompt can start and end
between any two of those requests. The server here is OpenCode as a
timeline over the real recording (``fixtures/serve-thinking-tool.*``):
before the run the session is idle and empty, during it the API shows the
answer half written and the session busy, after it the API shows what
OpenCode reported once idle; the run's recorded ``/event`` payloads reach
the subscription when it ends. Whatever the instants, the bus must say
what the stream alone says: each text once and whole, the session never
idle while its turns run, OpenCode's totals.

The real ``opencode serve`` cannot be stopped between two requests of
another program; ``test_opencode_attach.py`` runs it, and this timeline is
the race that failed there once (the status read idle before the prompt,
the messages read during it: the answer's turn was ended by that idle).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import h11
import pytest
import trio
from busd_opencode import OpenCodeAdapter, OpenCodeAttacher
from fake_opencode import _read_request, _respond
from opencode_standin import ANSWER, SAID
from test_opencode_backlog import API, SID, mid_answer, of, reported, same, stream, the_turns

from busd import AttachOptions, Emitted, TextComplete, TextDelta, TurnEnd, Usage

Raw = dict[str, Any]


class Timeline:
    """OpenCode whose one session runs a prompt from request ``start`` to request ``end``.

    Requests are the attacher's API reads, counted from 1; the run starts
    after the ``start``-th and ends after the ``end``-th (or, past the
    catch-up, once the backlog was sent: :meth:`finish`).
    """

    def __init__(self, start: int, end: int, *, lost: bool = False) -> None:
        self.start, self.end = start, end
        self.lost = lost  # the server restarted mid-answer: the answer stays open, idle
        self.reads: list[str] = []
        self._subscriber: tuple[h11.Connection, trio.SocketStream] | None = None
        self._subscribed = trio.Event()
        self._ended = False

    def phase(self) -> str:
        done = len(self.reads)
        return "before" if done < self.start else "during" if done < self.end else "after"

    async def serve(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        task_status.started(f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}")
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        request, _ = await _read_request(conn, stream)
        path = request.target.decode().split("?")[0]
        if path == "/event":
            headers = [("content-type", "text/event-stream"), ("connection", "close")]
            await stream.send_all(conn.send(h11.Response(status_code=200, headers=headers)))
            await self._send(conn, stream, [{"type": "server.connected", "properties": {}}])
            self._subscriber = (conn, stream)
            self._subscribed.set()
            await trio.sleep_forever()
        phase = self.phase()
        self.reads.append(path)
        busy = phase == "during" and not self.lost
        opened = phase == "during" or self.lost
        match path:
            case "/session":
                answer: object = [API["session"]]
            case "/session/status":
                answer = {SID: {"type": "busy"}} if busy else {}
            case "/permission":
                answer = []
            case _ if path == f"/session/{SID}/message":
                answer = mid_answer() if opened else [] if phase == "before" else API["messages"]
            case _:
                raise AssertionError(f"the attacher read {path}")
        await _respond(conn, stream, 200, answer)
        if len(self.reads) == self.end and not self.lost:
            await self.finish()

    async def finish(self) -> None:
        """The run ends: its events reach the subscription (once)."""
        if self._ended:
            return
        self._ended = True
        await self._subscribed.wait()
        assert self._subscriber is not None
        run = [r for r in stream() if r["type"] != "server.connected"]
        await self._send(*self._subscriber, run)

    @staticmethod
    async def _send(conn: h11.Connection, stream: trio.SocketStream, raws: Sequence[Raw]) -> None:
        data = b"".join(f"data: {json.dumps(r)}\n\n".encode() for r in raws)
        await stream.send_all(conn.send(h11.Data(data=data)))


class TranslatingSink:
    """The daemon's side of ``ingest``: the ``opencode`` adapter's translator, no journal."""

    def __init__(self, timeline: Timeline) -> None:
        self.translator = OpenCodeAdapter().translator(session_id=SID)
        self.out: list[Emitted] = []
        self.notes: list[str] = []
        self.done = trio.Event()
        self._timeline = timeline
        self._last = stream()[-1]

    async def ingest(
        self, sdk: str, session_id: str | None, events: Sequence[object], *, end: bool = False
    ) -> None:
        assert (sdk, session_id) == ("opencode", SID)
        for raw in events:
            self.out += self.translator.feed(raw, len(self.out) * 0.01)
        if len(events) > 1:  # the backlog: the catch-up is over, the run may end now
            if self._timeline.lost:
                self.done.set()
                return
            await self._timeline.finish()
        if events and events[-1] == self._last:
            self.done.set()

    async def checkpoint(self) -> bool:
        return False

    def note(self, message: str) -> None:
        self.notes.append(message)


LATEST = 8
"""Past the attacher's last read of a catch-up: the run ends after it."""


async def catch_up(state: Path, timeline: Timeline) -> TranslatingSink:
    """Attach to ``timeline`` until the run's last event (or, lost, the backlog) was sent."""
    sink = TranslatingSink(timeline)
    async with trio.open_nursery() as nursery:
        url = await nursery.start(timeline.serve)
        options = AttachOptions(state_dir=state, url=url)
        nursery.start_soon(OpenCodeAttacher().attach, sink, options)
        with trio.fail_after(10):
            await sink.done.wait()
        nursery.cancel_scope.cancel()
    return sink


@pytest.mark.parametrize(
    ("start", "end"), [(s, e) for s in range(LATEST + 1) for e in range(s, LATEST + 1)]
)
async def test_a_run_between_the_reads_of_a_catch_up_is_told_once_and_whole(
    tmp_path: Path, start: int, end: int
) -> None:
    timeline = Timeline(start, end)
    sink = await catch_up(tmp_path, timeline)
    assert len(timeline.reads) < LATEST
    out = sink.out
    said = the_turns(out)
    assert [t.text for t in of(out, TextComplete)] == [SAID, ANSWER]
    assert [e.finish_reason for e in of(out, TurnEnd)] == ["tool_use", "end_turn"]
    # Never idle while a turn runs: no idle from the first turn to the last turn's end.
    first = next(n for n, (kind, _) in enumerate(said) if kind == "turn")
    last = max(n for n, (kind, _) in enumerate(said) if kind == "end")
    assert ("idle", False) not in said[first:last]
    assert said[-1] == ("idle", False)
    assert same(of(out, Usage)[-1].tokens, reported())
    answer = of(out, TextComplete)[-1]
    deltas = [d.text for d in of(out, TextDelta) if d.message_id == answer.message_id]
    assert "".join(deltas) == ANSWER
    assert sink.notes == []


async def test_an_answer_the_restarted_server_left_open_ends_there_as_an_error(
    tmp_path: Path,
) -> None:
    """Still open when read again, and idle: the run died with the server, it will not go on.

    The real ``opencode serve`` 1.18 does leave it so: stopped while the
    model answers and started again, it lists the answer without a finish,
    a completion time or an error, and the session idle.
    """
    timeline = Timeline(0, LATEST, lost=True)
    sink = await catch_up(tmp_path, timeline)
    path = f"/session/{SID}/message"
    assert timeline.reads.count(path) == 2  # read again before it was believed
    out = sink.out
    assert [e.finish_reason for e in of(out, TurnEnd)] == ["tool_use", "error"]
    assert [(t.text, t.stopped) for t in of(out, TextComplete)] == [
        (SAID, False),
        (ANSWER[:11], True),
    ]
    assert the_turns(out)[-1] == ("idle", False)
    assert sink.notes == [
        f"opencode: session {SID}: the server stopped while an answer was being written;"
        " it ends there"
    ]
