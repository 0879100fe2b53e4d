"""akocore figures: gradient steps per second, accumulate-and-partition throughput."""

from __future__ import annotations

import numpy as np

from akocore.partition import accumulate_and_take, partition_slice
from akocore.workload import build_workload
from tests.bench.common import Figure, best_of


def _steps_per_s(name: str, batch_size: int, steps: int) -> float:
    workload = build_workload(name, batch_size=batch_size, seed=0)
    stream = workload.batches(0, 1, 0)
    batch = stream.next()
    params = np.array(workload.init_params)
    workload.grad_step(params, batch.x, batch.y, 0)  # compile
    seconds = best_of(3, lambda: [workload.grad_step(params, batch.x, batch.y, i)
                                  for i in range(steps)])
    return steps / seconds


def run() -> list[Figure]:
    figures = [
        Figure("core.seed_cnn_steps_per_s", _steps_per_s("synthetic-cnn", 104, 5), "steps/s",
               note="3 conv + 2 FC, 4,263,434 params, 32x32x3, batch 104"),
        Figure("core.default_workload_steps_per_s", _steps_per_s("digits-mlp", 32, 200),
               "steps/s", note="digits-mlp, batch 32"),
    ]
    length, p = 4_263_434, 8
    rng = np.random.default_rng(0)
    grad = rng.standard_normal(length).astype(np.float32)
    unsent = np.zeros(length, np.float32)
    target = np.empty_like(grad)
    start, stop = partition_slice(length, p, 3)
    accumulate_s = best_of(20, lambda: accumulate_and_take(unsent, grad, start, stop))
    copy_s = best_of(20, lambda: np.copyto(target, grad))
    figures.append(Figure("core.accumulate_partition_vs_copy", copy_s / accumulate_s, "ratio",
                          goal=0.5, note=f"{grad.nbytes / accumulate_s / 1e9:.2f} GB/s vs "
                                         f"numpy copy {grad.nbytes / copy_s / 1e9:.2f} GB/s"))
    return figures
