"""The closed-form baselines give the simulation's answer where both run.

Every case runs `scenario.simulate` at exact precision (coalesce_rel=0) and
`closed_form.closed_form_run` side by side: ring all-reduce with even chunks
and uneven chunks (the max-plus recursion; a worker's overlapping sends queue
on its link), the synchronous parameter server with every
candidate server count, with and without per-pair caps, latency and a
per-round overhead. Heterogeneous clusters, jitter, traces and async ps are
left to the simulation.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from akocore.settings.schema import (
    ClusterConfig,
    ExchangeConfig,
    NetworkConfig,
    RunConfig,
    TrainConfig,
)
from akosim.planning.compare import ps_server_candidates, run_variant
from akosim.planning.compute import ComputeModel
from akosim.sim import closed_form
from akosim.sim.closed_form import closed_form_run
from akosim.sim.engine import StopRule
from akosim.sim.scenario import Setup, Variant, simulate

FIGURES = ("round_time_s", "samples_per_s", "nic_utilisation", "max_uplink_utilisation",
           "max_downlink_utilisation", "wait_s_per_round", "compute_s_per_round",
           "simulated_s", "training_workers")


def _setup(n: int, length: int, *, latency: str = "0s", cap: str | None = None,
           bandwidth: str = "40mbps", rounds: int = 6, overhead_s: float = 0.0,
           compute: ComputeModel | None = None, coalesce: float = 0.0,
           ps_mode: str = "sync") -> Setup:
    network = NetworkConfig(bandwidth_bps=bandwidth, latency_s=latency,
                            link_bandwidth_bps=cap or ())
    config = RunConfig(cluster=ClusterConfig(workers=n), network=network,
                       exchange=ExchangeConfig(ps_mode=ps_mode),
                       train=TrainConfig(batch_size=32, rounds=rounds))
    model = compute or ComputeModel(0.01, overhead_s=overhead_s)
    return Setup(config, length, model, 32, StopRule(rounds=rounds), coalesce_rel=coalesce)


def _variants(n: int) -> list[Variant]:
    return [Variant("allreduce", label="ring allreduce")] + [
        Variant("ps", ps_servers=k, label=f"ps {k}") for k in ps_server_candidates(n)]


def _busy(text: str) -> tuple[str, str]:
    """("uplink", "95% busy") from "uplink of node 0 (40 Mbit/s), 95% busy"."""
    return text.split(" ")[0], text.rsplit(", ", 1)[-1]


CASES = [
    dict(n=2, length=1000),
    dict(n=3, length=999, latency="5ms"),
    dict(n=3, length=1000),  # uneven chunks, no latency: a worker's sends overlap
    dict(n=5, length=1003, cap="30mbps"),
    dict(n=8, length=4000, latency="1ms", overhead_s=0.002),
    dict(n=8, length=4003, latency="0s", bandwidth="1gbps", rounds=3),
    dict(n=6, length=6000, cap="30mbps", latency="2ms", rounds=10),
]


@pytest.mark.parametrize("case", CASES, ids=lambda case: "-".join(map(str, case.values())))
def test_closed_form_equals_the_simulation(case: dict) -> None:
    setup = _setup(**case)
    for variant in _variants(case["n"]):
        exact = closed_form_run(setup, variant)
        assert exact is not None, variant.label
        simulated = simulate(setup, variant)
        for name in FIGURES:
            assert getattr(exact, name) == pytest.approx(getattr(simulated, name), rel=1e-9), \
                (variant.label, name)
        assert _busy(exact.bottleneck) == _busy(simulated.bottleneck), variant.label
        assert exact.staleness_bound_rounds == simulated.staleness_bound_rounds == 0
        # the simulation's timeline counter may miss part of the last round's forwarded
        # chunks; within that, the same bytes per round
        rounds = case.get("rounds", 6)
        ratio = simulated.bytes_sent_per_worker_per_round / exact.bytes_sent_per_worker_per_round
        assert (rounds - 1) / rounds - 1e-12 <= ratio <= 1 + 1e-12, variant.label
        for mine, theirs in zip(exact.per_worker, simulated.per_worker, strict=True):
            assert mine.round_time_s == pytest.approx(theirs.round_time_s, rel=1e-9)
            assert mine.uplink_utilisation == pytest.approx(theirs.uplink_utilisation, rel=1e-9)


def test_a_workers_overlapping_ring_sends_queue_on_its_link() -> None:
    # 3 nodes, 1000 elements: chunks 334, 333, 333; no latency. Node 0 gets its step-0
    # chunk (333 elements) before its own 334-element step 0 has left: step 1 waits.
    sizes = closed_form.ring_step_sizes(1000, 3)
    rate = np.full(3, 8e6)
    dispatch = closed_form.ring_round_ends(sizes, rate, np.zeros(3), np.full(3, 0.01), 2)
    step_s = sizes * 8 / 8e6
    # node 1's ring: steps start back to back on every link, the slowest of each step
    ring_s = sum(float(step_s[s].max()) for s in range(4))
    assert dispatch[1, 1] == pytest.approx(0.01 + ring_s + 0.01, rel=1e-12)


@pytest.mark.parametrize("setup", [
    _setup(4, 1000, bandwidth="40mbps,20mbps"),  # heterogeneous NICs
    _setup(4, 1000, cap="40,20,10mbps"),  # heterogeneous links
    _setup(4, 1000, compute=ComputeModel(0.01, stragglers=(2,), straggler_factor=3.0)),
    _setup(4, 1000, compute=ComputeModel(0.01, jitter=0.1)),
], ids=["nics", "links", "straggler", "jitter"])
def test_heterogeneous_clusters_are_simulated(setup: Setup) -> None:
    for variant in _variants(4):
        assert closed_form_run(setup, variant) is None


def test_traces_training_and_async_ps_are_simulated() -> None:
    setup = _setup(4, 1000)
    ring = Variant("allreduce", label="ring")
    assert closed_form_run(setup, ring, trace=True) is None
    assert closed_form_run(setup, ring, workload=object()) is None
    assert closed_form_run(setup, Variant("ako", (2,) * 4)) is None
    asynchronous = _setup(4, 1000, ps_mode="async")
    assert closed_form_run(asynchronous, Variant("ps", ps_servers=1)) is None


def test_run_variant_uses_the_closed_form_and_matches_default_precision() -> None:
    setup = _setup(8, 4003, coalesce=1e-4)  # the simulation's default precision
    ring = Variant("allreduce", label="ring")
    fast = run_variant(setup, ring)
    assert fast.events == {"closed_form": 1}
    simulated = simulate(setup, ring)
    assert fast.round_time_s == pytest.approx(simulated.round_time_s, rel=1e-4)
    assert math.isfinite(fast.samples_per_s) and np.isfinite(fast.nic_utilisation)
