"""Fault hooks the training loop calls around every round: none by default, the test hooks
of AKORUN_FAULT (akorun.faults) when asked for.

`FaultHooks` is the interface; `NoFaults` does nothing; `InjectedFaults`
pauses before a round until a file exists, SIGKILLs this process before a
round, after a round once every peer acknowledged it, after a round once ONE
peer acknowledged it (mid-send), after sending a round to one peer only
(mid-multicast), inside a checkpoint write (its temp file
written, not yet moved into place), after the last round or during the join
(once a peer holds our answer to its hello), holds the rank in its join
(before its own hellos) until a stop is requested or a file exists, and
sleeps after each round.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import os
import signal
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

import numpy as np

from akocore.messages import Partial, Send
from akorun.faults import Faults
from akorun.runtime.outbox import Outbox

log = logging.getLogger("akorun")

PAUSE_POLL_S = 0.05


class FaultHooks(Protocol):
    async def before_round(self, round_: int) -> None: ...

    async def after_round(self, round_: int) -> None: ...

    def mid_checkpoint(self, round_: int) -> Callable[[Path], None] | None: ...

    def outgoing_gradient(self, round_: int, grad: np.ndarray) -> np.ndarray: ...

    def outgoing(self, round_: int, effects: list[Send]) -> list[Send]: ...

    async def at_end(self) -> None: ...

    def greeted(self, peer: int, times: int) -> None: ...

    async def in_join(self) -> None: ...


class NoFaults:
    """The production hooks: nothing happens."""

    async def before_round(self, round_: int) -> None:
        return None

    async def after_round(self, round_: int) -> None:
        return None

    def outgoing_gradient(self, round_: int, grad: np.ndarray) -> np.ndarray:
        return grad

    def outgoing(self, round_: int, effects: list[Send]) -> list[Send]:
        return effects

    def mid_checkpoint(self, round_: int) -> Callable[[Path], None] | None:
        return None

    async def at_end(self) -> None:
        return None

    def greeted(self, peer: int, times: int) -> None:
        return None

    async def in_join(self) -> None:
        return None


def _kill_now(why: str) -> None:
    log.warning("test hook: SIGKILL %s", why)
    for handler in logging.getLogger().handlers:
        handler.flush()
    os.kill(os.getpid(), signal.SIGKILL)


class InjectedFaults:
    """The AKORUN_FAULT test hooks of one rank (keyed by rounds, not by sleeps)."""

    def __init__(self, faults: Faults, *, outbox: Outbox, gone: Callable[[int], bool],
                 hard_stop: Callable[[], bool],
                 stop_requested: Callable[[], bool] = lambda: False) -> None:
        self.faults = faults
        self.outbox = outbox
        self.gone = gone  # a suspended peer need not acknowledge before the kill
        self.hard_stop = hard_stop
        self.stop_requested = stop_requested  # a first signal (ends pause_in_join)
        self.checkpoint_killed = False
        self.multicast_to: int | None = None  # kill_mid_multicast: the one destination

    async def before_round(self, round_: int) -> None:
        faults = self.faults
        if faults.kill_mid_multicast == round_ and self.outbox.senders:
            self.multicast_to = min(self.outbox.senders)
            self.outbox.only_to[round_] = self.multicast_to
        if faults.kill_before_round == round_:
            _kill_now(f"before round {round_}")
        if faults.pause_before_round == round_ and faults.pause_until_file:
            log.warning("test hook: paused before round %d until %s exists", round_,
                        faults.pause_until_file)
            while not os.path.exists(faults.pause_until_file) and not self.hard_stop():
                await asyncio.sleep(PAUSE_POLL_S)

    def outgoing_gradient(self, round_: int, grad: np.ndarray) -> np.ndarray:
        """send_nonfinite: a NaN gradient from its round on, past the rank's own check;
        record_gradients: the gradient saved first."""
        record = self.faults.record_gradients
        if record is not None:
            os.makedirs(record, exist_ok=True)
            np.save(os.path.join(record, f"round-{round_}.npy"), grad)
        start = self.faults.send_nonfinite
        if start is None or round_ < start:
            return grad
        return np.full_like(grad, np.nan)

    def outgoing(self, round_: int, effects: list[Send]) -> list[Send]:
        """send_malformed: from its round on, every coded message's body is broken."""
        malformed = self.faults.send_malformed
        if malformed is None or round_ < malformed[0]:
            return effects
        return [dataclasses.replace(send, message=_broken(send.message, malformed[1]))
                for send in effects]

    async def after_round(self, round_: int) -> None:
        if self.faults.kill_after_round == round_:
            await self.outbox.wait_acked(round_, self.gone)
            _kill_now(f"after round {round_} (all its sends acknowledged)")
        if self.faults.kill_mid_send == round_:
            senders = self.outbox.senders
            acked = next(iter(senders.values())).wait
            await acked(lambda: any(s.acked_through >= round_ for s in senders.values()),
                        poll_s=0.001)
            _kill_now(f"after round {round_}, mid-send: acknowledged by peer(s) "
                      f"{sorted(j for j, s in senders.items() if s.acked_through >= round_)} "
                      f"of {sorted(senders)}")
        if self.faults.kill_mid_multicast == round_ and self.multicast_to is not None:
            sender = self.outbox.senders[self.multicast_to]
            await sender.wait(lambda: sender.acked_through >= round_, poll_s=0.001)
            _kill_now(f"after round {round_}, mid-multicast: sent to peer {self.multicast_to} "
                      f"only and acknowledged; peers "
                      f"{sorted(set(self.outbox.senders) - {self.multicast_to})} never get it")
        if self.faults.sleep_per_round_s > 0:
            await asyncio.sleep(self.faults.sleep_per_round_s)


    def mid_checkpoint(self, round_: int) -> Callable[[Path], None] | None:
        after = self.faults.kill_mid_checkpoint
        if after is None or round_ <= after or self.checkpoint_killed:
            return None
        self.checkpoint_killed = True
        return lambda temp: _kill_now(f"mid-checkpoint after round {round_} ({temp.name} "
                                      f"written, not moved into place)")

    async def at_end(self) -> None:
        if self.faults.kill_at_end:
            _kill_now("after the last round, before the final flush")

    def greeted(self, peer: int, times: int) -> None:
        if self.faults.kill_in_join and times >= 2:  # it holds our answer to its first
            _kill_now(f"during the join, at rank {peer}'s second hello")

    async def in_join(self) -> None:
        if not self.faults.pause_in_join:
            return
        until = self.faults.pause_in_join_file
        log.warning("test hook: held in the join, before our hellos, until a stop is "
                    "requested%s", f" or {until} exists" if until else "")
        while not self.stop_requested() and not self.hard_stop() \
                and not (until and os.path.exists(until)):
            await asyncio.sleep(PAUSE_POLL_S)


def _broken(message: Partial, how: str) -> Partial:
    """`message` with the coded body a correct member never sends (`Faults.send_malformed`)."""
    payload = message.payload
    if payload is None or not message.length:
        return message
    body = bytearray(payload)
    if how == "topk_index":  # u32 indices, then the values: the last index past the end
        k = len(body) // 8
        struct.pack_into("<I", body, 4 * (k - 1), 0xFFFFFFFF)
    else:  # int8: the chunks' float32 scales first
        struct.pack_into("<f", body, 0, math.nan if how == "int8_scale" else -1.0)
    return dataclasses.replace(message, payload=bytes(body))


def fault_hooks(faults: Faults, *, outbox: Outbox, gone: Callable[[int], bool],
                hard_stop: Callable[[], bool],
                stop_requested: Callable[[], bool] = lambda: False) -> FaultHooks:
    """NoFaults unless `faults` asks for one."""
    if not faults.any:
        return NoFaults()
    return InjectedFaults(faults, outbox=outbox, gone=gone, hard_stop=hard_stop,
                          stop_requested=stop_requested)


def relay_answer_hook(faults: Faults) -> Callable[[int], Awaitable[bool]] | None:
    """The relay's hook before it answers a pull from a rank (akorun.runtime.recovery.relay): waits
    ``relay_late`` seconds for its rank, and says False (answer with no messages) for the
    ``relay_withhold`` rank; None when neither fault is asked for."""
    if faults.relay_withhold is None and faults.relay_late is None:
        return None

    async def before_answer(asker: int) -> bool:
        if faults.relay_late is not None and asker == faults.relay_late[0]:
            log.warning("fault: answering rank %d's relay pull %.1f s late", asker,
                        faults.relay_late[1])
            await asyncio.sleep(faults.relay_late[1])
        if asker == faults.relay_withhold:
            log.warning("fault: answering rank %d's relay pull with nothing", asker)
            return False
        return True
    return before_answer
