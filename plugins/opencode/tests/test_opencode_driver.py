"""The OpenCode driver, through the real ``opencode-ai`` SDK, against a local stand-in server."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import pytest
import trio
from busd_opencode import OpenCodeAdapter, OpenCodeDriver, busd_drivers
from busd_opencode.driver import OpenCodeRunError, UnsupportedOption, plan_run, reply_for
from fake_opencode import FIXTURE_SESSION, FakeOpenCode, Raw, fixture
from opencode_ai import InternalServerError
from test_opencode_live import streams_left_reading

from busd import (
    Driver,
    Emitted,
    Event,
    PermissionDecision,
    PermissionRequested,
    PermissionResolved,
    RunContext,
    RunRequest,
    SessionIdle,
    TextComplete,
    TextDelta,
    ToolComplete,
    TurnEnd,
    Usage,
)

E = TypeVar("E", bound=Event)
Answer = Callable[[PermissionRequested], Awaitable[PermissionDecision]]
PERMISSION = "per_bc527cb49001Kk4Ll7Mm0Nn3Oo"


async def allow(request: PermissionRequested) -> PermissionDecision:
    return PermissionDecision(outcome="allowed", option_id="once", by="test")


async def deny(request: PermissionRequested) -> PermissionDecision:
    return PermissionDecision(outcome="denied", option_id="reject", by="test")


class Context:
    """A RunContext that translates what it is fed, like the daemon, and answers from a script."""

    def __init__(self, request: RunRequest, answer: Answer = allow) -> None:
        self.request = request
        self.run_id = "run-1"
        self.answer = answer
        self.translator = OpenCodeAdapter().translator(session_id=request.session_id)
        self.raw: list[object] = []
        self.emitted: list[Emitted] = []
        self.asked: list[PermissionRequested] = []
        self.asking = trio.Event()
        self.sdk_sessions: list[str] = []

    def feed(self, raw: object) -> list[Event]:
        self.raw.append(raw)
        emitted = self.translator.feed(raw, trio.current_time())
        self.emitted += emitted
        return [e.event for e in emitted]

    async def request_permission(self, request: PermissionRequested) -> PermissionDecision:
        self.asked.append(request)
        self.asking.set()
        return await self.answer(request)

    def publish(self, event: Event) -> None:
        raise AssertionError(f"this driver publishes nothing beside its SDK's events: {event}")

    def set_sdk_session(self, sdk_session_id: str) -> None:
        self.sdk_sessions.append(sdk_session_id)

    def of(self, cls: type[E]) -> list[E]:
        return [e.event for e in self.emitted if isinstance(e.event, cls)]


def request(url: str, **fields: Any) -> RunRequest:
    options = {"base_url": url, **fields.pop("options", {})}
    return RunRequest(
        adapter="opencode",
        prompt="Which git branch am I on?",
        session_id="busd-1",
        options=options,
        **fields,
    )


@asynccontextmanager
async def serving(fake: FakeOpenCode) -> AsyncIterator[str]:
    async with trio.open_nursery() as nursery:
        url: str = await nursery.start(fake.serve)
        yield url
        nursery.cancel_scope.cancel()


async def drive(fake: FakeOpenCode, answer: Answer = allow, **fields: Any) -> Context:
    """Run the driver against ``fake``; what it raises comes out as it is (no group)."""
    error: Exception | None = None
    async with serving(fake) as url:
        context = Context(request(url, **fields), answer)
        with trio.fail_after(2):
            try:
                await OpenCodeDriver().run(context)
            except Exception as exc:
                error = exc
            await fake.unsubscribed.wait()  # every run closes its event stream
    if error is not None:
        raise error
    return context


# -- the contract ---------------------------------------------------------------------


def test_the_plugin_registers_a_driver_named_like_its_adapter() -> None:
    (driver,) = busd_drivers()
    assert isinstance(driver, Driver)
    assert driver.name == OpenCodeAdapter.name == "opencode"
    assert driver.default_model == "anthropic/claude-sonnet-4-5"


def test_the_context_stand_in_is_a_run_context() -> None:
    assert isinstance(Context(request("http://x")), RunContext)


# -- a run ----------------------------------------------------------------------------


async def test_a_full_run_gives_the_fixtures_numbers() -> None:
    fake = FakeOpenCode()
    context = await drive(fake)

    (sid,) = context.sdk_sessions
    assert sid.startswith("ses_fake")
    # Everything but server.connected and the session.idle after the idle status: the end.
    assert context.raw == [
        json.loads(json.dumps(r).replace(FIXTURE_SESSION, sid)) for r in fixture()[1:-1]
    ]
    final = context.of(Usage)[-1].tokens
    assert final.output_tokens == 161
    assert final.reasoning_tokens == 81
    assert final.cost_usd == pytest.approx(0.0081171, abs=1e-9)
    (tool,) = context.of(ToolComplete)
    assert (tool.name, tool.status, tool.output) == ("bash", "ok", "main\n")
    (resolved,) = context.of(PermissionResolved)
    assert (resolved.outcome, resolved.option_id) == ("allowed", "once")
    assert context.of(SessionIdle)
    assert all(e.session_id == sid for e in context.emitted)


async def test_the_permission_awaited_is_the_one_the_translator_published() -> None:
    fake = FakeOpenCode()
    context = await drive(fake)

    (asked,) = context.asked
    assert context.of(PermissionRequested) == [asked]
    assert asked.request_id == PERMISSION
    assert (asked.tool, asked.input["command"]) == ("bash", "git branch --show-current")


async def test_an_allowed_permission_is_replied_once_exactly_once() -> None:
    fake = FakeOpenCode()
    await drive(fake)

    (reply,) = fake.permission_replies
    assert reply.path == f"/permission/{PERMISSION}/reply"
    assert reply.body == {"reply": "once"}
    assert not fake.aborts


async def test_a_denied_permission_is_replied_reject_and_the_tool_fails() -> None:
    fake = FakeOpenCode()
    context = await drive(fake, deny)

    assert [r.body for r in fake.permission_replies] == [{"reply": "reject"}]
    (resolved,) = context.of(PermissionResolved)
    assert resolved.outcome == "denied"
    (tool,) = context.of(ToolComplete)
    assert tool.status == "error"
    assert context.of(SessionIdle)


async def test_a_denial_with_a_reason_is_the_feedback_opencode_gives_the_model() -> None:
    """OpenCode tells the model a rejection's ``message`` and carries on (without one, it
    stops the turn, as its own Reject does)."""

    async def not_now(request: PermissionRequested) -> PermissionDecision:
        return PermissionDecision(outcome="denied", by="frontend", reason="not now")

    fake = FakeOpenCode()
    await drive(fake, not_now)

    (reply,) = fake.permission_replies
    assert reply.path == f"/permission/{PERMISSION}/reply"
    assert reply.body == {"reply": "reject", "message": "not now"}


async def test_a_cancelled_request_is_rejected_without_feedback_so_the_turn_stops() -> None:
    async def cancelled(request: PermissionRequested) -> PermissionDecision:
        return PermissionDecision(outcome="cancelled", by="busd", reason="the run was cancelled")

    fake = FakeOpenCode()
    await drive(fake, cancelled)

    assert [r.body for r in fake.permission_replies] == [{"reply": "reject"}]


async def test_an_older_servers_request_is_answered_on_its_own_endpoint() -> None:
    """``permission.updated`` (the generation the SDK models) has no ``/permission/{id}/reply``."""
    script = fixture()
    for i, raw in enumerate(script):
        if raw["type"] == "permission.asked":
            asked = raw["properties"]
            older = {
                "id": asked["id"],
                "sessionID": asked["sessionID"],
                "type": asked["permission"],
                "pattern": asked["patterns"],
                "callID": asked["tool"]["callID"],
                "messageID": asked["tool"]["messageID"],
                "title": "git branch --show-current",
            }
            script[i] = {"type": "permission.updated", "properties": older}
    fake = FakeOpenCode(script=script)
    context = await drive(fake, deny)

    (reply,) = fake.permission_replies
    assert reply.path == f"/session/{context.sdk_sessions[0]}/permissions/{PERMISSION}"
    assert reply.body == {"response": "reject"}  # that endpoint takes no message


@pytest.mark.parametrize(
    ("decision", "reply"),
    [
        (PermissionDecision(outcome="allowed"), "once"),
        (PermissionDecision(outcome="allowed", option_id="allow_once"), "once"),
        (PermissionDecision(outcome="allowed", option_id="always"), "always"),
        (PermissionDecision(outcome="allowed", option_id="allow_always"), "always"),
        (PermissionDecision(outcome="denied", option_id="always"), "reject"),
        (PermissionDecision(outcome="cancelled"), "reject"),
    ],
)
def test_decisions_map_onto_opencodes_replies(decision: PermissionDecision, reply: str) -> None:
    assert reply_for(decision) == reply


async def test_bypass_permissions_replies_without_asking() -> None:
    fake = FakeOpenCode()
    context = await drive(fake, permission_mode="bypassPermissions")

    assert not context.asked
    assert [r.body for r in fake.permission_replies] == [{"reply": "once"}]


async def test_a_resumed_run_reuses_the_opencode_session() -> None:
    fake = FakeOpenCode()
    context = await drive(fake, resume="ses_earlier")

    assert not [r for r in fake.requests if r.path == "/session"]  # nothing created
    assert [r.path for r in fake.calls("POST", "/session/", "/message")] == [
        "/session/ses_earlier/message"
    ]
    assert context.sdk_sessions == ["ses_earlier"]
    assert context.of(Usage)[-1].tokens.output_tokens == 161


# -- options ----------------------------------------------------------------------------


async def test_model_system_prompt_cwd_and_options_reach_the_server() -> None:
    fake = FakeOpenCode()
    await drive(
        fake,
        model="openrouter/anthropic/claude-opus-4",
        system_prompt="Be terse.",
        cwd="/work/project",
        options={"tools": {"bash": True}, "variant": "high"},
    )

    (prompt,) = fake.calls("POST", "/session/", "/message")
    model = {"providerID": "openrouter", "modelID": "anthropic/claude-opus-4"}
    assert prompt.body["providerID"] == model["providerID"]
    assert prompt.body["modelID"] == model["modelID"]
    assert prompt.body["model"] == model  # what current servers read
    assert prompt.body["system"] == "Be terse."
    assert prompt.body["parts"] == [{"type": "text", "text": "Which git branch am I on?"}]
    assert prompt.body["tools"] == {"bash": True}
    assert prompt.body["variant"] == "high"
    assert all(r.query.get("directory") == "/work/project" for r in fake.requests)


def test_a_bare_model_name_means_anthropic_and_no_model_means_the_default() -> None:
    plan = plan_run(request("http://x", model="claude-opus-4"))
    assert (plan.provider, plan.model) == ("anthropic", "claude-opus-4")
    plan = plan_run(request("http://x"))
    assert (plan.provider, plan.model) == ("anthropic", "claude-sonnet-4-5")


def test_plan_mode_runs_opencodes_plan_agent() -> None:
    plan = plan_run(request("http://x", permission_mode="plan"))
    assert plan.chat["mode"] == plan.chat["extra_body"]["agent"] == "plan"


def test_an_unknown_permission_mode_is_refused() -> None:
    with pytest.raises(UnsupportedOption, match="yolo"):
        plan_run(request("http://x", permission_mode="yolo"))


async def test_max_turns_aborts_the_session_when_the_next_turn_starts() -> None:
    script = fixture()
    second = [i for i, r in enumerate(script) if r["type"] == "message.updated"][2]
    fake = FakeOpenCode(script=script[: second + 1], stall=True)  # goes on until aborted
    context = await drive(fake, max_turns=1)

    assert len(fake.aborts) == 1
    assert context.of(Usage)[-1].tokens.output_tokens == 154
    assert context.of(SessionIdle)[-1].aborted


# -- failures and cancellation -------------------------------------------------------------


async def test_a_server_error_on_the_prompt_is_raised_and_not_retried() -> None:
    fake = FakeOpenCode(fail_prompt=500)
    with pytest.raises(InternalServerError):
        await drive(fake)
    assert len(fake.calls("POST", "/session/", "/message")) == 1


async def test_a_session_error_on_the_stream_is_raised_after_the_idle() -> None:
    script = fixture()
    sid = script[1]["properties"]["sessionID"]
    error: Raw = {
        "type": "session.error",
        "properties": {
            "sessionID": sid,
            "error": {"name": "ProviderAuthError", "data": {"message": "bad key"}},
        },
    }
    fake = FakeOpenCode(script=[*script[:3], error, *script[-2:]])
    with pytest.raises(OpenCodeRunError, match="ProviderAuthError: bad key"):
        await drive(fake)
    assert not fake.aborts  # the session went idle on its own


async def test_an_event_stream_that_ends_before_the_idle_is_an_error() -> None:
    fake = FakeOpenCode(script=fixture()[:8], hang_up=True)
    with pytest.raises(OpenCodeRunError, match="ended before it went idle"):
        await drive(fake)
    assert len(fake.aborts) == 1  # the agent may still be at work: stop it


async def test_cancelling_a_run_aborts_the_session_and_closes_the_stream() -> None:
    fake = FakeOpenCode()
    async with serving(fake) as url:
        context = Context(request(url), answer=_never)
        with trio.fail_after(2):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(OpenCodeDriver().run, context)
                await context.asking.wait()  # mid-run: the agent waits for a permission
                nursery.cancel_scope.cancel()
            await fake.unsubscribed.wait()

    assert [r.path for r in fake.aborts] == [f"/session/{context.sdk_sessions[0]}/abort"]
    assert not fake.permission_replies


async def test_a_run_cancelled_mid_answer_reads_opencodes_own_end_of_it() -> None:
    """The driver has OpenCode abort the session, then reads on (shielded, bounded) until
    the idle: the bus gets OpenCode's account (an idle that says ``aborted``, the text
    ``stopped``), not just busd's, and the run's cancellation still comes out."""
    fake = FakeOpenCode(script=fixture()[:9], stall=True)  # mid-text, then silence
    async with serving(fake) as url:
        context = Context(request(url))
        with trio.fail_after(5):
            with trio.CancelScope() as run:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(OpenCodeDriver().run, context)
                    while not context.of(TextDelta):  # noqa: ASYNC110 - the fake's replay
                        await trio.sleep(0.01)
                    run.cancel()
            await fake.unsubscribed.wait()

    assert run.cancelled_caught  # cancelled, not failed: the abort's error is no error
    assert streams_left_reading() == []  # the stream was read to the idle, then closed
    assert len(fake.aborts) == 1
    fed = [raw["type"] for raw in context.raw if isinstance(raw, dict)]
    assert fed[-2:] == ["session.error", "session.status"]  # OpenCode's end: aborted, idle
    (idle,) = context.of(SessionIdle)
    assert idle.aborted
    (text,) = context.of(TextComplete)
    assert (text.text, text.stopped) == ("Let me check ", True)
    assert [t.finish_reason for t in context.of(TurnEnd)] == ["cancelled"]


async def test_a_permission_answered_elsewhere_stops_waiting() -> None:
    fake = FakeOpenCode(pause_on_permission=False)  # the fixture's own reply follows at once
    context = await drive(fake, answer=_never)

    assert len(context.asked) == 1
    assert not fake.permission_replies
    (resolved,) = context.of(PermissionResolved)
    assert resolved.option_id == "once"
    assert context.of(Usage)[-1].tokens.output_tokens == 161


async def _never(request: PermissionRequested) -> PermissionDecision:
    await trio.sleep_forever()
    raise AssertionError("unreachable")
