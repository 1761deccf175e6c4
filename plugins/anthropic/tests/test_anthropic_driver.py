"""The ``anthropic`` driver, through the real SDK, against a local Messages API stand-in."""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

import anthropic
import pytest
import trio
from busd_anthropic import AnthropicAdapter, AnthropicDriver, busd_drivers
from busd_anthropic.driver import DEFAULT_MAX_TOKENS, DEFAULT_MODEL, StreamIncomplete
from fake_anthropic import FakeMessagesAPI

from busd import (
    Driver,
    Emitted,
    Event,
    PermissionDecision,
    PermissionRequested,
    RunContext,
    RunRequest,
    SessionContext,
    SessionError,
    SessionIdle,
    TextComplete,
    ToolStart,
    Usage,
)

FIXTURES = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "sdk"
PROMPT = "What's the weather in San Francisco?"
KEY = "sk-test-not-a-key"
MODEL = "claude-sonnet-4-6"


def fixture_events() -> list[dict[str, Any]]:
    with (FIXTURES / "anthropic.jsonl").open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


EVENTS = fixture_events()
OVERLOADED = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}


class RecordingContext:
    """A RunContext that translates what is fed with the ``anthropic`` adapter."""

    def __init__(self, request: RunRequest, *, wait_for: int = 0) -> None:
        self.request = request
        self.run_id = "run-1"
        self.raw: list[object] = []
        self.emitted: list[Emitted] = []
        self.translator = AnthropicAdapter().translator(session_id=request.session_id)
        self.wait_for = wait_for
        self.fed_enough = trio.Event()
        """Set when ``wait_for`` raw events have been fed."""

    def feed(self, raw: object) -> list[Event]:
        self.raw.append(raw)
        emitted = self.translator.feed(raw, len(self.raw) * 0.1)
        self.emitted += emitted
        if len(self.raw) == self.wait_for:
            self.fed_enough.set()
        return [e.event for e in emitted]

    async def request_permission(self, request: PermissionRequested) -> PermissionDecision:
        raise AssertionError("the Messages API has no permission requests")

    def publish(self, event: Event) -> None:
        self.emitted.append(Emitted(event))

    def set_sdk_session(self, sdk_session_id: str) -> None:
        raise AssertionError("the Messages API has no session to resume")

    def events(self) -> list[Any]:
        self.emitted += self.translator.finish(len(self.raw) * 0.1 + 1)
        return [e.event for e in self.emitted]


def run_request(server: FakeMessagesAPI, **fields: Any) -> RunRequest:
    options = {"base_url": server.base_url, "api_key": KEY, **fields.pop("options", {})}
    fields.setdefault("model", MODEL)
    return RunRequest(
        adapter="anthropic", prompt=PROMPT, session_id="s1", options=options, **fields
    )


@pytest.fixture(autouse=True)
def no_real_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Nothing from the developer's environment or config reaches the SDK."""
    for name in ("API_KEY", "AUTH_TOKEN", "BASE_URL", "PROFILE", "CUSTOM_HEADERS"):
        monkeypatch.delenv(f"ANTHROPIC_{name}", raising=False)
    monkeypatch.setenv("ANTHROPIC_CONFIG_DIR", str(tmp_path))


async def serve(nursery: trio.Nursery, server: FakeMessagesAPI) -> FakeMessagesAPI:
    await nursery.start(server.serve)
    return server


def test_the_plugin_provides_the_driver_paired_with_its_adapter() -> None:
    (driver,) = busd_drivers()
    assert isinstance(driver, AnthropicDriver)
    assert isinstance(driver, Driver)
    assert driver.name == AnthropicAdapter.name == "anthropic"
    assert driver.default_model == DEFAULT_MODEL == "claude-sonnet-4-6"


async def test_a_run_feeds_the_sdk_events_that_give_the_fixture_numbers(
    nursery: trio.Nursery,
) -> None:
    server = await serve(nursery, FakeMessagesAPI(EVENTS))
    context = RecordingContext(run_request(server, model=None))
    assert isinstance(context, RunContext)

    with trio.fail_after(2):
        await AnthropicDriver().run(context)

    # The SDK's own event objects, every one but the ping it drops.
    assert all(isinstance(raw, anthropic.BaseModel) for raw in context.raw)
    assert [raw.type for raw in context.raw] == [  # type: ignore[attr-defined]
        e["type"] for e in EVENTS if e["type"] != "ping"
    ]
    events = context.events()
    (text,) = [e for e in events if isinstance(e, TextComplete)]
    assert text.text == "I'll check the weather for you."
    (tool,) = [e for e in events if isinstance(e, ToolStart)]
    assert (tool.name, tool.input) == ("get_weather", {"location": "San Francisco, CA"})
    usage = [e for e in events if isinstance(e, Usage)][-1].tokens
    assert (usage.input_tokens, usage.output_tokens) == (69, 112)
    assert events[-1] == SessionIdle(aborted=False)
    stats = context.translator.statistics()
    assert (stats.unknown, stats.malformed) == ({}, {})

    (request,) = server.requests
    assert (request.method, request.path) == ("POST", "/v1/messages")
    assert request.body == {
        "model": DEFAULT_MODEL,
        "max_tokens": DEFAULT_MAX_TOKENS,
        "messages": [{"role": "user", "content": PROMPT}],
        "stream": True,
    }
    assert KEY in request.headers.get("x-api-key", "") + request.headers.get("authorization", "")
    with trio.fail_after(1):  # the driver closed its client, and so the connection
        await server.hung_up.wait()


async def test_model_system_prompt_and_options_reach_the_api(nursery: trio.Nursery) -> None:
    server = await serve(nursery, FakeMessagesAPI(EVENTS))
    history = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
    ]
    tools = [{"name": "get_weather", "input_schema": {"type": "object", "properties": {}}}]
    thinking = {"type": "enabled", "budget_tokens": 1024}
    request = run_request(
        server,
        model="claude-opus-4-1",
        system_prompt="Be brief.",
        max_turns=5,
        options={"max_tokens": 2048, "thinking": thinking, "tools": tools, "messages": history},
    )

    with trio.fail_after(2):
        await AnthropicDriver().run(RecordingContext(request))

    (sent,) = server.requests
    assert sent.body == {
        "model": "claude-opus-4-1",
        "system": "Be brief.",
        "max_tokens": 2048,
        "thinking": thinking,
        "tools": tools,
        "messages": [*history, {"role": "user", "content": PROMPT}],
        "stream": True,
    }


async def test_base_url_and_api_key_come_from_the_sdk_environment(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = await serve(nursery, FakeMessagesAPI(EVENTS))
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    request = RunRequest(adapter="anthropic", prompt=PROMPT, session_id="s1", model=MODEL)

    with trio.fail_after(2):
        await AnthropicDriver().run(RecordingContext(request))

    (sent,) = server.requests
    assert KEY in sent.headers.get("x-api-key", "") + sent.headers.get("authorization", "")


# The SDK raises the ``error`` event from inside its stream generator and leaves
# the generators under it (SSE decoding, httpx's byte streams) suspended; the
# response is closed, so nothing leaks, but Trio warns when the GC finalizes
# them (asyncio does not). They are collected here, where that is expected.
@pytest.mark.filterwarnings("ignore:Async generator '[^']*' was garbage collected:ResourceWarning")
async def test_an_error_event_is_fed_and_then_raised(nursery: trio.Nursery) -> None:
    server = await serve(nursery, FakeMessagesAPI([*EVENTS[:4], OVERLOADED]))
    context = RecordingContext(run_request(server))

    with trio.fail_after(2), pytest.raises(anthropic.APIStatusError, match="Overloaded"):
        await AnthropicDriver().run(context)

    assert context.raw[-1] == OVERLOADED
    events = context.events()
    assert events[-1] == SessionError(message="Overloaded", code="overloaded_error", retryable=True)
    with trio.fail_after(1):
        await server.hung_up.wait()
    gc.collect()


async def test_an_http_error_raises_and_max_retries_reaches_the_client(
    nursery: trio.Nursery,
) -> None:
    body = {"type": "error", "error": {"type": "api_error", "message": "Internal server error"}}
    server = await serve(nursery, FakeMessagesAPI(EVENTS, status=500, error_body=body))
    context = RecordingContext(run_request(server, options={"max_retries": 0}))

    with trio.fail_after(2), pytest.raises(anthropic.InternalServerError):
        await AnthropicDriver().run(context)

    assert len(server.requests) == 1  # max_retries=0 configured the client: no retry
    assert "max_retries" not in server.requests[0].body
    assert context.raw == []


async def test_a_stream_cut_short_raises(nursery: trio.Nursery) -> None:
    server = await serve(nursery, FakeMessagesAPI(EVENTS[:12]))  # inside the text block
    context = RecordingContext(run_request(server))

    with trio.fail_after(2), pytest.raises(StreamIncomplete):
        await AnthropicDriver().run(context)

    assert len(context.raw) == 11  # no ping
    assert context.events()[-1] == SessionIdle(aborted=True)


async def test_cancelling_a_run_closes_the_connection_promptly(nursery: trio.Nursery) -> None:
    pause_at = 8  # after the thinking block, before the text block
    server = await serve(nursery, FakeMessagesAPI(EVENTS, pause_at=pause_at))
    context = RecordingContext(run_request(server), wait_for=pause_at - 1)  # no ping
    returned = False

    async def run() -> None:
        nonlocal returned
        await AnthropicDriver().run(context)
        returned = True

    with trio.fail_after(2):
        async with trio.open_nursery() as runs:
            runs.start_soon(run)
            await context.fed_enough.wait()
            await server.paused.wait()
            runs.cancel_scope.cancel()
        await server.hung_up.wait()

    assert not returned  # cancellation propagated out of run()
    assert len(context.raw) == pause_at - 1
    assert not any(isinstance(e, TextComplete) for e in context.events())


async def test_count_tokens_makes_the_context_figure_the_apis_own_before_the_call(
    nursery: trio.Nursery,
) -> None:
    """Dexto's calibrated estimates: count the input exactly where the API can (issue 22)."""
    server = await serve(nursery, FakeMessagesAPI(EVENTS, input_tokens=69))
    tools = [{"name": "get_weather", "input_schema": {"type": "object"}}]
    options = {"count_tokens": True, "tools": tools, "max_tokens": 100}
    context = RecordingContext(run_request(server, options=options, system_prompt="Be brief."))
    with trio.fail_after(2):
        await AnthropicDriver().run(context)
    events = context.events()
    assert events[0] == SessionContext(used=69)  # before anything the call streams
    counted, called = server.requests
    assert counted.path == "/v1/messages/count_tokens"
    assert counted.body == {  # what makes up the input, nothing about the answer
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPT}],
        "system": "Be brief.",
        "tools": tools,
    }
    assert called.path == "/v1/messages"
    assert "count_tokens" not in called.body


async def test_a_count_the_api_refuses_leaves_the_estimate(
    nursery: trio.Nursery, caplog: pytest.LogCaptureFixture
) -> None:
    server = await serve(nursery, FakeMessagesAPI(EVENTS))  # no count_tokens endpoint: 404
    context = RecordingContext(run_request(server, options={"count_tokens": True}))
    with trio.fail_after(2):
        await AnthropicDriver().run(context)
    assert not [e for e in context.events() if isinstance(e, SessionContext)]
    assert [r.path for r in server.requests] == ["/v1/messages/count_tokens", "/v1/messages"]
    assert "count_tokens failed" in caplog.text
