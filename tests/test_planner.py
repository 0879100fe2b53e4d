"""p auto, worked by hand."""

from __future__ import annotations

import math

import pytest

from akocore.planner import PlanInputs, plan

INF = math.inf


def inputs(n: int, up, down=None, **kw) -> PlanInputs:
    up = tuple(up) if isinstance(up, (list, tuple)) else (up,) * n
    down = up if down is None else (tuple(down) if isinstance(down, (list, tuple)) else (down,) * n)
    return PlanInputs(workers=n, uplink_bps=up, downlink_bps=down, **kw)


def test_seed_cnn_on_40mbps_with_4_workers_needs_p_35() -> None:
    # docs/design/seeds.md (p auto): (n-1) * 17.05 MB * 8 / (40 Mbit/s * 0.3 s) = 34.1 -> 35
    result = plan(inputs(4, 40e6, gradient_bytes=17.05e6, compute_s=0.3, utilisation=1.0))
    assert result.p_of == (35,) * 4
    assert result.binding.startswith("uplink of worker 0")
    assert result.staleness_bound_rounds == 34


def test_target_utilisation_raises_p() -> None:
    # 34.1 / 0.9 = 37.9 -> 38
    result = plan(inputs(4, 40e6, gradient_bytes=17.05e6, compute_s=0.3, utilisation=0.9,
                         staleness=2))
    assert result.p == 38
    assert result.staleness_bound_rounds == 38 - 1 + 2


def test_p_grows_with_the_cluster_to_keep_bandwidth_constant() -> None:
    ps = [plan(inputs(n, 100e6, gradient_bytes=1e6, compute_s=0.01, utilisation=1.0)).p
          for n in (2, 3, 5, 9)]
    # (n-1) * 8e6 bits / (100e6 * 0.01) = 8 (n-1)
    assert ps == [8, 16, 32, 64]


def test_heterogeneous_uplinks_per_worker_and_global() -> None:
    # 2 peers * 8e6 bits / (B * 1 s): 8 Mbit/s -> 2, 4 -> 4, 2 -> 8
    args = dict(gradient_bytes=1e6, compute_s=1.0, utilisation=1.0)
    per = plan(inputs(3, [8e6, 4e6, 2e6], down=1e9, **args), per_worker=True)
    assert per.p_of == (2, 4, 8)
    glob = plan(inputs(3, [8e6, 4e6, 2e6], down=1e9, **args))
    assert glob.p_of == (8, 8, 8)
    assert glob.binding.startswith("uplink of worker 2")


def test_a_slow_link_binds_its_two_ends() -> None:
    links = [[INF, 1e6, INF], [1e6, INF, INF], [INF, INF, INF]]
    result = plan(inputs(3, 100e6, gradient_bytes=1e6, compute_s=1.0, utilisation=1.0,
                         link_bps=tuple(map(tuple, links))), per_worker=True)
    # one 8e6-bit partition per second over 1 Mbit/s -> p = 8; worker 2: 0.16 -> 1
    assert result.p_of == (8, 8, 1)
    assert result.bound_by[0].startswith("link 0->1")
    assert result.bound_by[2].startswith("nothing")


def test_a_slow_downlink_raises_every_sender_into_it() -> None:
    # uplinks need p = ceil(3*8e6/100e6) = 1; worker 3 takes 3 * 8e6/p <= 8e6 -> p >= 3
    result = plan(inputs(4, 100e6, down=[100e6, 100e6, 100e6, 8e6], gradient_bytes=1e6,
                         compute_s=1.0, utilisation=1.0), per_worker=True)
    assert result.p_of == (3, 3, 3, 3)
    assert "incast" in result.bound_by[0]


def test_p_is_clamped_to_p_max_and_says_what_the_network_needed() -> None:
    result = plan(inputs(3, 1e6, gradient_bytes=1e6, compute_s=0.001, utilisation=1.0,
                         p_max=100))
    assert result.p == 100
    assert "needs p=16000" in result.binding


def test_p_never_exceeds_the_gradient_length() -> None:
    result = plan(inputs(3, 1e6, gradient_bytes=40, compute_s=1e-9, length=10))
    assert result.p == 10


def test_ample_bandwidth_gives_p_1() -> None:
    result = plan(inputs(8, 10e9, gradient_bytes=1e6, compute_s=1.0))
    assert result.p == 1 and result.binding.startswith("nothing")


@pytest.mark.parametrize("bad", [dict(workers=1), dict(gradient_bytes=0),
                                 dict(utilisation=0), dict(compute_s=0.0)])
def test_bad_inputs_are_refused(bad) -> None:
    args = dict(workers=3, gradient_bytes=1e6, compute_s=1.0, uplink_bps=(1e6,) * 3,
                downlink_bps=(1e6,) * 3)
    args.update(bad)
    with pytest.raises(ValueError):
        PlanInputs(**args)
