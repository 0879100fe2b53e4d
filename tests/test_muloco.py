"""MuLoCo, the preset: DiLoCo with Muon (optax.contrib.muon) as the inner optimizer.

Muon treats a leaf by its shape (it orthogonalises the 2-D ones), so the flat
optimizer hands it the workload's parameter pytree: one Muon step on the flat vector
is optax's step on the pytree, flattened; without the shapes the name is refused.
"""

from __future__ import annotations

import numpy as np
import pytest

from akocore.optim import OptaxFlatOptimizer
from akocore.schemes.named import NAMED_SCHEMES
from akocore.settings.layers import Given, Layer, resolve
from akocore.workloads.flat import build_workload, optimizer_by_name
from akocore.workloads.param_tree import flatten_params


def test_a_muon_step_on_the_flat_vector_is_optaxs_step_on_the_pytree() -> None:
    import jax
    import optax
    from optax.contrib import muon

    rng = np.random.default_rng(0)
    tree = {"w": rng.standard_normal((6, 4)).astype(np.float32),
            "b": rng.standard_normal(4).astype(np.float32)}
    grads = {"w": rng.standard_normal((6, 4)).astype(np.float32),
             "b": rng.standard_normal(4).astype(np.float32)}
    flat, unravel = flatten_params(tree)
    flat_grad, _ = flatten_params(grads)
    ours = optimizer_by_name("muon", 0.02, unravel=unravel)
    assert isinstance(ours, OptaxFlatOptimizer)
    params, state = flat, ours.init(flat)
    theirs = muon(0.02)
    reference, ref_state = tree, theirs.init(tree)
    for _ in range(3):
        params, state = ours.apply(params, state, flat_grad)
        updates, ref_state = theirs.update(grads, ref_state, reference)
        reference = optax.apply_updates(reference, updates)
    expected = np.concatenate([np.asarray(leaf).reshape(-1)
                               for leaf in jax.tree_util.tree_leaves(reference)])
    np.testing.assert_allclose(params, expected, rtol=1e-6, atol=1e-7)
    flat_adam = optimizer_by_name("adam", 0.02)  # the 2-D leaf is not treated as Adam does
    adam_params, _ = flat_adam.apply(flat, flat_adam.init(flat), flat_grad)
    assert not np.allclose(optimizer_by_name("muon", 0.02, unravel=unravel).apply(
        flat, ours.init(flat), flat_grad)[0], adam_params)


def test_muon_without_the_parameter_shapes_is_refused() -> None:
    with pytest.raises(ValueError, match="muon needs the parameters' shapes"):
        optimizer_by_name("muon", 0.02)


def test_the_muloco_name_is_diloco_with_the_muon_inner_optimizer() -> None:
    config = resolve([Given("exchange.scheme", "muloco", Layer.FLAG, "by --scheme")]).config
    assert config.exchange.scheme == "diloco" and config.train.optimizer == "muon"
    assert NAMED_SCHEMES["muloco"].core_scheme == "diloco"


def test_akosim_train_learns_digits_with_muloco() -> None:
    from dataclasses import replace

    from akocore.settings.schema import ClusterConfig, ExchangeConfig, RunConfig, TrainConfig
    from akosim.planning.compute import ComputeModel
    from akosim.planning.runspec import configured_runs
    from akosim.sim.engine import StopRule
    from akosim.sim.scenario import Setup

    workload = build_workload("digits-mlp", batch_size=16, seed=3)
    cfg = RunConfig(cluster=ClusterConfig(workers=3),
                    exchange=ExchangeConfig(scheme="diloco", inner_steps=5),
                    train=TrainConfig(rounds=40, seed=3, batch_size=16, lr=0.02,
                                      optimizer="muon"))
    setup = Setup(cfg, workload.param_count, ComputeModel(0.01, jitter=0.0, seed=1), 16,
                  StopRule(rounds=40, drain=True))
    before = workload.evaluate(np.asarray(workload.init_params, dtype=np.float32))
    (run,) = configured_runs(replace(setup), workload=workload, eval_every=20)
    assert run.final_accuracy is not None
    assert run.final_accuracy > before + 0.3, (before, run.final_accuracy)
