"""docs/plugins.md documents every hook exactly as busd/plugins/hookspecs.py declares it.

Each hook has a heading in the "Hook reference" section, and under it a
```python block with ``def name(signature):`` as :func:`inspect.signature`
renders it, the first line of its docstring, and whether it is firstresult.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from busd.plugins import hookspecs

DOC = Path(__file__).resolve().parent.parent / "docs" / "plugins.md"
REFERENCE = "## Hook reference"
_HEADING = re.compile(r"^### `?(\w+)`?\s*$", re.MULTILINE)


def specs() -> dict[str, Callable[..., Any]]:
    """Every function marked ``@hookspec`` in busd.hookspecs, by name."""
    marker = f"{hookspecs.PROJECT}_spec"
    return {
        name: function
        for name, function in inspect.getmembers(hookspecs, inspect.isfunction)
        if getattr(function, marker, None) is not None
    }


def documented() -> dict[str, str]:
    """Each hook heading of the reference section, with the text under it."""
    text = DOC.read_text()
    assert REFERENCE in text, f"{DOC} has no {REFERENCE!r} section"
    reference = text.split(REFERENCE, 1)[1]
    reference = re.split(r"^## ", reference, maxsplit=1, flags=re.MULTILINE)[0]
    parts = _HEADING.split(reference)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def python_blocks(section: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", section, re.MULTILINE | re.DOTALL)


def test_the_hookspecs_are_found() -> None:
    assert "busd_adapters" in specs()  # guards the other tests against finding nothing


@pytest.mark.parametrize("name", sorted(specs()))
def test_every_hook_is_documented_with_its_exact_signature(name: str) -> None:
    sections = documented()
    assert name in sections, f"docs/plugins.md has no '### `{name}`' under {REFERENCE!r}"
    spec = specs()[name]
    signature = f"def {name}{inspect.signature(spec)}:"
    blocks = python_blocks(sections[name])
    assert any(signature in block for block in blocks), (
        f"the ```python block under {name} must contain exactly:\n{signature}"
    )
    doc = inspect.getdoc(spec)
    assert doc, f"{name} has no docstring in busd/plugins/hookspecs.py"
    first_line = doc.splitlines()[0]
    assert first_line in sections[name], f"{name}: say {first_line!r} in its section"
    firstresult = getattr(spec, f"{hookspecs.PROJECT}_spec")["firstresult"]
    expected = "**firstresult:** yes" if firstresult else "**firstresult:** no"
    assert expected in sections[name], f"{name}: its section must say {expected!r}"


def test_no_hook_is_documented_that_does_not_exist() -> None:
    extra = sorted(set(documented()) - set(specs()))
    assert not extra, f"docs/plugins.md documents hooks the hookspecs do not have: {extra}"
