"""The trained model back as the user's pytree: `akorun.load_params` on a short loopback run
of the Flax example (the structure, shapes and dtypes of the model's init, the values of
``worker-R.npz``; the errors of one line), and `akosim.train`'s ``params``."""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flax")

import jax  # noqa: E402

import akorun  # noqa: E402
import akosim  # noqa: E402
from akocore import build_workload  # noqa: E402
from akocore.workloads.flat import initial_params, load_workload_spec  # noqa: E402
from akocore.workloads.naming import parse_workload_name  # noqa: E402
from akorun.errors import UsageError  # noqa: E402
from akorun.testing import REPO_ROOT  # noqa: E402
from tests.test_examples import _env, launch_and_check_replicas  # noqa: E402

pytestmark = pytest.mark.timeout(300)

FLAX = "examples/flax_cnn/mymodel.py:make"  # relative, as a user launches it


@pytest.fixture(scope="module")
def flax_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 3-rank loopback run of the Flax example (plain SGD, 6 rounds), launched from
    the repository root."""
    tmp = tmp_path_factory.mktemp("flax")
    launch_and_check_replicas(FLAX, tmp / "run", REPO_ROOT, _env(tmp))
    return tmp / "run"


def _layout(tree: object) -> list[tuple[str, tuple[int, ...], str]]:
    paths = jax.tree_util.tree_flatten_with_path(tree)[0]
    return [(jax.tree_util.keystr(path), tuple(np.shape(leaf)), str(np.asarray(leaf).dtype))
            for path, leaf in paths]


def _flat(run_dir: Path, rank: int) -> np.ndarray:
    with np.load(run_dir / f"worker-{rank}.npz") as data:
        return np.array(data["params"])


def _raveled(tree: object) -> np.ndarray:
    return np.concatenate([np.ravel(leaf) for leaf in jax.tree_util.tree_leaves(tree)])


def test_load_params_gives_the_flax_models_pytree_with_the_ranks_values(
        flax_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO_ROOT)
    spec = load_workload_spec(parse_workload_name(FLAX))
    init = initial_params(spec, 0)  # the model's own init: CNN().init(key, x)["params"]
    params = akorun.load_params(flax_run)
    assert jax.tree_util.tree_structure(params) == jax.tree_util.tree_structure(init)
    assert _layout(params) == _layout(init)
    assert set(params) == {"Conv_0", "Conv_1", "Dense_0"}
    np.testing.assert_array_equal(_raveled(params), _flat(flax_run, 0))
    assert not np.array_equal(_raveled(params), _raveled(init)), "the run trained nothing"
    second = akorun.load_params(flax_run, rank=2)
    np.testing.assert_array_equal(_raveled(second), _flat(flax_run, 2))


def test_load_params_takes_the_structure_from_a_workload_or_a_pytree_given(
        flax_run: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)  # the run's relative workload path is not found here
    with pytest.raises(UsageError, match=r"cannot build the run's workload "
                       r"examples/flax_cnn/mymodel.py:make here .* give workload= or like="):
        akorun.load_params(flax_run)
    spec = load_workload_spec(parse_workload_name(str(REPO_ROOT / FLAX)))
    from_object = akorun.load_params(flax_run, workload=spec)  # the user's Workload object
    from_name = akorun.load_params(flax_run, workload=str(REPO_ROOT / FLAX))
    init = initial_params(spec, 0)
    from_like = akorun.load_params(flax_run, like=init)
    for tree in (from_object, from_name, from_like):
        assert _layout(tree) == _layout(init)
        np.testing.assert_array_equal(_raveled(tree), _flat(flax_run, 0))
    with pytest.raises(UsageError, match=r"rank 0 trained 1,828 parameters but workload "
                                         r"digits-mlp builds"):
        akorun.load_params(flax_run, workload="digits-mlp")
    with pytest.raises(UsageError, match="like= does not fit rank 0's 1,828 parameters"):
        akorun.load_params(flax_run, like={"w": np.zeros(3, np.float32)})


def test_load_params_names_a_missing_rank_and_a_file_of_another_run(
        flax_run: Path, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"rank 7 left no record \(worker-7.json\); "
                                         r"ranks with a record: 0, 1, 2"):
        akorun.load_params(flax_run, rank=7)
    mixed = tmp_path / "mixed"
    shutil.copytree(flax_run, mixed)
    np.savez(mixed / "worker-0.npz", params=_flat(flax_run, 0) + 1.0, offset=np.array(0))
    with pytest.raises(UsageError, match="not the parameters worker-0.json records"):
        akorun.load_params(mixed, like=_flat(flax_run, 0))
    (mixed / "worker-1.npz").unlink()
    with pytest.raises(UsageError, match=r"rank 1 left no parameters \(worker-1.npz\)"):
        akorun.load_params(mixed, rank=1)


def test_a_parameter_servers_shard_is_refused_and_a_workers_model_given(
        tmp_path: Path) -> None:
    out = tmp_path / "ps"
    run = akorun.launch(out=out, workers=3, scheme="ps", rounds=3, workload="digits-mlp",
                        optimizer="sgd", lr=0.05, quiet=True)
    assert [rank.role for rank in run.per_worker] == ["worker", "worker", "ps"]
    with pytest.raises(UsageError, match="rank 2 is a parameter server; it holds a shard"):
        akorun.load_params(out, rank=2)
    params = akorun.load_params(out)
    assert _layout(params) == _layout(initial_params(build_workload("digits-mlp").spec, 0))
    np.testing.assert_array_equal(_raveled(params), _flat(out, 0))


def test_a_bfloat16_model_comes_back_in_bfloat16() -> None:
    from akocore.workloads import ArrayData, Workload

    x = np.zeros((8, 3), np.float32)
    y = np.zeros(8, np.int32)
    spec = Workload(init=lambda seed: {"w": np.ones((3, 2), jax.numpy.bfloat16),
                                       "b": np.zeros(2, np.float32)},
                    loss=lambda p, batch, rng: 0.0, evaluate=lambda p, batch: 0.0,
                    data=ArrayData(x, y, x, y))
    from akocore.workloads.flat import flat_workload

    workload = flat_workload(spec, batch_size=4)
    tree = workload.params_tree(np.arange(8, dtype=np.float32))
    assert tree["b"].dtype == np.float32 and tree["w"].dtype == jax.numpy.bfloat16
    np.testing.assert_array_equal(tree["b"], [0.0, 1.0])  # leaf order: b, then w
    np.testing.assert_array_equal(tree["w"].astype(np.float32), np.arange(2, 8).reshape(3, 2))


def test_akosim_train_gives_the_trained_pytree_that_scored_its_accuracy() -> None:
    name = str(REPO_ROOT / FLAX) + ":channels=4"
    run = akosim.train(workers=2, bandwidth="100mbps", compute="10ms", rounds=6,
                       workload=name, scheme="ako", quiet=True)
    workload = build_workload(name)
    init = initial_params(workload.spec, 0)
    assert _layout(run.params) == _layout(init)
    assert not np.array_equal(_raveled(run.params), _raveled(init)), "nothing trained"
    assert workload.evaluate(_raveled(run.params)) == pytest.approx(run.accuracy, abs=1e-6)
    assert "params" not in run.to_json()  # the record's JSON is unchanged


def test_akosim_train_of_a_workload_object_gives_its_structure() -> None:
    from tests.test_examples import USER_FILE  # a user's Flax model built in a script

    namespace: dict[str, object] = {}
    exec(compile(USER_FILE, "mymodel.py", "exec"), namespace)  # noqa: S102
    spec = namespace["make"]()  # type: ignore[operator]
    run = akosim.train(workers=2, bandwidth="100mbps", compute="10ms", rounds=4,
                       workload=spec, scheme="ako", quiet=True)
    assert _layout(run.params) == _layout(initial_params(spec, 0))
