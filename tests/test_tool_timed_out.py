"""A tool call busd ends at its limit ends with status ``timed_out`` (issue 16).

``busd.tool.timeout`` says the call is overdue; the ``stream.tool.complete``
that follows it (status ``timed_out``, error "timed out: ...") ends the call
for every tracker. Tool metrics count it as an error (the call failed) and
apart, in ``ToolMetrics.timed_out``. The last test runs a real daemon on its
Unix socket: an agent publishes a tool start and never its result, and a
frontend sees the call end, decoded from the wire like any other status.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from busd.client import connect
from busd.core.accounting import TIMED_OUT, Accountant
from busd.core.events import (
    Envelope,
    Event,
    ToolComplete,
    ToolMetrics,
    ToolStart,
    ToolTimeout,
)
from busd.core.toolmetrics import ToolTracker

from .daemon_helpers import running_daemon


def _at(event: Event, seq: int = 1) -> Envelope[Event]:
    return Envelope(seq, 1_000.0, event, session_id="s1", run_id="r1")


@pytest.mark.parametrize(
    ("status", "errors", "timed_out"),
    [("ok", 0, 0), ("error", 1, 0), ("cancelled", 0, 0), ("timed_out", 1, 1)],
)
def test_a_timed_out_call_is_an_error_counted_apart_too(
    status: str, errors: int, timed_out: int
) -> None:
    tracker = ToolTracker()
    tracker.observe(_at(ToolStart(tool_call_id="t1", name="Bash")), 0.0)
    tracker.observe(_at(ToolComplete(tool_call_id="t1", status=status), 2), 3.0)  # type: ignore[arg-type]
    metric = tracker.metric("Bash")
    assert metric == ToolMetrics(
        name="Bash",
        calls=1,
        errors=errors,
        timed_out=timed_out,
        total_s=3.0,
        mean_s=3.0,
        last_called=1_000.0,
        last_s=3.0,
    )


def test_the_accountant_ends_an_overdue_call_timed_out_once() -> None:
    accountant = Accountant(tool_timeout_s=60.0, tool_limits={"Bash": 5.0})
    accountant.observe(_at(ToolStart(tool_call_id="t1", name="Bash")), 10.0)
    assert accountant.tools.next_deadline() == 15.0
    assert not [d for d in accountant.tick(14.9) if isinstance(d.event, ToolComplete)]

    derived = accountant.tick(15.0)
    timeout = [d.event for d in derived if isinstance(d.event, ToolTimeout)]
    ends = [d for d in derived if isinstance(d.event, ToolComplete)]
    assert [t.limit_s for t in timeout] == [5.0]
    [end] = ends
    assert isinstance(end.event, ToolComplete)
    assert (end.event.tool_call_id, end.event.name, end.event.status) == ("t1", "Bash", "timed_out")
    assert end.event.error is not None
    assert end.event.error.startswith(f"{TIMED_OUT}: no result after 5s")
    assert end.event.duration_s == pytest.approx(5.0)
    assert (end.session_id, end.run_id) == ("s1", "r1")
    assert not [
        d for d in accountant.tick(100.0) if isinstance(d.event, ToolTimeout | ToolComplete)
    ]

    late = ToolComplete(tool_call_id="t1", name="Bash", output="done")  # the agent, too late
    accountant.observe(_at(late, 3), 120.0)
    metric = accountant.tools.metric("Bash")
    assert metric is not None
    assert (metric.calls, metric.errors, metric.timed_out) == (1, 1, 1)
    assert metric.last_s == pytest.approx(5.0)  # the late result is a duplicate
    assert accountant.tools.statistics().duplicates == 1


@pytest.fixture
def sock_path() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="busd-to-", dir="/tmp"))
    yield directory / "bus.sock"
    shutil.rmtree(directory, ignore_errors=True)


async def test_a_frontend_sees_the_call_end_timed_out_over_the_wire(sock_path: Path) -> None:
    accountant = Accountant(tool_limits={"Bash": 0.2})
    async with (
        running_daemon(sock_path, accountant=accountant),
        connect(sock_path, client="agent", role="agent") as agent,
        connect(sock_path, client="frontend") as frontend,
        frontend.subscribe(["stream.tool.>", "busd.tool.>"]) as subscription,
    ):
        await agent.publish(
            ToolStart(tool_call_id="t9", name="Bash", input={"command": "sleep 99"}),
            session_id="s9",
            ack=True,
        )
        seen: list[Envelope[Event]] = []
        with trio.fail_after(10):
            async for batch in subscription:
                seen += batch.events
                if any(isinstance(e.event, ToolComplete) for e in batch.events):
                    break
    assert [type(e.event) for e in seen] == [ToolStart, ToolTimeout, ToolComplete]
    end = seen[-1]
    assert isinstance(end.event, ToolComplete)
    assert (end.event.status, end.session_id, end.source) == ("timed_out", "s9", "busd.accounting")
    assert end.event.error is not None
    assert end.event.error.startswith(TIMED_OUT)
    metric = accountant.tools.metric("Bash")
    assert metric is not None
    assert (metric.errors, metric.timed_out) == (1, 1)
