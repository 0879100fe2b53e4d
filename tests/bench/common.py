"""What a benchmark returns: named figures, compared with a stored baseline.

Each module tests/bench/bench_*.py exposes `run() -> list[Figure]` and
registers nothing else: the runner (tests/bench/__main__.py) finds the
modules by name. A figure's `value` is what the baseline compares: a ratio
to a reference measured side by side in the same process (a bare SimPy loop,
a numpy copy, a blocking socket, a plain JAX step), so that it means the same
on any machine of one kind. `absolute` keeps the raw measurement (seconds,
MB/s) for the issue's goals, which are stated in those units.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

# Relative change a figure may show before it counts as regressed, unless the
# baseline stores its own (the machines are shared by several jobs at once).
DEFAULT_TOLERANCE = 0.35


@dataclass(frozen=True)
class Figure:
    name: str  # unique across all benchmarks, e.g. "sim.ako64_homog_1000r_vs_simpy"
    value: float  # compared with the baseline
    unit: str  # "ratio", "x bare SimPy loop", "MB", ...
    higher_is_better: bool = True
    goal: float | None = None  # the goal, on `absolute` if given, else on `value`
    note: str = ""
    absolute: float | None = None  # the raw measurement behind `value`, if it is a ratio
    absolute_unit: str = ""
    # Stored in the baseline by --update-baseline; None: informational, never regresses.
    tolerance: float | None = DEFAULT_TOLERANCE

    def goal_value(self) -> float:
        return self.value if self.absolute is None else self.absolute

    def meets_goal(self) -> bool | None:
        if self.goal is None:
            return None
        measured = self.goal_value()
        return measured >= self.goal if self.higher_is_better else measured <= self.goal


def best_of(repeats: int, fn: Callable[[], object],
            clock: Callable[[], float] = time.perf_counter) -> float:
    """Smallest time of `repeats` calls (the least disturbed by other load), by
    `clock`: wall time, or `time.process_time` for this process's CPU time,
    which other jobs on the machine disturb far less."""
    best = float("inf")
    for _ in range(repeats):
        start = clock()
        fn()
        best = min(best, clock() - start)
    return best
