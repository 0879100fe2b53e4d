"""akorun launches ako on loopback (3 real processes) with a codec: the replicas are
equal after the drain, the bytes shrink by the codec's ratio, and the final loss stays
close to the uncompressed run's."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from akorun.testing import REPO_ROOT, akorun_command, child_test_env

pytestmark = pytest.mark.timeout(600)
WORKERS = 3


def launch(out: Path, codec: str) -> tuple[dict, list[np.ndarray]]:
    command = akorun_command("launch", "--workers", str(WORKERS), "--rounds", "40",
                             "--lr", "0.1", "--optimizer", "sgd", "--p", "2",
                             "--workload", "digits-mlp", "--codec", codec, "--out", str(out),
                             "--quiet", "--timeout", "150s")
    result = subprocess.run(command, capture_output=True, text=True, env=child_test_env(),
                            cwd=REPO_ROOT, timeout=200)
    assert result.returncode == 0, result.stderr
    merged = json.loads((out / "result.json").read_text())
    replicas = []
    for rank in range(WORKERS):
        with np.load(out / f"worker-{rank}.npz") as data:
            replicas.append(np.array(data["params"]))
    return merged, replicas


def mean_loss(merged: dict) -> float:
    return float(np.mean([worker["final_loss"] for worker in merged["per_worker"]]))


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> dict:
    merged, _ = launch(tmp_path_factory.mktemp("none") / "run", "none")
    return merged


@pytest.mark.parametrize(("codec", "most_bytes", "loss_slack"),
                         [("int8", 0.27, 0.05), ("topk:0.01", 0.05, 0.25)])
def test_a_coded_launch_ends_with_equal_replicas_fewer_bytes_and_a_close_loss(
        tmp_path: Path, plain: dict, codec: str, most_bytes: float, loss_slack: float) -> None:
    merged, replicas = launch(tmp_path / "run", codec)
    assert merged["config"]["exchange"]["codec"] == codec
    for replica in replicas[1:]:
        np.testing.assert_allclose(replica, replicas[0], rtol=1e-5, atol=1e-6)
    ratio = merged["bytes_sent_per_worker_per_round"] / plain["bytes_sent_per_worker_per_round"]
    assert 0 < ratio <= most_bytes
    assert mean_loss(merged) < 2.0 < np.log(10)  # it trained (chance is ln 10)
    assert abs(mean_loss(merged) - mean_loss(plain)) <= loss_slack * mean_loss(plain)


def test_a_misspelt_codec_exits_2_with_one_line() -> None:
    command = akorun_command("launch", "--codec", "int4", "--out", "unused-dir")
    result = subprocess.run(command, capture_output=True, text=True, env=child_test_env(),
                            cwd=REPO_ROOT, timeout=60)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert "topk:FRACTION" in lines[-1] and "Traceback" not in result.stderr
