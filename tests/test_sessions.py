from __future__ import annotations

from itertools import count

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from busd.core.events import (
    AgentComplete,
    AgentStart,
    ContextUsage,
    Envelope,
    Event,
    PermissionRequested,
    PermissionResolved,
    RunFinished,
    RunStarted,
    SessionError,
    SessionIdle,
    SessionStart,
    SessionTitleChanged,
    StreamingStats,
    TextComplete,
    TextDelta,
    ThinkingComplete,
    ThinkingDelta,
    TokenUsage,
    ToolComplete,
    ToolStart,
    Usage,
    UserPrompt,
)
from busd.core.sessions import SessionRegistry, SessionSnapshot, SessionSummary, SubAgent


class Feed:
    """Envelopes with increasing seq and ts, fed to a registry."""

    def __init__(self, registry: SessionRegistry) -> None:
        self.registry = registry
        self._seq = count(1)

    def __call__(
        self,
        event: Event,
        *,
        session: str | None = "s1",
        run: str | None = "r1",
        agent: str | None = None,
        stale: bool = False,
    ) -> Envelope[Event]:
        seq = next(self._seq)
        envelope: Envelope[Event] = Envelope(
            seq, 1000.0 + seq, event, session, run, agent, "test", stale
        )
        self.registry.observe(envelope)
        return envelope


@pytest.fixture
def registry() -> SessionRegistry:
    return SessionRegistry()


@pytest.fixture
def feed(registry: SessionRegistry) -> Feed:
    return Feed(registry)


def usage(output: int, input_: int = 100) -> Usage:
    return Usage(tokens=TokenUsage(input_tokens=input_, output_tokens=output), model="opus")


def test_a_realistic_turn_gives_the_right_summary_and_snapshot(
    registry: SessionRegistry, feed: Feed
) -> None:
    feed(RunStarted(adapter="claude", model="sonnet"))
    feed(SessionStart(model="claude-sonnet", title="Fix the bug", cwd="/src"))
    feed(ThinkingDelta(message_id="m1", text="hmm"))
    feed(ThinkingComplete(message_id="m1", text="hmm", duration_s=1.5))
    feed(TextDelta(message_id="m2", text="Let me look"))
    feed(TextComplete(message_id="m2", text="Let me look"))
    feed(ToolStart(tool_call_id="t1", name="Read"))
    asked = feed(PermissionRequested(request_id="p1", tool="Bash", tool_call_id="t2"))
    feed(ToolStart(tool_call_id="t2", name="Bash"))
    feed(usage(output=50))
    feed(ToolComplete(tool_call_id="t1", name="Read"))
    stats = StreamingStats(elapsed_s=4.0, output_tokens=50, thinking_s=1.5)
    context = ContextUsage(used=12_000, window=200_000, percent=6.0)
    feed(stats, run=None)
    feed(context)

    snapshot = registry.snapshot("s1")

    assert snapshot is not None
    assert snapshot.status == "active"
    assert snapshot.model == "opus"  # the usage report names the model that answered
    assert snapshot.title == "Fix the bug"
    assert snapshot.cwd == "/src"
    assert snapshot.run_id == "r1"
    assert (snapshot.first_seq, snapshot.last_seq, snapshot.events) == (1, 13, 13)
    assert (snapshot.first_ts, snapshot.last_ts) == (1001.0, 1013.0)
    assert snapshot.usage == TokenUsage(input_tokens=100, output_tokens=50)
    assert snapshot.stats == stats
    assert snapshot.context == context
    assert snapshot.permissions == (asked,)
    assert snapshot.pending_permissions == 1
    assert snapshot.tools == {"t2": "Bash"}
    assert snapshot.running_tools == 1

    feed(PermissionResolved(request_id="p1", outcome="allowed"))
    feed(ToolComplete(tool_call_id="t2"))
    feed(usage(output=80))
    feed(SessionIdle())

    summary = registry.summary("s1")
    assert summary is not None
    assert summary.status == "idle"
    assert summary.pending_permissions == 0
    assert summary.running_tools == 0
    assert summary.usage == TokenUsage(input_tokens=100, output_tokens=80)
    assert registry.list() == [summary]


def test_cumulative_usage_takes_the_later_report_and_never_sums_or_goes_down(
    registry: SessionRegistry, feed: Feed
) -> None:
    feed(usage(output=10, input_=500))
    feed(usage(output=30, input_=500))
    feed(usage(output=20, input_=600))  # a late, partly older report

    state = registry.get("s1")
    assert state is not None
    assert state.usage == TokenUsage(input_tokens=600, output_tokens=30)


def test_usage_by_model_merges_each_model_like_the_total(
    registry: SessionRegistry, feed: Feed
) -> None:
    """Each model's entry takes the field-wise max, like ``usage``: a late,
    older report (sonnet 266) never lowers sonnet's 412; a report without a
    breakdown leaves it as it was."""

    def report(sonnet: int, haiku: int | None) -> Usage:
        models = {"sonnet": TokenUsage(output_tokens=sonnet)}
        if haiku is not None:
            models["haiku"] = TokenUsage(output_tokens=haiku)
        total = sonnet + (haiku or 0)
        return Usage(tokens=TokenUsage(output_tokens=total), models=models)

    feed(report(266, None))
    feed(report(412, 3))
    feed(report(266, 3))  # late
    feed(Usage(tokens=TokenUsage(output_tokens=415)))
    summary = registry.summary("s1")
    assert summary is not None
    assert {m: u.output_tokens for m, u in summary.usage_by_model.items()} == {
        "sonnet": 412,
        "haiku": 3,
    }
    assert summary.usage == TokenUsage(output_tokens=412 + 3)
    # It travels in the summary and comes back with a restored session.
    again = SessionRegistry()
    again.restore(msgspec.json.decode(msgspec.json.encode(summary), type=SessionSummary))
    restored = again.snapshot("s1")
    assert restored is not None
    assert restored.usage_by_model == summary.usage_by_model


def test_sub_agent_usage_stats_and_context_do_not_describe_the_session(
    registry: SessionRegistry, feed: Feed
) -> None:
    feed(usage(output=10))
    feed(usage(output=999), agent="explorer")
    feed(ContextUsage(used=5), agent="explorer")
    feed(StreamingStats(elapsed_s=1.0), agent="explorer")

    state = registry.get("s1")
    assert state is not None
    assert state.usage == TokenUsage(input_tokens=100, output_tokens=10)
    assert state.context is None
    assert state.stats is None


def test_an_unknown_session_has_no_snapshot_or_summary(registry: SessionRegistry) -> None:
    assert registry.snapshot("nope") is None
    assert registry.summary("nope") is None
    assert registry.get("nope") is None
    assert "nope" not in registry


def test_envelopes_without_a_session_are_ignored(registry: SessionRegistry, feed: Feed) -> None:
    feed(RunStarted(adapter="claude"), session=None)

    assert len(registry) == 0
    assert registry.statistics().observed == 0


def test_an_error_holds_until_the_next_sign_of_work(registry: SessionRegistry, feed: Feed) -> None:
    feed(SessionStart())
    feed(SessionError(message="overloaded", retryable=True))

    summary = registry.summary("s1")
    assert summary is not None
    assert (summary.status, summary.error) == ("error", "overloaded")

    feed(SessionTitleChanged(title="still broken"))
    assert registry.summary("s1") == msgspec.structs.replace(
        summary, title="still broken", last_seq=3, last_ts=1003.0, events=3
    )

    feed(TextDelta(message_id="m", text="retrying worked"))
    summary = registry.summary("s1")
    assert summary is not None
    assert (summary.status, summary.error) == ("active", None)


@pytest.mark.parametrize(
    "trailing",
    [
        SessionTitleChanged(title="Named later"),
        usage(output=5),
        StreamingStats(elapsed_s=3.0),
        ContextUsage(used=100),
    ],
)
def test_events_that_trail_a_turn_do_not_wake_an_idle_session(
    registry: SessionRegistry, feed: Feed, trailing: Event
) -> None:
    feed(SessionStart())
    feed(SessionIdle())
    feed(trailing)

    state = registry.get("s1")
    assert state is not None
    assert state.status == "idle"


def test_stale_output_of_an_old_run_changes_neither_status_nor_latest_run(
    registry: SessionRegistry, feed: Feed
) -> None:
    feed(SessionStart())
    feed(SessionIdle())
    feed(TextDelta(message_id="m", text="late"), run="r0", stale=True)
    feed(SessionIdle(), run="r0", stale=True)

    state = registry.get("s1")
    assert state is not None
    assert (state.status, state.run_id) == ("idle", "r1")


def test_only_the_latest_run_finishing_settles_the_session(
    registry: SessionRegistry, feed: Feed
) -> None:
    feed(RunStarted(adapter="claude"), run="r1")
    feed(RunStarted(adapter="claude"), run="r2")
    feed(TextDelta(message_id="m", text="r2 works"), run="r2")
    feed(RunFinished(status="cancelled", duration_s=1.0), run="r1")

    state = registry.get("s1")
    assert state is not None
    assert (state.status, state.run_id) == ("active", "r2")

    feed(RunFinished(status="timed_out", duration_s=300.0), run="r2")
    assert (state.status, state.error, state.run_id) == ("error", "timed_out", "r2")


def test_a_run_finishing_ok_makes_the_session_idle_and_closes_what_was_open(
    registry: SessionRegistry, feed: Feed
) -> None:
    feed(ToolStart(tool_call_id="t1", name="Bash"))
    feed(PermissionRequested(request_id="p1", tool="Bash"))
    feed(RunFinished(status="ok", duration_s=2.0))

    summary = registry.summary("s1")
    assert summary is not None
    assert (summary.status, summary.running_tools, summary.pending_permissions) == ("idle", 0, 0)


def test_sub_agents_are_listed_with_name_and_outcome_and_their_idle_does_not_idle_the_session(
    registry: SessionRegistry, feed: Feed
) -> None:
    feed(SessionStart())
    feed(ToolStart(tool_call_id="t1", name="Task"))
    feed(AgentStart(agent_id="explorer", name="Explore", tool_call_id="t1"))
    feed(TextDelta(message_id="m", text="reading"), agent="explorer")
    feed(TextDelta(message_id="m", text="also me"), agent="helper")
    feed(SessionIdle(), agent="explorer")
    feed(AgentComplete(agent_id="explorer", status="ok"))

    snapshot = registry.snapshot("s1")
    assert snapshot is not None
    assert snapshot.status == "active"
    assert snapshot.agents == (
        SubAgent(agent_id="explorer", name="Explore", status="ok"),
        SubAgent(agent_id="helper"),
    )
    assert snapshot.sub_agents == 2


def test_a_child_session_is_described_by_its_own_agent(
    registry: SessionRegistry, feed: Feed
) -> None:
    feed(SessionStart(parent_session_id="s1"), session="c1", agent="c1")
    feed(TextDelta(message_id="m", text="child"), session="c1", agent="c1")
    feed(usage(output=7), session="c1", agent="c1")
    feed(SessionIdle(), session="c1", agent="c1")

    snapshot = registry.snapshot("c1")
    assert snapshot is not None
    assert snapshot.parent_session_id == "s1"
    assert snapshot.status == "idle"
    assert snapshot.usage == TokenUsage(input_tokens=100, output_tokens=7)
    assert snapshot.agents == ()


def test_the_least_recently_active_session_is_forgotten_first() -> None:
    registry = SessionRegistry(max_sessions=2)
    feed = Feed(registry)
    feed(SessionStart(), session="a")
    feed(SessionStart(), session="b")
    feed(TextDelta(message_id="m", text="a again"), session="a")
    feed(SessionStart(), session="c")

    assert [s.session_id for s in registry.list()] == ["c", "a"]
    assert registry.get("b") is None
    stats = registry.statistics()
    assert (stats.sessions, stats.evicted, stats.observed) == (2, 1, 4)


def test_list_is_most_recent_first_and_honours_a_limit(
    registry: SessionRegistry, feed: Feed
) -> None:
    for session in ("a", "b", "c", "b"):
        feed(TextDelta(message_id="m", text="x"), session=session)

    assert [s.session_id for s in registry.list()] == ["b", "c", "a"]
    assert [s.session_id for s in registry.list(limit=2)] == ["b", "c"]
    assert registry.list(limit=0) == []


def test_statistics_count_sessions_by_status(registry: SessionRegistry, feed: Feed) -> None:
    feed(SessionStart(), session="a")
    feed(SessionStart(), session="b")
    feed(SessionIdle(), session="b")
    feed(SessionError(message="boom"), session="c")

    stats = registry.statistics()
    assert (stats.sessions, stats.active, stats.idle, stats.error) == (3, 1, 1, 1)


def test_open_tool_calls_and_permissions_per_session_are_bounded() -> None:
    registry = SessionRegistry(max_open=2)
    feed = Feed(registry)
    for i in range(4):
        feed(ToolStart(tool_call_id=f"t{i}", name="Read"))
        feed(PermissionRequested(request_id=f"p{i}", tool="Read"))
        feed(AgentStart(agent_id=f"a{i}"))

    snapshot = registry.snapshot("s1")
    assert snapshot is not None
    assert snapshot.tools == {"t2": "Read", "t3": "Read"}
    assert [p.event.request_id for p in snapshot.permissions] == ["p2", "p3"]
    assert [a.agent_id for a in snapshot.agents] == ["a2", "a3"]


def test_a_fresh_stats_figure_can_replace_the_last_one_seen(
    registry: SessionRegistry, feed: Feed
) -> None:
    feed(StreamingStats(elapsed_s=1.0))
    fresh = StreamingStats(elapsed_s=9.0)

    snapshot = registry.snapshot("s1", stats=fresh)

    assert snapshot is not None
    assert snapshot.stats == fresh


def test_snapshot_is_immutable_while_the_session_moves_on(
    registry: SessionRegistry, feed: Feed
) -> None:
    feed(ToolStart(tool_call_id="t1", name="Read"))
    snapshot = registry.snapshot("s1")
    feed(ToolComplete(tool_call_id="t1"))

    assert snapshot is not None
    assert snapshot.tools == {"t1": "Read"}


def test_custom_stream_events_count_as_work_and_others_do_not(
    registry: SessionRegistry, feed: Feed
) -> None:
    class Progress(Event, frozen=True, tag="stream.plugin.progress"):
        pass

    class Audit(Event, frozen=True, tag="acme.audit"):
        pass

    feed(SessionIdle())
    feed(Audit())
    state = registry.get("s1")
    assert state is not None
    assert state.status == "idle"

    feed(Progress())
    state = registry.get("s1")
    assert state is not None
    assert (state.status, state.events) == ("active", 3)


def test_summary_and_snapshot_round_trip_through_msgpack_and_json(
    registry: SessionRegistry, feed: Feed
) -> None:
    feed(SessionStart(model="opus", title="t", cwd="/w"))
    feed(PermissionRequested(request_id="p1", tool="Bash", input={"command": "ls"}))
    feed(ToolStart(tool_call_id="t1", name="Read"))
    feed(AgentStart(agent_id="explorer", name="Explore"))
    feed(usage(output=3))
    feed(StreamingStats(elapsed_s=1.0, output_tokens=3))
    feed(ContextUsage(used=10, window=100, percent=10.0))
    snapshot = registry.snapshot("s1")
    assert snapshot is not None

    for codec in (msgspec.msgpack, msgspec.json):
        decoded = codec.decode(codec.encode(snapshot), type=SessionSnapshot)
        assert decoded == snapshot
        summaries = codec.decode(codec.encode(registry.list()), type=list[SessionSummary])
        assert summaries == registry.list()


def test_defaults_are_left_off_the_wire(registry: SessionRegistry, feed: Feed) -> None:
    feed(TextDelta(message_id="m", text="x"))

    summary = msgspec.to_builtins(registry.summary("s1"))

    assert summary == {
        "session_id": "s1",
        "status": "active",
        "first_seq": 1,
        "last_seq": 1,
        "first_ts": 1001.0,
        "last_ts": 1001.0,
        "events": 1,
        "run_id": "r1",
    }


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_sessions"):
        SessionRegistry(max_sessions=0)
    with pytest.raises(ValueError, match="max_open"):
        SessionRegistry(max_open=0)


def test_a_session_without_a_title_is_named_by_its_first_prompt() -> None:
    """As Claude Code's resume list names it; the agent's own title wins when it comes."""
    registry = SessionRegistry()
    seq = iter(range(1, 100))

    def feed(event: Event) -> None:
        registry.observe(Envelope(next(seq), 1.0, event, session_id="s"))

    feed(UserPrompt(text="Fix the login bug\nand add a test"))
    feed(UserPrompt(text="Thanks"))
    snapshot = registry.snapshot("s")
    assert snapshot is not None
    assert snapshot.title == "Fix the login bug"
    feed(SessionTitleChanged(title="Login fix"))
    snapshot = registry.snapshot("s")
    assert snapshot is not None
    assert snapshot.title == "Login fix"


_PLACES = st.tuples(
    # Few places, so that runs of one place (and of one place but another staleness) occur.
    st.sampled_from(
        [
            ("s1", None, "r1", "run/claude-code"),
            ("s1", "a1", "r1", "run/claude-code"),
            ("s2", None, None, "web[pid=1,uid=0]/opencode"),
            (None, None, None, "test"),
        ]
    ),
    st.booleans(),
).map(lambda place: (*place[0], place[1]))


@given(
    places=st.lists(_PLACES, max_size=40),
    thinking=st.booleans(),
    max_sessions=st.integers(1, 3),
)
def test_observe_many_is_observe_of_each(
    places: list[tuple[str | None, str | None, str | None, str, bool]],
    thinking: bool,
    max_sessions: int,
) -> None:
    """A run of deltas observed at once leaves every record as observing each would."""
    envelopes: list[Envelope[Event]] = [
        Envelope(
            seq,
            1000.0 + seq,
            ThinkingDelta(message_id="m", text="t")
            if thinking
            else TextDelta(message_id="m", text="x"),
            session,
            run,
            agent,
            source,
            stale,
        )
        for seq, (session, agent, run, source, stale) in enumerate(places, 1)
    ]
    one_by_one = SessionRegistry(max_sessions=max_sessions)
    at_once = SessionRegistry(max_sessions=max_sessions)
    # Both sessions known and idle: a delta that is not stale makes its session active.
    before: list[Envelope[Event]] = [
        Envelope(-3, 996.0, SessionStart(model="m"), "s1", None, None, "test", False),
        Envelope(-2, 997.0, SessionIdle(), "s1", None, None, "test", False),
        Envelope(-1, 998.0, SessionStart(model="m"), "s2", None, None, "test", False),
        Envelope(0, 999.0, SessionIdle(), "s2", None, None, "test", False),
    ]
    for registry in (one_by_one, at_once):
        for envelope in before:
            registry.observe(envelope)
    for envelope in envelopes:
        one_by_one.observe(envelope)
    at_once.observe_many(envelopes)
    assert at_once.statistics() == one_by_one.statistics()
    assert at_once.list() == one_by_one.list()
    for session in ("s1", "s2", "s3"):
        assert at_once.summary(session) == one_by_one.summary(session)
        assert at_once.snapshot(session) == one_by_one.snapshot(session)


def test_run_marks_count_each_session_a_run_id_reaches_and_nothing_else() -> None:
    """What RunManager.authority_epoch counts: a client's vetted place there is judged again."""
    registry = SessionRegistry()
    feed = Feed(registry)
    feed(TextDelta(message_id="m", text="x"), run=None)
    feed(TextDelta(message_id="m", text="x"), run="r1", stale=True)  # an unknown run's
    assert registry.run_marks == 0
    feed(TextDelta(message_id="m", text="x"))
    feed(TextDelta(message_id="m", text="y"))
    feed(UserPrompt(text="go"), run=None)
    assert registry.run_marks == 1
    feed(TextDelta(message_id="m", text="x"), run="r2")
    feed(TextDelta(message_id="m", text="x"), session="s2")
    assert registry.run_marks == 3
    restored = SessionRegistry()
    restored.restore(registry.summary("s2") or pytest.fail("s2 was observed"))
    assert restored.run_marks == 1
