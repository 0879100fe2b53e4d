"""The fast paths behind akosim's heterogeneous-network speed: each gives what the slow way gives.

* NIC accounting (akosim.network.fluid keeps carried bits and busy time as flows start
  and end) equals integrating every NIC's load between wake-ups, coalesced
  early ends included.
* The multicast gate watch (akosim.sim.multicast) counts exactly the peers an ako
  worker waits for and says when the last one arrived; it refuses to watch
  what it cannot count (known final rounds).
"""

from __future__ import annotations

import numpy as np
import pytest
import simpy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from akocore.schemes import SchemeSpec, build_nodes
from akosim.network.fluidnet import FluidNetwork
from akosim.network.netspec import NetworkSpec
from akosim.sim.multicast import MulticastDelivery

MBPS = 1e6


class IntegratingNetwork(FluidNetwork):
    """The old accounting beside the new: integrate each NIC's load at every wake-up."""

    def __init__(self, env: simpy.Environment, spec: NetworkSpec, coalesce_rel: float) -> None:
        super().__init__(env, spec, coalesce_rel=coalesce_rel)
        self.carried_bits = np.zeros(2 * spec.n)
        self.busy_s = np.zeros(2 * spec.n)
        self.integrated_to_s = 0.0

    def integrate(self) -> None:
        now = float(self.env.now)
        load = np.concatenate([self._flows.uplink_load_bps, self._flows.downlink_load_bps])
        self.carried_bits += load * (now - self.integrated_to_s)
        self.busy_s += (load > 0) * (now - self.integrated_to_s)
        self.integrated_to_s = now

    def _on_wake(self, event: simpy.Event) -> None:
        self.integrate()
        super()._on_wake(event)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(2, 7),
       coalesce_rel=st.sampled_from([0.0, 1e-4, 0.05]))
def test_nic_accounting_equals_integrating_the_loads(seed, n, coalesce_rel):
    rng = np.random.default_rng(seed)
    link_bps = np.where(rng.random((n, n)) < 0.5, rng.uniform(1, 30, (n, n)) * MBPS, np.inf)
    np.fill_diagonal(link_bps, np.inf)
    spec = NetworkSpec(uplink_bps=rng.uniform(5, 50, n) * MBPS,
                       downlink_bps=rng.uniform(5, 50, n) * MBPS, link_bps=link_bps,
                       latency_s=np.zeros((n, n)))
    env = simpy.Environment()
    net = IntegratingNetwork(env, spec, coalesce_rel)

    def sender():
        for _ in range(8):
            yield env.timeout(float(rng.exponential(0.05)))
            src = int(rng.integers(n))
            others = [j for j in range(n) if j != src]
            dsts = rng.choice(others, size=int(rng.integers(1, len(others) + 1)), replace=False)
            net.send(src, dsts, rng.uniform(1e3, 3e5, dsts.size), lambda d, t: None)

    env.process(sender())
    for stop_s in (0.05, 0.2, None):  # mid-run (flows in flight) and at the end
        env.run(until=stop_s)
        net.integrate()
        stats = net.stats()
        carried = np.concatenate([stats.uplink_carried_bytes, stats.downlink_carried_bytes]) * 8
        busy = np.concatenate([stats.uplink_busy_s, stats.downlink_busy_s])
        assert carried == pytest.approx(net.carried_bits, rel=1e-9, abs=1e-6)
        assert busy == pytest.approx(net.busy_s, rel=1e-9, abs=1e-12)


def _ako(workers: int, staleness: float = 0.0):
    nodes = build_nodes(SchemeSpec("ako", workers, (1,), staleness=staleness), 8, None, None)
    return nodes, MulticastDelivery(nodes)


def test_the_gate_watch_counts_the_peers_a_worker_waits_for():
    nodes, delivery = _ako(4)
    sends = {rank: nodes[rank].local_step(0, None)[0] for rank in range(4)}
    assert not nodes[0].may_start(1)
    assert delivery.watch(0, 1)
    assert int(delivery.blocking[0]) == 3
    for sender, last in ((1, False), (2, False), (3, True)):
        _, _, in_order = delivery.deliver_tracked(np.array([0]), sends[sender].message)
        assert in_order
        assert delivery.opened(0, sends[sender].message.round) is last
    assert nodes[0].may_start(1)


def test_the_gate_watch_of_many_receivers_at_once():
    nodes, delivery = _ako(3, staleness=1.0)
    round0 = {rank: nodes[rank].local_step(0, None)[0].message for rank in range(3)}
    # round 2 with s = 1 needs round 0 of every peer
    for rank in (1, 2):
        assert delivery.watch(rank, 2)
        assert int(delivery.blocking[rank]) == 2
    both = np.array([1, 2])
    assert delivery.deliver_tracked(both, round0[0])[2]
    assert delivery.opened_many(both, 0).tolist() == []
    assert delivery.deliver_tracked(np.array([1]), round0[2])[2]
    assert delivery.opened(1, 0)
    assert delivery.deliver_tracked(np.array([2]), round0[1])[2]
    assert delivery.opened(2, 0)
    assert nodes[1].may_start(2) and nodes[2].may_start(2)


def test_the_gate_watch_refuses_what_it_cannot_count():
    nodes, delivery = _ako(3)
    assert not delivery.watch(0, 0)  # round 0 never waits
    nodes[0]._set_final(1, 0)  # a known final round changes who is in the gate
    assert not delivery.watch(0, 1)
    assert not delivery.watched[0]
