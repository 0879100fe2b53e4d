"""akocore figures: gradient steps against a plain JAX step, accumulate-and-partition
against a numpy copy, each in repeated pairs with its reference (wall time: the
steps use XLA's threads), the figure the median of the paired ratios.

The plain JAX step is the jitted gradient of a two-layer MLP written inline
with jax.numpy (no akocore), on float32 data of a fixed shape: the machine's
own JAX speed, for the workload steps to be divided by.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np

from akocore.partition import accumulate_and_take, partition_slice
from akocore.workloads.flat import build_workload
from tests.bench.common import Figure, paired

# Steps and memory copies on a shared 2-core machine swing by a third from run to
# run; a real regression (a lost jit, a copy per call) costs 2x and more.
TOLERANCE = 0.6


def plain_jax_step(batch: int, features: int, hidden: int) -> Callable[[], object]:
    """One step of a jitted MLP gradient written with jax.numpy alone (compiled here)."""
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    w1 = jnp.asarray(rng.standard_normal((features, hidden), dtype=np.float32) * 0.01)
    w2 = jnp.asarray(rng.standard_normal((hidden, 10), dtype=np.float32) * 0.01)
    x = jnp.asarray(rng.standard_normal((batch, features), dtype=np.float32))
    y = jnp.asarray(rng.integers(0, 10, batch))

    def loss(params: tuple[jax.Array, jax.Array]) -> jax.Array:
        logits = jnp.tanh(x @ params[0]) @ params[1]
        return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(batch), y])

    grad = jax.jit(jax.grad(loss))

    def step() -> object:
        return jax.block_until_ready(grad((w1, w2)))

    step()  # compile
    return step


def workload_step(name: str, batch_size: int) -> Callable[[], object]:
    """One gradient step of a built-in workload as akocore runs it (compiled here)."""
    workload = build_workload(name, batch_size=batch_size, seed=0)
    batch = workload.batches(0, 1, 0).next()
    params = np.array(workload.init_params)

    def step() -> object:
        return workload.grad_step(params, batch.x, batch.y, 0)

    step()  # compile
    return step


def paired_step_ratios(plain: Callable[[], object], workload: Callable[[], object], *,
                       steps: int, repeats: int) -> tuple[tuple[float, ...], float, float]:
    """(workload / plain seconds per repetition, median plain and workload seconds per
    step): `repeats` pairs of chunks of `steps` steps each, timed back to back (common.
    paired), so that a busy moment of the machine hits both sides of a pair alike."""
    def chunk(step: Callable[[], object]) -> Callable[[], None]:
        def run_chunk() -> None:
            for _ in range(steps):
                step()
        return run_chunk

    pairs = paired(chunk(workload), chunk(plain), repeats, clock=time.perf_counter)
    return (pairs.ratios(), pairs.median_reference_s() / steps,
            pairs.median_case_s() / steps)


def run() -> list[Figure]:
    figures = []
    ratios, plain_big_s, cnn_s = paired_step_ratios(
        plain_jax_step(104, 3072, 1024), workload_step("synthetic-cnn", 104), steps=1,
        repeats=10)
    figures.append(Figure(
        "core.seed_cnn_step_vs_plain_jax", statistics.median(ratios), "x plain JAX step",
        higher_is_better=False, absolute=1 / cnn_s, absolute_unit="steps/s", tolerance=TOLERANCE,
        samples=ratios, reference="plain JAX step",
        note=f"3 conv + 2 FC, 4,263,434 params, 32x32x3, batch 104, vs a plain jitted MLP "
             f"gradient (104 x 3072 -> 1024 -> 10) at {1 / plain_big_s:.1f} steps/s"))
    ratios, plain_small_s, mlp_s = paired_step_ratios(
        plain_jax_step(32, 64, 64), workload_step("digits-mlp", 32), steps=10, repeats=30)
    figures.append(Figure(
        "core.default_workload_step_vs_plain_jax", statistics.median(ratios),
        "x plain JAX step", higher_is_better=False, absolute=1 / mlp_s,
        absolute_unit="steps/s", tolerance=TOLERANCE, samples=ratios,
        reference="plain JAX step",
        note=f"digits-mlp, batch 32, vs a plain jitted MLP gradient (32 x 64 -> 64 -> 10) "
             f"at {1 / plain_small_s:,.0f} steps/s"))
    length, p = 4_263_434, 8
    rng = np.random.default_rng(0)
    grad = rng.standard_normal(length).astype(np.float32)
    unsent = np.zeros(length, np.float32)
    target = np.empty_like(grad)
    start, stop = partition_slice(length, p, 3)
    pairs = paired(lambda: accumulate_and_take(unsent, grad, start, stop),
                   lambda: np.copyto(target, grad), 20, clock=time.perf_counter)
    speeds = pairs.inverse_ratios()
    figures.append(Figure(
        "core.accumulate_partition_vs_copy", statistics.median(speeds), "ratio", goal=0.5,
        tolerance=TOLERANCE, samples=speeds, reference="numpy copy",
        note=f"{grad.nbytes / pairs.median_case_s() / 1e9:.2f} GB/s vs numpy copy "
             f"{grad.nbytes / pairs.median_reference_s() / 1e9:.2f} GB/s (medians of 20 "
             f"pairs)"))
    return figures
