"""Every stop rule ends every scheme together: the training ranks agree on their last round.

A stop that one rank decides alone (the duration limit, the target accuracy,
a signal to one rank) would leave the others a round apart: an all-reduce
ring, a sync ps round or a wagma group waits for a message its stopped peer
never sends. So a training rank that stops does not stop at once; it
*freezes*: it records how many rounds it has started (`own`: the round the
gate let through is started) and tells every other training rank
(control ``stop``, retried until answered or the peer is out of the gate).
A rank told so freezes too (if it had not) and answers with its own count;
it tells the others as well. Each rank then knows every live training
rank's count; the run ends, everywhere, after `target` = the largest of
them rounds (ranks behind run their missing rounds; none starts one more).
Counts only grow until a rank freezes and no rank starts a round at or past
its own count before the target is known, so every rank computes the same
target. A peer out of the gate (suspended, left, lost) is not waited for:
the schemes that cannot go on without it stop on the lost peer as before.

Stops by the rounds limit need no agreement (every rank has the same limit)
and a hard stop (a second signal) skips it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

from akorun.runtime.liveness.waiting import Waiter
from akorun.transport.client import ControlClient
from akorun.transport.control import ControlError, ControlKind

log = logging.getLogger("akorun")

CALL_RETRY_S = 0.2
CALL_TIMEOUT_S = 2.0


class StopAgreement:
    """The last round of the training ranks, agreed when one of them stops."""

    def __init__(self, *, rank: int, training_peers: Sequence[int], waiter: Waiter,
                 gone: Callable[[int], bool], spawn: Callable[[Any], Any],
                 heard: Callable[[int], None] = lambda peer: None,
                 patience_s: float = 30.0) -> None:
        self.rank = rank
        self.training_peers = list(training_peers)
        self.waiter = waiter
        self.gone = gone  # a peer out of the gate (suspended, left, lost): not waited for
        self.spawn = spawn  # run a coroutine as a task of the rank
        self.heard = heard
        self.patience_s = patience_s  # a peer that answers no stop this long is not waited for
        self.given_up: set[int] = set()
        self.control: ControlClient | None = None  # set once the run's client exists
        self.started = 0  # rounds this rank has started (the gate let them through)
        self.finished = False  # the rounds loop ended (no more rounds will start)
        self.own: int | None = None  # rounds started when this rank froze
        self.counts: dict[int, int] = {}  # peer -> its rounds started when it froze

    @property
    def frozen(self) -> bool:
        return self.own is not None

    def freeze(self, reason: str) -> None:
        """Stop starting new rounds past those started; tell every training peer."""
        if self.own is not None:
            return
        self.own = self.started
        if self.training_peers:
            log.info("stopping (%s) after %d rounds started here: agreeing on the last "
                     "round with rank(s) %s", reason, self.own, self.training_peers)
        for peer in self.training_peers:
            self.spawn(self._tell(peer))
        self.waiter.wake_up()

    async def _tell(self, peer: int) -> None:
        payload = {"rank": self.rank, "rounds": self.own, "reason": self.waiter.stop_reason}
        loop = asyncio.get_running_loop()
        deadline_s = loop.time() + self.patience_s
        while peer not in self.counts and not self.gone(peer) and not self.waiter.hard_stop:
            if loop.time() > deadline_s:
                log.warning("rank %d answered no stop for %.0f s: not waited for in the "
                            "agreement on the last round", peer, self.patience_s)
                self.given_up.add(peer)
                self.waiter.wake_up()
                return
            if self.control is not None:
                answer = await self.control.call(peer, ControlKind.STOP, payload,
                                                 timeout_s=CALL_TIMEOUT_S)
                rounds = answer.payload.get("rounds") if answer.payload else None
                if answer.ok and isinstance(rounds, int) and not isinstance(rounds, bool):
                    self.counts.setdefault(peer, rounds)
                    self.waiter.wake_up()
                    return
            await asyncio.sleep(CALL_RETRY_S)

    def settled(self) -> bool:
        """Every training peer's count is known (or it is out of the gate)."""
        return self.own is not None and all(j in self.counts or self.gone(j)
                                            or j in self.given_up
                                            for j in self.training_peers)

    @property
    def target(self) -> int:
        """The rounds every rank runs (the largest count known)."""
        assert self.own is not None
        return max([self.own, *(self.counts[j] for j in self.counts if not self.gone(j))])

    async def last_round(self) -> int | None:
        """Wait until the counts are known; the agreed number of rounds (None: hard stop)."""
        if not await self.waiter.until(self.settled):
            return None
        target = self.target
        if target > (self.own or 0):
            log.info("stop agreed: %d rounds (%d started here)", target, self.own)
        return target

    async def on_stop(self, sender: int, payload: dict[str, Any]) -> dict[str, Any]:
        """A training peer stops after `rounds`: freeze too, answer with our count."""
        rounds = payload.get("rounds")
        if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 0:
            raise ControlError(400, "stop: expected {rank, rounds}")
        self.heard(sender)
        self.counts.setdefault(sender, rounds)
        reason = str(payload.get("reason") or "stop")[:200]
        log.info("rank %d stops (%s) after %d rounds started", sender, reason, rounds)
        self.waiter.request_stop(reason)  # the same reason on every rank
        if not self.finished:
            self.freeze(f"as rank {sender}")
        self.waiter.wake_up()
        return {"rank": self.rank, "rounds": self.own if self.own is not None
                else self.started}
