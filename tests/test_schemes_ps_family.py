"""The parameter-server family of the Distributed TensorFlow Guide and AEASGD.

Elastic averaging conserves sum_i x_i + centre (the elastic force is
symmetric); DOWNPOUR and ADAG/AGN servers end at theta0 minus every update the
workers applied (divided by lambda for ADAG); per-worker learning rates scale
each worker's share of the synchronous step. All under random delivery
orders, delays and duplicates (tests/scheme_harness.py).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from akocore.optim import PlainSGD
from akocore.schemes import (
    DeltaPSServer,
    ElasticServer,
    ElasticWorker,
    LocalStepPSWorker,
    SchemeSpec,
    build_nodes,
    elastic_alpha,
)
from tests.scheme_harness import drive

LR = 0.25
SLOW = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

cases = st.fixed_dictionaries({
    "workers": st.integers(2, 6),  # training workers
    "servers": st.integers(1, 3),
    "length": st.integers(3, 12),
    "every": st.integers(1, 4),
    "fetch_every": st.integers(1, 4),
    "staleness": st.sampled_from([0, 1, 3, math.inf]),
    "rounds_seed": st.integers(0, 10_000),
    "max_rounds": st.integers(0, 8),
    "seed": st.integers(0, 2**31),
    "duplicate_prob": st.sampled_from([0.0, 0.1, 0.3]),
})


def _run(case: dict, **spec_fields: object) -> tuple[list, dict, np.ndarray, int]:
    n, servers, length = case["workers"], case["servers"], case["length"]
    spec = SchemeSpec("ps", n + servers, ps_servers=servers, staleness=case["staleness"],
                      push_every=case["every"], **spec_fields)  # type: ignore[arg-type]
    theta0 = np.linspace(-1, 1, length).astype(np.float32)
    nodes = build_nodes(spec, length, theta0, PlainSGD(LR))
    rounds = {r: int(x) for r, x in enumerate(
        np.random.default_rng(case["rounds_seed"]).integers(0, case["max_rounds"] + 1, n))}
    log = drive(nodes, rounds, seed=case["seed"], length=length,
                duplicate_prob=case["duplicate_prob"])
    assert log.duplicates_dropped == log.duplicates_sent
    total = sum((g.astype(np.float64) for gs in log.gradients.values() for g in gs),
                np.zeros(length))
    return nodes, rounds, total, n


def _centre(nodes: list, n: int) -> np.ndarray:
    return np.concatenate([node.params for node in nodes[n:]])


@SLOW
@given(case=cases, alpha=st.sampled_from([0.0, 0.1, 0.5]))
def test_elastic_averaging_conserves_the_sum_of_replicas_and_centre(case: dict,
                                                                    alpha: float) -> None:
    nodes, _, total, n = _run(case, ps_mode="elastic", elastic_alpha=alpha)
    assert isinstance(nodes[0], ElasticWorker) and isinstance(nodes[n], ElasticServer)
    theta0 = np.linspace(-1, 1, case["length"]).astype(np.float32)
    mass = sum(node.params.astype(np.float64) for node in nodes[:n]) + _centre(nodes, n)
    np.testing.assert_allclose(mass, (n + 1) * theta0 - LR * total, rtol=1e-5, atol=1e-4)


@SLOW
@given(case=cases, push_average=st.booleans())
def test_downpour_and_adag_servers_apply_every_local_update_once(case: dict,
                                                                 push_average: bool) -> None:
    """centre = theta0 - lr * sum(gradients) (/ lambda for ADAG) after a drain."""
    nodes, rounds, total, n = _run(case, ps_mode="async", local_steps=True,
                              push_average=push_average, fetch_every=case["fetch_every"])
    assert isinstance(nodes[0], LocalStepPSWorker) and isinstance(nodes[n], DeltaPSServer)
    scale = 1.0 / case["every"] if push_average else 1.0
    theta0 = np.linspace(-1, 1, case["length"]).astype(np.float32)
    np.testing.assert_allclose(_centre(nodes, n), theta0 - LR * scale * total,
                               rtol=1e-5, atol=1e-4)
    if any(rounds.values()):  # per shard, the worker answered last holds exactly the centre
        for server in nodes[n:]:
            window = slice(server.start, server.stop)
            assert any(np.array_equal(node.params[window], server.params)
                       for node in nodes[:n])


@SLOW
@given(case=cases)
def test_elastic_gate_bounds_unanswered_exchanges(case: dict) -> None:
    n, servers = case["workers"], case["servers"]
    spec = SchemeSpec("ps", n + servers, ps_servers=servers, staleness=case["staleness"],
                      push_every=case["every"], ps_mode="elastic")
    nodes = build_nodes(spec, case["length"], None, None)
    rounds = {r: case["max_rounds"] for r in range(n)}
    log = drive(nodes, rounds, seed=case["seed"], length=case["length"],
                duplicate_prob=case["duplicate_prob"])
    assert all(node.drained() for node in nodes)
    assert len(log.starts) == n * case["max_rounds"]


def test_adag_local_steps_then_one_normalised_push() -> None:
    """ADAG with lambda = 3: no message for two rounds, then update / 3, then fetch."""
    spec = SchemeSpec("ps", 2, ps_servers=1, ps_mode="async", local_steps=True,
                      push_average=True, push_every=3, fetch_every=3)
    nodes = build_nodes(spec, 2, np.zeros(2, np.float32), PlainSGD(1.0))
    worker = nodes[0]
    assert worker.local_step(0, np.ones(2, np.float32)) == []
    assert worker.local_step(1, np.ones(2, np.float32)) == []
    np.testing.assert_allclose(worker.params, [-2, -2])  # local optimizer steps
    (push,) = worker.local_step(2, np.ones(2, np.float32))
    np.testing.assert_allclose(push.message.values, [1, 1])  # (3 * lr * g) / 3
    (reply,) = nodes[1].receive(push.message).effects
    np.testing.assert_allclose(reply.message.values, [-1, -1])
    worker.receive(reply.message)
    np.testing.assert_allclose(worker.params, [-1, -1])  # fetched the centre


def test_per_worker_learning_rates_scale_each_share_of_the_sync_step() -> None:
    spec = SchemeSpec("ps", 3, ps_servers=1, ps_mode="sync", worker_lr_scale=(1.0, 0.5))
    theta0 = np.zeros(2, np.float32)
    nodes = build_nodes(spec, 2, theta0, PlainSGD(LR))
    log = drive(nodes, {0: 4, 1: 4}, seed=3, length=2)
    want = theta0 - LR / 2 * (sum(log.gradients[0]) + 0.5 * sum(log.gradients[1]))
    np.testing.assert_allclose(nodes[2].params, want, rtol=1e-5, atol=1e-5)
    for node in nodes[:2]:
        np.testing.assert_allclose(node.params, want, rtol=1e-5, atol=1e-5)


def test_elastic_moving_rate_defaults_to_beta_over_n() -> None:
    assert elastic_alpha(0.0, 9) == pytest.approx(0.1)
    with pytest.raises(ValueError):
        elastic_alpha(1.5, 4)
    with pytest.raises(ValueError):
        SchemeSpec("ps", 3, ps_servers=1, worker_lr_scale=(1.0, 0.5, 0.5))


@SLOW
@given(case=cases, push_average=st.booleans(), reduce=st.sampled_from(["mean", "sum"]),
       equal_rounds=st.booleans())
def test_sdag_and_sagn_apply_every_local_update_once_in_lockstep(
        case: dict, push_average: bool, reduce: str, equal_rounds: bool) -> None:
    """centre = theta0 - lr * scale * sum(gradients) (/ lambda); a run of equal
    rounds ending on an exchange leaves every worker holding the centre."""
    lam = case["every"]
    if equal_rounds:
        case = {**case, "max_rounds": lam * (1 + case["max_rounds"] // 2)}
    n, servers, length = case["workers"], case["servers"], case["length"]
    spec = SchemeSpec("ps", n + servers, ps_servers=servers, ps_mode="sync", local_steps=True,
                      push_average=push_average, push_every=lam, reduce=reduce)
    theta0 = np.linspace(-1, 1, length).astype(np.float32)
    nodes = build_nodes(spec, length, theta0, PlainSGD(LR))
    rounds = ({r: case["max_rounds"] for r in range(n)} if equal_rounds else
              {r: int(x) for r, x in enumerate(np.random.default_rng(case["rounds_seed"])
                                                .integers(0, case["max_rounds"] + 1, n))})
    log = drive(nodes, rounds, seed=case["seed"], length=length,
                duplicate_prob=case["duplicate_prob"])
    assert log.duplicates_dropped == log.duplicates_sent
    total = sum((g.astype(np.float64) for gs in log.gradients.values() for g in gs),
                np.zeros(length))
    scale = (1.0 / n if reduce == "mean" else 1.0) / (lam if push_average else 1.0)
    np.testing.assert_allclose(_centre(nodes, n), theta0 - LR * scale * total,
                               rtol=1e-5, atol=1e-4)
    if equal_rounds:
        for node in nodes[:n]:
            np.testing.assert_allclose(node.params, _centre(nodes, n), rtol=1e-6, atol=1e-6)
    for _, started, peers in log.starts:  # lockstep at every exchange
        for peer_next in peers.values():
            assert started - peer_next <= lam - 1


@SLOW
@given(seed=st.integers(0, 2**31 - 1), push_every=st.sampled_from([1, 2, 3]),
       fetch_every=st.sampled_from([1, 2, 3]), workers=st.sampled_from([2, 3]),
       rounds=st.integers(1, 7))
def test_plain_async_ps_answers_a_final_after_that_workers_earlier_messages(
        seed: int, push_every: int, fetch_every: int, workers: int, rounds: int) -> None:
    """The final marker may overtake the worker's last pushes on the wire; the server
    answers it only once they arrived, so the worker answered last ends on the centre."""
    spec = SchemeSpec("ps", workers + 1, ps_servers=1, ps_mode="async", staleness=math.inf,
                      push_every=push_every, fetch_every=fetch_every)
    nodes = build_nodes(spec, 3, np.zeros(3, np.float32), PlainSGD(LR))
    drive(nodes, dict.fromkeys(range(workers), rounds), seed=seed, length=3)
    centre = nodes[workers].params
    assert any(np.array_equal(node.params, centre) for node in nodes[:workers])
