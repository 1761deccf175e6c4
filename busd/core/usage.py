"""Token usage: one shape for every provider, and the ledger behind ``stream.usage``.

Providers disagree on what "input tokens" means. Anthropic, Bedrock and
OpenCode report *uncached* input with cache reads and writes beside it;
OpenAI (chat and Responses), litellm and Copilot report *all* prompt tokens
with the cached share inside. busd uses the first meaning everywhere, so
``input + cache_read + cache_write`` is the whole prompt for every provider
and the same sum can be shown, priced or compared across them.
``output_tokens`` is each provider's own output figure, so counts match what
that provider shows and bills: reasoning is inside it for Anthropic, OpenAI,
Bedrock, litellm and Copilot, and beside it for OpenCode (whose
``tokens.output`` leaves ``tokens.reasoning`` out). Gemini bills its thoughts
as output but counts them beside its answer, so busd adds them in.

A payload of a shape no mapping knows is reported (counted and logged),
never silently read as zeros; :func:`read_usage` returns ``None`` for it.

:func:`normalize_usage` never raises on payload content: a missing, ``None``
or malformed count is 0, and a cost that is not a plain non-negative number
stays ``None`` (unknown), never 0 (free).

Two kinds of reports reach the :class:`UsageLedger`: *cumulative* snapshots
(the counts so far within one model call; Anthropic's ``message_delta``,
OpenCode's per-message ``tokens``), which are merged with ``max`` so that a
repeated or late snapshot cannot count twice, and *increments* (one model
call's own counts; Copilot's ``assistant.usage``), which are added.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from .errors import BusdError
from .events import TokenUsage
from .usagefields import (
    _GEMINI_KEYS,
    _PRIMARY_KEYS,
    _cost,
    _get,
    _has,
    _inclusive,
    _money,
    _pick,
    _report_unrecognized,
    _unknown_shape,
    unrecognized_usage,
)

__all__ = [
    "PROVIDERS",
    "UnknownProvider",
    "UsageLedger",
    "UsageLedgerStatistics",
    "add_usage",
    "cache_hit_percent",
    "merge_cumulative",
    "normalize_usage",
    "read_usage",
    "unrecognized_usage",
]

_ZERO = TokenUsage()


class UnknownProvider(BusdError, ValueError):
    """``normalize_usage(provider=...)`` got a name it has no mapping for."""


# -- one mapping per provider family -----------------------------------------

_Counts = tuple[int, int, int, int, int]
"""input (uncached), output (as the provider counts it), reasoning, cache read, cache write."""


def _anthropic(p: object) -> _Counts:
    details = _get(p, "output_tokens_details")
    return (
        _pick(p, "input_tokens"),
        _pick(p, "output_tokens"),
        _pick(details, "thinking_tokens", "reasoning_tokens"),
        _pick(p, "cache_read_input_tokens"),
        _pick(p, "cache_creation_input_tokens"),
    )


def _openai_responses(p: object) -> _Counts:
    read = _pick(_get(p, "input_tokens_details"), "cached_tokens")
    return (
        _inclusive(_pick(p, "input_tokens"), read, 0),
        _pick(p, "output_tokens"),
        _pick(_get(p, "output_tokens_details"), "reasoning_tokens", "thinking_tokens"),
        read,
        0,
    )


def _openai_chat(p: object) -> _Counts:
    # OpenAI chat completions and litellm's superset of it: prompt_tokens holds every
    # input token, cached reads (and, in litellm, cache writes) included.
    # litellm also spells them cache_read_tokens / cache_creation_tokens (top level or
    # in the details); all of them are inside prompt_tokens, never beside it.
    prompt_details = _get(p, "prompt_tokens_details")
    read = max(
        _pick(prompt_details, "cached_tokens", "cache_read_tokens"),
        _pick(p, "cache_read_input_tokens", "cache_read_tokens"),
    )
    write = max(
        _pick(prompt_details, "cache_creation_tokens"),
        _pick(p, "cache_creation_input_tokens", "cache_creation_tokens"),
    )
    reasoning = max(
        _pick(_get(p, "completion_tokens_details"), "reasoning_tokens"),
        _pick(p, "reasoning_tokens"),
    )
    return (
        _inclusive(_pick(p, "prompt_tokens"), read, write),
        _pick(p, "completion_tokens"),
        reasoning,
        read,
        write,
    )


def _bedrock(p: object) -> _Counts:
    # Converse reports cache reads and writes beside inputTokens, not inside it.
    # cacheCreationInputTokens and thinkingTokens are Claude Code's modelUsage spelling.
    return (
        _pick(p, "inputTokens"),
        _pick(p, "outputTokens"),
        _pick(p, "reasoningTokens", "thinkingTokens"),
        _pick(p, "cacheReadInputTokens", "cacheReadInputTokenCount"),
        _pick(p, "cacheWriteInputTokens", "cacheWriteInputTokenCount", "cacheCreationInputTokens"),
    )


def _copilot(p: object) -> _Counts:
    # assistant.usage: inputTokens is the whole prompt of the call, cache reads inside.
    # The Python SDK spells the same fields in snake_case.
    read = _pick(p, "cacheReadTokens", "cache_read_tokens")
    write = _pick(p, "cacheWriteTokens", "cache_write_tokens")
    return (
        _inclusive(_pick(p, "inputTokens", "input_tokens"), read, write),
        _pick(p, "outputTokens", "output_tokens"),
        _pick(p, "reasoningTokens", "reasoning_tokens"),
        read,
        write,
    )


def _opencode(p: object) -> _Counts:
    tokens = _get(p, "tokens")
    cache = _get(tokens, "cache")
    inp = _pick(tokens, "input")
    out = _pick(tokens, "output")
    reasoning = _pick(tokens, "reasoning")
    read = _pick(cache, "read")
    write = _pick(cache, "write")
    # OpenCode reports reasoning beside ``output`` (total = input + output +
    # reasoning + cache); busd keeps the provider's own output figure.
    return inp, out, reasoning, read, write


def _gemini(p: object) -> _Counts:
    # Gemini's usageMetadata (ai.google.dev/api/generate-content#UsageMetadata):
    # promptTokenCount holds the cached share (cachedContentTokenCount) and a
    # hosted tool's prompt is beside it (toolUsePromptTokenCount); the answer
    # (candidatesTokenCount) leaves the thoughts out (thoughtsTokenCount), and
    # both are billed as output, so output is their sum with reasoning inside,
    # as for Anthropic and OpenAI. Gemini reports no cache writes.
    read = _pick(p, "cachedContentTokenCount", "cached_content_token_count")
    prompt = _pick(p, "promptTokenCount", "prompt_token_count")
    tool_prompt = _pick(p, "toolUsePromptTokenCount", "tool_use_prompt_token_count")
    thoughts = _pick(p, "thoughtsTokenCount", "thoughts_token_count")
    answer = _pick(p, "candidatesTokenCount", "candidates_token_count")
    return _inclusive(prompt + tool_prompt, read, 0), answer + thoughts, thoughts, read, 0


def _busd(p: object) -> _Counts:
    return (
        _pick(p, "input_tokens"),
        _pick(p, "output_tokens"),
        _pick(p, "reasoning_tokens"),
        _pick(p, "cache_read_tokens"),
        _pick(p, "cache_write_tokens"),
    )


_Mapper = Callable[[object], _Counts]

_MAPPERS: dict[str, _Mapper] = {
    "anthropic": _anthropic,
    "openai": _openai_chat,
    "litellm": _openai_chat,
    "openai_responses": _openai_responses,
    "bedrock": _bedrock,
    "copilot": _copilot,
    "opencode": _opencode,
    "gemini": _gemini,
    "busd": _busd,
}
_ALIASES = {
    "claude": "anthropic",
    "claude_code": "anthropic",
    "responses": "openai_responses",
    "google": "gemini",
    "vertex": "gemini",
}

PROVIDERS: tuple[str, ...] = tuple(_MAPPERS)
"""Provider names :func:`normalize_usage` accepts (plus aliases ``claude``, ``responses``,
``google``, ``vertex``)."""

_COPILOT_CAMEL = (
    "cacheReadTokens",
    "cacheWriteTokens",
    "reasoningTokens",
    "cost",
    "copilotUsage",
    "apiCallId",
    "providerCallId",
    "quotaSnapshots",
)
_COPILOT_SNAKE = (
    "cache_read_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
    "copilot_usage",
    "api_call_id",
    "provider_call_id",
    "quota_snapshots",
)


def _detect(p: object) -> str:
    """Which provider family wrote ``p``, from the keys it carries."""
    if _get(p, "tokens") is not None:
        return "opencode"
    if _has(p, *_GEMINI_KEYS):
        return "gemini"
    if _has(p, "inputTokens", "outputTokens"):
        # Bedrock never carries a plain ``cost``; Copilot's is a multiplier that must
        # not be read as USD. Bare {inputTokens, outputTokens} maps the same either way.
        if _has(p, *_COPILOT_CAMEL):
            return "copilot"
        return "bedrock"
    if _has(p, "prompt_tokens", "completion_tokens"):
        return "openai"
    if _has(p, "input_tokens", "output_tokens"):
        if _get(p, "input_tokens_details") is not None:
            return "openai_responses"
        if _has(p, "cache_read_input_tokens", "cache_creation_input_tokens"):
            return "anthropic"
        if _has(p, *_COPILOT_SNAKE):
            return "copilot"
        details = _get(p, "output_tokens_details")
        if _get(details, "reasoning_tokens") is not None:
            return "openai_responses"
    return "anthropic"


def _unwrap(payload: object) -> object:
    inner = _get(payload, "usage")
    if inner is None:
        inner = _get(payload, "usageMetadata")
        if inner is None:
            inner = _get(payload, "usage_metadata")
    if inner is not None and not _has(payload, *_PRIMARY_KEYS, *_GEMINI_KEYS):
        return inner
    if isinstance(tokens := _get(payload, "tokens"), TokenUsage):
        return tokens  # a stream.usage event
    return payload


def read_usage(payload: object, *, provider: str | None = None) -> TokenUsage | None:
    """:func:`normalize_usage`, or ``None`` for a payload of a shape busd does not know.

    Use it where "no usage" and "zero tokens" must differ: an unrecognised
    shape is counted (:func:`unrecognized_usage`) and logged, never read as
    zeros. ``None`` (no usage at all) is ``None`` too, without a report.
    """
    if payload is None:
        return None
    inner = _unwrap(payload)
    if _unknown_shape(inner):
        _report_unrecognized(inner)
        return None
    return normalize_usage(payload, provider=provider)


def normalize_usage(payload: object, *, provider: str | None = None) -> TokenUsage:
    """The token usage in a provider's payload, as a :class:`~busd.core.events.TokenUsage`.

    ``payload`` may be a dict or any object with attributes (an SDK model, a
    dataclass). A wrapper that carries the counts under ``usage`` (an
    Anthropic message, an OpenAI completion, Claude Code's ``result``,
    ``busd.run.finished``) is unwrapped, and its own cost field counts; a
    ``TokenUsage`` or a ``stream.usage`` event passes through. ``provider``
    picks the mapping (see :data:`PROVIDERS`); without it the keys present
    decide, which adapters should not rely on when they know their SDK. Bad
    content never raises: bad counts are 0 and a cost that is not a USD
    number is ``None``. Copilot's ``cost`` is a premium-request multiplier,
    not money, so it is never read as USD.

    :raises UnknownProvider: ``provider`` is not a known name.
    """
    name: str | None = None
    if provider is not None:
        name = provider.lower().replace("-", "_")
        name = _ALIASES.get(name, name)
        if name not in _MAPPERS:
            raise UnknownProvider(
                f"no usage mapping for provider {provider!r}; known: {', '.join(PROVIDERS)}"
            )
    outer = payload
    payload = _unwrap(payload)
    if _unknown_shape(payload):
        _report_unrecognized(payload)  # read as zeros here; see read_usage
    if name is None:
        name = "busd" if isinstance(payload, TokenUsage) else _detect(payload)
    inp, out, reasoning, read, write = _MAPPERS[name](payload)
    plain = name != "copilot"
    cost = _cost(payload, plain=plain)
    if cost is None and outer is not payload:
        cost = _cost(outer, plain=plain)
    return TokenUsage(
        input_tokens=inp,
        output_tokens=out,
        reasoning_tokens=reasoning if name == "opencode" else min(reasoning, out),
        cache_read_tokens=read,
        cache_write_tokens=write,
        cost_usd=cost,
    )


# -- arithmetic --------------------------------------------------------------


def merge_cumulative(a: TokenUsage, b: TokenUsage) -> TokenUsage:
    """Two snapshots of one running total: the field-wise max.

    Commutative, associative and idempotent, so snapshots can arrive in any
    order, any number of times. The cost is the larger known one; ``None``
    only when both are unknown.
    """
    if a == b:
        return a
    if a.cost_usd is None:
        cost = b.cost_usd
    elif b.cost_usd is None:
        cost = a.cost_usd
    else:
        cost = max(a.cost_usd, b.cost_usd)
    return msgspec.structs.replace(tokens_max(a, b), cost_usd=cost)


def tokens_max(a: TokenUsage, b: TokenUsage) -> TokenUsage:
    """The field-wise max of the token counts, without the cost (a context's running total)."""
    return TokenUsage(
        input_tokens=max(a.input_tokens, b.input_tokens),
        output_tokens=max(a.output_tokens, b.output_tokens),
        reasoning_tokens=max(a.reasoning_tokens, b.reasoning_tokens),
        cache_read_tokens=max(a.cache_read_tokens, b.cache_read_tokens),
        cache_write_tokens=max(a.cache_write_tokens, b.cache_write_tokens),
    )


def tokens_minus(a: TokenUsage, b: TokenUsage | None) -> TokenUsage:
    """One call of a running total: ``a`` less ``b``, each count at least 0, without the cost.

    Without ``b`` (no earlier total), ``a`` as it is.
    """
    if b is None:
        return a
    return TokenUsage(
        input_tokens=max(0, a.input_tokens - b.input_tokens),
        output_tokens=max(0, a.output_tokens - b.output_tokens),
        reasoning_tokens=max(0, a.reasoning_tokens - b.reasoning_tokens),
        cache_read_tokens=max(0, a.cache_read_tokens - b.cache_read_tokens),
        cache_write_tokens=max(0, a.cache_write_tokens - b.cache_write_tokens),
    )


def cache_hit_percent(tokens: TokenUsage) -> float | None:
    """The share of the prompt served from the cache: reads over the whole input, in percent.

    Of one call, or of a running total (a session's ``stream.usage``); ``None``
    when there was no input. The same figure ``busd.context`` gives per call.
    """
    whole = tokens.input_tokens + tokens.cache_read_tokens + tokens.cache_write_tokens
    return 100.0 * tokens.cache_read_tokens / whole if whole else None


def add_usage(a: TokenUsage, b: TokenUsage) -> TokenUsage:
    """Usage of two separate calls together: the field-wise sum.

    A known cost plus an unknown one is unknown: the sum would understate
    what was spent. The empty usage ``TokenUsage()`` (no tokens, cost
    unknown) stands for "nothing" and is the identity, so summing from it
    keeps a known cost known.
    """
    if a == _ZERO:
        return b
    if b == _ZERO:
        return a
    cost = None if a.cost_usd is None or b.cost_usd is None else a.cost_usd + b.cost_usd
    return TokenUsage(
        input_tokens=a.input_tokens + b.input_tokens,
        output_tokens=a.output_tokens + b.output_tokens,
        reasoning_tokens=a.reasoning_tokens + b.reasoning_tokens,
        cache_read_tokens=a.cache_read_tokens + b.cache_read_tokens,
        cache_write_tokens=a.cache_write_tokens + b.cache_write_tokens,
        cost_usd=cost,
    )


# -- the ledger --------------------------------------------------------------


class _Tally:
    """Mutable counts of one turn or one running total (no allocation per record)."""

    __slots__ = ("cache_read", "cache_write", "cost", "input", "output", "reasoning")

    def __init__(self) -> None:
        self.input = 0
        self.output = 0
        self.reasoning = 0
        self.cache_read = 0
        self.cache_write = 0
        self.cost: float | None = None

    def bump(self, di: int, do: int, dr: int, dcr: int, dcw: int, dcost: float | None) -> None:
        self.input += di
        self.output += do
        self.reasoning += dr
        self.cache_read += dcr
        self.cache_write += dcw
        if dcost is not None:
            self.cost = dcost if self.cost is None else self.cost + dcost

    def snapshot(self) -> TokenUsage:
        return TokenUsage(
            input_tokens=self.input,
            output_tokens=self.output,
            reasoning_tokens=self.reasoning,
            cache_read_tokens=self.cache_read,
            cache_write_tokens=self.cache_write,
            cost_usd=self.cost,
        )


class _Turn(_Tally):
    __slots__ = ("run_id",)

    def __init__(self, run_id: str | None) -> None:
        super().__init__()
        self.run_id = run_id


class _Session:
    __slots__ = ("forgotten", "total", "turns")

    def __init__(self) -> None:
        self.turns: dict[str, _Turn] = {}
        self.forgotten: dict[str, None] = {}
        self.total = _Tally()


@dataclass(frozen=True, slots=True)
class UsageLedgerStatistics:
    """A snapshot of what a :class:`UsageLedger` holds and has seen."""

    sessions: int
    runs: int
    turns: int
    """Turns still held (the last ``turns_per_session`` of each session)."""
    records: int
    unchanged: int
    """Records that changed nothing: repeated or older cumulative snapshots."""
    late: int
    """Records for turns already forgotten; ignored."""
    forgotten_turns: int


def _nonneg(n: int) -> int:
    return n if n > 0 else 0


class UsageLedger:
    """Per-turn usage and running totals per run and per session.

    A *turn* is one model call (its ``turn_id`` is typically the provider's
    message id). A new turn starts from zero; a session's or run's total is
    the sum over its turns of each turn's latest value, which is how both
    OpenCode's "tokens restart at the next message" and Claude Code's several
    model calls in one user turn add up. Totals only grow.

    Costs: a turn's cost is unknown until a record carries one, and a total
    adds up the turns that have a cost; it is ``None`` only while none has.
    (Unlike :func:`add_usage`, a running total never falls back to unknown,
    because counts on the bus are monotonic.)

    Memory is bounded per session: only the last ``turns_per_session`` turns
    are held, older ones stay folded into the totals, and records that still
    arrive for them are ignored and counted as ``late`` (the ids of as many
    again forgotten turns are remembered for that). Call
    :meth:`forget_session` and :meth:`forget_run` when those are over.
    """

    __slots__ = ("_forgotten", "_keep", "_late", "_records", "_runs", "_sessions", "_unchanged")

    def __init__(self, *, turns_per_session: int = 256) -> None:
        if turns_per_session < 1:
            raise ValueError("turns_per_session must be at least 1")
        self._keep = turns_per_session
        self._sessions: dict[str, _Session] = {}
        self._runs: dict[str, _Tally] = {}
        self._records = 0
        self._unchanged = 0
        self._late = 0
        self._forgotten = 0

    def record(
        self,
        *,
        session_id: str,
        run_id: str | None,
        turn_id: str,
        usage: TokenUsage,
        cumulative: bool,
    ) -> bool:
        """Take one usage report for ``turn_id``; return whether any total changed.

        ``cumulative=True``: ``usage`` is the turn's count so far (merged with
        max, so repeats and stale snapshots are no-ops). ``cumulative=False``:
        ``usage`` is an increment, added once per call; delivering it twice
        counts it twice. A turn belongs to the run of its first record.
        """
        self._records += 1
        session = self._sessions.get(session_id)
        if session is None:
            session = self._sessions[session_id] = _Session()
        turn = session.turns.get(turn_id)
        if turn is None:
            if turn_id in session.forgotten:
                self._late += 1
                return False
            turn = session.turns[turn_id] = _Turn(run_id)
            if len(session.turns) > self._keep:
                self._forget_oldest(session)

        ui = _nonneg(usage.input_tokens)
        uo = _nonneg(usage.output_tokens)
        ur = _nonneg(usage.reasoning_tokens)
        ucr = _nonneg(usage.cache_read_tokens)
        ucw = _nonneg(usage.cache_write_tokens)
        ucost = _money(usage.cost_usd)
        dcost: float | None = None
        if cumulative:
            di = _nonneg(ui - turn.input)
            do = _nonneg(uo - turn.output)
            dr = _nonneg(ur - turn.reasoning)
            dcr = _nonneg(ucr - turn.cache_read)
            dcw = _nonneg(ucw - turn.cache_write)
            if ucost is not None:
                if turn.cost is None:
                    dcost = ucost
                elif ucost > turn.cost:
                    dcost = ucost - turn.cost
        else:
            di, do, dr, dcr, dcw = ui, uo, ur, ucr, ucw
            if ucost is not None and (turn.cost is None or ucost > 0):
                dcost = ucost
        if not (di or do or dr or dcr or dcw) and dcost is None:
            self._unchanged += 1
            return False

        turn.bump(di, do, dr, dcr, dcw, dcost)
        session.total.bump(di, do, dr, dcr, dcw, dcost)
        if turn.run_id is not None:
            run = self._runs.get(turn.run_id)
            if run is None:
                run = self._runs[turn.run_id] = _Tally()
            run.bump(di, do, dr, dcr, dcw, dcost)
        return True

    def _forget_oldest(self, session: _Session) -> None:
        oldest = next(iter(session.turns))
        del session.turns[oldest]
        session.forgotten[oldest] = None
        if len(session.forgotten) > self._keep:
            del session.forgotten[next(iter(session.forgotten))]
        self._forgotten += 1

    def turn(self, session_id: str, turn_id: str) -> TokenUsage:
        """The usage of one turn so far (empty if unknown or forgotten)."""
        session = self._sessions.get(session_id)
        turn = None if session is None else session.turns.get(turn_id)
        return _ZERO if turn is None else turn.snapshot()

    def run_total(self, run_id: str) -> TokenUsage:
        """Everything recorded for the turns of ``run_id`` (empty if unknown)."""
        run = self._runs.get(run_id)
        return _ZERO if run is None else run.snapshot()

    def session_total(self, session_id: str) -> TokenUsage:
        """Everything recorded for ``session_id`` (empty if unknown)."""
        session = self._sessions.get(session_id)
        return _ZERO if session is None else session.total.snapshot()

    def forget_session(self, session_id: str) -> None:
        """Drop a finished session's turns and total (its runs keep their totals)."""
        self._sessions.pop(session_id, None)

    def forget_run(self, run_id: str) -> None:
        """Drop a finished run's total."""
        self._runs.pop(run_id, None)

    def statistics(self) -> UsageLedgerStatistics:
        return UsageLedgerStatistics(
            sessions=len(self._sessions),
            runs=len(self._runs),
            turns=sum(len(s.turns) for s in self._sessions.values()),
            records=self._records,
            unchanged=self._unchanged,
            late=self._late,
            forgotten_turns=self._forgotten,
        )
