from __future__ import annotations

import re

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from busd.core.estimate import estimate_json_tokens, estimate_tokens

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
