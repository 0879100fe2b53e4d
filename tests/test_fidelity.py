"""The fidelity figures: MAPE and Kendall's tau, worked by hand."""

from __future__ import annotations

import math

import pytest

from analysis.fidelity import Pair, kendall_tau, mape


def test_mape_is_the_mean_absolute_relative_error() -> None:
    pairs = [Pair("a", 1.0, 1.1), Pair("b", 2.0, 1.8), Pair("c", 4.0, 4.0)]
    assert mape(pairs) == pytest.approx((0.1 + 0.1 + 0.0) / 3)


def test_mape_skips_unmeasured_configurations() -> None:
    assert mape([Pair("a", 0.0, 1.0), Pair("b", 2.0, 3.0)]) == pytest.approx(0.5)
    assert math.isnan(mape([]))


def test_kendall_tau_counts_concordant_minus_discordant_pairs() -> None:
    same_order = [Pair(str(i), m, p) for i, (m, p) in enumerate([(1, 10), (2, 20), (3, 30)])]
    assert kendall_tau(same_order) == pytest.approx(1.0)
    one_swap = [Pair(str(i), m, p) for i, (m, p) in enumerate([(1, 10), (2, 30), (3, 20),
                                                                (4, 40)])]
    # 6 pairs, 5 concordant, 1 discordant -> (5 - 1) / 6
    assert kendall_tau(one_swap) == pytest.approx(4 / 6)
    assert kendall_tau([Pair(str(i), m, -m) for i, m in enumerate([1, 2, 3])]) == \
        pytest.approx(-1.0)
