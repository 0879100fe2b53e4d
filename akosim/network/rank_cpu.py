"""Each rank's message handling as CPU time of that rank, serialised with its steps.

akorun runs a rank's gradient step in a worker thread (``asyncio.to_thread`` in
akorun/runtime/lifecycle/training.py) while its event loop receives, verifies, decodes
and applies the peers' messages (akorun/transport/server.py) and seals and encodes its
own (akorun/runtime/outbox.py, the encoding also in a thread). XLA releases the
GIL while it computes, so with a free core the two overlap. On the netns
testbed they do not: every rank is a process on one host whose cores are all
taken by the ranks' steps (as many processes as cores or more), so a second
of message handling is a second of CPU the rank's own step or a co-located
rank's step does not get. The per-message delay of akosim.network.tcpmodel (d) models
when a message becomes usable; `RankCpu` models what the handling costs the
rank's rounds:

- a message's software cost (`TcpParameters.message_cost_s`, sender and
  receiver together) is split in halves: the sender's half is charged when the
  message leaves, each receiver's half when it arrives;
- a charge that falls while the rank is busy (computing, or in its per-round
  overhead, the sends at the round's end included) is CPU the step competed
  with: it is owed, and paid as extra per-round overhead at the end of the
  rank's next step (akosim.planning.compute.ComputeModel.overhead_of asks `settle`), so
  a rank's round is never shorter than its step plus its message handling;
- a charge that falls while the rank waits at its gate costs no round time:
  the rank was idle, and the delay (d) already holds the handling.

This is processor sharing reduced to one rank's ledger: the co-located ranks'
contention for the cores is in the step time itself (akosim.calibration.colocated_compute
measures it with as many processes stepping at once), and the same slowdown
stretches the message cost (akosim.prediction). A rank that never computes (a
parameter server) is never busy and so never charged.
"""

from __future__ import annotations

import math

import simpy

__all__ = ["RankCpu"]


class RankCpu:
    """The message CPU each rank owes its next round (seconds), per simulation.

    Plain lists, not arrays: it is called once per message on the simulation's hot
    path, with one rank or a handful, where numpy's per-call cost dominates."""

    def __init__(self, env: simpy.Environment, nodes: int) -> None:
        self.env = env
        self._computing = [False] * nodes
        self._busy_until_s = [-math.inf] * nodes
        self._owed_s = [0.0] * nodes
        self.charged_s = [0.0] * nodes  # owed and paid, for reports and tests

    def begin_step(self, rank: int) -> None:
        """The rank starts a gradient step: message handling now competes with it."""
        self._computing[rank] = True

    def settle(self, rank: int, overhead_s: float) -> float:
        """The rank's step ended: the message CPU it owes, paid now after its
        `overhead_s`; the rank stays busy until both are spent."""
        self._computing[rank] = False
        owed = self._owed_s[rank]
        self._owed_s[rank] = 0.0
        self._busy_until_s[rank] = float(self.env.now) + overhead_s + owed
        return owed

    def charge(self, rank: int, seconds: float) -> None:
        """`seconds` of message handling by `rank` now."""
        if self._computing[rank] or self._busy_until_s[rank] >= self.env.now:
            self._owed_s[rank] += seconds
            self.charged_s[rank] += seconds

    def charge_each(self, ranks: list[int], seconds: list[float]) -> None:
        """`seconds[i]` of message handling by `ranks[i]` now."""
        for rank, cost in zip(ranks, seconds, strict=True):
            self.charge(rank, cost)
