"""A rank of sparta or noloco killed mid-run: the survivors go on without it and end.

Neither scheme needs every rank (`Scheme.needs_every_rank` is False): once the peer
timeout suspends the dead rank, SPARTA's survivors average among themselves and
NoLoCo's group of three goes on as a pair (akocore/schemes/sparta.py and noloco.py
say so; the node-level behaviour is tested in tests/test_schemes_sparta.py and
tests/test_schemes_noloco.py). What is tested here is the real run: every survivor
trains every round and exits 0, with the victim suspended at the end.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from akorun.testing import LocalCluster
from tests.scheme_runs import kill_at_round

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ROUNDS = 40
KNOBS = {"sparta": {"sparta_fraction": 0.1}, "noloco": {"noloco_inner_steps": 3}}


def _tables(scheme: str) -> dict[str, Any]:
    return {"cluster": {"workers": 3}, "exchange": {"scheme": scheme, **KNOBS[scheme]},
            "train": {"workload": "digits-mlp", "optimizer": "sgd", "lr": 0.1,
                      "rounds": ROUNDS, "eval_every": 1000}}


@pytest.mark.parametrize("scheme", sorted(KNOBS))
def test_the_survivors_of_a_killed_rank_train_every_round_and_end(scheme: str,
                                                                  tmp_path: Path) -> None:
    victim, survivors = 1, (0, 2)
    with LocalCluster(tmp_path, _tables(scheme)) as cluster:
        cluster.start_all("--quiet")
        kill_at_round(cluster, victim, 5)
        codes = {rank: cluster.wait(rank, 240) for rank in survivors}
        assert all(code == 0 for code in codes.values()), (codes, cluster.logs())
        for rank in survivors:
            result = cluster.result(rank)
            assert result["rounds"] == ROUNDS and result["stop_reason"] == "rounds"
            assert victim in result["suspended_at_end"], cluster.logs()
