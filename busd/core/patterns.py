"""NATS-style subject patterns over dotted event type names.

``*`` matches exactly one token and ``>`` matches one or more trailing
tokens (so ``stream.>`` matches ``stream.text.delta`` but not ``stream``).
A name without wildcards is an exact type.
"""

from __future__ import annotations

from .errors import InvalidPattern

__all__ = ["Pattern", "is_pattern"]


def is_pattern(text: str) -> bool:
    """Whether ``text`` contains a wildcard token (and so is not an exact type)."""
    return "*" in text or ">" in text


class Pattern:
    """A validated, compiled pattern; cheap to match against many type names."""

    __slots__ = ("_tail", "_tokens", "text")

    def __init__(self, text: str) -> None:
        if not isinstance(text, str) or not text:
            raise InvalidPattern(f"a pattern must be a non-empty string, not {text!r}")
        tokens = text.split(".")
        for i, token in enumerate(tokens):
            if not token:
                raise InvalidPattern(f"empty token in pattern {text!r}")
            if token == ">" and i != len(tokens) - 1:
                raise InvalidPattern(f"'>' may only be the last token, in {text!r}")
            if token not in ("*", ">") and ("*" in token or ">" in token):
                raise InvalidPattern(f"wildcards must be whole tokens, in {text!r}")
        self.text = text
        self._tail = tokens[-1] == ">"
        self._tokens = tuple(tokens[:-1] if self._tail else tokens)

    def matches(self, name: str) -> bool:
        parts = name.split(".")
        tokens = self._tokens
        if self._tail:
            if len(parts) <= len(tokens):
                return False
        elif len(parts) != len(tokens):
            return False
        return all(t == "*" or t == p for t, p in zip(tokens, parts, strict=False))

    def __repr__(self) -> str:
        return f"Pattern({self.text!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Pattern) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)
