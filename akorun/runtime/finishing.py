"""The end of a rank's run, after its rounds:

    deliver node.finish(t); flush the queues
    wait until node.drained()             # the peer timeout covers dead peers
    node.settle(); final checkpoint; final accuracy; results; "done" to peers;
    wait a grace period for the peers' "done"

Deadlines on these waits, and what a failed final write does, belong here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from akorun.client import ControlClient
from akorun.control import ControlKind
from akorun.runtime.checkpoints import CheckpointWriter
from akorun.runtime.evaluation import Evaluator
from akorun.runtime.liveness import Liveness
from akorun.runtime.outbox import Outbox
from akorun.runtime.phase import Phase, PhaseMachine
from akorun.runtime.results import ResultBuilder
from akorun.runtime.roles import Role
from akorun.runtime.training import TrainingLoop
from akorun.runtime.waiting import Waiter

log = logging.getLogger("akorun")

DONE_TIMEOUT_S = 2.0


class Finisher:
    """Drains, settles and reports one rank, then says goodbye to its peers."""

    def __init__(self, *, rank: int, peers: Sequence[int], role: Role, phase: PhaseMachine,
                 waiter: Waiter, outbox: Outbox, liveness: Liveness, training: TrainingLoop,
                 evaluator: Evaluator, checkpoints: CheckpointWriter, results: ResultBuilder,
                 grace_s: float) -> None:
        self.rank = rank
        self.peers = list(peers)
        self.role = role
        self.phase = phase
        self.waiter = waiter
        self.outbox = outbox
        self.liveness = liveness
        self.training = training
        self.evaluator = evaluator
        self.checkpoints = checkpoints
        self.results = results
        self.grace_s = grace_s

    async def finish(self, control: ControlClient) -> None:
        node = self.role.node
        assert node is not None
        self.phase.to(Phase.FINISHING)
        if self.role.trains:
            await self.outbox.dispatch(node.finish(self.training.rounds_done))
        drained = await self.waiter.until(node.drained)
        await self.outbox.flush(lambda j: j in node.suspended, lambda: self.waiter.hard_stop)
        node.settle()
        self.phase.to(Phase.DONE)
        if not drained:
            log.warning("stopped before every peer's last message arrived")
        await self.checkpoints.write()
        if self.role.trains and node.params is not None:
            await self.evaluator.final(node.params)
        self.results.write()
        await asyncio.gather(*(control.call(j, ControlKind.DONE, {"rank": self.rank},
                                            timeout_s=DONE_TIMEOUT_S)
                               for j in self.peers if j not in node.suspended))
        done_peers = self.liveness.done_peers
        await self.waiter.until(lambda: all(j in done_peers or j in node.suspended
                                            for j in self.peers), self.grace_s)
