"""--compute measure stops timing once the median step time is known closely enough.

The clock and the step are fakes: nothing here times JAX.
"""

from __future__ import annotations

import math
from itertools import count
from pathlib import Path

import numpy as np
import pytest

from akocore.workloads.flat import FlatWorkload, build_workload
from akocore.workloads.step_timing import (
    MEASURE_STEPS,
    MEASURE_WARMUP,
    StepTiming,
    median_interval,
    timing_is_enough,
)
from akosim.planning.compute import measure_step_timing
from akosim.planning.compute_cache import CacheKey, measured_compute


def test_the_median_interval_needs_five_values_for_90_percent() -> None:
    assert median_interval([1.0, 2.0, 3.0, 4.0]) is None
    assert median_interval([5.0, 1.0, 3.0, 2.0, 4.0]) == (1.0, 5.0)  # 1 - 2/32 >= 0.9
    # more values: a narrower pair of order statistics keeps the confidence
    low, high = median_interval([float(v) for v in range(1, 21)])
    assert (low, high) == (6.0, 15.0)  # k = 6 for n = 20 at 90%


def test_the_median_interval_holds_the_median_as_often_as_it_says() -> None:
    rng = np.random.default_rng(0)
    trials, hits = 4000, 0
    for _ in range(trials):
        sample = rng.exponential(1.0, 9).tolist()  # skewed, like step times
        low, high = median_interval(sample)
        hits += low <= math.log(2) <= high
    assert hits / trials >= 0.89  # >= 90% up to sampling error (n=9: 96% exactly)


def test_steady_steps_stop_after_five_and_noisy_ones_run_to_the_budget() -> None:
    steady = [0.200, 0.201, 0.199, 0.202, 0.200]
    assert not timing_is_enough(steady[:4])
    assert timing_is_enough(steady)
    noisy = [0.2, 0.3, 0.2, 0.3, 0.25, 0.22]
    assert not timing_is_enough(noisy)
    assert not timing_is_enough(noisy * 2)  # 2.94 s timed, interval 0.2-0.3 s
    assert timing_is_enough(noisy * 2, budget_s=2.5)  # the budget ends it
    assert timing_is_enough([0.9, 1.3, 0.9, 1.3, 1.1])  # 5.5 s timed: past the 4 s budget


def _counted_steps(monkeypatch) -> tuple[FlatWorkload, list[int]]:
    """A workload whose gradient step does nothing but note its seed (one per step)."""
    workload = build_workload("digits-mlp")
    seeds: list[int] = []

    def fake_step(self, params, x, y, seed=0):
        seeds.append(seed)
        return 0.0, params

    monkeypatch.setattr(type(workload), "grad_step", fake_step)
    return workload, seeds


def test_measure_step_timing_stops_early_and_says_how_close(monkeypatch) -> None:
    workload, seeds = _counted_steps(monkeypatch)
    ticks = count()
    step_s = [0.100, 0.101, 0.099, 0.102, 0.100, 0.5, 0.5, 0.5]

    def clock() -> float:  # start, end of each timed step
        tick = next(ticks)
        return sum(step_s[:tick // 2]) + (step_s[tick // 2] if tick % 2 else 0.0)

    timing = measure_step_timing(workload, max_steps=30, clock=clock)
    assert timing.steps == 5 and len(seeds) == 3 + 5  # 3 warm-up steps, then 5 timed
    assert timing.compute_s == pytest.approx(0.100)
    assert (timing.low_s, timing.high_s) == pytest.approx((0.099, 0.102))
    assert timing.describe() == "median of 5 steps, within ±2.0% at 90% confidence"


def test_measure_compute_s_times_at_most_steps_when_never_enough(monkeypatch) -> None:
    workload = build_workload("digits-mlp")
    monkeypatch.setattr(type(workload), "grad_step", lambda self, p, x, y, seed=0: (0.0, p))
    ticks = count()
    seen: list[int] = []

    def never(durations: list[float]) -> bool:
        seen.append(len(durations))
        return False

    assert workload.measure_compute_s(lambda: float(next(ticks)), steps=7, warmup=1,
                                      enough=never) == pytest.approx(1.0)
    assert seen == [1, 2, 3, 4, 5, 6, 7]


def test_akosim_times_the_step_as_akorun_does_for_p_auto(monkeypatch) -> None:
    """--compute measure and akorun's p auto (the workload's default measurement) take the
    same warm-up and at most the same number of timed steps."""
    workload, seeds = _counted_steps(monkeypatch)
    ticks = count()
    noisy = [0.1, 0.3, 0.2, 0.5, 0.15, 0.4]

    def clock() -> float:  # never settles within ±5%, and stays under the 4 s budget
        tick = next(ticks)
        return tick // 2 * 0.001 + (noisy[tick // 2 % len(noisy)] / 100 if tick % 2 else 0.0)

    timing = measure_step_timing(workload, clock=clock)
    akosim_seeds, seeds[:] = list(seeds), []
    workload.measure_compute_s(clock)
    assert timing.steps == MEASURE_STEPS
    assert akosim_seeds == seeds == list(range(MEASURE_WARMUP + MEASURE_STEPS))


def test_the_record_keeps_the_steps_timed_and_the_line_says_the_interval(
        tmp_path: Path) -> None:
    key = CacheKey("synthetic-cnn", 104, "sgd", "Test CPU x2 x86_64", "0.0.1")
    timing = StepTiming(0.25, 7, 0.24, 0.26, 0.9)
    fresh = measured_compute(key, lambda: (timing, 1000), steps=30, directory=tmp_path)
    assert fresh.record.steps == 7 and fresh.record.compute_s == 0.25
    assert "(median of 7 steps, within ±4.0% at 90% confidence)" in fresh.provenance()
    cached = measured_compute(key, lambda: (9.0, 1000), steps=30, directory=tmp_path)
    assert not cached.fresh and cached.record == fresh.record
