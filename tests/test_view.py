"""The frontend model: what every UI shows, folded once from the stream."""

from __future__ import annotations

import itertools
import json
from typing import Any, Literal

import msgspec
import pytest

from busd.core.events import (
    AgentComplete,
    AgentStart,
    ContextBasis,
    ContextBreakdown,
    ContextUsage,
    Envelope,
    Event,
    PermissionOption,
    PermissionRequested,
    PermissionResolved,
    RunFinished,
    RunStarted,
    SessionIdle,
    SessionStart,
    StreamingStats,
    TextComplete,
    TextDelta,
    ThinkingComplete,
    ThinkingDelta,
    TokenUsage,
    ToolComplete,
    ToolMetrics,
    ToolStart,
    ToolTimeout,
    Usage,
    UserPrompt,
)
from busd.frontends.view import (
    AgentBlock,
    NoticeBlock,
    PermissionBlock,
    PromptBlock,
    TextBlock,
    ThinkingBlock,
    ToolBlock,
    Views,
    models_line,
)

T0 = 1_700_000_000.0


class Feed:
    """Envelopes for one session, with accept times chosen by the test."""

    def __init__(self, session: str = "s1") -> None:
        self.views = Views()
        self.session = session
        self.seq = itertools.count(1)

    def __call__(self, at: float, event: Event, *, agent: str | None = None, **fields: Any) -> None:
        envelope: Envelope[Event] = Envelope(
            next(self.seq), T0 + at, event, session_id=self.session, agent_id=agent, **fields
        )
        self.views.apply(envelope)

    @property
    def view(self) -> Any:
        return self.views.sessions[self.session]


def test_text_deltas_fold_and_the_complete_text_wins() -> None:
    feed = Feed()
    feed(0, TextDelta(message_id="m1", text="Hel"))
    feed(0.1, TextDelta(message_id="m1", text="lo"))
    (block,) = feed.view.main.blocks
    assert block == TextBlock(message_id="m1", text="Hello")
    feed(0.2, TextComplete(message_id="m1", text="Hello!"))
    assert feed.view.main.blocks == [TextBlock(message_id="m1", text="Hello!", done=True)]


def test_text_after_a_tool_is_a_new_block_of_the_same_message() -> None:
    feed = Feed()
    feed(0, TextDelta(message_id="m1", text="Let me look."))
    feed(0.1, TextComplete(message_id="m1", text="Let me look."))
    feed(0.2, ToolStart(tool_call_id="t1", name="Read"))
    feed(0.3, TextDelta(message_id="m1", text="Found it."))
    kinds = [type(b).__name__ for b in feed.view.main.blocks]
    assert kinds == ["TextBlock", "ToolBlock", "TextBlock"]
    assert feed.view.main.blocks[2].text == "Found it."


def test_thinking_timer_runs_from_the_first_delta_and_stops_at_complete() -> None:
    feed = Feed()
    feed(1.0, ThinkingDelta(message_id="m1", text="hmm"))
    (block,) = feed.view.main.blocks
    assert isinstance(block, ThinkingBlock)
    assert block.elapsed(T0 + 4.5) == pytest.approx(3.5)
    feed(6.0, ThinkingComplete(message_id="m1", text="hmm, ok", signature="sig"))
    assert block.done
    assert block.text == "hmm, ok"
    assert block.elapsed(T0 + 100) == pytest.approx(5.0)  # wall clock from first delta
    feed(7.0, ThinkingComplete(message_id="m2", text="x", duration_s=2.25))
    assert feed.view.main.blocks[-1].elapsed(T0 + 100) == 2.25  # the SDK's own figure wins


def test_tool_status_and_duration() -> None:
    feed = Feed()
    feed(0, ToolStart(tool_call_id="t1", name="Bash", input={"command": "ls"}))
    tool = feed.view.main.blocks[0]
    assert isinstance(tool, ToolBlock)
    assert tool.status == "running"
    assert tool.elapsed(T0 + 2) == 2
    feed(1.5, ToolComplete(tool_call_id="t1", status="error", error="exit 1", duration_s=1.25))
    assert (tool.status, tool.duration_s, tool.error) == ("error", 1.25, "exit 1")
    feed(2, ToolComplete(tool_call_id="t-unseen", name="Grep", output="x" * 5000))
    late = feed.view.main.blocks[-1]
    assert late.name == "Grep"
    assert late.duration_s == 0
    assert len(late.output) == 2000


def test_tool_timeout_marks_the_tool_and_says_so() -> None:
    feed = Feed()
    feed(0, ToolStart(tool_call_id="t1", name="Bash"))
    feed(61, ToolTimeout(tool_call_id="t1", name="Bash", limit_s=60, elapsed_s=61))
    tool, notice = feed.view.main.blocks
    assert tool.timed_out
    assert notice == NoticeBlock(level="warning", text="Bash has run for 1m 01s (limit 1m 00s)")


def test_sub_agents_nest_under_the_tool_that_spawned_them() -> None:
    feed = Feed()
    feed(0, ToolStart(tool_call_id="task1", name="Task"))
    feed(0.1, AgentStart(agent_id="a1", name="explorer", tool_call_id="task1"))
    feed(0.2, ToolStart(tool_call_id="t2", name="Grep"), agent="a1")
    feed(0.3, TextDelta(message_id="m9", text="found"), agent="a1")
    feed(0.4, AgentComplete(agent_id="a1", result="done"))
    feed(0.5, AgentStart(agent_id="a2", name="loose"))
    view = feed.view
    task = view.main.blocks[0]
    assert task.agents == ["a1"]
    sub = view.agents["a1"]
    assert (sub.name, sub.status, sub.result) == ("explorer", "ok", "done")
    assert [type(b).__name__ for b in sub.blocks] == ["ToolBlock", "TextBlock"]
    assert view.main.blocks[-1] == AgentBlock(agent_id="a2")
    assert all(not isinstance(b, ToolBlock) or b.name != "Grep" for b in view.main.blocks)


def test_permission_prompt_then_who_answered() -> None:
    feed = Feed()
    request = PermissionRequested(
        request_id="r1",
        tool="Bash",
        input={"command": "rm -rf build"},
        options=[PermissionOption(id="allow", kind="allow_once")],
    )
    feed(0, request, run_id="run1")
    feed(0.1, request, run_id="run1")  # republished: still one prompt
    (pending,) = feed.view.pending_permissions()
    assert isinstance(pending, PermissionBlock)
    assert pending.tool == "Bash"
    feed(1, PermissionResolved(request_id="r1", outcome="allowed", by="watch@host:1"))
    assert feed.view.pending_permissions() == []
    assert (pending.state, pending.by) == ("allowed", "watch@host:1")
    feed(2, PermissionResolved(request_id="r1", outcome="denied", by="late"))
    assert (pending.state, pending.by) == ("allowed", "watch@host:1")  # the first answer stays


def test_a_finished_run_cancels_its_pending_prompts() -> None:
    feed = Feed()
    feed(0, RunStarted(adapter="claude_code", prompt="hi"), run_id="run1")
    feed(0.1, PermissionRequested(request_id="r1", tool="Bash"), run_id="run1")
    feed(1, RunFinished(status="cancelled", duration_s=1), run_id="run1")
    prompt, permission = feed.view.main.blocks
    assert prompt == PromptBlock(text="hi", run_id="run1")
    assert permission.state == "cancelled"
    assert feed.view.run_status == "cancelled"


def test_status_line_ticks_between_reports_and_stops_when_idle() -> None:
    feed = Feed()
    feed(0, SessionStart(model="claude-sonnet-4-5", title="t"))
    feed(0, TextDelta(message_id="m", text="x"))
    feed(
        10,
        StreamingStats(
            elapsed_s=10, output_tokens=1234, output_estimated=True, thinking_s=3, thinking=True
        ),
    )
    view = feed.view
    assert view.status_line(T0 + 11) == "✶ Thinking… (11s · ↓ ~1.2k tokens · thought for 4s)"
    assert view.summary_line() is None
    feed(13, StreamingStats(elapsed_s=13, output_tokens=1400, thinking_s=5))
    assert view.status_line(T0 + 14) == "✶ Working… (14s · ↓ 1.4k tokens · thought for 5s)"
    feed(14, SessionIdle())
    assert view.status_line(T0 + 100) is None
    assert view.summary_line() == "✻ Worked for 13s · ↓ 1.4k tokens · thought for 5s"


def test_a_run_on_several_models_shows_each_models_share() -> None:
    """The subagent-haiku recording's run: sonnet 412 + haiku 3 = 415 output."""
    models = {
        "claude-sonnet-4-5": TokenUsage(output_tokens=412, cost_usd=0.030195),
        "claude-haiku-5-5": TokenUsage(output_tokens=3, cost_usd=0.0018767),
    }
    feed = Feed()
    feed(0, RunStarted(adapter="claude-code"), run_id="r")
    finished = RunFinished(
        status="ok", duration_s=0.4, usage=TokenUsage(output_tokens=412 + 3), models=models
    )
    feed(1, finished, run_id="r")
    assert feed.view.summary_line() == (
        "✻ Worked for 0s · ↓ 415 tokens · claude-sonnet-4-5 412 out · claude-haiku-5-5 3 out"
    )
    # One model (or none) adds nothing: the total says it all.
    assert models_line({"claude-sonnet-4-5": models["claude-sonnet-4-5"]}) is None
    assert models_line({}) is None
    assert models_line({"a": TokenUsage(output_tokens=1412), "b": TokenUsage()}) == (
        "a 1.4k out · b 0 out"
    )


def test_an_observed_session_shows_each_models_total_so_far() -> None:
    """No run (``busd attach``, ``busd ingest``): the models of the last ``stream.usage``.

    The subagent-bash recording's totals: sonnet 270 + haiku 49 = 319 output.
    """
    feed = Feed()
    feed(0, SessionStart(model="claude-sonnet-4-5-20250929"))
    feed(1, Usage(tokens=TokenUsage(output_tokens=240)))  # streamed: no models yet
    sub = TokenUsage(output_tokens=49)
    feed(1, Usage(tokens=sub, models={"claude-haiku-5-5": sub}), agent="toolu_agent_1")
    models = {
        "claude-sonnet-4-5-20250929": TokenUsage(output_tokens=270),
        "claude-haiku-5-5": TokenUsage(output_tokens=49),
    }
    feed(2, Usage(tokens=TokenUsage(output_tokens=319), models=models))
    feed(2, StreamingStats(elapsed_s=2, output_tokens=319))
    feed(3, SessionIdle())
    assert feed.view.summary_line() == (
        "✻ Worked for 2s · ↓ 319 tokens · claude-sonnet-4-5-20250929 270 out"
        " · claude-haiku-5-5 49 out"
    )


def test_a_finished_run_shows_its_tool_metrics() -> None:
    """simse's getToolMetrics, in both frontends once the run is over (issue 22)."""
    feed = Feed()
    feed(0, RunStarted(adapter="a"), run_id="r")
    assert feed.view.tools_line() is None
    tools = [
        ToolMetrics(name="Read", calls=1, total_s=0.2, mean_s=0.2, last_s=0.2),
        ToolMetrics(name="Bash", calls=3, errors=1, total_s=3.6, mean_s=1.2, last_s=0.4),
    ]
    feed(9, RunFinished(status="ok", duration_s=9.0, tools=tools), run_id="r")
    line = "tools: Bash 3 calls, 1 error, mean 1.2s, last 0.4s · Read 1 call, last 0.2s"
    assert feed.view.tools_line() == line
    assert feed.view.snapshot(T0 + 10)["tools_line"] == line
    feed(10, RunStarted(adapter="a"), run_id="r2")  # the next run: its own, once it ends
    assert feed.view.tools_line() is None


def test_the_finished_runs_exact_usage_wins_over_the_live_estimate() -> None:
    feed = Feed()
    feed(0, RunStarted(adapter="a"), run_id="r")
    feed(5, StreamingStats(elapsed_s=5, output_tokens=900, output_estimated=True))
    feed(
        18,
        RunFinished(
            status="ok", duration_s=18.4, usage=TokenUsage(output_tokens=1437), thinking_s=5.9
        ),
        run_id="r",
    )
    assert feed.view.summary_line() == "✻ Worked for 18s · ↓ 1.4k tokens · thought for 5s"
    assert feed.view.finished.usage.output_tokens == 1437


def test_sub_agent_stats_do_not_replace_the_sessions() -> None:
    feed = Feed()
    feed(0, TextDelta(message_id="m", text="x"))
    feed(1, StreamingStats(elapsed_s=1, output_tokens=10))
    feed(2, StreamingStats(elapsed_s=2, output_tokens=99), agent="a1")
    assert feed.view.stats.output_tokens == 10


def test_context_line_and_snapshot_are_json() -> None:
    feed = Feed()
    feed(
        0,
        ContextUsage(
            used=23_456,
            window=200_000,
            percent=11.7,
            breakdown=ContextBreakdown(system=3100, tools=9800, messages=10_556, free=176_544),
        ),
    )
    view = feed.view
    assert view.context_line() == (
        "context 23.4k / 200.0k (11%) · system 3.1k · tools 9.8k · messages 10.5k · free 176.5k"
    )
    data = json.loads(msgspec.json.encode(view.snapshot(T0 + 1)))
    assert data["context"]["breakdown"]["free"] == 176_544
    assert data["context_line"] == view.context_line()
    assert data["session_id"] == "s1"
    assert data["main"]["blocks"] == []


def test_the_context_line_says_the_cache_hit_and_how_good_estimates_were() -> None:
    """ac-dc's cache-hit figure and Dexto's estimate error, from busd.context's basis (issue 22)."""
    feed = Feed()
    basis = ContextBasis(
        last_input=50_000, cache_read=42_600, cache_hit_percent=85.2, estimate_error_percent=3.4
    )
    feed(0, ContextUsage(used=54_500, window=200_000, percent=27.2, basis=basis))
    line = feed.view.context_line()
    assert line is not None
    assert line.endswith(" · cache hit 85% · estimates ±3%")
    feed(1, ContextUsage(used=100))  # before any call: neither figure exists yet
    assert feed.view.context_line() == "context 100 · window unknown"


def test_a_prompt_from_the_agents_own_stream_is_shown_as_one() -> None:
    """Sessions busd did not start say what was asked with stream.session.prompt."""
    feed = Feed()
    feed(0, UserPrompt(text="Please read my notes.", prompt_id="p1"))
    [block] = feed.view.main.blocks
    assert isinstance(block, PromptBlock)
    assert block.text == "Please read my notes."


def test_stale_and_sessionless_events_are_not_shown() -> None:
    views = Views()
    assert views.apply(Envelope(1, T0, TextDelta(message_id="m", text="x"))) is None
    stale: Envelope[Event] = Envelope(
        2, T0, TextDelta(message_id="m", text="x"), session_id="s", stale=True
    )
    assert views.apply(stale) is None
    assert views.sessions == {}
    changed = views.apply_all(
        [
            Envelope(3, T0, SessionStart(title="a"), session_id="a"),
            Envelope(4, T0, SessionStart(title="b"), session_id="b"),
        ]
    )
    assert changed == {"a", "b"}
    assert list(views.sessions) == ["a", "b"]


def test_a_live_timer_resumes_from_the_new_work_not_from_the_last_report() -> None:
    feed = Feed()
    feed(0, TextDelta(message_id="m", text="x"))
    feed(8, StreamingStats(elapsed_s=8, output_tokens=5))
    feed(8, SessionIdle())
    feed(60, TextDelta(message_id="m2", text="again"))  # busy again, long after the report
    view = feed.view
    assert view.live_stats(T0 + 60.5).elapsed_s == pytest.approx(8.5)
    feed(60.75, StreamingStats(elapsed_s=8.75, output_tokens=6))
    assert view.status_line(T0 + 60.75) == "✶ Working… (8s · ↓ 6 tokens)"


def test_a_silent_daemon_cannot_make_a_timer_run_away() -> None:
    feed = Feed()
    feed(0, TextDelta(message_id="m", text="x"))
    feed(1, StreamingStats(elapsed_s=1, output_tokens=5))
    assert feed.view.live_stats(T0 + 100).elapsed_s == 2  # one second ahead at most


def test_a_tool_left_running_when_its_run_ends_stops_its_timer() -> None:
    feed = Feed()
    feed(0, RunStarted(adapter="acp"), run_id="r")
    feed(1, ToolStart(tool_call_id="t1", name="rm"), run_id="r")
    feed(1.5, ToolStart(tool_call_id="t2", name="ls"), run_id="r")
    feed(2, ToolComplete(tool_call_id="t2"), run_id="r")
    feed(4, RunFinished(status="ok", duration_s=4), run_id="r")
    left, done = feed.view.main.blocks
    assert (left.status, left.elapsed(T0 + 100)) == ("cancelled", 3.0)
    assert done.status == "ok"


# -- tool timers: the tool's own run time, whatever the adapter -----------------------


def asked(feed: Feed, call: str, at: float) -> None:
    feed(at, PermissionRequested(request_id=f"r-{call}", tool="Write", tool_call_id=call))


def answered(
    feed: Feed, call: str, at: float, outcome: Literal["allowed", "denied"] = "allowed"
) -> None:
    feed(at, PermissionResolved(request_id=f"r-{call}", outcome=outcome, by="me"))


@pytest.mark.parametrize(
    ("adapter", "sdk_duration", "expected"),
    [
        # What each adapter reported in the bundled recordings with a 3 s wait for the
        # answer (asked at 0.3, answered at 3.3, completed at 4.9):
        ("claude-code", 4.88, 1.6),  # measured from the call: the wait is in it
        ("opencode", 5.111, 1.6),  # OpenCode's time.start..end: the wait is in it
        ("copilot", 0.23, 0.23),  # the SDK's own execution time: no wait in it
        ("acp", 1.01, 1.01),  # measured from the tool's in_progress update
        ("none", None, 1.6),  # no figure: the bus's clock, from the answer
    ],
)
def test_a_tool_that_asked_times_from_the_answer(
    adapter: str, sdk_duration: float | None, expected: float
) -> None:
    feed = Feed()
    feed(0, ToolStart(tool_call_id="t1", name="Write"))
    asked(feed, "t1", 0.3)
    tool = feed.view.main.blocks[0]
    assert tool.waiting
    assert tool.elapsed(T0 + 2.0) == 0  # waiting for a person is not the tool's time
    answered(feed, "t1", 3.3)
    assert not tool.waiting
    assert tool.waited_s == pytest.approx(3.3)
    assert tool.elapsed(T0 + 4.0) == pytest.approx(0.7)  # its timer runs from the answer
    feed(4.9, ToolComplete(tool_call_id="t1", duration_s=sdk_duration))
    assert tool.duration_s == pytest.approx(expected), adapter


def test_a_tool_that_asked_nothing_keeps_the_sdks_figure_or_the_bus_clock() -> None:
    feed = Feed()
    feed(0, ToolStart(tool_call_id="t1", name="Bash"))
    feed(2, ToolComplete(tool_call_id="t1", duration_s=2.5))  # the SDK knows better
    feed(3, ToolStart(tool_call_id="t2", name="Bash"))
    feed(4.5, ToolComplete(tool_call_id="t2"))
    first, second = feed.view.main.blocks
    assert (first.duration_s, first.waited_s, second.duration_s) == (2.5, None, 1.5)


def test_a_request_shown_before_its_tool_call_is_linked_to_it() -> None:
    feed = Feed()
    asked(feed, "t1", 0)
    feed(0.1, ToolStart(tool_call_id="t1", name="Write"))
    assert feed.view.main.blocks[1].waiting
    answered(feed, "t1", 2)
    feed(2.5, ToolComplete(tool_call_id="t1", duration_s=2.5))
    assert feed.view.main.blocks[1].duration_s == pytest.approx(0.5)
    asked(feed, "t2", 3)
    answered(feed, "t2", 4)
    feed(5, ToolStart(tool_call_id="t2", name="Write"))  # answered before it showed
    feed(5.5, ToolComplete(tool_call_id="t2", duration_s=9))
    tool = feed.view.main.blocks[-1]
    assert (tool.waiting, tool.duration_s) == (False, 0.5)


def test_a_denied_or_abandoned_tool_did_not_run() -> None:
    feed = Feed()
    feed(0, RunStarted(adapter="acp"), run_id="r")
    feed(0, ToolStart(tool_call_id="t1", name="rm"), run_id="r")
    asked(feed, "t1", 0.1)
    answered(feed, "t1", 5, outcome="denied")
    feed(5.01, ToolComplete(tool_call_id="t1", status="error", error="denied"), run_id="r")
    feed(6, ToolStart(tool_call_id="t2", name="rm"), run_id="r")
    asked(feed, "t2", 6.1)
    feed(9, RunFinished(status="cancelled", duration_s=9), run_id="r")
    denied, abandoned = (b for b in feed.view.main.blocks if isinstance(b, ToolBlock))
    assert denied.duration_s == pytest.approx(0.01)
    assert (abandoned.status, abandoned.duration_s, abandoned.waiting) == ("cancelled", 0, False)


# -- a run whose provider reports no output count (ACP) -------------------------------


def test_a_finished_acp_run_keeps_its_estimated_count() -> None:
    """ACP's usage_update has no output tokens: the run's count is busd's estimate."""
    feed = Feed()
    feed(0, RunStarted(adapter="acp", prompt="write okra"), run_id="r1")
    feed(5, StreamingStats(elapsed_s=5, output_tokens=42, output_estimated=True), run_id="r1")
    feed(17, RunFinished(status="ok", duration_s=17.0, thinking_s=3.2), run_id="r1")
    assert feed.view.summary_line() == "✻ Worked for 17s · ↓ ~42 tokens · thought for 3s"
    # a second run of the session counts its own output, not the session's
    feed(20, RunStarted(adapter="acp", prompt="again"), run_id="r2")
    feed(22, StreamingStats(elapsed_s=19, output_tokens=89, output_estimated=True), run_id="r2")
    feed(23, RunFinished(status="ok", duration_s=3.0), run_id="r2")
    assert feed.view.summary_line() == "✻ Worked for 3s · ↓ ~47 tokens"
    # a provider's exact count, when there is one, wins
    feed(30, RunStarted(adapter="acp", prompt="third"), run_id="r3")
    feed(31, RunFinished(status="ok", duration_s=1.0, usage=TokenUsage(output_tokens=45)))
    assert feed.view.summary_line() == "✻ Worked for 1s · ↓ 45 tokens"


def test_the_view_snapshot_keeps_its_keys() -> None:
    """busd web reads these: new keys may come, none may go."""
    feed = Feed()
    feed(0, RunStarted(adapter="x", prompt="go"), run_id="r")
    feed(0.1, ToolStart(tool_call_id="t", name="Write"), run_id="r")
    asked(feed, "t", 0.2)
    data = feed.view.snapshot(T0 + 1)
    assert {
        "session_id", "title", "model", "cwd", "adapter", "run_id", "run_status",
        "cancelled_by", "busy", "stats", "stats_ts", "usage", "context", "finished",
        "last_seq", "main", "agents", "status_line", "summary_line", "context_line", "now",
    } <= set(data)  # fmt: skip
    tool, request = data["main"]["blocks"][1:]
    assert tool["waiting"] is True
    assert tool["waited_s"] is None
    assert request["tool_call_id"] == "t"
