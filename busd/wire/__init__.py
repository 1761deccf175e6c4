"""The wire protocol: frames (:mod:`.frames`), their codec (:mod:`.codec`) and roles
(:mod:`.roles`), sans-I/O.

Clients and the daemon import the protocol from here; ``docs/protocol.md``
is its specification.
"""

from __future__ import annotations

from .codec import *  # noqa: F403
from .codec import __all__ as _codec_names
from .frames import *  # noqa: F403
from .frames import __all__ as _frame_names
from .roles import *  # noqa: F403
from .roles import __all__ as _role_names

__all__ = [*_frame_names, *_codec_names, *_role_names]
