"""The workload protocol: the user's Workload, data sources, naming, adapters, fingerprint."""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np
import pytest

from akocore import ArrayData, BatchFactory, Workload, build_workload, flat_workload
from akocore.workloads.flat import workload_fingerprint
from akocore.workloads.naming import (
    WorkloadError,
    load_workload_spec,
    parse_workload_args,
    parse_workload_name,
)


def _arrays(n: int = 120, features: int = 6, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, features)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32)
    return x[: n - 20], y[: n - 20], x[n - 20:], y[n - 20:]


def _logits(params, x):
    return x @ params["w"] + params["b"]


def _loss(params, batch, rng):
    import optax

    x, y = batch
    return optax.softmax_cross_entropy_with_integer_labels(_logits(params, x), y).mean()


def _accuracy(params, batch):
    import jax.numpy as jnp

    x, y = batch
    return jnp.mean(jnp.argmax(_logits(params, x), -1) == y)


def _linear(dtype=np.float32, **kwargs) -> Workload:
    def init(seed):
        rng = np.random.default_rng(seed)
        return {"w": rng.normal(size=(6, 2)).astype(dtype), "b": np.zeros(2, dtype)}

    return Workload(init=init, loss=_loss, evaluate=_accuracy, data=ArrayData(*_arrays()),
                    **kwargs)


def test_a_plain_jax_workload_is_flattened_and_steps_like_a_builtin():
    import jax

    w = flat_workload(_linear(), batch_size=10, seed=3)
    assert w.param_count == 6 * 2 + 2 and w.gradient_bytes == 4 * 14
    assert w.init_params.dtype == np.float32
    batch = w.batches(0, 2).next()
    assert batch.x.shape == (10, 6)
    loss, grad = w.grad_step(w.init_params, batch.x, batch.y)
    expected_loss, expected = jax.value_and_grad(_loss)(w.unravel(w.init_params),
                                                        (batch.x, batch.y), None)
    assert loss == pytest.approx(float(expected_loss), rel=1e-6)
    np.testing.assert_allclose(grad[:2], np.asarray(expected["b"]), rtol=1e-5)
    assert 0.0 <= w.evaluate(w.init_params) <= 1.0
    assert w.evaluate_loss(w.init_params) is None  # evaluate gave only an accuracy


def test_plain_sgd_on_the_users_workload_learns_its_task():
    w = flat_workload(_linear(), batch_size=20, seed=0)
    optimizer = w.optimizer("sgd", 0.5)
    params, state = w.init_params, optimizer.init(w.init_params)
    stream = w.batches(0, 1)
    for step in range(60):
        batch = stream.next()
        _, grad = w.grad_step(params, batch.x, batch.y, step)
        params, state = optimizer.apply(params, state, grad)
    assert w.evaluate(params) >= 0.9


def test_init_may_take_a_prng_key_and_loss_may_return_metrics():
    import jax

    def init(key):
        return {"w": jax.random.normal(key, (6, 2)), "b": jax.numpy.zeros(2)}

    def loss_with_metrics(params, batch, rng):
        value = _loss(params, batch, rng)
        return value, {"loss": value}

    spec = Workload(init=init, loss=loss_with_metrics, evaluate=_accuracy,
                    data=ArrayData(*_arrays()))
    w = flat_workload(spec, batch_size=10, seed=5)
    again = flat_workload(spec, batch_size=10, seed=5)
    np.testing.assert_array_equal(w.init_params, again.init_params)
    batch = w.batches(0, 1).next()
    loss, grad = w.grad_step(w.init_params, batch.x, batch.y)
    assert np.isfinite(loss) and grad.shape == (14,)


def test_bfloat16_parameters_are_held_as_float32_and_the_notice_says_so():
    import jax.numpy as jnp

    w = flat_workload(_linear(dtype=jnp.bfloat16), batch_size=10)
    assert w.init_params.dtype == np.float32
    assert [dtype for _, dtype in w.param_layout] == ["bfloat16", "bfloat16"]
    assert len(w.notices) == 1 and "bfloat16" in w.notices[0] and "float32" in w.notices[0]
    batch = w.batches(0, 1).next()
    loss, grad = w.grad_step(w.init_params, batch.x, batch.y)
    assert grad.dtype == np.float32 and np.isfinite(loss)
    assert flat_workload(_linear(), batch_size=10).notices == ()


def test_integer_parameters_are_refused_in_one_line():
    spec = Workload(init={"w": np.zeros((6, 2), np.int32)}, loss=_loss, evaluate=_accuracy,
                    data=ArrayData(*_arrays()))
    with pytest.raises(WorkloadError, match=r"parameter \['w'\] is int32"):
        flat_workload(spec)


def test_an_optax_object_is_the_workloads_own_optimizer_and_a_name_takes_the_run_lr():
    import optax

    from akocore.optim import OptaxFlatOptimizer, PlainSGD

    own = flat_workload(_linear(optimizer=optax.adam(1e-3)))
    assert isinstance(own.optimizer("sgd", 0.1), OptaxFlatOptimizer)
    assert any("own optax optimizer" in notice for notice in own.notices)
    named = flat_workload(_linear(optimizer="sgd")).optimizer("adam", 0.25)
    assert isinstance(named, PlainSGD) and named.lr == 0.25


def test_workload_refuses_what_is_not_a_function_or_a_data_source():
    with pytest.raises(TypeError, match="loss must be a function"):
        Workload(init={}, loss=3, evaluate=_accuracy, data=ArrayData(*_arrays()))
    with pytest.raises(TypeError, match="data must be a data source"):
        Workload(init={}, loss=_loss, evaluate=_accuracy, data=np.zeros(3))
    with pytest.raises(ValueError, match="x_train has 100 examples but y_train has 99"):
        x, y, xt, yt = _arrays()
        ArrayData(x, y[:-1], xt, yt)


def test_array_data_gives_disjoint_shards_to_the_ranks():
    data = ArrayData(np.arange(40, dtype=np.float32)[:, None], np.arange(40), np.zeros((2, 1)),
                     np.zeros(2))
    seen = [data.train_batches(rank, 4, 5, seed=0).next().x.ravel() for rank in range(4)]
    assert len(set(np.concatenate(seen).tolist())) == 20


def test_a_batch_factory_feeds_training_and_evaluation():
    x_test, y_test = _arrays()[2:]

    def train(rank, ranks, batch_size, seed):
        rng = np.random.default_rng([seed, rank])
        while True:
            x = rng.normal(size=(batch_size, 6)).astype(np.float32)
            yield x, (x[:, 0] > 0).astype(np.int32)

    spec = Workload(init=_linear().init, loss=_loss, evaluate=_accuracy,
                    data=BatchFactory(train, lambda batch_size: [(x_test, y_test)], "gauss-6"))
    w = flat_workload(spec, batch_size=8)
    stream = w.batches(1, 3)
    stream.skip(2)
    batch = stream.next()
    assert batch.x.shape == (8, 6) and batch.step == 2
    assert 0.0 <= w.evaluate(w.init_params) <= 1.0


def test_a_batch_of_another_shape_is_refused():
    w = flat_workload(_linear(), batch_size=10)
    batch = w.batches(0, 1).next()
    w.grad_step(w.init_params, batch.x, batch.y)
    with pytest.raises(ValueError, match="expected a batch of 10 examples"):
        w.grad_step(w.init_params, batch.x[:, :5], batch.y)


# --------------------------------------------------------------------------- naming


def test_workload_names_take_one_of_three_forms():
    assert parse_workload_name("digits-mlp").builtin == "digits-mlp"
    old = parse_workload_name("synthetic-mlp:train_size=64,hidden=8")
    assert old.builtin == "synthetic-mlp" and dict(old.args) == {"train_size": 64, "hidden": 8}
    module = parse_workload_name("pkg.models:make:width=64", {"depth": 2})
    assert (module.builtin, module.source, module.factory) == (None, "pkg.models", "make")
    assert dict(module.args) == {"width": 64, "depth": 2} and not module.is_file
    assert module.text == "pkg.models:make"
    path = parse_workload_name("./models/mymodel.py:make", {"width": 8})
    assert path.is_file and path.source == "./models/mymodel.py" and dict(path.args) == {
        "width": 8}
    assert parse_workload_args(["width=64", "name=x"]) == {"width": 64, "name": "x"}


@pytest.mark.parametrize("text, message", [
    ("imagenet", "unknown workload 'imagenet'; expected a built-in name"),
    ("mymodel:make=3", "key=value options follow a built-in name"),
    ("mymodel.py:1make", "is not a Python function name"),
    ("digits-mlp:oops", "bad workload option 'oops'"),
])
def test_bad_names_are_one_line_errors(text, message):
    with pytest.raises(WorkloadError, match=message):
        parse_workload_name(text)


FACTORY_FILE = '''
import numpy as np
from akocore import ArrayData, Workload

def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 4)).astype(np.float32)
    return ArrayData(x[:50], (x[:50, 0] > 0).astype(np.int32), x[50:],
                     (x[50:, 0] > 0).astype(np.int32))

def make(width=2, seed=0):
    import optax
    def loss(p, batch, rng):
        x, y = batch
        return optax.softmax_cross_entropy_with_integer_labels(x @ p["w"], y).mean()
    return Workload(init=lambda s: {"w": np.full((4, width), s, np.float32)}, loss=loss,
                    evaluate=lambda p, batch: 0.5, data=_data())

def broken():
    raise RuntimeError("no data here")

def wrong():
    return 42

NOT_A_FUNCTION = 3
'''


@pytest.fixture
def factory_file(tmp_path, monkeypatch):
    (tmp_path / "mymodel.py").write_text(FACTORY_FILE)
    monkeypatch.chdir(tmp_path)
    return tmp_path / "mymodel.py"


def test_a_factory_in_a_file_is_loaded_with_its_arguments_and_the_seed(factory_file):
    w = build_workload("./mymodel.py:make:width=3", seed=2, batch_size=5)
    assert w.name == "./mymodel.py:make" and w.param_count == 12
    np.testing.assert_array_equal(w.init_params, np.full(12, 2, np.float32))
    assert dict(w.options) == {"width": 3}
    flag_wins = build_workload("./mymodel.py:make:width=3", workload_args={"width": 5})
    assert flag_wins.param_count == 20


@pytest.mark.parametrize("text, message", [
    ("./mymodel.py:broken", "workload factory ./mymodel.py:broken raised RuntimeError: "
                            "no data here"),
    ("./mymodel.py:wrong", "returned int, expected an akocore.Workload"),
    ("./mymodel.py:missing", "./mymodel.py has no missing"),
    ("./mymodel.py:NOT_A_FUNCTION", "is a int, not a function"),
    ("./absent.py:make", "no file ./absent.py"),
    ("no_such_package.models:make", "cannot import module no_such_package.models"),
    ("./mymodel.py:make:depth=2", "raised TypeError: .*depth"),
])
def test_a_broken_factory_is_one_line_naming_it(factory_file, text, message):
    with pytest.raises(WorkloadError, match=message) as caught:
        load_workload_spec(parse_workload_name(text))
    assert "\n" not in str(caught.value)


def test_the_fingerprint_tells_workloads_apart_and_agrees_across_builds(factory_file):
    one = workload_fingerprint(build_workload("./mymodel.py:make", batch_size=5))
    assert one == workload_fingerprint(build_workload("./mymodel.py:make", batch_size=5))
    assert one != workload_fingerprint(build_workload("./mymodel.py:make:width=3",
                                                      batch_size=5))
    assert one != workload_fingerprint(build_workload("./mymodel.py:make", batch_size=6))
    assert one != workload_fingerprint(build_workload("digits-mlp", batch_size=5))


def test_the_join_refuses_a_peer_with_another_workload():
    from akorun.runtime.lifecycle.join import Identity
    from akorun.transport.control import ControlError

    ours = Identity(0, "run", "config", "params", workload="mymodel.py:make 1a2b")
    theirs = Identity(1, "run", "config", "params", workload="mymodel.py:make 9f9f")
    ours.check(1, Identity(1, "run", "config", "params", workload="mymodel.py:make 1a2b")
               .payload())
    with pytest.raises(ControlError, match="workload .* mymodel.py:make 9f9f differs from "
                                           "ours mymodel.py:make 1a2b"):
        ours.check(1, theirs.payload())


# --------------------------------------------------------------------------- adapters


def _train_a_little(w, steps=40, lr=0.5):
    optimizer = w.optimizer("sgd", lr)
    params, state = w.init_params, optimizer.init(w.init_params)
    stream = w.batches(0, 1)
    before = w.evaluate_metrics(params)
    for step in range(steps):
        batch = stream.next()
        _, grad = w.grad_step(params, batch.x, batch.y, step)
        params, state = optimizer.apply(params, state, grad)
    return before, w.evaluate_metrics(params)


def test_a_flax_linen_module_trains_through_from_flax():
    from flax import linen as nn

    from akocore.workloads import from_flax

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x, train: bool = False):
            x = nn.relu(nn.Dense(16)(x))
            x = nn.Dropout(0.1, deterministic=not train)(x)
            return nn.Dense(2)(x)

    x, y, xt, yt = _arrays()
    spec = from_flax(MLP(), example_input=x[:1], data=ArrayData(x, y, xt, yt),
                     train_kwargs={"train": True})
    w = flat_workload(spec, batch_size=10, seed=1)
    assert w.param_count == 6 * 16 + 16 + 16 * 2 + 2
    assert not np.array_equal(w.init_params, flat_workload(spec, seed=2).init_params)
    before, after = _train_a_little(w)
    assert after.loss < before.loss and after.accuracy >= 0.85


def test_a_flax_nnx_model_trains_through_from_nnx():
    import jax
    from flax import nnx

    from akocore.workloads import from_nnx

    class MLP(nnx.Module):
        def __init__(self, rngs):
            self.hidden = nnx.Linear(6, 16, rngs=rngs)
            self.out = nnx.Linear(16, 2, rngs=rngs)

        def __call__(self, x):
            return self.out(jax.nn.relu(self.hidden(x)))

    spec = from_nnx(MLP, data=ArrayData(*_arrays()))
    w = flat_workload(spec, batch_size=10, seed=1)
    assert w.param_count == 6 * 16 + 16 + 16 * 2 + 2
    before, after = _train_a_little(w)
    assert after.loss < before.loss and after.accuracy >= 0.85


def test_an_equinox_module_trains_through_from_equinox():
    import equinox as eqx

    from akocore.workloads import from_equinox

    spec = from_equinox(lambda key: eqx.nn.MLP(6, 2, 16, 1, key=key),
                        data=ArrayData(*_arrays()))
    w = flat_workload(spec, batch_size=10, seed=1)
    assert w.param_count == 6 * 16 + 16 + 16 * 2 + 2
    before, after = _train_a_little(w)
    assert after.loss < before.loss and after.accuracy >= 0.85


def _resolved_workload(*argv: str) -> str:
    import argparse

    from akocore.settings.cli_flags import add_shared_arguments, resolve_args

    parser = argparse.ArgumentParser()
    add_shared_arguments(parser)
    return resolve_args(parser.parse_args(list(argv))).config.train.workload


def test_workload_arg_flags_become_the_names_tail_and_win_over_it():
    assert _resolved_workload("--workload", "f.py:make", "--workload-arg", "width=8",
                              "--workload-arg", "depth=2") == "f.py:make:width=8,depth=2"
    assert _resolved_workload("--workload", "f.py:make:width=4", "--workload-arg",
                              "width=8") == "f.py:make:width=4,width=8"
    assert dict(parse_workload_name("f.py:make:width=4,width=8").args) == {"width": 8}
    assert _resolved_workload("--workload-arg", "hidden=8") == "digits-mlp:hidden=8"
    assert _resolved_workload("--workload", "synthetic-mlp:hidden=4", "--workload-arg",
                              "train_size=64") == "synthetic-mlp:hidden=4,train_size=64"


def test_a_bad_workload_arg_is_refused():
    from akocore.settings.normalise import ConfigError

    with pytest.raises(ConfigError, match="--workload-arg 'width': expected key=value"):
        _resolved_workload("--workload-arg", "width")


def test_synthetic_lm_is_a_built_in_of_27m_parameters_and_small_versions_learn():
    import jax

    from akocore.workloads.lm import lm_workload

    full = lm_workload()
    shapes = jax.eval_shape(lambda: jax.tree_util.tree_map(np.asarray, full.init(0)))
    assert sum(int(np.prod(leaf.shape)) for leaf in jax.tree_util.tree_leaves(shapes)) \
        == 27_350_016
    w = build_workload("synthetic-lm:d_model=32,layers=1,heads=2,vocab=64,seq_len=16,"
                       "train_sequences=256,test_sequences=32", batch_size=16)
    optimizer = w.optimizer("adam", 1e-2)
    params, state = w.init_params, optimizer.init(w.init_params)
    stream = w.batches(0, 1)
    before = w.evaluate_metrics(params)
    for step in range(60):
        batch = stream.next()
        _, grad = w.grad_step(params, batch.x, batch.y, step)
        params, state = optimizer.apply(params, state, grad)
    after = w.evaluate_metrics(params)
    assert after.loss < before.loss - 0.5 and after.accuracy > before.accuracy


def test_a_workload_table_in_a_config_file_gives_the_arguments_and_flags_win(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text('[train]\nworkload = "f.py:make:depth=1"\n\n'
                      '[workload]\nwidth = 64\ninput_shape = [8, 8, 1]\nname = "x"\n')
    assert _resolved_workload("--config", str(config)) == \
        "f.py:make:depth=1,width=64,input_shape=8x8x1,name=x"
    flagged = _resolved_workload("--config", str(config), "--workload-arg", "width=8")
    assert dict(parse_workload_name(flagged).args)["width"] == 8
    bad = tmp_path / "bad.toml"
    bad.write_text('[workload]\nwidth = "a,b"\n')
    from akocore.settings.normalise import ConfigError

    with pytest.raises(ConfigError, match="workload argument width"):
        _resolved_workload("--config", str(bad))


def test_the_example_in_the_workload_docstring_builds_and_trains():
    import textwrap

    doc = Workload.__doc__
    code = textwrap.dedent(doc.split("::\n", 1)[1].split("\n    Saved as", 1)[0])
    namespace: dict = {}
    exec(compile(code, "<Workload docstring>", "exec"), namespace)  # noqa: S102
    w = flat_workload(namespace["make"](), batch_size=32)
    assert w.param_count == 8 * 2 + 2
    _, after = _train_a_little(w, steps=30)
    assert after.accuracy >= 0.9


def test_from_flax_takes_its_example_input_from_array_data_and_names_are_checked():
    from flax import linen as nn

    from akocore.workloads import from_flax

    spec = from_flax(nn.Dense(2), data=ArrayData(*_arrays()))
    assert flat_workload(spec).param_count == 6 * 2 + 2
    with pytest.raises(ValueError, match="'rmsprop' is not one of sgd, momentum"):
        _linear(optimizer="rmsprop")


def test_pytree_batches_step_singly_and_stacked_in_akosims_batched_gradients():
    from akosim.sim.sim_training import BatchedGradients

    def train(rank, ranks, batch_size, seed):
        rng = np.random.default_rng([seed, rank])
        while True:
            a = rng.normal(size=(batch_size, 3)).astype(np.float32)
            b = rng.normal(size=(batch_size, 3)).astype(np.float32)
            yield {"a": a, "b": b}, (a[:, 0] > b[:, 0]).astype(np.int32)

    def loss(params, batch, rng):
        import optax

        x, y = batch
        logits = x["a"] @ params["wa"] + x["b"] @ params["wb"]
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    test = [next(train(0, 1, 20, 99))]
    spec = Workload(init={"wa": np.zeros((3, 2), np.float32), "wb": np.zeros((3, 2), np.float32)},
                    loss=loss, evaluate=lambda p, batch: 0.0,
                    data=BatchFactory(train, lambda batch_size: test, "pairs"))
    w = flat_workload(spec, batch_size=4)
    gradients = BatchedGradients(w, [0, 1], seed=0)
    for rank in (0, 1):
        gradients.begin(rank, 0, w.init_params)
    stacked = [gradients.result(rank) for rank in (0, 1)]
    for rank in (0, 1):
        batch = w.batches(rank, 2, 0).next()
        _, single = w.grad_step(w.init_params, batch.x, batch.y, rng_seed=0)
        np.testing.assert_allclose(stacked[rank], single, rtol=1e-5, atol=1e-7)
    assert np.any(stacked[0] != 0)
