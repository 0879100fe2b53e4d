"""The fluid network of akosim: exact hand-worked cases and max-min properties.

Times and rates here are worked out by hand (or by a slow reference
simulation written for clarity, not speed) and compared to 1e-12 relative
unless floating point forces a looser bound. No timing assertions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
import simpy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import akosim.network.maxmin as maxmin_module
from akosim.network.fluidnet import FluidNetwork
from akosim.network.maxmin import max_min_rates
from akosim.network.netspec import NetworkSpec

MBPS = 1e6
GBPS = 1e9
REL = 1e-12


def spec_of(
    uplink_bps: list[float],
    downlink_bps: list[float] | None = None,
    links: dict[tuple[int, int], float] | None = None,
    latency_s: float | np.ndarray = 0.0,
) -> NetworkSpec:
    n = len(uplink_bps)
    link_bps = np.full((n, n), np.inf)
    for (i, j), cap_bps in (links or {}).items():
        link_bps[i, j] = cap_bps
    return NetworkSpec(
        uplink_bps=np.array(uplink_bps, dtype=float),
        downlink_bps=np.array(downlink_bps if downlink_bps is not None else uplink_bps, float),
        link_bps=link_bps,
        latency_s=np.broadcast_to(np.asarray(latency_s, dtype=float), (n, n)).copy(),
    )


@dataclass
class Recorder:
    """Collects on_delivered calls as (time, receivers, token)."""

    env: simpy.Environment
    calls: list[tuple[float, list[int], object]] = field(default_factory=list)

    def __call__(self, dsts: np.ndarray, token: object) -> None:
        self.calls.append((self.env.now, [int(d) for d in dsts], token))


def make(spec: NetworkSpec, coalesce_rel: float = 0.0
         ) -> tuple[simpy.Environment, FluidNetwork, Recorder]:
    """Exact-time tests switch coalescing off; one test below pins what it does."""
    env = simpy.Environment()
    return env, FluidNetwork(env, spec, coalesce_rel=coalesce_rel), Recorder(env)


def send_at(env: simpy.Environment, at_s: float, action) -> None:
    def process():
        yield env.timeout(at_s)
        action()

    env.process(process())


# ------------------------------------------------------------------ single flows


def test_one_flow_is_limited_by_the_senders_uplink_and_pays_latency_once():
    spec = spec_of([8 * MBPS, GBPS], [GBPS, GBPS], latency_s=0.25)
    env, net, rec = make(spec)
    net.send(0, [1], 1_000_000, rec, token="m")
    env.run()
    assert rec.calls == [(pytest.approx(1.25, rel=REL), [1], "m")]
    assert net.rate_solves == 1
    assert net.flow_completions == 1


def test_a_link_cap_below_both_nics_sets_the_rate():
    spec = spec_of([100 * MBPS] * 2, links={(0, 1): 10 * MBPS})
    assert max_min_rates(np.array([0]), np.array([1]), spec) == pytest.approx([10 * MBPS])
    env, net, rec = make(spec)
    net.send(0, [1], 1_250_000, rec)  # 10 Mbit
    env.run()
    assert rec.calls[0][0] == pytest.approx(1.0, rel=REL)


def test_a_link_cap_above_the_nics_changes_nothing():
    spec = spec_of([10 * MBPS] * 2, links={(0, 1): 50 * MBPS})
    assert max_min_rates(np.array([0]), np.array([1]), spec) == pytest.approx([10 * MBPS])


# ------------------------------------------------------------------ sharing


def test_a_shared_downlink_is_split_equally_and_the_survivor_speeds_up():
    spec = spec_of([GBPS, GBPS, GBPS], [GBPS, GBPS, 100 * MBPS])
    rates = max_min_rates(np.array([0, 1]), np.array([2, 2]), spec)
    assert rates == pytest.approx([50 * MBPS, 50 * MBPS], rel=REL)
    env, net, rec = make(spec)
    net.send(0, [2], 1_000_000, rec, token="a")  # 8 Mbit at 50 Mbps: 0.16 s
    net.send(1, [2], 2_000_000, rec, token="b")  # 8 Mbit by 0.16 s, 8 more at 100 Mbps
    env.run()
    finish = {token: t for t, _, token in rec.calls}
    assert finish["a"] == pytest.approx(0.16, rel=REL)
    assert finish["b"] == pytest.approx(0.24, rel=REL)
    assert net.rate_solves == 2  # one for both starts, one when "a" leaves


def test_incast_gives_the_slow_sender_its_cap_and_splits_the_rest():
    # senders 1..4 -> receiver 0 (100 Mbps downlink); sender 4 has a 10 Mbps uplink
    spec = spec_of([GBPS, GBPS, GBPS, GBPS, 10 * MBPS], [100 * MBPS] + [GBPS] * 4)
    rates = max_min_rates(np.array([1, 2, 3, 4]), np.array([0, 0, 0, 0]), spec)
    assert rates == pytest.approx([30 * MBPS, 30 * MBPS, 30 * MBPS, 10 * MBPS], rel=REL)
    env, net, rec = make(spec)
    for sender in (1, 2, 3, 4):
        net.send(sender, [0], 1_250_000, rec, token=sender)  # 10 Mbit each
    env.run()
    finish = {token: t for t, _, token in rec.calls}
    for sender in (1, 2, 3):
        assert finish[sender] == pytest.approx(1 / 3, rel=REL)
    assert finish[4] == pytest.approx(1.0, rel=REL)  # still held by its own uplink


def test_outcast_gives_the_slow_receiver_its_cap_and_splits_the_rest():
    # sender 0 (100 Mbps uplink) -> receivers 1..4; receiver 4 has a 10 Mbps downlink
    spec = spec_of([100 * MBPS] + [GBPS] * 4, [GBPS] * 4 + [10 * MBPS])
    rates = max_min_rates(np.array([0, 0, 0, 0]), np.array([1, 2, 3, 4]), spec)
    assert rates == pytest.approx([30 * MBPS, 30 * MBPS, 30 * MBPS, 10 * MBPS], rel=REL)
    env, net, rec = make(spec)
    net.send(0, [1, 2, 3, 4], 1_250_000, rec, token="batch")
    env.run()
    # one batch: the three fast receivers arrive together in one callback
    assert [(dsts, token) for _, dsts, token in rec.calls] == [([1, 2, 3], "batch"), ([4], "batch")]
    assert rec.calls[0][0] == pytest.approx(1 / 3, rel=REL)
    assert rec.calls[1][0] == pytest.approx(1.0, rel=REL)


def test_progressive_filling_with_two_levels():
    # flows a: 0->2, b: 1->2, c: 1->3. Downlink 2 (10 Mbps) is the first
    # bottleneck (5 each for a and b); uplink 1 (15 Mbps) then has 10 left for c.
    spec = spec_of([GBPS, 15 * MBPS, GBPS, GBPS], [GBPS, GBPS, 10 * MBPS, GBPS])
    rates = max_min_rates(np.array([0, 1, 1]), np.array([2, 2, 3]), spec)
    assert rates == pytest.approx([5 * MBPS, 5 * MBPS, 10 * MBPS], rel=REL)


def test_progressive_filling_with_three_levels_through_a_link_cap():
    # a: 0->1, b: 0->2, c: 3->2, d: 4->2; uplink 0 at 10 Mbps, downlink 2 at
    # 8 Mbps, link (3,2) at 1 Mbps. Level 1: c = 1 (its link). Level 2:
    # downlink 2 has 7 left for b and d, 3.5 each (below uplink 0's 5).
    # Level 3: a takes what uplink 0 has left, 10 - 3.5 = 6.5.
    spec = spec_of(
        [10 * MBPS, GBPS, GBPS, GBPS, GBPS],
        [GBPS, GBPS, 8 * MBPS, GBPS, GBPS],
        links={(3, 2): 1 * MBPS},
    )
    rates = max_min_rates(np.array([0, 0, 3, 4]), np.array([1, 2, 2, 2]), spec)
    assert rates == pytest.approx([6.5 * MBPS, 3.5 * MBPS, 1 * MBPS, 3.5 * MBPS], rel=REL)


# ------------------------------------------------------------------ rounds


@pytest.mark.parametrize("n", [2, 5, 8])
@pytest.mark.parametrize("latency_s", [0.0, 0.003])
def test_a_symmetric_all_to_all_round_matches_the_closed_form_in_one_solve(n, latency_s):
    size_bytes = 123_456
    bandwidth_bps = 40 * MBPS
    env, net, rec = make(NetworkSpec.uniform(n, bandwidth_bps, latency_s))
    for i in range(n):
        net.send(i, [j for j in range(n) if j != i], size_bytes, rec, token=i)
    env.run()
    expected_s = (n - 1) * size_bytes * 8 / bandwidth_bps + latency_s
    assert len(rec.calls) == n  # one coalesced callback per batch
    for t, dsts, token in rec.calls:
        assert t == pytest.approx(expected_s, rel=1e-9)
        assert sorted(dsts) == [j for j in range(n) if j != token]
    assert net.rate_solves == 1
    assert net.flow_completions == n * (n - 1)


def test_sends_made_at_one_instant_by_several_processes_share_one_solve():
    n = 6
    env, net, rec = make(NetworkSpec.uniform(n, 10 * MBPS))

    def worker(i: int):
        yield env.timeout(1.0)  # every worker finishes computing at t = 1
        net.send(i, [j for j in range(n) if j != i], 10_000, rec, token=i)

    for i in range(n):
        env.process(worker(i))
    env.run()
    assert net.rate_solves == 1
    assert [t for t, _, _ in rec.calls] == [pytest.approx(1.0 + 5 * 80_000 / (10 * MBPS))] * n


# ------------------------------------------------------------------ latency


def test_latency_is_paid_once_after_the_transfer():
    env, net, rec = make(NetworkSpec.uniform(2, 8 * MBPS, latency_s=0.1))
    net.send(0, [1], 1_000_000, rec, token="big")
    env.run()
    assert rec.calls[0][0] == pytest.approx(1.1, rel=REL)


def test_zero_byte_messages_arrive_after_the_latency_and_use_no_bandwidth():
    env, net, rec = make(NetworkSpec.uniform(3, 8 * MBPS, latency_s=0.1))
    net.send(0, [1, 2], 0, rec, token="empty")
    net.send(1, [0, 2], np.array([0, 1_000_000]), rec, token="mixed")
    env.run()
    got = sorted((t, token, dsts) for t, dsts, token in rec.calls)
    assert got == [
        (pytest.approx(0.1, rel=REL), "empty", [1, 2]),
        (pytest.approx(0.1, rel=REL), "mixed", [0]),
        (pytest.approx(1.1, rel=REL), "mixed", [2]),
    ]
    assert net.flow_completions == 1
    assert net.messages_delivered == 4
    assert net.bytes_received.tolist() == [0, 0, 1_000_000]


def test_per_pair_latencies_split_a_batch_into_one_callback_per_arrival_time():
    latency_s = np.array(
        [[0.0, 0.1, 0.2, 0.1], [0.1, 0.0, 0.1, 0.1], [0.1, 0.1, 0.0, 0.1], [0.1, 0.1, 0.1, 0.0]]
    )
    env, net, rec = make(spec_of([24 * MBPS] + [GBPS] * 3, latency_s=latency_s))
    net.send(0, [1, 2, 3], 1_000_000, rec, token="b")  # 8 Mbit each at 8 Mbps: 1 s
    env.run()
    assert [(dsts, token) for _, dsts, token in rec.calls] == [([1, 3], "b"), ([2], "b")]
    assert rec.calls[0][0] == pytest.approx(1.1, rel=REL)
    assert rec.calls[1][0] == pytest.approx(1.2, rel=REL)


# ------------------------------------------------------------------ dynamics


def test_a_flow_started_mid_transfer_reshares_the_uplink():
    env, net, rec = make(NetworkSpec.uniform(3, 10 * MBPS))
    net.send(0, [1], 2_500_000, rec, token="a")  # 20 Mbit: 2 s alone
    # at t = 1, a has 10 Mbit left; b (5 Mbit) shares uplink 0 at 5 Mbps each,
    # so b ends at t = 2, and a's last 5 Mbit go at 10 Mbps: t = 2.5
    send_at(env, 1.0, lambda: net.send(0, [2], 625_000, rec, token="b"))
    env.run()
    finish = {token: t for t, _, token in rec.calls}
    assert finish["b"] == pytest.approx(2.0, rel=REL)
    assert finish["a"] == pytest.approx(2.5, rel=REL)
    assert net.rate_solves == 3


def test_a_flow_started_elsewhere_does_not_disturb_independent_flows():
    env, net, rec = make(NetworkSpec.uniform(4, 8 * MBPS))
    net.send(0, [1], 1_000_000, rec, token="a")  # 1 s
    send_at(env, 0.5, lambda: net.send(2, [3], 500_000, rec, token="b"))  # 0.5 s
    env.run()
    finish = {token: t for t, _, token in rec.calls}
    assert finish["a"] == pytest.approx(1.0, rel=REL)
    assert finish["b"] == pytest.approx(1.0, rel=REL)


def test_a_completion_that_frees_no_shared_bottleneck_costs_no_solve():
    env, net, rec = make(NetworkSpec.uniform(4, 8 * MBPS))
    net.send(0, [1], 100_000, rec, token="short")
    net.send(2, [3], 1_000_000, rec, token="long")
    env.run()
    finish = {token: t for t, _, token in rec.calls}
    assert finish["short"] == pytest.approx(0.1, rel=REL)
    assert finish["long"] == pytest.approx(1.0, rel=REL)
    assert net.rate_solves == 1


def test_messages_queued_on_the_same_pair_share_its_capacity():
    env, net, rec = make(NetworkSpec.uniform(2, 8 * MBPS))
    net.send(0, [1], 1_000_000, rec, token="first")
    net.send(0, [1], 1_000_000, rec, token="second")
    env.run()
    assert [t for t, _, _ in rec.calls] == [pytest.approx(2.0, rel=REL)] * 2


# ------------------------------------------------------------------ statistics


def test_bytes_are_conserved_per_node_and_per_link():
    rng = np.random.default_rng(7)
    n = 5
    spec = spec_of(
        list(rng.uniform(5, 50, n) * MBPS),
        list(rng.uniform(5, 50, n) * MBPS),
        links={(0, 1): 2 * MBPS, (3, 4): 4 * MBPS},
        latency_s=rng.uniform(0, 0.01, (n, n)),
    )
    env, net, rec = make(spec)
    offered = np.zeros((n, n))
    for k in range(40):
        src = int(rng.integers(n))
        dsts = [j for j in range(n) if j != src and rng.random() < 0.7] or [(src + 1) % n]
        sizes = rng.integers(0, 200_000, len(dsts))
        offered[src, dsts] += sizes
        send_at(
            env,
            float(rng.uniform(0, 0.5)),
            lambda s=src, d=dsts, z=sizes, k=k: net.send(s, d, z, rec, token=k),
        )
    env.run()
    assert net.bytes_sent.sum() == pytest.approx(offered.sum(), rel=REL)
    assert net.bytes_sent == pytest.approx(offered.sum(axis=1), rel=REL)
    assert net.bytes_received == pytest.approx(offered.sum(axis=0), rel=REL)
    assert net.link_bytes == pytest.approx(offered, rel=REL)
    stats = net.stats()
    # every byte crossed its sender's uplink and its receiver's downlink
    assert stats.uplink_carried_bytes == pytest.approx(offered.sum(axis=1), rel=1e-9)
    assert stats.downlink_carried_bytes == pytest.approx(offered.sum(axis=0), rel=1e-9)
    assert stats.active_flows == 0
    assert stats.messages_delivered == sum(len(dsts) for _, dsts, _ in rec.calls)


def test_utilisation_and_busy_time_of_one_transfer():
    env, net, rec = make(NetworkSpec.uniform(2, 8 * MBPS))
    net.send(0, [1], 1_000_000, rec)  # busy for 1 s
    env.run(until=2.0)
    utilisation = net.utilisation(2.0)
    assert utilisation.uplink == pytest.approx([0.5, 0.0], rel=REL)
    assert utilisation.downlink == pytest.approx([0.0, 0.5], rel=REL)
    assert net.uplink_busy_s == pytest.approx([1.0, 0.0], rel=REL)
    assert net.downlink_busy_s == pytest.approx([0.0, 1.0], rel=REL)


def test_utilisation_counts_a_transfer_still_in_flight():
    env, net, rec = make(NetworkSpec.uniform(2, 8 * MBPS))
    net.send(0, [1], 1_000_000, rec)
    env.run(until=0.25)
    assert net.utilisation().uplink[0] == pytest.approx(1.0, rel=REL)
    assert net.stats().uplink_carried_bytes[0] == pytest.approx(250_000, rel=REL)
    assert net.bytes_sent[0] == 0  # counted when the transfer ends
    env.run()
    assert net.bytes_sent[0] == 1_000_000


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"uplink_bps": np.array([1.0, -1.0])}, r"uplink_bps\[1\] = -1.0: expected a positive"),
        ({"downlink_bps": np.array([1.0, 0.0])}, r"downlink_bps\[1\] = 0.0: expected a positive"),
        ({"downlink_bps": np.array([1.0, np.inf])}, r"downlink_bps\[1\].*finite"),
        ({"downlink_bps": np.ones(3)}, r"downlink_bps must have shape \(2,\).*got shape \(3,\)"),
        ({"link_bps": np.ones((2, 3))}, r"link_bps must have shape \(2, 2\)"),
        ({"link_bps": np.array([[1.0, 0.0], [1.0, 1.0]])}, r"link_bps\[0, 1\] = 0.0"),
        ({"latency_s": np.array([[0.0, -0.1], [0.0, 0.0]])}, r"latency_s\[0, 1\] = -0.1"),
        ({"latency_s": np.array([[0.0, np.nan], [0.0, 0.0]])}, r"latency_s\[0, 1\] is NaN"),
        ({"uplink_bps": np.ones((2, 2))}, r"uplink_bps must be a 1-D array"),
        ({"uplink_bps": "fast"}, r"uplink_bps must be a 1-D array"),
    ],
)
def test_a_bad_spec_is_refused_with_a_clear_message(change, message):
    fields = {
        "uplink_bps": np.ones(2),
        "downlink_bps": np.ones(2),
        "link_bps": np.full((2, 2), np.inf),
        "latency_s": np.zeros((2, 2)),
    }
    fields.update(change)
    with pytest.raises(ValueError, match=message):
        NetworkSpec(**fields)


def test_uniform_refuses_a_bad_node_count_and_bandwidth():
    with pytest.raises(ValueError, match="n must be a positive integer"):
        NetworkSpec.uniform(0, MBPS)
    with pytest.raises(ValueError, match="uplink_bps"):
        NetworkSpec.uniform(3, -MBPS)


def test_the_spec_is_a_read_only_copy():
    uplink = np.ones(2)
    spec = NetworkSpec(uplink, np.ones(2), np.full((2, 2), np.inf), np.zeros((2, 2)))
    uplink[0] = 99.0
    assert spec.uplink_bps[0] == 1.0
    with pytest.raises(ValueError):
        spec.uplink_bps[0] = 5.0


def test_bad_sends_are_refused():
    env, net, rec = make(NetworkSpec.uniform(3, MBPS))
    with pytest.raises(ValueError, match="cannot send to itself"):
        net.send(1, [0, 1], 10, rec)
    with pytest.raises(ValueError, match="contains node 3; nodes are 0..2"):
        net.send(0, [3], 10, rec)
    with pytest.raises(ValueError, match="src 5 is not a node"):
        net.send(5, [0], 10, rec)
    with pytest.raises(ValueError, match="size_bytes must be >= 0"):
        net.send(0, [1], -1, rec)
    with pytest.raises(ValueError, match="2 entries for 1 destinations"):
        net.send(0, [1], np.array([1, 2]), rec)
    with pytest.raises(ValueError, match="to itself"):
        max_min_rates(np.array([2]), np.array([2]), net.spec)


# ------------------------------------------------------------------ properties


Resource = tuple[str, int, int]  # ("up", i, -1), ("down", j, -1) or ("link", i, j)


def finite_resources(
    spec: NetworkSpec, src: list[int], dst: list[int]
) -> dict[Resource, tuple[float, list[int]]]:
    """Every resource with a finite capacity: (capacity in bits/s, flows crossing it)."""
    resources: dict[Resource, tuple[float, list[int]]] = {}
    for f, (s, d) in enumerate(zip(src, dst, strict=True)):
        path: list[tuple[Resource, float]] = [
            (("up", s, -1), float(spec.uplink_bps[s])),
            (("down", d, -1), float(spec.downlink_bps[d])),
        ]
        if np.isfinite(spec.link_bps[s, d]):
            path.append((("link", s, d), float(spec.link_bps[s, d])))
        for resource, cap_bps in path:
            resources.setdefault(resource, (cap_bps, []))[1].append(f)
    return resources


def reference_rates(src: list[int], dst: list[int], spec: NetworkSpec) -> list[float]:
    """Textbook sequential progressive filling over every finite resource."""
    resources = finite_resources(spec, src, dst)
    leftover = {resource: cap_bps for resource, (cap_bps, _) in resources.items()}
    rates: list[float | None] = [None] * len(src)
    while any(rate is None for rate in rates):
        users = {
            resource: [f for f in flows if rates[f] is None]
            for resource, (_, flows) in resources.items()
        }
        share = {r: leftover[r] / len(fs) for r, fs in users.items() if fs}
        level = min(share.values())
        for r, level_r in share.items():
            if level_r <= level * (1 + 1e-12):
                for f in users[r]:
                    if rates[f] is None:
                        rates[f] = level
                        for resource, (_, flows) in resources.items():
                            if f in flows:
                                leftover[resource] -= level
    return [float(rate) for rate in rates if rate is not None]


CAPACITIES = st.sampled_from([1.0, 2.0, 3.0, 5.0, 8.0, 10.0, 7.5])


@st.composite
def flow_sets(draw):
    n = draw(st.integers(2, 5))
    uplink = [draw(CAPACITIES) * MBPS for _ in range(n)]
    downlink = [draw(CAPACITIES) * MBPS for _ in range(n)]
    links = {}
    for i in range(n):
        for j in range(n):
            if i != j and draw(st.booleans()) and draw(st.booleans()):
                links[(i, j)] = draw(CAPACITIES) * MBPS
    spec = spec_of(uplink, downlink, links)
    pairs = st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)).filter(lambda p: p[0] != p[1])
    flows = draw(st.lists(pairs, min_size=1, max_size=14))
    return spec, [s for s, _ in flows], [d for _, d in flows]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(flow_sets())
def test_rates_are_feasible_and_max_min_fair(case):
    spec, src, dst = case
    rates = max_min_rates(np.array(src), np.array(dst), spec)
    assert (rates > 0).all()
    resources = finite_resources(spec, src, dst)
    for cap, flows in resources.values():
        assert rates[flows].sum() <= cap * (1 + 1e-9)
    # every flow has a saturated resource where no other flow gets more
    for f in range(len(src)):
        assert any(
            f in flows
            and rates[flows].sum() >= cap * (1 - 1e-9)
            and rates[f] >= rates[flows].max() * (1 - 1e-9)
            for cap, flows in resources.values()
        ), f"flow {f} ({src[f]}->{dst[f]}) has no bottleneck"
    assert rates == pytest.approx(reference_rates(src, dst, spec), rel=1e-9)


@settings(max_examples=60, deadline=None)
@given(flow_sets())
def test_compacted_pair_indexing_gives_the_same_rates(case):
    spec, src, dst = case
    dense = max_min_rates(np.array(src), np.array(dst), spec)
    saved = maxmin_module._DENSE_PAIRS_MAX
    maxmin_module._DENSE_PAIRS_MAX = 0
    try:
        compact = max_min_rates(np.array(src), np.array(dst), spec)
    finally:
        maxmin_module._DENSE_PAIRS_MAX = saved
    assert compact == pytest.approx(dense, rel=1e-12)


def reference_finish_times(
    spec: NetworkSpec, starts: list[tuple[float, int, int, float]]
) -> list[float]:
    """Arrival time of every (start_s, src, dst, size_bytes) message, by re-solving
    the rates from scratch at every start and every completion."""
    finish: list[float | None] = [None] * len(starts)
    remaining = [size * 8.0 for _, _, _, size in starts]
    now = 0.0
    active: list[int] = []
    upcoming = sorted(range(len(starts)), key=lambda k: starts[k][0])
    while upcoming or active:
        while upcoming and starts[upcoming[0]][0] <= now:
            active.append(upcoming.pop(0))
        rates = (
            reference_rates([starts[k][1] for k in active], [starts[k][2] for k in active], spec)
            if active
            else []
        )
        dt_done = min(
            (remaining[k] / r for k, r in zip(active, rates, strict=True)), default=np.inf
        )
        dt_start = starts[upcoming[0]][0] - now if upcoming else np.inf
        dt = min(dt_done, dt_start)
        for k, r in zip(active, rates, strict=True):
            remaining[k] -= r * dt
        now += dt
        for k, r in zip(list(active), rates, strict=True):
            if remaining[k] <= r * 1e-9 * max(now, 1.0):
                finish[k] = now + float(spec.latency_s[starts[k][1], starts[k][2]])
                active.remove(k)
    return [float(t) for t in finish if t is not None]


@st.composite
def timed_sends(draw):
    spec, src, dst = draw(flow_sets())
    n = spec.n
    latency_s = np.array(
        draw(st.lists(st.sampled_from([0.0, 0.01, 0.5]), min_size=n * n, max_size=n * n))
    ).reshape(n, n)
    spec = NetworkSpec(spec.uplink_bps, spec.downlink_bps, spec.link_bps, latency_s)
    starts = [
        (
            draw(st.sampled_from([0.0, 0.0, 0.1, 0.5, 1.3])),
            s,
            d,
            float(draw(st.sampled_from([0, 1, 50_000, 125_000, 400_000]))),
        )
        for s, d in zip(src, dst, strict=True)
    ]
    return spec, starts


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(timed_sends())
def test_arrival_times_match_a_from_scratch_reference(case):
    spec, starts = case
    env = simpy.Environment()
    net = FluidNetwork(env, spec, coalesce_rel=0.0)
    arrived: dict[object, float] = {}

    def on_delivered(dsts: np.ndarray, token: object) -> None:
        assert len(dsts) == 1
        assert token not in arrived, "delivered twice"
        arrived[token] = env.now

    for k, (at_s, s, d, size) in enumerate(starts):
        send_at(env, at_s, lambda k=k, s=s, d=d, size=size: net.send(s, [d], size, on_delivered, k))
    env.run()
    expected = reference_finish_times(spec, starts)
    assert [arrived[k] for k in range(len(starts))] == pytest.approx(expected, rel=1e-7, abs=1e-9)
    assert net.active_flows == 0
    assert net.bytes_received.sum() == pytest.approx(sum(s[3] for s in starts), rel=1e-12)


def test_messages_within_coalesce_rel_of_their_duration_finish_together():
    """Partitions one element apart (4 bytes in 400 kB) complete in one event, early
    by at most COALESCE_REL of their own duration; far-apart ones do not."""
    spec = NetworkSpec.uniform(3, 8e6)
    env, net, rec = make(spec, coalesce_rel=1e-4)
    net.send(0, [1], 400_004, rec, "a")
    net.send(2, [1], 400_000, rec, "b")
    net.send(1, [0], 200_000, rec, "c")
    env.run()
    times = {token: t for t, _, token in rec.calls}
    assert times["a"] == times["b"]
    assert times["a"] == pytest.approx(0.8, rel=1e-4)  # two flows share 8 Mbit/s downlink 1
    assert times["c"] == pytest.approx(0.2, rel=1e-12)
    assert net.rate_solves == 1
