"""The ``busd watch`` renderer and its keys, on views folded from hand-made envelopes."""

from __future__ import annotations

import io
import itertools
from typing import Any

from rich.console import Console, RenderableType

from busd.client import RequestFailed
from busd.core.events import (
    AgentComplete,
    AgentStart,
    Envelope,
    Event,
    PermissionOption,
    PermissionRequested,
    PermissionResolved,
    RunCancelled,
    RunFinished,
    RunStarted,
    SessionIdle,
    StreamingStats,
    TextComplete,
    TextDelta,
    ThinkingComplete,
    ThinkingDelta,
    TokenUsage,
    ToolComplete,
    ToolStart,
    TurnStart,
)
from busd.frontends.screen import Screen, session_line
from busd.frontends.tui import PlainLog, input_summary, render_session, tool_duration
from busd.frontends.view import Views
from busd.frontends.watch import HELP, Cancel, Quit, Reply, WatchState, _refusal, parse_keys

T0 = 1_700_000_000.0


class Feed:
    """Folds envelopes numbered in order, each at ``T0 + at``."""

    def __init__(self) -> None:
        self.views = Views()
        self._seq = itertools.count(1)

    def __call__(
        self,
        event: Event,
        *,
        at: float = 0.0,
        session: str = "s1",
        agent: str | None = None,
        run: str | None = "run-1",
    ) -> None:
        self.views.apply(
            Envelope[Event](
                seq=next(self._seq),
                ts=T0 + at,
                event=event,
                session_id=session,
                run_id=run,
                agent_id=agent,
            )
        )


def text_of(renderable: RenderableType, *, width: int = 100, height: int = 40) -> str:
    out = io.StringIO()
    console = Console(file=out, width=width, height=height, color_system=None, legacy_windows=False)
    console.print(renderable)
    return "\n".join(line.rstrip() for line in out.getvalue().splitlines())


def session_text(feed: Feed, now: float, session: str = "s1", **kw: Any) -> str:
    return text_of(render_session(feed.views.sessions[session], T0 + now, **kw))


def permission(request_id: str = "run-1/p1", *, always: bool = True) -> PermissionRequested:
    options = [PermissionOption(id="allow", label="Allow", kind="allow_once")]
    if always:
        options.append(PermissionOption(id="always", label="Always", kind="allow_always"))
    options.append(PermissionOption(id="reject", label="Reject", kind="reject_once"))
    return PermissionRequested(
        request_id=request_id,
        tool="Write",
        title="tmp/hello.txt",
        input={"file_path": "/home/u/tmp/hello.txt", "content": "hello"},
        options=options,
    )


# -- blocks ---------------------------------------------------------------------------


def test_streaming_text_shows_as_it_arrives_and_keeps_its_line_breaks() -> None:
    feed = Feed()
    feed(RunStarted(adapter="claude-code", prompt="say hello"))
    feed(TextDelta(message_id="m1", text="Hello"), at=0.1)
    assert session_text(feed, 0.2).splitlines()[:2] == ["❯ say hello", "Hello"]
    feed(TextDelta(message_id="m1", text=" there!\nSecond line"), at=0.2)
    assert "Hello there!\nSecond line" in session_text(feed, 0.3)
    feed(TextComplete(message_id="m1", text="Hello there!\nSecond line.", stopped=True), at=0.3)
    text = session_text(feed, 0.4)
    assert "Hello there!\nSecond line.\n⊘ stopped" in text


def test_thinking_is_collapsed_with_a_timer_that_ticks_then_stops() -> None:
    feed = Feed()
    feed(ThinkingDelta(message_id="m1", text="Let me think about the secret plan"), at=10.0)
    assert "∴ Thinking… 0s" in session_text(feed, 10.5)
    assert "∴ Thinking… 3s" in session_text(feed, 13.9)
    assert "secret plan" not in session_text(feed, 13.9)
    feed(ThinkingComplete(message_id="m1", text="...", duration_s=4.7), at=14.7)
    assert "∴ Thought for 4s" in session_text(feed, 99.0)


def test_tools_show_their_input_status_and_duration() -> None:
    feed = Feed()
    feed(ToolStart(tool_call_id="t1", name="Bash", input={"command": "ls -la\nwc -l"}), at=1.0)
    assert "⏺ Bash(ls -la …)  ⋯ running 2.5s" in session_text(feed, 3.55)
    feed(ToolComplete(tool_call_id="t1", output="a\nb\nc", duration_s=0.42), at=1.5)
    text = session_text(feed, 50.0)
    assert "✓ Bash(ls -la …)  0.4s" in text
    assert "└ a (+2 lines)" in text
    feed(ToolStart(tool_call_id="t2", name="Read", input={"file_path": "/x"}), at=2.0)
    feed(ToolComplete(tool_call_id="t2", status="error", error="no such file"), at=2.25)
    text = session_text(feed, 50.0)
    assert "✗ Read(/x)  error 0.2s" in text
    assert "└ no such file" in text


def test_input_summary_and_tool_durations() -> None:
    assert input_summary({"pattern": "*.py", "path": "src"}) == "src"
    assert input_summary({"a": 1, "b": "two"}) == "a=1, b=two"
    assert input_summary({"command": "x" * 200}, 10) == "x" * 9 + "…"
    assert input_summary({}) == ""
    assert tool_duration(0.09) == "0.0s"
    assert tool_duration(59.99) == "59.9s"
    assert tool_duration(65) == "1m 05s"


def test_sub_agents_are_nested_under_the_tool_call_that_spawned_them() -> None:
    feed = Feed()
    feed(ToolStart(tool_call_id="task", name="Task", input={"description": "explore"}), at=0.0)
    feed(
        AgentStart(agent_id="a1", name="Explore", description="maps the repo", tool_call_id="task")
    )
    feed(
        ToolStart(tool_call_id="g1", name="Grep", input={"pattern": "def main"}), agent="a1", at=1.0
    )
    feed(ToolComplete(tool_call_id="g1", duration_s=0.3), agent="a1", at=1.3)
    feed(TextDelta(message_id="am", text="found 12 functions"), agent="a1", at=1.4)
    feed(AgentComplete(agent_id="a1", result="12 functions"), at=2.0)
    feed(ToolComplete(tool_call_id="task", duration_s=2.0), at=2.0)
    feed(TextDelta(message_id="m2", text="Done."), at=2.1)
    lines = session_text(feed, 3.0).splitlines()
    assert lines == [
        "✓ Task(explore)  2.0s",
        "    ↳ Explore — maps the repo  ok",
        "      ✓ Grep(def main)  0.3s",
        "      found 12 functions",
        "      └ 12 functions",
        "Done.",
    ]


def test_a_pending_permission_is_a_prompt_with_its_keys_then_says_who_answered() -> None:
    feed = Feed()
    feed(ToolStart(tool_call_id="t1", name="Write", input={"file_path": "/home/u/tmp/hello.txt"}))
    feed(permission(), at=0.1)
    feed(permission("run-1/p2", always=False), at=0.2)
    text = session_text(feed, 1.0)
    assert "⚑ Write · tmp/hello.txt  waiting for an answer" in text
    # One prompt, for the oldest request: the one the keys answer.
    assert text.count("Permission requested") == 1
    assert "│ Write · tmp/hello.txt" in text
    assert "│ /home/u/tmp/hello.txt" in text
    assert "│ [y] allow  [a] allow always  [n] deny" in text
    without_keys = session_text(feed, 1.0, keys=False)
    assert "[y]" not in without_keys
    assert "answer it from a frontend with keys" in without_keys
    feed(PermissionResolved(request_id="run-1/p1", outcome="allowed", by="watch-B"), at=2.0)
    text = session_text(feed, 3.0)
    assert "⚑ Write · tmp/hello.txt  ✓ allowed by watch-B" in text
    assert "│ [y] allow  [n] deny" in text  # now the second one is asked
    feed(PermissionResolved(request_id="run-1/p2", outcome="allowed", by="watch-A"), at=4.0)
    assert "Permission requested" not in session_text(feed, 5.0)


def test_denials_and_cancellations_read_as_such() -> None:
    feed = Feed()
    feed(RunStarted(adapter="x"))
    feed(permission("run-1/p1", always=False))
    feed(permission("run-1/p2", always=False))
    feed(
        PermissionResolved(request_id="run-1/p1", outcome="denied", by="rule:0", reason="no rm"),
        at=1.0,
    )
    feed(RunCancelled(by="watch-A"), at=2.0)
    feed(RunFinished(status="cancelled", duration_s=2.0), at=2.0)
    text = session_text(feed, 3.0)
    assert "⚑ Write · tmp/hello.txt  ✗ denied by rule:0 (no rm)" in text
    assert "⚑ Write · tmp/hello.txt  ⊘ cancelled" in text
    assert "⊘ cancelled by watch-A" in text


def test_the_status_line_ticks_between_reports_and_marks_estimates() -> None:
    feed = Feed()
    feed(TurnStart(), at=0.0)
    stats = StreamingStats(
        elapsed_s=12.0, output_tokens=1234, output_estimated=True, thinking_s=3.2, thinking=True
    )
    feed(stats, at=12.0)
    assert "✶ Thinking… (12s · ↓ ~1.2k tokens · thought for 3s)" in session_text(feed, 12.5)
    assert "✶ Thinking… (13s · ↓ ~1.2k tokens · thought for 4s)" in session_text(feed, 13.0)
    line = session_line(feed.views.sessions["s1"], T0 + 13.0, focused=True)
    assert line.plain == "▸ s1  ✶ Thinking… (13s · ↓ ~1.2k tokens · thought for 4s)"


def test_the_summary_line_carries_the_runs_exact_count() -> None:
    feed = Feed()
    feed(RunStarted(adapter="claude-code", prompt="go"))
    feed(StreamingStats(elapsed_s=17.0, output_tokens=1300, output_estimated=True), at=17.0)
    feed(
        RunFinished(
            status="ok",
            duration_s=18.4,
            usage=TokenUsage(input_tokens=10, output_tokens=1434),
            thinking_s=5.9,
        ),
        at=18.4,
    )
    text = session_text(feed, 60.0)
    assert "✶" not in text
    assert text.splitlines()[-1] == "✻ Worked for 18s · ↓ 1.4k tokens · thought for 5s"


def test_the_summary_line_names_each_models_share_when_there_are_several() -> None:
    feed = Feed()
    feed(RunStarted(adapter="claude-code", prompt="go"))
    models = {"sonnet": TokenUsage(output_tokens=412), "haiku": TokenUsage(output_tokens=3)}
    feed(
        RunFinished(
            status="ok", duration_s=2.0, usage=TokenUsage(output_tokens=415), models=models
        ),
        at=2.0,
    )
    text = session_text(feed, 60.0)
    assert text.splitlines()[-1] == "✻ Worked for 2s · ↓ 415 tokens · sonnet 412 out · haiku 3 out"


# -- the screen -----------------------------------------------------------------------


def test_the_screen_lists_sessions_and_keeps_the_newest_lines_of_the_focused_one() -> None:
    feed = Feed()
    feed(RunStarted(adapter="claude-code", prompt="first"), session="s1")
    feed(RunStarted(adapter="copilot", prompt="second"), session="s2", run="run-2")
    feed(permission("run-2/p1"), session="s2", run="run-2")
    lines = "".join(f"line {i}\n" for i in range(100))
    feed(TextDelta(message_id="m", text=lines + "the end"), session="s2", run="run-2")
    screen = Screen(feed.views, ["s1", "s2"], "s2", T0 + 1.0, message="hello", help=HELP)
    rows = text_of(screen, height=30).splitlines()
    assert len(rows) == 29  # a line to spare, so the terminal never scrolls
    assert rows[0] == "busd watch · 2 sessions"
    assert rows[1] == "  s1  first · claude-code"
    assert rows[2] == "▸ s2  second · copilot     ⚠ 1 permission waiting"  # states line up
    assert rows[-3] == "hello"
    assert rows[-2] == " y  allow   a  allow always   n  deny   c  cancel run   Tab ] [  session"
    assert rows[-1] == " ↑↓ PgUp PgDn Home End  scroll   q  quit"  # wrapped between two keys
    body = "\n".join(rows)
    assert "the end" in body
    assert "[y] allow  [a] allow always  [n] deny" in body
    assert "line 0\n" not in body


def test_the_session_list_scrolls_to_keep_the_focused_one() -> None:
    feed = Feed()
    ids = [f"s{i}" for i in range(10)]
    for sid in ids:
        feed(RunStarted(adapter="x", prompt=f"p{sid}"), session=sid)
    rows = text_of(Screen(feed.views, ids, "s9", T0), height=30).splitlines()
    assert "▸ s9  ps9 · x" in rows
    assert "  s0  ps0 · x" not in rows
    assert "  … 4 more (Tab to switch)" in rows


# -- plain log lines ------------------------------------------------------------------


def test_plain_log_lines_flush_text_per_line_and_say_each_change_once() -> None:
    feed = Feed()
    log = PlainLog()

    def lines(now: float) -> list[str]:
        return log.lines(feed.views, ["s1"], T0 + now)

    feed(RunStarted(adapter="claude-code", prompt="write it"))
    feed(ThinkingDelta(message_id="t", text="hmm"), at=0.5)
    assert lines(0.5) == ["[s1] ❯ write it", "[s1] ∴ Thinking…"]
    feed(ThinkingComplete(message_id="t", text="hmm", duration_s=2.5), at=3.0)
    feed(TextDelta(message_id="m", text="Hello wor"), at=3.1)
    assert lines(3.1) == ["[s1] ∴ Thought for 2s"]
    feed(TextDelta(message_id="m", text="ld\nand mo"), at=3.2)
    assert lines(3.2) == ["[s1] Hello world"]
    feed(TextComplete(message_id="m", text="Hello world\nand more"), at=3.3)
    feed(ToolStart(tool_call_id="t1", name="Task", input={"description": "look"}), at=3.4)
    feed(AgentStart(agent_id="a1", name="Explore", tool_call_id="t1"), at=3.4)
    assert lines(3.4) == [
        "[s1] and more",
        "[s1] ⏺ Task(look)",
        "[s1] ↳ sub-agent Explore",
    ]
    feed(ToolStart(tool_call_id="g", name="Grep", input={"pattern": "x"}), agent="a1", at=3.5)
    feed(ToolComplete(tool_call_id="g", duration_s=0.5), agent="a1", at=4.0)
    feed(AgentComplete(agent_id="a1", result="nothing"), at=4.1)
    feed(ToolComplete(tool_call_id="t1", duration_s=0.8), at=4.2)
    feed(permission(), at=4.3)
    assert lines(4.3) == [
        "[s1 ↳ Explore] ⏺ Grep(x)",
        "[s1 ↳ Explore] ✓ Grep 0.5s",
        "[s1 ↳ Explore] ↳ ok: nothing",
        "[s1] ✓ Task 0.8s",
        "[s1] ⚠ permission requested: Write · tmp/hello.txt · /home/u/tmp/hello.txt",
    ]
    assert lines(4.4) == []
    feed(PermissionResolved(request_id="run-1/p1", outcome="allowed", by="watch-A"), at=5.0)
    feed(RunFinished(status="ok", duration_s=6.0, usage=TokenUsage(output_tokens=231)), at=6.0)
    assert lines(6.0) == [
        "[s1] ⚑ Write: ✓ allowed by watch-A",
        "[s1] ✻ Worked for 6s · ↓ 231 tokens",
    ]
    assert lines(7.0) == []


def test_plain_status_lines_come_when_they_change_at_most_once_a_second() -> None:
    feed = Feed()
    log = PlainLog()
    feed(TurnStart())
    feed(StreamingStats(elapsed_s=1.0, output_tokens=10, output_estimated=True), at=1.0)
    assert log.status_lines(feed.views, ["s1"], T0 + 1.0) == ["[s1] ✶ Working… (1s · ↓ ~10 tokens)"]
    feed(StreamingStats(elapsed_s=1.5, output_tokens=20, output_estimated=True), at=1.5)
    assert log.status_lines(feed.views, ["s1"], T0 + 1.5) == []
    assert log.status_lines(feed.views, ["s1"], T0 + 2.0) == ["[s1] ✶ Working… (2s · ↓ ~20 tokens)"]
    feed(SessionIdle(), at=2.5)
    assert log.status_lines(feed.views, ["s1"], T0 + 9.0) == []


# -- keys -----------------------------------------------------------------------------


def test_keys_are_parsed_with_escape_sequences_taken_whole() -> None:
    assert parse_keys(b"y\t]") == ["y", "tab", "]"]
    assert parse_keys(b"\x1b[Z[") == ["backtab", "["]
    assert parse_keys(b"\x1b[A\x1b[C\x1bOPq") == ["up", "right", "q"]  # F1 is dropped
    assert parse_keys(b"\x1b[5~\x1b[6~\x1b[H\x1b[F\x1b[1~\x1b[4~\x1bOB") == [
        "pageup",
        "pagedown",
        "home",
        "end",
        "home",
        "end",
        "down",
    ]
    assert parse_keys(b"\x1b") == ["escape"]
    assert parse_keys(b"\r\x00") == ["enter"]


def two_sessions() -> Feed:
    feed = Feed()
    feed(RunStarted(adapter="claude-code", prompt="a"), session="s1", run="run-1")
    feed(permission("run-1/p1"), session="s1", run="run-1")
    feed(permission("run-1/p2", always=False), session="s1", run="run-1")
    feed(RunStarted(adapter="copilot", prompt="b"), session="s2", run="run-2")
    return feed


def test_permission_keys_answer_the_oldest_request_of_the_focused_session() -> None:
    feed = two_sessions()
    state = WatchState(focus="s1")
    assert state.action_for("y", feed.views, 0) == Reply(
        request_id="run-1/p1", tool="Write", label="allow", allow=True
    )
    assert state.action_for("a", feed.views, 0) == Reply(
        request_id="run-1/p1", tool="Write", label="allow always", option_id="always"
    )
    assert state.action_for("n", feed.views, 0) == Reply(
        request_id="run-1/p1", tool="Write", label="deny", allow=False
    )
    feed(PermissionResolved(request_id="run-1/p1", outcome="allowed", by="x"), session="s1")
    assert state.action_for("a", feed.views, 0) is None
    assert state.current_message(1.0) == "Write: this request offers no “allow always”"
    assert state.current_message(100.0) is None
    assert state.action_for("q", feed.views, 0) == Quit()


def test_switching_sessions_wraps_and_stops_following() -> None:
    feed = two_sessions()
    state = WatchState()
    state.settle(feed.views, {"s1", "s2"})
    assert state.focus == "s1"  # it asks for permission: it keeps the focus
    assert state.action_for("tab", feed.views, 0) is None
    assert (state.focus, state.follow) == ("s2", False)
    state.action_for("]", feed.views, 0)
    assert state.focus == "s1"
    state.action_for("[", feed.views, 0)
    assert state.focus == "s2"
    assert state.action_for("y", feed.views, 0) is None
    assert state.message == "no permission request waiting in this session"
    feed(RunFinished(status="ok", duration_s=1.0), session="s2", run="run-2")
    assert state.action_for("c", feed.views, 0) is None
    assert state.message == "no run in progress in this session"


def test_following_moves_the_focus_to_a_session_that_needs_the_user() -> None:
    feed = Feed()
    state = WatchState()
    feed(RunStarted(adapter="x", prompt="a"), session="s1")
    feed(RunFinished(status="ok", duration_s=1.0), session="s1")
    state.settle(feed.views, {"s1"})
    feed(RunStarted(adapter="x", prompt="b"), session="s2", run="run-2")
    state.settle(feed.views, {"s2"})
    assert state.focus == "s2"  # s1 was at rest, s2 got busy
    feed(RunStarted(adapter="x", prompt="c"), session="s3", run="run-3")
    state.settle(feed.views, {"s3"})
    assert state.focus == "s2"  # s2 is still busy
    feed(permission("run-3/p1"), session="s3", run="run-3")
    state.settle(feed.views, {"s3"})
    assert state.focus == "s3"  # a question wins


def test_a_session_filter_hides_the_others() -> None:
    feed = two_sessions()
    state = WatchState(only=("s2",))
    state.settle(feed.views, {"s1", "s2"})
    assert state.visible(feed.views) == ["s2"]
    assert state.focus == "s2"


def test_a_lost_race_for_an_answer_is_a_message() -> None:
    reply = Reply(request_id="r", tool="Write", label="allow", allow=True)
    lost = RequestFailed("already_resolved", "already allowed by watch-B")
    assert (
        _refusal(reply, lost)
        == "Write: already answered (already_resolved: already allowed by watch-B)"
    )
    assert _refusal(Cancel("run-1", "s1"), RequestFailed("run_finished", "done")) == (
        "could not cancel (run_finished: done)"
    )


def test_plain_lines_carry_no_terminal_control_characters() -> None:
    feed = Feed()
    log = PlainLog()
    feed(TextComplete(message_id="m", text="\x1b[31mred\x1b[0m\tand\x07 plain"))
    assert log.lines(feed.views, ["s1"], T0) == ["[s1] [31mred[0m\tand plain"]
