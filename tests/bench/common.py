"""What a benchmark returns: named figures, compared with a stored baseline.

Each module tests/bench/bench_*.py exposes `run() -> list[Figure]`. Timing
figures are ratios measured side by side in the same run wherever a fair
reference exists (a bare SimPy loop, a numpy copy, a blocking socket), so
they travel across machines better than raw seconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Figure:
    name: str  # unique across all benchmarks, e.g. "sim.ako64_homog_wall_s"
    value: float
    unit: str  # "s", "steps/s", "ratio", "MB/s", ...
    higher_is_better: bool = True
    goal: float | None = None  # the goal, if it sets one
    note: str = ""

    def meets_goal(self) -> bool | None:
        if self.goal is None:
            return None
        return self.value >= self.goal if self.higher_is_better else self.value <= self.goal


def best_of(repeats: int, fn: Callable[[], object]) -> float:
    """Smallest wall time of `repeats` calls (the least disturbed by other load)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best
