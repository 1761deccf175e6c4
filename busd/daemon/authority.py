"""What a connection may send: its role's rights, and the daemon's hold on the runs it drives.

Checked before a frame does anything, so a refused frame changes nothing;
the answer is ``forbidden``, in the frame's reply when it asked for one
(a request's ``id``, a publish's ``ack``), else an ``error`` frame. The
table of rights is :mod:`busd.wire.roles`; docs/operations.md has the
trust model.
"""

from __future__ import annotations

from collections.abc import Sequence, Set
from operator import attrgetter

from ..core.events import Event, PermissionRequested, PermissionResolved
from ..wire import (
    FORBIDDEN,
    AskPermission,
    Error,
    ErrorInfo,
    Frame,
    Ingest,
    Outgoing,
    Publish,
    Reply,
    Request,
    Right,
    Role,
    right_needed,
)
from .runs import RunManager

__all__ = ["Vetted", "forbidden", "refusal"]

_PERMISSION_EVENTS = (PermissionRequested, PermissionResolved)
_event_of = attrgetter("event")
_place_of = attrgetter("session_id", "run_id")
_kind_and_place_of = attrgetter("event.__class__", "session_id", "run_id")
_SMALL = 16  # events in a frame below which one look at each costs less than the sets
_MAX_VETTED = 1024  # kinds and places a connection keeps; past it, it starts again


def forbidden(frame: Frame, *, role: Role, rights: Set[Right], runs: RunManager) -> str | None:
    """Why a connection in ``role`` may not send ``frame`` (``None``: it may)."""
    right = right_needed(frame)
    if right is not None and right not in rights:
        return f"role {role!r} may not {right.replace('_', ' ')} (docs/operations.md)"
    match frame:
        case Publish(events=events):
            # Only permission events are judged on more than where they go: a
            # frame of a thousand deltas to one session asks once per place.
            if len(events) < _SMALL:
                return _publish_refusal(events, runs)
            kinds = set(map(type, map(_event_of, events)))
            if any(issubclass(kind, _PERMISSION_EVENTS) for kind in kinds) or any(
                runs.authority(out.event, session_id=out.session_id, run_id=out.run_id)
                for out in dict(zip(map(_place_of, events), events, strict=True)).values()
            ):
                return _publish_refusal(events, runs)
        case Ingest(session_id=str(session_id)):
            why = runs.authority(None, session_id=session_id, run_id=None)
            if why is not None:
                return f"{why}; nothing of the frame was ingested"
        case Request(command=AskPermission() as ask):
            # As a publish of the request would be: not into a driven session, and
            # not under the id of a request the broker already knows.
            request = PermissionRequested(request_id=ask.request_id or "", tool=ask.tool)
            return runs.authority(
                request if ask.request_id else None, session_id=ask.session_id, run_id=None
            )
    return None


def _publish_refusal(events: Sequence[Outgoing[Event]], runs: RunManager) -> str | None:
    """The first event of a frame ``runs`` refuses, judged one by one (permission events each)."""
    allowed: set[tuple[str | None, str | None]] = set()
    for index, out in enumerate(events):
        where = (out.session_id, out.run_id)
        if where in allowed and not isinstance(out.event, _PERMISSION_EVENTS):
            continue
        why = runs.authority(out.event, session_id=out.session_id, run_id=out.run_id)
        if why is not None:
            return f"events[{index}]: {why}; none of the frame's events was published"
        allowed.add(where)
    return None


class Vetted:
    """The kinds of event and places a connection was allowed to publish, while that holds.

    An agent sends the same few kinds of event to the same place, frame after
    frame; judging each frame anew (its role's right, the place's authority,
    each kind) was a tenth of the daemon's work for a burst of deltas. A
    frame whose every ``(event type, session, run)`` is here, vetted at the
    same :attr:`~busd.daemon.runs.RunManager.authority_epoch`, is allowed
    as it stands. The epoch moves whenever the daemon takes a place (a run
    starts, a session gets a run id): everything is judged again.
    Permission events are never kept (each is judged on its request id).
    """

    __slots__ = ("_epoch", "_kinds")

    def __init__(self) -> None:
        self._kinds: set[tuple[type[Event], str | None, str | None]] = set()
        self._epoch = -1

    def covers(self, events: Sequence[Outgoing[Event]], epoch: int) -> bool:
        """Whether every event's kind and place was vetted at ``epoch``."""
        return epoch == self._epoch and all(
            map(self._kinds.__contains__, map(_kind_and_place_of, events))
        )

    def add(self, events: Sequence[Outgoing[Event]], epoch: int) -> None:
        """Keep the kinds and places of a frame just allowed whole (every check passed)."""
        kinds = self._kinds
        if epoch != self._epoch:
            kinds.clear()
            self._epoch = epoch
        for kind in map(_kind_and_place_of, events):
            if not issubclass(kind[0], _PERMISSION_EVENTS):
                kinds.add(kind)
        if len(kinds) > _MAX_VETTED:
            kinds.clear()


def refusal(frame: Frame, message: str) -> tuple[Frame, bool]:
    """The frame that says ``frame`` was forbidden, and whether it is a reply."""
    match frame:
        case Request(id=ref) | Publish(ack=int(ref)) | Ingest(ack=int(ref)):
            error = ErrorInfo(code=FORBIDDEN, message=message)
            return Reply(id=ref, ok=False, error=error), True
    return Error(code=FORBIDDEN, message=message), False
