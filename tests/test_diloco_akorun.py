"""akorun runs DiLoCo and Streaming DiLoCo on loopback (3 real worker processes).

DiLoCo: a run whose rounds are a multiple of H ends on a full sync, so every replica
holds the same parameters (bit for bit: each rank sums the pseudo-gradients in rank
order). Streaming DiLoCo: the fragment synced last is equal on every replica. A member
killed around an outer sync does not stall the others: they apply the sync without it
once the peer timeout suspends it and go on to the last round. With a codec on the
pseudo-gradients (int8, top-k) the replicas stay bit-equal where they synced last, and
each sync's message weighs exactly the codec's encoded size.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from akocore.codecs import codec_named
from akocore.partition import partition_bounds
from akocore.schemes.diloco_sync import chunk_bounds
from akocore.workloads.flat import build_workload
from akorun.testing import REPO_ROOT, LocalCluster, akorun_command, child_test_env
from akorun.transport.wire import HEADER_SIZE

pytestmark = pytest.mark.timeout(150)


@pytest.fixture(scope="module")
def theta0() -> np.ndarray:
    return np.array(build_workload("digits-mlp").init_params)


def _launch(tmp_path: Path, *args: str) -> tuple[dict, list[np.ndarray]]:
    out = tmp_path / "run"
    command = akorun_command("launch", "--workers", "3", "--rounds", "20", "--lr", "0.1",
                             "--optimizer", "sgd", "--workload", "digits-mlp", *args,
                             "--out", str(out), "--quiet", "--timeout", "120s")
    result = subprocess.run(command, capture_output=True, text=True, env=child_test_env(),
                            cwd=REPO_ROOT, timeout=140)
    assert result.returncode == 0, result.stderr
    merged = json.loads((out / "result.json").read_text())
    replicas = []
    for rank in range(3):
        with np.load(out / f"worker-{rank}.npz") as data:
            replicas.append(np.array(data["params"]))
    return merged, replicas


def test_diloco_ends_on_a_sync_with_equal_replicas(tmp_path: Path, theta0: np.ndarray) -> None:
    merged, replicas = _launch(tmp_path, "--scheme", "diloco", "--inner-steps", "5")
    assert merged["scheme"] == "diloco"
    assert [w["rounds"] for w in merged["per_worker"]] == [20] * 3
    for replica in replicas[1:]:
        np.testing.assert_array_equal(replica, replicas[0])
    assert float(np.max(np.abs(replicas[0] - theta0))) > 1e-3


def test_streaming_diloco_ends_with_the_last_synced_fragment_equal(
        tmp_path: Path, theta0: np.ndarray) -> None:
    merged, replicas = _launch(tmp_path, "--scheme", "streaming-diloco", "--inner-steps",
                               "10", "--fragments", "2", "--overlap-steps", "1")
    assert merged["scheme"] == "streaming-diloco"
    assert [w["rounds"] for w in merged["per_worker"]] == [20] * 3
    bounds = partition_bounds(theta0.size, 2)
    last = slice(int(bounds[1]), int(bounds[2]))  # windows of 5 rounds: 0,1,0,1
    for replica in replicas[1:]:
        np.testing.assert_array_equal(replica[last], replicas[0][last])
    assert float(np.max(np.abs(replicas[0] - theta0))) > 1e-3


@pytest.mark.parametrize(("codec", "knobs", "fragments"), [
    ("int8", ("--scheme", "diloco", "--inner-steps", "5"), 1),
    ("topk:0.1", ("--scheme", "streaming-diloco", "--inner-steps", "10", "--fragments", "2",
                  "--overlap-steps", "1"), 2),
])
def test_coded_pseudo_gradients_leave_equal_replicas_and_weigh_the_encoded_size(
        tmp_path: Path, theta0: np.ndarray, codec: str, knobs: tuple[str, ...],
        fragments: int) -> None:
    merged, replicas = _launch(tmp_path, *knobs, "--codec", codec)
    assert merged["config"]["exchange"]["codec"] == codec
    bounds = partition_bounds(theta0.size, fragments)
    last = slice(int(bounds[-2]), int(bounds[-1]))  # the fragment synced after round 19
    for replica in replicas[1:]:
        np.testing.assert_array_equal(replica[last], replicas[0][last])
    # 4 syncs of 20 rounds (DiLoCo H = 5; Streaming windows of 5 rounds), each an
    # all-reduce of the fragment in 3 chunks: rank r sends the 2 chunks it does not own to
    # their owners and the mean of chunk r to the 2 peers, each message the codec's exact
    # bytes plus the header
    def sent_by(rank: int) -> int:
        total = 0
        for k in range(4):
            chunks = np.diff(chunk_bounds(int(bounds[k % fragments]),
                                          int(bounds[k % fragments + 1]), 3))
            total += sum((2 if c == rank else 1)
                         * (codec_named(codec).encoded_bytes(int(size)) + HEADER_SIZE)
                         for c, size in enumerate(chunks))
        return total

    expected = [sent_by(rank) for rank in range(3)]
    assert [w["bytes_sent_rounds"] for w in merged["per_worker"]] == expected
    assert max(expected) < 0.3 * 2 * 4 * (theta0.size // fragments) * 4  # well under float32
    assert float(np.max(np.abs(replicas[0] - theta0))) > 1e-3


def _tables(**exchange: Any) -> dict[str, Any]:
    return {"cluster": {"workers": 3},
            "exchange": {"scheme": "diloco", "inner_steps": 5, **exchange},
            "train": {"workload": "digits-mlp", "optimizer": "sgd", "lr": 0.1, "rounds": 20,
                      "eval_every": 1000}}


def test_a_member_killed_after_its_sync_sends_leaves_the_survivors_equal(
        tmp_path: Path) -> None:
    """Rank 2 dies once both peers acknowledged its pseudo-gradient of the sync after
    round 4: both survivors average it into that sync, then sync without it."""
    with LocalCluster(tmp_path, _tables()) as cluster:
        cluster.start_all("--quiet", env={"AKORUN_FAULT": "2@kill_after_round:4"})
        assert cluster.wait(2, 60) == -9
        codes = {rank: cluster.wait(rank, 90) for rank in (0, 1)}
        assert codes == {0: 0, 1: 0}, cluster.logs()
        results = [cluster.result(rank) for rank in (0, 1)]
        assert all(r["rounds"] == 20 and 2 in r["suspended_at_end"] for r in results)
        np.testing.assert_array_equal(cluster.params(1), cluster.params(0))


def test_a_member_killed_during_a_sync_does_not_stall_the_others(tmp_path: Path) -> None:
    """Rank 2 dies after one peer got its pseudo-gradient of the sync after round 4; the
    other waits for it until the peer timeout, then applies the sync without it."""
    with LocalCluster(tmp_path, _tables()) as cluster:
        cluster.start_all("--quiet", env={"AKORUN_FAULT": "2@kill_mid_send:4"})
        assert cluster.wait(2, 60) == -9
        codes = {rank: cluster.wait(rank, 90) for rank in (0, 1)}
        assert codes == {0: 0, 1: 0}, cluster.logs()
        results = [cluster.result(rank) for rank in (0, 1)]
        assert all(r["rounds"] == 20 and 2 in r["suspended_at_end"] for r in results)
        assert all(r["peer_timeouts"] >= 1 for r in results)
