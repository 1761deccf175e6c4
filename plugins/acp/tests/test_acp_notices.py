"""An agent's warnings become ``stream.session.warning``, not answer text (issue 17, bug 9).

The recordings (fixtures/README.md): claude-agent-acp 0.101.0 asked for
``auto`` mode on a model that cannot serve it; it falls back and says so,
as a ``notice`` update to a client that advertised
``clientCapabilities.session.notices`` (``claude-agent-acp-notice.jsonl``),
else as a bold-label answer chunk (``claude-agent-acp-notice-as-text.jsonl``).
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from busd_acp import AcpAdapter, AcpDriver

from busd import (
    Event,
    RunRequest,
    SessionInfo,
    SessionWarning,
    TextComplete,
    TextDelta,
)

FIXTURES = Path(__file__).resolve().parent / "fixtures"
FAKE = Path(__file__).resolve().parent / "fake_acp_agent.py"
SCRIPT = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "sdk" / "acp.jsonl"
AUTO_MODE = (
    "Auto mode unavailable: The selected model does not support Auto mode; "
    "using Accept edits instead."
)


def translate(lines: list[dict[str, Any]]) -> list[Event]:
    translator = AcpAdapter().translator(session_id="s1")
    out = [e for i, line in enumerate(lines) for e in translator.feed(line, float(i))]
    return [e.event for e in out + translator.finish(float(len(lines)))]


def recording(name: str) -> list[dict[str, Any]]:
    text = (FIXTURES / name).read_text()
    return [json.loads(line) for line in text.splitlines() if line]


def update(kind: str, **fields: Any) -> dict[str, Any]:
    body = {"sessionUpdate": kind, **fields}
    params = {"sessionId": "s1", "update": body}
    return {"jsonrpc": "2.0", "method": "session/update", "params": params}


def chunk(text: str, **fields: Any) -> dict[str, Any]:
    return update("agent_message_chunk", content={"type": "text", "text": text}, **fields)


def test_a_recorded_notice_is_a_warning_and_the_answer_is_only_the_answer() -> None:
    events = translate(recording("claude-agent-acp-notice.jsonl"))
    assert [e for e in events if isinstance(e, SessionWarning | SessionInfo)] == [
        SessionWarning(message=AUTO_MODE),
        SessionInfo(message="Mode: acceptEdits"),  # its current_mode_update after the notice
    ]
    assert [e.text for e in events if isinstance(e, TextComplete)] == ["The command printed hello."]


def test_without_the_capability_the_same_notice_is_answer_text_nothing_tells_it_apart() -> None:
    """What a client that does not ask for notices gets; busd's driver asks (below)."""
    events = translate(recording("claude-agent-acp-notice-as-text.jsonl"))
    assert not any(isinstance(e, SessionWarning) for e in events)
    texts = [e.text for e in events if isinstance(e, TextComplete)]
    assert texts[0].startswith("**Auto mode unavailable:**")


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"severity": "warning", "title": "Fast mode turned off"}, SessionWarning),
        ({"severity": "info", "title": "Task stopped by user", "description": "x."}, SessionInfo),
        ({"severity": "error", "title": "Broken"}, SessionWarning),
        ({"title": "No severity"}, SessionInfo),
    ],
)
def test_a_notice_is_a_warning_or_a_note_by_its_severity(
    fields: dict[str, str], expected: type[Event]
) -> None:
    [event] = [e for e in translate([update("notice", **fields)]) if type(e) is expected]
    title, description = fields["title"], fields.get("description")
    assert event == expected(message=f"{title}: {description}" if description else title)


def test_a_notice_without_words_says_nothing_and_is_not_unknown() -> None:
    translator = AcpAdapter().translator(session_id="s1")
    events = [e.event for e in translator.feed(update("notice", severity="warning"), 0.0)]
    assert not any(isinstance(e, SessionWarning | SessionInfo) for e in events)
    assert (translator.statistics().unknown, translator.statistics().malformed) == ({}, {})


@pytest.mark.parametrize(
    ("text", "vendor", "expected"),
    [
        (  # acp-agent.js, case "informational", level warning
            "**Warning:** the Stop hook failed",
            {"kind": "informational", "level": "warning"},
            SessionWarning(message="Warning: the Stop hook failed"),
        ),
        (
            "**Notice:** compacting soon",
            {"kind": "informational", "level": "notice"},
            SessionInfo(message="Notice: compacting soon"),
        ),
        (  # reportMcpServerStartupFailures
            '**MCP server "db" failed to start:** Its tools are unavailable in this session.',
            {"kind": "mcpServerStatus", "server": "db", "status": "failed"},
            SessionWarning(
                message='MCP server "db" failed to start: '
                "Its tools are unavailable in this session."
            ),
        ),
        (
            "**Needs sign-in**",
            {"kind": "mcpServerStatus", "server": "db", "status": "needs-auth"},
            SessionInfo(message="Needs sign-in"),
        ),
    ],
)
def test_an_answer_chunk_the_agent_marks_as_a_notice_leaves_the_answer_whole(
    text: str, vendor: dict[str, str], expected: Event
) -> None:
    lines = [
        chunk("Hello, ", messageId="m1"),
        chunk(text, _meta={"claudeCode": vendor}),
        chunk("world.", messageId="m1"),
    ]
    events = translate(lines)
    assert [e for e in events if isinstance(e, SessionWarning | SessionInfo)] == [expected]
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["Hello, ", "world."]
    assert [e.text for e in events if isinstance(e, TextComplete)] == ["Hello, world."]


def test_a_chunk_with_other_vendor_meta_is_answer_text() -> None:
    events = translate([chunk("**Bold:** answer", _meta={"claudeCode": {"kind": "other"}})])
    assert [e.text for e in events if isinstance(e, TextComplete)] == ["**Bold:** answer"]


async def test_the_driver_asks_for_notices_and_publishes_them_as_warnings(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The SDK's schema knows no ``notice``: it is fed all the same, and nothing is logged."""
    record = tmp_path / "record.jsonl"
    command = [sys.executable, str(FAKE), str(SCRIPT), str(record), "--notice"]
    lines = [json.loads(line) for line in SCRIPT.read_text().splitlines() if line]
    prompt = lines[0]["params"]["prompt"][0]["text"]
    request = RunRequest(
        adapter="acp",
        prompt=prompt,
        session_id="s1",
        cwd=str(tmp_path),
        options={"command": command},
    )
    context = _Context(request)
    with caplog.at_level(logging.WARNING), trio.fail_after(30):
        await AcpDriver().run(context)
    sent = [json.loads(line) for line in record.read_text().splitlines()]
    [init] = [
        r["from_client"] for r in sent if r.get("from_client", {}).get("method") == "initialize"
    ]
    assert init["params"]["clientCapabilities"]["session"] == {"notices": {}}
    assert init["params"]["clientCapabilities"]["fs"] == {
        "readTextFile": True,
        "writeTextFile": True,
    }
    assert [e for e in context.events if isinstance(e, SessionWarning)] == [
        SessionWarning(message=AUTO_MODE)
    ]
    assert not any("Auto mode" in e.text for e in context.events if isinstance(e, TextDelta))
    assert [r.getMessage() for r in caplog.records] == []


class _Context:
    """The RunContext a run needs: feeds the adapter, allows what is asked."""

    def __init__(self, request: RunRequest) -> None:
        self.request = request
        self.run_id = "run-1"
        self.translator = AcpAdapter().translator(session_id=request.session_id)
        self.events: list[Event] = []

    def feed(self, raw: object) -> list[Event]:
        events = [e.event for e in self.translator.feed(raw, trio.current_time())]
        self.events += events
        return events

    async def request_permission(self, request: Any) -> Any:
        from busd import PermissionDecision

        return PermissionDecision(outcome="allowed", by="test")

    def set_sdk_session(self, session_id: str) -> None:
        pass

    def publish(self, event: Event) -> None:
        raise AssertionError(f"the driver publishes nothing of its own: {event}")
