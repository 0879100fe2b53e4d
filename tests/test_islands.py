"""Islands: a rank spanning several devices (forced CPU devices) and several processes
(jax.distributed with gloo CPU collectives on loopback), end to end through `akorun launch`.

- 3 ranks of 2 CPU devices each under all-reduce and plain SGD end with equal replicas,
  equal to the same run computed here with 6 one-device workers' batches (an island of D
  devices gives what D ranks' worth of batches at one device give), within RTOL.
- 2 ranks of 2 processes each under ako and plain SGD end with equal replicas, each equal
  to theta0 - lr/n x the sum of every gradient the islands handed their scheme (recorded
  by the record_gradients test hook): exactly once across islands, within RTOL.
- The settings' mistakes exit 2 with one line; the devices' environment rule is pure.

RTOL = 1e-5 relative (atol 1e-6): the island's pmean adds its devices' gradients in
another order than the reference's NumPy mean, and the exchange sums in arrival order.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from akocore.workloads.flat import build_workload
from akorun.launching.devices import DEVICE_COUNT_FLAG, device_env
from akorun.testing import REPO_ROOT, akorun_command, child_test_env

pytestmark = pytest.mark.timeout(150)

RTOL, ATOL = 1e-5, 1e-6
LR = 0.1
BATCH = 16


def _launch(out: Path, *flags: str, env: dict[str, str] | None = None) -> None:
    command = akorun_command("launch", "--optimizer", "sgd", "--lr", str(LR),
                             "--batch-size", str(BATCH), "--out", str(out),
                             "--timeout", "120s", *flags)
    result = subprocess.run(command, capture_output=True, text=True,
                            env=child_test_env(env), cwd=REPO_ROOT, timeout=140)
    assert result.returncode == 0, result.stderr[-3000:]


def _replicas(out: Path, ranks: int) -> list[np.ndarray]:
    replicas = []
    for rank in range(ranks):
        with np.load(out / f"worker-{rank}.npz") as data:
            replicas.append(np.array(data["params"]))
    return replicas


def _assert_equal(replicas: list[np.ndarray], want: np.ndarray) -> None:
    for rank, replica in enumerate(replicas):
        np.testing.assert_allclose(replica, want, rtol=RTOL, atol=ATOL,
                                   err_msg=f"replica {rank}")


def test_three_ranks_of_two_devices_equal_six_one_device_workers(tmp_path: Path) -> None:
    ranks, devices, rounds = 3, 2, 4
    _launch(tmp_path / "run", "--workers", str(ranks), "--devices-per-rank", str(devices),
            "--scheme", "allreduce", "--rounds", str(rounds))
    log = (tmp_path / "run" / "worker-0.log").read_text()
    assert "island of 2 cpu device(s) in 1 process(es)" in log
    # the same rounds with every device a one-device worker: theta -= lr x mean gradient
    workload = build_workload("digits-mlp", batch_size=BATCH)
    workers = ranks * devices
    streams = [workload.batches(v, workers) for v in range(workers)]
    theta = np.array(workload.init_params, dtype=np.float32)
    theta0 = theta.copy()
    for _ in range(rounds):
        grads = []
        for stream in streams:
            batch = stream.next()
            grads.append(workload.grad_step(theta, batch.x, batch.y, 0)[1])
        theta = theta - np.float32(LR) * np.mean(grads, axis=0, dtype=np.float32)
    assert float(np.max(np.abs(theta - theta0))) > 1e-3  # the rounds moved it
    _assert_equal(_replicas(tmp_path / "run", ranks), theta)


def test_two_ranks_of_two_processes_apply_every_islands_gradient_once(tmp_path: Path) -> None:
    ranks, rounds = 2, 5
    record = tmp_path / "grads"
    _launch(tmp_path / "run", "--workers", str(ranks), "--processes-per-rank", "2",
            "--rounds", str(rounds), env={"AKORUN_FAULT": f"record_gradients:{record}"})
    out = tmp_path / "run"
    follower_log = (out / "worker-0.p1.log").read_text()
    assert "island of 2 cpu device(s) in 2 process(es); this is process 1" in follower_log
    assert "the leader said stop" in follower_log
    assert not (out / "worker-0.p1.json").exists()  # a follower writes no result
    sent = [np.load(path) for path in sorted(record.glob("rank-*/round-*.npy"))]
    assert len(sent) == ranks * rounds
    theta0 = np.array(build_workload("digits-mlp", batch_size=BATCH).init_params)
    want = theta0 - LR / ranks * np.sum(sent, axis=0, dtype=np.float64)
    _assert_equal(_replicas(out, ranks), want.astype(np.float32))


@pytest.mark.parametrize("flags, words", [
    (["--devices-per-rank", "0"], "akorun.devices_per_rank: got 0"),
    (["--processes-per-rank", "x"], "akorun.processes_per_rank"),
    (["--platform", "tpu"], "invalid choice: 'tpu'"),
    pytest.param(["--platform", "gpu"], "nvidia-smi lists no GPU on this host",
                 marks=pytest.mark.skipif(shutil.which("nvidia-smi") is not None,
                                          reason="this host may have GPUs")),
])
def test_bad_island_settings_exit_2_with_one_line(flags: list[str], words: str,
                                                  tmp_path: Path) -> None:
    result = subprocess.run(akorun_command("launch", "--out", str(tmp_path / "run"), *flags),
                            capture_output=True, text=True, env=child_test_env(),
                            cwd=REPO_ROOT, timeout=60)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], result.stderr


def test_device_environment_of_cpu_gpu_and_auto() -> None:
    cpu = device_env("cpu", 2, {"XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false"})
    assert cpu["JAX_PLATFORMS"] == "cpu"
    assert cpu["XLA_FLAGS"] == (f"--xla_cpu_multi_thread_eigen=false "
                                f"{DEVICE_COUNT_FLAG}=2")
    assert device_env("cpu", 1, {"JAX_PLATFORMS": "cuda"}) == {}  # the user's choice wins
    assert "XLA_FLAGS" not in device_env("cpu", 1, {})
    gpu = device_env("gpu", 2, {}, processes_on_host=2, process_slot=1, gpus_on_host=4)
    assert gpu == {"JAX_PLATFORMS": "cuda", "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
                   "CUDA_VISIBLE_DEVICES": "2,3"}
    shared = device_env("gpu", 1, {}, processes_on_host=2, process_slot=1, gpus_on_host=1)
    assert "CUDA_VISIBLE_DEVICES" not in shared  # one GPU for two processes: they share it
    assert "JAX_PLATFORMS" not in device_env("auto", 2, {})


def test_the_python_api_takes_the_island_keywords(tmp_path: Path) -> None:
    import akorun

    with pytest.raises(ValueError, match="akorun.devices_per_rank: got 0"):
        akorun.launch(out=tmp_path / "run", devices_per_rank=0)
    with pytest.raises(ValueError, match="akorun.processes_per_rank: got 0"):
        akorun.launch(out=tmp_path / "run", processes_per_rank=0)
    with pytest.raises(ValueError, match="akorun.platform: got 'tpu', expected one of cpu"):
        akorun.launch(out=tmp_path / "run", platform="tpu")
