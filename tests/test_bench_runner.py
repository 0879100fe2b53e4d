"""The bench runner (tests/bench/__main__.py): goals reported met or missed by
how much, regressions judged per figure (on the interval of its paired
samples) against the stored tolerance, and a baseline update that stores
exactly what the run printed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bench import __main__ as runner
from tests.bench.common import Figure, Skipped
from tests.bench.verdict import judge


def test_the_goal_summary_says_what_is_met_and_by_how_much_a_goal_is_missed():
    figures = [
        Figure("sim.fast", 10.0, "x bare SimPy loop", higher_is_better=False, goal=30.0,
               absolute=20.0, absolute_unit="CPU s"),
        Figure("sim.slow", 90.0, "x bare SimPy loop", higher_is_better=False, goal=30.0,
               absolute=120.0, absolute_unit="CPU s"),
        Figure("sim.info", 1.0, "ratio"),
    ]
    lines = runner.goal_summary(figures)
    assert lines[0] == "goals: 1 of 2 met"
    assert lines[1].startswith("  met    sim.fast: 20 CPU s")
    assert lines[2].startswith("  MISSED sim.slow: 120 CPU s") and "MISSED by 4.00x" in lines[2]


def test_a_missed_goal_says_why_where_the_reason_is_known():
    figures = [
        Figure("a.missed", 0.3, "ratio", goal=0.6, known_gap="CPU-bound receiver"),
        Figure("a.met", 0.9, "ratio", goal=0.6, known_gap="not printed when met"),
    ]
    lines = runner.goal_summary(figures)
    assert lines[1].startswith("  MISSED a.missed")
    assert lines[2].strip() == "why: CPU-bound receiver"
    assert len(lines) == 4 and "not printed" not in "".join(lines)


@pytest.mark.parametrize(("value", "higher_is_better", "worse"), [
    (1.5, False, False), (1.7, False, True), (0.7, True, False), (0.5, True, True)])
def test_a_figure_regresses_only_beyond_its_tolerance(value, higher_is_better, worse):
    figure = Figure("x", value, "ratio", higher_is_better=higher_is_better)
    verdict = judge(runner.interval_of(figure), 1.0,
                    0.6 if not higher_is_better else 0.4, higher_is_better=higher_is_better)
    assert verdict.regressed is worse


def test_paired_samples_are_judged_on_their_interval(tmp_path: Path, monkeypatch, capsys):
    """Two disturbed repetitions of five do not fail the run; five slow ones do. The
    stored baseline keeps the samples and the load averages before and after."""
    baseline = tmp_path / "baseline.json"
    fake_modules(monkeypatch, {"bench_a": [
        Figure("a.cost", 1.0, "ratio", higher_is_better=False, tolerance=0.35,
               samples=(1.0, 0.95, 1.05, 1.02, 0.98))]})
    assert runner.main(["--update-baseline", "--baseline", str(baseline)]) == 0
    stored = json.loads(baseline.read_text())
    assert stored["figures"]["a.cost"]["samples"] == [1.0, 0.95, 1.05, 1.02, 0.98]
    assert {"load_average_before", "load_average_after"} <= set(stored["environment"])
    disturbed = (1.0, 2.5, 0.97, 2.8, 1.03)  # median 1.03, interval 0.97-2.8
    fake_modules(monkeypatch, {"bench_a": [
        Figure("a.cost", 1.03, "ratio", higher_is_better=False, samples=disturbed)]})
    assert runner.main(["--baseline", str(baseline)]) == 0
    slower = (2.0, 2.1, 1.9, 2.2, 2.05)
    fake_modules(monkeypatch, {"bench_a": [
        Figure("a.cost", 2.05, "ratio", higher_is_better=False, samples=slower)]})
    capsys.readouterr()
    assert runner.main(["--baseline", str(baseline)]) == 1
    assert "regressed beyond their tolerance: a.cost" in capsys.readouterr().out


def test_a_benchmark_that_cannot_run_here_is_skipped_not_failed(monkeypatch, capsys,
                                                                tmp_path: Path):
    class Module:
        def run(self) -> list[Figure]:
            raise Skipped("needs root")

    monkeypatch.setattr(runner, "discover", lambda only: ["bench_t"])
    monkeypatch.setattr(runner.importlib, "import_module", lambda path: Module())
    assert runner.main(["--baseline", str(tmp_path / "none.json")]) == 0
    assert "benchmark skipped (its goals not measured): bench_t: needs root" in \
        capsys.readouterr().out


def fake_modules(monkeypatch, figures_by_module: dict[str, list[Figure]]) -> None:
    class Module:
        def __init__(self, figures: list[Figure]) -> None:
            self.figures = figures

        def run(self) -> list[Figure]:
            return self.figures

    monkeypatch.setattr(runner, "discover", lambda only: sorted(
        name for name in figures_by_module
        if not only or name.removeprefix("bench_") in only))
    monkeypatch.setattr(runner.importlib, "import_module",
                        lambda path: Module(figures_by_module[path.rsplit(".", 1)[1]]))


def test_an_update_stores_what_the_run_printed_and_a_regression_fails(
        tmp_path: Path, monkeypatch, capsys):
    baseline = tmp_path / "baseline.json"
    fake_modules(monkeypatch, {
        "bench_a": [Figure("a.cost", 2.0, "ratio", higher_is_better=False, tolerance=0.5)],
        "bench_b": [Figure("b.speed", 3.0, "ratio", tolerance=0.3)]})
    assert runner.main(["--update-baseline", "--baseline", str(baseline)]) == 0
    stored = json.loads(baseline.read_text())
    assert set(stored["figures"]) == {"a.cost", "b.speed"}
    assert stored["figures"]["a.cost"]["tolerance"] == 0.5
    assert stored["environment"]["cores"] is not None

    # Unchanged: passes. Module a drops its figure and adds another: an update
    # with --only a stores that and keeps b's.
    assert runner.main(["--baseline", str(baseline)]) == 0
    fake_modules(monkeypatch, {
        "bench_a": [Figure("a.cost2", 1.0, "ratio", higher_is_better=False)],
        "bench_b": [Figure("b.speed", 3.0, "ratio", tolerance=0.3)]})
    assert runner.main(["--only", "a", "--update-baseline", "--baseline", str(baseline)]) == 0
    assert set(json.loads(baseline.read_text())["figures"]) == {"a.cost2", "b.speed"}

    # A real regression (3x the cost) fails the run and is named.
    fake_modules(monkeypatch, {
        "bench_a": [Figure("a.cost2", 3.0, "ratio", higher_is_better=False)],
        "bench_b": [Figure("b.speed", 3.0, "ratio", tolerance=0.3)]})
    capsys.readouterr()
    assert runner.main(["--baseline", str(baseline)]) == 1
    assert "regressed beyond their tolerance: a.cost2" in capsys.readouterr().out
