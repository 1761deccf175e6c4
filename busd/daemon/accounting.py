"""The accountant's Trio shell: feeds it the bus, publishes what it derives, ticks it.

The accounting itself is pure (:class:`busd.core.accounting.Accountant`);
this module only owns the loop that sleeps until the next tick or tool
deadline, in the daemon's nursery.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import trio

from ..core.accounting import SETTLE_STRETCH, Accountant, Derived
from ..core.bus import Bus, Handle
from ..core.events import Envelope, Event

__all__ = ["AccountingService"]


class AccountingService:
    """Publishes an accountant's derived events on a bus, with a Trio tick loop.

    ``clock`` must be the clock the loop sleeps on (``trio.current_time`` by
    default), so that durations agree with deadlines under a test clock.
    """

    def __init__(
        self,
        bus: Bus,
        accountant: Accountant | None = None,
        *,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        self.bus = bus
        self.accountant = accountant if accountant is not None else Accountant()
        self._clock = clock
        self._wakeup = trio.Event()
        self._sleeping_until = math.inf
        self._handle: Handle | None = None

    def _publish(self, derived: list[Derived]) -> None:
        for item in derived:
            self.bus.publish(
                item.event,
                session_id=item.session_id,
                run_id=item.run_id,
                agent_id=item.agent_id,
                source="busd.accounting",
            )

    def settle(self) -> None:
        """:meth:`Accountant.settle`: the caller's burst of events is over."""
        self.accountant.settle(stretch=SETTLE_STRETCH)

    def _on_event(self, envelope: Envelope[Event]) -> None:
        self._publish(self.accountant.observe(envelope, self._clock()))
        self._woken()

    def _on_events(self, envelopes: list[Envelope[Event]]) -> None:
        """:meth:`_on_event` for a run: one clock read, one wake-up check."""
        self._publish(self.accountant.observe_run(envelopes, self._clock()))
        self._woken()

    def _woken(self) -> None:
        # Wake the loop only when it must now wake earlier than it planned: not
        # a task switch per event.
        wakeup = self.accountant.next_wakeup()
        if wakeup is not None and wakeup < self._sleeping_until:
            self._wakeup.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Observe the bus and tick until cancelled; owned by the caller's nursery."""
        self._handle = self.bus.on_all(self._on_event, many=self._on_events)
        try:
            task_status.started()
            while True:
                wakeup = self.accountant.next_wakeup()
                self._sleeping_until = math.inf if wakeup is None else wakeup
                with trio.move_on_at(self._sleeping_until):
                    await self._wakeup.wait()
                self._wakeup = trio.Event()
                self._sleeping_until = -math.inf  # awake: events need not wake us
                self._publish(self.accountant.tick(self._clock()))
        finally:
            self._handle.unsubscribe()
