"""Checkpoints are Orbax checkpoints: a loopback run of the Flax example writes them,
Orbax alone (the your-model guide's code, run here) restores the model's pytree,
``--resume`` continues from one, and an npz checkpoint of an older akorun still resumes."""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flax")
pytest.importorskip("orbax.checkpoint")

import jax  # noqa: E402

import akorun  # noqa: E402
from akorun.runtime.records.checkpoint_file import load_checkpoint  # noqa: E402
from akorun.runtime.records.checkpoint_npz import npz_path, write_npz  # noqa: E402
from akorun.testing import REPO_ROOT, akorun_command  # noqa: E402
from tests.test_examples import _env  # noqa: E402

pytestmark = pytest.mark.timeout(400)

FLAX = "examples/flax_cnn/mymodel.py:make"
ROUNDS = 6
KILLED_AFTER = 3  # rank 1's last checkpoint is the one of round 2 (every 2 rounds)


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two ako ranks of the Flax example, checkpoints every 2 rounds; rank 1 is SIGKILLed
    after round 3, rank 0 finishes (its final checkpoint at round 6)."""
    out = tmp_path_factory.mktemp("orbax") / "run"
    env = {**_env(out.parent), "AKORUN_FAULT": f"1@kill_after_round:{KILLED_AFTER}"}
    command = akorun_command("launch", "--workload", FLAX, "--workers", "2", "--rounds",
                             str(ROUNDS), "--optimizer", "sgd", "--lr", "0.1",
                             "--checkpoint-every", "2", "--peer-timeout", "3s", "--out", str(out),
                             "--quiet",
                             "--timeout", "200s")
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO_ROOT,
                            timeout=300)
    assert result.returncode != 0 and "rank 1 (exit status -9)" in result.stderr, \
        result.stderr[-3000:]
    return out


def _guide_code() -> str:
    text = (REPO_ROOT / "docs" / "guide" / "your-model.md").read_text()
    start = text.index("```python\n# restore with Orbax alone") + len("```python\n")
    return text[start:text.index("```", start)]


def test_orbax_alone_restores_the_flax_models_pytree(killed_run: Path, tmp_path: Path) -> None:
    """The guide's code, with the run's directory, gives the model's pytree with rank 0's
    final values (what load_params returns, as float32) and the round."""
    code = _guide_code().replace("runs/mine", str(killed_run))
    script = tmp_path / "restore.py"
    script.write_text(code + "\nimport numpy\nnumpy.savez(" + repr(str(tmp_path / "got.npz"))
                      + ", round=next_round, **{jax.tree_util.keystr(p): leaf for p, leaf in"
                      " jax.tree_util.tree_flatten_with_path(params)[0]})\n")
    env = {**_env(tmp_path), "PYTHONPATH": ""}  # Orbax and JAX only: no akorun imported
    result = subprocess.run([sys.executable, "-c", "import jax\n" + script.read_text()],
                            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    want = akorun.load_params(killed_run, workload=str(REPO_ROOT / FLAX))
    paths = jax.tree_util.tree_flatten_with_path(want)[0]
    with np.load(tmp_path / "got.npz") as got:
        assert int(got["round"]) == ROUNDS
        assert sorted(name for name in got.files if name != "round") == \
            sorted(jax.tree_util.keystr(path) for path, _ in paths)
        for path, leaf in paths:
            np.testing.assert_array_equal(got[jax.tree_util.keystr(path)],
                                          np.asarray(leaf, np.float32))


def _resume(run: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    command = akorun_command("worker", "--rank", "1", "--config", str(run / "cluster.toml"),
                             "--resume", "--checkpoint-dir", str(run / "checkpoints"),
                             "--out", str(run), "--quiet", "--peer-timeout", "3s",
                             "--grace", "1s")
    return subprocess.run(command, capture_output=True, text=True, env=_env(cwd),
                          cwd=REPO_ROOT, timeout=200)


def test_resume_continues_from_the_orbax_checkpoint_and_from_an_old_npz(
        killed_run: Path, tmp_path: Path) -> None:
    """Rank 1, restarted with --resume and no live peer, goes on from its checkpoint of
    round 2 to the end, from the Orbax checkpoint and from the same state as an npz."""
    saved = load_checkpoint(killed_run / "checkpoints", 1)
    assert saved.next_round == 2
    runs = {"orbax": tmp_path / "orbax", "npz": tmp_path / "npz"}
    for run in runs.values():
        shutil.copytree(killed_run, run, symlinks=True)
    folder = runs["npz"] / "checkpoints"
    shutil.rmtree(folder / "worker-1.ckpt.d")
    (folder / "worker-1.ckpt").unlink()
    meta = saved.meta()
    meta["format"] = 1
    write_npz(npz_path(folder, 1), meta, {"params": saved.params, "unsent": saved.unsent,
                                          "inbox": saved.inbox})
    finals = {}
    for name, run in runs.items():
        result = _resume(run, tmp_path / name)
        assert result.returncode == 0, result.stderr[-3000:]
        assert re.search(r"continuing from our checkpoint alone at round 2", result.stderr), \
            result.stderr[-3000:]
        with np.load(run / "worker-1.npz") as data:
            finals[name] = np.array(data["params"])
    np.testing.assert_array_equal(finals["npz"], finals["orbax"])
    assert not np.array_equal(finals["orbax"], saved.params), "no round was trained"
    assert load_checkpoint(runs["npz"] / "checkpoints", 1).next_round == ROUNDS  # now Orbax


def test_an_equinox_models_checkpoint_round_trips_through_its_own_leaf_order(
        tmp_path: Path) -> None:
    """An Equinox module (attributes, None leaves) is saved under its attribute names;
    loading puts every leaf back at its place in the flat vector."""
    pytest.importorskip("equinox")
    from akocore import build_workload
    from akorun.runtime.records.checkpoint_file import Checkpoint, save_checkpoint

    workload = build_workload(str(REPO_ROOT / "examples/equinox_mlp/mymodel.py:make"))
    flat = np.arange(workload.param_count, dtype=np.float32) / workload.param_count
    path = save_checkpoint(tmp_path, Checkpoint(rank=0, next_round=1, params=flat, run_id="r",
                                                config_hash="c", scheme="ako", p_of=(1,)),
                           structure=workload.unravel)
    back = load_checkpoint(tmp_path, 0, like=workload.unravel(workload.init_params))
    np.testing.assert_array_equal(back.params, flat)
    import orbax.checkpoint as ocp

    alone = ocp.StandardCheckpointer().restore(path.resolve())["params"]
    assert sorted(np.asarray(x).size for x in jax.tree_util.tree_leaves(alone)) == sorted(
        np.asarray(x).size for x in jax.tree_util.tree_leaves(workload.unravel(flat)))
