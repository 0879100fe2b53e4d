"""Baselines on uneven clusters: the simulation equals their step-by-step closed forms.

Random heterogeneous clusters (NIC up and down speeds, per-pair caps, latencies,
per-worker compute, uneven chunks): every worker's round ends in the simulation
(akosim.sim.engine at exact precision) equal akosim.sim.closed_form.ring_round_ends (ring
all-reduce) and sync_ps_round_ends (synchronous ps, one server) to a relative
1e-9, and raising any one capacity never makes a ring round end later. (Under
max-min sharing that last property does not hold for ps or Ako: a faster receiver
can take a shared uplink from the others; docs/reference/network-models.md.)
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from akocore.resolve import scheme_spec
from akocore.schemes import build_nodes
from akocore.settings.toml_io import config_from_dict
from akosim.network.netspec import NetworkSpec
from akosim.planning.compute import ComputeModel
from akosim.sim.closed_form import (
    ring_links,
    ring_round_ends,
    ring_step_sizes,
    sync_ps_round_ends,
)
from akosim.sim.engine import Simulation, StopRule

MBPS = 1e6


def _simulate_ring(spec: NetworkSpec, length: int, compute: ComputeModel,
                   rounds: int) -> np.ndarray:
    """round_end_s[r, i] of ring all-reduce on `spec`, simulated exactly."""
    config = config_from_dict({
        "cluster": {"workers": spec.n}, "exchange": {"scheme": "allreduce", "ssp": 0},
        "train": {"workload": "synthetic-cnn", "batch_size": 32, "rounds": rounds}})
    nodes = build_nodes(scheme_spec(config, (1,)), length, None, None)
    sim = Simulation(nodes, spec, compute, StopRule(rounds=rounds, drain=False),
                     coalesce_rel=0.0)
    sim.run()
    return np.array([sim.timelines[rank].round_end_s for rank in range(spec.n)]).T


def _closed_form(spec: NetworkSpec, length: int, compute: ComputeModel,
                 rounds: int) -> np.ndarray:
    rate_bps, latency_s = ring_links(spec)
    lead_s = np.array([compute.base_s(i) + compute.overhead_of(i) for i in range(spec.n)])
    return ring_round_ends(ring_step_sizes(length, spec.n), rate_bps, latency_s, lead_s, rounds)


@st.composite
def clusters(draw: st.DrawFn) -> tuple[NetworkSpec, int, ComputeModel, int]:
    n = draw(st.integers(2, 6))
    speed = st.floats(1.0, 1000.0).map(lambda mbps: mbps * MBPS)
    up = [draw(speed) for _ in range(n)]
    down = [draw(speed) for _ in range(n)]
    caps = [[math.inf if i == j else draw(st.one_of(st.just(math.inf), speed))
             for j in range(n)] for i in range(n)]
    latency = [[0.0 if i == j else draw(st.one_of(st.just(0.0), st.floats(0.0, 0.01)))
                for j in range(n)] for i in range(n)]
    length = draw(st.integers(n, 40_000))  # uneven chunks included
    factors = tuple(draw(st.floats(0.5, 2.0)) for _ in range(n))
    compute = ComputeModel(draw(st.floats(0.0, 0.05)), speed_factors=factors,
                           overhead_s=draw(st.floats(0.0, 0.005)))
    rounds = draw(st.integers(1, 4))
    return NetworkSpec(np.array(up), np.array(down), np.array(caps), np.array(latency)), \
        length, compute, rounds


@settings(max_examples=40, deadline=None)
@given(clusters())
def test_the_simulated_ring_equals_its_closed_form(cluster) -> None:
    spec, length, compute, rounds = cluster
    got = _simulate_ring(spec, length, compute, rounds)
    want = _closed_form(spec, length, compute, rounds)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=0)


@settings(max_examples=30, deadline=None)
@given(clusters(), st.data())
def test_raising_any_capacity_never_makes_a_ring_round_end_later(cluster, data) -> None:
    spec, length, compute, rounds = cluster
    n = spec.n
    up, down = spec.uplink_bps.copy(), spec.downlink_bps.copy()
    caps = spec.link_bps.copy()
    finite_caps = [(i, j) for i in range(n) for j in range(n)
                   if i != j and math.isfinite(caps[i, j])]
    kinds = ["uplink", "downlink"] + (["cap"] * bool(finite_caps))
    kind = data.draw(st.sampled_from(kinds))
    factor = data.draw(st.floats(1.001, 10.0))
    if kind == "uplink":
        up[data.draw(st.integers(0, n - 1))] *= factor
    elif kind == "downlink":
        down[data.draw(st.integers(0, n - 1))] *= factor
    else:
        caps[data.draw(st.sampled_from(finite_caps))] *= factor
    before = _simulate_ring(spec, length, compute, rounds)
    after = _simulate_ring(NetworkSpec(up, down, caps, spec.latency_s), length, compute, rounds)
    assert (after <= before * (1 + 1e-9)).all()


def test_upgrading_half_the_nics_never_slows_the_ring() -> None:
    # 8 nodes, nodes 0-3 at 1 Gbit/s and 4-7 at 50 Mbit/s: every ring step still waits
    # for a 50 Mbit/s link, as when all are at 50 Mbit/s (the fluid model's fair share
    # of a node's piled-up steps made it 1.6x slower before the ring's stream order)
    length, rounds = 250_000, 4
    compute = ComputeModel(0.8)

    def last_round_end(speeds_mbps: list[float]) -> float:
        spec = NetworkSpec.uniform(8, 50 * MBPS)
        nics = np.array(speeds_mbps) * MBPS
        spec = NetworkSpec(nics, nics, spec.link_bps, spec.latency_s)
        return float(_simulate_ring(spec, length, compute, rounds)[-1].max())

    slow = last_round_end([50.0] * 8)
    half = last_round_end([1000.0] * 4 + [50.0] * 4)
    interleaved = last_round_end([1000.0, 50.0] * 4)
    assert half <= slow * (1 + 1e-9)
    assert interleaved <= slow * (1 + 1e-9)


def _simulate_sync_ps(spec: NetworkSpec, length: int, compute: ComputeModel,
                      rounds: int) -> np.ndarray:
    """round_end_s[r, w] of synchronous ps with one server (the last node), simulated."""
    config = config_from_dict({
        "cluster": {"workers": spec.n},
        "exchange": {"scheme": "ps", "ps_servers": 1, "ps_mode": "sync", "ssp": 0},
        "train": {"workload": "synthetic-cnn", "batch_size": 32, "rounds": rounds}})
    nodes = build_nodes(scheme_spec(config, (1,)), length, None, None)
    sim = Simulation(nodes, spec, compute, StopRule(rounds=rounds, drain=False),
                     coalesce_rel=0.0)
    sim.run()
    return np.array([sim.timelines[rank].round_end_s for rank in sorted(sim.timelines)]).T


@settings(max_examples=40, deadline=None)
@given(clusters())
def test_the_simulated_sync_ps_with_one_server_equals_its_closed_form(cluster) -> None:
    spec, length, compute, rounds = cluster
    if spec.n < 3:
        spec = NetworkSpec(np.append(spec.uplink_bps, 50 * MBPS),
                           np.append(spec.downlink_bps, 50 * MBPS),
                           np.pad(spec.link_bps, ((0, 1), (0, 1)), constant_values=math.inf),
                           np.pad(spec.latency_s, ((0, 1), (0, 1))))
    got = _simulate_sync_ps(spec, length, compute, rounds)
    lead_s = np.array([compute.base_s(i) + compute.overhead_of(i) for i in range(spec.n)])
    want = sync_ps_round_ends(spec, length, lead_s, rounds)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=0)
