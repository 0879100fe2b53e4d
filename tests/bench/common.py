"""What a benchmark returns: named figures, compared with a stored baseline.

Each module tests/bench/bench_*.py exposes `run() -> list[Figure]` and
registers nothing else: the runner (tests/bench/__main__.py) finds the
modules by name. A figure's `value` is what the baseline compares: a ratio
to a reference of its own kind measured side by side in the same run (event
work against a bare SimPy loop, JAX work against a plain JAX step, socket
work against a blocking socket, numpy work against a numpy copy, a fresh
interpreter against a fresh interpreter), so that it means the same on any
machine of one kind. `absolute` keeps the raw measurement (seconds, MB/s)
for the issue's goals, which are stated in those units.

A figure measured by `paired` carries its `samples`: one ratio per
repetition, each from the figure and its reference timed back to back (in
alternating order), so that a busy moment of a shared machine hits both
sides of one pair alike. Its value is their median and the verdict
(tests/bench/verdict.py) uses their order-statistic interval.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

# Relative change a figure may show before it counts as regressed, unless the
# baseline stores its own (the machines are shared by several jobs at once).
DEFAULT_TOLERANCE = 0.35


class Skipped(Exception):
    """A benchmark that cannot run here (e.g. the netns testbed without root): reported
    with its reason, not a failure."""


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
    samples: tuple[float, ...] = ()  # the paired ratios behind `value` (their median)
    reference: str = ""  # what `value` is relative to, e.g. "bare SimPy loop"
    # Why the goal is missed where it is known to be (printed only when it is missed).
    known_gap: str = ""

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


@dataclass(frozen=True)
class Pairs:
    """Seconds of a figure's case and of its reference, repetition by repetition."""

    case_s: tuple[float, ...]
    reference_s: tuple[float, ...]

    def ratios(self) -> tuple[float, ...]:
        """case / reference per repetition (a cost: lower is better)."""
        return tuple(c / r for c, r in zip(self.case_s, self.reference_s, strict=True))

    def inverse_ratios(self) -> tuple[float, ...]:
        """reference / case per repetition (a speed: higher is better)."""
        return tuple(r / c for c, r in zip(self.case_s, self.reference_s, strict=True))

    def median_case_s(self) -> float:
        return statistics.median(self.case_s)

    def median_reference_s(self) -> float:
        return statistics.median(self.reference_s)


def paired(case: Callable[[], object], reference: Callable[[], object], repeats: int,
           clock: Callable[[], float] = time.process_time) -> Pairs:
    """Time `case` and `reference` back to back `repeats` times by `clock`, the
    reference first in every other repetition, so that a drift of the machine's
    speed within the run does not favour one side."""
    case_s: list[float] = []
    reference_s: list[float] = []

    def timed(fn: Callable[[], object]) -> float:
        start = clock()
        fn()
        return clock() - start

    for repetition in range(repeats):
        if repetition % 2:
            reference_s.append(timed(reference))
            case_s.append(timed(case))
        else:
            case_s.append(timed(case))
            reference_s.append(timed(reference))
    return Pairs(tuple(case_s), tuple(reference_s))
