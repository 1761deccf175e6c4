"""busd's adapter for the GitHub Copilot SDK (``session.event`` payloads).

Loaded from the ``busd`` entry-point group like any third-party plugin; the
adapter is named ``copilot``.
"""

from __future__ import annotations

from collections.abc import Sequence

from busd.adapters import Adapter
from busd.hookspecs import hookimpl

from .translator import CopilotAdapter as CopilotAdapter
from .translator import CopilotTranslator as CopilotTranslator

__all__ = ["CopilotAdapter", "CopilotTranslator", "busd_adapters"]


@hookimpl
def busd_adapters() -> Sequence[Adapter]:
    return [CopilotAdapter()]
