"""The event catalog: one frozen msgspec Struct per event type.

Every event is tagged on the wire by its dotted type name in the ``type``
field, so a msgpack or JSON object decodes straight into the right class.
Wire names are the Python field names (snake_case), once and for all; fields
that equal their default are omitted on the wire, and a decoder fills them in
again, so new fields must always come with a default (msgspec's schema
evolution rule).

Names under ``stream.`` come from agents (through adapters); names under
``busd.`` are derived by the daemon itself (accounting, run control). Events
never carry callbacks: anything that wants an answer carries a request id,
and the answer travels back as a command.
"""

from __future__ import annotations

from typing import Any, Generic, Literal, TypeVar

import msgspec

__all__ = [
    "AgentComplete",
    "AgentStart",
    "AgentUpdate",
    "ContextBasis",
    "ContextBreakdown",
    "ContextUsage",
    "Envelope",
    "Event",
    "InternalError",
    "PermissionOption",
    "PermissionRequested",
    "PermissionResolved",
    "RunCancelled",
    "RunFinished",
    "RunStarted",
    "SessionCompaction",
    "SessionContext",
    "SessionContextParts",
    "SessionError",
    "SessionIdle",
    "SessionInfo",
    "SessionRetry",
    "SessionStart",
    "SessionTitleChanged",
    "SessionTruncation",
    "SessionWarning",
    "StreamingStats",
    "TextComplete",
    "TextDelta",
    "ThinkingComplete",
    "ThinkingDelta",
    "TokenUsage",
    "ToolComplete",
    "ToolMetrics",
    "ToolPartialResult",
    "ToolStart",
    "ToolTimeout",
    "TurnEnd",
    "TurnStart",
    "Usage",
    "UserPrompt",
    "event_type",
]


class Event(
    msgspec.Struct, frozen=True, kw_only=True, tag_field="type", omit_defaults=True, gc=False
):
    """Base class of every catalog event; subclasses set ``tag=`` to their dotted name.

    ``gc=False``: events never take part in reference cycles, and leaving the
    100k events of the replay history out of the cyclic garbage collector's
    scans removes its multi-millisecond pauses from the delivery path.
    """


def event_type(event: Event) -> str:
    """The dotted type name of ``event`` (its wire tag)."""
    return event.__struct_config__.tag  # type: ignore[return-value]


# -- value types shared by several events -----------------------------------


class TokenUsage(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Token counts of one model call, a turn, a run or a session.

    On the bus these are running totals: consumers keep the max of each
    field, so a repeated or late delivery can never make a count go down.
    ``input_tokens`` is uncached input (cache reads and writes stand beside
    it). ``output_tokens`` is the provider's own output figure and
    ``reasoning_tokens`` the thinking it reports: inside the output for
    Anthropic, OpenAI and Copilot, beside it for OpenCode.
    ``cost_usd`` is ``None`` when unknown, which is not the same as free.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost_usd: float | None = None


class PermissionOption(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One answer an SDK accepts for a permission request."""

    id: str
    label: str = ""
    kind: Literal["allow_once", "allow_always", "reject_once", "reject_always", "other"] = "other"


class ToolMetrics(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What a run did with one tool."""

    name: str
    calls: int = 0
    errors: int = 0
    total_s: float = 0.0
    mean_s: float = 0.0
    last_called: float | None = None
    last_s: float | None = None
    """How long the last call that ended took."""
    timed_out: int = 0
    """Of ``errors``, the calls busd ended at their time limit (status ``timed_out``)."""


class ContextBreakdown(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Where the context window goes; parts are back-calculated and never negative."""

    system: int = 0
    tools: int = 0
    messages: int = 0
    free: int | None = None


class ContextBasis(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What the context figure stands on: the last actual count, and what was estimated since.

    ``used`` is ``last_input + last_output + added`` after a call (or
    ``reported + added`` after a provider's own report). ``cache_hit_percent``
    is the last call's cache reads over its whole input. The estimate error
    compares each figure shown before a call with the call's actual input.
    """

    last_input: int | None = None
    """The last call's whole input (uncached, cache reads and writes); ``None`` before one."""
    last_output: int = 0
    reported: int | None = None
    """The provider's own figure, when it reported the window state since the last call."""
    added: int = 0
    """Estimated tokens added since (new messages, tool results, partial output), corrected."""
    estimate_correction: float = 1.0
    """The factor ``added`` was scaled by, learned from this conversation's earlier calls."""
    cache_read: int = 0
    cache_write: int = 0
    cache_hit_percent: float | None = None
    estimate_samples: int = 0
    """Calls whose input busd had estimated before the actual count arrived."""
    estimate_error_percent: float | None = None
    """Mean absolute error of those estimates, as a percentage of the actual input."""


# -- stream.session.* --------------------------------------------------------


class SessionStart(Event, frozen=True, tag="stream.session.start"):
    """An agent session began (or a child session, when ``parent_session_id`` is set)."""

    model: str | None = None
    title: str | None = None
    cwd: str | None = None
    parent_session_id: str | None = None


class UserPrompt(Event, frozen=True, tag="stream.session.prompt"):
    """What the user asked, as the agent's own stream shows it.

    From sessions busd did not start (Claude Code's transcripts and hooks);
    a driven run's prompt is in ``busd.run.started``. ``prompt_id`` is the
    agent's id for it, when it has one: two streams of one session (hooks
    and transcripts) publish a prompt once.
    """

    text: str
    prompt_id: str | None = None


class SessionIdle(Event, frozen=True, tag="stream.session.idle"):
    """The agent finished what it was asked and waits for input."""

    aborted: bool = False


class SessionError(Event, frozen=True, tag="stream.session.error"):
    """The agent or its SDK reported an error."""

    message: str
    code: str | None = None
    retryable: bool = False


class SessionRetry(Event, frozen=True, tag="stream.session.retry"):
    """The SDK is retrying a failed call."""

    attempt: int
    message: str = ""
    delay_s: float | None = None


class SessionInfo(Event, frozen=True, tag="stream.session.info"):
    """A note from the agent meant for people, not for the transcript."""

    message: str


class SessionWarning(Event, frozen=True, tag="stream.session.warning"):
    """A non-fatal problem worth showing."""

    message: str


class SessionTitleChanged(Event, frozen=True, tag="stream.session.title_changed"):
    """The session got a (new) title."""

    title: str


class SessionCompaction(Event, frozen=True, tag="stream.session.compaction"):
    """The conversation was summarized to free context; context estimates restart."""

    tokens_before: int | None = None
    tokens_after: int | None = None


class SessionTruncation(Event, frozen=True, tag="stream.session.truncation"):
    """Old messages were dropped to fit the context window."""

    tokens_removed: int | None = None
    messages_removed: int | None = None


class SessionContext(Event, frozen=True, tag="stream.session.context"):
    """The provider's own report of the context window (Copilot usage_info, ACP usage_update).

    A reported figure wins over busd's estimate until the next model call.
    """

    used: int
    window: int | None = None


class SessionContextParts(Event, frozen=True, tag="stream.session.context_parts"):
    """What every model call of the session sends besides the conversation, as token counts.

    The system prompt and the tool specs, as far as the agent's SDK shows
    them (the ``anthropic`` driver knows both; Claude Code's ``init`` line
    only the tools' names). A separate event, not fields of
    ``stream.session.start``: both can change from one run to the next, and
    whoever knows them (a driver, not the adapter) publishes them when it
    does. Counts, not texts: every frontend gets this event, and a system
    prompt is the agent's business; the count is all the context figure
    needs. ``None``: not known, the earlier figure stays. The context
    breakdown's ``system`` and ``tools`` parts come from here.
    """

    system: int | None = None
    """Tokens of the system prompt (the publisher's count or estimate)."""
    tools: int | None = None
    """Tokens of the tool specs (names, descriptions, input schemas)."""
    tool_names: list[str] = []
    """The tools offered, by name, when the source lists them."""


# -- stream.turn.* -----------------------------------------------------------


class TurnStart(Event, frozen=True, tag="stream.turn.start"):
    """A model call (one assistant turn) began."""

    turn_id: str | None = None


class TurnEnd(Event, frozen=True, tag="stream.turn.end"):
    """A model call ended; ``finish_reason`` as the provider said it, normalized.

    Usual values: ``end_turn``, ``tool_use``, ``max_tokens``, ``stop_sequence``,
    ``refusal``, ``cancelled``, ``error``.
    """

    turn_id: str | None = None
    finish_reason: str = "end_turn"


# -- stream.text.* and stream.thinking.* -------------------------------------


class TextDelta(Event, frozen=True, tag="stream.text.delta"):
    """A piece of assistant text; concatenating a message's deltas gives its text."""

    message_id: str
    text: str


class TextComplete(Event, frozen=True, tag="stream.text.complete"):
    """The full text of one assistant message; ``stopped`` if it was cut short."""

    message_id: str
    text: str
    stopped: bool = False


class ThinkingDelta(Event, frozen=True, tag="stream.thinking.delta"):
    """A piece of visible reasoning."""

    message_id: str
    text: str


class ThinkingComplete(Event, frozen=True, tag="stream.thinking.complete"):
    """A finished reasoning block.

    ``signature`` is kept verbatim so the conversation can be sent back to the
    provider; ``duration_s`` is the SDK's figure when it has one, otherwise
    the adapter's wall-clock measure from block start to block stop.
    """

    message_id: str
    text: str
    duration_s: float | None = None
    signature: str | None = None
    stopped: bool = False


# -- stream.tool.* -----------------------------------------------------------


class ToolStart(Event, frozen=True, tag="stream.tool.start"):
    """A tool call with its parsed input (``{}`` when the tool takes none)."""

    tool_call_id: str
    name: str
    input: dict[str, Any] = {}
    parent_tool_call_id: str | None = None


class ToolPartialResult(Event, frozen=True, tag="stream.tool.partial_result"):
    """Progress of a running tool: ``output`` is everything produced so far."""

    tool_call_id: str
    output: str


class ToolComplete(Event, frozen=True, tag="stream.tool.complete"):
    """A tool call ended.

    ``timed_out``: busd ended it at its time limit (``busd.tool.timeout``
    comes just before, ``error`` says which limit); the call failed, as an
    ``error`` did, and a result the agent still sends later is a duplicate.
    """

    tool_call_id: str
    name: str | None = None
    status: Literal["ok", "error", "cancelled", "timed_out"] = "ok"
    output: str | None = None
    error: str | None = None
    duration_s: float | None = None


# -- stream.agent.* (sub-agents) ---------------------------------------------


class AgentStart(Event, frozen=True, tag="stream.agent.start"):
    """A sub-agent was spawned, usually by a tool call of its parent."""

    agent_id: str
    name: str = ""
    description: str | None = None
    parent_agent_id: str | None = None
    tool_call_id: str | None = None


class AgentUpdate(Event, frozen=True, tag="stream.agent.update"):
    """A sub-agent's current status; later updates supersede earlier ones."""

    agent_id: str
    status: str
    message: str | None = None


class AgentComplete(Event, frozen=True, tag="stream.agent.complete"):
    """A sub-agent finished."""

    agent_id: str
    status: Literal["ok", "error", "cancelled"] = "ok"
    result: str | None = None


# -- stream.usage ------------------------------------------------------------


class Usage(Event, frozen=True, tag="stream.usage"):
    """Cumulative token usage of the envelope's session (and agent) so far.

    ``tokens`` is the total over every model; ``model`` names the model of
    the latest call. ``models``, when the source reports per model (Claude
    Code's ``modelUsage``, ACP's ``_meta.quota.model_usage``), breaks the
    total down: each entry is that model's running total, keyed by model id.
    Every report carries the whole breakdown known so far, so the latest
    report of a session (and agent) supersedes the earlier ones; a model's
    entry may lag ``tokens`` while a turn is still streaming. Empty when the
    source does not say.
    """

    tokens: TokenUsage
    model: str | None = None
    models: dict[str, TokenUsage] = {}


# -- stream.permission.* -----------------------------------------------------


class PermissionRequested(Event, frozen=True, tag="stream.permission.requested"):
    """The agent asks before using a tool; answer with a permission reply."""

    request_id: str
    tool: str
    input: dict[str, Any] = {}
    tool_call_id: str | None = None
    title: str | None = None
    category: str | None = None
    annotations: dict[str, Any] = {}
    options: list[PermissionOption] = []


class PermissionResolved(Event, frozen=True, tag="stream.permission.resolved"):
    """A permission request got its answer (or was cancelled)."""

    request_id: str
    outcome: Literal["allowed", "denied", "cancelled"]
    option_id: str | None = None
    by: str | None = None
    reason: str | None = None


# -- busd.* (derived by the daemon) ------------------------------------------


class StreamingStats(Event, frozen=True, tag="busd.stats"):
    """What a live status line shows for the envelope's session.

    ``output_estimated`` is true while the count includes output estimated
    from text seen since the last authoritative usage report. ``elapsed_s``
    is busy time: it pauses while the session is idle.
    """

    elapsed_s: float
    output_tokens: int = 0
    output_estimated: bool = False
    thinking_s: float = 0.0
    thinking: bool = False


class ContextUsage(Event, frozen=True, tag="busd.context"):
    """How full the context window will be on the next call.

    ``estimated`` is true when no provider count backs the figure yet (no
    call so far, or just after a compaction).
    """

    used: int
    window: int | None = None
    percent: float | None = None
    estimated: bool = False
    breakdown: ContextBreakdown = ContextBreakdown()
    basis: ContextBasis = ContextBasis()


class ToolTimeout(Event, frozen=True, tag="busd.tool.timeout"):
    """A tool call ran past its limit without completing (reported once)."""

    tool_call_id: str
    name: str
    limit_s: float
    elapsed_s: float


class RunStarted(Event, frozen=True, tag="busd.run.started"):
    """The daemon started an agent run.

    ``request_id`` is the id the frontend chose for it in ``start_run``; every
    ``busd.run.*`` event of the run repeats it.
    """

    adapter: str
    model: str | None = None
    request_id: str | None = None
    prompt: str | None = None


class RunCancelled(Event, frozen=True, tag="busd.run.cancelled"):
    """Someone asked to cancel a run; ``busd.run.finished`` follows."""

    by: str | None = None
    reason: str | None = None
    request_id: str | None = None


class RunFinished(Event, frozen=True, tag="busd.run.finished"):
    """A run ended, with its summary.

    ``usage`` is the run's share of its session's totals; ``models`` is that
    share per model (what each model's running total gained during the run),
    when the session's usage reports break down by model.
    ``output_estimated`` is true when ``usage.output_tokens`` includes output
    no count covers (a run cut short, say cancelled mid-answer, after its
    agent's last count): the live estimate, as ``busd.stats`` showed it last.
    """

    status: Literal["ok", "error", "cancelled", "timed_out"]
    duration_s: float
    usage: TokenUsage = TokenUsage()
    output_estimated: bool = False
    models: dict[str, TokenUsage] = {}
    thinking_s: float = 0.0
    tools: list[ToolMetrics] = []
    context: ContextUsage | None = None
    error: str | None = None
    request_id: str | None = None


class InternalError(Event, frozen=True, tag="busd.internal.error"):
    """Something inside the daemon failed (a plugin, an adapter) and was contained."""

    where: str
    message: str
    plugin: str | None = None


E = TypeVar("E", bound=Event)


class Envelope(msgspec.Struct, Generic[E], frozen=True, omit_defaults=True, gc=False):
    """An accepted event with its place in the total order.

    ``seq`` is daemon-wide and strictly increasing; ``ts`` is the accept time
    in seconds since the epoch. ``agent_id`` is set for sub-agent events (and
    so unset means the main chat); on ``stream.agent.*`` events it is the
    agent that spawned the sub-agent. ``stale`` marks events from a run that
    is no longer active. ``id`` names the event itself, wherever it travels.
    """

    seq: int
    ts: float
    event: E
    session_id: str | None = None
    run_id: str | None = None
    agent_id: str | None = None
    source: str = ""
    stale: bool = False
    id: str = ""
    """Globally unique and time-ordered (a UUIDv7): the same event keeps it across
    daemons, journals and bridges, so copies are recognized."""


BUILTIN_EVENTS: tuple[type[Event], ...] = tuple(
    cls
    for cls in list(globals().values())
    if isinstance(cls, type) and issubclass(cls, Event) and cls is not Event
)
