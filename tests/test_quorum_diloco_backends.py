"""quorum-diloco runs by name in both backends: akosim's timing and training, akorun's
launch on loopback.

With one worker 3x slower (``--speeds 1,1,3``) the quorum (a majority: 2 of 3) lets
the two fast workers go on without the slow one, so akosim reports more samples/s
for quorum-diloco than for DiLoCo, whose every sync waits for the slow worker. On
loopback, 3 real workers end on syncs every replica applied alike: equal parameters,
also when one of them was paused while the others went on at the quorum.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.scheme_runs import launch

SLOW_THIRD = ["--workers", "3", "--speeds", "1,1,3", "--gradient-size", "40KB",
              "--compute", "10ms", "--rounds", "40", "--inner-steps", "5", "--quiet"]


def _samples_per_s(out: str, scheme: str) -> float:
    row = next(line for line in out.splitlines() if line.startswith(f"{scheme} H="))
    return float(next(cell for cell in row.split("  ") if cell.strip().replace(",", "")
                      .replace(".", "").isdigit() and "." in cell).replace(",", ""))


def test_akosim_with_one_worker_3x_slower_gives_quorum_diloco_more_samples_per_s(
        capsys) -> None:
    from akosim.cli import main

    rates = {}
    for scheme in ("diloco", "quorum-diloco"):
        assert main(["--scheme", scheme, *SLOW_THIRD]) == 0
        out = capsys.readouterr().out
        rates[scheme] = _samples_per_s(out, scheme)
        if scheme == "quorum-diloco":
            assert "quorum-diloco H=5 q=majority g=0" in out
    assert rates["quorum-diloco"] > rates["diloco"], rates


def test_akosim_trains_quorum_diloco_by_name(capsys) -> None:
    from akosim.cli import main

    assert main(["train", "--scheme", "quorum-diloco", "--workers", "3", "--inner-steps", "5",
                 "--quorum-min", "2", "--quorum-grace-steps", "1", "--rounds", "20",
                 "--compute", "10ms", "--quiet"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("quorum-diloco"))
    assert "H=5 q=2 g=1" in row and "%" in row  # a final accuracy


def test_a_bad_quorum_knob_is_one_line_and_status_2(capsys) -> None:
    from akosim.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["--scheme", "quorum-diloco", "--workers", "3", "--inner-steps", "2",
              "--quorum-grace-steps", "2", "--quiet"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "exchange.quorum_grace_steps: got 2" in err[0], err


@pytest.mark.timeout(150)
def test_akorun_launches_quorum_diloco_by_name_and_ends_with_equal_replicas(
        tmp_path: Path) -> None:
    merged, replicas = launch(tmp_path / "run", 3, 6, "--scheme", "quorum-diloco",
                              "--inner-steps", "3", "--quorum-min", "2")
    assert merged["scheme"] == "quorum-diloco"
    assert [w["rounds"] for w in merged["per_worker"]] == [6] * 3
    for replica in replicas[1:]:
        np.testing.assert_array_equal(replica, replicas[0])


def test_the_planner_times_a_quorum_of_everyone_and_graces_beside_the_configured_run(
        ) -> None:
    from dataclasses import replace

    from akosim.planning.compare import compare_all
    from akosim.planning.pareto_candidates import pareto_candidates
    from tests.test_plan_advice import _setup

    setup = _setup(n=3, rounds=12)
    setup = replace(setup, config=replace(setup.config, exchange=replace(
        setup.config.exchange, scheme="quorum-diloco", inner_steps=4)))
    chosen = pareto_candidates(setup, compare_all(setup), max_staleness_rounds=16,
                               training_rounds=12)
    labels = {c.variant.label for c in chosen if c.timing.scheme == "quorum-diloco"}
    assert "quorum-diloco H=4 q=all g=0" in labels, labels  # its plan_grid
    assert any(" q=majority g=" in label and not label.endswith(" g=0")
               for label in labels), labels  # a grace: it moves the staleness bound


@pytest.mark.timeout(150)
def test_akorun_goes_on_at_the_quorum_while_a_member_is_paused_and_it_catches_up(
        tmp_path: Path) -> None:
    """Rank 2 sends its first pseudo-gradient, then pauses before round 3: ranks 0 and 1
    run every round without it (DiLoCo would hold them at their second sync). Released,
    rank 2 applies the syncs it missed, its pseudo-gradients join later syncs, and every
    rank ends on the same anchor (exit 0: the run compares them)."""
    from akorun.testing import LocalCluster, wait_for

    go = tmp_path / "go"
    tables = {"cluster": {"workers": 3},
              "exchange": {"scheme": "quorum-diloco", "inner_steps": 3, "quorum_min": 2},
              "train": {"workload": "digits-mlp", "optimizer": "sgd", "lr": 0.1,
                        "rounds": 12, "eval_every": 1000}}
    with LocalCluster(tmp_path, tables) as cluster:
        cluster.start_all("--quiet", env={"AKORUN_FAULT": f"2@pause_before_round:3:{go}"})

        def others_done_while_paused() -> bool:
            states = [cluster.status(r) for r in range(3)]
            return all(states) and states[0]["round"] == states[1]["round"] == 12 \
                and states[2]["round"] == 3

        wait_for(others_done_while_paused, 90, "ranks 0 and 1 past every round, rank 2 held")
        go.touch()
        assert cluster.wait_all(90) == {0: 0, 1: 0, 2: 0}, cluster.logs()
        replicas = [cluster.params(rank) for rank in range(3)]
    for replica in replicas[1:]:
        np.testing.assert_array_equal(replica, replicas[0])
