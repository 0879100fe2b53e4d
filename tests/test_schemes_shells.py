"""Every named scheme preset runs in akosim, timing and training (digits-mlp).

configs/presets/*.toml name WAGMA-SGD, elastic averaging and the Distributed
TensorFlow Guide's schemes; each must load, simulate and learn.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from akocore.settings.schema import NetworkConfig, TrainConfig
from akocore.settings.toml_io import load_config
from akosim.planning.compute import ComputeModel
from akosim.planning.runspec import configured_runs
from akosim.sim.engine import StopRule
from akosim.sim.scenario import Setup, Variant, simulate

PRESETS = Path(__file__).resolve().parent.parent / "configs" / "presets"
NAMES = ("wagma", "hogwild", "downpour", "adag", "sdag", "sync-sgd", "sync-sgd-lr-per-worker",
         "easgd", "muloco")
ROUNDS = 30
# SDAG/SAGN averages lambda steps into one update: lambda times the lr for the same progress
LR_OF = {"sdag": 0.4}


@pytest.fixture(scope="module")
def workload():
    from akocore.workloads.flat import build_workload

    return build_workload("digits-mlp", batch_size=16, seed=3)


def _setup(name: str, length: int, rounds: int, **train: object) -> Setup:
    cfg = load_config(PRESETS / f"{name}.toml")
    cfg = replace(cfg, cluster=replace(cfg.cluster, workers=5),
                  network=NetworkConfig(bandwidth_bps=(1e6,), latency_s=(0.002,)),
                  train=replace(cfg.train, rounds=rounds, seed=3, batch_size=16, **train))
    return Setup(cfg, length, ComputeModel(0.01, jitter=0.3, seed=1), 16,
                 StopRule(rounds=rounds, drain=True))


def test_every_preset_is_listed() -> None:
    assert sorted(p.stem for p in PRESETS.glob("*.toml")) == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_preset_trains_digits_mlp_in_akosim(name: str, workload) -> None:
    setup = _setup(name, workload.param_count, ROUNDS, lr=LR_OF.get(name, 0.1))
    before = workload.evaluate(np.asarray(workload.init_params, dtype=np.float32))
    (run,) = configured_runs(setup, workload=workload, eval_every=10)
    assert run.final_accuracy is not None
    assert run.final_accuracy > before + 0.2, (name, before, run.final_accuracy)
    assert run.training_workers == (5 if name in ("wagma", "muloco") else 4)  # ps: a server


@pytest.mark.parametrize("name", NAMES)
def test_preset_runs_timing_only(name: str) -> None:
    (run,) = configured_runs(_setup(name, 40_000, 20))
    assert run.round_time_s > 0 and run.bytes_sent_per_worker_per_round > 0


def test_wagma_global_average_costs_more_traffic_than_group_rounds() -> None:
    """Group rounds send G - 1 models, global rounds n - 1: tau = 1 sends the most."""
    sent = {}
    for tau in (1, 10):
        setup = _setup("wagma", 40_000, 20)
        cfg = setup.config
        cfg = replace(cfg, cluster=replace(cfg.cluster, workers=8),
                      exchange=replace(cfg.exchange, group_size=2, global_every=tau))
        run = simulate(replace(setup, config=cfg), Variant("wagma"))
        sent[tau] = run.bytes_sent_per_worker_per_round
        assert run.staleness_bound_rounds == tau - 1
    model_bytes = 40_000 * 4
    assert sent[1] == pytest.approx(7 * model_bytes, rel=0.05)
    assert sent[10] == pytest.approx((9 * 1 + 7) / 10 * model_bytes, rel=0.05)


def test_per_worker_learning_rate_preset_scales_the_shares() -> None:
    cfg = load_config(PRESETS / "sync-sgd-lr-per-worker.toml")
    assert cfg.exchange.worker_lr_scale == (1.0, 1.0, 0.5, 0.5)
    assert isinstance(TrainConfig().lr, float)
