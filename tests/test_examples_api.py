"""The Python-API examples at small size: examples/own_loop.py (a plain JAX loop with
akorun.Exchange on 3 loopback ranks: replicas equal under plain SGD, one result.json) and
examples/notebook_style.py (the Flax CNN through akosim.plan, akosim.simulate,
akorun.launch and akocore.read_result)."""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import akocore
import akorun
import akosim
from akorun.errors import UsageError
from akorun.testing import REPO_ROOT, child_test_env

pytestmark = pytest.mark.timeout(900)

EXAMPLES = REPO_ROOT / "examples"


def _env(tmp_path: Path) -> dict[str, str]:
    pythonpath = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    return child_test_env({"PYTHONPATH": pythonpath, "AKO_CACHE_DIR": str(tmp_path / "cache")})


def test_own_loop_ranks_end_with_equal_replicas(tmp_path: Path) -> None:
    out = tmp_path / "own"
    done = subprocess.run([sys.executable, str(EXAMPLES / "own_loop.py"), "--out", str(out),
                           "--rounds", "8"], capture_output=True, text=True,
                          env=_env(tmp_path), cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    replicas = [np.load(out / f"own-loop-{rank}.npy") for rank in range(3)]
    assert np.any(replicas[0] != 0), "the loop trained nothing"
    for rank, replica in enumerate(replicas[1:], start=1):
        np.testing.assert_allclose(replica, replicas[0], rtol=1e-5, atol=1e-6,
                                   err_msg=f"rank {rank}'s replica differs from rank 0's")
    run = akocore.read_result(out)
    assert isinstance(run, akocore.RunResult)
    assert [rank.rounds for rank in run.per_worker] == [8, 8, 8]
    assert run.accuracy is not None and run.accuracy > 0  # the example's R^2 after 8 rounds
    for rank, replica in enumerate(replicas):
        with np.load(out / f"worker-{rank}.npz") as saved:  # what the rank itself wrote
            np.testing.assert_array_equal(saved["params"], replica)
    features = replicas[0].size - 1  # the loop's {"w": (features,), "b": ()}, b first
    with pytest.raises(UsageError, match="akorun.Exchange: give like=your initial"):
        akorun.load_params(out)  # the record names no workload of the user's loop
    back = akorun.load_params(out, rank=1, like={"w": np.zeros(features, np.float32),
                                                 "b": np.float32(0.0)})
    assert back["w"].shape == (features,) and back["b"].shape == ()
    np.testing.assert_array_equal(np.concatenate([[back["b"]], back["w"]]), replicas[1])
    prediction = akosim.predict(out, network_model="maxmin")  # the run is an akorun run
    assert prediction.measured_round_time_s == run.round_time_s
    assert prediction.predicted_round_time_s > 0
    assert prediction.record.runs[0].workers == 3


def test_notebook_style_plans_simulates_launches_and_reads(tmp_path: Path) -> None:
    pytest.importorskip("flax")
    out = tmp_path / "nb"
    done = subprocess.run([sys.executable, str(EXAMPLES / "notebook_style.py"), "--rounds",
                           "4", "--out", str(out)], capture_output=True, text=True,
                          env=_env(tmp_path), cwd=tmp_path, timeout=800)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ring allreduce" in done.stdout and "plan: Ako p=" in done.stdout
    assert "trained parameters: {'Conv_0': {'bias': (8,), 'kernel': (3, 3, 1, 8)}" \
        in done.stdout  # akorun.load_params: the CNN's own pytree
    run = akocore.read_result(out / "result.json")
    assert isinstance(run, akocore.RunResult)
    assert run.training_workers == 3 and run.max_relative_difference is not None
    assert run.max_relative_difference < 1e-5
    assert "RuntimeWarning" not in done.stderr
