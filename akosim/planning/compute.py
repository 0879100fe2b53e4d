"""How long each simulated worker computes each round.

A `ComputeModel` gives the seconds worker i spends on the gradient of round t:
a base time, per-worker speed factors (heterogeneous machines), a relative
jitter (lognormal, mean-preserving) and stragglers (chosen workers slowed by a
factor). Times are deterministic for a seed, so runs are reproducible, and
drawn in blocks so a 1,000-round run does not pay a generator call per round.

`overhead_s` is a per-round cost that is not the gradient: what a real process
spends each round dispatching its sends, folding its inbox, applying the
optimizer and running its event loop (akorun measures it as
``overhead_s_per_round``). It is not scaled by speed factors, stragglers or
jitter; the engine spends it after the gradient and before the round's sends
leave (where akorun spends most of it), as a span of its own, so
``compute_s`` stays the gradient time.

`inside_s` is a rank's inside all-reduce per round when the rank is an island of
several devices (akosim.network.island_reduce: the batch is per device, each device
computes its batch in the gradient time, then the island reduces over its inside
network). It is network time, not compute: not scaled by speed factors,
stragglers or jitter; the engine spends it right after the gradient, as a span
of its own ("inside"), and before the overhead and the sends.

`cpu` (an akosim.network.rank_cpu.RankCpu, one per simulation, set by the TCP-aware
network when message handling is CPU of the ranks) marks each step's start and
adds the message CPU a rank owes to its per-round overhead (`overhead_of`).

`measure_compute_s` times the workload's gradient step with the wall clock
(akocore takes the clock from here); `measure_step_timing` is `--compute
measure`: akocore.workloads.step_timing's `time_gradient_step` (the step count,
warm-up and stopping rule akorun's p auto uses too) with this process's clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from akocore.workloads.step_timing import MEASURE_STEPS, StepTiming, time_gradient_step

if TYPE_CHECKING:
    from akocore.workloads.flat import FlatWorkload
    from akosim.network.rank_cpu import RankCpu

_BLOCK = 256


@dataclass(frozen=True)
class ComputeModel:
    compute_s: float
    speed_factors: tuple[float, ...] = ()  # time multiplier per worker, assigned in turn
    jitter: float = 0.0  # relative standard deviation of each round's time
    stragglers: tuple[int, ...] = ()
    straggler_factor: float = 1.0
    per_worker_s: tuple[float, ...] = ()  # measured times per worker (overrides compute_s)
    seed: int = 0
    overhead_s: float | tuple[float, ...] = 0.0  # per round; a tuple: per worker, in turn
    inside_s: tuple[float, ...] = ()  # per rank: its island's inside all-reduce per round
    cpu: RankCpu | None = field(default=None, compare=False, repr=False)  # per simulation
    _cache: dict[int, np.ndarray] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.compute_s >= 0:
            raise ValueError(f"compute time must be >= 0 s, got {self.compute_s}")
        if any(f <= 0 for f in self.speed_factors):
            raise ValueError("speed factors must be > 0")
        if self.jitter < 0:
            raise ValueError(f"jitter must be >= 0, got {self.jitter}")
        if self.straggler_factor <= 0:
            raise ValueError("straggler factor must be > 0")
        if any(t < 0 for t in self.per_worker_s):
            raise ValueError("measured compute times must be >= 0 s")
        overheads = self.overhead_s if isinstance(self.overhead_s, tuple) else (self.overhead_s,)
        if not overheads or not all(t >= 0 for t in overheads):
            raise ValueError(f"round overhead must be >= 0 s, got {self.overhead_s}")
        if not all(t >= 0 for t in self.inside_s):
            raise ValueError(f"inside all-reduce times must be >= 0 s, got {self.inside_s}")

    def inside_of(self, rank: int) -> float:
        """Seconds per round rank `rank`'s island spends reducing over its inside network."""
        return self.inside_s[rank % len(self.inside_s)] if self.inside_s else 0.0

    def round_busy_s(self, rank: int) -> float:
        """The rank's time per round before its sends, without jitter: its gradient
        (`base_s`) and its island's inside all-reduce (what the planner weighs sends
        against)."""
        return self.base_s(rank) + self.inside_of(rank)

    def overhead_of(self, rank: int) -> float:
        """Seconds per round worker `rank` spends outside the gradient (not jittered),
        with `cpu`: called at the end of its step, plus the message CPU it owes."""
        if isinstance(self.overhead_s, tuple):
            base = float(self.overhead_s[rank % len(self.overhead_s)])
        else:
            base = float(self.overhead_s)
        if self.cpu is not None:
            return base + self.cpu.settle(rank, base)
        return base

    def base_s(self, rank: int) -> float:
        base = self.per_worker_s[rank % len(self.per_worker_s)] if self.per_worker_s \
            else self.compute_s
        if self.speed_factors:
            base *= self.speed_factors[rank % len(self.speed_factors)]
        if rank in self.stragglers:
            base *= self.straggler_factor
        return base

    def mean_s(self, workers: int) -> float:
        return float(np.mean([self.base_s(i) for i in range(workers)]))

    def time_s(self, rank: int, round_: int) -> float:
        """Seconds of worker `rank`'s step of `round_` (with `cpu`: called as it starts)."""
        if self.cpu is not None:
            self.cpu.begin_step(rank)
        base = self.base_s(rank)
        if self.jitter == 0 or base == 0:
            return base
        block, index = divmod(round_, _BLOCK)
        key = rank * 1_000_003 + block
        draws = self._cache.get(key)
        if draws is None:
            rng = np.random.default_rng((self.seed, rank, block))
            sigma = np.sqrt(np.log1p(self.jitter**2))
            draws = rng.lognormal(-sigma**2 / 2, sigma, _BLOCK)
            if len(self._cache) > 4096:
                self._cache.clear()
            self._cache[key] = draws
        return base * float(draws[index])


def measure_compute_s(workload: FlatWorkload, steps: int | None = None) -> float:
    """`--compute measure`: median wall seconds of one gradient step of `workload`
    (`steps` timed steps, the workload's default if None), timed with this
    process's monotonic clock (the shell's job, not akocore's)."""
    if steps is None:
        return workload.measure_compute_s(time.perf_counter)
    return workload.measure_compute_s(time.perf_counter, steps=steps)


def measure_step_timing(workload: FlatWorkload, max_steps: int = MEASURE_STEPS,
                        clock: Callable[[], float] = time.perf_counter) -> StepTiming:
    """`--compute measure`: the workload's gradient step timed the way akorun times it for
    p auto (akocore.workloads.step_timing), with this process's monotonic clock."""
    return time_gradient_step(workload, clock, max_steps)
