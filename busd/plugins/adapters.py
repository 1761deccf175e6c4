"""The adapter contract: how an agent SDK's raw stream becomes catalog events.

An :class:`Adapter` is a named factory of :class:`Translator`\\ s, one per
session (or per stream). A translator is a deterministic state machine: it is
fed raw SDK events (dicts from JSON, or the SDK's own objects) together with
the time, and returns zero or more :class:`Emitted` catalog events; at the end
of the stream :meth:`Translator.finish` returns what the stream implies but
never said (the last ``stream.text.complete``, a ``stream.session.idle``).
Given the same input and the same ``now`` values it always says the same
thing, so recorded streams are its tests.

Translators never raise on what the SDK sends: :meth:`Translator.feed`
isolates the subclass's :meth:`Translator.translate`, and unknown or
malformed raw events are counted and reported once per kind, never per
event, while the stream carries on.
"""

from __future__ import annotations

import dataclasses
import logging
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar, Protocol, runtime_checkable

import msgspec

from ..core.events import Event

__all__ = [
    "Adapter",
    "Emitted",
    "Translator",
    "TranslatorStatistics",
    "as_mapping",
]

logger = logging.getLogger("busd.adapters")


class Emitted(msgspec.Struct, frozen=True):
    """One catalog event a translator produced, with where it belongs.

    ``session_id`` defaults to the translator's session; ``agent_id`` names
    the sub-agent that produced it, or ``parent_tool_call_id`` the tool call
    that spawned that sub-agent (the correlation service resolves it).
    """

    event: Event
    session_id: str | None = None
    agent_id: str | None = None
    parent_tool_call_id: str | None = None


class TranslatorStatistics(msgspec.Struct, frozen=True, kw_only=True):
    raw_events: int
    emitted: int
    unknown: dict[str, int]
    malformed: dict[str, int]
    duplicates: int


class Translator(ABC):
    """Per-stream state machine from raw SDK events to catalog events.

    Subclasses implement :meth:`translate` (and usually :meth:`close`); callers
    use :meth:`feed` and :meth:`finish`, which never raise.
    """

    usage_spans_runs: ClassVar[bool] = False
    """Whether the SDK's running totals already include the earlier runs of a
    resumed session (Claude Code restores them on ``--resume``). When not, the
    daemon adds what a continued session had before the run (docs/runs.md)."""

    cost_spans_runs: bool = False
    """Whether the cost this stream reports already includes the earlier runs
    of a continued session while its token counts are its own (ACP agents
    after ``session/load``). The daemon then takes that cost as the session's
    and adds only the counts; a translator sets it when it learns so."""

    def __init__(self, *, session_id: str | None = None, adapter: str = "") -> None:
        self.session_id = session_id
        self.adapter = adapter or type(self).__name__
        self._raw_events = 0
        self._emitted = 0
        self._unknown: dict[str, int] = {}
        self._malformed: dict[str, int] = {}
        self._duplicates = 0
        self._finished = False

    # -- what callers use -------------------------------------------------------

    def feed(self, raw: object, now: float) -> list[Emitted]:
        """Translate one raw SDK event seen at ``now``; bad input is counted, not raised."""
        self._raw_events += 1
        try:
            out = self.translate(raw, now)
        except Exception as exc:  # an SDK shape we did not foresee: keep going
            self.malformed(_kind_of(raw), f"{type(exc).__name__}: {exc}")
            return []
        self._emitted += len(out)
        return out

    def finish(self, now: float) -> list[Emitted]:
        """What the end of the stream implies (idempotent: a second call returns [])."""
        if self._finished:
            return []
        self._finished = True
        try:
            out = self.close(now)
        except Exception as exc:
            self.malformed("<finish>", f"{type(exc).__name__}: {exc}")
            return []
        self._emitted += len(out)
        return out

    def statistics(self) -> TranslatorStatistics:
        return TranslatorStatistics(
            raw_events=self._raw_events,
            emitted=self._emitted,
            unknown=dict(self._unknown),
            malformed=dict(self._malformed),
            duplicates=self._duplicates,
        )

    # -- what subclasses implement --------------------------------------------------

    @abstractmethod
    def translate(self, raw: object, now: float) -> list[Emitted]:
        """Events for one raw SDK event; may raise on malformed input (``feed`` counts it)."""

    def close(self, now: float) -> list[Emitted]:
        """Events the end of the stream implies; the default implies nothing."""
        return []

    # -- helpers for subclasses ---------------------------------------------------------

    def emit(
        self,
        event: Event,
        *,
        session_id: str | None = None,
        agent_id: str | None = None,
        parent_tool_call_id: str | None = None,
    ) -> Emitted:
        return Emitted(
            event,
            session_id if session_id is not None else self.session_id,
            agent_id,
            parent_tool_call_id,
        )

    def unknown(self, kind: str) -> None:
        """A raw event type this translator does not handle: counted, warned about once."""
        seen = self._unknown.get(kind, 0)
        self._unknown[kind] = seen + 1
        if not seen:
            logger.warning("%s: ignoring unknown raw event kind %r", self.adapter, kind)

    def malformed(self, kind: str, why: str) -> None:
        """A raw event that does not have the shape its kind promises."""
        seen = self._malformed.get(kind, 0)
        self._malformed[kind] = seen + 1
        if not seen:
            logger.warning("%s: malformed %r event (%s); skipped", self.adapter, kind, why)

    def duplicate(self) -> None:
        """A raw event seen before (same id), dropped."""
        self._duplicates += 1


@runtime_checkable
class Adapter(Protocol):
    """A named source of translators; plugins return these from ``busd_adapters``."""

    name: str
    """The name ``ingest`` frames and ``busd ingest --sdk`` use (e.g. ``"anthropic"``)."""

    def translator(self, *, session_id: str | None = None) -> Translator:
        """A fresh translator for one stream."""
        ...


def as_mapping(raw: object) -> Mapping[str, Any]:
    """A raw SDK event as a mapping: dicts as they are, SDK objects dumped.

    Accepts pydantic models (``model_dump``), objects with ``to_dict()``,
    dataclasses, msgspec Structs and mappings; raises ``TypeError`` for
    anything else (``feed`` counts it).
    """
    if isinstance(raw, Mapping):
        return raw
    # The SDK's own wire form first: pydantic's model_dump, or the to_dict() of
    # generated dataclasses (whose class-level discriminators asdict() drops).
    for method in ("model_dump", "to_dict"):
        dump = getattr(raw, method, None)
        if callable(dump):
            result = dump()
            if isinstance(result, Mapping):
                return result
    if dataclasses.is_dataclass(raw) and not isinstance(raw, type):
        return dataclasses.asdict(raw)
    if isinstance(raw, msgspec.Struct):
        built = msgspec.to_builtins(raw)
        if isinstance(built, Mapping):
            return built
    raise TypeError(f"expected a mapping or an SDK object, got {type(raw).__name__}")


def _kind_of(raw: object) -> str:
    try:
        kind = as_mapping(raw).get("type")
    except TypeError:
        return type(raw).__name__
    return kind if isinstance(kind, str) else "<no type>"
