"""Who a client is and what its role lets it do, without I/O.

Every client names itself and a role in its ``hello``. The name is the
client's to choose, but not everything is: names that read as the daemon's
own deciders (``busd``, ``rule:0``, ``policy``, ``timeout``, ``run/…``) are
refused, so a decision's ``by`` and an event's ``source`` cannot be made to
look like a configured rule's or the daemon's. The daemon then labels the
connection with what the kernel says about it (SO_PEERCRED's pid and uid):
:func:`identity` is what ``source`` and ``by`` carry, never a payload field.

Roles say what a client may change. Reading (subscribing, ``status``,
``sessions``, ``snapshot``, ``stats``, ``runs``, ``ping``) is everyone's;
the four rights below are granted per role (:data:`DEFAULT_GRANTS`, the
table in docs/operations.md) and a configuration may only take them away
(:func:`narrow`). The defaults suit one person on one laptop: their
terminal and web frontends start, cancel and answer; an agent publishes
(``ask_permission`` too: it publishes a permission request).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Final, Literal, get_args

from .frames import BAD_HANDSHAKE, FORBIDDEN, Frame, Ingest, Publish, Request, Role

__all__ = [
    "DEFAULT_GRANTS",
    "RIGHTS",
    "ROLES",
    "Right",
    "identity",
    "name_refusal",
    "narrow",
    "right_needed",
]

Right = Literal["publish", "start_run", "cancel_run", "permission_reply"]

ROLES: Final[tuple[Role, ...]] = get_args(Role)
RIGHTS: Final[tuple[Right, ...]] = get_args(Right)

DEFAULT_GRANTS: Final[Mapping[Role, frozenset[Right]]] = MappingProxyType(
    {
        "observer": frozenset(),
        "frontend": frozenset({"start_run", "cancel_run", "permission_reply"}),
        "responder": frozenset({"permission_reply"}),
        "agent": frozenset({"publish"}),
        "admin": frozenset(RIGHTS),
    }
)

_COMMAND_RIGHTS: Final[Mapping[str, Right]] = {
    "ask_permission": "publish",  # it publishes a request, as an agent would
    "start_run": "start_run",
    "cancel_run": "cancel_run",
    "permission_reply": "permission_reply",
}

MAX_NAME = 64
_RESERVED_NAMES = ("busd", "policy", "timeout")
_RESERVED_PREFIXES = ("busd.", "busd:", "busd/", "rule:", "policy:", "run/")


def right_needed(frame: Frame) -> Right | None:
    """The right a frame needs (``None``: anyone may send it)."""
    match frame:
        case Publish() | Ingest():
            return "publish"
        case Request(command=command):
            tag = command.__struct_config__.tag
            return _COMMAND_RIGHTS.get(tag) if isinstance(tag, str) else None
    return None


def name_refusal(name: str) -> tuple[str, str] | None:
    """Why ``name`` cannot be a client's name in ``hello``: ``(code, message)``, or ``None``.

    ``bad_handshake`` for a malformed name, ``forbidden`` for a reserved one.
    """
    if not name or len(name) > MAX_NAME:
        return BAD_HANDSHAKE, f"a client name has 1 to {MAX_NAME} characters, not {len(name)}"
    if not name.isprintable() or any(c in name for c in "[]"):
        return BAD_HANDSHAKE, f"client name {name!r} has a bracket or an unprintable character"
    lowered = name.lower()
    if lowered in _RESERVED_NAMES or lowered.startswith(_RESERVED_PREFIXES):
        return FORBIDDEN, f"client name {name!r} is reserved: it reads as the daemon's own"
    return None


def identity(name: str, *, pid: int | None, uid: int | None) -> str:
    """A connection's label for ``source`` and ``by``: ``name[pid=…,uid=…]``.

    Brackets are refused in names, so no client can name itself like another.
    """
    pid_part = "?" if pid is None else str(pid)
    uid_part = "?" if uid is None else str(uid)
    return f"{name}[pid={pid_part},uid={uid_part}]"


def narrow(
    grants: Mapping[str, Iterable[str]],
    base: Mapping[Role, frozenset[Right]] = DEFAULT_GRANTS,
) -> dict[Role, frozenset[Right]]:
    """``base`` with some roles' rights replaced by a subset of them.

    :class:`ValueError` names an unknown role or right, or a right the role
    does not have by default: configuration takes rights away, never adds.
    """
    narrowed = dict(base)
    for name, rights in grants.items():
        role = next((r for r in ROLES if r == name), None)
        if role is None:
            raise ValueError(f"unknown role {name!r} (roles: {', '.join(ROLES)})")
        wanted: set[Right] = set()
        for given in rights:
            right = next((r for r in RIGHTS if r == given), None)
            if right is None:
                raise ValueError(
                    f"role {name!r}: unknown right {given!r} (rights: {', '.join(RIGHTS)})"
                )
            if right not in base[role]:
                having = ", ".join(sorted(base[role])) or "none"
                raise ValueError(
                    f"role {name!r} cannot be given {right!r}: a configuration only takes "
                    f"rights away (by default it has: {having})"
                )
            wanted.add(right)
        narrowed[role] = frozenset(wanted)
    return narrowed
