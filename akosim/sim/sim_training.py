"""Training mode: simulated workers really train the shared JAX workload.

`BatchedGradients` is the engine's GradientSource. A worker that starts
computing hands over a copy of its parameters and its next batch; the first
worker whose simulated compute ends triggers one vmapped gradient call for
every pending worker (padded to a fixed replica count, so it compiles once).
Every gradient is therefore taken on the parameters the worker held when its
compute started, and applied by the scheme at the simulated end of compute;
every received partial is applied at its simulated arrival. Evaluation runs
against simulated time, so a run predicts time to accuracy.

A gradient step whose loss or gradient is not finite (the user's NaN: in the
data, or a diverged run) ends the simulation with `NonFiniteStep`, naming the
simulated worker, the round, the batch and its loss (akocore.workloads.nonfinite), the
check akorun's ranks make; nothing is trained on with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from akocore.records.figures import step_seed  # the one per-step seed, shared with akorun
from akocore.workloads.flat import FlatWorkload
from akocore.workloads.nonfinite import NonFiniteStep, nonfinite_line, step_problem
from akocore.workloads.spec import TrainBatches


class BatchedGradients:
    """Pending gradient requests, computed together in one vmapped call."""

    def __init__(self, workload: FlatWorkload, ranks: list[int], seed: int,
                 replicas: int = 0) -> None:
        self.workload = workload
        self.ranks = ranks
        self.seed = seed
        # the replica count every call is padded to: at least one per rank (more lets runs
        # of different worker counts share one compilation)
        self.replicas = max(len(ranks), replicas)
        self.streams: dict[int, TrainBatches] = {
            rank: workload.batches(i, len(ranks), seed) for i, rank in enumerate(ranks)}
        self._pending: dict[int, tuple[np.ndarray, Any, Any, int]] = {}
        self._pending_batch: dict[int, tuple[int, Any]] = {}  # round and batch, for the NaN line
        self._ready: dict[int, np.ndarray] = {}
        self.last_loss: dict[int, float] = {}
        self.gradient_sum = np.zeros(workload.param_count, np.float64)  # for invariants
        self.calls = 0

    def begin(self, rank: int, round_: int, params: np.ndarray) -> None:
        batch = self.streams[rank].next()
        self._pending[rank] = (params.copy(), batch.x, batch.y,
                               step_seed(self.seed, rank, round_))
        self._pending_batch[rank] = (round_, batch)

    def result(self, rank: int) -> np.ndarray:
        if rank not in self._ready:
            self._compute_pending()
        return self._ready.pop(rank)

    def _compute_pending(self) -> None:
        ranks = list(self._pending)
        items = [self._pending.pop(r) for r in ranks]
        pad = self.replicas - len(items)
        items += [items[0]] * pad  # fixed replica count: one compilation
        params = np.stack([i[0] for i in items])
        xs = _stack([i[1] for i in items])
        ys = _stack([i[2] for i in items])
        seeds = np.asarray([i[3] for i in items], dtype=np.int32)
        losses, grads = self.workload.batched_grad_step(params, xs, ys, seeds)
        self.calls += 1
        for k, rank in enumerate(ranks):
            grad = np.array(grads[k], dtype=np.float32)
            round_, batch = self._pending_batch.pop(rank)
            problem = step_problem(float(losses[k]), grad)
            if problem is not None:
                raise NonFiniteStep(nonfinite_line(
                    who=f"simulated worker {rank}", round_=round_, batch=batch,
                    loss=float(losses[k]), problem=problem))
            self._ready[rank] = grad
            self.last_loss[rank] = float(losses[k])
            self.gradient_sum += grad


def _stack(batches: list[Any]) -> Any:
    """Batches (arrays or pytrees of arrays) stacked on a new first axis."""
    import jax

    return jax.tree_util.tree_map(lambda *leaves: np.stack(leaves), *batches)


@dataclass
class Evaluation:
    """Accuracy of one replica at a simulated instant."""

    sim_time_s: float
    round: int
    accuracy: float


@dataclass
class AccuracyTracker:
    """Evaluates the watched replica every `every` rounds; flags the target."""

    workload: FlatWorkload
    every: int
    target: float | None = None
    history: list[Evaluation] = field(default_factory=list)

    def evaluate(self, params: np.ndarray, round_: int, sim_time_s: float) -> bool:
        """Record the accuracy; True when the target is reached."""
        accuracy = float(self.workload.evaluate(params))
        self.history.append(Evaluation(sim_time_s, round_, accuracy))
        return self.target is not None and accuracy >= self.target

    def time_to(self, target: float) -> float | None:
        for point in self.history:
            if point.accuracy >= target:
                return point.sim_time_s
        return None
