"""NoLoCo's invariants, driven through the randomised harness, and its runs by name.

Pairings are a function of (seed, outer step) that every worker computes alike: they
split the ranks into pairs (one triple when the count is odd), symmetric. Over random
delivery orders, delays and duplicated deliveries, every member of a group averages
the same members' values into the same means, bit for bit; with outer momentum 0,
outer learning rate 1 and pull 1 each group ends its outer step with equal replicas,
bit for bit (pairwise model averaging); with pull 0 and no momentum, two workers are
DiLoCo with a plain outer SGD. A partner lost is not awaited: the worker steps alone.
akosim and akorun run it by name.

A mutation these tests catch: the pairing seeded by (rank, outer step) instead of
(seed, outer step) (the groups are then not symmetric:
test_pairings_are_a_symmetric_function_of_seed_and_outer_step fails, and the driven
tests refuse a message from a rank that is not a partner).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from akocore.optim import PlainSGD
from akocore.schemes import SchemeSpec, build_nodes
from akocore.schemes.noloco import noloco_group, noloco_groups
from akocore.settings.normalise import ConfigError
from akocore.settings.toml_io import parse_toml_text
from akocore.workloads.flat import build_workload
from tests.scheme_harness import drive
from tests.scheme_runs import WORKLOAD, akosim_trained, launch

LR = 0.25
SLOW = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

cases = st.fixed_dictionaries({
    "workers": st.integers(2, 6),
    "length": st.integers(1, 10),
    "inner_steps": st.integers(1, 3),
    "seed": st.integers(0, 2**31),
    "duplicate_prob": st.sampled_from([0.0, 0.1, 0.3]),
})


def _theta0(length: int) -> np.ndarray:
    return np.linspace(-1, 1, length).astype(np.float32)


def _nodes(workers: int, length: int, theta0: np.ndarray | None, codec: str = "none",
           **knobs: float) -> list:
    spec = SchemeSpec("noloco", workers, codec=codec,
                      **{f"noloco_{k}": v for k, v in knobs.items()})
    return build_nodes(spec, length, theta0, PlainSGD(LR) if theta0 is not None else None)


@settings(max_examples=300, deadline=None)
@given(workers=st.integers(2, 40), seed=st.integers(0, 2**31), step=st.integers(0, 10**6))
def test_pairings_are_a_symmetric_function_of_seed_and_outer_step(workers: int, seed: int,
                                                                  step: int) -> None:
    groups = noloco_groups(workers, seed, step)
    assert groups == noloco_groups(workers, seed, step)
    assert sorted(r for g in groups for r in g) == list(range(workers))
    assert sorted(len(g) for g in groups) == [2] * (workers // 2 - workers % 2) \
        + [3] * (workers % 2)
    for rank in range(workers):
        group = noloco_group(rank, workers, seed, step)
        assert rank in group
        assert all(noloco_group(q, workers, seed, step) == group for q in group)


def test_pairings_change_with_the_outer_step_and_the_seed() -> None:
    first = noloco_groups(16, 0, 0)
    assert any(noloco_groups(16, 0, s) != first for s in range(1, 4))
    assert noloco_groups(16, 1, 0) != first


@SLOW
@given(case=cases, periods=st.integers(0, 4), codec=st.sampled_from(["none", "int8"]))
def test_every_member_of_a_group_averages_the_same_values(case: dict, periods: int,
                                                          codec: str) -> None:
    """Each outer step's log on a rank: (start, members averaged, digest of the means):
    the members are the rank's group, and every member logged the same entry (with a
    lossy codec too: each averages its own pseudo-gradient as its partners decode it)."""
    n, length, h = case["workers"], case["length"], case["inner_steps"]
    nodes = _nodes(n, length, _theta0(length), codec, inner_steps=h, seed=case["seed"] % 100)
    log = drive(nodes, {r: periods * h for r in range(n)}, seed=case["seed"], length=length,
                duplicate_prob=case["duplicate_prob"])
    for node in nodes:
        assert len(node.sync_log) == periods
        for step, (start, members, digest) in enumerate(node.sync_log):
            assert start == (step + 1) * h - 1
            assert members == noloco_group(node.rank, n, case["seed"] % 100, step)
            assert all(nodes[q].sync_log[step] == (start, members, digest) for q in members)
    assert log.duplicates_dropped == log.duplicates_sent


@SLOW
@given(case=cases, periods=st.integers(1, 4))
def test_without_momentum_and_with_full_pull_a_group_ends_equal(case: dict,
                                                                periods: int) -> None:
    """alpha = 0, beta = gamma = 1: each member's slow weights become the group's mean
    of its members' models, the same float32 values on every member."""
    n, length, h = case["workers"], case["length"], case["inner_steps"]
    nodes = _nodes(n, length, _theta0(length), inner_steps=h, outer_momentum=0.0,
                   outer_lr=1.0, pull=1.0, seed=case["seed"] % 100)
    drive(nodes, {r: periods * h for r in range(n)}, seed=case["seed"], length=length,
          duplicate_prob=case["duplicate_prob"])
    for group in noloco_groups(n, case["seed"] % 100, periods - 1):
        for q in group[1:]:
            np.testing.assert_array_equal(nodes[q].params, nodes[group[0]].params)
            np.testing.assert_array_equal(nodes[q].anchor, nodes[group[0]].anchor)


@SLOW
@given(case=cases, periods=st.integers(0, 4))
def test_two_workers_without_pull_or_momentum_are_diloco_with_plain_outer_sgd(
        case: dict, periods: int) -> None:
    """Two workers are always one group: phi <- phi - beta * mean(phi - theta_i), the
    DiLoCo outer step with a plain SGD outer optimizer (its arithmetic, in float64)."""
    length, h = case["length"], case["inner_steps"]
    nodes = _nodes(2, length, _theta0(length), inner_steps=h, outer_momentum=0.0,
                   outer_lr=0.7, pull=0.0)
    log = drive(nodes, {0: periods * h, 1: periods * h}, seed=case["seed"], length=length,
                duplicate_prob=case["duplicate_prob"])
    phi, sgd = _theta0(length), PlainSGD(LR)
    for period in range(periods):
        deltas = []
        for rank in range(2):
            theta = phi
            for grad in log.gradients[rank][period * h:(period + 1) * h]:
                theta = sgd.apply(theta, None, grad)[0]
            deltas.append((phi - theta).astype(np.float64))
        phi = (phi - 0.7 * (deltas[0] + deltas[1]) / 2).astype(np.float32)
    for node in nodes:
        np.testing.assert_allclose(node.params, phi, rtol=1e-5, atol=1e-6)


@SLOW
@given(case=cases, rounds=st.lists(st.integers(0, 7), min_size=6, max_size=6))
def test_workers_that_stop_at_different_rounds_end_without_waiting(case: dict,
                                                                   rounds: list) -> None:
    """A partner's final marker says it takes no part in later outer steps (timing-only
    too): nobody waits for it, nothing is left unfinished."""
    n, length = case["workers"], case["length"]
    for theta0 in (_theta0(length), None):
        nodes = _nodes(n, length, theta0, inner_steps=case["inner_steps"])
        drive(nodes, {r: rounds[r] for r in range(n)}, seed=case["seed"], length=length,
              duplicate_prob=case["duplicate_prob"])
        assert all(node.unfinished() is None for node in nodes)


def test_a_worker_whose_partner_is_lost_steps_alone() -> None:
    """Its partner falls silent before the outer step: once suspended, the worker does
    its outer step on its own pseudo-gradient (no pull), and goes on."""
    length, workers = 6, 4
    nodes = _nodes(workers, length, _theta0(length), inner_steps=1, outer_lr=1.0,
                   outer_momentum=0.0, pull=0.5)
    rank = 0
    partner = next(q for q in noloco_group(rank, workers, 0, 0) if q != rank)
    grad = np.ones(length, np.float32)
    sends = nodes[rank].local_step(0, grad)
    assert {s.message.part for s in sends} == {0, 1}
    assert all(s.dests == (partner,) for s in sends)
    assert nodes[rank].waiting_on(1) == [partner] and not nodes[rank].may_start(1)
    nodes[rank].suspend_peer(partner)
    assert nodes[rank].may_start(1)
    assert nodes[rank].sync_log[0][1] == (rank,)
    # alone: phi - beta * (phi - theta) = theta (beta 1), the pull term is zero
    np.testing.assert_allclose(nodes[rank].params, _theta0(length) - LR * grad, rtol=1e-6)
    assert nodes[rank].unfinished() is None


def test_bad_values_are_one_line_settings_errors(capsys) -> None:
    from akosim.cli import main

    with pytest.raises(ConfigError, match=r"exchange.noloco_pull: got 2"):
        parse_toml_text("[exchange.noloco]\nnoloco_pull = 2\n")
    with pytest.raises(SystemExit) as stop:
        main(["--scheme", "noloco", "--noloco-inner-steps", "0", "--quiet"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "noloco_inner_steps" in err


def test_akosim_plans_and_trains_noloco_by_name(capsys, tmp_path: Path) -> None:
    from akosim.cli import main

    assert main(["--scheme", "noloco", "--noloco-inner-steps", "4", "--workers", "4",
                 "--gradient-size", "400KB", "--compute", "10ms", "--rounds", "8",
                 "--quiet"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines()
               if line.startswith("noloco"))
    assert "H=4" in row
    run = akosim_trained(tmp_path / "train.json", "--scheme", "noloco", "--noloco-inner-steps", "2")
    assert run["scheme"] == "noloco" and run["label"].endswith("H=2")


@pytest.mark.timeout(150)
def test_akorun_trains_noloco_by_name(tmp_path: Path) -> None:
    """Two workers are one group: with no momentum and full pull every outer step ends
    with equal replicas, away from the start."""
    merged, params = launch(tmp_path / "run", 2, 4, "--scheme", "noloco",
                            "--noloco-inner-steps", "2", "--noloco-outer-momentum", "0",
                            "--noloco-outer-lr", "1",
                            "--set", "exchange.noloco.noloco_pull=1")
    assert merged["scheme"] == "noloco"
    assert [w["rounds"] for w in merged["per_worker"]] == [4, 4]
    np.testing.assert_array_equal(params[1], params[0])
    assert not np.array_equal(params[0], np.array(build_workload(WORKLOAD).init_params))
