"""The fast event path and solver give the round ends the engine gave before (rel 1e-9).

Cases: tests/engine_exactness_cases.py (homogeneous, random per-pair caps,
heterogeneous NICs, latency matrices, PS, ring all-reduce, ssp 0..2, drains).
"""

from __future__ import annotations

import json

import pytest

from tests.engine_exactness_cases import CASES, GOLDEN, relative_gap, run_case

_WANT = json.loads(GOLDEN.read_text())


@pytest.mark.parametrize("name", sorted(CASES))
def test_round_ends_match_the_recorded_engine(name: str) -> None:
    got = run_case(name)
    assert relative_gap(got, _WANT[name]) <= 1e-9


def test_relative_gap_sees_a_difference() -> None:
    want = _WANT["ako_homog_s0"]
    shifted = [row[:-1] + [row[-1] * (1 + 1e-6)] for row in want]
    assert relative_gap(shifted, want) > 1e-9
    assert relative_gap(want[:-1] + [want[-1][:-1]], want) == float("inf")
