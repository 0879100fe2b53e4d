"""A rank of the parameter-server or all-reduce scheme killed mid-run: every survivor ends.

These schemes cannot rejoin (`--resume` is for ako) and a dead rank's shard or ring
step is lost, so their replicas may differ (docs/guide/failure.md). What is
promised is that the run still ends: no survivor hangs; every survivor stops with
exit 1 (the run could not complete) and writes its result, stop reason "lost_peer",
naming the peer it lost.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from akorun.testing import LocalCluster
from tests.scheme_runs import kill_at_round

pytestmark = pytest.mark.slow


def _tables(scheme: str) -> dict[str, Any]:
    exchange: dict[str, Any] = {"scheme": scheme, "ssp": 0}
    if scheme == "ps":
        exchange.update(ps_servers=1)
    return {"cluster": {"workers": 3}, "exchange": exchange,
            "train": {"workload": "digits-mlp", "optimizer": "sgd", "lr": 0.1, "rounds": 60,
                      "eval_every": 1000}}


@pytest.mark.parametrize(("scheme", "victim"), [("ps", 1), ("allreduce", 2)],
                         ids=["ps-worker", "allreduce-rank"])
def test_a_killed_rank_of_a_scheme_without_rejoin_leaves_a_run_that_still_ends(
        scheme: str, victim: int, tmp_path: Path) -> None:
    survivors = [rank for rank in range(3) if rank != victim]
    with LocalCluster(tmp_path, _tables(scheme)) as cluster:
        cluster.start_all("--quiet")
        kill_at_round(cluster, victim, 5)
        # generous: peer timeout 3 s, three timeouts at a stuck gate, the finish grace
        codes = {rank: cluster.wait(rank, 240) for rank in survivors}
        assert all(code == 1 for code in codes.values()), (codes, cluster.logs())
        for rank in survivors:
            result = cluster.result(rank)
            assert result["stop_reason"] == "lost_peer", cluster.logs()
            assert f"lost peer(s) [{victim}]" in cluster.log(rank), cluster.logs()
            assert result["peer_timeouts"] >= 1, cluster.logs()
            assert victim in result["suspended_at_end"], cluster.logs()
