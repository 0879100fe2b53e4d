"""Ako's final flush: what every replica applies of the gradients still owed at the end.

With `flush` = average the sender sends 1/n of what it still owes and takes the
rest back from its own replica, so every replica ends at the mean of the
replicas as they stood when they finished (each with what it had received
applied). Every message still reaches every peer exactly once and every
replica ends equal; on a convex loss the final loss is never above the
replicas' mean loss before the flush (Jensen), whatever the staleness.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from akocore.optim import OptaxFlatOptimizer, PlainSGD
from akocore.schemes import AkoWorker, SchemeSpec, build_nodes
from akocore.schemes.ako import flush_weight
from akocore.settings.normalise import ConfigError
from akocore.settings.schema import ExchangeConfig
from tests.scheme_harness import drive
from tests.test_codecs import withdrawn

LR = 0.25


def spec(workers: int, p_of: tuple[int, ...], flush: str | float, **more: object) -> SchemeSpec:
    return SchemeSpec("ako", workers, p_of, options=(("flush", flush),), **more)  # type: ignore[arg-type]


def record_owed(nodes: list) -> dict[int, np.ndarray]:
    """Wrap each node's finish to record what it still owed when it finished."""
    owed: dict[int, np.ndarray] = {}
    for node in nodes:
        def finish(rounds_done: int, node=node, inner=node.finish):
            owed[node.rank] = node.unsent.copy()
            return inner(rounds_done)
        node.finish = finish
    return owed


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workers=st.integers(2, 5), length=st.integers(1, 20), p=st.integers(1, 6),
       staleness=st.sampled_from([0, 1, 3, math.inf]), flush=st.sampled_from(
           ["average", 0.375, 1.0]), reduce=st.sampled_from(["mean", "sum"]),
       rounds=st.integers(0, 9), seed=st.integers(0, 2**31),
       duplicate_prob=st.sampled_from([0.0, 0.2]),
       codec=st.sampled_from(["none", "none", "int8", "topk:0.3"]))
def test_a_weighted_flush_delivers_once_and_every_replica_ends_equal(
        workers: int, length: int, p: int, staleness: float, flush: str | float, reduce: str,
        rounds: int, seed: int, duplicate_prob: float, codec: str) -> None:
    """Every replica ends at theta0 - lr*scale*(every gradient - (1 - w) * what every
    worker still owed at its finish - what a codec's error feedback never sent);
    each duplicate is dropped."""
    p = min(p, length)
    theta0 = np.linspace(-1, 1, length).astype(np.float32)
    nodes = build_nodes(spec(workers, (p,), flush, staleness=staleness, reduce=reduce,
                             codec=codec), length, theta0, PlainSGD(LR))
    owed = record_owed(nodes)
    log = drive(nodes, dict.fromkeys(range(workers), rounds), seed=seed, length=length,
                duplicate_prob=duplicate_prob)
    weight = flush_weight(flush, workers)
    scale = 1.0 / workers if reduce == "mean" else 1.0
    total = sum((g.astype(np.float64) for grads in log.gradients.values() for g in grads),
                np.zeros(length))
    total -= (1.0 - weight) * sum(owed.values()) + withdrawn(nodes)
    want = theta0 - LR * scale * total
    for node in nodes:
        np.testing.assert_allclose(node.params, want, rtol=1e-5, atol=1e-4)
    assert log.duplicates_dropped == log.duplicates_sent


# ------------------------------------------------------------- a convex problem, lockstep

def quadratic(length: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Curvatures h and minimum x* of L(x) = 0.5 * sum h (x - x*)^2."""
    rng = np.random.default_rng(seed)
    return rng.uniform(0.2, 2.0, length), rng.normal(0.0, 1.0, length)


def loss(x: np.ndarray, h: np.ndarray, x_star: np.ndarray) -> float:
    return float(0.5 * np.sum(h * (x.astype(np.float64) - x_star) ** 2))


def lockstep(workers: int, p: int, flush: str | float, *, rounds: int, lr: float,
             seed: int) -> tuple[list[float], float, list[AkoWorker]]:
    """Lockstep Ako on a quadratic, each worker's gradient noisy and taken at its own
    replica: the replicas' losses just before the flush (what each received applied),
    the loss after it, and the nodes."""
    length = 4 * p
    h, x_star = quadratic(length, seed)
    noise = np.random.default_rng(seed + 1)
    nodes = build_nodes(spec(workers, (p,), flush), length,
                        np.zeros(length, np.float32), PlainSGD(lr))

    def deliver(sends) -> None:
        for send in sends:
            for dest in send.dests:
                assert nodes[dest].receive(send.message).accepted

    for t in range(rounds):
        sends = []
        for node in nodes:
            grad = h * (node.params - x_star) + noise.normal(0.0, 0.5, length)
            sends += node.local_step(t, grad.astype(np.float32))
        deliver(sends)
    before = []
    for node in nodes:  # each replica with what it has received applied
        scaled = node.inbox * np.float32(node.scale)
        before.append(loss(node.params - np.float32(lr) * scaled, h, x_star))
    for node in nodes:
        deliver(node.finish(rounds))
    for node in nodes:
        assert node.drained()
        node.settle()
    return before, loss(nodes[0].params, h, x_star), nodes


@settings(max_examples=60, deadline=None)
@given(workers=st.integers(2, 6), p=st.integers(2, 24), rounds=st.integers(1, 60),
       lr=st.sampled_from([0.05, 0.2, 0.5]), seed=st.integers(0, 10_000))
def test_on_a_convex_loss_the_averaging_flush_never_ends_worse_than_before_it(
        workers: int, p: int, rounds: int, lr: float, seed: int) -> None:
    before, after, nodes = lockstep(workers, p, "average", rounds=rounds, lr=lr, seed=seed)
    for node in nodes[1:]:  # each replica sums the same float32 updates in its own order
        np.testing.assert_allclose(node.params, nodes[0].params, rtol=1e-5, atol=1e-5)
    assert after <= np.mean(before) * (1 + 1e-5) + 1e-6


def test_a_stale_full_flush_ends_worse_than_before_it_and_the_average_does_not() -> None:
    """The case the averaging flush fixes: 4 workers, p = 16, 120 rounds at a step that
    staleness makes oscillate. Applied in full, the backlog (about 7 rounds of 3 peers'
    gradients at once) overshoots past every replica; the averaging flush ends at the
    replicas' mean."""
    before, full, _ = lockstep(4, 16, "full", rounds=120, lr=0.12, seed=3)
    before_avg, average, _ = lockstep(4, 16, "average", rounds=120, lr=0.12, seed=3)
    assert before == before_avg  # the same run up to the flush
    assert full > 1.2 * max(before)
    assert average <= np.mean(before)


def test_a_stateful_optimizer_flushes_in_full() -> None:
    """Momentum cannot take an applied update back exactly: what is owed goes whole."""
    import optax

    node = AkoWorker(0, 2, 8, (4, 4), replica=_replica(OptaxFlatOptimizer(optax.sgd(0.1, 0.9))),
                     flush_weight=0.5)
    node.local_step(0, np.ones(8, np.float32))
    params = node.params.copy()
    flush = node.finish(1)
    assert all(np.all(s.message.values == 1) for s in flush)
    np.testing.assert_array_equal(node.params, params)


def test_with_plain_sgd_the_sender_sends_w_of_what_it_owes_and_takes_the_rest_back() -> None:
    node = AkoWorker(0, 2, 8, (4, 4), replica=_replica(PlainSGD(1.0)), flush_weight=0.25)
    node.local_step(0, np.ones(8, np.float32))  # applied at 1/2, partition 0 sent
    flush = node.finish(1)
    assert all(np.all(s.message.values == 0.25) for s in flush)
    # partitions 0 (sent) at -1/2; 1..3 at -1/2 + (1 - 0.25) / 2
    np.testing.assert_allclose(node.params, [-0.5] * 2 + [-0.125] * 6)


def _replica(optimizer):
    from akocore.schemes import Replica

    return Replica(np.zeros(8, np.float32), optimizer)


@pytest.mark.parametrize("value, weight", [("average", 0.25), ("full", 1.0), (0.375, 0.375),
                                           ("0.5", 0.5)])
def test_the_setting_reads_average_full_or_a_fraction(value: object, weight: float) -> None:
    flush = ExchangeConfig(flush=value).flush
    assert flush_weight(flush, 4) == weight


@pytest.mark.parametrize("value", ["half", 0, 1.5, "-0.1", True])
def test_a_flush_outside_average_full_or_0_to_1_is_refused(value: object) -> None:
    with pytest.raises(ConfigError, match="exchange.flush"):
        ExchangeConfig(flush=value)


# ------------------------------------------------------------- a planned end: in step

@settings(max_examples=100, deadline=None)
@given(workers=st.integers(2, 4), staleness=st.sampled_from([1, 2, 5]), p=st.integers(1, 4),
       seed=st.integers(0, 2**31), rounds=st.integers(1, 14))
def test_over_the_last_s_rounds_of_a_planned_end_the_bound_shrinks_to_0(
        workers: int, staleness: int, p: int, seed: int, rounds: int) -> None:
    """Round t starts only while no peer is more than min(s, rounds - 1 - t) rounds
    behind: the last round waits for every peer's previous one, as in lockstep."""
    nodes = build_nodes(SchemeSpec("ako", workers, (p,), staleness), 8, None, None)
    for node in nodes:
        node.plan_rounds(rounds)
    log = drive(nodes, dict.fromkeys(range(workers), rounds), seed=seed, length=8,
                duplicate_prob=0.2)
    for _, started, peer_next_rounds in log.starts:
        for peer_next in peer_next_rounds.values():
            assert started - peer_next <= min(staleness, rounds - 1 - started)


def test_the_bound_is_s_until_the_last_s_rounds_and_inf_stays_inf() -> None:
    node = build_nodes(SchemeSpec("ako", 2, (2,), 3), 4, None, None)[0]
    assert [node.bound(t) for t in (0, 5)] == [3, 3]
    node.plan_rounds(10)
    assert [node.bound(t) for t in (5, 6, 7, 8, 9)] == [3, 3, 2, 1, 0]
    free = build_nodes(SchemeSpec("ako", 2, (2,), math.inf), 4, None, None)[0]
    free.plan_rounds(10)
    assert free.bound(9) == math.inf and free.may_start(9)
