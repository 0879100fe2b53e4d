"""DiLoCo survivors of a pause end with one model: the anchors are re-synced, never apart.

One rank of a 3-rank DiLoCo run is stopped (SIGSTOP) for 4 peer timeouts: the
others suspend it and go on; while their views of who is live differ, a sync
would give them different means. After the suspension and the return they
compare their anchors with the lowest live rank's (akorun.runtime.recovery.anchor_sync)
and take it where it differs, so they end bit-equal with exit 0. The paused
rank comes back many syncs behind: it stops with exit 1 and a line saying so,
never exit 0 with another model.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import numpy as np
import pytest

from akocore.optim import PlainSGD
from akocore.schemes.base import Replica, SchemeError
from akocore.schemes.diloco import DilocoWorker
from akorun.launching.cluster import new_settings
from akorun.testing import LocalCluster

pytestmark = pytest.mark.slow

PEER_TIMEOUT_S = 1.5


def test_adopting_a_peers_anchor_keeps_the_progress_made_since_the_sync() -> None:
    params = np.ones(8, np.float32)
    node = DilocoWorker(1, 3, 8, replica=Replica(params.copy(), PlainSGD(0.1)), inner_steps=2)
    assert node.anchor is not None and node.replica.params is not None
    node.replica.params -= 0.5  # local progress since the anchor
    theirs = np.full(8, 3.0, np.float32)
    node.adopt_agreed(0, theirs, [np.full(8, 0.25, np.float32)])
    np.testing.assert_array_equal(node.anchor, theirs)
    np.testing.assert_array_equal(node.replica.params, theirs - 0.5)
    np.testing.assert_array_equal(node.outer_state[0], np.full(8, 0.25, np.float32))
    with pytest.raises(SchemeError):  # another number of syncs applied: not the same state
        node.adopt_agreed(1, theirs, [None])


@pytest.mark.parametrize("paused", [2, 0], ids=["a-rank-paused", "the-reference-paused"])
def test_after_a_pause_the_others_end_bit_equal_and_the_paused_rank_fails_loudly(
        paused: int, tmp_path: Path) -> None:
    tables = {"cluster": {"workers": 3}, "exchange": {"scheme": "diloco", "inner_steps": 4},
              "train": {"workload": "digits-mlp", "optimizer": "sgd", "lr": 0.1,
                        "rounds": 1500, "eval_every": 100000}}
    others = [rank for rank in range(3) if rank != paused]
    with LocalCluster(tmp_path, tables,
                      settings=new_settings(peer_timeout_s=PEER_TIMEOUT_S)) as cluster:
        cluster.start_all("--quiet")
        deadline = time.monotonic() + 120
        while (cluster.status(paused) or {}).get("round", 0) < 100:
            assert time.monotonic() < deadline, cluster.logs()
            time.sleep(0.05)
        cluster.procs[paused].send_signal(signal.SIGSTOP)
        time.sleep(4 * PEER_TIMEOUT_S)
        cluster.procs[paused].send_signal(signal.SIGCONT)
        codes = cluster.wait_all(180)
        assert [codes[rank] for rank in others] == [0, 0], cluster.logs()
        np.testing.assert_array_equal(cluster.params(others[0]), cluster.params(others[1]))
        assert codes[paused] == 1, cluster.logs()
        assert "syncs behind" in cluster.log(paused), cluster.log(paused)
