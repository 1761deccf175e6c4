"""Exceptions busd raises at its boundaries.

Every error a caller can provoke with bad input is a :class:`BusdError`, and
also subclasses the builtin it refines (``TypeError``, ``ValueError``), so
generic handlers keep working.
"""

from __future__ import annotations

from collections.abc import Iterator


class BusdError(Exception):
    """Base class of every error busd raises on purpose."""


class UnknownEventType(BusdError, TypeError):
    """An event that is neither in the catalog nor registered by a plugin."""


class InvalidPattern(BusdError, ValueError):
    """A subscription pattern that breaks the NATS-style token rules."""


class CatalogConflict(BusdError, ValueError):
    """Two different classes claim the same dotted event type name."""


class PluginConfigError(BusdError, ValueError):
    """A plugin's options cannot be used: the daemon stops instead of running without it.

    Every other exception a hook raises is contained (reported, the hook
    skipped); this one, raised from ``busd_services`` or ``busd_startup``,
    makes ``busd serve`` exit 2 with the message, because a daemon that
    silently runs without the bridge its operator configured is worse than
    one that refuses to start.
    """


def lone_error(error: BaseException) -> BaseException | None:
    """The one error inside ``error`` and its nested groups, else ``None``.

    A nursery wraps even a single failure in an ``ExceptionGroup``; a caller
    that wants to say what went wrong (a port taken, a daemon gone, an
    attacher that cannot start) unwraps it when there is exactly one.
    """
    leaves = list(_leaves(error))
    return leaves[0] if len(leaves) == 1 else None


def _leaves(error: BaseException) -> Iterator[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            yield from _leaves(inner)
    else:
        yield error
