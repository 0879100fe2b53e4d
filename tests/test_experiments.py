"""The CI subset of the experiments: akosim train, akorun launch, the report.

uniform-wan x 2 workers x {ps, ako p=4}, a few rounds instead of the budget,
through `python -m analysis.run` (the CLIs as subprocesses) and the report.
No timing thresholds: only that every file, fidelity pair and table row exists.
"""

from __future__ import annotations

import builtins
import json
import shutil
import subprocess
import sys

import pytest

from analysis.matrix import CI_SUBSET, ROOT
from analysis.page_block import BEGIN_MARK, END_MARK, splice
from analysis.records import Record, accuracy_at, akorun_time_axis, time_to
from analysis.report import build_report

BACKENDS = ("akosim", "akorun", "akosim-calibrated", "akosim-fullsize")


@pytest.fixture(scope="module")
def ci_results(tmp_path_factory):
    results = tmp_path_factory.mktemp("experiments")
    proc = subprocess.run(
        [sys.executable, "-m", "analysis.run", "--subset", "ci", "--rounds", "10",
         "--results", str(results)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return results


def test_the_ci_subset_runs_in_every_backend(ci_results):
    for backend in BACKENDS:
        for config in CI_SUBSET:
            folder = ci_results / backend / config
            assert (folder / "done.json").exists(), f"{backend} {config}"
            data = json.loads((folder / "result.json").read_text())
            if backend == "akorun":
                assert data["round_time_s"] > 0 and data["per_worker"]
            else:
                assert len(data["runs"]) == 1  # the config names its scheme: just that one
                assert data["runs"][0]["scheme"] == ("ps" if config.endswith("ps") else "ako")
    again = subprocess.run(
        [sys.executable, "-m", "analysis.run", "--subset", "ci", "--rounds", "10",
         "--backend", "akosim", "--results", str(ci_results)],
        cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert again.stdout.count("skipped (done)") == len(CI_SUBSET)  # resumable


def test_the_report_has_the_rows_and_the_fidelity_pairs(ci_results, tmp_path):
    tables = build_report(ci_results, tmp_path / "report")
    assert tables.name == "tables.md"
    text = tables.read_text()
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    for config in CI_SUBSET:
        assert f"| {config} |" in text  # time to target and fidelity rows
    assert "| Uniform WAN | 2 |" in text
    for fid in summary["fidelity"]:
        assert {p["config"] for p in fid["pairs"]} == set(CI_SUBSET), fid["metric"]
        assert fid["mape"] is not None
    assert {r["backend"] for r in summary["records"]} == set(BACKENDS)


def test_the_report_fills_the_report_pages_experiments_block(ci_results, tmp_path):
    page = tmp_path / "report" / "index.md"
    page.parent.mkdir()
    page.write_text(f"# Study\nbefore\n{BEGIN_MARK}\nold tables\n{END_MARK}\nafter\n")
    build_report(ci_results, tmp_path / "report", plots=False, page=page)
    text = page.read_text()
    assert text.startswith(f"# Study\nbefore\n{BEGIN_MARK}\n") and text.endswith(
        f"{END_MARK}\nafter\n")
    assert "old tables" not in text
    assert "| Uniform WAN | 2 |" in text and "Kendall's tau" in text
    assert "[the full tables](tables.md)" in text  # links relative to the page
    splice(page, "new")  # idempotent: the markers stay
    assert f"{BEGIN_MARK}\nnew\n{END_MARK}" in page.read_text()
    unmarked = tmp_path / "plain.md"
    unmarked.write_text("# no markers\n")
    with pytest.raises(ValueError, match="experiments:begin"):
        splice(unmarked, "x")


def test_the_report_works_without_matplotlib(ci_results, tmp_path, monkeypatch):
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError("no matplotlib")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    text = build_report(ci_results, tmp_path / "report").read_text()
    assert "matplotlib is not installed" in text
    assert not list((tmp_path / "report").glob("*.png"))


def test_time_axes_and_targets():
    curve = [(1.0, 5, 0.5), (2.0, 10, 0.96), (3.0, 15, 0.94)]
    assert time_to(curve, 0.95) == (2.0, 10)
    assert time_to(curve, 0.95, budget_s=1.5) is None
    assert accuracy_at(curve, 2.5) == 0.96
    # 9 s of compilation in round 1, then 0.1 s rounds: warm-up counted at 0.1 s
    axis = akorun_time_axis([9.0, 9.1, 9.2, 9.3, 9.4], 0.1)
    assert axis == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5])


def test_the_new_columns_report_reads_a_results_folder_with_only_them(ci_results, tmp_path):
    """analysis.new_schemes: one WAGMA akosim run in a folder of its own; the PS and
    Ako p=4 cells come from a committed report's summary.json (marked †); the seeds'
    block of the report page is left alone."""
    from analysis.new_schemes import NEW_BEGIN_MARK, NEW_END_MARK, build_new_schemes_report

    results = tmp_path / "new"
    (results / "akosim").mkdir(parents=True)
    shutil.copy(ci_results / "akosim" / "compute.json", results / "akosim" / "compute.json")
    proc = subprocess.run(
        [sys.executable, "-m", "analysis.run", "--backend", "akosim", "--only",
         "uniform-wan/2w-wagma", "--rounds", "5", "--results", str(results)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    committed = tmp_path / "report"
    build_report(ci_results, committed, plots=False)
    study = committed / "index.md"
    study.write_text(f"{BEGIN_MARK}\nseeds\n{END_MARK}\n{NEW_BEGIN_MARK}\nold\n{NEW_END_MARK}\n")
    page = build_new_schemes_report(results, committed, plots=False, page=study)
    text = study.read_text()
    assert f"{BEGIN_MARK}\nseeds\n{END_MARK}" in text and "\nold\n" not in text
    assert "WAGMA and ADAG vs Ako and PS, measured 20" in text
    assert "[the new columns' page](new-schemes.md)" in text
    row = next(line for line in text.splitlines() if line.startswith("| Uniform WAN | 2 |"))
    cells = [c.strip() for c in row.strip("|").split("|")][2:]
    assert len(cells) == 4 and "†" in cells[0] and "†" in cells[1]  # ps, ako-p4: committed
    assert "†" not in cells[2] and cells[2].split(" / ")[0].endswith("*")  # wagma: ours
    assert cells[3] == "- / -"  # adag did not run
    assert page.name == "new-schemes.md" and "Per configuration" in page.read_text()
    empty = subprocess.run([sys.executable, "-m", "analysis", "new-schemes", "--results",
                            str(tmp_path / "none"), "--out", str(tmp_path / "x")],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert empty.returncode == 2 and len(empty.stderr.strip().splitlines()) == 1


def test_the_new_columns_fidelity_is_reported_per_scheme():
    """analysis.new_schemes.per_scheme_fidelity: each new column's round-time MAPE from its own
    pairs only (WAGMA 10% off, ADAG 50% off must not pool into one figure)."""
    from analysis.matrix import all_experiments
    from analysis.new_schemes import per_scheme_fidelity

    records = {}
    for exp in all_experiments():
        if exp.scheme not in ("wagma", "adag") or exp.workers != 2:
            continue
        off = 1.1 if exp.scheme == "wagma" else 1.5
        for backend, factor in (("akorun", 1.0), ("akosim", off), ("akosim-calibrated", off)):
            records[(backend, exp.id)] = Record(
                backend, exp.id, exp.network.name, exp.workers, exp.scheme,
                round_time_s=0.1 * factor * (1 + len(exp.network.name) / 100),
                bytes_per_round=1.0, compute_s=0.01, p_of=None)
    table = per_scheme_fidelity(records)
    rows = {tuple(c.strip() for c in line.strip("|").split("|")[:2]): line
            for line in table.splitlines()[2:]}
    assert set(rows) == {(s, c) for s in ("WAGMA", "ADAG") for c in ("uncalibrated", "calibrated")}
    assert "| 10.0% |" in rows[("WAGMA", "calibrated")]
    assert "| 50.0% |" in rows[("ADAG", "uncalibrated")]
