"""A rank that is alive but stuck (it answers heartbeats, its round never ends) is given up.

Rank 0 is held before round 8 by the `pause_before_round` hook (a hung data
loader or a deadlocked step: its event loop still answers). Its peers give it
up once it has made no progress for 3 x the peer timeout (runtime.liveness.peer_liveness),
answering heartbeats does not put it back, and every other rank ends by its
own stop rule: ako and (Streaming) DiLoCo go on without it and finish with
exit 0; ps and all-reduce training ranks stop with exit 1 and a line naming
rank 0. The stuck
rank of a scheme that does not take it back stops itself with exit 1 and says
that its peers gave it up.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from akorun.launching.cluster import new_settings
from akorun.testing import LocalCluster

pytestmark = pytest.mark.slow

PEER_TIMEOUT_S = 1.5
GENEROUS_S = 120.0  # a bound for a test that hangs, not a measurement


def _tables(scheme: str, stop: dict[str, Any]) -> dict[str, Any]:
    exchange: dict[str, Any] = {"scheme": scheme}
    if scheme == "ako":
        exchange.update(p=2, ssp=2)
    if scheme == "ps":
        exchange.update(ps_servers=1)
    if scheme == "diloco":
        exchange.update(inner_steps=4)
    if scheme == "streaming-diloco":
        exchange.update(inner_steps=4, fragments=2, overlap_steps=1)
    return {"cluster": {"workers": 3}, "exchange": exchange,
            "train": {"workload": "digits-mlp", "optimizer": "sgd", "lr": 0.1,
                      "eval_every": 100000, **stop}}


def _run_with_rank_0_stuck(tmp_path: Path, scheme: str, stop: dict[str, Any]
                           ) -> tuple[LocalCluster, Path]:
    go = tmp_path / "go"
    cluster = LocalCluster(tmp_path, _tables(scheme, stop),
                           settings=new_settings(peer_timeout_s=PEER_TIMEOUT_S))
    cluster.start_all("--quiet", env={"AKORUN_FAULT": f"0@pause_before_round:8:{go}"})
    return cluster, go


DURATION = {"rounds": "none", "duration": "12s"}


@pytest.mark.parametrize(("scheme", "stop"), [
    ("ako", DURATION), ("ako", {"rounds": 300}), ("diloco", DURATION),
    ("streaming-diloco", {"rounds": 300})],
    ids=["ako-duration", "ako-rounds", "diloco-duration", "streaming-diloco-rounds"])
def test_the_others_give_a_stuck_rank_up_and_end_by_their_stop_rule(
        scheme: str, stop: dict[str, Any], tmp_path: Path) -> None:
    cluster, go = _run_with_rank_0_stuck(tmp_path, scheme, stop)
    with cluster:
        codes = {rank: cluster.wait(rank, GENEROUS_S) for rank in (1, 2)}
        assert codes == {1: 0, 2: 0}, cluster.logs()
        for rank in (1, 2):
            result = cluster.result(rank)
            assert result["stop_reason"] == ("rounds" if "rounds" in stop
                                             and stop["rounds"] != "none" else "duration")
            if stop.get("rounds") == 300:
                assert result["rounds"] == 300
            log = cluster.log(rank)
            assert "given up on" in log and "peer 0" in log, log
        if scheme == "ako":  # ako takes it back with its next round: it ends when released
            for rank in (1, 2):  # not before: its answers to heartbeats do not count
                assert "peer 0 speaks again" not in cluster.log(rank), cluster.log(rank)
            go.touch()
            cluster.wait(0, GENEROUS_S)
        else:  # its peers went on without it: it stops itself, loudly
            assert cluster.wait(0, GENEROUS_S) == 1, cluster.log(0)
            assert "its peers gave it up" in cluster.log(0), cluster.log(0)


@pytest.mark.parametrize("scheme", ["allreduce", "ps"])
def test_a_stuck_rank_stops_a_scheme_that_needs_every_rank_with_a_line_naming_it(
        scheme: str, tmp_path: Path) -> None:
    cluster, go = _run_with_rank_0_stuck(tmp_path, scheme, {"rounds": 300})
    with cluster:
        # the first rank that gives rank 0 up tells every other to stop: all fail
        codes = {rank: cluster.wait(rank, GENEROUS_S) for rank in (1, 2)}
        go.touch()  # rank 0 too, once its step returns (told, or giving itself up)
        codes[0] = cluster.wait(0, GENEROUS_S)
        assert codes == {0: 1, 1: 1, 2: 1}, cluster.logs()
        trainers = (1, 2) if scheme == "allreduce" else (1,)
        for rank in trainers:
            assert cluster.result(rank)["stop_reason"] == "lost_peer", cluster.logs()
            log = cluster.log(rank)
            assert "peer 0" in log and "no progress" in log, log
