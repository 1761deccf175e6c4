"""busd's adapter and driver for the GitHub Copilot SDK (``session.event`` payloads).

Loaded from the ``busd`` entry-point group like any third-party plugin; the
adapter and the driver are named ``copilot``. The driver needs the SDK
(``pip install busd-copilot[driver]``), imported only when a run starts.
"""

from __future__ import annotations

from collections.abc import Sequence

from busd import Adapter, Driver, hookimpl

from .driver import CopilotDriver as CopilotDriver
from .driver import CopilotRunError as CopilotRunError
from .driver import MaxTurnsExceeded as MaxTurnsExceeded
from .translator import CopilotAdapter as CopilotAdapter
from .translator import CopilotTranslator as CopilotTranslator

__all__ = [
    "CopilotAdapter",
    "CopilotDriver",
    "CopilotRunError",
    "CopilotTranslator",
    "MaxTurnsExceeded",
    "busd_adapters",
    "busd_drivers",
]


@hookimpl
def busd_adapters() -> Sequence[Adapter]:
    return [CopilotAdapter()]


@hookimpl
def busd_drivers() -> Sequence[Driver]:
    return [CopilotDriver()]
