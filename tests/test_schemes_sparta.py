"""SPARTA's invariants, driven through the randomised harness, and its runs by name.

Over random delivery orders, delays and duplicated deliveries: round t's index set is
a function of (seed, t) alone; after a run every replica holds the same values, bit
for bit, at its last round's indices; averaging keeps the mean of the replicas; with
a fraction of 1 SPARTA is per-step model averaging, bit for bit; a lost member is not
awaited and the survivors agree. akosim and akorun run it by name.

A mutation these tests catch: the index set seeded by (rank, round) instead of
(seed, round) (each replica then writes the mean at other indices than its peers:
test_every_replica_holds_the_same_values_at_the_last_rounds_indices fails).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from akocore.messages import Kind
from akocore.optim import PlainSGD
from akocore.schemes import SchemeSpec, build_nodes
from akocore.schemes.diloco_sync import mean_of
from akocore.schemes.sparta import SpartaSettings, sparta_count, sparta_indices
from akocore.settings.normalise import ConfigError
from akocore.settings.toml_io import parse_toml_text
from akocore.workloads.flat import build_workload
from tests.scheme_harness import drive
from tests.scheme_runs import WORKLOAD, akosim_trained, launch

LR = 0.25
SLOW = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

cases = st.fixed_dictionaries({
    "workers": st.integers(2, 5),
    "length": st.integers(1, 12),
    "fraction": st.sampled_from([0.05, 0.2, 0.5, 1.0]),
    "seed": st.integers(0, 2**31),
    "duplicate_prob": st.sampled_from([0.0, 0.1, 0.3]),
})


def _theta0(length: int) -> np.ndarray:
    return np.linspace(-1, 1, length).astype(np.float32)


def _nodes(workers: int, length: int, theta0: np.ndarray | None, fraction: float,
           seed: int = 0) -> list:
    spec = SchemeSpec("sparta", workers, sparta_fraction=fraction, sparta_seed=seed)
    return build_nodes(spec, length, theta0, PlainSGD(LR) if theta0 is not None else None)


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**31), round_=st.integers(0, 10**6),
       length=st.integers(1, 500), fraction=st.floats(1e-4, 1.0))
def test_the_index_set_is_a_function_of_seed_and_round(seed: int, round_: int, length: int,
                                                       fraction: float) -> None:
    indices = sparta_indices(seed, round_, length, fraction)
    assert np.array_equal(indices, sparta_indices(seed, round_, length, fraction))
    assert len(indices) == sparta_count(length, fraction) >= 1
    assert np.all(np.diff(indices) > 0) and 0 <= indices[0] and indices[-1] < length


def test_index_sets_change_with_the_round_and_the_seed() -> None:
    first = sparta_indices(0, 0, 10_000, 0.01)
    assert not np.array_equal(first, sparta_indices(0, 1, 10_000, 0.01))
    assert not np.array_equal(first, sparta_indices(1, 0, 10_000, 0.01))
    assert np.array_equal(sparta_indices(3, 7, 9, 1.0), np.arange(9))


@SLOW
@given(case=cases, rounds=st.integers(1, 8))
def test_every_replica_holds_the_same_values_at_the_last_rounds_indices(
        case: dict, rounds: int) -> None:
    n, length, fraction = case["workers"], case["length"], case["fraction"]
    nodes = _nodes(n, length, _theta0(length), fraction, seed=case["seed"] % 1000)
    log = drive(nodes, {r: rounds for r in range(n)}, seed=case["seed"], length=length,
                duplicate_prob=case["duplicate_prob"])
    last = sparta_indices(case["seed"] % 1000, rounds - 1, length, fraction)
    for node in nodes[1:]:
        np.testing.assert_array_equal(node.params[last], nodes[0].params[last])
    # averaging moves no mass: the mean of the replicas is that of plain local SGD
    total = sum((g.astype(np.float64) for gs in log.gradients.values() for g in gs),
                np.zeros(length))
    mean = np.mean([node.params.astype(np.float64) for node in nodes], axis=0)
    np.testing.assert_allclose(mean, _theta0(length) - LR * total / n, rtol=1e-5, atol=1e-5)
    assert all(node.averages_done == rounds for node in nodes)
    assert log.duplicates_dropped == log.duplicates_sent


@SLOW
@given(case=cases, rounds=st.integers(0, 8))
def test_a_fraction_of_one_is_per_step_model_averaging(case: dict, rounds: int) -> None:
    """Every round: each replica takes its own SGD step, then every replica holds the
    mean of the replicas (summed in rank order), bit for bit."""
    n, length = case["workers"], case["length"]
    nodes = _nodes(n, length, _theta0(length), 1.0)
    log = drive(nodes, {r: rounds for r in range(n)}, seed=case["seed"], length=length,
                duplicate_prob=case["duplicate_prob"])
    model, sgd = _theta0(length), PlainSGD(LR)
    for t in range(rounds):
        stepped = {r: sgd.apply(model, None, log.gradients[r][t])[0] for r in range(n)}
        model = mean_of(stepped, length)
    for node in nodes:
        np.testing.assert_array_equal(node.params, model)


@SLOW
@given(case=cases, rounds=st.lists(st.integers(0, 7), min_size=5, max_size=5))
def test_workers_that_stop_at_different_rounds_end_without_waiting(case: dict,
                                                                   rounds: list) -> None:
    """A peer's final marker says it takes no part in later rounds (timing-only too)."""
    n, length = case["workers"], case["length"]
    for theta0 in (_theta0(length), None):
        nodes = _nodes(n, length, theta0, case["fraction"])
        drive(nodes, {r: rounds[r] for r in range(n)}, seed=case["seed"], length=length,
              duplicate_prob=case["duplicate_prob"])
        assert all(node.unfinished() is None for node in nodes)


def test_a_lost_member_is_not_awaited_and_the_survivors_agree() -> None:
    """Rank 2 sends round 0's values to rank 0 only, then falls silent: once suspended,
    ranks 0 and 1 average round 0 between themselves (its values dropped where they
    arrived), so both hold the same mean, and they go on without it."""
    length, fraction = 8, 0.5
    nodes = _nodes(3, length, _theta0(length), fraction)
    grads = [np.full(length, r + 1, np.float32) for r in range(3)]
    sends = {r: nodes[r].local_step(0, grads[r]) for r in range(3)}
    nodes[0].receive(sends[2][0].message)  # rank 2's values reach rank 0, not rank 1
    nodes[1].receive(sends[0][0].message)
    assert nodes[0].waiting_on(1) == [1] and nodes[1].waiting_on(1) == [2]
    for rank in (0, 1):
        nodes[rank].suspend_peer(2)
    assert nodes[1].may_start(1) and not nodes[0].may_start(1)
    nodes[0].receive(sends[1][0].message)
    assert nodes[0].may_start(1)
    index = sparta_indices(0, 0, length, fraction)
    np.testing.assert_array_equal(nodes[0].params[index], nodes[1].params[index])
    expected = _theta0(length)[index] - LR * 1.5  # the mean of ranks 0 and 1 alone
    np.testing.assert_allclose(nodes[0].params[index], expected, rtol=1e-6)
    nodes[0].local_step(1, grads[0])
    assert nodes[0].waiting_on(2) == [1]  # the live peer only
    assert all(s.message.kind == Kind.MODEL for s in sends[0])


def test_a_bad_fraction_is_a_one_line_settings_error(capsys) -> None:
    from akosim.cli import main

    with pytest.raises(ConfigError, match=r"exchange.sparta_fraction: got 0"):
        parse_toml_text("[exchange.sparta]\nsparta_fraction = 0\n")
    assert parse_toml_text('[exchange]\nscheme = "sparta"\n[exchange.sparta]\n'
                           'sparta_fraction = 0.01\n').exchange.knobs(
        SpartaSettings).sparta_fraction == 0.01
    with pytest.raises(SystemExit) as stop:
        main(["--scheme", "sparta", "--sparta-fraction", "1.5", "--quiet"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "sparta_fraction" in err


def test_akosim_plans_and_trains_sparta_by_name(capsys, tmp_path: Path) -> None:
    from akosim.cli import main

    assert main(["--scheme", "sparta", "--sparta-fraction", "0.01", "--workers", "3",
                 "--gradient-size", "400KB", "--compute", "10ms", "--rounds", "6",
                 "--quiet"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines()
               if line.startswith("sparta"))
    assert "f=0.01" in row
    run = akosim_trained(tmp_path / "train.json", "--scheme", "sparta", "--sparta-fraction", "0.01")
    assert run["scheme"] == "sparta" and run["label"].endswith("f=0.01")


@pytest.mark.timeout(150)
def test_akorun_trains_sparta_by_name(tmp_path: Path) -> None:
    """With a fraction of 1 every round ends in a full average: the replicas end equal
    (and away from the start)."""
    merged, params = launch(tmp_path / "run", 2, 3, "--scheme", "sparta",
                            "--sparta-fraction", "1")
    assert merged["scheme"] == "sparta"
    assert [w["rounds"] for w in merged["per_worker"]] == [3, 3]
    np.testing.assert_array_equal(params[1], params[0])
    assert not np.array_equal(params[0], np.array(build_workload(WORKLOAD).init_params))
