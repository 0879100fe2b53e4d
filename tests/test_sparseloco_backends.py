"""SparseLoCo runs by name in both backends: akosim times and trains it, akorun launches it.

akosim: a worker sends its compressed pseudo-gradient to each of its n - 1 peers once
per H rounds, each copy the ctopk codec's exact size, so the timing row charges
(n - 1)·encoded/H bytes per round (DiLoCo's all-reduce: 2(n - 1)/n·4·length/H).
akorun: 3 workers on loopback end on a sync with bit-equal replicas, each sync's
message weighing the codec's bytes plus the header; a member killed mid-sync leaves the
survivors finishing the run, equal. The plan times sparseloco's k and bits grid.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from akocore.codecs import codec_named
from akocore.schemes.registry import wire_codec
from akocore.settings.schema import (
    ClusterConfig,
    ExchangeConfig,
    NetworkConfig,
    RunConfig,
    TrainConfig,
)
from akocore.workloads.flat import build_workload
from akorun.transport.wire import HEADER_SIZE
from akosim.planning.compute import ComputeModel
from akosim.planning.runspec import configured_runs
from akosim.sim.engine import StopRule
from akosim.sim.scenario import Setup
from tests.scheme_runs import launch

WORKERS = 4
LENGTH = 40_000


def _setup(scheme: str, length: int, rounds: int, **exchange: object) -> Setup:
    cfg = RunConfig(cluster=ClusterConfig(workers=WORKERS),
                    network=NetworkConfig(bandwidth_bps=(1e6,), latency_s=(0.002,)),
                    exchange=ExchangeConfig(scheme=scheme, **exchange),
                    train=TrainConfig(rounds=rounds, seed=3, batch_size=16, lr=0.1))
    return Setup(cfg, length, ComputeModel(0.01, jitter=0.0, seed=1), 16,
                 StopRule(rounds=rounds, drain=True))


def test_akosim_charges_each_peer_the_compressed_pseudo_gradient() -> None:
    setup = _setup("sparseloco", LENGTH, 40, inner_steps=10)
    (run,) = configured_runs(setup)
    encoded = codec_named(wire_codec(setup.config.exchange)).encoded_bytes(LENGTH)
    assert run.bytes_sent_per_worker_per_round == pytest.approx(
        (WORKERS - 1) * encoded / 10, rel=0.01)
    (diloco,) = configured_runs(_setup("diloco", LENGTH, 40, inner_steps=10))
    assert run.bytes_sent_per_worker_per_round < diloco.bytes_sent_per_worker_per_round / 40
    assert run.round_time_s < diloco.round_time_s  # 1 Mbit/s: the sync dominates
    assert run.label == "sparseloco H=10 k=1.56%/4096 2-bit"


def test_akosim_plans_sparseloco_by_name_with_its_knobs_from_the_flags(capsys) -> None:
    from akosim.cli import main

    assert main(["--scheme", "sparseloco", "--sparseloco-topk-fraction", "0.03",
                 "--sparseloco-bits", "4", "--inner-steps", "5", "--workers", "3",
                 "--gradient-size", "400KB", "--compute", "10ms", "--rounds", "10",
                 "--quiet"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("sparseloco"))
    assert "H=5 k=3%/4096 4-bit" in row
    assert "codec ctopk:0.03:4096:4:0.95" in out


def test_akosim_train_learns_digits_with_sparseloco() -> None:
    workload = build_workload("digits-mlp", batch_size=16, seed=3)
    setup = _setup("sparseloco", workload.param_count, 60, inner_steps=5,
                   sparseloco_topk_fraction=0.25)
    before = workload.evaluate(np.asarray(workload.init_params, dtype=np.float32))
    (run,) = configured_runs(setup, workload=workload, eval_every=20)
    assert run.final_accuracy is not None
    assert run.final_accuracy > before + 0.3, (before, run.final_accuracy)


@pytest.mark.timeout(150)
def test_akorun_launches_sparseloco_by_name_and_ends_with_equal_replicas(
        tmp_path: Path) -> None:
    merged, replicas = launch(tmp_path / "run", 3, 20, "--scheme", "sparseloco",
                              "--inner-steps", "5", "--sparseloco-chunk", "512")
    assert merged["scheme"] == "sparseloco"
    assert [w["rounds"] for w in merged["per_worker"]] == [20] * 3
    for replica in replicas[1:]:
        np.testing.assert_array_equal(replica, replicas[0])
    theta0 = np.array(build_workload("digits-mlp").init_params)
    assert float(np.max(np.abs(replicas[0] - theta0))) > 1e-3
    # 4 syncs, each the whole compressed pseudo-gradient to the 2 peers
    codec = codec_named("ctopk:0.015625:512:2:0.95")
    expected = 4 * 2 * (codec.encoded_bytes(theta0.size) + HEADER_SIZE)
    assert [w["bytes_sent_rounds"] for w in merged["per_worker"]] == [expected] * 3


def test_the_plan_times_sparseloco_with_its_k_and_bits_grid() -> None:
    """The plan's candidates hold sparseloco as configured and each value of its
    `plan_grid` (half and twice k, float32 values), found through the scheme object."""
    from dataclasses import replace

    from akosim.planning.compare import compare_all
    from akosim.planning.pareto_candidates import pareto_candidates

    setup = _setup("sparseloco", LENGTH, 20, inner_steps=4)
    setup = replace(setup, config=replace(setup.config, exchange=replace(
        setup.config.exchange, p="auto")))
    chosen = pareto_candidates(setup, compare_all(setup), max_staleness_rounds=8,
                               training_rounds=20)
    labels = {c.variant.label for c in chosen if c.timing.scheme == "sparseloco"}
    assert {"sparseloco H=4 k=0.781%/4096 2-bit", "sparseloco H=4 k=3.12%/4096 2-bit",
            "sparseloco H=4 k=1.56%/4096 f32"} <= labels, labels


@pytest.mark.timeout(150)
def test_akorun_survivors_of_a_member_killed_mid_sync_finish_with_equal_replicas(
        tmp_path: Path) -> None:
    """Rank 2 dies after one peer got its compressed pseudo-gradient of the sync after
    round 4: the other waits for it until the peer timeout, applies the sync without it,
    and the survivors (their anchors re-synced) end the run on a sync, equal."""
    from akorun.testing import LocalCluster

    tables = {"cluster": {"workers": 3},
              "exchange": {"scheme": "sparseloco", "inner_steps": 5,
                           "sparseloco_chunk": 512},
              "train": {"workload": "digits-mlp", "optimizer": "sgd", "lr": 0.1,
                        "rounds": 20, "eval_every": 1000}}
    with LocalCluster(tmp_path, tables) as cluster:
        cluster.start_all("--quiet", env={"AKORUN_FAULT": "2@kill_mid_send:4"})
        assert cluster.wait(2, 60) == -9
        codes = {rank: cluster.wait(rank, 90) for rank in (0, 1)}
        assert codes == {0: 0, 1: 0}, cluster.logs()
        results = [cluster.result(rank) for rank in (0, 1)]
        assert all(r["rounds"] == 20 and 2 in r["suspended_at_end"] for r in results)
        np.testing.assert_array_equal(cluster.params(1), cluster.params(0))
