"""busd: one ordered, typed, coalesced event stream for AI coding agents and their frontends."""

from __future__ import annotations

from .bus import Bus as Bus
from .bus import BusStatistics as BusStatistics
from .bus import Handle as Handle
from .bus import HandlerError as HandlerError
from .catalog import Catalog as Catalog
from .errors import BusdError as BusdError
from .errors import CatalogConflict as CatalogConflict
from .errors import InvalidPattern as InvalidPattern
from .errors import UnknownEventType as UnknownEventType
from .events import *  # noqa: F403 - the catalog is public by design
from .events import __all__ as _event_names
from .patterns import Pattern as Pattern

__version__ = "0.1.0"

__all__ = [
    "Bus",
    "BusStatistics",
    "BusdError",
    "Catalog",
    "CatalogConflict",
    "Handle",
    "HandlerError",
    "InvalidPattern",
    "Pattern",
    "UnknownEventType",
    "__version__",
    *_event_names,
]
