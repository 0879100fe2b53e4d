"""akosim against closed forms, and training mode against the akocore invariants."""

from __future__ import annotations

import math

import numpy as np
import pytest

from akocore.schemes import SchemeSpec, build_nodes
from akocore.settings.schema import (
    ClusterConfig,
    ExchangeConfig,
    NetworkConfig,
    RunConfig,
    TrainConfig,
)
from akosim.planning.compute import ComputeModel
from akosim.sim.engine import StopRule
from akosim.sim.scenario import Setup, Variant, simulate

B = 40e6  # bits/s


def setup_for(n: int, length: int, compute_s: float, latency_s: float = 0.0, rounds: int = 60,
              **train) -> Setup:
    cfg = RunConfig(cluster=ClusterConfig(workers=n),
                    network=NetworkConfig(bandwidth_bps=(B,), latency_s=(latency_s,)),
                    train=TrainConfig(**train) if train else TrainConfig())
    return Setup(cfg, length, ComputeModel(compute_s), 32, StopRule(rounds=rounds, drain=False))


@pytest.mark.parametrize("n,p", [(2, 1), (4, 2), (8, 4), (6, 3), (16, 5)])
def test_lockstep_ako_round_is_compute_plus_transfer_plus_latency(n: int, p: int) -> None:
    length = 60_000 * p  # partitions of equal size
    setup = setup_for(n, length, compute_s=0.3, latency_s=0.005)
    run = simulate(setup, Variant("ako", (p,), ssp=0))
    transfer = (n - 1) * length * 4 * 8 / (p * B)
    assert run.round_time_s == pytest.approx(0.3 + transfer + 0.005, rel=1e-3)


@pytest.mark.parametrize("n,p,s", [(4, 1, 1), (8, 3, 1), (6, 2, 2), (8, 3, 4), (12, 2, 3)])
def test_bandwidth_bound_ssp_round_is_the_transfer_time(n: int, p: int, s: int) -> None:
    length = 60_000 * p
    transfer = (n - 1) * length * 4 * 8 / (p * B)
    setup = setup_for(n, length, compute_s=transfer / 2.5, rounds=200)
    run = simulate(setup, Variant("ako", (p,), ssp=s))
    assert run.round_time_s == pytest.approx(transfer, rel=1e-3)
    assert run.nic_utilisation == pytest.approx(1.0, rel=0.02)
    assert run.staleness_bound_rounds == p - 1 + s


def test_compute_bound_ssp_round_is_the_compute_time() -> None:
    setup = setup_for(4, 40_000, compute_s=1.0, rounds=40)
    run = simulate(setup, Variant("ako", (2,), ssp=2))
    assert run.round_time_s == pytest.approx(1.0, rel=1e-3)


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_ring_allreduce_round_is_2_n_minus_1_steps_of_one_chunk(n: int) -> None:
    length = 30_000 * n
    setup = setup_for(n, length, compute_s=0.2, latency_s=0.001)
    run = simulate(setup, Variant("allreduce"))
    step = (length / n) * 4 * 8 / B + 0.001
    assert run.round_time_s == pytest.approx(0.2 + 2 * (n - 1) * step, rel=1e-3)


@pytest.mark.parametrize("workers", [1, 3, 6])
def test_sync_ps_with_one_server_is_incast_then_broadcast(workers: int) -> None:
    length = 50_000
    setup = setup_for(workers + 1, length, compute_s=0.1, latency_s=0.002)
    run = simulate(setup, Variant("ps", ps_servers=1))
    one_way = workers * length * 4 * 8 / B + 0.002
    assert run.round_time_s == pytest.approx(0.1 + 2 * one_way, rel=1e-3)
    assert run.bytes_sent_per_worker_per_round == pytest.approx(length * 4, rel=1e-3)


def test_a_straggler_sets_the_pace_of_lockstep_ako() -> None:
    """Worker 2 computes 0.3 s, the others 0.1 s; the others' messages (0.096 s on
    the wire) reach it while it computes, so every worker settles at its 0.3 s."""
    setup = setup_for(4, 40_000, compute_s=0.1)
    fast_run = simulate(setup, Variant("ako", (1,), ssp=0))
    assert fast_run.round_time_s == pytest.approx(0.1 + 3 * 160_000 * 8 / B, rel=1e-3)
    slow = Setup(setup.config, setup.length,
                 ComputeModel(0.1, stragglers=(2,), straggler_factor=3.0), 32, setup.stop)
    slow_run = simulate(slow, Variant("ako", (1,), ssp=0))
    for worker in slow_run.per_worker:
        assert worker.round_time_s == pytest.approx(0.3, rel=1e-3)
    assert slow_run.per_worker[0].wait_s > slow_run.per_worker[2].wait_s


# ---------------------------------------------------------------- training mode


@pytest.fixture(scope="module")
def workload():
    from akocore.workloads.flat import build_workload

    return build_workload("digits-mlp", batch_size=16, seed=3)


def train_setup(n: int, ssp: float, p: int, rounds: int, workload,
                flush: str = "full") -> tuple[Setup, Variant]:
    """Ako training; the flush full unless said (the exact sum of every gradient)."""
    cfg = RunConfig(cluster=ClusterConfig(workers=n),
                    network=NetworkConfig(bandwidth_bps=(1e6,), latency_s=(0.002,)),
                    exchange=ExchangeConfig(ssp=ssp, flush=flush),
                    train=TrainConfig(optimizer="sgd", lr=0.1, seed=3, batch_size=16,
                                      rounds=rounds))
    compute = ComputeModel(0.01, jitter=0.3, seed=1)
    setup = Setup(cfg, workload.param_count, compute, 16, StopRule(rounds=rounds, drain=True))
    return setup, Variant("ako", (p,), ssp=ssp)


@pytest.fixture
def spy(monkeypatch):
    """Keep the nodes and the gradient source a simulation builds."""
    from akosim.sim import scenario

    seen: dict = {}
    build, source = scenario.build_nodes, scenario.BatchedGradients

    def keep_nodes(*args, **kwargs):
        seen["nodes"] = build(*args, **kwargs)
        return seen["nodes"]

    def keep_source(*args, **kwargs):
        seen["source"] = source(*args, **kwargs)
        return seen["source"]

    monkeypatch.setattr(scenario, "build_nodes", keep_nodes)
    monkeypatch.setattr(scenario, "BatchedGradients", keep_source)
    return seen


@pytest.mark.parametrize("ssp,p", [(0, 1), (2, 3), (math.inf, 4)])
def test_training_mode_conserves_every_gradient(workload, spy, ssp: float, p: int) -> None:
    setup, variant = train_setup(3, ssp, p, 12, workload)
    run = simulate(setup, variant, workload=workload, eval_every=4)
    theta0 = np.asarray(workload.init_params, dtype=np.float64)
    want = theta0 - 0.1 / 3 * spy["source"].gradient_sum
    for node in spy["nodes"]:
        np.testing.assert_allclose(node.params, want, rtol=1e-4, atol=1e-5)
    assert not np.allclose(want, theta0)
    assert run.evaluations and run.final_accuracy is not None


def test_lockstep_training_follows_the_schemes_driven_directly(workload, spy) -> None:
    """With s = 0 the simulation applies the same updates as a plain lockstep loop
    over the akocore nodes: identical parameters after the same rounds (the default,
    averaging flush included)."""
    from akosim.sim.sim_training import step_seed

    rounds, n, p = 8, 3, 2
    setup, variant = train_setup(n, 0, p, rounds, workload, flush="average")
    simulate(setup, variant, workload=workload, eval_every=100)
    simulated = [node.params for node in spy["nodes"]]

    nodes = build_nodes(SchemeSpec("ako", n, (p,), 0, options=(("flush", "average"),)),
                        workload.param_count,
                        np.array(workload.init_params), workload.optimizer("sgd", 0.1))
    streams = [workload.batches(i, n, 3) for i in range(n)]
    for t in range(rounds):
        sends = []
        for i, node in enumerate(nodes):
            batch = streams[i].next()
            _, grad = workload.grad_step(node.params, batch.x, batch.y, step_seed(3, i, t))
            sends += node.local_step(t, np.array(grad))
        for send in sends:
            for dest in send.dests:
                nodes[dest].receive(send.message)
    for node in nodes:
        for send in node.finish(rounds):
            for dest in send.dests:
                nodes[dest].receive(send.message)
    for node in nodes:
        node.settle()
    for direct, sim in zip(nodes, simulated, strict=True):
        np.testing.assert_allclose(sim, direct.params, rtol=1e-5, atol=1e-6)
