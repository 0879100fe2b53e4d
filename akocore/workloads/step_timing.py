"""How both shells time a workload's gradient step: one step count, one warm-up, one rule.

akorun times the step behind ``p auto`` and akosim times it for ``--compute
measure``; both call `FlatWorkload.measure_compute_s` with the constants here,
so the two tools plan from the same measurement. The clock is the shell's
(akocore reads none): `time_gradient_step` takes it as an argument.

`time_gradient_step` stops as soon as the median step time is known within ±5%
at 90% confidence (a distribution-free interval of order statistics,
`median_interval`), after at least 5 steps, or after a few seconds of timed
steps, or at `MEASURE_STEPS`, and says the interval it reached (`StepTiming`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from akocore.workloads.flat import FlatWorkload

MEASURE_STEPS = 20  # the most timed gradient steps of one measurement (median)
MEASURE_WARMUP = 3  # untimed steps first: the compile, then two to settle

# the stopping rule: the median step time within ±5% at 90% confidence
TIMING_CONFIDENCE = 0.9
TIMING_REL_HALFWIDTH = 0.05
TIMING_MIN_STEPS = 5  # the fewest steps whose order statistics give a 90% interval
TIMING_BUDGET_S = 4.0  # timed seconds after which the interval reached is what it is


@dataclass(frozen=True)
class StepTiming:
    """A measured gradient step: the median of `steps` timed steps and a distribution-free
    interval [low_s, high_s] that holds the true median with probability >= confidence
    (None when too few steps give no such interval)."""

    compute_s: float
    steps: int
    low_s: float | None
    high_s: float | None
    confidence: float

    def rel_halfwidth(self) -> float:
        """The interval's larger distance from the median, relative to it (inf if none)."""
        if self.low_s is None or self.high_s is None or self.compute_s <= 0:
            return math.inf
        return max(self.compute_s - self.low_s, self.high_s - self.compute_s) / self.compute_s

    def describe(self) -> str:
        """E.g. "median of 7 steps, within ±3.1% at 90% confidence"."""
        text = f"median of {self.steps} step{'s' if self.steps != 1 else ''}"
        width = self.rel_halfwidth()
        if math.isfinite(width):
            text += f", within ±{width:.1%} at {self.confidence:.0%} confidence"
        return text


def median_interval(durations_s: list[float],
                    confidence: float = TIMING_CONFIDENCE) -> tuple[float, float] | None:
    """The narrowest order-statistic interval [x(k), x(n+1-k)] of the sorted durations
    that holds the population median with probability >= `confidence`, whatever the
    distribution (binomial with p = 1/2); None when n is too small for any."""
    n = len(durations_s)
    ordered = sorted(durations_s)
    best: tuple[float, float] | None = None
    below = 0.0  # P(Binomial(n, 1/2) <= k - 1)
    for k in range(1, n // 2 + 1):
        below += math.comb(n, k - 1) / 2 ** n
        if 1 - 2 * below < confidence:
            break
        best = (ordered[k - 1], ordered[n - k])
    return best


def timing_is_enough(durations_s: list[float], *, min_steps: int = TIMING_MIN_STEPS,
                     rel_halfwidth: float = TIMING_REL_HALFWIDTH,
                     confidence: float = TIMING_CONFIDENCE,
                     budget_s: float = TIMING_BUDGET_S) -> bool:
    """Stop timing: at least `min_steps`, and the median's interval within
    `rel_halfwidth` of it or `budget_s` seconds already timed."""
    if len(durations_s) < min_steps:
        return False
    if sum(durations_s) >= budget_s:
        return True
    interval = median_interval(durations_s, confidence)
    if interval is None:
        return False
    median = statistics.median(durations_s)
    return max(median - interval[0], interval[1] - median) <= rel_halfwidth * median


def time_gradient_step(workload: FlatWorkload, clock: Callable[[], float],
                       max_steps: int = MEASURE_STEPS) -> StepTiming:
    """The workload's gradient step timed with `clock` until its median is known within
    ±5% at 90% confidence (at least 5 steps, at most `max_steps`, and no more once 4 s
    have been timed), with the interval reached."""
    seen: list[float] = []

    def enough(durations_s: list[float]) -> bool:
        seen[:] = durations_s
        return timing_is_enough(durations_s)

    median_s = workload.measure_compute_s(clock, steps=max_steps, warmup=MEASURE_WARMUP,
                                          enough=enough)
    low_s, high_s = median_interval(seen) or (None, None)
    return StepTiming(median_s, len(seen), low_s, high_s, TIMING_CONFIDENCE)
