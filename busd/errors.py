"""Exceptions busd raises at its boundaries.

Every error a caller can provoke with bad input is a :class:`BusdError`, and
also subclasses the builtin it refines (``TypeError``, ``ValueError``), so
generic handlers keep working.
"""

from __future__ import annotations


class BusdError(Exception):
    """Base class of every error busd raises on purpose."""


class UnknownEventType(BusdError, TypeError):
    """An event that is neither in the catalog nor registered by a plugin."""


class InvalidPattern(BusdError, ValueError):
    """A subscription pattern that breaks the NATS-style token rules."""


class CatalogConflict(BusdError, ValueError):
    """Two different classes claim the same dotted event type name."""
