"""The package's folders are its layers: small modules, and docs that name the contract's layers.

The import rules themselves are import-linter contracts (pyproject.toml),
checked by ``lint-imports`` in .ci/run.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 700


def _contracts() -> list[dict[str, object]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts: list[dict[str, object]] = config["tool"]["importlinter"]["contracts"]
    return contracts


def test_no_module_is_over_700_lines() -> None:
    sizes = {
        str(path.relative_to(ROOT)): len(path.read_text().splitlines())
        for path in (ROOT / "busd").rglob("*.py")
    }
    assert {name: n for name, n in sizes.items() if n > MAX_LINES} == {}


def test_every_module_is_in_a_layer() -> None:
    (layers,) = [c for c in _contracts() if c["type"] == "layers"]
    assert isinstance(layers["layers"], list)
    packages = {p.strip() for layer in layers["layers"] for p in layer.split("|")}
    outside = {"busd.__init__", "busd.__main__", "busd._version"}
    for path in (ROOT / "busd").rglob("*.py"):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        if module in outside:
            continue
        assert any(module == p or module.startswith(p + ".") for p in packages), module


def test_the_architecture_page_names_every_layer_of_the_contract() -> None:
    (layers,) = [c for c in _contracts() if c["type"] == "layers"]
    assert isinstance(layers["layers"], list)
    page = (ROOT / "docs" / "architecture.md").read_text()
    rows = re.findall(r"^\| `(busd/[\w/.]+)` \|", page, flags=re.M)
    documented = {row.removesuffix("/").removesuffix(".py").replace("/", ".") for row in rows}
    contract = {p.strip() for layer in layers["layers"] for p in layer.split("|")}
    assert documented == contract
