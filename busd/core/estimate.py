"""Token estimates for text no provider has counted (yet).

These numbers are a fallback: accounting uses them only where no
authoritative count exists, and flags every figure they feed as estimated.
They must be cheap (no tokenizer tables), deterministic and monotone enough
that a running sum of per-delta estimates tracks the real count.

Why not ``len(text) / 4``: that rule is fine for English prose but off by a
factor of three or more elsewhere. Indented code spends most of its
characters on blanks that a BPE tokenizer folds into a handful of tokens, and
Chinese or Japanese text costs about one token per character, four times
what chars/4 says. So the text is cut into the pieces a BPE tokenizer
typically keeps apart, and the pieces are counted:

- runs of ASCII letters (and ``_``), at most 6 to a piece: common words are
  one token, long words and identifiers two or more;
- digits, at most 3 to a piece (how current tokenizers split numbers);
- runs of other alphabetic scripts (accented Latin, Greek, Cyrillic, Hebrew,
  Arabic), at most 4 to a piece;
- a line break with the indentation after it, or a run of 2+ blanks: one;
- ASCII punctuation, at most 2 to a piece (``()``, ``->``, ``",``);
- any other character (CJK, kana, hangul, emoji, symbols): one each.

A single blank between words costs nothing: tokenizers glue it to the next
word. Calibration: on the recorded Anthropic reply in the SDK fixtures
(30 real output tokens, 107 characters) this counts 29 where chars/4 says 27.

The definition is the regex ``_PIECE`` (:func:`_reference_estimate`). Matching
it costs ~130 ns per piece, over a third of the daemon's CPU per event, so
:func:`estimate_tokens` counts the same pieces without matching them: one
byte of character classes per character, then a few whole-text passes in C
(``bytes.translate``, big-integer bit operations, ``bytes.count``): 3.5-5.5x
faster on 4 KB of prose, code, Markdown or JSON, about 3x with non-ASCII mixed
in (``contrib/bench/bench_estimator.py``). The count is exactly the regex's
for every input (property-tested); short texts and text that is not valid
UTF-8 (lone surrogates) take the regex itself.
"""

from __future__ import annotations

import contextlib
import re

import msgspec

__all__ = ["estimate_json_tokens", "estimate_tokens"]

_PIECE = re.compile(
    # A single blank before a piece is matched with it (it costs nothing
    # either way): the count is the same as without the prefix, and the
    # engine no longer tries every branch at each blank, ~35% faster.
    r"[ \t]?(?:"
    r"[A-Za-z_]{1,6}"
    r"|[0-9]{1,3}"
    r"|[!-/:-@\[-`{-~]{1,2}"
    r"|[\u00c0-\u06ff]{1,4}"
    r"|[^\x00-\x7f]"
    r")"
    r"|[\r\n]+[ \t]*"
    r"|[ \t]{2,}"
)

_json_encode = msgspec.json.Encoder(enc_hook=str).encode

# One class byte per character (UTF-8 lead byte or ASCII byte). Bits:
_LETTER = 0x01  # [A-Za-z_]: runs of up to 6
_DIGIT = 0x02  # runs of up to 3
_PUNCT = 0x04  # ASCII punctuation but `_`: runs of up to 2
_BREAK = 0x08  # \r \n: a run is one piece (with the blanks after it)
_BLANK = 0x10  # space, tab
_BLANK_OR_BREAK = 0x20  # set with _BLANK and with _BREAK
_OTHER = 0x40  # alone: one piece per character; with _LETTER: `_`
_SCRIPT = 0x80  # U+00C0-U+06FF: runs of up to 4
_UNDERSCORE = _LETTER | _OTHER
# Control characters are 0: no piece, and they end runs.
_RUN_CLASSES = _LETTER | _DIGIT | _PUNCT | _BREAK | _SCRIPT  # a run starts a piece
_CUT_CLASSES = _LETTER | _DIGIT | _PUNCT | _SCRIPT  # long runs are cut by a cap


def _class_of_byte(byte: int) -> int:
    if byte >= 0x80:  # UTF-8 lead byte (continuation bytes are deleted)
        return _SCRIPT if 0xC3 <= byte <= 0xDB else _OTHER  # U+00C0-U+06FF, else not
    char = chr(byte)
    if char == "_":
        return _UNDERSCORE
    if char.isalpha():
        return _LETTER
    if char.isdigit():
        return _DIGIT
    if char in "\r\n":
        return _BREAK | _BLANK_OR_BREAK
    if char in " \t":
        return _BLANK | _BLANK_OR_BREAK
    return _PUNCT if "!" <= char <= "~" else 0


_CLASSES = bytes(_class_of_byte(byte) for byte in range(256))
_UTF8_CONTINUATION = bytes(range(0x80, 0xC0))
_SHORT = 48  # below this many characters the regex is as fast: fixed costs dominate
_MASK_CACHE_MAX = 1 << 16  # keep masks for texts up to 64 KiB (6 ints of that size)
# (size, masks): one object, so that a thread never pairs a size with other masks.
_cached_masks: tuple[int, tuple[int, ...]] = (0, ())


# Chunks estimated lately: the accountant's trackers estimate the same 4 KiB
# chunk of a stream more than once (the session's and the run's lanes, the
# context's message), each from its own join. Bounded in count and in size
# (a whole message or a tool's output is not kept); the oldest goes first, since a
# big frame's settle has each tracker estimate several chunks in turn, and the last
# tracker asks for the first chunk after the first tracker's later ones. A dict's
# operations are atomic, so threads may share it.
_recent: dict[str, int] = {}
_RECENT_MAX = 16
_RECENT_CHARS = 16_384


def estimate_tokens(text: str) -> int:
    """A deterministic O(n) token estimate: 0 for ``""``, at least 1 otherwise."""
    if len(text) < _SHORT:
        return _reference_estimate(text)
    if len(text) > _RECENT_CHARS:
        return _fast_estimate(text)
    count = _recent.get(text)
    if count is None:
        if len(_recent) >= _RECENT_MAX:
            # The oldest; a thread may change the dict meanwhile, and then it stays.
            with contextlib.suppress(KeyError, RuntimeError, StopIteration):
                del _recent[next(iter(_recent))]
        count = _recent[text] = _fast_estimate(text)
    return count


def _fast_estimate(text: str) -> int:
    """:func:`_reference_estimate`'s count, without matching the pieces one by one."""
    ascii_only = text.isascii()
    if ascii_only:
        classes = text.encode().translate(_CLASSES)
    else:
        try:
            classes = text.encode().translate(_CLASSES, _UTF8_CONTINUATION)
        except UnicodeEncodeError:  # lone surrogates: one piece each, to the regex
            return _reference_estimate(text)
    if not classes:
        return 0
    return _count_pieces(classes, ascii_only) or 1


def _reference_estimate(text: str) -> int:
    """The definition: count the matches of ``_PIECE``."""
    if not text:
        return 0
    return _PIECE.subn("", text)[1] or 1  # counts without building the list of pieces


def _count_pieces(classes: bytes, ascii_only: bool) -> int:
    """Count ``_PIECE``'s matches in a text given as one class byte per character.

    The class bytes, read as one little-endian integer, turn per-character
    questions about neighbours into shifts and masks over the whole text.
    A run of L characters whose pieces hold at most k is ceil(L/k) pieces:
    one for the run's start, plus floor((L-1)/k) for the rest, which
    ``bytes.count`` gives (non-overlapping) once each run's first byte is 0.
    """
    n = len(classes)
    run_mask, cut_mask, blank_mask, ones, even, odd = _masks_for(n)
    x = int.from_bytes(classes, "little")
    # The regex takes a `_` after punctuation into the punctuation piece when
    # that piece has room: after an odd-length punctuation run. Such a `_` is
    # then no letter. Parity with a carry: adding a run's lowest bit to its
    # 0xFF bytes carries into the byte after it; a run that starts on an even
    # character has odd length iff that byte is odd, and the other way round.
    if _UNDERSCORE in classes:
        underscores = (x >> 6) & x & ones
        punct = (x >> 2) & ones
        if underscores & (punct << 8):
            starts = punct ^ (punct & (punct << 8))
            even_starts = starts & even
            dense = punct * 0xFF
            after_odd_runs = ((dense + even_starts) & odd) | (
                (dense + (starts ^ even_starts)) & even
            )
            x ^= after_odd_runs & underscores  # clears their _LETTER bit
    # Byte i of `same` has a class bit iff characters i-1 and i share it.
    same = x & (x << 8)
    run_starts = (x ^ same) & run_mask
    # A run of 2+ blanks is one piece, but not right after a line break (whose
    # piece takes it): count each second blank whose character two back is
    # neither a blank nor a line break.
    blank_pairs = same & blank_mask
    blank_runs = blank_pairs ^ (blank_pairs & (x << 15))  # bit 0x20 of byte i-2 -> 0x10 of i
    pieces = (run_starts | blank_runs).bit_count()
    rest = (same & cut_mask).to_bytes(n, "little")
    pieces += rest.count(b"\x01" * 6) + rest.count(b"\x02" * 3) + rest.count(b"\x04" * 2)
    if not ascii_only:
        pieces += classes.count(_OTHER)
        if _SCRIPT in classes:
            pieces += rest.count(b"\x80" * 4)
    return pieces


def _masks_for(n: int) -> tuple[int, ...]:
    """Integers of at least ``n`` bytes: the byte patterns each step keeps."""
    global _cached_masks
    cached_size, cached = _cached_masks
    if n <= cached_size:
        return cached
    size = 1 << max(12, (n - 1).bit_length())
    masks = tuple(
        int.from_bytes(pattern * (size // len(pattern)), "little")
        for pattern in (
            bytes([_RUN_CLASSES]),
            bytes([_CUT_CLASSES]),
            bytes([_BLANK]),
            b"\x01",
            b"\x01\x00",  # even characters
            b"\x00\x01",  # odd characters
        )
    )
    if size <= _MASK_CACHE_MAX:
        _cached_masks = (size, masks)
    return masks


def estimate_json_tokens(value: object) -> int:
    """Estimate ``value`` as a model sees it: compact JSON (tool inputs, outputs, specs).

    A string is estimated as the text it is (tool outputs are sent verbatim,
    not JSON-quoted); objects msgspec cannot encode count as their ``str()``.
    """
    if isinstance(value, str):
        return estimate_tokens(value)
    return estimate_tokens(_json_encode(value).decode())
