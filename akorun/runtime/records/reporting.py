"""What a rank shows while it runs: ``/status`` JSON, ``/metrics`` text and progress lines.

Read-only views of the collaborators' state; nothing here changes the run.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from akorun.metrics import ProgressLine, render_prometheus
from akorun.runtime.liveness.peer_liveness import Liveness
from akorun.runtime.liveness.waiting import Waiter
from akorun.runtime.outbox import Outbox
from akorun.runtime.rank_context import RankContext

log = logging.getLogger("akorun")


class Reporter:
    """Status, Prometheus gauges and the periodic progress line of one rank."""

    def __init__(self, context: RankContext, *, outbox: Outbox, liveness: Liveness,
                 waiter: Waiter) -> None:
        self.role = context.role
        self.phase = context.phase
        self.metrics = context.metrics
        self.outbox = outbox
        self.liveness = liveness
        self.waiter = waiter
        self.run_id = context.run_id
        self.config_hash = context.config_hash
        self._progress = ProgressLine()

    def status(self, digest: bool = False) -> dict[str, Any]:
        node = self.role.node
        p_of = self.role.p_of
        next_round = node.next_round if node is not None else 0
        result: dict[str, Any] = {
            "rank": self.role.rank,
            "role": self.role.name,
            "state": self.phase.name,
            "run_id": self.run_id,
            "config_hash": self.config_hash,
            "scheme": self.role.cfg.exchange.scheme,
            "p": list(p_of) if p_of else None,
            "round": self.metrics.round,
            "next_round": next_round,
            "finished": bool(node.finished) if node is not None else False,
            "waiting_on": node.waiting_on(next_round) if node is not None else [],
            "lag": node.lag(next_round) if node is not None else 0,
            "suspended": sorted(node.suspended) if node is not None else [],
            "done_peers": sorted(self.liveness.done_peers),
            "queue_depth": {str(j): d for j, d in self.outbox.depths().items()},
            "acked_round": {str(j): r for j, r in self.outbox.acked_rounds().items()},
            "stop_reason": self.waiter.stop_reason,
            "metrics": self.metrics.as_dict(),
        }
        result.update(self.role.status_extras(digest))
        return result

    def prometheus(self) -> str:
        node = self.role.node
        loop_now = asyncio.get_running_loop().time()
        gauges: dict[str, Any] = {
            "queue_depth": self.outbox.depths(),
            "last_heard_age_s": {j: loop_now - t for j, t in self.liveness.last_heard.items()},
        }
        if node is not None:
            gauges["lag_rounds"] = node.lag(node.next_round)
            gauges["suspended"] = set(node.suspended)
        return render_prometheus(self.metrics, gauges)

    async def progress(self, every_s: float) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(every_s)
            node = self.role.node
            if node is None:
                continue
            self.metrics.state = self.phase.name
            t = node.next_round
            log.info("%s", self._progress.line(loop.time(), self.metrics, node.lag(t),
                                               node.waiting_on(t), node.suspended))
