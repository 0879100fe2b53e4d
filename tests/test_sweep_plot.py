"""The sweep plot: labels that do not cover one another, staleness shown, and a missing
matplotlib named with the extra that installs it."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from akocore.extras import MissingExtra, install_command, require
from akosim.sweeping.sweep_summary import BestRow
from analysis.sweep_plot import Box, choice_label, lines_of, main, plot, stack_labels


def _best(workers: str, bandwidth: str, p: int, stale: float, scheme: str = "ako",
          ssp: float = 2.0) -> BestRow:
    return BestRow(group=(("workers", workers), ("bandwidth", bandwidth)), scheme=scheme,
                   p=p, ssp=ssp, round_time_s=0.5, samples_per_s=100.0 * int(workers),
                   nic_utilisation=0.5, busiest_nic_utilisation=0.6,
                   staleness_bound_rounds=stale, bottleneck="uplink",
                   candidates=4)


def test_stacked_labels_cover_none_of_each_other() -> None:
    boxes = [Box(100, 50, 40, 10), Box(102, 52, 40, 10), Box(101, 49, 40, 10),
             Box(300, 50, 40, 10)]
    shifts = stack_labels(boxes)
    moved = [Box(b.x, b.y - s, b.width, b.height) for b, s in zip(boxes, shifts, strict=True)]
    for i, a in enumerate(moved):
        for b in moved[i + 1:]:
            assert not a.overlaps(b), (a, b)
    assert shifts[1] == 0.0 == shifts[3]  # the highest of a pile and a lone label stay
    assert all(s >= 0 for s in shifts)


def test_lines_carry_the_staleness_bound_and_the_choice() -> None:
    best = [_best("8", "40mbps", 41, 42), _best("4", "40mbps", 18, 19),
            _best("4", "1gbps", 1, 0, scheme="allreduce"), _best("8", "1gbps", 2, math.inf,
                                                                  ssp=math.inf)]
    lines = lines_of(best)
    assert [line.name for line in lines] == ["bandwidth 40mbps", "bandwidth 1gbps"]
    assert lines[0].workers == (4.0, 8.0) and lines[0].staleness_rounds == (19, 42)
    assert lines[0].labels == ("p=18 s=2", "p=41 s=2")
    assert lines[1].labels == ("allreduce", "p=2 s=inf")
    assert choice_label(best[3]) == "p=2 s=inf"


def test_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    best = [_best(w, b, p, p + 1) for w in ("4", "8") for b, p in (("1gbps", 2), ("40mbps", 2))]
    path = plot(best, tmp_path / "sweep.png")
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_without_matplotlib_the_extra_and_its_install_command_are_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from akosim.sweeping.sweep_grid import run_sweep

    out = tmp_path / "sweep"
    assert run_sweep(["--workers", "2", "--bandwidth", "1gbps", "--p", "1", "--compute", "10ms",
                      "--gradient-size", "40KB", "--rounds", "3", "--jobs", "1", "--quiet",
                      "--out", str(out)]) == 0
    capsys.readouterr()
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    assert main([str(out)]) == 2
    captured = capsys.readouterr()
    assert "ako p=1" in captured.out  # the table is printed all the same
    err = captured.err.strip().splitlines()
    assert len(err) == 1
    assert "optional extra 'plot'" in err[0] and "pip install 'ako-toolkit[plot]'" in err[0]
    assert not (out / "sweep.png").exists()
    assert main([str(out), "--no-plot"]) == 0


def test_require_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(MissingExtra) as caught:
        require("matplotlib", "plot", "the plot")
    assert str(caught.value) == ("the plot needs matplotlib, in the optional extra 'plot': "
                                 "pip install 'ako-toolkit[plot]'")
    assert isinstance(caught.value, ImportError)  # "skip the plots" callers still work
    assert install_command("ns3") == "pip install 'ako-toolkit[ns3]'"
