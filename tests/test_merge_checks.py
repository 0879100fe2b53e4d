"""`akorun merge` never reports NaN replicas as equal and refuses damaged records.

One real 3-rank run (`akorun launch`) gives the records; each test copies them
and damages the copy: NaN parameters in one rank's or every rank's replica
(exit 1, one line naming the ranks, result.json says max_relative_difference
inf; a launch whose ranks end with a NaN model fails the same way), a damaged
npz, a record claiming a billion ranks, a record filed under another rank's
name, a rank outside the run (exit 2, one line, no traceback, no stall: the
module timeout is the hang guard).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from akorun.launching.commands import main as akorun_main
from akorun.runtime.records.result_files import max_relative_difference, nonfinite_replicas
from akorun.testing import REPO_ROOT, akorun_command, child_test_env

pytestmark = pytest.mark.timeout(180)

WORKERS = 3


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("merge-checks") / "run"
    result = subprocess.run(akorun_command(
        "launch", "--workers", str(WORKERS), "--rounds", "4", "--optimizer", "sgd",
        "--batch-size", "16", "--out", str(out), "--quiet"), capture_output=True, text=True,
        env=child_test_env(), cwd=REPO_ROOT, timeout=150)
    assert result.returncode == 0, result.stderr
    return out


@pytest.fixture
def copy(run_dir: Path, tmp_path: Path) -> Path:
    target = tmp_path / "copy"
    target.mkdir()
    for rank in range(WORKERS):
        for suffix in ("json", "npz"):
            shutil.copy(run_dir / f"worker-{rank}.{suffix}", target)
    return target


def _merge(run: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    code = akorun_main(["merge", str(run), "--quiet"])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err.strip().splitlines()


def _poison(run: Path, rank: int) -> None:
    path = run / f"worker-{rank}.npz"
    with np.load(path) as data:
        arrays = {key: np.array(data[key]) for key in data.files}
    arrays["params"] = np.full_like(arrays["params"], np.nan)
    np.savez(path, **arrays)


def _edit(path: Path, change: dict[str, Any], config_cluster: dict[str, Any] | None = None
          ) -> None:
    record = json.loads(path.read_text())
    record.update(change)
    if config_cluster is not None:
        record["config"]["cluster"].update(config_cluster)
    path.write_text(json.dumps(record))


# ------------------------------------------------------------------- NaN replicas


def test_a_nan_or_inf_replica_is_never_equal_to_the_others() -> None:
    finite = np.arange(5, dtype=np.float32)
    assert max_relative_difference([finite, finite.copy()]) == 0.0
    assert nonfinite_replicas({0: finite, 1: finite}) is None
    nan = np.full(5, np.nan, np.float32)
    assert math.isinf(max_relative_difference([finite, nan]))
    assert math.isinf(max_relative_difference([nan, finite]))
    assert math.isinf(max_relative_difference([nan, nan.copy(), nan.copy()]))
    one_inf = finite.copy()
    one_inf[2] = np.inf
    assert math.isinf(max_relative_difference([one_inf]))
    line = nonfinite_replicas({0: finite, 1: one_inf, 2: nan})
    assert line is not None and "rank(s) 1, 2 hold NaN or Inf" in line
    assert "rank 1: 1 of 5 values, rank 2: 5 of 5 values" in line
    assert "rank(s) 0 finite: the replicas disagree" in line


@pytest.mark.parametrize("poisoned", [(1,), (0, 1, 2)], ids=["one-rank", "every-rank"])
def test_merge_fails_with_exit_1_naming_the_ranks_whose_replica_is_nan(
        copy: Path, capsys: pytest.CaptureFixture[str], poisoned: tuple[int, ...]) -> None:
    for rank in poisoned:
        _poison(copy, rank)
    code, lines = _merge(copy, capsys)
    assert code == 1 and len(lines) == 1, lines
    assert lines[0].startswith(f"akorun merge: failed: the final parameters of rank(s) "
                               f"{', '.join(map(str, poisoned))} hold NaN or Inf"), lines[0]
    result = json.loads((copy / "result.json").read_text())
    assert result["max_relative_difference"] == "inf"


def test_merge_of_finite_replicas_still_succeeds(copy: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    code, lines = _merge(copy, capsys)
    assert code == 0 and lines == [f"wrote {copy / 'result.json'}: every rank's record"], lines
    assert json.loads((copy / "result.json").read_text())["max_relative_difference"] < 1e-5


# --------------------------------------------------------------- damaged records


def _refused(copy: Path, capsys: pytest.CaptureFixture[str], *needles: str) -> None:
    code, lines = _merge(copy, capsys)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("akorun merge: error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert not (copy / "result.json").exists()


def test_a_damaged_npz_is_refused_with_one_line(copy: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    npz = copy / "worker-1.npz"
    npz.write_bytes(npz.read_bytes()[:300])
    _refused(copy, capsys, "worker-1.npz: not readable parameters")
    npz.write_bytes(b"not an npz at all")
    _refused(copy, capsys, "worker-1.npz: not readable parameters")


def test_an_npz_without_parameters_is_refused(copy: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    np.savez(copy / "worker-2.npz", other=np.zeros(3))
    _refused(copy, capsys, "worker-2.npz: not readable parameters", "KeyError")


@pytest.mark.parametrize("hosts", [[], None], ids=["no-hosts", "hosts-kept"])
def test_a_record_claiming_a_billion_ranks_is_refused_at_once(
        copy: Path, capsys: pytest.CaptureFixture[str], hosts: list[str] | None) -> None:
    cluster: dict[str, Any] = {"workers": 10**9}
    if hosts is not None:
        cluster["hosts"] = hosts
    _edit(copy / "worker-0.json", {"workers": 10**9}, cluster)
    _refused(copy, capsys, "1000000000")


def test_a_record_claiming_a_count_its_configuration_does_not_is_refused(
        copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _edit(copy / "worker-2.json", {"workers": 10**9})
    _refused(copy, capsys, "worker-2.json: rank 2 of 1000000000 ranks, but the run has 3")


def test_a_record_filed_under_another_ranks_name_is_refused(
        copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _edit(copy / "worker-1.json", {"rank": 0})
    _refused(copy, capsys, "worker-1.json: holds rank 0's record, not rank 1's")


def test_a_rank_outside_the_run_is_refused(copy: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copy(copy / "worker-2.json", copy / "worker-7.json")
    _edit(copy / "worker-7.json", {"rank": 7})
    _refused(copy, capsys, "worker-7.json: rank 7 of 3 ranks, but the run has 3")


def test_akorun_launch_whose_every_rank_ends_with_a_nan_model_fails_with_exit_1(
        tmp_path: Path) -> None:
    """One round at an infinite learning rate: every step's loss and gradient are finite
    (no rank stops), the update after it makes every parameter Inf or NaN."""
    out = tmp_path / "run"
    result = subprocess.run(akorun_command(
        "launch", "--workers", "2", "--rounds", "1", "--optimizer", "sgd", "--lr", "1e39",
        "--batch-size", "16", "--out", str(out), "--quiet"), capture_output=True, text=True,
        env=child_test_env(), cwd=REPO_ROOT, timeout=150)
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "akorun launch: failed: the final parameters of rank(s) 0, 1 hold NaN or Inf"), lines
    run = json.loads((out / "result.json").read_text())
    assert run["max_relative_difference"] == "inf"
    assert [rank["exit_code"] for rank in run["per_worker"]] == [0, 0]
