"""Tests for akosim.network.fluid (the clock-free flow model, driven by hand with advance())
and for the SimPy adapter's behaviour at one instant (akosim.network.fluidnet)."""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from akosim.network.fluid import FluidFlows, check_send
from akosim.network.fluidnet import FluidNetwork
from akosim.network.netspec import NetworkSpec

MBPS = 1e6


def flows_on(n: int, bandwidth_bps: float, latency_s: float = 0.0,
             coalesce_rel: float = 0.0) -> FluidFlows:
    return FluidFlows(NetworkSpec.uniform(n, bandwidth_bps, latency_s), coalesce_rel)


def start(flows: FluidFlows, src: int, dsts: list[int], size_bytes: float, batch_id: int):
    src, dst, sizes = check_send(flows.spec.n, src, dsts, size_bytes)
    queued, immediate = flows.start(src, dst, sizes, batch_id)
    assert queued == bool((np.asarray(sizes) > 0).any())
    return list(immediate)


def delivered(deliveries) -> list[tuple[int, int, int, float]]:
    """(src, dst, batch, latency) of every delivered message."""
    return [(int(s), int(d), int(b), group.latency_s)
            for group in deliveries
            for s, d, b in zip(group.src, group.dst, group.batch, strict=True)]


def test_two_flows_sharing_a_downlink_get_equal_rates_and_closed_form_finish_times():
    # 8 Mbit/s everywhere: two flows into node 2 share its downlink at 4 Mbit/s each.
    flows = flows_on(3, 8 * MBPS, latency_s=0.25)
    assert start(flows, 0, [2], 1_000_000, batch_id=0) == []
    assert start(flows, 1, [2], 2_000_000, batch_id=1) == []
    assert flows.active_flows == 2
    deliveries, next_s = flows.advance(0.0)
    assert deliveries == []
    src, dst, rate_bps = flows.rates_bps()
    assert rate_bps.tolist() == [4 * MBPS, 4 * MBPS]
    # 1 MB at 0.5 MB/s ends at 2 s.
    assert next_s == pytest.approx(2.0, rel=1e-12)
    assert flows.rate_solves == 1


def test_a_flow_ending_frees_its_share_for_the_other():
    flows = flows_on(3, 8 * MBPS, latency_s=0.25)
    start(flows, 0, [2], 1_000_000, batch_id=0)
    start(flows, 1, [2], 2_000_000, batch_id=1)
    _, first_s = flows.advance(0.0)
    deliveries, next_s = flows.advance(first_s)
    assert delivered(deliveries) == [(0, 2, 0, 0.25)]  # arrives 0.25 s after it ended
    _, _, rate_bps = flows.rates_bps()
    assert rate_bps.tolist() == [8 * MBPS]  # the survivor takes the whole downlink
    # The second flow sent 1 MB in the first 2 s; the last 1 MB takes 1 s at 1 MB/s.
    assert next_s == pytest.approx(3.0, rel=1e-12)
    deliveries, next_s = flows.advance(next_s)
    assert delivered(deliveries) == [(1, 2, 1, 0.25)]
    assert next_s == np.inf
    assert flows.active_flows == 0
    assert flows.flow_completions == 2


def test_advancing_before_the_next_event_changes_nothing():
    flows = flows_on(2, 8 * MBPS)
    start(flows, 0, [1], 1_000_000, batch_id=0)
    _, next_s = flows.advance(0.0)
    deliveries, again_s = flows.advance(next_s / 2)
    assert deliveries == [] and again_s == next_s
    assert flows.rate_solves == 1


def test_zero_byte_messages_come_back_at_once_and_use_no_bandwidth():
    flows = flows_on(3, 8 * MBPS, latency_s=0.1)
    immediate = start(flows, 0, [1, 2], 0, batch_id=7)
    assert delivered(immediate) == [(0, 1, 7, 0.1), (0, 2, 7, 0.1)]
    assert flows.active_flows == 0
    assert flows.advance(0.0) == ([], np.inf)


def test_starts_before_one_advance_join_one_rate_solve_and_finish_in_batch_order():
    flows = flows_on(4, 8 * MBPS)
    start(flows, 3, [0, 1, 2], 500_000, batch_id=0)  # uplink 3 shared three ways
    start(flows, 0, [1], 500_000, batch_id=1)  # downlink 1 shared with a flow of batch 0
    _, next_s = flows.advance(0.0)
    assert flows.rate_solves == 1
    everything = []
    while next_s < np.inf:
        deliveries, next_s = flows.advance(next_s)
        everything += delivered(deliveries)
    assert sorted(everything) == [(0, 1, 1, 0.0), (3, 0, 0, 0.0), (3, 1, 0, 0.0), (3, 2, 0, 0.0)]


def test_flows_within_coalesce_rel_of_their_duration_end_in_one_advance():
    flows = flows_on(3, 8 * MBPS, coalesce_rel=1e-4)
    start(flows, 0, [1], 1_000_004, batch_id=0)
    start(flows, 2, [1], 1_000_000, batch_id=1)
    _, next_s = flows.advance(0.0)
    deliveries, after_s = flows.advance(next_s)
    assert sorted(delivered(deliveries)) == [(0, 1, 0, 0.0), (2, 1, 1, 0.0)]
    assert after_s == np.inf


def test_check_send_names_the_bad_input():
    with pytest.raises(ValueError, match="cannot send to itself"):
        check_send(3, 1, [1], 10)
    with pytest.raises(ValueError, match="contains node 5"):
        check_send(3, 0, [1, 5], 10)
    with pytest.raises(ValueError, match="2 entries for 1 destinations"):
        check_send(3, 0, [1], [1.0, 2.0])


# ------------------------------------------------------------------ SimPy adapter


def test_sends_made_anywhere_in_one_instant_join_one_rate_solve():
    """A send at t made by a process woken by another event of t (after the network
    armed its wake-up) still joins the first send's rate solve."""
    env = simpy.Environment()
    net = FluidNetwork(env, NetworkSpec.uniform(3, 8 * MBPS), coalesce_rel=0.0)
    arrivals: dict[str, float] = {}
    go = env.event()

    def on_delivered(dsts: np.ndarray, token: object) -> None:
        arrivals[str(token)] = env.now

    def first():
        yield env.timeout(1.0)
        net.send(0, [2], 1_000_000, on_delivered, "first")
        go.succeed()

    def second():
        yield go
        yield env.timeout(0)  # later still in the same instant
        net.send(1, [2], 1_000_000, on_delivered, "second")

    env.process(first())
    env.process(second())
    env.run()
    assert net.rate_solves == 1  # both starts in one solve; they end together: no other
    assert arrivals == {"first": pytest.approx(3.0), "second": pytest.approx(3.0)}


def test_the_adapter_runs_on_a_clock_that_stops_early_and_resumes():
    env = simpy.Environment()
    net = FluidNetwork(env, NetworkSpec.uniform(2, 8 * MBPS, latency_s=0.5), coalesce_rel=0.0)
    arrivals: list[float] = []
    net.send(0, [1], 1_000_000, lambda dsts, token: arrivals.append(env.now))
    env.run(until=0.75)
    assert arrivals == [] and net.active_flows == 1
    assert net.stats().uplink_carried_bytes[0] == pytest.approx(750_000)
    env.run()
    assert arrivals == [pytest.approx(1.5)]
    assert net.bytes_received.tolist() == [0, 1_000_000]
