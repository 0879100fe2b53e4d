"""``akorun launch --plan plan.json`` runs the configuration the akosim plan recommends."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from akocore.cli_support import UsageError
from akocore.settings.layers import Given, Layer, resolve
from akorun.launching.plan_layer import plan_layer
from akosim.cli import main as akosim_main

PLAN = ["--workers", "3", "--bandwidth", "10mbps", "--compute", "10ms", "--workload",
        "digits-mlp", "--batch-size", "16", "--quiet", "--rank-by", "throughput"]


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("plan") / "plan.json"
    assert akosim_main([*PLAN, "--out", str(out)]) == 0
    return out


def _recommended_label(path: Path) -> str:
    record = json.loads(path.read_text())
    line = record["recommendation"][0]
    return max((run["label"] for run in record["runs"]
                if line.startswith(f"recommend: {run['label']}: ")), key=len)


def test_the_plan_layer_is_the_recommended_row(plan_file: Path) -> None:
    record = json.loads(plan_file.read_text())
    label = _recommended_label(plan_file)
    row = next(run for run in record["runs"] if run["label"] == label)
    cfg = resolve(plan_layer(plan_file)).config
    assert cfg.exchange.scheme == row["scheme"]
    assert cfg.cluster.workers == 3 and cfg.network.bandwidth_bps == (10e6,)
    assert cfg.train.workload == "digits-mlp" and cfg.train.batch_size == 16
    assert cfg.exchange.ssp == row["ssp"]
    if row["scheme"] == "ako":
        assert set(cfg.exchange.p) == set(row["p_of"])  # type: ignore[arg-type]
    keys = {given.key for given in plan_layer(plan_file)}
    assert "train.rounds" not in keys and "train.eval_every" not in keys  # the timing's


def test_flags_override_the_plan_and_a_bad_file_is_one_line(plan_file: Path,
                                                             tmp_path: Path) -> None:
    from akorun.launching.commands import main

    flagged = resolve([*plan_layer(plan_file),
                       Given("train.batch_size", 8, Layer.FLAG, "by --batch-size")])
    assert flagged.config.train.batch_size == 8
    assert flagged.origin("train.batch_size").layer == Layer.FLAG
    other = tmp_path / "not-a-plan.json"
    other.write_text("[1, 2]")
    assert main(["launch", "--plan", str(other), "--out", str(tmp_path / "r")]) == 2
    missing = tmp_path / "missing.json"
    assert main(["launch", "--plan", str(missing), "--out", str(tmp_path / "r")]) == 2
    with pytest.raises(UsageError, match="not a result record"):
        plan_layer(other)


def test_launch_runs_the_recommended_configuration(plan_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "akorun", "launch", "--plan", str(plan_file),
                           "--out", str(out), "--rounds", "3", "--quiet"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((out / "result.json").read_text())
    record = json.loads(plan_file.read_text())
    row = next(run for run in record["runs"] if run["label"] == _recommended_label(plan_file))
    assert result["scheme"] == row["scheme"] and result["workers"] == 3
    assert result["config"]["train"]["batch_size"] == 16 and result["ssp"] == row["ssp"]
    if row["scheme"] == "ako":
        assert result["p_of"] == row["p_of"]


@pytest.fixture(scope="module")
def ranked_plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A plan ranked by time to a target: its rows are DiLoCo's H ladder, not compared rows."""
    out = tmp_path_factory.mktemp("ranked") / "plan.json"
    assert akosim_main(["--workers", "3", "--bandwidth", "10mbps", "--compute", "10ms",
                        "--workload", "digits-mlp", "--batch-size", "16", "--scheme",
                        "diloco", "--target-accuracy", "0.5", "--quiet", "--out",
                        str(out)]) == 0
    return out


def test_a_ranked_row_runs_with_the_settings_it_trained_with(ranked_plan: Path,
                                                             tmp_path: Path) -> None:
    from akorun.launching.commands import main

    record = json.loads(ranked_plan.read_text())
    ranking = record["ranking"]
    compared = {run["label"] for run in record["runs"]}
    assert len(ranking) >= 2 and any(row["label"] not in compared for row in ranking)
    for position, row in enumerate(ranking, 1):
        cfg = resolve(plan_layer(ranked_plan, position)).config
        assert cfg.exchange.scheme == row["scheme"] == "diloco"
        assert row["label"] == f"diloco H={cfg.exchange.inner_steps}"
    recommended = resolve(plan_layer(ranked_plan)).config  # the recommended: the first
    assert recommended.exchange.inner_steps == resolve(plan_layer(ranked_plan, 1)).config \
        .exchange.inner_steps
    with pytest.raises(UsageError, match="--plan-rank 9: the plan .* ranks"):
        plan_layer(ranked_plan, 9)
    out = str(tmp_path / "r")
    assert main(["launch", "--plan", str(ranked_plan), "--plan-rank", "0", "--out", out]) == 2
    assert main(["launch", "--plan-rank", "2", "--out", out]) == 2
