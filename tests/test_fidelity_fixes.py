"""Issue 5, simulator vs real: the changes that bring akosim's predictions to akorun.

- akorun compiles before its start barrier; evaluations carry the evaluated round's end;
- akorun's bytes per round exclude the final flush (reported apart);
- a per-round overhead: measured by akorun (``overhead_s_per_round``), modelled by akosim
  (``ComputeModel.overhead_s``, ``--round-overhead``, read by ``--compute-from``);
- a per-message overhead (what a message costs beyond the emulated wire): measured by
  akorun (``message_overhead_s``), modelled by akosim as link latency
  (``--message-overhead``, read by ``--compute-from``);
- calibrated runs give akosim akorun's resolved p;
- ``measure_compute_s``: warm-up steps, then the median of more steps.

No pass/fail condition depends on how fast this machine is: simulated times are exact,
and akorun's are only checked for consistency with each other.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from akocore.records.results import RankResult, RunResult
from akocore.workloads.flat import build_workload
from akorun.runtime.records.result_files import merge_results, worker_summary
from akorun.runtime.records.round_times import RoundTimes
from akosim.cli import (
    compute_from_result,
    main,
    message_overhead_from_result,
    overhead_from_result,
    rank_overhead_s,
)
from akosim.planning.compute import ComputeModel
from analysis.matrix import select
from analysis.records import Record, p_text
from analysis.run import calibration_file, command, resolved_p, run_dir

# ----------------------------------------------------------------- measure_compute_s


def test_measure_compute_s_warms_up_then_takes_the_median(monkeypatch) -> None:
    workload = build_workload("digits-mlp")
    seeds: list[int] = []
    durations = iter([0.0, 1.0, 10.0, 10.5, 20.0, 20.2, 30.0, 39.0])  # 1, 0.5, 0.2, 9

    def fake_step(self, params, x, y, seed=0):
        seeds.append(seed)
        return 0.0, params

    clock = iter(durations)
    monkeypatch.setattr(type(workload), "grad_step", fake_step)
    assert workload.measure_compute_s(lambda: next(clock), steps=4,
                                      warmup=2) == pytest.approx(0.75)
    assert seeds == [0, 1, 2, 3, 4, 5]  # 2 untimed, then 4 timed, each its own seed
    with pytest.raises(ValueError):
        workload.measure_compute_s(lambda: next(clock), steps=0)
    with pytest.raises(ValueError):
        workload.measure_compute_s(lambda: next(clock), warmup=0)


# ----------------------------------------------------------------- akosim overhead


def test_compute_model_overhead_is_per_worker_and_not_jittered() -> None:
    model = ComputeModel(0.01, jitter=0.5, overhead_s=(0.002, 0.004))
    assert model.overhead_of(0) == 0.002 and model.overhead_of(3) == 0.004
    assert ComputeModel(0.01, overhead_s=0.003).overhead_of(7) == 0.003
    assert ComputeModel(0.01).overhead_of(0) == 0.0
    with pytest.raises(ValueError):
        ComputeModel(0.01, overhead_s=-1.0)
    with pytest.raises(ValueError):
        ComputeModel(0.01, overhead_s=())


def _sim(capsys, tmp_path: Path, *extra: str) -> dict:
    out = tmp_path / f"r{len(list(tmp_path.iterdir()))}.json"
    try:
        code = main(["--workers", "2", "--scheme", "ako", "--p", "1", "--bandwidth", "100gbps",
                     "--latency", "0ms", "--gradient-size", "4KB", "--rounds", "20", "--quiet",
                     "--out", str(out), *extra])
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(out.read_text())["runs"][0]


def test_round_overhead_lengthens_each_round_but_not_the_compute(capsys, tmp_path) -> None:
    plain = _sim(capsys, tmp_path, "--compute", "10ms")
    slow = _sim(capsys, tmp_path, "--compute", "10ms", "--round-overhead", "5ms")
    assert plain["round_time_s"] == pytest.approx(0.010, rel=1e-2)
    assert slow["round_time_s"] == pytest.approx(0.015, rel=1e-2)
    assert slow["compute_s_per_round"] == pytest.approx(plain["compute_s_per_round"])
    with pytest.raises(SystemExit) as exit_:
        main(["--gradient-size", "4KB", "--compute", "10ms", "--round-overhead", "soon",
              "--quiet"])
    assert exit_.value.code == 2


def test_compute_from_reads_the_overhead_and_falls_back_for_older_results(
        capsys, tmp_path: Path) -> None:
    new = tmp_path / "new.json"
    new.write_text(json.dumps({"workers": [
        {"compute_s_per_round": 0.01, "overhead_s_per_round": 0.004},
        {"compute_s_per_round": 0.01, "overhead_s_per_round": 0.006}]}))
    old = tmp_path / "old.json"  # no overhead field: round - compute - wait
    old.write_text(json.dumps({"workers": [
        {"compute_s_per_round": 0.01, "round_time_s": 0.02, "wait_s_per_round": 0.003},
        {"compute_s_per_round": 0.01, "round_time_s": 0.02, "wait_s_per_round": 0.005},
        {"compute_s_per_round": None}]}))  # a parameter server: the workers' mean
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"workers": [{"compute_s_per_round": 0.01}]}))
    assert overhead_from_result(str(new), 2) == pytest.approx((0.004, 0.006))
    assert overhead_from_result(str(old), 3) == pytest.approx((0.007, 0.005, 0.006))
    assert overhead_from_result(str(bare), 2) is None
    assert compute_from_result(str(old), 3) == pytest.approx((0.01, 0.01, 0.01))
    lockstep = ("--ssp", "0")  # the slower worker sets the pace (akosim picks s=1 otherwise)
    with_overhead = _sim(capsys, tmp_path, *lockstep, "--compute-from", str(new))
    without = _sim(capsys, tmp_path, *lockstep, "--compute-from", str(bare))
    overridden = _sim(capsys, tmp_path, *lockstep, "--compute-from", str(new),
                      "--round-overhead", "0s")
    assert without["round_time_s"] == pytest.approx(0.010, rel=1e-2)
    assert with_overhead["round_time_s"] == pytest.approx(0.016, rel=1e-2)  # the slower one
    assert overridden["round_time_s"] == pytest.approx(without["round_time_s"])


def test_message_overhead_delays_each_message_like_latency(capsys, tmp_path: Path) -> None:
    lockstep = ("--compute", "10ms", "--ssp", "0")
    plain = _sim(capsys, tmp_path, *lockstep)
    slow = _sim(capsys, tmp_path, *lockstep, "--message-overhead", "3ms")
    assert slow["round_time_s"] - plain["round_time_s"] == pytest.approx(0.003, rel=1e-6)
    measured = tmp_path / "measured.json"
    measured.write_text(json.dumps({"workers": [
        {"compute_s_per_round": 0.01, "message_overhead_s": 0.002},
        {"compute_s_per_round": 0.01, "message_overhead_s": 0.004},
        {"compute_s_per_round": None}]}))  # no value: the others' mean
    assert message_overhead_from_result(str(measured), 3) == pytest.approx((0.002, 0.004, 0.003))
    assert message_overhead_from_result(str(tmp_path / "missing.json"), 2) == ()
    from_file = _sim(capsys, tmp_path, "--compute-from", str(measured), "--ssp", "0")
    # lockstep, each rank's messages delayed by its own overhead: the two ranks wait for
    # each other in turn, 2 ms then 4 ms, so a round takes 3 ms longer on average
    assert from_file["round_time_s"] - plain["round_time_s"] == pytest.approx(0.003, rel=1e-6)
    with pytest.raises(SystemExit) as exit_:
        main(["--gradient-size", "4KB", "--message-overhead", "-1ms", "--quiet"])
    assert exit_.value.code == 2


# ----------------------------------------------------------------- akorun results


def test_round_times_split_each_round_into_compute_wait_and_overhead() -> None:
    times = RoundTimes()
    times.add(0.5, 0.3, 0.1)
    times.add(1.0, 0.3, 0.15)
    assert times.overhead_s == pytest.approx([0.1, 0.05])


def test_summary_reports_overhead_and_keeps_the_flush_apart() -> None:
    ends = [0.1 * (i + 1) for i in range(20)]
    summary = worker_summary(scheme="ako", p_of=(4, 4), ssp=0, workers=2, training_workers=2,
                             batch_size=8, round_end_s=ends, compute_s=[0.05] * 20,
                             wait_s=[0.03] * 20, overhead_s=[0.02] * 20, bytes_sent=2000,
                             bytes_flush=700)
    assert summary.overhead_s_per_round == pytest.approx(0.02)
    assert summary.bytes_sent_per_worker_per_round == 100  # the flush is not in it
    assert summary.bytes_sent_rounds == 2000 and summary.bytes_sent_flush == 700
    rank = RankResult(rank=0, role="worker", **summary.as_fields())
    merged = merge_results({}, [rank] * 2, [], batch_size=8)
    assert merged.overhead_s_per_round == pytest.approx(0.02)


def test_akorun_compiles_before_the_start_and_reports_the_new_fields(tmp_path: Path) -> None:
    from akorun.testing import REPO_ROOT, akorun_command, child_test_env

    out = tmp_path / "run"
    cmd = akorun_command("launch", "--workers", "2", "--rounds", "20", "--optimizer", "adam",
                         "--lr", "0.001", "--p", "auto", "--set", "train.eval_every=5",
                         "--out", str(out), "--quiet", "--timeout", "120s")
    done = subprocess.run(cmd, capture_output=True, text=True, env=child_test_env(),
                          cwd=REPO_ROOT, timeout=140)
    assert done.returncode == 0, done.stderr
    merged = json.loads((out / "result.json").read_text())
    assert isinstance(merged["p_of"], list) and all(isinstance(p, int) for p in merged["p_of"])
    assert merged["p"] == max(merged["p_of"])
    for rank in merged["per_worker"]:
        assert rank["warmup_s"] > 0  # compiled in prepare, before the join
        assert rank["p_auto_compute_s"] > 0
        ends = rank["round_end_s"]
        # each evaluation is stamped with the end of the round it evaluated
        assert rank["evaluations"]
        for time_s, round_, _ in rank["evaluations"]:
            assert time_s == ends[round_ - 1]
        per_round = np.diff([0.0, *ends])
        np.testing.assert_allclose(
            np.array(rank["round_compute_s"]) + rank["round_wait_s"] + rank["round_overhead_s"],
            per_round, rtol=1e-6, atol=1e-9)
        steady = rank["round_time_s"] - rank["compute_s_per_round"] - rank["wait_s_per_round"]
        assert rank["overhead_s_per_round"] == pytest.approx(steady, rel=1e-6, abs=1e-9)
        assert rank["bytes_sent_flush"] > 0  # node.finish owes the unsent parts
        # every delivered message's time past the wire (here: all of HTTP) is counted
        assert rank["message_overhead_s"] > 0
        assert all(peer["mean_stack_s"] > 0 for peer in rank["peers"].values())
        assert rank["bytes_sent_per_worker_per_round"] * rank["rounds"] == \
            pytest.approx(rank["bytes_sent_rounds"])


# ----------------------------------------------------------------- analysis


def _fake_akorun(results: Path, exp, p, ranks: list[dict]) -> None:
    folder = run_dir(results, "akorun", exp)
    folder.mkdir(parents=True)
    (folder / "result.json").write_text(json.dumps({"p": p, "workers": ranks}))
    (folder / "done.json").write_text("{}")


def test_calibrated_runs_take_akoruns_p_compute_and_overhead(tmp_path: Path) -> None:
    [auto] = select("uniform-wan/2w-ako-pauto", "all")
    [ps] = select("uniform-wan/2w-ps", "all")
    worker = {"role": "worker", "compute_s_per_round": 0.012, "round_time_s": 0.03,
              "wait_s_per_round": 0.01, "overhead_s_per_round": 0.006,
              "message_overhead_s": 0.002}
    _fake_akorun(tmp_path, auto, [35, 35], [{**worker, "rank": 0}, {**worker, "rank": 1}])
    old = {k: v for k, v in worker.items() if k != "overhead_s_per_round"}
    _fake_akorun(tmp_path, ps, None, [{**old, "rank": 0}, {**old, "rank": 1},
                                      {"rank": 2, "role": "ps", "compute_s_per_round": None}])
    cmd = command("akosim-calibrated", auto, tmp_path)
    assert cmd is not None and cmd[cmd.index("--p") + 1] == "35,35"
    data = json.loads(Path(cmd[cmd.index("--compute-from") + 1]).read_text())
    assert [w["overhead_s_per_round"] for w in data["per_worker"]] == [0.006, 0.006]
    assert [w["message_overhead_s"] for w in data["per_worker"]] == [0.002, 0.002]
    assert cmd[:2] == ["akosim", "--config"]  # timing only: the fidelity needs no gradients
    ps_cmd = command("akosim-calibrated", ps, tmp_path)
    assert ps_cmd is not None and "--p" not in ps_cmd
    compute = json.loads(calibration_file(run_dir(tmp_path, "akorun", ps) / "result.json",
                                          tmp_path / "c.json").read_text())
    overheads = [w["overhead_s_per_round"] for w in compute["per_worker"]]
    assert overheads == pytest.approx([0.008, 0.008, 0.008])  # the server: the mean
    # the uncalibrated prediction's compute: measured once per results folder, then reused
    measured = tmp_path / "akosim" / "compute.json"
    measured.parent.mkdir(parents=True)
    measured.write_text(json.dumps({
        f"digits-cnn/batch 104/{mode} XLA": 0.0123 for mode in ("single-thread", "default")}))
    uncalibrated = command("akosim", auto, tmp_path)
    assert uncalibrated is not None and "--p" not in uncalibrated  # akosim's own p auto
    assert uncalibrated[uncalibrated.index("--compute") + 1] == "0.0123s"
    assert resolved_p(RunResult(tool="akorun", scheme="ps")) is None
    assert resolved_p(RunResult(tool="akorun", scheme="ako", p=4, p_of=(2, 4))) == [2, 4]


def test_report_shows_p_and_overhead() -> None:
    record = Record("akorun", "x", "uniform-wan", 2, "ako-pauto", 0.03, 1.0, 0.01, [35, 35])
    assert p_text(record) == "35" and p_text(None) == "-"
    assert rank_overhead_s(RankResult(0, overhead_s_per_round=0.004)) == 0.004
    assert rank_overhead_s(RankResult(0, round_time_s=0.03, compute_s_per_round=0.01,
                                      wait_s_per_round=0.015)) == pytest.approx(0.005)
    assert rank_overhead_s(RankResult(0)) is None


def test_akosim_measures_with_akoruns_xla_flags_when_akorun_would_use_them(
        monkeypatch) -> None:
    from akocore.rank_threads import SINGLE_THREAD_XLA_FLAGS
    from analysis.run import _env

    [exp] = select("uniform-wan/2w-ako-p4", "all")
    for name in ("XLA_FLAGS", "NPROC", "AKO_THREADS_PER_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("analysis.run.os.cpu_count", lambda: 2)
    assert _env("akosim", exp)["XLA_FLAGS"] == SINGLE_THREAD_XLA_FLAGS
    assert _env("akosim", exp)["NPROC"] == "1"
    assert "XLA_FLAGS" not in _env("akosim-calibrated", exp)  # compute comes from akorun
    monkeypatch.setattr("analysis.run.os.cpu_count", lambda: 8)
    assert "XLA_FLAGS" not in _env("akosim", exp)  # akorun would not set them either
    assert _env("akosim", exp)["NPROC"] == "4"  # 2 ranks: half the cores each
