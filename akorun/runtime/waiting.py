"""Every wait of a rank and what ends it: the wake-up event, stop requests and the SSP gate.

A `Waiter` owns the one asyncio.Event that is set whenever something a wait
may be waiting for changes (an accepted message, a suspended or resumed peer,
a ``done``, a stop request), the stop reason and the hard-stop flag (a second
signal). `until` waits for a condition (with an optional deadline), `gate`
for the SSP gate to let a round start. Deadlines on these waits belong here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from akocore.schemes import SchemeNode

log = logging.getLogger("akorun")

POLL_S = 0.25  # a wait re-checks its condition at least this often
GATE_POLL_S = 0.5


class Waiter:
    """The wake-up event, the stop reason and the waits built on them."""

    def __init__(self, *, report_every_s: float) -> None:
        self.wake = asyncio.Event()
        self.stop_reason: str | None = None
        self.hard_stop = False
        self.report_every_s = report_every_s  # how often a blocked gate says why

    def wake_up(self) -> None:
        self.wake.set()

    def request_stop(self, reason: str) -> None:
        """Stop after this round (the first reason wins)."""
        if self.stop_reason is None:
            self.stop_reason = reason
            log.warning("stopping: %s", reason)
        self.wake.set()

    def stop_now(self) -> None:
        """Give up every wait at once (a second signal, a ps server's first)."""
        self.hard_stop = True
        self.wake.set()

    async def _sleep(self, poll_s: float) -> None:
        self.wake.clear()
        try:
            await asyncio.wait_for(self.wake.wait(), poll_s)
        except TimeoutError:
            pass

    async def until(self, done: Callable[[], bool], timeout_s: float | None = None,
                    poll_s: float = POLL_S) -> bool:
        """Wait until `done()`; False on a hard stop or once `timeout_s` passed."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while not done():
            if self.hard_stop or (deadline is not None and loop.time() > deadline):
                return False
            await self._sleep(poll_s)
        return True

    async def gate(self, node: SchemeNode, t: int) -> float | None:
        """Wait until the SSP gate lets round t start; seconds waited, None if stopped."""
        loop = asyncio.get_running_loop()
        start_s = loop.time()
        next_report_s = start_s + self.report_every_s
        while not node.may_start(t):
            if self.stop_reason is not None:
                return None
            await self._sleep(GATE_POLL_S)
            now = loop.time()
            if now > next_report_s:
                log.warning("round %d waits %.0f s on peer(s) %s", t, now - start_s,
                            node.waiting_on(t))
                next_report_s = now + self.report_every_s
        return loop.time() - start_s
