"""The daemon's configuration file (TOML), for what flags express badly: policy.

    [runs]
    watchdog = 300            # seconds without an event before a run times out

    [permissions]
    timeout = 120             # deny what nobody answered in time (omit: wait)

    [[permissions.rules]]     # first match wins; every given condition must hold
    action = "allow"          # allow | deny | ask
    tool = "Read"             # glob over the tool name
    [[permissions.rules]]
    action = "deny"
    category = "execute"
    command = "rm -rf"        # regular expression searched in input.command

    [plugins.nats]            # options of the plugin named nats (docs/scaling.md)
    url = "nats://127.0.0.1:4222"

Unknown keys are errors, so a typo cannot silently weaken a policy; what a
``[plugins.NAME]`` table may hold is the plugin's to check.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import msgspec

from .errors import BusdError
from .permissions import PermissionRule

__all__ = ["ConfigError", "FileConfig", "load_config"]


class ConfigError(BusdError, ValueError):
    """The configuration file cannot be used; the message says where and why."""


class _Permissions(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    timeout: float | None = None
    rules: tuple[PermissionRule, ...] = ()


class _Runs(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    watchdog: float = 300.0


class FileConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """What a configuration file may hold."""

    runs: _Runs = _Runs()
    permissions: _Permissions = _Permissions()
    plugins: dict[str, dict[str, Any]] = {}


def load_config(path: Path) -> FileConfig:
    """Read and validate ``path``; :class:`ConfigError` with a clear message otherwise."""
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from None
    try:
        return msgspec.convert(raw, FileConfig)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{path}: {exc}") from None
