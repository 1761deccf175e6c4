"""Every recorded SDK stream through a real daemon, with two frontends attached.

``busd serve`` runs as a process with the built-in adapters loaded by entry
point; ``busd ingest`` feeds a fixture; two ``busd tail`` processes (one with
merged deltas, one raw) watch. Coalescing may group their deliveries
differently, so each frontend's stream is folded into what a UI shows, and
both folds must be equal and carry the fixture's exact numbers.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio

from busd.client import connect

from .daemon_helpers import serving

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "sdk"
BUSD = [sys.executable, "-m", "busd"]
SENTINEL = "stream.session.warning"  # published once the ingest is done


@dataclass
class Fold:
    """What a UI ends up showing, whatever batching the frontend got."""

    usage: dict[str, Any] = field(default_factory=dict)
    text: dict[str, str] = field(default_factory=dict)
    completed_text: dict[str, str] = field(default_factory=dict)
    thinking: list[dict[str, Any]] = field(default_factory=list)
    tools: dict[str, dict[str, Any]] = field(default_factory=dict)
    permissions: dict[str, dict[str, Any]] = field(default_factory=dict)
    resolutions: dict[str, dict[str, Any]] = field(default_factory=dict)
    turn_ends: list[str] = field(default_factory=list)
    contexts: list[dict[str, Any]] = field(default_factory=list)
    lifecycle: list[str] = field(default_factory=list)
    seqs: list[int] = field(default_factory=list)


LIFECYCLE = {"stream.session.start", "stream.session.idle", "stream.turn.start", "stream.turn.end"}


def fold(lines: list[dict[str, Any]]) -> Fold:
    state = Fold()
    for envelope in lines:
        event = envelope["event"]
        kind = event["type"]
        state.seqs.append(envelope["seq"])
        if kind == "stream.usage":
            state.usage = event["tokens"]
        elif kind == "stream.text.delta":
            state.text[event["message_id"]] = (
                state.text.get(event["message_id"], "") + event["text"]
            )
        elif kind == "stream.text.complete":
            state.completed_text[event["message_id"]] = event["text"]
        elif kind == "stream.thinking.complete":
            state.thinking.append(event)
        elif kind in ("stream.tool.start", "stream.tool.complete"):
            state.tools.setdefault(event["tool_call_id"], {}).update(event)
        elif kind == "stream.permission.requested":
            state.permissions[event["request_id"]] = event
        elif kind == "stream.permission.resolved":
            state.resolutions[event["request_id"]] = event
        elif kind == "stream.session.context":
            state.contexts.append(event)
        if kind == "stream.turn.end":
            state.turn_ends.append(event.get("finish_reason", "end_turn"))
        if kind in LIFECYCLE:
            state.lifecycle.append(kind)
    return state


async def run_fixture(sock_path: Path, sdk: str, fixture: str) -> tuple[Fold, Fold]:
    async with serving(sock_path), trio.open_nursery() as nursery:
        outputs: dict[str, bytes] = {}

        async def tail(name: str, *args: str) -> None:
            result = await trio.run_process(
                [
                    *BUSD,
                    "tail",
                    "--socket",
                    str(sock_path),
                    "--json",
                    "--since",
                    "0",
                    "--until",
                    SENTINEL,
                    "--timeout",
                    "60",
                    "stream.>",
                    *args,
                ],
                capture_stdout=True,
                capture_stderr=True,
            )
            assert result.returncode == 0, result.stderr
            outputs[name] = result.stdout

        nursery.start_soon(tail, "merged")
        nursery.start_soon(tail, "raw", "--raw-deltas")
        ingest = await trio.run_process(
            [
                *BUSD,
                "ingest",
                "--socket",
                str(sock_path),
                "--sdk",
                sdk,
                "--session",
                f"{sdk}-session",
                str(FIXTURES / fixture),
            ],
            capture_stderr=True,
        )
        assert ingest.returncode == 0, ingest.stderr
        assert b"ingested" in ingest.stderr
        await trio.run_process(
            [*BUSD, "publish", SENTINEL, "--socket", str(sock_path), "--field", "message=done"],
        )
    folds = []
    for name in ("merged", "raw"):
        lines = [json.loads(line) for line in outputs[name].splitlines()]
        assert lines[-1]["event"]["type"] == SENTINEL
        folds.append(fold(lines[:-1]))
    merged, raw = folds
    for state in folds:
        assert state.seqs == sorted(set(state.seqs))  # one total order, no doubles
        for message_id, text in state.completed_text.items():
            assert state.text.get(message_id, text) == text  # deltas add up to the complete
    # Both frontends show the same thing.
    assert merged.usage == raw.usage
    assert merged.completed_text == raw.completed_text
    assert merged.text == raw.text
    assert merged.tools == raw.tools
    assert merged.permissions == raw.permissions
    assert merged.resolutions == raw.resolutions
    assert merged.turn_ends == raw.turn_ends
    assert merged.lifecycle == raw.lifecycle
    return merged, raw


@pytest.fixture
def sock_path() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="busd-", dir="/tmp"))
    yield directory / "run" / "bus.sock"
    shutil.rmtree(directory, ignore_errors=True)


def only(values: dict[str, Any] | list[Any]) -> Any:
    items = list(values.values()) if isinstance(values, dict) else values
    assert len(items) == 1, items
    return items[0]


async def test_anthropic_text(sock_path: Path) -> None:
    shown, _ = await run_fixture(sock_path, "anthropic", "anthropic-text.recorded.jsonl")
    assert only(shown.completed_text) == (
        "Hello! I'm doing well, thank you for asking. How are you doing today? "
        "Is there anything I can help you with?"
    )
    assert (shown.usage["input_tokens"], shown.usage["output_tokens"]) == (12, 30)
    assert shown.lifecycle[-1] == "stream.session.idle"


async def test_anthropic_tool(sock_path: Path) -> None:
    shown, _ = await run_fixture(sock_path, "anthropic", "anthropic-tool.recorded.jsonl")
    tool = only(shown.tools)
    assert tool["name"] == "json"
    assert tool["input"] == {
        "elements": [{"location": "San Francisco", "temperature": 58, "condition": "sunny"}]
    }
    assert shown.turn_ends == ["tool_use"]
    assert shown.usage["output_tokens"] == 47


async def test_anthropic_thinking_text_and_tool(sock_path: Path) -> None:
    shown, _ = await run_fixture(sock_path, "anthropic", "anthropic.jsonl")
    thinking = only(shown.thinking)
    assert thinking["text"].startswith("The user wants the weather")
    assert thinking["signature"].startswith("EvQBCkYICxgCKkAx")
    assert only(shown.completed_text) == "I'll check the weather for you."
    tool = only(shown.tools)
    assert (tool["name"], tool["input"]) == ("get_weather", {"location": "San Francisco, CA"})
    assert (shown.usage["input_tokens"], shown.usage["output_tokens"]) == (69, 112)


async def test_claude_code(sock_path: Path) -> None:
    shown, _ = await run_fixture(sock_path, "claude-code", "claude_code.jsonl")
    assert shown.usage["output_tokens"] == 231  # never the stale per-block snapshots
    assert shown.usage["reasoning_tokens"] == 59
    assert shown.usage["cost_usd"] == pytest.approx(0.120235)
    assert only(shown.permissions)["tool"] == "Write"
    assert shown.lifecycle.count("stream.session.start") == 1


async def test_copilot(sock_path: Path) -> None:
    shown, _ = await run_fixture(sock_path, "copilot", "copilot.jsonl")
    assert shown.usage["output_tokens"] == 110  # 98 + 12: per-call usage accumulates
    assert shown.usage["reasoning_tokens"] == 31
    context = only(shown.contexts)
    assert (context["window"], context["used"]) == (200_000, 18_234)
    resolution = shown.resolutions["perm-7f3a"]
    assert resolution["outcome"] == "allowed"
    tool = shown.tools["toolu_1"]
    assert (tool["name"], tool.get("status", "ok")) == ("bash", "ok")


async def test_opencode(sock_path: Path) -> None:
    shown, _ = await run_fixture(sock_path, "opencode", "opencode.jsonl")
    assert shown.usage["output_tokens"] == 161  # 154 + 7: tokens restart per message
    assert shown.usage["reasoning_tokens"] == 81
    assert shown.usage["cost_usd"] == pytest.approx(0.0081171)
    resolution = only(shown.resolutions)
    assert (resolution["outcome"], resolution["option_id"]) == ("allowed", "once")
    bash = [t for t in shown.tools.values() if t.get("name") == "bash"]
    assert only(bash)["output"] == "main\n"


async def test_acp(sock_path: Path) -> None:
    shown, _ = await run_fixture(sock_path, "acp", "acp.jsonl")
    assert shown.turn_ends == ["end_turn", "cancelled"]
    outcomes = [r["outcome"] for r in shown.resolutions.values()]
    assert outcomes == ["allowed", "cancelled"]
    first, _ = shown.resolutions.values()
    assert first.get("option_id") == "once"
    # A field equal to its default is left off the wire: a missing status is "ok".
    assert shown.tools["call_c95bdab20b584813b28ef777"].get("status", "ok") == "ok"
    assert shown.tools["call_1d2e3f"]["status"] == "error"


async def test_unknown_sdk_is_refused_with_the_loaded_adapters(sock_path: Path) -> None:
    async with serving(sock_path):
        result = await trio.run_process(
            [*BUSD, "ingest", "--socket", str(sock_path), "--sdk", "nope", "-"],
            stdin=b"{}\n",
            capture_stderr=True,
            check=False,
        )
    assert result.returncode == 2
    assert b"no adapter 'nope'" in result.stderr
    assert b"anthropic" in result.stderr


async def test_malformed_lines_are_counted_and_the_stream_goes_on(sock_path: Path) -> None:
    lines = (FIXTURES / "anthropic-text.recorded.jsonl").read_bytes().splitlines()
    huge = b'{"type": "ping", "pad": "' + b"x" * (3 << 20) + b'"}'  # over the 1 MiB frame cap
    not_objects = [b"[1, 2, 3]", b"42", b'"str"']
    broken = [lines[0], b"{not json", b'{"type": "mystery"}', huge, *not_objects, *lines[1:]]
    async with serving(sock_path):
        result = await trio.run_process(
            [
                *BUSD,
                "ingest",
                "--socket",
                str(sock_path),
                "--sdk",
                "anthropic",
                "--session",
                "s1",
                "-",
            ],
            stdin=b"\n".join(broken) + b"\n",
            capture_stderr=True,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        said = result.stderr.decode().splitlines()
        assert said[0].startswith("busd: line 2: not JSON (")
        assert said[1:5] == [
            f"busd: line 4: {len(huge) + 1} bytes, over the daemon's frame cap of 1048576; skipped",
            "busd: line 5: not a JSON object (an array); skipped",
            "busd: line 6: not a JSON object (a number); skipped",
            "busd: line 7: not a JSON object (a string); skipped",
        ]
        # the unknown {"type": "mystery"} is the adapter's to judge (it logs it), not the CLI's
        assert said[5] == f"busd: ingested {len(lines) + 1} anthropic event(s), 5 line(s) skipped"
        tail = await trio.run_process(
            [
                *BUSD,
                "tail",
                "--socket",
                str(sock_path),
                "--json",
                "--since",
                "0",
                "--until",
                "stream.session.idle",
                "--timeout",
                "30",
                "stream.>",
            ],
            capture_stdout=True,
            check=False,
        )
    assert tail.returncode == 0
    shown = fold([json.loads(line) for line in tail.stdout.splitlines()])
    assert shown.usage["output_tokens"] == 30


async def test_ctrl_c_stops_reading_a_terminal_and_sends_what_was_read(sock_path: Path) -> None:
    lines = (FIXTURES / "anthropic-text.recorded.jsonl").read_bytes().splitlines()
    controller, terminal = os.openpty()  # stdin is a terminal, as when a person types
    try:
        async with serving(sock_path):
            process = await trio.lowlevel.open_process(
                [*BUSD, "ingest", "--socket", str(sock_path), "--sdk", "anthropic"],
                stdin=terminal,
                stderr=subprocess.PIPE,
            )
            assert process.stderr is not None
            os.write(controller, lines[0] + b"\n")
            async with (
                connect(sock_path, client="watcher") as watcher,
                watcher.subscribe(["stream.>"], window_ms=0) as sub,
            ):
                with trio.fail_after(20):  # the first line is translated: the CLI has read it
                    await sub.__anext__()
            process.send_signal(signal.SIGINT)
            with trio.fail_after(20):
                code = await process.wait()
            said = (await process.stderr.receive_some(65536)).decode()
            await process.stderr.aclose()
    finally:
        os.close(controller)
        os.close(terminal)
    assert code == 0, said
    assert "busd: ingested 1 anthropic event(s)" in said


async def test_follow_reads_a_growing_file_and_holds_a_half_written_line(
    sock_path: Path, tmp_path: Path
) -> None:
    lines = (FIXTURES / "anthropic-text.recorded.jsonl").read_bytes().splitlines()
    growing = tmp_path / "stream.jsonl"
    growing.write_bytes(lines[0] + b"\n" + lines[1][:10])  # the writer is mid-line
    async with serving(sock_path):
        process = await trio.lowlevel.open_process(
            [
                *BUSD,
                "ingest",
                "--socket",
                str(sock_path),
                "--sdk",
                "anthropic",
                "--follow",
                "--session",
                "grow",
                str(growing),
            ],
            stderr=subprocess.PIPE,
        )
        assert process.stderr is not None
        async with (
            connect(sock_path, client="watcher") as watcher,
            watcher.subscribe(["stream.>"], sessions=["grow"], window_ms=0) as sub,
        ):
            with trio.fail_after(20):  # the first line is followed
                await sub.__anext__()
            with growing.open("ab") as file:  # the writer finishes its line and the stream
                file.write(lines[1][10:] + b"\n" + b"\n".join(lines[2:]) + b"\n")
            seen: list[str] = []
            with trio.fail_after(20):
                async for batch in sub:
                    seen += [type(envelope.event).__name__ for envelope in batch.events]
                    if "TurnEnd" in seen:
                        break
        process.send_signal(signal.SIGTERM)
        with trio.fail_after(20):
            code = await process.wait()
        said = (await process.stderr.receive_some(65536)).decode()
        await process.stderr.aclose()
    assert code == 0, said
    assert "skipped" not in said  # the half line was held, not judged
    assert f"busd: ingested {len(lines)} anthropic event(s)" in said
