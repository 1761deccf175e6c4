"""The bridge's options: ``[plugins.nats]`` in the config file, or ``busd serve --nats…``.

Checked once, before anything connects, so a typo is an error that names the
option instead of a bridge that quietly does something else.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import msgspec

from busd import InvalidPattern, Pattern, PluginConfigError

__all__ = ["BridgeOptions", "NatsOptionsError", "check_keys", "default_name", "parse_options"]

SCHEMES = ("nats", "tls", "ws", "wss")
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


class NatsOptionsError(PluginConfigError):
    """An option of the nats plugin is unknown or has a bad value (the message says which).

    A :class:`busd.PluginConfigError`: ``busd serve`` exits 2 with it.
    """


class BridgeOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Where and how to bridge; see docs/scaling.md for each option."""

    url: str
    """One server or several, comma-separated: ``nats://host:4222``."""
    name: str = ""
    """This daemon's subject token (``busd.<name>.…``) and durable consumer; default: the
    host name and a hash of the socket path. One name, one live daemon (see
    :mod:`busd_nats.claim`)."""
    stream: str = "BUSD"
    subjects: list[str] | None = None
    """What to ingest; default: every other daemon's events (``busd.>`` less our own)."""
    creds: str | None = None
    """A NATS credentials file (JWT and NKey seed)."""
    buffer: int = 100_000
    """Events held while NATS is unreachable; past it the oldest are dropped (and said so)."""
    duplicate_window: float = 120.0
    """Seconds JetStream remembers message ids, for a stream this plugin creates."""
    max_age: float = 86_400.0
    """Seconds a stream this plugin creates keeps events (0: for ever)."""
    seen: int = 100_000
    """Event ids remembered on ingest, to drop redeliveries."""


def default_name(socket_path: str | None = None) -> str:
    """The host's short name, made subject-safe, and 6 hex digits of ``socket_path``'s hash.

    ``build-01.example.org`` with ``/run/user/1000/busd/bus.sock`` → ``build-01-3f9a1c``.
    The socket, because two daemons on one host (two users, a second ``--socket``) would
    otherwise share the name, and with it the durable consumer; a socket path, because it
    stays the same from one start to the next, so the consumer resumes. Without one (a
    daemon embedded in a test), the host name alone.
    """
    host = socket.gethostname().split(".", 1)[0]
    host = _UNSAFE.sub("-", host).strip("-") or "busd"
    if socket_path is None:
        return host[:64]
    digest = hashlib.sha256(os.path.abspath(socket_path).encode()).hexdigest()[:6]
    return f"{host[:57]}-{digest}"


def parse_options(raw: Mapping[str, Any], *, socket_path: str | None = None) -> BridgeOptions:
    """Validate ``raw`` (the ``[plugins.nats]`` table with the flags on top).

    ``socket_path``, the daemon's, makes the default name (:func:`default_name`).

    :raises NatsOptionsError: naming the first option that is wrong, and why.
    """
    check_keys(raw)
    if "url" not in raw:
        raise NatsOptionsError("[plugins.nats]: 'url' is required (e.g. nats://127.0.0.1:4222)")
    try:
        options = msgspec.convert(dict(raw), BridgeOptions)
    except msgspec.ValidationError as exc:
        raise NatsOptionsError(f"[plugins.nats]: {exc}") from None
    for url in options.url.split(","):
        _check_url(url.strip())
    name = options.name or default_name(socket_path)
    if not _NAME.fullmatch(name):
        raise NatsOptionsError(
            f"[plugins.nats]: name {name!r} may only hold letters, digits, '_' and '-' "
            "(it is a subject token)"
        )
    if not _NAME.fullmatch(options.stream):
        raise NatsOptionsError(
            f"[plugins.nats]: stream {options.stream!r} may only hold letters, digits, '_' and '-'"
        )
    for subject in options.subjects or ():
        _check_subject(subject)
    if options.subjects is not None and not options.subjects:
        raise NatsOptionsError("[plugins.nats]: subjects is empty (leave it out to ingest all)")
    if options.creds is not None and not Path(options.creds).is_file():
        raise NatsOptionsError(f"[plugins.nats]: credentials file {options.creds!r} not found")
    if options.buffer < 1 or options.seen < 1:
        raise NatsOptionsError("[plugins.nats]: buffer and seen must be at least 1")
    if not options.duplicate_window > 0:
        raise NatsOptionsError("[plugins.nats]: duplicate_window must be positive (seconds)")
    if not 0 <= options.max_age < float("inf"):
        raise NatsOptionsError("[plugins.nats]: max_age must be 0 (for ever) or seconds")
    if options.max_age and options.max_age < options.duplicate_window:
        raise NatsOptionsError("[plugins.nats]: max_age must not be below duplicate_window")
    return msgspec.structs.replace(options, name=name)


def check_keys(raw: Mapping[str, Any]) -> None:
    """:raises NatsOptionsError: for the first key that is no option (a typo)."""
    known = set(BridgeOptions.__struct_fields__)
    unknown = sorted(set(raw) - known)
    if unknown:
        raise NatsOptionsError(
            f"[plugins.nats]: unknown option {unknown[0]!r} (known: {', '.join(sorted(known))})"
        )


def _check_url(url: str) -> None:
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = -1
    if parts.scheme not in SCHEMES or not parts.hostname or port == -1:
        raise NatsOptionsError(
            f"[plugins.nats]: url {url!r} is not a NATS server address "
            f"(expected {'|'.join(SCHEMES)}://HOST[:PORT], several separated by commas)"
        )


def _check_subject(subject: str) -> None:
    try:
        Pattern(subject)
    except InvalidPattern as exc:
        raise NatsOptionsError(f"[plugins.nats]: subject {subject!r}: {exc}") from None
    if any(c.isspace() for c in subject) or not subject.startswith("busd."):
        raise NatsOptionsError(
            f"[plugins.nats]: subject {subject!r} must be a subject under busd. "
            "(e.g. busd.*.*.stream.> or busd.laptop.>), without spaces"
        )
