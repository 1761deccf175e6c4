"""Streamed text kept for an estimate, in bounded memory.

The context tracker estimates a call's output from its text deltas only
when the call is cut short (no usage came). Keeping every delta until
then let a message that streams for hours without a turn's end hold all
of its text: the daemon's memory grew with it, about 160 bytes an event
in a benchmark's endless message. Here a message's text is estimated every
``FOLD_CHARS`` (as :mod:`.stats` estimates its lanes), so what is kept is
a count and at most that much text; past ``MAX_OPEN`` open messages the
oldest is folded into one count. Larger stretches cost more an event, not
less (64 KiB ones made the daemon about 12% dearer in
``contrib/bench/bench_aging.py``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from .estimate import estimate_tokens

__all__ = ["FOLD_CHARS", "MAX_OPEN", "PartialTexts"]

FOLD_CHARS: Final = 4096
"""Text of one message estimated at least this often (chunks this long count as one pass)."""
MAX_OPEN: Final = 256
"""Open messages kept apart; an older one is folded into the shared count."""


class _Partial:
    __slots__ = ("chars", "folded", "texts")

    def __init__(self) -> None:
        self.folded = 0  # tokens of the text already estimated
        self.texts: list[str] = []  # text not estimated yet
        self.chars = 0

    def tokens(self) -> int:
        return self.folded + (estimate_tokens("".join(self.texts)) if self.texts else 0)

    def state(self) -> tuple[int, str]:
        return self.folded, "".join(self.texts)


class PartialTexts:
    """The streamed text of a call's open messages: ``tokens()`` estimates all of it."""

    __slots__ = ("_folded", "_messages")

    def __init__(self) -> None:
        self._messages: dict[str, _Partial] = {}
        self._folded = 0  # messages let go past MAX_OPEN

    def add(self, message_id: str, texts: Iterable[str]) -> None:
        partial = self._messages.get(message_id)
        if partial is None:
            if len(self._messages) >= MAX_OPEN:
                oldest = next(iter(self._messages))
                self._folded += self._messages.pop(oldest).tokens()
            partial = self._messages[message_id] = _Partial()
        for text in texts:  # folded as it comes: a run of deltas is each delta in turn
            partial.texts.append(text)
            partial.chars += len(text)
            if partial.chars >= FOLD_CHARS:
                partial.folded = partial.tokens()
                partial.texts.clear()
                partial.chars = 0

    def discard(self, message_id: str) -> None:
        """The message completed: its full text is counted elsewhere."""
        self._messages.pop(message_id, None)

    def clear(self) -> None:
        self._messages.clear()
        self._folded = 0

    def tokens(self) -> int:
        return self._folded + sum(partial.tokens() for partial in self._messages.values())

    def __eq__(self, other: object) -> bool:
        """The same text kept and the same counts (a run of deltas is each delta in turn)."""
        if not isinstance(other, PartialTexts):
            return NotImplemented
        mine = {k: v.state() for k, v in self._messages.items()}
        theirs = {k: v.state() for k, v in other._messages.items()}
        return (self._folded, list(mine.items())) == (other._folded, list(theirs.items()))

    __hash__ = None  # type: ignore[assignment]

    def held_chars(self) -> int:
        """Characters of text kept, not yet estimated (bounded by ``FOLD_CHARS`` a message)."""
        return sum(partial.chars for partial in self._messages.values())
