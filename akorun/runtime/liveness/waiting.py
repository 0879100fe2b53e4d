"""Every wait of a rank and what ends it: the wake-up event, stop requests and the SSP gate.

A `Waiter` owns the one asyncio.Event that is set whenever something a wait
may be waiting for changes (an accepted message, a suspended or resumed peer,
a ``done``, a stop request), the stop reason and the hard-stop flag (a second
signal). `until` waits for a condition (with an optional deadline), `gate`
for the SSP gate to let a round start.

Deadlines: the gate gives up at the run's duration limit (a stop, reason
"duration"), and when it has been blocked for `stall_limit_s` on peers whose
rounds did not advance meanwhile, it gives those peers up (`give_up`,
runtime.liveness.peer_liveness: one error line naming them, out of the gate; answering
heartbeats does not put them back, only their next new message does). A
blocker whose heartbeat answers say it waits on others itself is spared
(the rank it waits on is given up instead, runtime.liveness.peer_liveness) unless the
gate stalls twice in a row on such blockers alone. If a peer this rank's scheme cannot go on
without (`can_continue_without`, from the role: ps, all-reduce) is given up
or suspended, the run stops (reason "lost_peer", one error line naming the
peer; `lost_peers` keeps it for the finish). Every blocked gate says every
`report_every_s` what it waits on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection
from typing import Protocol

from akocore.schemes import SchemeNode
from akorun.transport.cancelling import raise_if_cancelling

log = logging.getLogger("akorun")

POLL_S = 0.25  # a wait re-checks its condition at least this often
GATE_POLL_S = 0.5
GATE_STALL_TIMEOUTS = 3  # a gate blocked this many peer timeouts without progress gives up


class StalledPeers(Protocol):
    """What a stalled gate asks of the rank's liveness (runtime.liveness.peer_liveness.Liveness)."""

    def waits_itself(self, peer: int) -> bool: ...

    def give_up(self, peer: int, why: str) -> None: ...


class Waiter:
    """The wake-up event, the stop reason and the waits built on them."""

    def __init__(self, *, report_every_s: float, stall_limit_s: float | None = None,
                 scheme: str = "ako", can_continue_without: Callable[[int], bool] | None = None,
                 peers: StalledPeers | None = None,
                 send_due: Callable[[], Awaitable[None]] | None = None) -> None:
        self.wake = asyncio.Event()
        self.stop_reason: str | None = None
        self.hard_stop = False
        self.report_every_s = report_every_s  # how often a blocked gate says why
        self.stall_limit_s = stall_limit_s  # a gate blocked this long drops its blockers
        self.gate_stalls = 0
        self.scheme = scheme  # the run's scheme, for the log
        # the role's answer: may the run go on without this peer (ps, all-reduce: no)
        self.can_continue_without = can_continue_without or (lambda peer: True)
        self.lost_peers: set[int] = set()  # peers the run stopped for (see `lose`)
        self.cause: str | None = None  # the line the run fails with, when it is known
        # sends the scheme owes outside an event (a suspension re-forms diloco's
        # all-reduce: SchemeNode.take_effects); every wait sends them as it polls
        self.send_due = send_due
        # a blocker of a stalled gate is given up there (runtime.liveness.peer_liveness.Liveness),
        # unless its answers say it waits on others itself
        self.peers = peers

    def wake_up(self) -> None:
        self.wake.set()

    def request_stop(self, reason: str) -> None:
        """Stop after this round (the first reason wins)."""
        if self.stop_reason is None:
            self.stop_reason = reason
            log.warning("stopping: %s", reason)
        self.wake.set()

    def lose(self, peers: Collection[int], why: str | None = None) -> None:
        """Stop: the scheme cannot go on without `peers` (one error line, reason
        "lost_peer", or `why`); the finish does not wait for them."""
        new = sorted(set(peers) - self.lost_peers)
        self.lost_peers.update(peers)
        if new and why is not None:
            log.error("%s", why)
        elif new:
            log.error("lost peer(s) %s: scheme %s cannot continue without them (only ako "
                      "runs go on without a rank; --resume exists for ako only): stopping "
                      "this rank, exit 1", new, self.scheme)
        if self.stop_reason is None or self.stop_reason == "rounds":
            self.stop_reason = "lost_peer"
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
        raise_if_cancelling()  # a cancellation that wait_for returned over
        if self.send_due is not None:
            await self.send_due()

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

    async def gate(self, node: SchemeNode, t: int, deadline_s: float | None = None, *,
                   ignore_stop: bool = False) -> float | None:
        """Wait until the SSP gate lets round t start; seconds waited, None if stopped
        (a stop request unless `ignore_stop` (a round the ranks agreed to run still,
        runtime.lifecycle.stopping), a hard stop, a lost peer, or the loop time `deadline_s`)."""
        loop = asyncio.get_running_loop()
        start_s = loop.time()
        next_report_s = start_s + self.report_every_s
        stall_from_s, progress = start_s, _progress(node)
        spared = False  # the last stall gave nobody up: every blocker waits on others
        while not node.may_start(t):
            if (self.stop_reason is not None and not ignore_stop) or self.hard_stop \
                    or self.stop_reason == "lost_peer":
                return None
            if deadline_s is not None and loop.time() >= deadline_s:
                if self.stop_reason is None:
                    self.stop_reason = "duration"
                return None
            await self._sleep(GATE_POLL_S)
            now = loop.time()
            if now > next_report_s:
                log.warning("round %d waits %.0f s on peer(s) %s", t, now - start_s,
                            node.waiting_on(t))
                next_report_s = now + self.report_every_s
            if _progress(node) != progress:
                stall_from_s, progress = now, _progress(node)
            elif self.stall_limit_s is not None and now - stall_from_s > self.stall_limit_s:
                lost = sorted(peer for peer in node.suspended
                              if not self.can_continue_without(peer))
                if lost:
                    self.lose(lost)
                    return None
                blockers = node.waiting_on(t)
                stuck = [peer for peer in blockers
                         if self.peers is None or not self.peers.waits_itself(peer)]
                if not stuck and spared:  # they all wait on others, twice in a row
                    stuck = blockers
                spared = not stuck
                for peer in stuck:
                    if self.peers is not None:
                        self.peers.give_up(peer, f"round {t}: no progress from peer {peer} "
                                           f"for {now - stall_from_s:.0f} s although it is "
                                           f"not silent")
                    if peer not in node.suspended:  # no liveness wired (a bare waiter)
                        node.suspend_peer(peer)
                self.gate_stalls += 1
                stall_from_s = now
        return loop.time() - start_s


def _progress(node: SchemeNode) -> object:
    """What changes when a peer's messages arrive (ako: its contiguous rounds)."""
    log_ = getattr(node, "log", None)
    contiguous = getattr(log_, "contiguous", None)
    return tuple(contiguous.tolist()) if contiguous is not None else None
