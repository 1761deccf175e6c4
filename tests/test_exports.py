"""The public API is what busd/__init__.py re-exports; keep it curated and importable."""

from __future__ import annotations

import importlib
import pkgutil

import busd
import busd.core.events


def test_every_exported_name_resolves_and_is_unique() -> None:
    assert len(busd.__all__) == len(set(busd.__all__))
    for name in busd.__all__:
        assert hasattr(busd, name), name


def test_every_event_class_is_public() -> None:
    for cls in busd.core.events.BUILTIN_EVENTS:
        assert getattr(busd, cls.__name__) is cls


def test_exports_come_from_the_package_and_name_themselves() -> None:
    for name in busd.__all__:
        value = getattr(busd, name)
        module = getattr(value, "__module__", None)
        if module is not None and isinstance(value, type):
            assert module.startswith("busd."), (name, module)
            assert value.__name__ == name


def test_every_module_imports_on_its_own() -> None:
    for info in pkgutil.walk_packages(busd.__path__, prefix="busd."):
        importlib.import_module(info.name)
