"""The public Python API: akosim.plan/simulate/train over the same path as the commands,
keyword settings as the flags, typed records back; akocore.read_result of a path or a
dict; akorun's settings checks. (The examples that run real ranks: test_examples_api.)

The plans share the suite's cache folder (tests/conftest.py: AKO_CACHE_DIR), so the rows
of the default plan that two tests ask for are trained once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import akocore
import akorun
import akosim
from akocore.cli_support import UsageError
from akocore.records.jsonrecord import RecordError
from akorun.testing import REPO_ROOT

TIMING = dict(workers=8, bandwidth="40mbps", compute="0.3s", gradient_size="17MB",
              quiet=True)


def test_plan_compares_every_scheme_and_recommends() -> None:
    plan = akosim.plan(p="auto", **TIMING)
    assert isinstance(plan, akocore.PlanResult)
    labels = [run.label for run in plan.runs]
    assert labels[0].startswith("ako p=") and "ring allreduce" in labels
    assert any(label.startswith("ps ") for label in labels)
    assert plan.explanation.startswith("plan: Ako p=")
    assert plan.chosen_ssp is not None and plan.gradient_bytes == 17_000_000


def test_plan_is_what_the_command_writes(tmp_path: Path) -> None:
    from akosim.cli import main

    out = tmp_path / "plan.json"
    assert main(["--workers", "8", "--bandwidth", "40mbps", "--compute", "0.3s",
                 "--gradient-size", "17MB", "--quiet", "--out", str(out)]) == 0
    written = akocore.read_result(out)
    planned = akosim.plan(**TIMING)
    assert isinstance(written, akocore.PlanResult)
    assert [r.label for r in written.runs] == [r.label for r in planned.runs]
    assert [r.round_time_s for r in written.runs] == [r.round_time_s for r in planned.runs]
    assert written.explanation == planned.explanation


def test_simulate_times_one_configuration_with_dotted_settings() -> None:
    run = akosim.simulate(scheme="ako", p=4, rounds=30, overrides={"exchange.ssp": 3},
                          **TIMING)
    assert isinstance(run, akocore.RunResult)
    assert (run.scheme, run.p, run.ssp, run.mode) == ("ako", 4, 3, "timing")
    assert run.round_time_s is not None and run.round_time_s >= 0.3


def test_simulate_reads_a_settings_file(tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text('[cluster]\nworkers = 5\n[exchange]\nscheme = "allreduce"\n')
    run = akosim.simulate(config, compute="0.1s", gradient_size="1MB", rounds=10)
    assert (run.workers, run.scheme) == (5, "allreduce")


def test_train_returns_the_training_record() -> None:
    run = akosim.train(workers=3, compute="10ms", bandwidth="1gbps", rounds=20,
                       eval_every=10, workload="synthetic-mlp", quiet=True)
    assert run.mode == "train" and run.scheme == "ako"
    assert run.accuracy == run.final_accuracy and run.accuracy is not None
    assert [round_ for _, round_, _ in run.evaluations] == [10, 20]


def test_a_workload_object_is_planned_from_its_parameters() -> None:
    x = np.random.default_rng(0).normal(size=(64, 5)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32)

    def loss(params, batch, rng):
        xb, yb = batch
        return ((xb @ params["w"])[:, 0] - yb) .mean() ** 2

    def evaluate(params, batch):
        return 0.5

    workload = akocore.Workload(init=lambda seed: {"w": np.zeros((5, 3), np.float32)},
                                loss=loss, evaluate=evaluate,
                                data=akocore.ArrayData(x[:48], y[:48], x[48:], y[48:]))
    plan = akosim.plan(workload=workload, workers=4, compute="5ms", scheme="ako", p=1,
                       rounds=5, quiet=True)
    assert plan.gradient_bytes == 15 * 4


def test_an_unknown_setting_is_a_type_error_naming_the_settings() -> None:
    with pytest.raises(TypeError, match="no setting 'wokers'.*workers"):
        akosim.plan(wokers=8)
    with pytest.raises(TypeError, match="no setting 'rounds_max'"):
        akorun.launch(out="x", rounds_max=3)


def test_a_bad_value_is_the_commands_one_line() -> None:
    with pytest.raises(ValueError, match="cluster.workers: got 'two'"):
        akosim.simulate(workers="two", compute="1s", gradient_size="1MB")
    with pytest.raises(UsageError, match="--max-staleness: got -1"):
        akosim.plan(max_staleness=-1, **TIMING)
    with pytest.raises(UsageError, match="max_staleness: got 'many', expected a whole number"):
        akosim.plan(max_staleness="many", **TIMING)


def test_launch_refuses_a_workload_object() -> None:
    with pytest.raises(TypeError, match="every rank is its own process"):
        akorun.launch(out="x", workload=object())


def test_init_writes_a_cluster_file_a_rank_reads(tmp_path: Path) -> None:
    from akorun.launching.commands import rank_options
    from akorun.launching.requests import RankRequest

    path = akorun.init(tmp_path / "c.toml", workers=3, rounds=7, lr=0.2)
    options = rank_options(RankRequest(config=path, rank=1))
    assert options.config.cluster.workers == 3 and options.config.train.rounds == 7
    assert len(options.config.cluster.hosts) == 3


def test_read_result_takes_a_dict_a_file_or_a_run_directory(tmp_path: Path) -> None:
    record = akocore.RunResult(tool="akorun", scheme="ako", final_accuracy=0.75, workers=3)
    data = record.to_json()
    (tmp_path / "result.json").write_text(json.dumps(data))
    for source in (data, tmp_path / "result.json", str(tmp_path)):
        read = akocore.read_result(source)
        assert read == record and read.accuracy == 0.75
    with pytest.raises(RecordError, match="no such result file"):
        akocore.read_result(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(RecordError, match="not a readable JSON result"):
        akocore.read_result(tmp_path / "bad.json")


def test_importing_the_packages_stays_light() -> None:
    code = ("import sys, akocore, akosim, akorun; "
            "assert callable(akosim.plan) and callable(akorun.launch); "
            "print(sorted(m for m in ('jax', 'simpy', 'aiohttp') if m in sys.modules))")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, check=True)
    assert done.stdout.strip() == "[]"


RANK_SCRIPT = """
import sys, jax.numpy as jnp, numpy as np, akorun
rank, cluster, out, steps = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
with akorun.Exchange(rank=rank, cluster=cluster, params={"w": jnp.zeros(4)}, out=out) as ex:
    params = ex.params
    for _ in range(steps):
        params = ex.step({"w": jnp.full(4, rank + 1.0)})
np.save(f"{out}/rank-{rank}.npy", np.asarray(params["w"]))
"""


def test_an_exchange_without_evaluation_that_leaves_early(tmp_path: Path) -> None:
    """Every rank leaves after 3 of 10 rounds: each stops after the round in flight, the
    record has no accuracy (none was given), and the ranks' final replicas agree."""
    from akorun.testing import child_test_env

    cluster = akorun.init(tmp_path / "c.toml", workers=3, rounds=10, optimizer="sgd",
                          lr=0.1, p=2)
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    env = child_test_env({"PYTHONPATH": str(REPO_ROOT)})
    ranks = [subprocess.Popen([sys.executable, str(script), str(rank), str(cluster),
                               str(tmp_path), "3"], env=env, stderr=subprocess.PIPE,
                              text=True) for rank in range(3)]
    errors = [rank.communicate(timeout=300)[1] for rank in ranks]
    assert [rank.returncode for rank in ranks] == [0, 0, 0], errors
    run = akocore.read_result(tmp_path)
    assert [rank.rounds for rank in run.per_worker] == [4, 4, 4]  # 3 steps + the one in flight
    assert run.accuracy is None and "NaN" not in (tmp_path / "result.json").read_text()
    with np.load(tmp_path / "worker-0.npz") as saved:
        final = np.array(saved["params"])
    for rank in range(1, 3):
        with np.load(tmp_path / f"worker-{rank}.npz") as saved:
            np.testing.assert_allclose(saved["params"], final, rtol=1e-6)
    # plain SGD on the workers' mean gradient, 3 rounds (the 4th's gradients are zeros)
    np.testing.assert_allclose(final, np.full(4, -0.1 * 3 * (1 + 2 + 3) / 3), rtol=1e-5)
