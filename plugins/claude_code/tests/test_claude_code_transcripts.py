"""The ``claude-code-transcript`` adapter on transcripts the real Claude Code CLI wrote.

``fixtures/transcripts/`` is a configuration directory recorded by
``fixtures/record_transcripts.py`` (Claude Code 2.1.332 against
``fixtures/transcript_stand_in.py``; fixtures/README.md says how). Its
sessions, and what the stand-in answered in each (input, cache write,
cache read, output per response, from ``transcript_stand_in.USAGE``):

- **alpha** (``-p``, sonnet): an ``Agent`` call on haiku in the background
  (3 / 5,000 / 0 / 120), an answer (1 / 300 / 5,000 / 146), the sub-agent's
  answer on haiku (2 / 15,000 / 0 / 30), and after its task notification a
  second answer (1 / 300 / 5,000 / 146).
- **beta** (three prompts to one CLI on opus, then ``--resume`` on sonnet):
  a thought, text and a ``Bash`` call in one response written as three
  lines (4 / 6,000 / 0 / 210), the answer after the result
  (6 / 450 / 6,000 / 95); a foreground ``Agent`` call (3 / 5,000 / 0 / 120)
  whose haiku sub-agent does the same two calls, and the answer
  (1 / 300 / 5,000 / 146); a plain answer (5 / 700 / 6,450 / 64); resumed on
  sonnet, a plain answer again.
- **beta's fork** (``--resume --fork-session``): beta's whole conversation
  copied (same message and request ids), then one plain sonnet answer.
- **gamma** (sonnet): the ``Bash`` call of the first kind, then SIGINT
  while the stand-in held its answer.

Each expected figure below is that arithmetic, and each session's also
equals Claude Code's own ``cost-state`` line, written by the CLI itself.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from busd_claude_code.attach import read_new, scan
from busd_claude_code.follow import Follower, State
from busd_claude_code.tally import SYNTHETIC, Tally, entry
from busd_claude_code.transcript import TranscriptTranslator, worth_sending

from busd import (
    AgentComplete,
    AgentStart,
    Emitted,
    SessionCompaction,
    SessionContext,
    SessionIdle,
    SessionRetry,
    SessionStart,
    TextComplete,
    ThinkingComplete,
    TokenUsage,
    ToolComplete,
    ToolStart,
    Usage,
    UserPrompt,
)
from busd.core.prices import cost_usd

CONFIG = Path(__file__).resolve().parent / "fixtures" / "transcripts"
PROJECTS = CONFIG / "projects"
ALPHA = "a68808b5-fc8b-45c8-951a-0ba31f84b1e8"
BETA = "98a9a30d-4869-44ca-8751-13bb3fe6ebfb"
FORK = "78cfba7a-4f44-48df-afca-173e040c0edb"
GAMMA = "4142c389-504f-4e3a-948f-6a0aa3935eea"
SONNET = "claude-sonnet-4-5-20250929"
OPUS = "claude-opus-4-5-20251101"
HAIKU = "claude-haiku-4-5-20251001"

# (input, cache write, cache read, output) of each kind of answer: transcript_stand_in.USAGE
AGENT_CALL = (3, 5_000, 0, 120)
AGENT_ANSWER = (1, 300, 5_000, 146)
SUB_ANSWER = (2, 15_000, 0, 30)
TOOL_CALL = (4, 6_000, 0, 210)
TOOL_ANSWER = (6, 450, 6_000, 95)
PLAIN = (5, 700, 6_450, 64)


def _priced(model: str, *calls: tuple[int, int, int, int]) -> TokenUsage:
    """These calls of ``model`` together, each priced by busd's table (as ccusage prices them)."""
    total = TokenUsage(cost_usd=0.0)
    for fresh, write, read, out in calls:
        one = TokenUsage(
            input_tokens=fresh, cache_write_tokens=write, cache_read_tokens=read, output_tokens=out
        )
        price = cost_usd(model, one)
        assert price is not None, model
        total = TokenUsage(
            input_tokens=total.input_tokens + fresh,
            output_tokens=total.output_tokens + out,
            cache_read_tokens=total.cache_read_tokens + read,
            cache_write_tokens=total.cache_write_tokens + write,
            cost_usd=(total.cost_usd or 0.0) + price,
        )
    return total


EXPECTED: dict[str, dict[str, TokenUsage]] = {
    ALPHA: {
        SONNET: _priced(SONNET, AGENT_CALL, AGENT_ANSWER, AGENT_ANSWER),
        HAIKU: _priced(HAIKU, SUB_ANSWER),
    },
    BETA: {
        OPUS: _priced(OPUS, TOOL_CALL, TOOL_ANSWER, AGENT_CALL, AGENT_ANSWER, PLAIN),
        HAIKU: _priced(HAIKU, TOOL_CALL, TOOL_ANSWER),
        SONNET: _priced(SONNET, PLAIN),
    },
    FORK: {SONNET: _priced(SONNET, PLAIN)},  # the copied conversation counts in beta
    GAMMA: {SONNET: _priced(SONNET, TOOL_CALL)},
}


def same(a: TokenUsage, b: TokenUsage) -> bool:
    """Equal counts, and costs equal to the last float digits (sums in another order)."""
    counts = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")
    if any(getattr(a, name) != getattr(b, name) for name in counts):
        return False
    if a.cost_usd is None or b.cost_usd is None:
        return a.cost_usd is b.cost_usd
    return abs(a.cost_usd - b.cost_usd) < 1e-9


def lines(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def files() -> Iterator[Path]:
    yield from sorted(PROJECTS.rglob("*.jsonl"))


def attach_once(config: Path = CONFIG) -> dict[str, list[Any]]:
    """What ``busd attach claude-code --once`` sends for ``config``, session by session."""
    follower = Follower(State(), once=True, window=0.0)
    for read in follower.plan(scan([config]), time.time()):
        got = read_new(read)
        assert got is not None
        follower.take(read, *got)
    return {batch.session: batch.payloads for batch in follower.batches()}


def translate(session: str, payloads: list[Any]) -> list[Emitted]:
    """The events the daemon publishes for one session's payloads."""
    translator = TranscriptTranslator(session_id=session)
    out: list[Emitted] = []
    for n, payload in enumerate(payloads):
        out += translator.feed(payload, float(n))
    out += translator.finish(float(len(payloads)))
    stats = translator.statistics()
    assert (stats.unknown, stats.malformed) == ({}, {}), stats
    return out


@pytest.fixture(scope="module")
def sessions() -> dict[str, list[Emitted]]:
    return {sid: translate(sid, payloads) for sid, payloads in attach_once().items()}


def of(out: list[Emitted], cls: type[Any]) -> list[Any]:
    return [e.event for e in out if isinstance(e.event, cls)]


# -- every line ------------------------------------------------------------------------


def test_every_line_the_cli_wrote_is_handled_or_skipped_on_purpose() -> None:
    kinds: set[str] = set()
    for path in files():
        translator = TranscriptTranslator()
        for line in lines(path):
            kinds.add(line["type"])
            translator.feed(line, 0.0)
        translator.finish(1.0)
        stats = translator.statistics()
        assert (stats.unknown, stats.malformed) == ({}, {}), (path.name, stats)
    # The line types Claude Code 2.1.332 writes (what docs/attaching.md lists).
    assert kinds == {
        "user",
        "assistant",
        "attachment",
        "queue-operation",
        "last-prompt",
        "api-request",
        "api-request-shape",
        "api-request-blob",
        "tools-used",
        "atis-latch",
        "cost-state",
        "mode",
    }


def test_the_attacher_sends_what_the_translator_uses_and_little_else() -> None:
    sent = skipped = 0
    for path in files():
        for raw in path.read_bytes().splitlines():
            if worth_sending(json.loads(raw)):
                sent += len(raw)
            else:
                skipped += len(raw)
    assert sent < skipped / 10  # prompts and request bodies are nine tenths of the bytes


# -- usage -------------------------------------------------------------------------


def test_tokens_and_cost_per_session_and_model_are_what_the_stand_in_served(
    sessions: dict[str, list[Emitted]],
) -> None:
    assert set(sessions) == set(EXPECTED)
    for sid, expected in EXPECTED.items():
        usage = of(sessions[sid], Usage)[-1]
        assert set(usage.models) == set(expected), sid
        for model, tokens in expected.items():
            assert same(usage.models[model], tokens), (sid, model, usage.models[model], tokens)
        total = TokenUsage(
            input_tokens=sum(t.input_tokens for t in expected.values()),
            output_tokens=sum(t.output_tokens for t in expected.values()),
            cache_read_tokens=sum(t.cache_read_tokens for t in expected.values()),
            cache_write_tokens=sum(t.cache_write_tokens for t in expected.values()),
            cost_usd=sum(t.cost_usd or 0.0 for t in expected.values()),
        )
        assert same(usage.tokens, total), (sid, usage.tokens, total)
        assert all(e.parent_tool_call_id is None for e in sessions[sid] if type(e.event) is Usage)


def test_each_session_equals_claude_codes_own_running_totals(
    sessions: dict[str, list[Emitted]],
) -> None:
    """The CLI's ``cost-state`` line (its totals, its prices) is an oracle busd does not share."""
    finals: dict[str, dict[str, TokenUsage]] = {}
    for sid in EXPECTED:
        main = next(PROJECTS.rglob(f"{sid}.jsonl"))
        state = [line for line in lines(main) if line["type"] == "cost-state"][-1]
        finals[sid] = {
            model: TokenUsage(
                input_tokens=entry_["inputTokens"],
                output_tokens=entry_["outputTokens"],
                cache_read_tokens=entry_["cacheReadInputTokens"],
                cache_write_tokens=entry_["cacheCreationInputTokens"],
                cost_usd=entry_["costUSD"],
            )
            for model, entry_ in state["modelUsage"].items()
        }
    for sid in (ALPHA, BETA, GAMMA):
        models = of(sessions[sid], Usage)[-1].models
        assert set(models) == set(finals[sid])
        for model, tokens in finals[sid].items():
            assert same(models[model], tokens), (sid, model)
    # The fork's CLI restored beta's totals and added its own answer; busd counts
    # the copied responses in beta only (as ccusage does).
    fork = of(sessions[FORK], Usage)[-1].models
    beta = of(sessions[BETA], Usage)[-1].models
    restored = finals[FORK][SONNET]
    assert restored.output_tokens == beta[SONNET].output_tokens + fork[SONNET].output_tokens
    assert restored.input_tokens == beta[SONNET].input_tokens + fork[SONNET].input_tokens


def test_a_response_written_as_three_lines_counts_once() -> None:
    main = next(PROJECTS.rglob(f"{BETA}.jsonl"))
    first = [line for line in lines(main) if line.get("message", {}).get("id") == "msg_005"]
    assert [line["message"]["content"][0]["type"] for line in first] == [
        "thinking",
        "text",
        "tool_use",
    ]
    assert len({json.dumps(line["message"]["usage"]) for line in first}) == 1  # repeated usage
    translator = TranscriptTranslator(session_id=BETA)
    reports = [
        e.event for line in first for e in translator.feed(line, 0.0) if type(e.event) is Usage
    ]
    assert len(reports) == 1
    assert same(reports[0].tokens, _priced(OPUS, TOOL_CALL))


def test_the_context_is_each_main_responses_own(sessions: dict[str, list[Emitted]]) -> None:
    used = [e.event.used for e in sessions[GAMMA] if type(e.event) is SessionContext]
    fresh, write, read, out = TOOL_CALL
    assert used == [fresh + write + read + out]


# -- what a frontend shows ---------------------------------------------------------------


def test_the_session_starts_with_its_cwd_and_model(sessions: dict[str, list[Emitted]]) -> None:
    for sid, cwd, model in (
        (ALPHA, "/tmp/busd-transcripts/alpha", SONNET),
        (BETA, "/tmp/busd-transcripts/beta", OPUS),
    ):
        out = sessions[sid]
        assert type(out[0].event) is SessionStart
        assert (out[0].event.cwd, out[0].event.model) == (cwd, model)
        assert {e.session_id for e in out} == {sid}
    assert of(sessions[BETA], Usage)[-1].model == SONNET  # resumed on sonnet


def test_text_thinking_and_tools_with_their_results(sessions: dict[str, list[Emitted]]) -> None:
    out = [e for e in sessions[BETA] if e.parent_tool_call_id is None]
    thoughts = [e.event.text for e in out if type(e.event) is ThinkingComplete]
    assert thoughts[:2] == ["The user wants the notes; read the file.", "The file lists two items."]
    texts = [e.event.text for e in out if type(e.event) is TextComplete]
    assert texts[:3] == [
        "Let me read the notes.",
        "The notes list two items: milk and bread.",
        "The sub-agent says: milk and bread.",
    ]
    [bash] = [e.event for e in out if type(e.event) is ToolStart and e.event.name == "Bash"]
    assert bash.input == {"command": "cat notes.txt", "description": "Show the notes"}
    [done] = [e.event for e in out if type(e.event) is ToolComplete and e.event.name == "Bash"]
    assert (done.status, done.output) == ("ok", "milk\nbread")
    assert done.duration_s is not None
    assert 0 < done.duration_s < 5  # from the lines' own timestamps


def test_a_foreground_sub_agents_lines_carry_its_agent_call(
    sessions: dict[str, list[Emitted]],
) -> None:
    out = sessions[BETA]
    [start] = of(out, AgentStart)
    call = start.agent_id
    assert (start.name, start.description, start.tool_call_id) == (
        "general-purpose",
        "Read the notes",
        call,
    )
    inside = [e for e in out if e.parent_tool_call_id == call]
    kinds = {type(e.event).__name__ for e in inside}
    assert {"ToolStart", "ToolComplete", "TextComplete", "ThinkingComplete"} <= kinds
    assert not [e for e in out if e.agent_id is not None]  # every line found its agent
    [sub_bash] = [e.event for e in inside if type(e.event) is ToolStart]
    assert sub_bash.parent_tool_call_id == call
    [complete] = of(out, AgentComplete)
    assert (complete.status, complete.result) == ("ok", "The notes list two items: milk and bread.")
    # Merged by time: the sub-agent works between its start and its completion.
    where = {id(e): n for n, e in enumerate(out)}
    first_inside = min(where[id(e)] for e in inside)
    last_inside = max(where[id(e)] for e in inside)
    starts = [n for n, e in enumerate(out) if type(e.event) is AgentStart]
    ends = [n for n, e in enumerate(out) if type(e.event) is AgentComplete]
    assert starts[0] < first_inside < last_inside < ends[0]


def test_a_background_sub_agent_ends_at_its_task_notification(
    sessions: dict[str, list[Emitted]],
) -> None:
    out = sessions[ALPHA]
    [start] = of(out, AgentStart)
    [launched] = [e for e in of(out, ToolComplete) if e.tool_call_id == start.agent_id]
    assert launched.output is not None
    assert launched.output.startswith("Async agent launched successfully.")
    [complete] = of(out, AgentComplete)
    assert (complete.agent_id, complete.status, complete.result) == (
        start.agent_id,
        "ok",
        "It is 42.",
    )
    inside = [e.event for e in out if e.parent_tool_call_id == start.agent_id]
    assert [e.text for e in inside if type(e) is TextComplete] == ["It is 42."]


# -- runs ------------------------------------------------------------------------------


def test_a_run_ends_when_its_last_response_is_in_and_only_an_interrupt_aborts(
    sessions: dict[str, list[Emitted]],
) -> None:
    idles = {sid: [e.aborted for e in of(out, SessionIdle)] for sid, out in sessions.items()}
    # alpha: the prompt's run, then the task notification's; beta: three prompts and
    # the resumed one; the fork: beta's four and its own; gamma: interrupted.
    assert idles == {
        ALPHA: [False, False],
        BETA: [False, False, False, False],
        FORK: [False, False, False, False, False],
        GAMMA: [True],
    }


def test_the_end_of_a_transcript_is_not_the_end_of_a_run() -> None:
    """gamma up to its tool result: the CLI is waiting on the model; nothing ended."""
    main = next(PROJECTS.rglob(f"{GAMMA}.jsonl"))
    upto = [line for line in lines(main) if "[Request interrupted" not in json.dumps(line)]
    out = translate(GAMMA, [line for line in upto if line["type"] != "cost-state"])
    assert of(out, SessionIdle) == []
    assert [e.status for e in of(out, ToolComplete)] == ["ok"]


def test_a_run_ends_at_the_attachers_caught_up_and_again_if_more_of_it_comes() -> None:
    main = next(PROJECTS.rglob(f"{GAMMA}.jsonl"))
    prompt = next(line for line in lines(main) if line["type"] == "user")
    answer: dict[str, Any] = {
        "type": "assistant",
        "uuid": "u-1",
        "timestamp": "2026-11-26T06:00:00.000Z",
        "requestId": "req_x",
        "message": {
            "id": "msg_x",
            "model": SONNET,
            "content": [{"type": "thinking", "thinking": "hm", "signature": "s"}],
            "stop_reason": "end_turn",
            "usage": {"input_tokens": 1, "output_tokens": 2},
        },
    }
    more = {
        **answer,
        "uuid": "u-2",
        "message": {**answer["message"], "content": [{"type": "text", "text": "done"}]},
    }
    translator = TranscriptTranslator(session_id=GAMMA)
    first = translator.feed(prompt, 0.0) + translator.feed(answer, 1.0)
    assert of(first, SessionIdle) == []  # more blocks of msg_x may follow
    assert of(translator.feed({"type": "busd.caught-up"}, 2.0), SessionIdle) == [SessionIdle()]
    late = translator.feed(more, 3.0)  # the next poll found the text block
    assert [e.text for e in of(late, TextComplete)] == ["done"]
    assert of(late, Usage) == []  # the same response: counted once
    assert of(translator.feed({"type": "busd.caught-up"}, 4.0), SessionIdle) == [SessionIdle()]


# -- the attacher's own lines --------------------------------------------------------------


def test_busd_counted_keeps_a_copied_response_from_counting_again() -> None:
    main = next(PROJECTS.rglob(f"{FORK}.jsonl"))
    raw = [line for line in lines(main) if worth_sending(line)]
    alone = of(translate(FORK, raw), Usage)[-1]  # as `busd ingest` of the file alone would
    assert alone.tokens.output_tokens == 635 + 64 + 64  # opus, then beta's sonnet, then its own
    told = attach_once()[FORK]
    counted = [p for p in told if p.get("type") == "busd.counted"]
    assert len(counted) == 1
    assert "msg_005:req_005" in counted[0]["keys"]
    assert of(translate(FORK, told), Usage)[-1].tokens.output_tokens == 64


def test_busd_resume_goes_on_from_the_totals_before_a_restart() -> None:
    totals = {SONNET: _priced(SONNET, TOOL_CALL)}
    translator = TranscriptTranslator(session_id=GAMMA)
    resume = {
        "type": "busd.resume",
        "models": {
            m: {
                "input_tokens": t.input_tokens,
                "output_tokens": t.output_tokens,
                "cache_write_tokens": t.cache_write_tokens,
                "cost_usd": t.cost_usd,
            }
            for m, t in totals.items()
        },
        "cwd": "/somewhere",
        "model": SONNET,
    }
    out = translator.feed(resume, 0.0)
    start, usage = (e.event for e in out)
    assert isinstance(start, SessionStart)
    assert isinstance(usage, Usage)
    assert (start.cwd, start.model) == ("/somewhere", SONNET)
    assert same(usage.tokens, totals[SONNET])
    line = {
        "type": "assistant",
        "timestamp": "2026-11-26T06:00:00Z",
        "requestId": "req_new",
        "message": {
            "id": "msg_new",
            "model": SONNET,
            "content": [],
            "usage": {"input_tokens": 1, "output_tokens": 1},
        },
    }
    [after] = of(translator.feed(line, 1.0), Usage)
    assert after.tokens.output_tokens == totals[SONNET].output_tokens + 1


# -- counting exactly as ccusage does ---------------------------------------------------------


def _line(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "type": "assistant",
        "timestamp": "2026-11-26T06:04:08.228Z",
        "requestId": "req_1",
        "version": "2.1.332",
        "message": {
            "id": "msg_1",
            "model": SONNET,
            "content": [{"type": "text", "text": "hi"}],
            "usage": {
                "input_tokens": 10,
                "output_tokens": 20,
                "cache_creation_input_tokens": 30,
                "cache_read_input_tokens": 40,
            },
        },
    }
    message = changes.pop("message", None)
    if message is not None:
        base["message"] = {**base["message"], **message}
    return {**base, **changes}


@pytest.mark.parametrize(
    ("line", "why"),
    [
        (_line(timestamp="2026-11-26 06:04:08"), "not ccusage's ISO form"),
        (_line(timestamp="2026-11-26T06:04:08.22Z"), "two digits of milliseconds"),
        (_line(requestId=None), "null is not absent"),
        (_line(requestId=""), "an empty request id"),
        (_line(version="v2"), "a version that is not N.N.N"),
        (_line(message={"model": None}), "a null model"),
        (_line(message={"content": "a string"}), "content that is not a list"),
        (_line(message={"content": [{"text": 3}]}), "a text that is not a string"),
        (_line(message={"usage": {"input_tokens": 1}}), "no output tokens"),
        (_line(message={"usage": {"input_tokens": 1, "output_tokens": True}}), "a boolean"),
        (_line(costUSD="0.1"), "a cost that is not a number"),
    ],
)
def test_a_line_ccusage_would_not_read_counts_nothing(line: dict[str, Any], why: str) -> None:
    assert entry(line) is None, why


def test_what_a_counted_line_is_worth() -> None:
    found = entry(_line())
    assert found is not None
    assert found.key == "msg_1:req_1"
    assert found.model == SONNET
    priced = cost_usd(
        SONNET,
        TokenUsage(input_tokens=10, output_tokens=20, cache_write_tokens=30, cache_read_tokens=40),
    )
    assert found.tokens.cost_usd == priced
    assert (found.tokens.input_tokens, found.tokens.cache_read_tokens) == (10, 40)
    with_cost = entry(_line(costUSD=1.25))
    assert with_cost is not None
    assert with_cost.tokens.cost_usd == 1.25  # the line's own cost wins (ccusage's auto mode)
    modelless = _line()
    del modelless["message"]["model"]
    no_model = entry(modelless)
    assert no_model is not None
    assert (no_model.model, no_model.tokens.cost_usd) == ("unknown", None)
    keyless = entry({k: v for k, v in _line().items() if k != "requestId"})
    assert keyless is not None
    assert keyless.key is None


def test_the_tally_counts_a_key_once_and_keeps_synthetic_out_of_the_breakdown() -> None:
    tally = Tally()
    first = entry(_line())
    keyless = entry({k: v for k, v in _line().items() if k != "requestId"})
    synthetic = entry(_line(requestId="req_2", message={"model": SYNTHETIC}))
    assert first is not None
    assert keyless is not None
    assert synthetic is not None
    assert tally.count(first)
    assert not tally.count(first)
    assert tally.count(keyless)
    assert tally.count(keyless)  # no key: always counted, as ccusage does
    assert tally.count(synthetic)
    assert set(tally.breakdown()) == {SONNET}
    assert tally.breakdown()[SONNET].input_tokens == 30
    assert tally.total().input_tokens == 40  # the synthetic response is in the total
    tally.mark(["msg_9:req_9"])
    nine = entry(_line(requestId="req_9", message={"id": "msg_9"}))
    assert nine is not None
    assert not tally.count(nine)


@pytest.mark.parametrize(
    ("session", "after"), [(BETA, "toolu_agent_007"), (ALPHA, "toolu_agent_001")]
)
def test_a_translator_started_mid_session_still_ends_the_agents_it_did_not_see_start(
    session: str, after: str
) -> None:
    """An attacher that restarted: its new translator sees an agent's end, not its start."""
    payloads = attach_once()[session]
    metas = [p for p in payloads if p.get("type") == "busd.subagent"]
    assert [m["meta"]["toolUseId"] for m in metas] == [after]
    called = next(
        n
        for n, p in enumerate(payloads)
        if p.get("type") == "assistant" and after in json.dumps(p["message"]["content"])
    )
    out = translate(session, [*metas, *payloads[called + 1 :]])
    [complete] = of(out, AgentComplete)
    assert (complete.agent_id, complete.status) == (after, "ok")
    assert of(out, AgentStart) == []
    assert [e for e in out if e.agent_id is not None] == []  # the sub-agent's lines found it
    assert any(e.parent_tool_call_id == after for e in out)


def test_lines_of_older_versions_are_mapped() -> None:
    """Not in the 2.1.332 recordings: lines in the shapes older Claude Code versions write.

    Constructed by hand (``summary``, ``custom-title``, ``system`` lines with
    ``compactMetadata``, ``retryAttempt``/``retryInMs`` and ``turn_duration``).
    """
    main = next(PROJECTS.rglob(f"{GAMMA}.jsonl"))
    prompt = next(line for line in lines(main) if line["type"] == "user")
    translator = TranscriptTranslator(session_id=GAMMA)
    out = translator.feed(prompt, 0.0)
    out += translator.feed({"type": "summary", "summary": "Reading notes", "leafUuid": "x"}, 1.0)
    out += translator.feed(
        {"type": "custom-title", "customTitle": "Notes", "sessionId": GAMMA}, 1.0
    )
    compact = {"type": "system", "subtype": "compact_boundary", "compactMetadata": {"preTokens": 9}}
    retry = {"type": "system", "subtype": "api_error", "retryAttempt": 2, "retryInMs": 1500,
             "error": {"message": "Overloaded"}}  # fmt: skip
    out += translator.feed(compact, 2.0) + translator.feed(retry, 3.0)
    out += translator.feed({"type": "system", "subtype": "turn_duration", "durationMs": 5}, 4.0)
    kinds = [type(e.event).__name__ for e in out]
    assert kinds == [
        "SessionStart",
        "UserPrompt",  # held until the session started: no model was known before it
        "SessionTitleChanged",
        "SessionTitleChanged",
        "SessionCompaction",
        "SessionRetry",
        "SessionIdle",
    ]
    asked = out[1].event
    assert isinstance(asked, UserPrompt)
    assert (asked.text, asked.prompt_id) == ("[hold] Please read my notes.", prompt["promptId"])
    retried, compacted = out[5].event, out[4].event
    assert isinstance(retried, SessionRetry)
    assert isinstance(compacted, SessionCompaction)
    assert (retried.attempt, retried.message, retried.delay_s) == (2, "Overloaded", 1.5)
    assert compacted.tokens_before == 9
    assert translator.statistics().unknown == {}
