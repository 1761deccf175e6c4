"""The live screen of ``busd watch`` laid out at the sizes people use (no terminal needed).

80x24 is the smallest terminal worth supporting: nothing a person needs to
act may be cut there (the state of each session, every key of the footer).
Wide terminals give the titles the room. The transcript scrolls, stays on
the same text while output arrives, and says where it is.
"""

from __future__ import annotations

from busd.core.events import (
    ContextUsage,
    PermissionResolved,
    RunFinished,
    RunStarted,
    StreamingStats,
    TextComplete,
    ThinkingComplete,
    ThinkingDelta,
    TokenUsage,
    ToolStart,
)
from busd.frontends.screen import Screen, Viewport, session_rows
from busd.frontends.watch import HELP, Cancel, WatchState, help_for

from .test_tui import T0, Feed, permission, session_text, text_of

TITLES = {
    "demo-claude_code": "Create tmp/hello-allow.txt containing hello and then explain it",
    "demo-copilot": "Find where login is implemented",
    "demo-opencode": "Which git branch am I on?",
    "demo-acp": "Write okra to /tmp/p4/p4-check.txt",
}


def four_busy_sessions() -> Feed:
    """The demo's four sessions, each working and asking for permission."""
    feed = Feed()
    for n, (sid, prompt) in enumerate(TITLES.items()):
        run = f"run-{n}"
        feed(RunStarted(adapter=sid.removeprefix("demo-"), prompt=prompt), session=sid, run=run)
        stats = StreamingStats(elapsed_s=26.0, output_tokens=1234, thinking_s=3.0)
        feed(stats, session=sid, run=run, at=26.0)
        feed(permission(f"{run}/p1"), session=sid, run=run, at=26.0)
    return feed


def screen_rows(screen: Screen, width: int, height: int) -> list[str]:
    return text_of(screen, width=width, height=height).splitlines()


def test_at_80x24_each_state_and_every_key_of_the_footer_shows() -> None:
    feed = four_busy_sessions()
    ids = list(TITLES)
    state = WatchState(focus=ids[0])
    screen = Screen(feed.views, ids, ids[0], T0 + 27.0, help=help_for(state, feed.views))
    rows = screen_rows(screen, 80, 24)
    assert len(rows) == 23
    listed = rows[1:5]
    for row, sid in zip(listed, ids, strict=True):
        assert len(row) <= 80
        assert row[2:].startswith(sid)
        # the state is shortened, not cut: who waits, for how long, how much
        assert row.endswith("⚠ 1 permission  ✶ 27s · ↓ 1.2k"), row
    assert len({row.index("⚠") for row in listed}) == 1  # a column
    assert "Create tmp/hello-allow.txt" in listed[0]
    assert "…" in listed[0]  # its title is what gave way
    footer = rows[-2:]
    assert footer[0] == " y  allow   a  allow always   n  deny   c  cancel run   Tab ] [  session"
    assert footer[1] == " ↑↓ PgUp PgDn Home End  scroll   q  quit"
    assert "[y] allow  [a] allow always  [n] deny" in "\n".join(rows)  # the prompt shows whole


def test_at_160_columns_titles_and_states_are_whole() -> None:
    feed = four_busy_sessions()
    ids = list(TITLES)
    rows = screen_rows(Screen(feed.views, ids, ids[0], T0 + 27.0), 160, 40)
    for row, (sid, title) in zip(rows[1:5], TITLES.items(), strict=True):
        assert row[2:].startswith(sid)
        assert f"  {title}" in row
        if sid != "demo-claude_code":  # the longest title: its adapter gave way to the state
            assert f"{title} · {sid.removeprefix('demo-')}" in row
        assert row.endswith(
            "⚠ 1 permission waiting  ✶ Working… (27s · ↓ 1.2k tokens · thought for 3s)"
        ), row
        assert "…" not in row.replace("Working…", "")


def test_long_ids_are_cut_to_keep_columns_and_short_ones_line_up() -> None:
    feed = Feed()
    uuid = "febcaa44-9f0f-4ae7-ad70-748009748653"
    feed(RunStarted(adapter="claude-code", prompt="write hello"), session=uuid)
    feed(RunStarted(adapter="copilot", prompt="find login"), session="s2", run="run-2")
    views = [feed.views.sessions[uuid], feed.views.sessions["s2"]]
    rows = [row.plain.rstrip() for row in session_rows(views, T0, uuid, 80)]
    assert rows[0] == "▸ febcaa44-9f0f-4ae7-…  write hello · claude-code"
    assert rows[1] == "  s2                    find login · copilot"
    wide = [row.plain for row in session_rows(views, T0, uuid, 160)]
    assert wide[0].startswith(f"▸ {uuid}  write hello")


def test_the_context_bar_needs_a_window_and_an_unknown_one_is_said() -> None:
    feed = Feed()
    feed(RunStarted(adapter="x", prompt="go"))
    feed(ContextUsage(used=54_500))
    view = feed.views.sessions["s1"]
    assert view.context_line() == "context 54.5k · window unknown"
    text = session_text(feed, 1.0)
    assert text.splitlines()[-1] == "context 54.5k · window unknown"  # no bar at all
    assert "█" not in text
    assert "░" not in text
    feed(ContextUsage(used=54_500, window=200_000, percent=27.25))
    assert session_text(feed, 1.0).splitlines()[-1] == ("██░░░░░░░░ context 54.5k / 200.0k (27%)")
    feed(ContextUsage(used=250_000, window=200_000, percent=100.0))  # over: still ten cells
    assert session_text(feed, 1.0).splitlines()[-1].startswith("██████████ context 250.0k")


def test_a_thought_under_a_second_reads_under_a_second() -> None:
    feed = Feed()
    feed(ThinkingDelta(message_id="m1", text="hm"), at=1.0)
    feed(ThinkingComplete(message_id="m1", text="hm", duration_s=0.4), at=1.4)
    assert "∴ Thought for <1s" in session_text(feed, 2.0)
    feed(ThinkingDelta(message_id="m2", text="hm"), at=3.0)
    assert "∴ Thinking… 0s" in session_text(feed, 3.5)  # a running timer counts up from 0s


# -- scrolling ------------------------------------------------------------------------


def long_session(lines: int = 60) -> Feed:
    feed = Feed()
    feed(RunStarted(adapter="x", prompt="count"))
    for i in range(lines):
        feed(TextComplete(message_id=f"m{i}", text=f"line {i}"), at=i / 10)
    return feed


def draw(feed: Feed, viewport: Viewport, height: int = 20) -> list[str]:
    screen = Screen(feed.views, ["s1"], "s1", T0 + 10, help=HELP, viewport=viewport)
    return screen_rows(screen, 100, height)


def test_the_transcript_scrolls_back_stays_put_and_says_where_it_is() -> None:
    feed = long_session()
    viewport = Viewport()
    rows = draw(feed, viewport)
    assert "line 59" in rows
    rule = next(row for row in rows if row.startswith("── "))
    assert rule.startswith("── ↑ earlier lines: PgUp ─")
    room = viewport.room
    viewport.page(-1)
    rows = draw(feed, viewport)
    assert "line 59" not in rows
    shown = [int(row.split()[1]) for row in rows if row.startswith("line ")]
    assert shown == list(range(60 - room - (room - 1), 60 - (room - 1)))  # a page, less a line
    rule = next(row for row in rows if row.startswith("── "))
    assert rule.startswith("── scrolled back (")
    assert "End: the newest" in rule
    # new output arrives: the page stays on the same text
    feed(TextComplete(message_id="new", text="line 60"), at=9.0)
    assert [int(row.split()[1]) for row in draw(feed, viewport) if row.startswith("line ")] == shown
    viewport.scroll(-1)
    assert next(r for r in draw(feed, viewport) if r.startswith("line ")) == f"line {shown[0] - 1}"
    viewport.home()
    rows = draw(feed, viewport)
    assert rows[3:5] == ["❯ count", "line 0"]
    assert "── scrolled back (top) · End: the newest" in "\n".join(rows)
    viewport.page(100)  # past the end: following the newest again
    rows = draw(feed, viewport)
    assert "line 60" in rows
    assert viewport.top is None
    viewport.page(-1)
    draw(feed, viewport)
    viewport.end()
    assert "line 60" in draw(feed, viewport)


def test_a_transcript_that_fits_has_nothing_to_scroll() -> None:
    feed = long_session(3)
    viewport = Viewport()
    viewport.page(-1)
    rows = draw(feed, viewport)
    assert rows[3:7] == ["❯ count", "line 0", "line 1", "line 2"]
    assert viewport.top is None
    assert not any(row.startswith("── ") for row in rows)


def test_scroll_keys_move_the_viewport_and_keep_the_focus() -> None:
    feed = long_session()
    feed(RunStarted(adapter="x", prompt="other"), session="s2", run="run-2")
    state = WatchState(focus="s1")
    for key, pending in (("pageup", -9), ("k", -10), ("up", -11), ("j", -10), ("down", -9)):
        state.viewport.room = 10
        assert state.action_for(key, feed.views, 0) is None
        assert state.viewport.pending == pending
    assert state.follow is False  # reading here: the focus no longer moves elsewhere
    state.settle(feed.views, {"s2"})
    assert state.focus == "s1"
    state.action_for("home", feed.views, 0)
    assert (state.viewport.top, state.viewport.pending) == ((0, 0), 0)
    state.action_for("end", feed.views, 0)
    assert state.viewport.following
    state.action_for("pagedown", feed.views, 0)
    state.action_for("tab", feed.views, 0)  # another session: its newest lines
    assert state.focus == "s2"
    assert state.viewport.following


# -- cancelling and answering ---------------------------------------------------------


def test_c_asks_first_and_any_other_key_keeps_the_run() -> None:
    feed = Feed()
    feed(RunStarted(adapter="x", prompt="go"))
    feed(permission())
    state = WatchState(focus="s1")
    assert state.action_for("c", feed.views, 0) is None
    assert state.current_message(100.0) == (
        "cancel run-1? c or y: cancel it · any other key: keep it"
    )  # it does not time out
    assert help_for(state, feed.views) == [
        ("c y", "yes, cancel the run"),
        ("any other key", "keep it running"),
    ]
    assert state.action_for("n", feed.views, 0) is None  # not a denial: it only aborts
    assert feed.views.sessions["s1"].pending_permissions()
    assert state.current_message(1.0) == "run-1 keeps running"
    state.action_for("c", feed.views, 0)
    assert state.action_for("y", feed.views, 0) == Cancel(run_id="run-1", session_id="s1")
    assert state.current_message(100.0) == "cancelling run-1…"  # until the run ends
    state.ended({"run-other"})
    assert state.current_message(100.0) == "cancelling run-1…"
    feed(RunFinished(status="cancelled", duration_s=1.0), at=1.0)
    state.ended({"run-1"})
    assert state.current_message(100.0) is None
    assert state.action_for("c", feed.views, 0) is None
    assert state.current_message(1.0) == "no run in progress in this session"


def test_a_cancel_confirmed_after_the_run_ended_says_so() -> None:
    feed = Feed()
    feed(RunStarted(adapter="x", prompt="go"))
    state = WatchState(focus="s1")
    state.action_for("c", feed.views, 0)
    feed(RunFinished(status="ok", duration_s=1.0), at=1.0)
    assert state.action_for("c", feed.views, 0) is None
    assert state.current_message(1.0) == "run-1 has already ended"


def test_after_an_answer_the_focus_stays_where_the_user_is() -> None:
    feed = Feed()
    feed(RunStarted(adapter="x", prompt="a"), session="s1", run="run-1")
    feed(permission("run-1/p1"), session="s1", run="run-1")
    feed(RunStarted(adapter="x", prompt="b"), session="s2", run="run-2")
    feed(permission("run-2/p1"), session="s2", run="run-2")
    state = WatchState()
    state.settle(feed.views, {"s1"})
    assert state.focus == "s1"
    assert state.action_for("y", feed.views, 0) is not None
    feed(PermissionResolved(request_id="run-1/p1", outcome="allowed", by="me"), session="s1")
    state.settle(feed.views, {"s1", "s2"})
    assert state.focus == "s1"  # s2 still asks, but the user is reading s1's answer
    feed(ToolStart(tool_call_id="t", name="Bash"), session="s2", run="run-2")
    state.settle(feed.views, {"s2"})
    assert state.focus == "s1"


def test_the_footer_lists_only_the_keys_that_do_something() -> None:
    feed = Feed()
    feed(RunStarted(adapter="x", prompt="go"))
    state = WatchState(focus="s1")
    assert [key for key, _ in help_for(state, feed.views)] == [
        "c",
        "↑↓ PgUp PgDn Home End",
        "q",
    ]
    feed(permission(always=False))
    assert [key for key, _ in help_for(state, feed.views)][:3] == ["y", "n", "c"]
    feed(
        RunFinished(status="ok", duration_s=1, usage=TokenUsage(output_tokens=3)),
        at=1.0,
    )
    feed(RunStarted(adapter="x", prompt="b"), session="s2", run="run-2")
    assert [key for key, _ in help_for(state, feed.views)] == [
        "Tab ] [",
        "↑↓ PgUp PgDn Home End",
        "q",
    ]


def test_the_header_stays_under_the_title() -> None:
    feed = long_session()
    hint = "more frontends: BUSD_SOCKET=/tmp/busd-demo-k2x1/bus.sock busd watch (or busd web)"
    rows = screen_rows(Screen(feed.views, ["s1"], "s1", T0, header=hint), 80, 24)
    assert rows[0] == "busd watch · 1 session"
    assert " ".join(rows[1:3]) == hint  # wrapped, not cut: it is to be copied
    assert rows[3].startswith("▸ s1")


def test_a_tiny_terminal_keeps_the_footer() -> None:
    feed = four_busy_sessions()
    ids = list(TITLES)
    state = WatchState(focus=ids[0])
    screen = Screen(feed.views, ids, ids[0], T0 + 27.0, help=help_for(state, feed.views))
    rows = screen_rows(screen, 60, 12)
    assert len(rows) == 11
    assert rows[-2].startswith(" y  allow   a  allow always")
    assert rows[-1] == " Tab ] [  session   ↑↓ PgUp PgDn Home End  scroll   q  quit"
