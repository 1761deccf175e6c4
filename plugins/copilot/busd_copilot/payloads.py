"""Readers for Copilot's payloads, which are untrusted and come in two spellings.

Shared by the translator and its state (:mod:`busd_copilot.state`): each
reader returns ``None`` or an empty value instead of raising, whatever a
field holds, and looks a field up by its wire (camelCase) name, then by the
Python SDK's snake_case one. Also here: event timestamps and how long
something took between two of them, tool arguments as a JSON object, and the
bounded memory of ids seen before.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from enum import Enum
from typing import Any, Final
from uuid import UUID

from busd import as_mapping

REMEMBER: Final = 4096
"""Ids remembered for dropping duplicates (events, finished parts and tools, calls)."""

_INT64: Final = 2**63
_UPPER = re.compile(r"(?<!^)(?=[A-Z])")


@functools.cache
def _snake(key: str) -> str:
    return _UPPER.sub("_", key).lower()


def field(d: Mapping[str, Any], key: str) -> Any:
    """``d[key]`` by its wire (camelCase) name, else by its Python (snake_case) one."""
    value = d.get(key)
    if value is None:
        value = d.get(_snake(key))
    return value


def as_text(value: object) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, Enum):
        return as_text(value.value)
    if isinstance(value, UUID):
        return str(value)
    return None


def field_str(d: Mapping[str, Any] | None, key: str) -> str | None:
    return None if d is None else as_text(field(d, key))


def field_int(d: Mapping[str, Any] | None, key: str) -> int | None:
    """A whole number that fits 64 bits (wider ones cannot go on the wire), else ``None``."""
    value = None if d is None else field(d, key)
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and -_INT64 <= value < _INT64:
        return value
    return None


def field_map(d: Mapping[str, Any] | None, key: str) -> Mapping[str, Any] | None:
    value = None if d is None else field(d, key)
    return value if isinstance(value, Mapping) else None


def wire_mapping(raw: object) -> Mapping[str, Any]:
    """A raw event as a mapping; the Copilot SDK's objects by their own ``to_dict()``."""
    if isinstance(raw, Mapping):
        return raw
    to_dict = getattr(raw, "to_dict", None)
    if callable(to_dict):
        result = to_dict()
        if isinstance(result, Mapping):
            return result
    return as_mapping(raw)


def timestamp_of(value: object) -> datetime | None:
    """An event's ``timestamp`` (ISO 8601 on the wire, ``datetime`` in the SDK), tz-aware."""
    if isinstance(value, str):
        try:
            when = datetime.fromisoformat(value)
        except ValueError:
            return None
    elif isinstance(value, datetime):
        when = value
    else:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


Stamp = tuple[datetime | None, float]
"""When something happened: the SDK's timestamp (if any) and the ``now`` it was fed at."""


def elapsed(start: Stamp, end: Stamp) -> float:
    """Seconds between two stamps: by the SDK's timestamps when both have one."""
    if start[0] is not None and end[0] is not None:
        seconds = (end[0] - start[0]).total_seconds()
    else:
        seconds = end[1] - start[1]
    return seconds if seconds > 0 else 0.0


def as_tool_input(value: object) -> dict[str, Any]:
    """Tool arguments as a JSON object: ``{}`` when none, a free-form input under ``input``."""
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, str):
        if not value.strip():
            return {}
        try:
            parsed = json.loads(value)
        except ValueError:
            return {"input": value}
        return dict(parsed) if isinstance(parsed, dict) else {"input": parsed}
    return {"input": value}


def remember(seen: dict[str, None], key: str) -> None:
    seen[key] = None
    if len(seen) > REMEMBER:
        del seen[next(iter(seen))]
