"""Tests for akosim.sim.multicast: the simulator's one-step multicast gives exactly
what delivering to each node's own `receive` gives."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from akocore.optim import PlainSGD
from akocore.schemes import SchemeSpec, build_nodes
from akocore.ssp import DeliveryLog
from akosim.sim import multicast
from akosim.sim.multicast import MulticastDelivery


@settings(max_examples=60, deadline=None)
@given(workers=st.integers(2, 6), p=st.integers(1, 3), rounds=st.integers(1, 6),
       seed=st.integers(0, 2**31))
def test_one_step_multicast_matches_per_node_delivery(workers, p, rounds, seed):
    matches_per_node_delivery(workers, p, rounds, seed)


@settings(max_examples=60, deadline=None)
@given(workers=st.integers(2, 6), p=st.integers(1, 3), rounds=st.integers(1, 6),
       seed=st.integers(0, 2**31))
def test_the_large_cluster_path_matches_per_node_delivery(workers, p, rounds, seed):
    """The two-slice update a multicast to all other nodes takes in large clusters,
    forced on for small ones."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(multicast, "SLICED_FROM_NODES", 2)
        matches_per_node_delivery(workers, p, rounds, seed)


def matches_per_node_delivery(workers, p, rounds, seed):
    spec = SchemeSpec("ako", workers, (p,), staleness=float("inf"))
    fast_nodes = build_nodes(spec, 12, None, None)
    slow_nodes = build_nodes(spec, 12, None, None)
    fast = MulticastDelivery(fast_nodes)
    assert fast.matrix is not None
    rng = np.random.default_rng(seed)
    in_flight = []
    for rank in range(workers):
        for round_ in range(rounds):
            in_flight += fast_nodes[rank].local_step(round_, None)
            slow_nodes[rank].local_step(round_, None)
        in_flight += fast_nodes[rank].finish(rounds)
        slow_nodes[rank].finish(rounds)
    # Deliver in a shuffled order, some messages twice, each to a random split of its peers.
    order = rng.permutation(len(in_flight)).tolist()
    order += rng.choice(len(in_flight), size=len(in_flight) // 3).tolist()
    fast_duplicates = slow_duplicates = 0
    for k in order:
        send = in_flight[k]
        dests = np.array(send.dests)
        cut = int(rng.integers(0, dests.size + 1))
        for part in (dests[:cut], dests[cut:]):
            if part.size:
                fast_duplicates += fast.deliver(part, send.message)[0]
                for dest in part.tolist():
                    slow_duplicates += not slow_nodes[dest].receive(send.message).accepted
    assert fast_duplicates == slow_duplicates
    for a, b in zip(fast_nodes, slow_nodes, strict=True):
        np.testing.assert_array_equal(a.log.contiguous, b.log.contiguous)
        np.testing.assert_array_equal(a.log.has_pending, b.log.has_pending)
        assert a.log.export() == b.log.export()
        assert a.drained() and b.drained()


def test_nodes_with_parameters_take_every_message_through_receive():
    nodes = build_nodes(SchemeSpec("ako", 3, (1,)), 4, np.zeros(4, np.float32), PlainSGD(1.0))
    delivery = MulticastDelivery(nodes)
    assert delivery.matrix is None
    (send,) = nodes[0].local_step(0, np.ones(4, np.float32))
    assert delivery.deliver(np.array(send.dests), send.message) == (0, [])
    assert [node.inbox.tolist() for node in nodes[1:]] == [[1.0] * 4] * 2


def test_shared_rows_keep_the_log_and_refuse_a_wrong_shape():
    log = DeliveryLog((1, 2), lambda sender, round_: 1, size=3)
    log.record(1, 0, 0)
    log.record(2, 1, 0)  # out of order: held
    rounds, pending = np.zeros((2, 3), np.int64), np.zeros((2, 3), bool)
    log.share_rows(rounds[1], pending[1])
    assert rounds[1].tolist() == [-1, 0, -1] and pending[1].tolist() == [False, False, True]
    log.record(2, 0, 0)
    assert rounds[1].tolist() == [-1, 0, 1] and not pending[1].any()
    with pytest.raises(ValueError, match="width 3"):
        log.share_rows(np.zeros(2, np.int64), np.zeros(2, bool))
