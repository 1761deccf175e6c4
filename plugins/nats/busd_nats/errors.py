"""The bridge's own failures, raised on the asyncio side and met on the Trio side."""

from __future__ import annotations

__all__ = ["NameTaken", "NatsBridgeError"]


class NatsBridgeError(RuntimeError):
    """The server is reachable but will not let the bridge work (the message says why).

    busd's guard restarts the service, and disables it after repeated failures.
    """


class NameTaken(NatsBridgeError):
    """Another live daemon holds this daemon's name (the message says which).

    Not retried: the other daemon renews its claim, so a restart would be refused
    again. The bridge says so and turns itself off until the daemon restarts.
    """
