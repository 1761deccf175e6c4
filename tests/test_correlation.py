from __future__ import annotations

from typing import Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from busd.core.correlation import (
    Correlator,
    DuplicateRun,
    EndStatus,
    Route,
    UnknownRun,
)
from busd.core.errors import BusdError
from busd.core.events import (
    AgentComplete,
    AgentStart,
    Envelope,
    Event,
    PermissionRequested,
    RunFinished,
    RunStarted,
    SessionStart,
    TextDelta,
    ThinkingDelta,
    ToolComplete,
    ToolPartialResult,
    ToolStart,
)

END_STATUSES: tuple[EndStatus, ...] = ("ok", "error", "cancelled", "timed_out")


def text(value: str = "hi") -> TextDelta:
    return TextDelta(message_id="m1", text=value)


def stamp(route: Route, event: Event, session_id: str | None = None) -> Envelope[Event]:
    """The envelope the bus would publish with this route."""
    return Envelope(1, 0.0, event, session_id, route.run_id, route.agent_id, "test", route.stale)


# -- runs and sessions -------------------------------------------------------


def test_new_run_supersedes_the_active_run_of_its_session() -> None:
    c = Correlator()
    old = c.start_run("a", session_id="s")
    new = c.start_run("b", session_id="s")

    assert old.status == "superseded"
    assert not old.active
    assert c.active_run("s") is new
    assert c.runs() == [new]
    assert c.route(text(), session_id="s", run_id="a") == Route("a", None, True)
    assert c.route(text(), session_id="s", run_id="b") == Route("b", None, False)
    # Without a run id, the session's current run gets the event.
    assert c.route(text(), session_id="s") == Route("b", None, False)
    assert c.statistics().stale_events == 1


def test_superseded_run_cannot_take_its_session_back() -> None:
    c = Correlator()
    c.start_run("a", session_id="s")
    c.start_run("b", session_id="s")
    c.route(SessionStart(), session_id="s", run_id="a")
    c.route(text(), session_id="s", run_id="a")
    assert c.active_run("s") is c.get_run("b")
    assert c.route(text(), session_id="s") == Route("b", None, False)


def test_ended_run_never_takes_a_session_from_a_live_run() -> None:
    c = Correlator()
    c.start_run("a")
    c.end_run("a", "cancelled")
    live = c.start_run("b", session_id="s")
    assert c.route(SessionStart(), session_id="s", run_id="a") == Route("a", None, True)
    assert c.route(text(), session_id="s", run_id="a") == Route("a", None, True)
    assert c.active_run("s") is live
    assert c.route(text(), session_id="s") == Route("b", None, False)


@pytest.mark.parametrize("status", END_STATUSES)
def test_events_of_an_ended_run_are_stale(status: EndStatus) -> None:
    c = Correlator()
    run = c.start_run("r", session_id="s")
    assert c.end_run("r", status) is run

    assert run.status == status
    assert c.active_run("s") is None
    assert c.runs() == []
    assert c.route(text(), session_id="s", run_id="r") == Route("r", None, True)
    assert c.route(text(), session_id="s") == Route("r", None, True)
    assert c.route(ThinkingDelta(message_id="m", text="t")) == Route()
    assert c.statistics().stale_events == 2


def test_late_session_start_of_a_cancelled_run_is_stale_and_binds_nothing_live() -> None:
    c = Correlator()
    c.start_run("a")
    c.end_run("a", "cancelled")
    waiting = c.start_run("b")

    assert c.route(SessionStart(), session_id="s1", run_id="a") == Route("a", None, True)
    # The cancelled run still recognizes its session, so later events are stale too.
    assert c.route(text(), session_id="s1") == Route("a", None, True)
    assert c.active_run("s1") is None
    # The run still waiting for its session is unaffected and gets the next one.
    assert waiting.active
    assert c.active_run("s2") is None
    assert c.route(SessionStart(), session_id="s2") == Route("b", None, False)
    assert waiting.session_ids == ("s2",)


def test_run_started_before_its_session_is_known_gets_it_from_session_start() -> None:
    c = Correlator()
    run = c.start_run("r", request_id="q1")
    assert c.active_run("s") is None
    assert c.route(text(), session_id="s") == Route()

    assert c.route(SessionStart(model="m"), session_id="s") == Route("r", None, False)
    assert run.session_ids == ("s",)
    assert c.active_run("s") is run
    assert c.route(text(), session_id="s") == Route("r", None, False)


def test_session_start_is_not_guessed_when_several_runs_wait() -> None:
    c = Correlator()
    c.start_run("a")
    b = c.start_run("b")
    assert c.route(SessionStart(), session_id="s") == Route()
    assert c.route(SessionStart(), session_id="s", run_id="b") == Route("b", None, False)
    assert c.active_run("s") is b


def test_session_start_announcing_a_session_of_another_active_run_supersedes_it() -> None:
    c = Correlator()
    a = c.start_run("a", session_id="s")
    b = c.start_run("b")
    # Without a run id the session's active owner keeps it.
    assert c.route(SessionStart(), session_id="s") == Route("a", None, False)
    # With one, the run resuming the session takes it over.
    assert c.route(SessionStart(), session_id="s", run_id="b") == Route("b", None, False)
    assert a.status == "superseded"
    assert c.active_run("s") is b


def test_event_with_a_run_id_adopts_an_unowned_session() -> None:
    c = Correlator()
    run = c.start_run("r")
    assert c.route(text(), session_id="s", run_id="r") == Route("r", None, False)
    assert run.session_ids == ("s",)
    assert c.route(text(), session_id="s") == Route("r", None, False)


def test_child_session_is_owned_by_the_parent_run_as_a_sub_agent() -> None:
    c = Correlator()
    run = c.start_run("r", session_id="s")

    assert c.route(SessionStart(parent_session_id="s"), session_id="c1") == Route("r", "c1", False)
    assert c.route(SessionStart(parent_session_id="c1"), session_id="c2") == Route("r", "c2", False)
    assert run.session_ids == ("s", "c1", "c2")
    assert dict(run.agents) == {"c1": None, "c2": "c1"}
    child_text = c.route(text(), session_id="c2")
    assert child_text == Route("r", "c2", False)
    assert not Correlator.for_main_chat(stamp(child_text, text(), "c2"))
    assert Correlator.is_owned(stamp(child_text, text(), "c2"))


def test_child_session_of_an_ended_run_is_stale() -> None:
    c = Correlator()
    c.start_run("r", session_id="s")
    c.end_run("r", "error")
    assert c.route(SessionStart(parent_session_id="s"), session_id="c") == Route("r", "c", True)
    assert c.route(text(), session_id="c") == Route("r", "c", True)


def test_child_session_announced_for_another_run_is_that_runs_main_session() -> None:
    c = Correlator()
    c.start_run("a", session_id="s")
    c.start_run("fork")
    route = c.route(SessionStart(parent_session_id="s"), session_id="f", run_id="fork")
    assert route == Route("fork", None, False)
    assert c.get_run("a").active  # type: ignore[union-attr]


# -- sub-agents and tool calls ----------------------------------------------


def test_sub_agent_tool_attribution_survives_to_completion_without_parent_id() -> None:
    c = Correlator()
    run = c.start_run("r", session_id="s")

    task = ToolStart(tool_call_id="tu_task", name="Task")
    assert c.route(task, session_id="s") == Route("r", None, False)
    c.route(AgentStart(agent_id="explorer", tool_call_id="tu_task"), session_id="s")

    read = ToolStart(tool_call_id="tu_read", name="Read", parent_tool_call_id="tu_task")
    grep = ToolStart(tool_call_id="tu_grep", name="Grep")
    assert c.route(read, session_id="s") == Route("r", "explorer", False)
    assert c.route(grep, session_id="s", parent_tool_call_id="tu_task") == Route(
        "r", "explorer", False
    )
    assert c.statistics().open_tool_calls == 3

    partial = ToolPartialResult(tool_call_id="tu_read", output="1: import")
    assert c.route(partial, session_id="s") == Route("r", "explorer", False)
    assert c.route(ToolComplete(tool_call_id="tu_read"), session_id="s") == Route(
        "r", "explorer", False
    )
    assert c.route(ToolComplete(tool_call_id="tu_grep"), session_id="s") == Route(
        "r", "explorer", False
    )
    assert c.route(ToolComplete(tool_call_id="tu_task"), session_id="s") == Route("r", None, False)
    assert c.statistics().open_tool_calls == 0
    assert dict(run.agents) == {"explorer": None}


def test_tool_attribution_given_with_the_event_wins_over_the_remembered_one() -> None:
    c = Correlator()
    c.start_run("r", session_id="s")
    c.route(ToolStart(tool_call_id="t1", name="Read"), session_id="s")
    done = c.route(ToolComplete(tool_call_id="t1"), session_id="s", agent_id="other")
    assert done == Route("r", "other", False)
    assert c.statistics().open_tool_calls == 0


def test_spawning_tool_call_without_announcement_names_an_implicit_sub_agent() -> None:
    c = Correlator()
    run = c.start_run("r", session_id="s")
    c.route(ToolStart(tool_call_id="tu_task", name="Task"), session_id="s")

    sub_text = c.route(text(), session_id="s", parent_tool_call_id="tu_task")
    assert sub_text == Route("r", "tu_task", False)
    # A tool of the implicit agent that spawns a nested one: parent is the caller.
    nested = ToolStart(tool_call_id="tu_inner", name="Task", parent_tool_call_id="tu_task")
    assert c.route(nested, session_id="s") == Route("r", "tu_task", False)
    assert c.route(text(), session_id="s", parent_tool_call_id="tu_inner") == Route(
        "r", "tu_inner", False
    )
    assert dict(run.agents) == {"tu_task": None, "tu_inner": "tu_task"}


def test_agent_events_belong_to_the_transcript_of_the_agent_that_spawned_them() -> None:
    c = Correlator()
    run = c.start_run("r", session_id="s")
    c.route(ToolStart(tool_call_id="t1", name="Task"), session_id="s")
    top = c.route(AgentStart(agent_id="planner", tool_call_id="t1"), session_id="s")
    c.route(ToolStart(tool_call_id="t2", name="Task", parent_tool_call_id="t1"), session_id="s")
    nested = c.route(AgentStart(agent_id="coder", tool_call_id="t2"), session_id="s")

    assert top == Route("r", None, False)
    assert nested == Route("r", "planner", False)
    assert dict(run.agents) == {"planner": None, "coder": "planner"}
    # Completions come without any agent information and still land right.
    assert c.route(AgentComplete(agent_id="coder"), session_id="s") == Route("r", "planner", False)
    assert c.route(AgentComplete(agent_id="planner"), session_id="s") == Route("r", None, False)
    # An adapter that stamps the new agent's own id on its start: it is not its own parent.
    solo = c.route(AgentStart(agent_id="solo"), session_id="s", agent_id="solo")
    assert solo == Route("r", None, False)
    assert run.agents["solo"] is None


def test_announced_agent_replaces_the_implicit_one_from_then_on() -> None:
    c = Correlator()
    c.start_run("r", session_id="s")
    assert c.route(text(), session_id="s", parent_tool_call_id="t1").agent_id == "t1"
    c.route(AgentStart(agent_id="explorer", tool_call_id="t1"), session_id="s")
    assert c.route(text(), session_id="s", parent_tool_call_id="t1").agent_id == "explorer"


def test_sub_agent_text_is_kept_out_of_the_main_chat() -> None:
    c = Correlator()
    c.start_run("r", session_id="s")
    c.route(AgentStart(agent_id="explorer", tool_call_id="t1"), session_id="s")

    main = stamp(c.route(text("main"), session_id="s"), text("main"), "s")
    sub = stamp(c.route(text("sub"), session_id="s", parent_tool_call_id="t1"), text("sub"), "s")
    explicit = stamp(c.route(text("x"), session_id="s", agent_id="explorer"), text("x"), "s")

    assert Correlator.for_main_chat(main)
    assert not Correlator.for_main_chat(sub)
    assert not Correlator.for_main_chat(explicit)
    assert sub.agent_id == explicit.agent_id == "explorer"
    assert Correlator.is_owned(main)
    assert Correlator.is_owned(sub)


def test_stale_and_foreign_events_are_neither_owned_nor_main_chat_when_stale() -> None:
    c = Correlator()
    c.start_run("r", session_id="s")
    c.end_run("r", "cancelled")
    stale = stamp(c.route(text(), session_id="s"), text(), "s")
    foreign = stamp(c.route(text(), session_id="elsewhere"), text(), "elsewhere")

    assert not Correlator.for_main_chat(stale)
    assert not Correlator.is_owned(stale)
    assert Correlator.for_main_chat(foreign)
    assert not Correlator.is_owned(foreign)


def test_permission_request_is_attributed_through_its_tool_call() -> None:
    c = Correlator()
    c.start_run("r", session_id="s")
    c.route(AgentStart(agent_id="explorer", tool_call_id="t1"), session_id="s")
    c.route(ToolStart(tool_call_id="t2", name="Bash"), session_id="s", parent_tool_call_id="t1")
    c.route(ToolStart(tool_call_id="t3", name="Edit"), session_id="s")

    def ask(tool_call_id: str | None) -> Route:
        request = PermissionRequested(request_id="p", tool="Bash", tool_call_id=tool_call_id)
        return c.route(request, session_id="s")

    assert ask("t2") == Route("r", "explorer", False)
    assert ask("t3") == Route("r", None, False)
    assert ask(None) == Route("r", None, False)
    # Asking does not close the tool call.
    assert c.statistics().open_tool_calls == 2


def test_foreign_sessions_pass_agent_information_through() -> None:
    c = Correlator()
    assert c.route(text(), session_id="x", agent_id="a1") == Route(None, "a1", False)
    assert c.route(text(), session_id="x", parent_tool_call_id="t9") == Route(None, "t9", False)
    assert c.route(ToolStart(tool_call_id="t", name="n", parent_tool_call_id="t9")) == Route(
        None, "t9", False
    )
    assert c.statistics().owned_sessions == 0


def test_unknown_run_id_is_stale() -> None:
    c = Correlator()
    assert c.route(text(), session_id="s", run_id="ghost") == Route("ghost", None, True)
    assert c.route(SessionStart(), session_id="s", run_id="ghost") == Route("ghost", None, True)
    assert c.active_run("s") is None
    assert c.statistics().stale_events == 2


# -- run lifecycle events, requests, errors ---------------------------------


def test_request_id_maps_to_its_run() -> None:
    c = Correlator()
    first = c.start_run("r1", request_id="q1")
    c.route(RunStarted(adapter="claude", request_id="q2"), run_id="r2", session_id="s")

    assert c.run_for_request("q1") is first
    second = c.run_for_request("q2")
    assert second is not None
    assert second.run_id == "r2"
    assert second.session_ids == ("s",)
    assert c.run_for_request("nobody") is None


def test_run_finished_is_never_stale_and_ends_the_run() -> None:
    c = Correlator()
    run = c.start_run("r", session_id="s")
    finished = RunFinished(status="cancelled", duration_s=1.0)
    assert c.route(finished, run_id="r", session_id="s") == Route("r", None, False)
    assert run.status == "cancelled"
    assert c.route(text(), session_id="s") == Route("r", None, True)

    # Ended first by the daemon, published afterwards: still not stale.
    c.start_run("r2", session_id="s2")
    c.end_run("r2", "timed_out")
    timed_out = RunFinished(status="timed_out", duration_s=300.0)
    assert c.route(timed_out, run_id="r2", session_id="s2") == Route("r2", None, False)


def test_route_returns_the_same_route_while_nothing_changes() -> None:
    c = Correlator()
    c.start_run("r", session_id="s")
    first = c.route(text("a"), session_id="s", run_id="r")
    assert c.route(text("b"), session_id="s", run_id="r") is first
    c.end_run("r")
    assert c.route(text("c"), session_id="s", run_id="r") == Route("r", None, True)


def test_run_errors_are_busd_errors_refining_builtins() -> None:
    c = Correlator()
    c.start_run("r")
    with pytest.raises(DuplicateRun, match="already known"):
        c.start_run("r")
    with pytest.raises(UnknownRun, match="ghost"):
        c.end_run("ghost")
    with pytest.raises(ValueError, match="not 'active'"):
        c.end_run("r", "active")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=">= 0"):
        Correlator(max_ended_runs=-1)
    assert issubclass(DuplicateRun, BusdError)
    assert issubclass(DuplicateRun, ValueError)
    assert issubclass(UnknownRun, BusdError)
    assert issubclass(UnknownRun, LookupError)


def test_first_end_of_a_run_wins() -> None:
    c = Correlator()
    c.start_run("a", session_id="s")
    c.start_run("b", session_id="s")
    assert c.end_run("a", "cancelled").status == "superseded"
    c.end_run("b", "error")
    assert c.end_run("b", "ok").status == "error"
    assert c.statistics().ended_runs == 2


# -- bounded memory ----------------------------------------------------------


def test_memory_stays_bounded_over_many_runs() -> None:
    c = Correlator(max_ended_runs=8)
    for i in range(10_000):
        c.start_run(f"r{i}", request_id=f"q{i}")
        c.route(SessionStart(), session_id=f"s{i}")
        c.route(SessionStart(parent_session_id=f"s{i}"), session_id=f"c{i}")
        c.route(AgentStart(agent_id="explorer", tool_call_id="t1"), session_id=f"s{i}")
        c.route(
            ToolStart(tool_call_id="t2", name="Read", parent_tool_call_id="t1"), session_id=f"s{i}"
        )
        c.route(ToolStart(tool_call_id="t3", name="Read"), session_id=f"s{i}")
        c.route(ToolComplete(tool_call_id="t3"), session_id=f"s{i}")
        c.end_run(f"r{i}", "ok")

    stats = c.statistics()
    assert stats.active_runs == 0
    assert stats.ended_runs == 8
    assert stats.owned_sessions == 16  # each run's main and child session
    assert stats.agents == 16  # each run's explorer and child-session agent
    assert stats.open_tool_calls == 8  # t2 never completed; t3 was forgotten at once
    assert c.get_run("r0") is None
    assert c.run_for_request("q0") is None
    assert c.get_run("r9999") is not None
    # Forgotten runs: their id is still stale, their sessions are no one's.
    assert c.route(text(), run_id="r0") == Route("r0", None, True)
    assert c.route(text(), session_id="s0") == Route()
    assert c.route(text(), session_id="s9999") == Route("r9999", None, True)


def test_with_no_memory_for_ended_runs_only_run_ids_stay_stale() -> None:
    c = Correlator(max_ended_runs=0)
    c.start_run("r", session_id="s", request_id="q")
    c.end_run("r")
    stats = c.statistics()
    assert (stats.active_runs, stats.ended_runs, stats.owned_sessions) == (0, 0, 0)
    assert c.get_run("r") is None
    assert c.run_for_request("q") is None
    assert c.route(text(), session_id="s", run_id="r").stale
    assert c.route(text(), session_id="s") == Route()


# -- laws --------------------------------------------------------------------

Op = tuple[str, int, int | None, int | None, int | None]

ops = st.lists(
    st.tuples(
        st.sampled_from(["start", "end", "session", "child", "text", "tool", "done", "agent"]),
        st.integers(0, 5),  # run
        st.none() | st.integers(0, 3),  # session
        st.none() | st.integers(0, 5),  # explicit run id
        st.none() | st.integers(0, 3),  # parent tool call
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_routes_are_stale_exactly_when_their_run_is_not_active(script: list[Op]) -> None:
    c = Correlator(max_ended_runs=3)
    statuses: tuple[Literal["ok", "cancelled"], ...] = ("ok", "cancelled")
    for kind, run, session, claimed, parent in script:
        sid = None if session is None else f"s{session}"
        rid = None if claimed is None else f"r{claimed}"
        ptc = None if parent is None else f"t{parent}"
        if kind == "start":
            if c.get_run(f"r{run}") is None:
                c.start_run(f"r{run}", session_id=sid)
            continue
        if kind == "end":
            if c.get_run(f"r{run}") is not None:
                c.end_run(f"r{run}", statuses[run % 2])
            continue
        event: Event = {
            "session": SessionStart(),
            "child": SessionStart(parent_session_id="s0"),
            "text": text(),
            "tool": ToolStart(tool_call_id=f"t{run}", name="Task"),
            "done": ToolComplete(tool_call_id=f"t{run}"),
            "agent": AgentStart(agent_id=f"a{run}", tool_call_id=f"t{run}"),
        }[kind]
        route = c.route(event, session_id=sid, run_id=rid, parent_tool_call_id=ptc)

        if rid is not None:
            assert route.run_id == rid
        if route.run_id is None:
            assert not route.stale
        else:
            known = c.get_run(route.run_id)
            assert route.stale == (known is None or not known.active)
        envelope = stamp(route, event, sid)
        assert Correlator.is_owned(envelope) == (route.run_id is not None and not route.stale)

        stats = c.statistics()
        assert stats.ended_runs <= 3
        assert stats.active_runs == len(c.runs())
        for active in c.runs():
            assert active.active
            for owned in active.session_ids:
                current = c.active_run(owned)
                assert current is None or current.active


def test_the_example_sequence_in_the_docs() -> None:
    c = Correlator()

    def row(route: Route, event: Event) -> tuple[str | None, str | None, bool, bool]:
        return (
            route.run_id,
            route.agent_id,
            route.stale,
            Correlator.for_main_chat(stamp(route, event)),
        )

    started = RunStarted(adapter="claude", request_id="q1")
    assert row(c.route(started, run_id="r1"), started) == ("r1", None, False, True)
    session = SessionStart()
    assert row(c.route(session, session_id="s1"), session) == ("r1", None, False, True)
    look = text("Let me look")
    assert row(c.route(look, session_id="s1"), look) == ("r1", None, False, True)
    task = ToolStart(tool_call_id="tu1", name="Task")
    assert row(c.route(task, session_id="s1"), task) == ("r1", None, False, True)
    agent = AgentStart(agent_id="explorer", tool_call_id="tu1")
    assert row(c.route(agent, session_id="s1"), agent) == ("r1", None, False, True)
    read = ToolStart(tool_call_id="tu2", name="Read", parent_tool_call_id="tu1")
    assert row(c.route(read, session_id="s1"), read) == ("r1", "explorer", False, False)
    ask = PermissionRequested(request_id="p1", tool="Read", tool_call_id="tu2")
    assert row(c.route(ask, session_id="s1"), ask) == ("r1", "explorer", False, False)
    done = ToolComplete(tool_call_id="tu2")
    assert row(c.route(done, session_id="s1"), done) == ("r1", "explorer", False, False)
    c.start_run("r2", session_id="s1")
    late = text("in flight")
    assert row(c.route(late, session_id="s1", run_id="r1"), late) == ("r1", None, True, False)
    fresh = text("new prompt")
    assert row(c.route(fresh, session_id="s1", run_id="r2"), fresh) == ("r2", None, False, True)
    finished = RunFinished(status="cancelled", duration_s=3.0)
    assert row(c.route(finished, session_id="s1", run_id="r1"), finished) == (
        "r1",
        None,
        False,
        True,
    )
    assert c.run_for_request("q1") is c.get_run("r1")
