"""The user's own NaN: a loss or gradient that goes NaN/Inf is named where it first
appears (rank, round, batch, local loss, whether the data held it) and the run
stops with exit 1 and that line, in `akorun launch` and in `akosim train`.

The workload is a user file (a linear model on 200 examples) whose data get a
NaN in every `nan_every`-th example; nan_every=0 keeps them finite, and a huge
learning rate then makes the training itself diverge.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from akocore.data.catalog import Batch
from akocore.workloads.nonfinite import (
    batch_holds,
    gradient_is_finite,
    is_nonfinite_stop,
    nonfinite_line,
    step_problem,
)
from akorun.testing import akorun_command, child_test_env
from akosim.cli import main as akosim_main

pytestmark = pytest.mark.timeout(240)

NAN_WORKLOAD = '''
import jax.numpy as jnp
import numpy as np
import optax

from akocore import ArrayData, Workload


def _logits(params, x):
    return x @ params["w"] + params["b"]


def _loss(params, batch, rng):
    x, y = batch
    return optax.softmax_cross_entropy_with_integer_labels(_logits(params, x), y).mean()


def _accuracy(params, batch):
    x, y = batch
    return jnp.mean(jnp.argmax(_logits(params, x), -1) == y)


def make(nan_every=0):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(240, 6)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32)
    if nan_every:
        x[::nan_every, 3] = np.nan
    def init(seed):
        r = np.random.default_rng(seed)
        return {"w": r.normal(size=(6, 2)).astype(np.float32), "b": np.zeros(2, np.float32)}
    return Workload(init=init, loss=_loss, evaluate=_accuracy,
                    data=ArrayData(x[:200], y[:200], x[200:], y[200:]))
'''


@pytest.fixture
def user_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "nanmodel.py").write_text(NAN_WORKLOAD)
    monkeypatch.chdir(tmp_path)
    return tmp_path


# ---------------------------------------------------------------------- the check


def test_a_nan_or_inf_anywhere_in_the_gradient_is_found_and_huge_finite_values_are_not() -> None:
    grad = np.ones(1000, np.float32)
    assert gradient_is_finite(grad) and step_problem(0.5, grad) is None
    huge = np.full(1000, 3e30, np.float32)  # its square sum overflows float32: still finite
    assert gradient_is_finite(huge) and step_problem(0.5, huge) is None
    for bad in (np.nan, np.inf, -np.inf):
        poisoned = grad.copy()
        poisoned[777] = bad
        assert not gradient_is_finite(poisoned)
        assert step_problem(0.5, poisoned) == "the gradient holds NaN or Inf (the loss is finite)"
    assert step_problem(None, grad) is None  # akorun.Exchange: the user's loop has the loss
    assert step_problem(None, poisoned) is not None
    assert step_problem(float("nan"), grad) == "the loss is NaN"
    assert step_problem(float("-inf"), grad) == "the loss is -Inf"


def test_the_line_names_the_round_the_batch_the_loss_and_what_the_data_hold() -> None:
    x = np.zeros((4, 3), np.float32)
    clean = Batch(x=x, y=np.zeros(4, np.int32), epoch=2, index=5, step=17)
    assert batch_holds(clean) == ()
    dirty_x = x.copy()
    dirty_x[1, 2] = np.nan
    dirty = Batch(x={"image": dirty_x}, y=np.array([0.0, np.inf, 0, 0]), epoch=2, index=5,
                  step=17)
    assert batch_holds(dirty) == ("inputs", "targets")
    line = nonfinite_line(who="rank 3", round_=41, batch=dirty, loss=float("nan"),
                          problem="the loss is NaN")
    assert line.startswith("rank 3: non-finite training step at round 41, batch 5 of epoch 2: "
                           "the loss is NaN (local loss nan); the batch's inputs and targets "
                           "hold NaN or Inf")
    assert is_nonfinite_stop(line) and not is_nonfinite_stop("rounds")
    diverged = nonfinite_line(who="simulated worker 0", round_=3, batch=clean,
                              loss=float("inf"), problem="the loss is +Inf")
    assert "data are finite: training diverged" in diverged and "\n" not in diverged


# ------------------------------------------------------------------------ akosim


def _akosim(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    try:
        code = akosim_main(list(argv))
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    return code, capsys.readouterr().err


def test_akosim_train_stops_at_the_first_nan_of_the_data_with_exit_1_and_one_line(
        user_folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _akosim(capsys, "train", "--workload", "./nanmodel.py:make:nan_every=7",
                        "--workers", "2", "--rounds", "20", "--batch-size", "10",
                        "--compute", "10ms", "--quiet")
    assert code == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("akosim train: failed: simulated worker ")
    assert "non-finite training step at round " in lines[0]
    assert "the loss is NaN (local loss nan)" in lines[0]
    assert "the batch's inputs hold NaN or Inf" in lines[0]


def test_akosim_train_says_a_run_diverged_on_finite_data(
        user_folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _akosim(capsys, "train", "--workload", "./nanmodel.py:make", "--workers", "2",
                        "--rounds", "40", "--batch-size", "10", "--lr", "1e38",
                        "--optimizer", "sgd", "--compute", "10ms", "--quiet")
    assert code == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "the batch's data are finite: training diverged" in lines[0], err


def test_akosim_train_of_finite_data_still_trains(user_folder: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _akosim(capsys, "train", "--workload", "./nanmodel.py:make", "--workers", "2",
                        "--rounds", "20", "--batch-size", "10", "--compute", "10ms", "--quiet")
    assert code == 0, err


# ------------------------------------------------------------------------ akorun


@pytest.mark.parametrize("scheme", ["ako", "allreduce"])
def test_akorun_launch_stops_every_rank_at_the_first_nan_with_exit_1_and_the_line(
        user_folder: Path, scheme: str) -> None:
    out = user_folder / "run"
    result = subprocess.run(akorun_command(
        "launch", "--workload", "./nanmodel.py:make:nan_every=23", "--workers", "3",
        "--scheme", scheme, "--rounds", "50", "--batch-size", "10", "--out", str(out),
        "--quiet"),
        capture_output=True, text=True, env=child_test_env(), cwd=user_folder, timeout=200)
    assert result.returncode == 1, result.stderr
    first = result.stderr.strip().splitlines()[0]
    assert first.startswith("akorun launch: failed: rank "), first
    assert "non-finite training step at round " in first
    assert "the loss is NaN (local loss nan); the batch's inputs hold NaN or Inf" in first
    run = json.loads((out / "result.json").read_text())
    ranks = run["per_worker"]
    assert all(rank["exit_code"] == 1 for rank in ranks), [r["exit_code"] for r in ranks]
    stopped = [rank for rank in ranks if is_nonfinite_stop(rank["stop_reason"])]
    assert stopped, [rank["stop_reason"] for rank in ranks]
    for rank in range(3):  # every rank's last line names the cause, not a lost peer
        last = (out / f"worker-{rank}.log").read_text().strip().splitlines()[-1]
        assert last.startswith("akorun worker: failed: rank "), last
        assert "non-finite training step at round " in last, last
    # the rank that met the NaN sent nothing non-finite: no peer refused a message
    assert all(not rank["rejected"].get("non_finite") for rank in ranks)
