"""akosim sweep's summary table (best configuration per group) and its plot."""

from __future__ import annotations

import math
from pathlib import Path

from akocore.records.results import RunResult
from akosim.sweeping.sweep_summary import SweepRow, best_per_group, format_summary


def _row(workers: str, bandwidth: str, p: str, samples: float,
         stale: float = 0.0) -> SweepRow:
    grid = (("workers", workers), ("bandwidth", bandwidth), ("p", p))
    run = RunResult(tool="akosim", scheme="ako", p=9 if p == "auto" else int(p), ssp=1.0,
                    workers=int(workers), round_time_s=0.3, samples_per_s=samples,
                    nic_utilisation=0.5, max_uplink_utilisation=0.7,
                    max_downlink_utilisation=0.4, staleness_bound_rounds=stale,
                    bottleneck="uplink")
    return SweepRow(grid, run)


def test_best_per_group_keeps_the_fastest_of_each_cluster() -> None:
    rows = [_row("4", "40mbps", "1", 100), _row("4", "40mbps", "auto", 300, 9),
            _row("16", "40mbps", "1", 50), _row("16", "40mbps", "auto", 50, 9),
            _row("16", "1gbps", "1", math.inf)]
    best = best_per_group(rows)
    assert [(dict(b.group)["workers"], b.p, b.samples_per_s) for b in best] == [
        ("4", 9, 300.0), ("16", 1, 50.0)]  # a tie goes to the fresher; no finite row: none
    assert best[0].candidates == 2
    table = format_summary(best)
    assert "40 Mbit/s" in table and "ako p=9 s=1" in table and "<= 9 rounds" in table
    assert "50% / 70%" in table  # the workers' mean uplink use, then the busiest NIC


def test_akosim_sweep_prints_it_and_analysis_plots_it(tmp_path: Path, capsys) -> None:
    from akosim.sweeping.sweep_grid import run_sweep

    out = tmp_path / "sweep"
    assert run_sweep(["--workers", "2,4", "--bandwidth", "1gbps", "--p", "1,2",
                      "--compute", "10ms", "--gradient-size", "40KB", "--rounds", "6",
                      "--jobs", "1", "--quiet", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "best configuration per group" in text
    assert text.count("ako p=") == 2  # one best row per workers value
    from analysis.__main__ import main as analysis_main

    assert analysis_main(["sweep", str(out)]) == 0
    assert "ako p=" in capsys.readouterr().out
    assert (out / "sweep.png").stat().st_size > 0  # without matplotlib: tests/test_sweep_plot
    assert analysis_main(["sweep", str(tmp_path / "missing")]) == 2
