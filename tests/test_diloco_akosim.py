"""akosim runs DiLoCo and Streaming DiLoCo: timing rows and real training (digits-mlp).

Timing: a worker computes H inner steps between syncs and all-reduces its
pseudo-gradient (one fragment of it, for Streaming DiLoCo) per sync: 2(n - 1)/n·S/H
bytes per round on average either way ((n - 1)·S/H with the all-to-all sync).
Training: both learn digits, with and without a codec on the pseudo-gradients.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from akocore.settings.schema import (
    ClusterConfig,
    ExchangeConfig,
    NetworkConfig,
    RunConfig,
    TrainConfig,
)
from akosim.planning.compute import ComputeModel
from akosim.planning.runspec import configured_runs
from akosim.sim.engine import StopRule
from akosim.sim.scenario import Setup

WORKERS = 4
LENGTH = 40_000


def _setup(scheme: str, length: int, rounds: int, **exchange: object) -> Setup:
    cfg = RunConfig(cluster=ClusterConfig(workers=WORKERS),
                    network=NetworkConfig(bandwidth_bps=(1e6,), latency_s=(0.002,)),
                    exchange=ExchangeConfig(scheme=scheme, **exchange),
                    train=TrainConfig(rounds=rounds, seed=3, batch_size=16, lr=0.1))
    return Setup(cfg, length, ComputeModel(0.01, jitter=0.0, seed=1), 16,
                 StopRule(rounds=rounds, drain=True))


COPIES = {"allreduce": 2 * (WORKERS - 1) / WORKERS, "all-to-all": WORKERS - 1}


@pytest.mark.parametrize("outer_sync", sorted(COPIES))
@pytest.mark.parametrize(("scheme", "knobs", "label"), [
    ("diloco", {"inner_steps": 10}, "diloco H=10"),
    ("streaming-diloco", {"inner_steps": 10, "fragments": 5, "overlap_steps": 1},
     "streaming-diloco H=10 P=5 tau=1"),
])
def test_timing_rows_charge_h_inner_steps_per_pseudo_gradient_exchange(
        scheme: str, knobs: dict, label: str, outer_sync: str) -> None:
    (run,) = configured_runs(_setup(scheme, LENGTH, 40, outer_sync=outer_sync, **knobs))
    assert run.bytes_sent_per_worker_per_round == pytest.approx(
        COPIES[outer_sync] * LENGTH * 4 / 10, rel=0.01)
    suffix = "" if outer_sync == "allreduce" else " all-to-all"
    assert run.label == label + suffix
    assert run.staleness_bound_rounds == 9 + knobs.get("overlap_steps", 0)


def test_fewer_syncs_take_less_time_on_a_slow_link() -> None:
    """On a 1 Mbit/s link the exchange dominates: H = 20 beats H = 2."""
    times = {h: configured_runs(_setup("diloco", LENGTH, 40, inner_steps=h))[0].round_time_s
             for h in (2, 20)}
    assert times[20] < times[2]


def test_streaming_overlap_hides_the_exchange_behind_inner_steps() -> None:
    """With tau = 1 the sync of a fragment runs during an inner step instead of after it."""
    times = {tau: configured_runs(_setup("streaming-diloco", LENGTH, 40, inner_steps=10,
                                         fragments=2, overlap_steps=tau))[0].round_time_s
             for tau in (0, 4)}
    assert times[4] < times[0]


@pytest.fixture(scope="module")
def workload():
    from akocore.workloads.flat import build_workload

    return build_workload("digits-mlp", batch_size=16, seed=3)


@pytest.mark.parametrize(("scheme", "knobs"), [
    ("diloco", {"inner_steps": 5}),
    ("streaming-diloco", {"inner_steps": 10, "fragments": 2, "overlap_steps": 1}),
    ("diloco", {"inner_steps": 5, "codec": "int8"}),
    ("streaming-diloco", {"inner_steps": 10, "fragments": 2, "overlap_steps": 1,
                          "codec": "topk:0.1", "eager": True}),
])
def test_akosim_train_learns_digits(scheme: str, knobs: dict, workload) -> None:
    setup = _setup(scheme, workload.param_count, 60, **knobs)
    before = workload.evaluate(np.asarray(workload.init_params, dtype=np.float32))
    (run,) = configured_runs(replace(setup), workload=workload, eval_every=20)
    assert run.final_accuracy is not None
    assert run.final_accuracy > max(0.7, before + 0.3), (before, run.final_accuracy)


@pytest.mark.parametrize("outer_sync", sorted(COPIES))
def test_the_round_time_counts_one_sync_per_h_rounds(outer_sync: str) -> None:
    """1 Mbit/s NICs, a 160 kB pseudo-gradient. All-reduce: each uplink sends its 3 chunks
    of 40 kB to their owners (0.96 s), then each owner its mean to the 3 others (0.96 s),
    each step a 2 ms latency. All-to-all: 3 whole copies (3.84 s) and one latency. Per
    H = 10 rounds that is 10 x 10 ms compute plus the sync, whatever the run's length
    (the steady window is whole periods)."""
    steps = 2 if outer_sync == "allreduce" else 1
    sync_s = COPIES[outer_sync] * LENGTH * 4 * 8 / 1e6 + steps * 0.002
    expected = (10 * 0.01 + sync_s) / 10
    for rounds in (20, 27, 40):
        (run,) = configured_runs(_setup("diloco", LENGTH, rounds, inner_steps=10,
                                        outer_sync=outer_sync))
        assert run.round_time_s == pytest.approx(expected, rel=0.02), rounds
