"""A rank that becomes ready tells every peer so, even one that told it first.

The join's readiness barrier (akorun.runtime.lifecycle.join): a rank starts only once every peer
said it is ready. A peer that said so while we were not ready yet still waits for our
word; if we started without giving it, then died a few rounds later, that peer would
take us for a rank that died in the join and end the run the others already train
(seen under load: a DiLoCo member killed after round 4 ended the join of a slow peer).
Driven with a scripted control client (milliseconds).
"""

from __future__ import annotations

import asyncio
from typing import Any

from akorun.metrics import Metrics
from akorun.runtime.lifecycle.join import Identity, Join
from akorun.runtime.lifecycle.phase import PhaseMachine
from akorun.runtime.liveness.peer_liveness import Liveness
from akorun.runtime.liveness.waiting import Waiter
from akorun.testing import BuiltWhen, one_rank_context
from akorun.transport.client import ControlAnswer
from akorun.transport.control import ControlKind

IDENTITY = Identity(0, "run", "config", "params")


class PeerReadyFirst:
    """Rank 1 answers our first hello while we are not ready (it is not either), and
    its own ready hello reaches us during that call; later hellos are answered ready."""

    def __init__(self) -> None:
        self.join: Join | None = None
        self.sent: list[dict[str, Any]] = []

    async def call(self, rank: int, kind: ControlKind, payload: dict[str, Any], *,
                   timeout_s: float = 10.0, binary: bool = False) -> ControlAnswer:
        assert kind is ControlKind.HELLO and rank == 1 and self.join is not None
        self.sent.append(dict(payload))
        await asyncio.sleep(0)
        first = len(self.sent) == 1
        if first:
            self.join.ready_peers.add(1)  # rank 1's ready hello, handled meanwhile
        return ControlAnswer(200, {**IDENTITY.payload(), "rank": 1, "ready": not first},
                             authentic=True)


def test_a_ready_rank_tells_a_peer_that_was_ready_first_before_it_starts() -> None:
    phase = PhaseMachine()
    liveness = Liveness(rank=0, peers=[1], timeout_s=60.0, node=lambda: None,
                        clock=lambda: 0.0, metrics=Metrics(0, "worker"), phase=phase)
    built: list[int] = []
    control = PeerReadyFirst()
    context = one_rank_context(0, [1], role=BuiltWhen(built), phase=phase,
                               hosts=("h:0", "h:1"), join_timeout_s=30.0)
    join = Join(context, identity=IDENTITY, waiter=Waiter(report_every_s=5.0),
                liveness=liveness, build_node=lambda compute_s: built.append(len(control.sent)))
    control.join = join
    asyncio.run(join.join(control))  # type: ignore[arg-type]
    assert built, "the node was not built"
    told_ready = [i for i, payload in enumerate(control.sent) if payload.get("ready") is True]
    assert told_ready, f"rank 1 was never told we are ready: {control.sent}"
    assert told_ready[0] < built[0]  # before the node was built (training started)
