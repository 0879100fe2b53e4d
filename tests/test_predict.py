"""`akosim predict RUN_DIR` on a small real akorun run (loopback, digits-mlp, 2 workers),
its refusals, and `--compute-from` taking the run's workload and batch."""

from __future__ import annotations

import json
import math
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from akocore.cli_support import UsageError
from akocore.records import testbed_record as tb
from akocore.records.host_calibration import TcpParameters
from akocore.records.jsonrecord import RecordError
from akocore.records.result_reader import read_result
from akocore.records.results import PlanResult
from akocore.settings.schema import NetworkConfig
from akorun.testing import REPO_ROOT, akorun_command, child_test_env
from akosim import prediction as predict
from akosim.calibration import colocated_compute as colocated
from akosim.calibration.colocated_compute import ColocatedCompute
from akosim.cli import main

pytestmark = pytest.mark.timeout(240)
ROUNDS = 6


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("predict") / "run"
    command = akorun_command("launch", "--workers", "2", "--rounds", str(ROUNDS),
                             "--workload", "digits-mlp", "--batch-size", "16", "--p", "2",
                             "--ssp", "1", "--bandwidth", "40mbps", "--out", str(out),
                             "--quiet", "--timeout", "150s")
    done = subprocess.run(command, capture_output=True, text=True, env=child_test_env(),
                          cwd=REPO_ROOT, timeout=200)
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(autouse=True)
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AKO_CACHE_DIR", str(tmp_path / "cache"))


def test_predict_prints_prediction_beside_measurement_and_writes_it(run_dir: Path,
                                                                    tmp_path: Path, capsys):
    out = tmp_path / "prediction.json"
    assert main(["predict", str(run_dir), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "network model tcp" in printed and f"{ROUNDS} rounds" in printed
    assert "predicted round time" in printed and "measured" in printed
    plan = read_result(json.loads(out.read_text()))
    assert isinstance(plan, PlanResult)
    (run,) = plan.runs
    assert run.scheme == "ako" and run.p_of == (2, 2) and run.ssp == 1
    assert plan.config["train"]["workload"] == "digits-mlp"
    assert plan.config["train"]["batch_size"] == 16
    assert plan.config["network"]["model"] == "tcp"
    assert plan.gradient_bytes == 4810 * 4  # the MLP's gradient, not the CNN's
    assert "measured" in plan.explanation


def test_predict_with_max_min_and_flags_that_restate_the_run(run_dir: Path, capsys):
    assert main(["predict", str(run_dir / "result.json"), "--network-model", "maxmin",
                 "--workers", "2", "--bandwidth", "40mbps", "--ssp", "1"]) == 0
    assert "network model maxmin" in capsys.readouterr().out


@pytest.mark.parametrize("flags, words", [
    (["--workers", "8"], "workers 8"),
    (["--bandwidth", "10mbps"], "bandwidth"),
    (["--set", "exchange.ssp=3"], "ssp 3"),
    (["--workload", "synthetic-cnn"], "workload 'synthetic-cnn'"),
    (["--p", "1"], "p [1]"),
])
def test_predict_refuses_a_flag_that_contradicts_the_run(run_dir: Path, capsys, flags, words):
    with pytest.raises(SystemExit) as stop:
        main(["predict", str(run_dir), *flags])
    assert stop.value.code == 2
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and "contradicts the run" in error and words in error


def test_predict_refuses_a_folder_without_a_result(tmp_path: Path, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["predict", str(tmp_path)])
    assert stop.value.code == 2
    assert "no result" in capsys.readouterr().err


def test_predict_never_adds_message_overhead_s_network_time(run_dir: Path, tmp_path: Path,
                                                            capsys):
    """message_overhead_s holds network time on a real network: predict ignores it."""
    data = json.loads((run_dir / "result.json").read_text())
    for rank in data["per_worker"]:
        rank["message_overhead_s"] = 5.0
    doctored = tmp_path / "result.json"
    doctored.write_text(json.dumps(data))
    main(["predict", str(run_dir), "--network-model", "maxmin"])
    plain = capsys.readouterr().out.splitlines()[-1]
    main(["predict", str(doctored), "--network-model", "maxmin"])
    assert capsys.readouterr().out.splitlines()[-1] == plain


def test_compute_from_takes_the_runs_workload_and_batch(run_dir: Path, capsys):
    assert main(["--compute-from", str(run_dir / "result.json"), "--workers", "2",
                 "--scheme", "ako", "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "gradient 19.24 kB (4,810 float32)" in printed and "batch 16" in printed


def test_show_config_prints_the_workload_and_batch_compute_from_takes(run_dir: Path, capsys):
    """--show-config prints what runs: the run's workload and batch, said to come from it."""
    result = run_dir / "result.json"
    assert main(["--compute-from", str(result), "--workers", "2", "--show-config"]) == 0
    shown = dict(line.split(" = ", 1) for line in capsys.readouterr().out.splitlines())
    assert shown["train.workload"] == f'"digits-mlp"  (as the run in {result} (--compute-from))'
    assert shown["train.batch_size"].startswith("16  (as the run in")


def test_compute_from_refuses_a_workload_the_run_did_not_use(run_dir: Path, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--compute-from", str(run_dir / "result.json"), "--workers", "2",
              "--workload", "synthetic-cnn", "--quiet"])
    assert stop.value.code == 2
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and "ran workload 'digits-mlp'" in error


def _round_line(printed: str) -> str:
    return next(line for line in printed.splitlines() if line.startswith("ako "))


def test_compute_from_under_the_tcp_model_does_not_add_message_overhead_s(
        run_dir: Path, tmp_path: Path, capsys):
    """A real network's message_overhead_s holds network time: the TCP model leaves it
    out; max-min (an emulated run, where it is the software beyond the emulated wire)
    keeps using it."""
    data = json.loads((run_dir / "result.json").read_text())
    for rank in data["per_worker"]:
        rank["message_overhead_s"] = 5.0
    doctored = tmp_path / "result.json"
    doctored.write_text(json.dumps(data))
    rows = {}
    for name, path in (("plain", run_dir / "result.json"), ("doctored", doctored)):
        for model in ("tcp", "maxmin"):
            main(["--compute-from", str(path), "--workers", "2", "--scheme", "ako", "--p", "2",
                  "--ssp", "0", "--quiet", "--network-model", model])
            rows[name, model] = _round_line(capsys.readouterr().out)
    assert rows["plain", "tcp"] == rows["doctored", "tcp"]
    assert rows["plain", "maxmin"] != rows["doctored", "maxmin"]


def _testbed(uplinks_bps: tuple[float, ...], *, pair_caps: dict[tuple[int, int], float],
             downlink_shaped: bool = True, latency_ignored_s: float = 0.0,
             latency_matrix_s: tuple[tuple[float, ...], ...] | None = None) -> tb.TestbedRecord:
    nodes = tuple(tb.TestbedNode(rank=r, namespace=f"ns{r}", device=f"v{r}", bridge_port=f"b{r}",
                              address=f"10.9.0.{r + 1}", port=7000, uplink_bps=rate,
                              downlink_bps=rate if downlink_shaped else None)
                  for r, rate in enumerate(uplinks_bps))
    queues = tuple(tb.ShapedQueue(rank=src, direction="pair", peer=dst, namespace=f"ns{src}",
                               device=f"v{src}", classid=f"1:{10 + dst}", rate_bps=cap,
                               ceil_bps=cap, burst_bytes=3000, queue_limit_bytes=131072)
                   for (src, dst), cap in pair_caps.items())
    return tb.TestbedRecord(testbed="netns", tag="akotb1", hub_namespace="hub", bridge="br0",
                         subnet="10.9.0.0/24", mtu=1500, nodes=nodes, queues=queues,
                         downlink_shaped=downlink_shaped, latency_policy="ignore",
                         latency_ignored_s=latency_ignored_s, in_process_emulation=False,
                         htb_quantum_bytes=1514, tcp_congestion_control="cubic",
                         kernel="6", commands=(), latency_matrix_s=latency_matrix_s)


def test_testbed_network_is_the_realised_uplinks_pair_caps_and_no_latency():
    configured = NetworkConfig(bandwidth_bps=(1e9,), link_bandwidth_bps=(40e6,),
                               latency_s=(0.02,))
    record = _testbed((1e9, 5e8, 1e9), pair_caps={(0, 1): 40e6, (1, 0): 40e6, (2, 0): 10e6},
                      downlink_shaped=False, latency_ignored_s=0.02)
    network, notes = predict.testbed_network(record, configured, 3)
    assert network.uplink_bps(3).tolist() == [1e9, 5e8, 1e9]
    links = network.link_bps_matrix(3)
    assert links[0, 1] == 40e6 and links[1, 0] == 40e6 and links[2, 0] == 10e6
    assert math.isinf(links[0, 2]) and math.isinf(links[1, 2])
    assert network.latency_matrix(3).max() == 0.0
    assert any("unshaped" in note for note in notes)
    assert any("not realised" in note for note in notes)
    with pytest.raises(UsageError):
        predict.testbed_network(record, configured, 4)


def test_testbed_network_takes_the_delays_the_delay_line_realised():
    configured = NetworkConfig(bandwidth_bps=(1e9,), latency_s=(0.02,))
    delays = ((0.0, 0.005, 0.03), (0.005, 0.0, 0.01), (0.03, 0.01, 0.0))
    record = _testbed((2e7, 2e7, 2e7), pair_caps={}, latency_matrix_s=delays)
    network, notes = predict.testbed_network(record, configured, 3)
    assert network.latency_matrix(3).tolist() == [list(row) for row in delays]
    assert not any("not realised" in note for note in notes)


def test_predict_reads_the_testbed_record_beside_the_result(run_dir: Path, tmp_path: Path,
                                                            capsys):
    """The network the testbed realised (here 10 Mbit/s uplinks, not the run's 40) is
    what predict simulates, and it says so."""
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "result.json").write_text((run_dir / "result.json").read_text())
    record = _testbed((10e6, 10e6), pair_caps={})
    (folder / tb.TESTBED_RECORD_FILE).write_text(json.dumps(record.to_json()))
    out = tmp_path / "prediction.json"
    assert main(["predict", str(folder), "--network-model", "maxmin", "--out", str(out)]) == 0
    assert "as the testbed realised it" in capsys.readouterr().out
    plan = read_result(json.loads(out.read_text()))
    assert isinstance(plan, PlanResult)
    assert plan.config["network"]["bandwidth"] == ["10Mbps", "10Mbps"]
    main(["predict", str(run_dir), "--network-model", "maxmin"])
    assert "the run's configuration (no testbed.json)" in capsys.readouterr().out
    (folder / tb.TESTBED_RECORD_FILE).write_text("{}")
    with pytest.raises(SystemExit) as stop:
        main(["predict", str(folder)])
    assert stop.value.code == 2


def test_predict_with_compute_measure_takes_nothing_timed_from_the_run(run_dir: Path,
                                                                       capsys):
    """--compute measure: akosim's own measurement of the run's workload, the run's
    message_software_s unused (host-calibrated)."""
    assert main(["predict", str(run_dir), "--compute", "measure"]) == 0
    printed = capsys.readouterr().out
    assert "akosim's own, not the run's" in printed
    assert "the run's message_software_s" not in printed
    with pytest.raises(SystemExit) as stop:
        main(["predict", str(run_dir), "--compute", "0.3s"])
    assert stop.value.code == 2


def test_message_cpu_is_stretched_by_the_measured_slowdown():
    host = TcpParameters(message_fixed_s=0.0004, message_per_byte_s=2e-9)
    stretched = predict.message_cpu_stretched(host, 1.5)
    assert stretched.message_fixed_s == pytest.approx(0.0006)
    assert stretched.message_per_byte_s == pytest.approx(3e-9)
    assert predict.with_message_cpu("tcp") == (
        "tcp-core+slow-start+one-per-connection+message-cpu+fifo")
    assert predict.with_message_cpu("tcp-core+message-cpu") == "tcp-core+message-cpu"


def _colocated(compute_s: float, single_s: float) -> ColocatedCompute:
    return ColocatedCompute(workload="digits-mlp", batch_size=16, optimizer="sgd", cpu="cpu",
                            jax_version="0", processes=3, cores=2, compute_s=compute_s,
                            single_compute_s=single_s, window_s=2.0, repeats=3, xla_flags="",
                            load_average=1.0, measured_at="2026-01-01T00:00:00+00:00")


def test_colocated_record_round_trips_and_never_speeds_a_step_up():
    record = _colocated(0.009, 0.006)
    assert ColocatedCompute.from_json(record.to_json()) == record
    assert record.slowdown == pytest.approx(1.5)
    assert _colocated(0.004, 0.005).slowdown == 1.0  # a noisy "faster together" is 1
    with pytest.raises(RecordError):
        ColocatedCompute.from_json({**record.to_json(), "kind": "compute"})
    # an older record, made before the step's variation was measured, reads as 0
    older = {k: v for k, v in replace(record, step_cv=0.3).to_json().items() if k != "step_cv"}
    assert ColocatedCompute.from_json(older).step_cv == 0.0
    assert "varies by 0.30" in replace(record, step_cv=0.3).provenance()


def test_colocated_compute_is_measured_once_then_cached(tmp_path: Path, monkeypatch):
    calls = []

    def fake(workload: str, batch_size: int, optimizer: str, processes: int):
        calls.append(processes)
        return replace(_colocated(0.009, 0.006), workload=workload, batch_size=batch_size,
                       optimizer=optimizer, processes=processes,
                       cpu=colocated.key_for(workload, batch_size, optimizer).cpu,
                       jax_version=colocated.key_for(workload, batch_size, optimizer)
                       .jax_version)

    monkeypatch.setattr(colocated, "measure_colocated", fake)
    first, fresh = colocated.colocated_compute("digits-mlp", 16, "sgd", 3, directory=tmp_path)
    again, fresh_again = colocated.colocated_compute("digits-mlp", 16, "sgd", 3,
                                                     directory=tmp_path)
    assert (fresh, fresh_again, again, calls) == (True, False, first, [3])
    colocated.colocated_compute("digits-mlp", 16, "sgd", 4, directory=tmp_path)
    assert calls == [3, 4]  # another number of processes is another measurement


def test_colocated_measurement_steps_k_processes_at_once():
    record = colocated.measure_colocated("digits-mlp", 16, "sgd", 2, window_s=0.3, repeats=1)
    assert record.processes == 2 and record.repeats == 1
    assert record.compute_s > 0 and record.single_compute_s > 0 and record.slowdown >= 1
    assert record.step_cv > 0  # steps of a real process vary
    assert "2 processes stepping at once" in record.provenance()


