from __future__ import annotations

import random
import re
import string
from pathlib import Path

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from busd.core import estimate
from busd.core.estimate import (
    _fast_estimate,
    _reference_estimate,
    estimate_json_tokens,
    estimate_tokens,
)

# The recorded Anthropic reply in the shared SDK fixtures: 30 real output tokens.
RECORDED_REPLY = (
    "Hello! I'm doing well, thank you for asking. How are you doing today? "
    "Is there anything I can help you with?"
)


def test_empty_text_is_zero_tokens() -> None:
    assert estimate_tokens("") == 0


@given(st.text(min_size=1))
def test_any_non_empty_text_is_at_least_one_token(text: str) -> None:
    assert estimate_tokens(text) >= 1


@given(st.text(), st.text())
def test_estimating_in_pieces_is_within_one_token_per_cut(a: str, b: str) -> None:
    # Streaming stats add per-delta estimates: a cut may split or join one piece, no more.
    assert abs(estimate_tokens(a) + estimate_tokens(b) - estimate_tokens(a + b)) <= 1


# The pieces as the module docs define them, one branch per kind of piece: the
# shipped pattern is rearranged for speed and must count exactly the same.
REFERENCE = re.compile(
    r"[A-Za-z_]{1,6}"
    r"|[0-9]{1,3}"
    r"|[\u00c0-\u06ff]{1,4}"
    r"|[\r\n]+[ \t]*"
    r"|[ \t]{2,}"
    r"|[!-/:-@\[-`{-~]{1,2}"
    r"|[^\x00-\x7f]"
)
TRICKY = st.text(alphabet=st.sampled_from("aZ_09 \t\r\n.,(-\x01\x7féЖ中😀"))


@given(st.one_of(TRICKY, st.text()))
def test_the_fast_pattern_counts_exactly_the_documented_pieces(text: str) -> None:
    assert estimate_tokens(text) == (len(REFERENCE.findall(text)) or 1 if text else 0)


def test_english_prose_lands_near_the_real_count() -> None:
    assert 27 <= estimate_tokens(RECORDED_REPLY) <= 33


def test_cjk_costs_about_a_token_per_character_not_a_quarter() -> None:
    text = "你好，世界。今天天气很好。"
    assert estimate_tokens(text) == len(text)
    assert estimate_tokens(text) > len(text) / 4 * 3


def test_indentation_costs_the_same_however_deep() -> None:
    def block(indent: int) -> str:
        return "def f(x):\n" + "".join(f"{' ' * indent}y = x + {i}\n" for i in range(20))

    assert estimate_tokens(block(16)) == estimate_tokens(block(4))
    assert estimate_tokens(block(16)) < len(block(16)) / 4


def test_numbers_split_in_groups_of_three_digits() -> None:
    assert estimate_tokens("1234567") == 3


def test_long_words_cost_more_than_short_ones() -> None:
    assert estimate_tokens("cat") == 1
    assert estimate_tokens("internationalization") > 1


def test_json_is_estimated_in_its_compact_encoding() -> None:
    value = {"path": "/tmp/x.py", "lines": [1, 2, 3], "recursive": True}
    assert estimate_json_tokens(value) == estimate_tokens(msgspec.json.encode(value).decode())


def test_json_of_a_string_is_the_string_itself() -> None:
    assert estimate_json_tokens("line one\nline two") == estimate_tokens("line one\nline two")


def test_json_of_an_unencodable_value_falls_back_to_its_text() -> None:
    class Opaque:
        def __str__(self) -> str:
            return "opaque thing"

    assert estimate_json_tokens({"x": Opaque()}) == estimate_tokens('{"x":"opaque thing"}')


# The fast path (`_fast_estimate`, used from `_SHORT` characters on) must count
# exactly what the regex counts, for every input. Texts are built from runs of
# one character class each, of every length around the caps (2, 3, 4 and 6),
# so that cuts, run starts and the classes' borders all get exercised.
CLASSES = {
    "letters": string.ascii_letters,
    "underscores": "_",  # a letter, but taken into a punctuation piece that has room
    "digits": string.digits,
    "punctuation": string.punctuation,
    "blanks": " \t",
    "line breaks": "\r\n",
    "controls": "\x00\x01\x08\x0b\x0c\x0e\x1b\x1f\x7f",  # no piece, end runs
    "scripts": "\u00c0\u00d7\u00e9\u00ff\u0100\u017e\u03a9\u03b1\u0416\u044f\u05d0\u0634\u06ff",
    "other non-ASCII": "\x80\xa0\xa9\xb5\xbf\u0700\u2014\u2019\u4e2d\u65e5\ud55c"
    "\U0001f600\U0010ffff",
}
RUNS = st.tuples(st.sampled_from(sorted(CLASSES)), st.integers(1, 13)).flatmap(
    lambda kind_length: st.text(
        alphabet=CLASSES[kind_length[0]], min_size=kind_length[1], max_size=kind_length[1]
    )
)
MIXTURES = st.lists(RUNS, max_size=40).map("".join)
# Prose-like: runs between single blanks, the blank the regex glues to a piece.
WORDS = st.lists(st.tuples(RUNS, st.sampled_from(["", " "])), max_size=40).map(
    lambda runs: "".join(run + blank for run, blank in runs)
)


@settings(max_examples=1000)
@given(st.one_of(MIXTURES, WORDS))
def test_the_fast_path_counts_exactly_what_the_regex_counts(text: str) -> None:
    assert _fast_estimate(text) == _reference_estimate(text)


@given(st.one_of(MIXTURES, WORDS, st.text()))
def test_estimate_tokens_is_the_regex_count_at_every_length(text: str) -> None:
    assert estimate_tokens(text) == _reference_estimate(text)


def test_an_underscore_after_punctuation_joins_the_piece_only_when_it_has_room() -> None:
    # "._" is one piece and "abcdef" another; counted per class it would be 3.
    cases = {"._abcdef": 2, ".._abcdef": 3, "..._abcdef": 3, "(__init__)": 4, "x._y": 3}
    assert {text: _fast_estimate(text) for text in cases} == cases
    assert all(_reference_estimate(text) == count for text, count in cases.items())


def test_repository_text_in_stats_sized_chunks_counts_as_the_regex_does() -> None:
    root = Path(__file__).resolve().parents[1]
    paths = ["busd/core/stats.py", "docs/performance.md", "tests/fixtures/sdk/anthropic.jsonl"]
    for path in paths:
        text = (root / path).read_text(encoding="utf-8")
        for start in range(0, len(text), 4096):
            chunk = text[start : start + 4096]
            assert estimate_tokens(chunk) == _reference_estimate(chunk), (path, start)


def test_texts_beyond_the_cached_masks_count_as_the_regex_does() -> None:
    rng = random.Random(20)
    alphabet = "".join(CLASSES.values())
    text = "".join(rng.choice(alphabet) * rng.randint(1, 8) for _ in range(25_000))
    assert len(text) > 65536  # _MASK_CACHE_MAX
    assert estimate_tokens(text) == _reference_estimate(text)
    assert estimate_tokens(text[:5000]) == _reference_estimate(text[:5000])  # cache still good


def test_lone_surrogates_are_counted_by_the_regex() -> None:
    text = "ab \ud800\udfff cd " * 10  # not encodable as UTF-8
    assert estimate_tokens(text) == _reference_estimate(text) == 40


def test_the_estimator_keeps_no_long_text_and_no_more_than_a_few() -> None:
    """It remembers the last chunks it estimated (the accountant's trackers share them),
    not a whole message or a tool's output, and not many of them."""
    estimate._recent.clear()
    for n in range(40):
        assert estimate_tokens(f"{n} " + "word " * 1000) == estimate_tokens(
            f"{n} " + "word " * 1000
        )
    assert 0 < len(estimate._recent) <= estimate._RECENT_MAX
    big = "word " * 10_000
    assert estimate_tokens(big) == _fast_estimate(big)
    assert big not in estimate._recent
