from __future__ import annotations

import pytest

from busd.core.errors import InvalidPattern
from busd.core.patterns import Pattern, is_pattern


@pytest.mark.parametrize(
    ("pattern", "name", "expected"),
    [
        ("stream.*.delta", "stream.text.delta", True),
        ("stream.*.delta", "stream.thinking.delta", True),
        ("stream.*.delta", "stream.text.complete", False),
        ("stream.*", "stream.usage", True),
        ("stream.*", "stream.text.delta", False),
        ("stream.>", "stream.usage", True),
        ("stream.>", "stream.text.delta", True),
        ("stream.>", "stream", False),
        (">", "stream.usage", True),
        ("*.*.*", "stream.text.delta", True),
        ("*.*.*", "stream.usage", False),
        ("busd.run.>", "busd.run.finished", True),
        ("busd.run.>", "busd.runner.finished", False),
        ("stream.text.delta", "stream.text.delta", True),
    ],
)
def test_nats_token_semantics(pattern: str, name: str, expected: bool) -> None:
    assert Pattern(pattern).matches(name) is expected


@pytest.mark.parametrize(
    "bad", ["", "stream..delta", "stream.>.delta", "stream.te*", "stream.>x", ".stream", "a."]
)
def test_malformed_patterns_are_rejected_with_a_clear_error(bad: str) -> None:
    with pytest.raises(InvalidPattern):
        Pattern(bad)


def test_wildcards_make_a_pattern() -> None:
    assert is_pattern("stream.>")
    assert is_pattern("stream.*.delta")
    assert not is_pattern("stream.text.delta")
