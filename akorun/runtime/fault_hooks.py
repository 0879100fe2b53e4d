"""Fault hooks the training loop calls around every round: none by default, the test hooks
of AKORUN_FAULT (akorun.faults) when asked for.

`FaultHooks` is the interface; `NoFaults` does nothing; `InjectedFaults`
pauses before a round until a file exists, SIGKILLs this process after a
round once every peer acknowledged it, and sleeps after each round.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable
from typing import Protocol

from akorun.faults import Faults
from akorun.runtime.outbox import Outbox

log = logging.getLogger("akorun")

PAUSE_POLL_S = 0.05


class FaultHooks(Protocol):
    async def before_round(self, round_: int) -> None: ...

    async def after_round(self, round_: int) -> None: ...


class NoFaults:
    """The production hooks: nothing happens."""

    async def before_round(self, round_: int) -> None:
        return None

    async def after_round(self, round_: int) -> None:
        return None


class InjectedFaults:
    """The AKORUN_FAULT test hooks of one rank (keyed by rounds, not by sleeps)."""

    def __init__(self, faults: Faults, *, outbox: Outbox, gone: Callable[[int], bool],
                 hard_stop: Callable[[], bool]) -> None:
        self.faults = faults
        self.outbox = outbox
        self.gone = gone  # a suspended peer need not acknowledge before the kill
        self.hard_stop = hard_stop

    async def before_round(self, round_: int) -> None:
        faults = self.faults
        if faults.pause_before_round == round_ and faults.pause_until_file:
            log.warning("test hook: paused before round %d until %s exists", round_,
                        faults.pause_until_file)
            while not os.path.exists(faults.pause_until_file) and not self.hard_stop():
                await asyncio.sleep(PAUSE_POLL_S)

    async def after_round(self, round_: int) -> None:
        if self.faults.kill_after_round == round_:
            await self.outbox.wait_acked(round_, self.gone)
            log.warning("test hook: SIGKILL after round %d (all its sends acknowledged)",
                        round_)
            for handler in logging.getLogger().handlers:
                handler.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        if self.faults.sleep_per_round_s > 0:
            await asyncio.sleep(self.faults.sleep_per_round_s)


def fault_hooks(faults: Faults, *, outbox: Outbox, gone: Callable[[int], bool],
                hard_stop: Callable[[], bool]) -> FaultHooks:
    """NoFaults unless `faults` asks for one."""
    if not faults.any:
        return NoFaults()
    return InjectedFaults(faults, outbox=outbox, gone=gone, hard_stop=hard_stop)
