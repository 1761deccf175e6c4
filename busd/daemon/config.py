"""The daemon's configuration file (TOML), for what flags express badly: policy.

    [runs]
    watchdog = 300            # seconds without an event before a run times out

    [permissions]
    timeout = "2m"            # deny what nobody answered in time (omit: 5m; 0: wait)

    [[permissions.rules]]     # first match wins; every given condition must hold
    action = "allow"          # allow | deny | ask
    tool = "Read"             # glob over the tool name (or a list of globs)
    [[permissions.rules]]
    action = "allow"
    category = ["read", "search"]   # one category, or a list
    [[permissions.rules]]
    action = "deny"
    category = "execute"
    command = "rm -rf"        # regular expression searched in input.command

    [tools]                   # tool-call limits (docs/accounting.md); flags win
    timeout = "10m"           # every tool; s, m, h, d, w or seconds; 0: no limit
    [tools.limits]            # per tool name; 0: no limit for that tool
    Bash = "30m"
    WebFetch = 60

    [context.windows]         # model id or prefix -> its context window (docs/accounting.md)
    "my-local-model" = 32768                                   # the reserve: 0
    "claude-sonnet-4" = { window = 1000000, reserve = 64000 }  # over the built-in table

    [journal]                 # durable history (docs/journal.md); flags win
    path = "~/.local/state/busd/journal.sqlite3"
    max_age = "30d"           # s, m, h, d, w; 0: no limit
    max_size = "1GiB"         # KiB, MiB, GiB, TiB or bytes; 0: no limit

    [roles]                   # narrow what a role may change (docs/operations.md)
    frontend = ["permission_reply"]   # frontends answer, but start and cancel nothing
    agent = []                        # agents publish nothing

    [plugins.nats]            # options of the plugin named nats (docs/scaling.md)
    url = "nats://127.0.0.1:4222"

Unknown keys are errors, so a typo cannot silently weaken a policy; what a
``[plugins.NAME]`` table may hold is the plugin's to check.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from ..core.errors import BusdError
from ..core.permissions import PermissionRule
from ..core.windows import ModelWindow
from ..wire import Right, Role, narrow
from .journalfile import parse_duration, parse_size

__all__ = ["ConfigError", "FileConfig", "load_config"]


class ConfigError(BusdError, ValueError):
    """The configuration file cannot be used; the message says where and why."""


class _Permissions(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    timeout: str | float | None = None
    """How long a driven run's request waits for a person; 0: for ever; omitted: the default."""
    rules: tuple[PermissionRule, ...] = ()

    def timeout_s(self) -> float | None:
        """The timeout in seconds (0: wait for ever), ``None`` when the file sets none.

        :class:`ValueError` for a value that is not a duration, or negative.
        """
        value = self.timeout
        if value is None:
            return None
        seconds = parse_duration(value) if isinstance(value, str) else float(value)
        if not 0 <= seconds < math.inf:
            raise ValueError(f"timeout is a duration, 0 to wait for ever, not {value!r}")
        return float(seconds)


class _Runs(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    watchdog: float = 300.0


class _Tools(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    timeout: str | float | None = None
    limits: dict[str, str | float] = {}

    def seconds(self) -> tuple[float | None, dict[str, float | None]]:
        """``(default limit, per-tool limits)`` in seconds; 0 becomes ``None`` (no limit).

        :class:`ValueError` for a value that is not a duration, or negative.
        """
        return _tool_limit(self.timeout), {
            name: _tool_limit(value) for name, value in self.limits.items()
        }


def _tool_limit(value: str | float | None) -> float | None:
    if value is None:
        return None
    seconds = parse_duration(value) if isinstance(value, str) else float(value)
    if not 0 <= seconds < math.inf:
        raise ValueError(f"a tool limit is a duration, 0 for none, not {value!r}")
    return float(seconds) or None


class _Window(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    window: int
    reserve: int = 0


class _Context(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    windows: dict[str, int | _Window] = {}

    def model_windows(self) -> dict[str, int | ModelWindow]:
        """Overrides of the model table; :class:`ValueError` for an impossible one."""
        made: dict[str, int | ModelWindow] = {}
        for model, given in self.windows.items():
            if isinstance(given, int):
                if given <= 0:
                    raise ValueError(f"{model!r}: a context window must be positive, not {given}")
                made[model] = given
            else:
                made[model] = ModelWindow(given.window, given.reserve)
        return made


class _Journal(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    path: str | None = None
    max_age: str | float | None = None
    max_size: str | int | None = None

    def limits(self) -> tuple[float | None, int | None]:
        """``(max_age seconds, max_size bytes)``; ``None`` where the file says nothing.

        :class:`ValueError` for a value that is not a duration or a size.
        """
        age = self.max_age
        size = self.max_size
        seconds = parse_duration(age) if isinstance(age, str) else age
        count = parse_size(size) if isinstance(size, str) else size
        if (seconds is not None and seconds < 0) or (count is not None and count < 0):
            raise ValueError("max_age and max_size cannot be negative (0: no limit)")
        return (None if seconds is None else float(seconds)), count


class FileConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """What a configuration file may hold."""

    runs: _Runs = _Runs()
    permissions: _Permissions = _Permissions()
    tools: _Tools = _Tools()
    context: _Context = _Context()
    journal: _Journal = _Journal()
    roles: dict[str, list[str]] = {}
    plugins: dict[str, dict[str, Any]] = {}

    def grants(self) -> dict[Role, frozenset[Right]]:
        """The roles' rights: the defaults, narrowed by ``[roles]`` (checked by load_config)."""
        return narrow(self.roles)


def load_config(path: Path) -> FileConfig:
    """Read and validate ``path``; :class:`ConfigError` with a clear message otherwise."""
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from None
    try:
        config = msgspec.convert(raw, FileConfig)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    checks: dict[str, Callable[[], object]] = {  # what convert cannot check: the values
        "permissions": config.permissions.timeout_s,
        "journal": config.journal.limits,
        "tools": config.tools.seconds,
        "context.windows": config.context.model_windows,
        "roles": config.grants,
    }
    for table, check in checks.items():
        try:
            check()
        except ValueError as exc:
            raise ConfigError(f"{path}: [{table}]: {exc}") from None
    return config
