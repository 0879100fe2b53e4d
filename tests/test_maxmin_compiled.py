"""The compiled max-min solver (akosim.network.maxmin_compiled) gives the numpy
reference's rates (akosim.network.maxmin) bit for bit: on random networks, for a
solve from scratch and for an incremental update (both of its first guesses,
its fallback filling and its refusal), and over whole fluid runs.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from akosim.network import maxmin_compiled
from akosim.network.fluid import FluidFlows
from akosim.network.maxmin import ResourceIndex, max_min_fill, max_min_update
from tests.engine_exactness_cases import CASES, run_case
from tests.test_maxmin_update import drive, random_spec


def random_flows(rng: np.random.Generator, n: int, count: int):
    spec = random_spec(rng, n)
    resources = ResourceIndex(spec, scan_pairs=False)
    src = rng.integers(0, n, count).astype(np.intp)
    dst = ((src + rng.integers(1, n, count)) % n).astype(np.intp)
    return resources.columns(src, dst, resources.pair_keys(src, dst))


def compiled_args(columns, flow_cap_bps):
    count = columns[0].shape[0]
    if flow_cap_bps is None:
        return np.stack(columns), np.full(count, np.inf), False
    return np.stack(columns), flow_cap_bps, True


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(2, 12), per_node=st.integers(1, 30))
def test_the_compiled_filling_gives_the_reference_rates_to_the_bit(seed, n, per_node):
    rng = np.random.default_rng(seed)
    columns, capacity_bps, flow_cap_bps = random_flows(rng, n, n * per_node)
    want_bps, want_saturated = max_min_fill(columns, capacity_bps, flow_cap_bps)
    stacked, caps_bps, has_cap = compiled_args(columns, flow_cap_bps)
    got_bps, got_saturated = maxmin_compiled.fill(stacked, capacity_bps, caps_bps, has_cap)
    assert got_bps.tobytes() == want_bps.tobytes()
    assert (got_saturated == want_saturated).all()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(2, 12), per_node=st.integers(1, 40),
       ending=st.floats(0.0, 0.9), max_free_share=st.floats(0.1, 1.0))
def test_the_compiled_update_gives_the_reference_rates_to_the_bit(
        seed, n, per_node, ending, max_free_share):
    # Rates of a solved allocation, some flows ended (their saturated NICs seeded)
    # and new ones started: both first guesses (few and many free flows), the
    # fallback filling and the refusal past max_free all occur.
    rng = np.random.default_rng(seed)
    columns, capacity_bps, flow_cap_bps = random_flows(rng, n, n * per_node)
    rate_bps, saturated = max_min_fill(columns, capacity_bps, flow_cap_bps)
    count = columns[0].shape[0]
    keep = rng.random(count) >= ending
    seed_mask = np.zeros(capacity_bps.shape[0], dtype=bool)
    for column in columns:
        seed_mask[column[~keep]] |= saturated[column[~keep]]
    fresh = rng.random(count) < 0.1
    for column in columns:
        seed_mask[column[fresh & keep]] = True
    kept = [column[keep] for column in columns]
    kept_cap_bps = None if flow_cap_bps is None else flow_cap_bps[keep]
    old_bps = np.where(fresh, 0.0, rate_bps)[keep]
    if kept[0].shape[0] == 0:
        return
    max_free = max(1, int(max_free_share * kept[0].shape[0]))
    want = max_min_update(kept, capacity_bps, kept_cap_bps, old_bps, seed_mask, max_free)
    stacked, caps_bps, has_cap = compiled_args(kept, kept_cap_bps)
    proved, got_bps, got_saturated, _ = maxmin_compiled.update(
        stacked, capacity_bps, caps_bps, has_cap, old_bps, seed_mask, max_free)
    assert proved == (want is not None)
    if want is not None:
        assert got_bps.tobytes() == want[0].tobytes()
        assert (got_saturated == want[1]).all()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(3, 40))
def test_a_fluid_run_with_the_compiled_solver_is_the_reference_run_to_the_bit(seed, n):
    rng = np.random.default_rng(seed)
    spec = random_spec(rng, n)
    sends = []
    for _ in range(int(rng.integers(1, 3 * n))):
        src = int(rng.integers(0, n))
        dsts = sorted({int(d) for d in (src + rng.integers(1, n, int(rng.integers(1, n)))) % n})
        sends.append((float(rng.choice([0.0, rng.uniform(0, 2)])), src, dsts,
                      float(rng.uniform(1e4, 1e6))))
    compiled = FluidFlows(spec, compiled=True)
    reference = FluidFlows(spec, compiled=False)
    ended = drive(compiled, sends)
    assert ended == drive(reference, sends)
    assert compiled.local_solves == reference.local_solves
    # and what each NIC carried and how long it was busy, to the bit
    end_s = ended[-1][0] + 1.0 if ended else 1.0
    assert compiled.nic_busy_s(end_s).tobytes() == reference.nic_busy_s(end_s).tobytes()
    assert (compiled.nic_carried_bits(end_s).tobytes()
            == reference.nic_carried_bits(end_s).tobytes())


def test_the_fluid_model_switches_to_the_compiled_solver_once_it_pays(monkeypatch):
    import akosim.network.fluid as fluid

    monkeypatch.setattr(fluid, "_COMPILE_AFTER_FLOWS", 200)
    rng = np.random.default_rng(5)
    spec = random_spec(rng, 12)
    sends = [(0.1 * t, i, [j for j in range(12) if j != i], 2e5 + 1e3 * i)
             for t in range(4) for i in range(12)]
    auto = FluidFlows(spec)
    reference = FluidFlows(spec, compiled=False)
    assert drive(auto, sends) == drive(reference, sends)
    assert auto._kernel is not None and reference._kernel is None
    assert FluidFlows(spec)._kernel is None  # a run starts on the numpy reference


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_recorded_engine_case_gives_the_same_round_ends_compiled(name, monkeypatch):
    # The engine's recorded cases (tests/engine_exactness_cases.py) with the compiled
    # solver and bookkeeping from the first solve: the numpy run's round ends, to the bit.
    import akosim.network.fluid as fluid

    reference = run_case(name)
    monkeypatch.setattr(fluid, "_COMPILE_AFTER_FLOWS", 0)
    assert run_case(name) == reference


def test_warming_the_compiled_kernels_runs_each_of_them():
    # The benchmark warms the kernels before timing: every kernel a run calls is then
    # compiled (or loaded), the incremental update and the filling included.
    from akosim.network import fluid_compiled
    from akosim.network.fluid import warm_compiled

    for solves, local_solves in warm_compiled():  # without and with per-pair caps
        assert 0 < local_solves < solves
    assert fluid_compiled.retire_due.signatures and fluid_compiled.solve.signatures


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(6, 14))
def test_queued_messages_on_capped_pairs_run_compiled_as_in_the_reference(seed, n):
    # Heterogeneous NICs and per-pair caps, every node sending to all, then again to
    # a few peers while the first messages are in flight: pairs crossed by two flows
    # (the third resource column), incremental solves (over 32 flows, few new ones)
    # and full ones. The compiled wake-up gives the reference's ends to the bit.
    rng = np.random.default_rng(seed)
    spec = random_spec(rng, n)
    sends = [(0.0, i, [j for j in range(n) if j != i], float(rng.uniform(1e5, 1e6)))
             for i in range(n)]
    for _ in range(2 * n):
        src = int(rng.integers(0, n))
        dsts = sorted({int(d) for d in (src + rng.integers(1, n, 2)) % n})
        sends.append((float(rng.uniform(0.0, 0.5)), src, dsts, float(rng.uniform(1e4, 5e5))))
    compiled = FluidFlows(spec, compiled=True)
    reference = FluidFlows(spec, compiled=False)
    ended = drive(compiled, sends)
    assert ended == drive(reference, sends)
    assert len(ended) == sum(len(send[2]) for send in sends)
    assert compiled.rate_solves == reference.rate_solves
    assert compiled.local_solves == reference.local_solves
    end_s = ended[-1][0] + 1.0
    assert compiled.nic_busy_s(end_s).tobytes() == reference.nic_busy_s(end_s).tobytes()
    assert (compiled.nic_carried_bits(end_s).tobytes()
            == reference.nic_carried_bits(end_s).tobytes())
