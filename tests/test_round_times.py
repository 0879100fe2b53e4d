"""A rank's per-round series stay bounded however long it runs (akorun.runtime.records.round_times)
and the figures read from a thinned series are those of every round."""

from __future__ import annotations

import pytest

from akocore.records.run_figures import rank_figures
from akorun.runtime.records.round_times import RoundTimes


def test_the_series_thin_by_doubling_the_stride_and_keep_round_stride_times_i() -> None:
    times = RoundTimes(max_entries=8)
    for round_ in range(100):  # each round: 1 s, of which 0.5 compute and 0.25 at the gate
        times.add(float(round_ + 1), 0.5, 0.25)
        assert len(times.end_s) < 8  # never more than the bound
    assert times.rounds == 100 and times.stride == 16 and times.last_end_s == 100.0
    # entry i is round (i + 1) x 16 - 1, which ended at (i + 1) x 16
    assert times.end_s == [16.0, 32.0, 48.0, 64.0, 80.0, 96.0]
    assert times.overhead_s == pytest.approx([0.25] * 6)  # each kept round's own
    assert len(times.compute_s) == len(times.wait_s) == 6


def test_a_short_run_keeps_every_round() -> None:
    times = RoundTimes()
    for round_ in range(1000):
        times.add(0.01 * (round_ + 1), 0.004, 0.001)
    assert times.stride == 1 and len(times.end_s) == times.rounds == 1000


def test_the_figures_of_a_thinned_series_are_per_round() -> None:
    times = RoundTimes(max_entries=8)
    for round_ in range(100):
        times.add(float(round_ + 1), 0.5, 0.25)
    figures = rank_figures(round_end_s=times.end_s, compute_s=times.compute_s,
                           wait_s=times.wait_s, overhead_s=times.overhead_s,
                           training_workers=2, batch_size=10, bytes_sent_rounds=1000.0,
                           round_stride=times.stride, rounds=times.rounds)
    assert figures.round_time_s == pytest.approx(1.0)  # not the 16 s between entries
    assert figures.samples_per_s == pytest.approx(20.0)
    assert figures.bytes_sent_per_worker_per_round == pytest.approx(10.0)  # 1000 / 100
    assert figures.compute_s_per_round == pytest.approx(0.5)
    assert figures.overhead_s_per_round == pytest.approx(0.25)
