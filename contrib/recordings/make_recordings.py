"""Make busd's bundled recordings from the SDK fixtures, with plausible timing.

    python contrib/recordings/make_recordings.py          # write busd/data/recordings/*.jsonl
    python contrib/recordings/make_recordings.py --check  # exit 1 if they are not what it writes

Each recording (the format is in docs/runs.md, "Replaying a recording") is
a header, then every line of ``tests/fixtures/sdk/<name>.jsonl``, in order
and byte for byte, as ``{"at": <seconds>, "raw": <the line>}``. The fixtures
carry no usable timing, so it is composed here: one gap per line, chosen by
what the line is (a delta, the first token of a model call, thinking, a
tool running, ...), with jitter drawn from a generator seeded with the
recording's name, so every run writes the same bytes. A gap after a
permission request is what follows the answer: the replay driver stops the
recording's clock while the question waits.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parents[2]
FIXTURES: Final = ROOT / "tests" / "fixtures" / "sdk"
RECORDINGS: Final = ROOT / "busd" / "data" / "recordings"

GAPS: Final[dict[str, tuple[float, float]]] = {
    "start": (0.0, 0.0),
    "next": (0.005, 0.02),  # bookkeeping right behind the line above (snapshots, stops)
    "delta": (0.03, 0.12),  # streamed text, thinking or tool input
    "first": (0.8, 1.4),  # a model call's time to its first token
    "think": (2.2, 3.2),  # thinking before the next part shows
    "pause": (0.15, 0.4),  # the agent between two steps
    "tool": (1.0, 2.0),  # a tool running
    "half": (0.5, 0.9),  # half of a tool's run, around its partial output
    "cancel": (0.5, 1.0),  # a person pressing stop
    "user": (1.5, 2.5),  # a person typing the next prompt
}
"""Seconds before a line, drawn uniformly from (low, high), by kind."""

MIN_LENGTH: Final = 6.0
MAX_LENGTH: Final = 15.0


class Spec:
    """One recording: its header and one gap kind per fixture line."""

    def __init__(self, adapter: str, title: str, prompt: str, gaps: list[str]) -> None:
        self.adapter = adapter
        self.title = title
        self.prompt = prompt
        self.gaps = gaps


SPECS: Final = {
    "claude_code": Spec(
        "claude-code",
        "Claude Code writes a file: thinking, a Write permission, two model calls",
        "Create tmp/hello-allow.txt containing hello",
        [
            "start",  # system init
            "next",  # system status: requesting
            "first",  # message_start
            "delta",  # content_block_start: thinking
            "delta",  # thinking_delta
            "think",  # signature_delta: the end of a few seconds of thinking
            "next",  # assistant snapshot of the thinking block
            "next",  # content_block_stop: thinking complete
            "delta",  # content_block_start: tool_use Write
            "delta",  # input_json_delta ""
            "pause",  # input_json_delta: the whole input
            "next",  # assistant snapshot of the tool_use block
            "next",  # content_block_stop: the tool starts
            "delta",  # message_delta with the call's usage
            "next",  # message_stop
            "pause",  # control_request can_use_tool: the permission request
            "tool",  # user tool_result: Write ran after the answer
            "first",  # message_start of the second call
            "delta",  # content_block_start: text
            "delta",  # text_delta
            "next",  # assistant snapshot of the text block
            "next",  # content_block_stop
            "delta",  # message_delta with the call's usage
            "next",  # message_stop
            "pause",  # result: the turn's totals
        ],
    ),
    "copilot": Spec(
        "copilot",
        "Copilot finds the login code: reasoning, a shell permission, grep",
        "Find where login is implemented",
        [
            "start",  # session.start
            "next",  # user.message
            "next",  # assistant.turn_start
            "next",  # session.usage_info
            "first",  # assistant.reasoning_delta
            "delta",  # assistant.reasoning_delta
            "think",  # assistant.message_start
            "delta",  # assistant.message_delta
            "delta",  # assistant.message_delta
            "pause",  # assistant.reasoning: the whole reasoning, thinking complete
            "next",  # assistant.message with the tool request
            "next",  # assistant.usage of the first call
            "pause",  # permission.requested
            "next",  # permission.completed: right after the answer
            "next",  # tool.execution_start
            "half",  # tool.execution_partial_result
            "half",  # tool.execution_complete
            "first",  # assistant.message_delta of the second call
            "delta",  # assistant.message
            "next",  # assistant.usage of the second call
            "next",  # assistant.turn_end
            "next",  # session.idle
        ],
    ),
    "opencode": Spec(
        "opencode",
        "OpenCode checks the git branch: reasoning, a bash permission",
        "Which git branch am I on?",
        [
            "start",  # server.connected
            "next",  # session.status busy
            "next",  # message.updated: the assistant message
            "first",  # step-start
            "delta",  # reasoning part starts
            "delta",  # reasoning delta
            "think",  # reasoning part ends
            "delta",  # text part starts
            "delta",  # text delta
            "delta",  # text delta
            "delta",  # text part ends
            "pause",  # tool part pending
            "pause",  # tool part running
            "next",  # permission.asked
            "next",  # permission.replied: right after the answer
            "tool",  # tool part completed
            "next",  # step-finish with the tokens
            "next",  # message.updated: completed
            "next",  # message.updated: the second assistant message
            "first",  # step-start
            "pause",  # the whole text part
            "next",  # step-finish with the tokens
            "next",  # message.updated: completed
            "next",  # session.status idle
            "next",  # session.idle
        ],
    ),
    "acp": Spec(
        "acp",
        "An ACP agent writes a file, then a delete is cancelled",
        "Write okra to /tmp/p4/p4-check.txt",
        [
            "start",  # session/prompt
            "first",  # agent_thought_chunk
            "delta",  # agent_thought_chunk
            "think",  # plan
            "pause",  # agent_message_chunk
            "delta",  # agent_message_chunk
            "pause",  # tool_call pending
            "pause",  # tool_call_update with the input
            "next",  # session/request_permission
            "next",  # its result: right after the answer
            "next",  # tool_call_update in_progress
            "tool",  # tool_call_update completed
            "next",  # plan: all done
            "first",  # agent_message_chunk
            "next",  # usage_update
            "next",  # the prompt's result: end_turn
            "user",  # the second session/prompt: "Now delete it"
            "first",  # tool_call rm
            "next",  # session/request_permission
            "cancel",  # session/cancel: the person stops the turn
            "next",  # the permission's result: cancelled
            "next",  # tool_call_update failed
            "next",  # the prompt's result: cancelled
        ],
    ),
}


def build(name: str) -> str:
    """The recording ``name`` as the text of its file."""
    spec = SPECS[name]
    lines = (FIXTURES / f"{name}.jsonl").read_text("utf-8").splitlines()
    if len(lines) != len(spec.gaps):
        raise SystemExit(f"{name}: {len(lines)} fixture lines but {len(spec.gaps)} gaps")
    rng = random.Random(name)
    header = {
        "busd_recording": 1,
        "adapter": spec.adapter,
        "title": spec.title,
        "prompt": spec.prompt,
    }
    out = [json.dumps(header, ensure_ascii=False)]
    at = 0.0
    for kind, line in zip(spec.gaps, lines, strict=True):
        low, high = GAPS[kind]
        at = round(at + rng.uniform(low, high), 3)
        out.append(f'{{"at": {at:.3f}, "raw": {line}}}')
    if not MIN_LENGTH <= at <= MAX_LENGTH:
        raise SystemExit(f"{name}: {at:.1f}s long, not {MIN_LENGTH:g} to {MAX_LENGTH:g}s")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args(argv)
    stale = []
    for name in SPECS:
        text = build(name)
        path = RECORDINGS / f"{name}.jsonl"
        if args.check:
            if not path.exists() or path.read_text("utf-8") != text:
                stale.append(name)
        else:
            path.write_text(text, "utf-8")
            at = text.rsplit('{"at": ', 1)[1].split(",", 1)[0]
            print(f"{path.relative_to(ROOT)}: {len(SPECS[name].gaps)} events, {at}s")
    if stale:
        print(f"stale: {', '.join(stale)} (run {Path(__file__).name})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
