"""The ``claude-code-transcript`` adapter: the JSON Lines Claude Code writes for each session.

Claude Code keeps every session in ``<config>/projects/<project>/<sessionId>.jsonl``
and each sub-agent's conversation in ``<sessionId>/subagents/agent-<agentId>.jsonl``
(lines with ``isSidechain`` and ``agentId``). ``busd attach claude-code``
(:mod:`.attach`) sends those lines here; ``busd ingest --sdk
claude-code-transcript FILE`` works too, one session per file. One
translator is one session: its id is the translator's, else the first
``sessionId`` seen. What each line becomes (docs/attaching.md has the table):

- ``assistant``: one content block of a response per line (a response
  written as several lines shares ``message.id``): text, thinking and tool
  calls, through the same :class:`busd_anthropic.stream.MessageStream` as the
  ``claude-code`` adapter's snapshots. An ``Agent`` (``Task``) call also
  starts a sub-agent (``stream.agent.start``, agent id = the tool call id).
- ``user``: a prompt starts a run; tool results complete their calls (with
  durations from the lines' timestamps); an ``Agent`` result completes its
  sub-agent, unless it says the agent was launched in the background: then
  the ``<task-notification>`` prompt that reports it does. ``[Request
  interrupted by user]`` ends the run as aborted: the only way a run is
  aborted here, since a transcript that stops growing says nothing.
- Sub-agent lines (``isSidechain``) carry ``parent_tool_call_id`` = the
  ``Agent`` call that spawned them, found from the attacher's
  ``busd.subagent`` line (the agent's ``meta.json``), the ``agentId`` of the
  call's result or a task notification, or else the one running agent not
  yet matched; failing all, they carry ``agent_id`` = their ``agentId``.
- **Usage** counts each API response once, exactly as ccusage does
  (:mod:`.tally`); ``stream.usage`` is the session's total over every model,
  sub-agents included, with the breakdown per model and the cost of each
  response from busd's price table. After each main-agent response,
  ``stream.session.context`` says what it left in the window.
- **End of a run**: a main-agent response that stops for good (``end_turn``,
  ``max_tokens``, ``stop_sequence``, ``refusal``) ends it once its last line
  is in: at the next line that is not part of it, at the attacher's
  ``busd.caught-up``, or at the end of the stream. An older Claude Code's
  ``system`` ``turn_duration`` line ends it at once.
- ``attachment`` lines give the session's model (``model``); ``summary`` and
  ``custom-title`` its title; ``system`` ``compact_boundary`` a compaction
  and ``api_error`` a retry. The line types of :data:`IGNORED` are skipped
  on purpose (what they say is elsewhere, or is not the agent's work).

The attacher's own lines, ``busd.*``: ``busd.resume`` (the session's totals,
cwd and model at the attacher's resume point, so a restarted attacher goes
on from them), ``busd.counted`` (response keys counted before, in another
session or before a restart: shown, never counted again), ``busd.subagent``
(a sub-agent's ``meta.json``) and ``busd.caught-up``.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final, Literal

import msgspec
from busd_anthropic.stream import MessageStream, result_text

from busd import (
    AgentComplete,
    AgentStart,
    Emitted,
    Event,
    SessionCompaction,
    SessionContext,
    SessionError,
    SessionIdle,
    SessionRetry,
    SessionStart,
    SessionTitleChanged,
    TokenUsage,
    ToolComplete,
    ToolStart,
    Translator,
    Usage,
    UserPrompt,
    as_mapping,
)

from .notices import TASK_END
from .tally import SYNTHETIC, Tally, entry
from .translator import TASK_TOOLS
from .usage import held

__all__ = [
    "IGNORED",
    "IGNORED_ATTACHMENTS",
    "TranscriptAdapter",
    "TranscriptTranslator",
    "line_time",
    "worth_sending",
]

IGNORED: Final = frozenset(
    {
        "queue-operation",  # prompts queued while a turn runs: the prompt line follows
        "last-prompt",  # the latest prompt again, for Claude Code's resume picker
        "api-request",  # the request Claude Code sent; its response is the assistant lines
        "api-request-shape",  # the request's system prompt and tool schemas
        "api-request-blob",  # the request's messages, deduplicated by hash
        "tools-used",  # the tools a turn used: its tool calls say it
        "atis-latch",  # Claude Code's internal state
        "cost-state",  # Claude Code's own running totals: usage is counted from the responses
        "mode",  # the permission mode
        "file-history-snapshot",  # file backups for /rewind
        "progress",  # hook and tool progress, repeated by their results
    }
)
"""Line types skipped on purpose (docs/attaching.md says why for each)."""

IGNORED_ATTACHMENTS: Final = frozenset(
    {
        "environment",
        "deferred_tools_delta",
        "agent_listing_delta",
        "skill_listing",
        "total_tokens_reminder",
        "session_context",
        "date",
        "remote_session_change",
        "prompt_snapshot",
    }
)
"""``attachment`` types skipped on purpose: context Claude Code gives the model, not its work."""

_IGNORED_SYSTEM: Final = frozenset(
    {"informational", "local_command", "stop_hook_summary", "away_summary", "bridge_status"}
)
_TERMINAL: Final = frozenset({"end_turn", "max_tokens", "stop_sequence", "refusal"})
_INTERRUPTED: Final = "[Request interrupted by user"
_TAG: Final = re.compile(r"<(tool-use-id|status|result|summary)>(.*?)</\1>", re.DOTALL)


def _str(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def line_time(line: Mapping[str, Any]) -> float | None:
    """The line's ``timestamp`` in epoch seconds, if it has a readable one."""
    stamp = line.get("timestamp")
    if not isinstance(stamp, str):
        return None
    try:
        return datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return None


def worth_sending(line: Mapping[str, Any]) -> bool:
    """Whether this translator does anything with ``line`` (the attacher skips the rest).

    The skipped lines are the large ones (system prompts, request bodies):
    most of a transcript's bytes, none of its events or usage.
    """
    kind = line.get("type")
    if kind in IGNORED:
        return False
    if kind == "attachment":
        attachment = line.get("attachment")
        return not (
            isinstance(attachment, Mapping) and attachment.get("type") in IGNORED_ATTACHMENTS
        )
    return True


_NOT_TYPED: Final = (
    "<task-notification>",
    "<command-",
    "<local-command-",
    "<system-reminder>",
    "<bash-",
)
"""User lines Claude Code writes itself (notifications, slash commands and their output)."""


class _Tool:
    """A tool call that has started and not completed."""

    __slots__ = ("agent", "agent_id", "name", "parent", "started")

    def __init__(
        self, name: str, parent: str | None, agent_id: str | None, started: float | None
    ) -> None:
        self.name = name
        self.parent = parent
        self.agent_id = agent_id
        self.started = started
        self.agent = name in TASK_TOOLS


_Who = tuple[str | None, str | None]
"""(the ``Agent`` call that spawned the line's agent, its ``agentId`` when that is unknown)."""


class TranscriptTranslator(Translator):
    """One Claude Code session's transcript lines (and its sub-agents') to catalog events."""

    def __init__(self, *, session_id: str | None = None, remember: int = 4096) -> None:
        super().__init__(session_id=session_id, adapter="claude-code-transcript")
        self._remember = remember
        self._sid = session_id
        self._cwd: str | None = None
        self._model: str | None = None
        self._announced = False
        self._early: UserPrompt | None = None  # a prompt before the model is known
        self._tally = Tally()
        self._lanes: dict[str | None, MessageStream] = {}
        self._tools: dict[str, _Tool] = {}
        self._agents: dict[str, str] = {}  # agentId -> the Agent call that spawned it
        self._background: dict[str, str | None] = {}  # launched agent call -> its parent
        self._agents_done: OrderedDict[str, None] = OrderedDict()  # agent calls completed
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._done: OrderedDict[str, None] = OrderedDict()
        self._busy = False
        self._ending: str | None = None  # the main response that ends the run, once all in
        self._ended: OrderedDict[str, int] = OrderedDict()  # such responses -> times ended

    # -- dispatch ------------------------------------------------------------------

    def translate(self, raw: object, now: float) -> list[Emitted]:
        line = as_mapping(raw)
        kind = line.get("type")
        uuid = line.get("uuid")
        if isinstance(uuid, str):
            if uuid in self._seen:
                self.duplicate()
                return []
            self._keep(self._seen, uuid)
        if self._sid is None:
            self._sid = _str(line.get("sessionId"))
        out: list[Emitted] = []
        own = isinstance(kind, str) and kind.startswith("busd.")
        if self._ending is not None and not own and not self._continues(line):
            self._end(now, out)
        match kind:
            case "assistant":
                self._assistant(line, now, out)
            case "user":
                self._user(line, now, out)
            case "attachment":
                self._attachment(line, out)
            case "system":
                self._system(line, now, out)
            case "summary" | "custom-title":
                title = _str(line.get("summary")) or _str(line.get("customTitle"))
                if title is not None:
                    self._emit(out, SessionTitleChanged(title=title))
            case str() if kind in IGNORED:
                pass
            case str() if own:
                self._own(kind, line, now, out)
            case _:
                self.unknown(kind if isinstance(kind, str) else "<no type>")
        return out

    def close(self, now: float) -> list[Emitted]:
        """The end of what was sent: a run whose last response is in ends; nothing is aborted."""
        out: list[Emitted] = []
        if self._early is not None:  # a prompt and nothing after it (yet)
            self._start(out)
        if self._ending is not None:
            self._end(now, out)
        for key, lane in self._lanes.items():
            self._deliver(out, lane.settle(now), self._who_of(key), None)
        return out

    # -- helpers -------------------------------------------------------------------

    def _keep(self, ids: OrderedDict[str, None], key: str) -> None:
        ids[key] = None
        if len(ids) > self._remember:
            ids.popitem(last=False)

    def _emit(self, out: list[Emitted], event: Event, who: _Who = (None, None)) -> None:
        """Emit ``event`` for ``who`` (the session starts first, once)."""
        self._start(out)
        parent, agent = who
        out.append(
            self.emit(event, session_id=self._sid, agent_id=agent, parent_tool_call_id=parent)
        )

    def _start(self, out: list[Emitted]) -> None:
        if not self._announced:
            self._announced = True
            start = SessionStart(model=self._model, cwd=self._cwd)
            out.append(self.emit(start, session_id=self._sid))
            if self._early is not None:  # held until the session could say its model
                prompt, self._early = self._early, None
                out.append(self.emit(prompt, session_id=self._sid))

    def _who(self, line: Mapping[str, Any]) -> _Who:
        """Whose line this is: the main agent's ``(None, None)``, else its sub-agent's."""
        if line.get("isSidechain") is not True:
            return None, None
        agent = _str(line.get("agentId"))
        if agent is None:
            return None, None
        call = self._agents.get(agent)
        if call is None:  # no word yet: the one running agent not yet matched, if one
            matched = set(self._agents.values())
            running = [c for c, t in self._tools.items() if t.agent and c not in matched]
            running += [c for c in self._background if c not in matched and c not in running]
            if len(running) != 1:
                return None, agent
            call = self._agents[agent] = running[0]
        return call, None

    @staticmethod
    def _who_of(key: str | None) -> _Who:
        if key is not None and key.startswith("agent:"):
            return None, key.removeprefix("agent:")
        return key, None

    @staticmethod
    def _key(who: _Who) -> str | None:
        """The lane of ``who``: its ``Agent`` call, ``agent:<agentId>`` unmatched, main ``None``."""
        parent, agent = who
        return parent if agent is None else f"agent:{agent}"

    def _lane(self, who: _Who) -> MessageStream:
        key = self._key(who)
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = MessageStream(self, parent_tool_call_id=who[0])
        return lane

    def _deliver(
        self, out: list[Emitted], events: list[Event], who: _Who, started: float | None
    ) -> None:
        """Emit a lane's events; a tool start is remembered, an ``Agent`` call starts an agent."""
        for event in events:
            self._emit(out, event, who)
            if type(event) is ToolStart and event.tool_call_id not in self._tools:
                if event.tool_call_id in self._done:
                    continue
                tool = _Tool(event.name, who[0], who[1], started)
                self._tools[event.tool_call_id] = tool
                if tool.agent:
                    kind = _str(event.input.get("subagent_type"))
                    spawned = AgentStart(
                        agent_id=event.tool_call_id,
                        name=kind or "task",
                        description=_str(event.input.get("description")),
                        parent_agent_id=who[0],
                        tool_call_id=event.tool_call_id,
                    )
                    self._emit(out, spawned, who)

    def _continues(self, line: Mapping[str, Any]) -> bool:
        """Whether ``line`` is another block of the response that ends the run."""
        if line.get("type") != "assistant" or line.get("isSidechain") is True:
            return False
        message = line.get("message")
        return isinstance(message, Mapping) and message.get("id") == self._ending

    def _end(self, now: float, out: list[Emitted], *, aborted: bool = False) -> None:
        """The run ends: the main agent's open turn settles, then idle."""
        if self._ending is not None:
            times = self._ended.pop(self._ending, 0) + 1
            self._ended[self._ending] = times
            if len(self._ended) > self._remember:
                self._ended.popitem(last=False)
        self._ending = None
        lane = self._lanes.get(None)
        if lane is not None:
            self._deliver(out, lane.settle(now, cancelled=aborted), (None, None), None)
        if self._busy:
            self._busy = False
            self._emit(out, SessionIdle(aborted=aborted))

    def _usage(self, out: list[Emitted]) -> None:
        total = self._tally.total()
        if total != TokenUsage():
            usage = Usage(tokens=total, model=self._model, models=self._tally.breakdown())
            self._emit(out, usage)

    # -- lines ---------------------------------------------------------------------

    def _assistant(self, line: Mapping[str, Any], now: float, out: list[Emitted]) -> None:
        message = line.get("message")
        if not isinstance(message, Mapping):
            self.malformed("assistant", "no message")
            return
        who = self._who(line)
        main = who == (None, None)
        model = _str(message.get("model"))
        if main and model is not None and model != SYNTHETIC:
            self._model = model
        self._busy = True
        message_id = _str(message.get("id"))
        late = self._ended.get(message_id or "") if main else None
        if late is not None:  # a block written after its run was said to end: a turn of its own
            message = {**message, "id": f"{message_id}~{late}"}
        events = self._lane(who).snapshot(message, now, usage=False, final=False)
        self._deliver(out, events, who, line_time(line))
        found = entry(line)
        if found is not None and self._tally.count(found):
            self._usage(out)
            if main and found.model != SYNTHETIC and held(found.tokens):
                self._emit(out, SessionContext(used=held(found.tokens)))
        if line.get("isApiErrorMessage") is True and main:
            text = result_text(message.get("content")) or "API error"
            self._emit(out, SessionError(message=text))
        stop = message.get("stop_reason")
        if main and isinstance(stop, str) and stop in _TERMINAL:
            self._ending = message_id or ""

    def _user(self, line: Mapping[str, Any], now: float, out: list[Emitted]) -> None:
        message = line.get("message")
        content = message.get("content") if isinstance(message, Mapping) else None
        who = self._who(line)
        cwd = _str(line.get("cwd"))
        if cwd is not None and who == (None, None):
            self._cwd = cwd
        results = (
            [b for b in content if isinstance(b, Mapping) and b.get("type") == "tool_result"]
            if isinstance(content, list)
            else []
        )
        if not results:
            if who == (None, None) and line.get("isMeta") is not True:
                self._prompt(result_text(content), line, now, out)
            return
        lane = self._lanes.get(self._key(who))
        if lane is not None and lane.open:
            self._deliver(out, lane.settle(now), who, None)  # results end a snapshot turn
        outcome = line.get("toolUseResult")
        for block in results:
            self._tool_result(block, outcome, who, (now, line_time(line)), out)

    def _prompt(self, text: str, line: Mapping[str, Any], now: float, out: list[Emitted]) -> None:
        """A prompt starts a run; an interruption ends one, aborted."""
        if line.get("isCompactSummary") is True:
            return  # the summary a compaction carries on with: not a prompt
        if text.startswith(_INTERRUPTED):
            for call, tool in list(self._tools.items()):
                self._complete(call, "cancelled", None, line_time(line), out)
                if tool.agent:
                    self._agent_done(call, tool.parent, "cancelled", None, now, out)
            self._end(now, out, aborted=True)
            return
        self._busy = True
        if text.strip() and not text.lstrip().startswith(_NOT_TYPED):
            prompt = UserPrompt(text=text, prompt_id=_str(line.get("promptId")))
            if self._announced or self._model is not None:
                self._emit(out, prompt)
            else:
                self._early = prompt
        if text.lstrip().startswith("<task-notification>"):
            tags = {name: value.strip() for name, value in _TAG.findall(text)}
            notified = tags.get("tool-use-id")
            # Launched here, or before this translator (an attacher that restarted).
            if notified is not None and notified not in self._agents_done:
                status = TASK_END.get(tags.get("status", ""), "ok")
                result = tags.get("result") or tags.get("summary")
                parent = self._background.pop(notified, None)
                self._agent_done(notified, parent, status, result, now, out)

    def _tool_result(
        self,
        block: Mapping[str, Any],
        outcome: object,
        who: _Who,
        times: tuple[float, float | None],
        out: list[Emitted],
    ) -> None:
        """A tool's result; ``times`` is ``now`` and the line's own time."""
        now, when = times
        call = _str(block.get("tool_use_id"))
        if call is None:
            self.malformed("tool_result", "no tool_use_id")
            return
        if call in self._done:
            self.duplicate()
            return
        failed = block.get("is_error") is True
        text = result_text(block.get("content"))
        tool = self._tools.get(call)
        self._complete(call, "error" if failed else "ok", text, when, out, who=who)
        found = outcome if isinstance(outcome, Mapping) else {}
        agent = _str(found.get("agentId"))
        if tool is not None and not tool.agent:
            return
        if tool is None and (agent is None or call in self._agents_done):
            return  # not an agent's; or its call was before this translator, and is done
        if agent is not None:
            self._agents.setdefault(agent, call)
        parent = who[0] if tool is None else tool.parent
        if found.get("status") == "async_launched" and not failed:
            self._background[call] = parent  # its task notification ends it
            return
        report = result_text(found.get("content")) or text
        self._agent_done(call, parent, "error" if failed else "ok", report, now, out)

    def _complete(
        self,
        call: str,
        status: Literal["ok", "error", "cancelled"],
        text: str | None,
        when: float | None,
        out: list[Emitted],
        *,
        who: _Who | None = None,
    ) -> None:
        tool = self._tools.pop(call, None)
        self._keep(self._done, call)
        if tool is not None:
            who = (tool.parent, tool.agent_id)
        started = None if tool is None else tool.started
        complete = ToolComplete(
            tool_call_id=call,
            name=None if tool is None else tool.name,
            status=status,
            output=text if status == "ok" else None,
            error=text if status == "error" else None,
            duration_s=None if started is None or when is None else max(0.0, when - started),
        )
        self._emit(out, complete, who or (None, None))

    def _agent_done(
        self,
        call: str,
        parent: str | None,
        status: Literal["ok", "error", "cancelled"],
        result: str | None,
        now: float,
        out: list[Emitted],
    ) -> None:
        self._keep(self._agents_done, call)
        lane = self._lanes.pop(call, None)
        if lane is not None:
            self._deliver(out, lane.settle(now), (call, None), None)
        self._emit(out, AgentComplete(agent_id=call, status=status, result=result), (parent, None))

    def _attachment(self, line: Mapping[str, Any], out: list[Emitted]) -> None:
        attachment = line.get("attachment")
        kind = attachment.get("type") if isinstance(attachment, Mapping) else None
        if not isinstance(attachment, Mapping) or not isinstance(kind, str):
            self.malformed("attachment", "no attachment type")
            return
        if kind == "model":
            identity = attachment.get("identity")
            model = _str(identity.get("modelId")) if isinstance(identity, Mapping) else None
            if model is not None and line.get("isSidechain") is not True:
                self._model = model
                cwd = _str(line.get("cwd"))
                self._cwd = self._cwd or cwd
                self._start(out)
        elif kind not in IGNORED_ATTACHMENTS:
            self.unknown(f"attachment.{kind}")

    def _system(self, line: Mapping[str, Any], now: float, out: list[Emitted]) -> None:
        subtype = line.get("subtype")
        match subtype:
            case "turn_duration":
                if line.get("isSidechain") is not True:
                    self._end(now, out)
            case "compact_boundary":
                meta = line.get("compactMetadata")
                before = _int(meta.get("preTokens")) if isinstance(meta, Mapping) else None
                self._emit(out, SessionCompaction(tokens_before=before))
            case "api_error":
                error = line.get("error")
                text = _str(error.get("message")) if isinstance(error, Mapping) else None
                delay = line.get("retryInMs")
                retry = SessionRetry(
                    attempt=_int(line.get("retryAttempt")) or 0,
                    message=text or _str(line.get("content")) or "API error",
                    delay_s=delay / 1000 if isinstance(delay, int | float) else None,
                )
                self._emit(out, retry)
            case str() if subtype in _IGNORED_SYSTEM:
                pass
            case _:
                self.unknown(f"system.{subtype}")

    # -- the attacher's lines ------------------------------------------------------------

    def _own(self, kind: str, line: Mapping[str, Any], now: float, out: list[Emitted]) -> None:
        match kind:
            case "busd.caught-up":
                if self._ending is not None:
                    self._end(now, out)
            case "busd.counted":
                keys = line.get("keys")
                if isinstance(keys, list):
                    self._tally.mark(k for k in keys if isinstance(k, str))
            case "busd.subagent":
                agent = _str(line.get("agentId"))
                meta = line.get("meta")
                call = _str(meta.get("toolUseId")) if isinstance(meta, Mapping) else None
                if agent is not None and call is not None:
                    self._agents[agent] = call
            case "busd.resume":
                self._resume(line, out)
            case _:
                self.unknown(kind)

    def _resume(self, line: Mapping[str, Any], out: list[Emitted]) -> None:
        """The attacher's resume point: what was counted before it, and the session's context."""
        models = line.get("models")
        if isinstance(models, Mapping):
            try:
                restored = msgspec.convert(models, dict[str, TokenUsage])
            except msgspec.ValidationError as exc:
                self.malformed("busd.resume", str(exc))
                return
            self._tally.restore(restored)
        self._cwd = _str(line.get("cwd")) or self._cwd
        self._model = _str(line.get("model")) or self._model
        self._start(out)
        self._usage(out)


class TranscriptAdapter:
    """The ``claude-code-transcript`` adapter: one :class:`TranscriptTranslator` per session."""

    name = "claude-code-transcript"

    def translator(self, *, session_id: str | None = None) -> Translator:
        return TranscriptTranslator(session_id=session_id)
