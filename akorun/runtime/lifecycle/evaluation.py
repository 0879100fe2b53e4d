"""Test accuracy of this rank's replica, off the training path, and the target-accuracy stop.

Periodic evaluations run on a copy of the parameters in one eval thread (one
at a time); each record carries the end of the evaluated round since the
start of training. ``train.target_accuracy`` is judged on one replica, the
first training rank still in the run (as akosim watches its first worker, so
both tools stop at the same evaluation and the run's time to target is the
stop's): where replicas differ between syncs (DiLoCo's inner steps, Ako's
partial exchange), the first of three to touch the target by chance would
stop the run early with a time to target no record shows. Reaching it stops
this rank; the training loop has every training rank agree on the last round
(runtime.lifecycle.stopping, control ``stop``). A rank that does not train answers a
``stop`` here: it stops too.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from akocore.workloads.flat import FlatWorkload
from akorun.runtime.liveness.waiting import Waiter
from akorun.runtime.rank_context import RankContext
from akorun.transport.client import ControlClient


class Evaluator:
    """Evaluations of one rank and the stops they lead to."""

    def __init__(self, context: RankContext, *, workload: FlatWorkload, waiter: Waiter,
                 heard: Callable[[int], None], training_ranks: Sequence[int] = (),
                 gone: Callable[[int], bool] = lambda peer: False) -> None:
        self.rank = context.rank
        self.peers = list(context.peers)
        self.training_ranks = sorted(training_ranks) or [context.rank]
        self.gone = gone  # a peer out of the run (suspended, left, lost)
        self.workload = workload
        self.metrics = context.metrics
        self.waiter = waiter
        self.target_accuracy = context.cfg.train.target_accuracy
        self.heard = heard
        self.spawn = context.spawn  # run a background task the worker cancels at the end
        self.control: ControlClient | None = None  # set once the session exists
        self.final_accuracy: float | None = None
        self.running = False
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="eval")

    def start(self, params: np.ndarray, round_: int, round_end_s: float) -> None:
        """Evaluate a copy of `params` (round `round_`, ended `round_end_s` after the start
        of training) unless an evaluation is running already."""
        if self.running or not self.evaluates:
            return
        self.running = True
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._pool, self.workload.evaluate,
                                      np.array(params, copy=True))

        def done(fut: asyncio.Future[float]) -> None:
            self.running = False
            if fut.cancelled() or fut.exception() is not None:
                return
            accuracy = float(fut.result())
            self.metrics.evaluations.append((round_end_s, round_, accuracy))
            self.metrics.accuracy = accuracy
            self._check_target(round_, accuracy)

        future.add_done_callback(done)

    @property
    def judges_target(self) -> bool:
        """Whether this rank's replica decides the target: the first training rank still
        in the run."""
        return next((r for r in self.training_ranks if r == self.rank or not self.gone(r)),
                    self.rank) == self.rank

    def _check_target(self, round_: int, accuracy: float) -> None:
        target = self.target_accuracy
        if target is None or accuracy < target or self.waiter.stop_reason is not None \
                or not self.judges_target:
            return
        # the training loop then has every training rank agree on the last round
        # (runtime.lifecycle.stopping), which tells the peers
        self.waiter.request_stop(f"target accuracy {target} reached ({accuracy:.4f} at round "
                                 f"{round_})")

    @property
    def evaluates(self) -> bool:
        """Whether the workload has an evaluation (akorun.Exchange's may have none)."""
        return bool(getattr(self.workload, "evaluates", True))

    async def final(self, params: np.ndarray) -> float | None:
        """The final accuracy (also the last one in the metrics); None without an
        evaluation."""
        if not self.evaluates:
            return None
        self.final_accuracy = await asyncio.get_running_loop().run_in_executor(
            self._pool, self.workload.evaluate, np.array(params, copy=True))
        self.metrics.accuracy = self.final_accuracy
        return self.final_accuracy

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def on_stop(self, sender: int, payload: dict[str, Any]) -> dict[str, Any]:
        """A peer reached the target accuracy."""
        self.heard(sender)
        self.waiter.request_stop(f"rank {sender} reached the target accuracy at round "
                                 f"{payload.get('round')}")
        return {"rank": self.rank, "round": self.metrics.round}
