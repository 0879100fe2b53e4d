"""The benchmark's regression verdict on synthetic paired samples (no timing here).

A real regression (every repetition slower) is caught; noise, even a few
badly disturbed repetitions, is not flagged.
"""

from __future__ import annotations

import math
from itertools import count

import numpy as np
import pytest

from tests.bench.common import Pairs, paired
from tests.bench.verdict import judge, median_interval


def _noisy_ratios(rng: np.random.Generator, true_ratio: float, n: int,
                  disturbed: int = 0) -> list[float]:
    """Paired ratios: lognormal noise of ~10%, `disturbed` of them hit by another job
    on the figure's side only (x1.5 to x3)."""
    ratios = (true_ratio * rng.lognormal(0.0, 0.1, n)).tolist()
    for i in range(disturbed):
        ratios[i] *= rng.uniform(1.5, 3.0)
    return ratios


def test_the_interval_is_min_max_below_five_samples_and_narrows_with_more() -> None:
    few = median_interval([3.0, 1.0, 2.0])
    assert (few.median, few.low, few.high) == (2.0, 1.0, 3.0)
    assert few.coverage == pytest.approx(0.75)
    five = median_interval([5.0, 1.0, 4.0, 2.0, 3.0])
    assert (five.low, five.high) == (1.0, 5.0) and five.coverage == pytest.approx(0.9375)
    many = median_interval([float(v) for v in range(1, 21)])
    assert (many.low, many.high) == (6.0, 15.0) and many.coverage >= 0.9
    one = median_interval([7.0])
    assert (one.low, one.median, one.high) == (7.0, 7.0, 7.0)
    with pytest.raises(ValueError):
        median_interval([])


def test_the_interval_covers_the_true_median_as_often_as_it_claims() -> None:
    rng = np.random.default_rng(1)
    trials, n = 3000, 7
    hits = 0
    for _ in range(trials):
        interval = median_interval(rng.lognormal(0.0, 0.3, n).tolist())
        hits += interval.low <= 1.0 <= interval.high  # lognormal(0, s): median 1
    assert hits / trials >= interval.coverage - 0.02


def test_a_real_regression_is_caught_every_time() -> None:
    rng = np.random.default_rng(2)
    for _ in range(200):  # 2x slower, tolerance 35%: every repetition shows it
        ratios = _noisy_ratios(rng, 2.0, 5)
        verdict = judge(median_interval(ratios), 1.0, 0.35, higher_is_better=False)
        assert verdict.regressed, ratios
    for _ in range(200):  # a throughput cut to 40%
        ratios = _noisy_ratios(rng, 0.4, 5)
        verdict = judge(median_interval(ratios), 1.0, 0.35, higher_is_better=True)
        assert verdict.regressed, ratios


def test_noise_and_a_few_disturbed_repetitions_are_not_flagged() -> None:
    rng = np.random.default_rng(3)
    for _ in range(500):
        ratios = _noisy_ratios(rng, 1.0, 5, disturbed=2)  # 2 of 5 hit by other jobs
        verdict = judge(median_interval(ratios), 1.0, 0.35, higher_is_better=False)
        assert not verdict.regressed, ratios


def test_one_ratio_against_a_wide_tolerance_would_have_flagged_noise() -> None:
    """What the paired verdict replaces: one disturbed ratio alone crosses the bound."""
    ratios = [1.0, 2.4, 1.05, 0.97, 2.6]  # two repetitions where another job took the core
    assert judge(median_interval(ratios[1:2]), 1.0, 1.0, higher_is_better=False).regressed
    assert not judge(median_interval(ratios), 1.0, 1.0, higher_is_better=False).regressed


def test_the_verdict_says_new_info_ok_and_improved() -> None:
    interval = median_interval([1.0, 1.1, 0.9, 1.05, 0.95])
    assert judge(interval, None, 0.35, higher_is_better=False).status == "new"
    assert judge(interval, math.nan, 0.35, higher_is_better=False).status == "new"
    info = judge(interval, 2.0, None, higher_is_better=False)
    assert info.status == "info" and info.change == pytest.approx(-0.5)
    assert judge(interval, 1.0, 0.35, higher_is_better=False).status == "ok"
    assert judge(interval, 2.0, 0.35, higher_is_better=False).status == "improved"
    assert judge(interval, 0.5, 0.35, higher_is_better=True).status == "improved"
    straddling = median_interval([1.2, 1.5, 1.3, 1.4, 1.1])  # low 1.1 < bound 1.35
    assert judge(straddling, 1.0, 0.35, higher_is_better=False).status == "ok"


def test_paired_times_both_sides_back_to_back_in_alternating_order() -> None:
    order: list[str] = []
    ticks = count()
    pairs = paired(lambda: order.append("case"), lambda: order.append("reference"), 4,
                   clock=lambda: float(next(ticks)))
    assert order == ["case", "reference", "reference", "case"] * 2
    assert pairs.ratios() == (1.0,) * 4 and pairs.inverse_ratios() == (1.0,) * 4
    slow = Pairs((2.0, 4.0, 3.0), (1.0, 1.0, 1.0))
    assert slow.ratios() == (2.0, 4.0, 3.0) and slow.median_case_s() == 3.0
