"""The units of the journal's retention limits: ``30d``, ``12h``; ``1GiB``, ``500MiB``."""

from __future__ import annotations

import re

__all__ = ["parse_duration", "parse_size"]

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)?\s*$", re.IGNORECASE)
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)b?\s*$", re.IGNORECASE)


def parse_duration(text: str) -> float:
    """``30d``, ``12h``, ``90m``, ``2w``, ``3600`` (seconds) -> seconds."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a duration such as 30d, 12h, 90m or 3600")
    seconds = float(match[1]) * _DURATION_UNITS[(match[2] or "s").lower()]
    return seconds


def parse_size(text: str) -> int:
    """``1GiB``, ``500MiB``, ``2G``, ``1048576`` -> bytes (K, M, G, T are powers of 1024)."""
    match = _SIZE.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a size such as 1GiB, 500MiB or 1048576")
    prefix = match[2].lower()
    size = float(match[1]) * 1024 ** ("kmgt".index(prefix) + 1 if prefix else 0)
    return int(size)
