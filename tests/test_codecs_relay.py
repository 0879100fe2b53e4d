"""A coded run repairs a rank killed mid-multicast like an uncoded one: the survivor
that holds the dead rank's last round forwards it with its codec payload, the other
decodes it, and both end equal (each withdraws its own residual at the drain)."""

from __future__ import annotations

import signal
from pathlib import Path

import numpy as np
import pytest

from akorun.testing import LocalCluster

pytestmark = pytest.mark.timeout(150)
KILL_ROUND = 5


def test_survivors_of_a_coded_run_end_equal_by_forwarding(tmp_path: Path) -> None:
    tables = {"cluster": {"workers": 3}, "exchange": {"p": 2, "ssp": 1, "codec": "int8"},
              "train": {"workload": "digits-mlp", "optimizer": "sgd", "lr": 0.1,
                        "rounds": 12, "eval_every": 1000}}
    with LocalCluster(tmp_path, tables) as cluster:
        cluster.start_all("--quiet", env={"AKORUN_FAULT": f"2@kill_mid_multicast:{KILL_ROUND}"})
        codes = cluster.wait_all(120)
        assert codes == {0: 0, 1: 0, 2: -signal.SIGKILL}, cluster.logs()
        details = {rank: cluster.result(rank) for rank in (0, 1)}
        for rank in (0, 1):
            assert "Traceback" not in cluster.log(rank)
            assert details[rank]["held_through"]["2"] == KILL_ROUND, details[rank]
            assert details[rank]["relay_refused"] == 0
        assert details[1]["relayed_in"] >= 1 and details[0]["relayed_out"] >= 1, cluster.logs()
        np.testing.assert_allclose(cluster.params(1), cluster.params(0), rtol=1e-5, atol=1e-6)
