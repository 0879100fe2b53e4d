"""The reference semantics of the exchange schemes, pinned by property tests.

Every test drives real akocore scheme nodes through the randomised harness:
arbitrary message delays and reorderings, duplicated deliveries, workers
starting rounds whenever their gate allows.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from akocore.messages import Kind, Partial
from akocore.optim import PlainSGD
from akocore.schemes import (
    AkoWorker,
    Replica,
    SchemeError,
    SchemeSpec,
    ako_partition,
    build_nodes,
)
from tests.scheme_harness import drive

LR = 0.25


def expected_params(theta0: np.ndarray, gradients: dict[int, list[np.ndarray]],
                    scale: float) -> np.ndarray:
    total = np.zeros_like(theta0, dtype=np.float64)
    for grads in gradients.values():
        for g in grads:
            total += g
    return theta0 - LR * scale * total


def assert_close(actual: np.ndarray, expected: np.ndarray) -> None:
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-4)


ako_cases = st.fixed_dictionaries({
    "workers": st.integers(2, 5),
    "length": st.integers(1, 24),
    "p_seed": st.integers(0, 10_000),
    "p_max": st.integers(1, 6),
    "staleness": st.sampled_from([0, 1, 2, 5, math.inf]),
    "schedule": st.sampled_from(["staggered", "aligned"]),
    "reduce": st.sampled_from(["mean", "sum"]),
    "rounds_seed": st.integers(0, 10_000),
    "max_rounds": st.integers(0, 7),
    "seed": st.integers(0, 2**31),
    "duplicate_prob": st.sampled_from([0.0, 0.1, 0.3]),
})


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=ako_cases)
def test_ako_conserves_every_gradient_exactly_once(case: dict) -> None:
    """After a drain every replica equals theta0 - lr*scale*sum(all gradients)."""
    n, length = case["workers"], case["length"]
    prng = np.random.default_rng(case["p_seed"])
    p_of = tuple(int(x) for x in prng.integers(1, min(case["p_max"], length) + 1, n))
    rounds = {r: int(x) for r, x in enumerate(
        np.random.default_rng(case["rounds_seed"]).integers(0, case["max_rounds"] + 1, n))}
    spec = SchemeSpec("ako", n, p_of, case["staleness"], case["schedule"], case["reduce"])
    theta0 = np.linspace(-1, 1, length).astype(np.float32)
    nodes = build_nodes(spec, length, theta0, PlainSGD(LR))
    log = drive(nodes, rounds, seed=case["seed"], length=length,
                duplicate_prob=case["duplicate_prob"])
    scale = 1.0 / n if case["reduce"] == "mean" else 1.0
    want = expected_params(theta0, log.gradients, scale)
    for node in nodes:
        assert node.params is not None
        assert_close(node.params, want)
    assert log.duplicates_dropped == log.duplicates_sent


@settings(max_examples=150, deadline=None)
@given(workers=st.integers(2, 5), staleness=st.sampled_from([0, 1, 3]),
       p=st.integers(1, 4), seed=st.integers(0, 2**31), rounds=st.integers(1, 12))
def test_ssp_gate_never_lets_a_worker_run_more_than_s_rounds_ahead(
        workers: int, staleness: int, p: int, seed: int, rounds: int) -> None:
    spec = SchemeSpec("ako", workers, (p,), staleness)
    nodes = build_nodes(spec, 8, None, None)
    log = drive(nodes, {r: rounds for r in range(workers)}, seed=seed, length=8,
                duplicate_prob=0.2)
    for _, started, peer_next_rounds in log.starts:
        for peer_next in peer_next_rounds.values():
            assert started - peer_next <= staleness


def test_lockstep_means_round_t_plus_1_waits_for_every_peers_round_t() -> None:
    nodes = build_nodes(SchemeSpec("ako", 3, (2,), 0.0), 6, None, None)
    sends = nodes[0].local_step(0, None)
    assert not nodes[0].may_start(1)
    assert nodes[0].waiting_on(1) == [1, 2]
    for peer in (1, 2):
        for send in nodes[peer].local_step(0, None):
            if 0 in send.dests:
                nodes[0].receive(send.message)
    assert nodes[0].may_start(1)
    assert sends[0].dests == (1, 2)


def test_a_silent_peer_leaves_the_gate_and_rejoins() -> None:
    nodes = build_nodes(SchemeSpec("ako", 3, (1,), 0.0), 4, None, None)
    nodes[0].local_step(0, None)
    for send in nodes[1].local_step(0, None):
        nodes[0].receive(send.message)
    assert not nodes[0].may_start(1)
    nodes[0].suspend_peer(2)
    assert nodes[0].may_start(1)
    nodes[0].resume_peer(2)
    assert not nodes[0].may_start(1)


def test_staggered_schedule_sends_different_partitions_in_one_round() -> None:
    assert [ako_partition(i, 5, 4, "staggered") for i in range(4)] == [1, 2, 3, 0]
    assert [ako_partition(i, 5, 4, "aligned") for i in range(4)] == [1, 1, 1, 1]


def test_flush_sends_the_p_minus_1_partitions_still_owed_marking_the_last_final() -> None:
    node = AkoWorker(0, 2, 10, (4, 4), replica=Replica(np.zeros(10, np.float32), PlainSGD(1)))
    node.local_step(0, np.ones(10, np.float32))
    flush = node.finish(1)
    assert [s.message.part for s in flush] == [1, 2, 3]
    assert [s.message.final for s in flush] == [False, False, True]
    assert sum(s.message.length for s in flush) + 3 == 10  # partition 0 (3 elements) went out
    assert all(np.all(s.message.values == 1) for s in flush)


def test_p_equal_1_finishes_with_an_empty_final_marker() -> None:
    node = AkoWorker(1, 2, 5, (1, 1), replica=Replica(None, None))
    node.local_step(0, None)
    (marker,) = node.finish(1)
    assert marker.message.final and marker.message.length == 0


def test_duplicate_is_acknowledged_and_not_applied_twice() -> None:
    a, b = build_nodes(SchemeSpec("ako", 2, (1,)), 3, np.zeros(3, np.float32), PlainSGD(1.0))
    (send,) = a.local_step(0, np.ones(3, np.float32))
    assert b.receive(send.message).accepted
    assert not b.receive(send.message).accepted
    b.local_step(0, np.zeros(3, np.float32))
    np.testing.assert_allclose(b.params, -0.5 * np.ones(3))


@pytest.mark.parametrize("bad", [
    dict(kind=Kind.PUSH),
    dict(p=3),
    dict(offset=1),
    dict(part=5),
])
def test_malformed_messages_are_refused_and_change_nothing(bad: dict) -> None:
    a, b = build_nodes(SchemeSpec("ako", 2, (2,)), 4, np.zeros(4, np.float32), PlainSGD(1.0))
    fields = dict(kind=Kind.GRAD, sender=0, round=0, part=0, p=2, offset=0, length=2,
                  values=np.ones(2, np.float32))
    fields.update(bad)
    with pytest.raises(SchemeError):
        b.receive(Partial(**fields))
    assert b.may_start(0) and not b.log.is_duplicate(0, 0, 0)


@settings(max_examples=60, deadline=None)
@given(workers=st.integers(2, 5), servers=st.integers(1, 3), length=st.integers(3, 20),
       mode=st.sampled_from(["sync", "async"]), staleness=st.sampled_from([0, 2, math.inf]),
       push_every=st.integers(1, 3), fetch_every=st.integers(1, 3),
       rounds=st.integers(0, 6), seed=st.integers(0, 2**31))
def test_ps_servers_apply_every_push_exactly_once(workers: int, servers: int, length: int,
                                                   mode: str, staleness: float,
                                                   push_every: int, fetch_every: int,
                                                   rounds: int, seed: int) -> None:
    servers = min(servers, length)
    total = workers + servers
    spec = SchemeSpec("ps", total, (1,), staleness, ps_servers=servers, ps_mode=mode,
                      push_every=push_every, fetch_every=fetch_every)
    theta0 = np.linspace(0, 1, length).astype(np.float32)
    nodes = build_nodes(spec, length, theta0, PlainSGD(LR))
    log = drive(nodes, {w: rounds for w in range(workers)}, seed=seed, length=length)
    want = expected_params(theta0, log.gradients, 1.0 / workers)
    server_params = np.concatenate([n.params for n in nodes[workers:]])
    assert_close(server_params, want)
    if mode == "sync":  # every worker ends with the servers' parameters
        for node in nodes[:workers]:
            assert_close(node.params, want)


@settings(max_examples=60, deadline=None)
@given(workers=st.integers(2, 6), length=st.integers(6, 30), rounds=st.integers(0, 5),
       seed=st.integers(0, 2**31))
def test_allreduce_replicas_all_apply_the_mean_gradient(workers: int, length: int,
                                                         rounds: int, seed: int) -> None:
    length = max(length, workers)
    theta0 = np.ones(length, np.float32)
    nodes = build_nodes(SchemeSpec("allreduce", workers), length, theta0, PlainSGD(LR))
    log = drive(nodes, {w: rounds for w in range(workers)}, seed=seed, length=length)
    want = expected_params(theta0, log.gradients, 1.0 / workers)
    for node in nodes:
        assert_close(node.params, want)


def test_sync_ps_worker_waits_for_every_shard_before_its_next_round() -> None:
    nodes = build_nodes(SchemeSpec("ps", 4, ps_servers=2), 6, None, None)
    worker = nodes[0]
    sends = worker.local_step(0, None)
    assert [s.dests for s in sends] == [(2,), (3,)]
    assert not worker.may_start(1)
    assert worker.waiting_on(1) == [2, 3]


def test_timing_only_nodes_carry_lengths_without_values() -> None:
    nodes = build_nodes(SchemeSpec("ako", 3, (4,)), 4_263_434, None, None)
    (send,) = nodes[2].local_step(0, None)
    assert send.message.values is None
    # 4,263,434 = 4 * 1,065,858 + 2: the two extra elements go to partitions 0 and 1
    assert send.message.part == 2 and send.message.length == 1_065_858


@pytest.mark.parametrize("codec", ["none", "topk:0.3"])
@pytest.mark.parametrize("seed", range(12))
def test_a_restarted_ako_worker_rejoins_from_a_donor_and_ends_equal(seed: int,
                                                                     codec: str) -> None:
    """Kill worker 2 mid-run between two rounds (its unsent buffers are lost), keep
    the others going, restart it from a donor's snapshot: all three end equal.

    A worker killed halfway through a multicast leaves its peers holding
    different parts of its last round; no protocol without retained copies can
    repair that, so the kill lands after its sends were delivered."""
    import random

    rng, grad_rng = random.Random(seed), np.random.default_rng(seed)
    n, length, rounds, p = 3, 12, 14, 3
    theta0 = np.linspace(-1, 1, length).astype(np.float32)
    spec = SchemeSpec("ako", n, (p,), staleness=1, codec=codec)
    nodes = build_nodes(spec, length, theta0, PlainSGD(LR))
    in_flight: list[tuple[int, Partial]] = []
    delivered_to_2 = {0: -1, 1: -1}  # highest round each peer delivered to (old) worker 2
    done = [0, 0, 0]
    alive = {0, 1, 2}
    holding_2 = False

    def post(rank, effects):
        for send in effects:
            in_flight.extend((d, send.message) for d in send.dests)

    def step_random(allowed_ranks, deliver_filter=lambda d, m: True):
        choices = [("step", r) for r in allowed_ranks
                   if not nodes[r].finished and done[r] < rounds and nodes[r].may_start(done[r])]
        choices += [("finish", r) for r in allowed_ranks
                    if not nodes[r].finished and done[r] == rounds]
        choices += [("deliver", i) for i, (d, m) in enumerate(in_flight) if deliver_filter(d, m)]
        if not choices:
            return False
        kind, arg = rng.choice(choices)
        if kind == "step":
            grad = (grad_rng.integers(-8, 9, length) / 8).astype(np.float32)
            post(arg, nodes[arg].local_step(done[arg], grad))
            done[arg] += 1
        elif kind == "finish":
            post(arg, nodes[arg].finish(done[arg]))
        else:
            dest, msg = in_flight.pop(arg)
            if dest == 2 and msg.sender in delivered_to_2 and not holding_2:
                delivered_to_2[msg.sender] = max(delivered_to_2[msg.sender], msg.round)
            post(dest, nodes[dest].receive(msg).effects)
        return True

    for _ in range(rng.randint(5, 40)):
        step_random(alive)
    while any(m.sender == 2 for _, m in in_flight):
        assert step_random(set(), lambda d, m: m.sender == 2)
    # worker 2 dies: its unsent buffers are lost; messages to it stay owed
    alive.discard(2)
    holding_2 = True
    for peer in (0, 1):
        nodes[peer].suspend_peer(2)
    not_to_2 = lambda d, m: d != 2  # noqa: E731
    for _ in range(rng.randint(0, 30)):
        step_random(alive, not_to_2)
    # restart: the donor (0) waits until it holds every round peer 1 delivered to old 2
    while nodes[0].log.contiguous[1] < delivered_to_2[1]:
        assert step_random({0, 1}, lambda d, m: d == 0 and m.sender == 1)
    snapshot = nodes[0].rejoin_snapshot(2)
    first_round = 1 + max(nodes[j].log.contiguous[2] for j in (0, 1))
    first_round = max([first_round] + [r + 1 for j in (0, 1) for r in nodes[j].log._pending[2]])
    fresh = build_nodes(spec, length, theta0, PlainSGD(LR))[2]
    fresh.adopt(snapshot, first_round)
    nodes[2] = fresh
    done[2] = first_round
    for peer in (0, 1):
        nodes[peer].peer_restarted(2, first_round)
    alive.add(2)
    holding_2 = False
    while step_random(alive):
        pass
    assert all(node.drained() for node in nodes)
    for node in nodes:
        node.settle()
    np.testing.assert_allclose(nodes[1].params, nodes[0].params, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(nodes[2].params, nodes[0].params, rtol=1e-5, atol=1e-5)
