"""WAGMA-SGD's invariants, driven through the randomised harness.

Synchronous group averaging preserves the mean of the replicas (so with plain
SGD the mean after equal rounds is theta0 - lr * sum(gradients) / n); a global
round leaves every replica equal; the tau-step global average bounds how far
any worker runs ahead, under arbitrary delivery orders, delays and duplicates.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from akocore.messages import Kind
from akocore.optim import PlainSGD
from akocore.schemes import SchemeSpec, build_nodes, butterfly_group, butterfly_phases
from tests.scheme_harness import drive

LR = 0.25
SLOW = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _wagma(workers: int, length: int, group_size: int, tau: int, *, wait_avoiding: bool,
           theta0: np.ndarray | None) -> list:
    spec = SchemeSpec("wagma", workers, group_size=group_size, global_every=tau,
                      wait_avoiding=wait_avoiding)
    return build_nodes(spec, length, theta0, PlainSGD(LR) if theta0 is not None else None)


@settings(max_examples=300, deadline=None)
@given(workers=st.integers(2, 40), group_size=st.integers(2, 6), round_=st.integers(0, 50))
def test_butterfly_groups_partition_the_workers(workers: int, group_size: int,
                                                round_: int) -> None:
    groups = {butterfly_group(r, workers, group_size, round_) for r in range(workers)}
    members = sorted(r for g in groups for r in g)
    assert members == list(range(workers))
    for r in range(workers):
        group = butterfly_group(r, workers, group_size, round_)
        assert r in group and len(group) <= group_size


@pytest.mark.parametrize(("workers", "group_size"), [(8, 2), (9, 3), (16, 4), (27, 3), (2, 4)])
def test_butterfly_information_reaches_everyone_in_log_g_rounds(workers: int,
                                                                group_size: int) -> None:
    knows = [{r} for r in range(workers)]
    for t in range(butterfly_phases(workers, group_size)):
        new = []
        for r in range(workers):
            new.append(set().union(*(knows[q] for q in butterfly_group(r, workers, group_size,
                                                                       t))))
        knows = new
    assert all(k == set(range(workers)) for k in knows)


wagma_cases = st.fixed_dictionaries({
    "workers": st.integers(2, 7),
    "length": st.integers(1, 12),
    "group_size": st.integers(2, 4),
    "tau": st.integers(1, 5),
    "rounds": st.integers(0, 9),
    "seed": st.integers(0, 2**31),
    "duplicate_prob": st.sampled_from([0.0, 0.1, 0.3]),
})


@SLOW
@given(case=wagma_cases)
def test_synchronous_group_averaging_keeps_the_mean_of_the_replicas(case: dict) -> None:
    """mean(replicas) after the run = theta0 - lr * sum(all gradients) / n."""
    n, length = case["workers"], case["length"]
    theta0 = np.linspace(-1, 1, length).astype(np.float32)
    nodes = _wagma(n, length, case["group_size"], case["tau"], wait_avoiding=False,
                   theta0=theta0)
    log = drive(nodes, {r: case["rounds"] for r in range(n)}, seed=case["seed"],
                length=length, duplicate_prob=case["duplicate_prob"])
    total = sum((g.astype(np.float64) for gs in log.gradients.values() for g in gs),
                np.zeros(length))
    mean = np.mean([node.params for node in nodes], axis=0)
    np.testing.assert_allclose(mean, theta0 - LR * total / n, rtol=1e-5, atol=1e-4)
    assert log.duplicates_dropped == log.duplicates_sent


@SLOW
@given(case=wagma_cases, wait_avoiding=st.booleans())
def test_a_global_round_leaves_every_replica_equal(case: dict, wait_avoiding: bool) -> None:
    n, length, tau = case["workers"], case["length"], case["tau"]
    rounds = tau * (1 + case["rounds"] // 3)  # the run ends on a global round
    theta0 = np.linspace(-1, 1, length).astype(np.float32)
    nodes = _wagma(n, length, case["group_size"], tau, wait_avoiding=wait_avoiding,
                   theta0=theta0)
    drive(nodes, {r: rounds for r in range(n)}, seed=case["seed"], length=length,
          duplicate_prob=case["duplicate_prob"])
    for node in nodes[1:]:
        np.testing.assert_allclose(node.params, nodes[0].params, rtol=1e-5, atol=1e-5)


@SLOW
@given(case=wagma_cases, wait_avoiding=st.booleans(), rounds_seed=st.integers(0, 10_000))
def test_no_worker_starts_more_than_tau_minus_1_rounds_ahead(case: dict, wait_avoiding: bool,
                                                            rounds_seed: int) -> None:
    """The staleness bound under random delivery orders, delays and unequal run lengths."""
    n, tau = case["workers"], case["tau"]
    rounds = {r: int(x) for r, x in enumerate(
        np.random.default_rng(rounds_seed).integers(0, case["rounds"] + 1, n))}
    nodes = _wagma(n, 4, case["group_size"], tau, wait_avoiding=wait_avoiding, theta0=None)
    log = drive(nodes, rounds, seed=case["seed"], length=4,
                duplicate_prob=case["duplicate_prob"])
    assert nodes[0].staleness_bound == tau - 1
    for _, started, peers in log.starts:
        for peer_next in peers.values():
            assert started - peer_next <= tau - 1


def test_wait_avoiding_group_round_does_not_wait_for_a_slow_member() -> None:
    theta0 = np.zeros(2, np.float32)
    nodes = _wagma(4, 2, 2, 10, wait_avoiding=True, theta0=theta0)
    sends = nodes[0].local_step(0, np.ones(2, np.float32))
    assert nodes[0].may_start(1)  # group round: no wait for rank 1
    assert sends[0].dests == (1,) and sends[0].message.kind == Kind.MODEL
    # rank 1 is behind; its model arrives later and counts at the next shared round
    nodes[0].receive(nodes[1].local_step(0, np.zeros(2, np.float32))[0].message)
    assert nodes[0].latest[1][0] == 0


def test_global_round_waits_for_every_peer_and_a_suspended_peer_leaves_it() -> None:
    nodes = _wagma(3, 2, 2, 1, wait_avoiding=True, theta0=None)
    nodes[0].local_step(0, None)
    assert not nodes[0].may_start(1)
    assert nodes[0].waiting_on(1) == [1, 2]
    nodes[0].receive(nodes[1].local_step(0, None)[0].message)
    assert nodes[0].waiting_on(1) == [2]
    nodes[0].suspend_peer(2)
    assert nodes[0].may_start(1)
