"""The regression verdict on repeated paired measurements (pure: no clocks, no I/O).

A figure is measured `n` times, each time beside its reference (the two timed
back to back), giving `n` paired ratios. Its value is their median, and
`median_interval` gives a distribution-free interval of order statistics
[x(k), x(n+1-k)] that holds the true median with probability >= the
confidence (binomial with p = 1/2; for n < 5 at 90% no such pair exists, and
the interval is [min, max] at the coverage it has, 1 - 2^(1-n)).

`judge` compares that interval with the baseline's value widened by the
figure's tolerance: a figure REGRESSED only when the whole interval lies
beyond the tolerated bound, so one disturbed repetition (another job taking
the core) cannot fail the run, while a real regression (every repetition
slower) does. A single sample is an interval of one point: the old rule.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

CONFIDENCE = 0.9


@dataclass(frozen=True)
class Interval:
    """The median of samples and an interval that holds the true median with
    probability >= coverage."""

    median: float
    low: float
    high: float
    coverage: float
    samples: int

    def text(self) -> str:
        if self.samples <= 1:
            return f"{self.median:.4g}"
        return f"{self.median:.4g} [{self.low:.4g}-{self.high:.4g}]"


def median_interval(samples: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """The median of `samples` and the narrowest symmetric pair of order statistics
    covering the true median with probability >= `confidence`; with too few samples
    for that, [min, max] at its own coverage."""
    if not samples:
        raise ValueError("no samples")
    ordered = sorted(samples)
    n = len(ordered)
    median = statistics.median(ordered)
    if n == 1:
        return Interval(median, median, median, 0.0, 1)
    low, high, coverage = ordered[0], ordered[-1], 1 - 2 * 0.5 ** n
    below = 0.0  # P(Binomial(n, 1/2) <= k - 1)
    for k in range(1, n // 2 + 1):
        below += math.comb(n, k - 1) / 2 ** n
        if 1 - 2 * below < confidence:
            break
        low, high, coverage = ordered[k - 1], ordered[n - k], 1 - 2 * below
    return Interval(median, low, high, coverage, n)


@dataclass(frozen=True)
class Verdict:
    """One figure against its baseline: status is "new" (no baseline), "info" (no
    tolerance), "ok", "REGRESSED" or "improved" (the whole interval beyond the
    tolerance the other way: time to store a new baseline)."""

    status: str
    change: float | None  # median / baseline - 1
    bound: float | None  # the tolerated value (baseline widened by the tolerance)

    @property
    def regressed(self) -> bool:
        return self.status == "REGRESSED"


def judge(interval: Interval, base: float | None, tolerance: float | None, *,
          higher_is_better: bool) -> Verdict:
    """The verdict on `interval` (this run) against the baseline value `base`."""
    if base is None or not math.isfinite(base) or base == 0:
        return Verdict("new", None, None)
    change = interval.median / base - 1
    if tolerance is None:
        return Verdict("info", change, None)
    if higher_is_better:
        bound, better = base * (1 - tolerance), base * (1 + tolerance)
        if interval.high < bound:
            return Verdict("REGRESSED", change, bound)
        return Verdict("improved" if interval.low > better else "ok", change, bound)
    bound, better = base * (1 + tolerance), base * (1 - tolerance)
    if interval.low > bound:
        return Verdict("REGRESSED", change, bound)
    return Verdict("improved" if interval.high < better else "ok", change, bound)
