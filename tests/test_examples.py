"""The examples/ and a user's model file outside the repository, through both CLIs.

Each runs at small size: `akorun launch --workload FILE:make --workers 3` ends with
equal replicas under plain SGD (the exactly-once invariant), `akosim --workload
FILE:make` measures the user's step and sizes the gradient from its parameters, and
a broken factory is one line and exit 2 in every command.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from akorun.testing import REPO_ROOT, akorun_command, child_test_env

pytestmark = pytest.mark.timeout(300)

EXAMPLES = REPO_ROOT / "examples"
RTOL = 1e-5


def _env(tmp_path: Path) -> dict[str, str]:
    pythonpath = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    return child_test_env({"PYTHONPATH": pythonpath, "AKO_CACHE_DIR": str(tmp_path / "cache")})


def _akosim(*args: str) -> list[str]:
    return [sys.executable, "-m", "akosim", *args]


def launch_and_check_replicas(workload: str, out: Path, cwd: Path, env: dict[str, str],
                              rounds: int = 6) -> dict:
    command = akorun_command("launch", "--workload", workload, "--workers", "3",
                             "--rounds", str(rounds), "--optimizer", "sgd", "--lr", "0.1",
                             "--p", "2", "--ssp", "1", "--out", str(out), "--quiet",
                             "--timeout", "200s")
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd,
                            timeout=260)
    assert result.returncode == 0, result.stderr[-3000:]
    replicas = []
    for rank in range(3):
        with np.load(out / f"worker-{rank}.npz") as data:
            replicas.append(np.array(data["params"]))
    for rank, replica in enumerate(replicas[1:], start=1):
        np.testing.assert_allclose(replica, replicas[0], rtol=RTOL, atol=RTOL * 1e-1,
                                   err_msg=f"replica {rank} differs from replica 0")
    return json.loads((out / "result.json").read_text())


def akosim_plan(workload: str, cwd: Path, env: dict[str, str]) -> str:
    """The plan's measured step and gradient size: ranked by throughput, it trains no row
    (the default ranking of a user's model: tests/test_examples_api.py, the notebook)."""
    command = _akosim("--workload", workload, "--workers", "3", "--compute", "measure",
                      "--bandwidth", "100mbps", "--rounds", "5", "--rank-by", "throughput")
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd,
                            timeout=260)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "measured here now" in result.stdout + result.stderr
    return result.stdout


def gradient_floats(plan_output: str) -> int:
    match = re.search(r"gradient [^(]*\(([\d,]+) float32\)", plan_output)
    assert match, plan_output
    return int(match.group(1).replace(",", ""))


@pytest.mark.parametrize("workload, params", [
    ("examples/flax_cnn/mymodel.py:make", 1828),
    ("examples/equinox_mlp/mymodel.py:make", 5508),
])
def test_an_example_trains_with_akorun_launch_and_is_planned_by_akosim(
        workload: str, params: int, tmp_path: Path) -> None:
    env = _env(tmp_path)
    launch_and_check_replicas(workload, tmp_path / "run", REPO_ROOT, env)
    assert gradient_floats(akosim_plan(workload, REPO_ROOT, env)) == params


def test_the_plain_jax_example_trains_in_akosim_train(tmp_path: Path) -> None:
    command = _akosim("train", "--workload", "examples/equinox_mlp/mymodel.py:make_plain",
                      "--workers", "3", "--rounds", "30", "--compute", "10ms",
                      "--scheme", "ako", "--lr", "0.2", "--out", str(tmp_path / "r.json"))
    result = subprocess.run(command, capture_output=True, text=True, env=_env(tmp_path),
                            cwd=REPO_ROOT, timeout=260)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "final acc" in result.stdout


USER_FILE = '''
"""A user's Flax model in a folder of their own."""
import numpy as np
from flax import linen as nn

from akocore import ArrayData
from akocore.workloads import from_flax


class Net(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(3)(nn.relu(nn.Dense(12)(x)))


def make():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 5)).astype(np.float32)
    y = x[:, :3].argmax(1).astype(np.int32)
    return from_flax(Net(), example_input=x[:1],
                     data=ArrayData(x[:300], y[:300], x[300:], y[300:]))


def broken():
    raise RuntimeError("my data went missing")
'''


@pytest.fixture
def user_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "user"
    folder.mkdir()
    (folder / "mymodel.py").write_text(USER_FILE)
    return folder


def test_a_flax_model_outside_the_repository_trains_and_is_planned(user_folder: Path,
                                                                    tmp_path: Path) -> None:
    env = _env(tmp_path)
    launch_and_check_replicas("./mymodel.py:make", user_folder / "run", user_folder, env)
    assert gradient_floats(akosim_plan("./mymodel.py:make", user_folder, env)) == \
        5 * 12 + 12 + 12 * 3 + 3
    # the file broken after the run: predicting the run on this host's step is one line
    source = user_folder / "mymodel.py"
    source.write_text(source.read_text().replace(
        "def make():", "def make():\n    raise RuntimeError('edited away')"))
    predicted = subprocess.run(_akosim("predict", "run", "--compute", "measure"),
                               capture_output=True, text=True, env=env, cwd=user_folder,
                               timeout=120)
    assert predicted.returncode == 2, predicted.stderr
    assert "Traceback" not in predicted.stderr
    assert predicted.stderr.strip().splitlines()[-1].endswith(
        "./mymodel.py:make raised RuntimeError: edited away")


def test_a_broken_factory_is_one_line_and_exit_2_in_every_command(user_folder: Path,
                                                                  tmp_path: Path) -> None:
    env = _env(tmp_path)
    broken = "./mymodel.py:broken"
    commands = [
        _akosim("--workload", broken, "--workers", "3", "--compute", "measure"),
        _akosim("train", "--workload", broken, "--workers", "3", "--rounds", "3",
                "--compute", "10ms"),
        _akosim("sweep", "--workload", broken, "--workers", "2,3", "--compute", "measure",
                "--out", str(tmp_path / "sweep")),
        akorun_command("init", "--workload", broken, "--workers", "3",
                       "--out", str(tmp_path / "c.toml")),
        akorun_command("launch", "--workload", broken, "--workers", "3", "--rounds", "2",
                       "--out", str(tmp_path / "run")),
    ]
    for command in commands:
        result = subprocess.run(command, capture_output=True, text=True, env=env,
                                cwd=user_folder, timeout=120)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2, (command, result.stderr)
        assert len(lines) == 1 and "Traceback" not in result.stderr, (command, result.stderr)
        assert "./mymodel.py:broken raised RuntimeError: my data went missing" in lines[0]
    # a worker given a cluster file that names the broken factory
    cluster = tmp_path / "good.toml"
    made = subprocess.run(akorun_command("init", "--workload", "./mymodel.py:make",
                                         "--workers", "3", "--out", str(cluster)),
                          capture_output=True, text=True, env=env, cwd=user_folder, timeout=120)
    assert made.returncode == 0, made.stderr
    cluster.write_text(cluster.read_text().replace("mymodel.py:make", "mymodel.py:broken"))
    worker = subprocess.run(akorun_command("worker", "--rank", "0", "--config", str(cluster)),
                            capture_output=True, text=True, env=env, cwd=user_folder,
                            timeout=120)
    assert worker.returncode == 2, worker.stderr
    assert worker.stderr.strip().splitlines()[-1].endswith("my data went missing")
    assert "Traceback" not in worker.stderr


def test_ranks_whose_workload_files_differ_refuse_each_other_naming_both(
        user_folder: Path, tmp_path: Path) -> None:
    env = _env(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    (other / "mymodel.py").write_text(USER_FILE.replace("size=(400, 5)", "size=(500, 5)"))
    cluster = tmp_path / "c.toml"
    made = subprocess.run(akorun_command("init", "--workload", "./mymodel.py:make", "--workers",
                                         "2", "--rounds", "2", "--join-timeout", "20s",
                                         "--out", str(cluster)),
                          capture_output=True, text=True, env=env, cwd=user_folder, timeout=120)
    assert made.returncode == 0, made.stderr
    ranks = [subprocess.Popen(akorun_command("worker", "--rank", str(rank), "--config",
                                             str(cluster)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env, cwd=folder)
             for rank, folder in enumerate((user_folder, other))]
    outputs = [rank.communicate(timeout=120) for rank in ranks]
    for rank, (_, stderr) in zip(ranks, outputs, strict=True):
        assert rank.returncode == 2, stderr  # a setting that differs: a user mistake
        assert re.search(r"setting workload .* differs between ranks: rank \d has "
                         r"./mymodel.py:make \w+, rank \d has ./mymodel.py:make \w+; "
                         r"give every rank the same workload file", stderr), stderr
