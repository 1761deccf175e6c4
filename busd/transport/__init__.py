"""Socket I/O that both ends of the protocol share: the daemon's connections and the client.

A thin layer over Trio's ``SocketStream`` for the one pattern a steady rate
is made of (wake on a socket, read a frame, write one, sleep again):
:class:`Receiver`, :func:`send_eagerly` and :func:`write_now`. Why:
``docs/performance.md``, "Reading after waiting".
"""

from __future__ import annotations

from .sockets import Receiver, send_eagerly, write_now

__all__ = ["Receiver", "send_eagerly", "write_now"]
