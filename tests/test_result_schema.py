"""The result records: round trips, files written by each backend, bad files, old files,
the schema table, the shared per-step seed, and the analysis report's refusal to shrink."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from akocore.records import figures
from akocore.records.calibration import Calibration, RankCalibration
from akocore.records.result_reader import read_result
from akocore.records.results import (
    SCHEMA_VERSION,
    LinkResult,
    PlanResult,
    RankResult,
    RecordError,
    RunResult,
)
from akocore.records.schema_table import schema_markdown

REPO = Path(__file__).resolve().parent.parent


def _rank(rank: int, role: str = "worker") -> RankResult:
    return RankResult(
        rank=rank, role=role, scheme="ako", p=4, p_of=(2, 4), ssp=math.inf, workers=3,
        training_workers=2, batch_size=8, rounds=20, round_time_s=0.1, samples_per_s=160.0,
        bytes_sent_per_worker_per_round=100.0, compute_s_per_round=0.05,
        wait_s_per_round=None, overhead_s_per_round=0.01, compute_s=1.0, wait_s=0.2,
        bytes_sent=2000.0, bytes_received=1800.0, round_end_s=(0.1, 0.2),
        evaluations=((0.2, 2, 0.5),), final_accuracy=0.5, stop_reason="rounds",
        details={"peers": {"1": {"mean_stack_s": 0.001}}, "warmup_s": 1.5})


def _run() -> RunResult:
    return RunResult(
        tool="akorun", scheme="ako", config={"cluster": {"workers": 3}}, run_id="r1", p=4,
        p_of=(2, 4), ssp=math.inf, workers=3, training_workers=2, ps_servers=0,
        batch_size=8, round_time_s=0.1, samples_per_s=math.inf, evaluations=((0.2, 2, 0.5),),
        max_relative_difference=1e-7, events={"messages": 3},
        per_worker=(_rank(0), _rank(1), _rank(2, "ps")),
        per_link=(LinkResult(0, 1, 10.0, None, None), LinkResult(1, 0, 5.0, 1e9, 0.5)))


def _through_json(data: dict) -> dict:
    return json.loads(json.dumps(data, allow_nan=False))


# ---------------------------------------------------------------------- round trips


def test_every_record_survives_json_and_back() -> None:
    run = _run()
    assert RankResult.from_json(_through_json(_rank(1).to_json())) == _rank(1)
    assert RunResult.from_json(_through_json(run.to_json())) == run
    plan = PlanResult(config={"a": 1}, mode="timing", gradient_bytes=16, compute_s=(0.1, 0.2),
                      runs=(run, run))
    assert PlanResult.from_json(_through_json(plan.to_json())) == plan
    calibration = Calibration("x.json", (RankCalibration(0, "worker", 0.01, 0.002, None),
                                         RankCalibration(1, "ps", 0.01, 0.002, None)),
                              p_of=(2, 2), compute_jitter=0.25)
    assert Calibration.from_json(_through_json(calibration.to_json())) == calibration
    for record in (run, plan, calibration, _rank(0)):
        assert read_result(_through_json(record.to_json())) == record


def test_details_are_written_beside_the_fields_and_read_back_as_details() -> None:
    data = _rank(0).to_json()
    assert data["warmup_s"] == 1.5 and "details" not in data
    assert data["schema_version"] == SCHEMA_VERSION and data["kind"] == "rank"
    with pytest.raises(ValueError, match="rounds"):
        RankResult(0, details={"rounds": 3})


# ---------------------------------------------------------------------- bad files


def test_a_bad_file_names_the_key() -> None:
    data = _run().to_json()
    data["per_worker"][1]["rounds"] = "20"
    with pytest.raises(RecordError, match=r"per_worker\[1\]\.rounds: expected an integer"):
        RunResult.from_json(data)
    data = _run().to_json()
    data["workers"] = [1, 2, 3]
    with pytest.raises(RecordError, match="^workers: expected an integer"):
        read_result(data)
    data = _run().to_json()
    del data["tool"]
    with pytest.raises(RecordError, match="^tool: missing"):
        RunResult.from_json(data)
    data = _run().to_json()
    data["evaluations"] = [[0.2, 2]]
    with pytest.raises(RecordError, match=r"^evaluations\[0\]: expected a list of 3"):
        RunResult.from_json(data)
    with pytest.raises(RecordError, match="^nonsense: not a key of RunResult"):
        RunResult.from_json({**_run().to_json(), "nonsense": 1})


def test_another_schema_version_is_refused() -> None:
    for version in (SCHEMA_VERSION + 1, "1"):
        data = {**_run().to_json(), "schema_version": version}
        with pytest.raises(RecordError, match="schema_version: this toolkit reads version"):
            RunResult.from_json(data)
        with pytest.raises(RecordError, match="schema_version"):
            read_result(data)
    with pytest.raises(RecordError, match="kind: expected 'run'"):
        RunResult.from_json(_rank(0).to_json())


# ---------------------------------------------------------------------- files written before


def test_files_without_schema_version_are_converted_once() -> None:
    old_akorun = {"config": {}, "scheme": "ako", "p": [2, 4], "ssp": "inf", "workers": [
        {"rank": 0, "role": "worker", "p": [2, 4], "workers": 2, "round_time_s": 0.1,
         "compute_s_per_round": 0.05, "final_accuracy": 0.7, "peers": {}},
        {"rank": 1, "role": "worker", "p": [2, 4], "workers": 2, "final_accuracy": 0.5}],
        "summary": {}, "training_workers": 2, "final_accuracy": 0.6}
    run = read_result(old_akorun)
    assert isinstance(run, RunResult)
    assert run.workers == 2 and run.p == 4 and run.p_of == (2, 4) and run.ssp == math.inf
    assert run.per_worker[0].details == {"peers": {}} and run.final_accuracy == 0.7
    old_akosim = {"tool": "akosim", "mode": "train", "config": {}, "gradient_bytes": 16,
                  "compute_s": [0.1], "runs": [{
                      "label": "ps", "scheme": "ps", "p": 1, "p_of": [1], "ssp": 0.0,
                      "workers": 2, "training_workers": 1, "samples_per_s": "inf",
                      "evaluations": [{"sim_time_s": 1.0, "round": 5, "accuracy": 0.9}],
                      "per_worker": [{"rank": 0, "rounds": 5, "compute_s": 0.5}]}]}
    plan = read_result(old_akosim)
    assert isinstance(plan, PlanResult)
    assert plan.runs[0].evaluations == ((1.0, 5, 0.9),)
    assert plan.runs[0].samples_per_s == math.inf and plan.runs[0].per_worker[0].rounds == 5
    old_calibration = {"source": "r.json", "p": None, "workers": [
        {"rank": 0, "role": "worker", "compute_s_per_round": 0.01,
         "overhead_s_per_round": 0.002, "message_overhead_s": None}]}
    calibration = read_result(old_calibration)
    assert isinstance(calibration, Calibration) and calibration.compute_s(2) == (0.01, 0.01)


def test_the_committed_report_summary_still_loads() -> None:
    from analysis.report import runs_in_report

    assert runs_in_report(REPO / "analysis" / "data" / "experiments-summary.json") == 240


# ---------------------------------------------------------------------- shared figures


def test_the_mean_filling_rule_and_the_calibration_made_from_a_run() -> None:
    assert figures.fill_missing([0.2, None, -1.0]) == (0.2, 0.1, 0.0)
    assert figures.fill_missing([None, None]) is None
    run = RunResult(tool="akorun", scheme="ako", p=2, p_of=(2, 2), per_worker=(
        RankResult(0, compute_s_per_round=0.01, round_time_s=0.02, wait_s_per_round=0.003,
                   round_compute_s=(0.01, 0.01, 0.02, 0.01, 0.01)),
        RankResult(1, role="ps")))
    calibration = Calibration.from_run(run, "r.json")
    assert calibration.compute_s(3) == (0.01, 0.01, 0.01)
    assert calibration.overhead_s(2) == pytest.approx((0.007, 0.007))
    assert calibration.message_overhead_s(2) is None
    assert calibration.p_of == (2, 2) and calibration.compute_jitter > 0


def test_both_backends_take_the_per_step_seed_from_akocore() -> None:
    import akorun.runtime.lifecycle.training
    import akosim.sim.sim_training

    assert akosim.sim.sim_training.step_seed is figures.step_seed
    assert akorun.runtime.lifecycle.training.step_seed is figures.step_seed
    assert figures.step_seed(3, 1, 7) != figures.step_seed(3, 2, 7)
    assert 0 <= figures.step_seed(10**9, 10**4, 10**6) < 2**31 - 1


# ---------------------------------------------------------------------- the schema table


def test_the_schema_table_is_generated_from_the_records() -> None:
    committed = (REPO / "docs" / "reference" / "result-schema.md").read_text(encoding="utf-8")
    assert committed == schema_markdown(), (
        "docs/reference/result-schema.md is stale: regenerate it with python -c 'from "
        "akocore.records.schema_table import schema_markdown; "
        "open(\"docs/reference/result-schema.md\", \"w\").write(schema_markdown())'")
    for key in ("compute_s_per_round", "per_worker", "p_of", "schema_version"):
        assert f"`{key}`" in committed


# ---------------------------------------------------------------------- files each backend writes


def test_akosims_out_file_validates(tmp_path: Path, capsys) -> None:
    from akosim.cli import main

    out = tmp_path / "f.json"
    assert main(["--workers", "4", "--bandwidth", "40mbps", "--gradient-size", "64KB",
                 "--compute", "10ms", "--rounds", "10", "--quiet", "--out", str(out)]) == 0
    capsys.readouterr()
    plan = PlanResult.from_json(json.loads(out.read_text()))
    assert len(plan.runs) >= 3 and plan.gradient_bytes == 64_000
    for run in plan.runs:
        assert run.tool == "akosim" and run.workers == 4 and isinstance(run.p, int)
        assert run.round_time_s is not None and run.round_time_s > 0
        assert run.per_worker and all(isinstance(r, RankResult) for r in run.per_worker)
        assert (run.p_of and max(run.p_of) == run.p) if run.scheme == "ako" else not run.p_of


def test_akoruns_result_files_validate(tmp_path: Path) -> None:
    from akorun.testing import REPO_ROOT, akorun_command, child_test_env

    out = tmp_path / "run"
    cmd = akorun_command("launch", "--workers", "3", "--rounds", "10", "--p", "2",
                         "--out", str(out), "--quiet", "--timeout", "120s")
    done = subprocess.run(cmd, capture_output=True, text=True, env=child_test_env(),
                          cwd=REPO_ROOT, timeout=140)
    assert done.returncode == 0, done.stderr
    run = RunResult.from_json(json.loads((out / "result.json").read_text()))
    assert run.tool == "akorun" and run.workers == 3 and run.training_workers == 3
    assert run.p == 2 and run.p_of == (2, 2, 2)
    assert [r.rank for r in run.per_worker] == [0, 1, 2]
    assert all(r.rounds == 10 and r.exit_code == 0 for r in run.per_worker)
    rank = RankResult.from_json(json.loads((out / "worker-1.json").read_text()))
    assert rank.rank == 1 and rank.workers == 3 and "params_sha256" in rank.details
    calibration = Calibration.from_run(run)
    assert calibration.compute_s(3) is not None and calibration.p_of == (2, 2, 2)


# ---------------------------------------------------------------------- python -m analysis


def _analysis(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    return subprocess.run([sys.executable, "-m", "analysis", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_analysis_refuses_to_replace_a_report_with_fewer_runs(tmp_path: Path) -> None:
    report = tmp_path / "docs" / "reports" / "experiments"
    report.mkdir(parents=True)
    committed = REPO / "docs" / "reports" / "experiments"
    for name in ("tables.md", "index.md"):
        (report / name).write_bytes((committed / name).read_bytes())
    summary = tmp_path / "analysis" / "data" / "experiments-summary.json"
    summary.parent.mkdir(parents=True)
    summary.write_bytes((REPO / "analysis" / "data" / "experiments-summary.json").read_bytes())
    page = report / "index.md"
    before = {p: p.read_bytes() for p in (summary, report / "tables.md", page)}
    page_arg = "docs/reports/experiments/index.md"
    refused = _analysis(tmp_path, "--no-plots", "--page", page_arg)  # no results/ here
    assert refused.returncode == 2
    assert len(refused.stderr.strip().splitlines()) == 1
    assert "0 runs, fewer than the 240" in refused.stderr and "--force" in refused.stderr
    assert {p: p.read_bytes() for p in before} == before  # nothing written
    forced = _analysis(tmp_path, "--no-plots", "--page", page_arg, "--force")
    assert forced.returncode == 0, forced.stderr
    assert "akosim 0/60" in page.read_text()
    assert json.loads(summary.read_text())["missing"]["akosim"] == 60  # the default records
    assert not (report / "summary.json").exists()  # no data file inside the site


def test_analysis_runs_from_any_directory_with_explicit_paths(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = _analysis(elsewhere, "--results", str(tmp_path / "none"), "--out",
                     str(tmp_path / "report"), "--no-plots")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "report" / "tables.md").exists()
    assert (tmp_path / "report" / "summary.json").exists()  # elsewhere: beside the report
