"""Tests for akocore.workloads.flat: flat params, gradient steps, evaluation, registry."""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import struct
import time

import numpy as np
import pytest

from akocore.data.catalog import DataError
from akocore.optim import OptaxFlatOptimizer, PlainSGD
from akocore.process_setup import enable_compilation_cache
from akocore.workloads import flat as workload_module
from akocore.workloads.flat import (
    WORKLOAD_NAMES,
    build_workload,
    flatten_params,
    parse_workload_spec,
)

TINY = "synthetic-mlp:train_size=64,test_size=37,input_shape=4x4x1,hidden=8,num_classes=3"


@pytest.fixture(scope="module")
def digits_mlp():
    return build_workload("digits-mlp", batch_size=32, seed=0)


@pytest.fixture(scope="module")
def tiny():
    return build_workload(TINY, batch_size=5, seed=1)


def test_gradient_bytes_is_four_bytes_per_parameter(digits_mlp):
    assert digits_mlp.param_count == 64 * 64 + 64 + 64 * 10 + 10
    assert digits_mlp.gradient_bytes == 4 * digits_mlp.param_count
    assert digits_mlp.init_params.shape == (digits_mlp.param_count,)
    assert digits_mlp.init_params.dtype == np.float32


def test_synthetic_cnn_is_the_seed_cnn_with_4263434_parameters():
    w = build_workload("synthetic-cnn:train_size=16,test_size=16", batch_size=104)
    assert w.param_count == 4_263_434
    assert w.gradient_bytes == 4 * 4_263_434
    assert w.data.input_shape == (32, 32, 3) and w.data.num_classes == 10


def test_init_params_are_ravel_pytree_of_the_numpy_init(tiny):
    from jax.flatten_util import ravel_pytree

    reference, _ = ravel_pytree(tiny.spec.init(tiny.seed))
    np.testing.assert_array_equal(tiny.init_params, np.asarray(reference))
    params = tiny.unravel(tiny.init_params)
    np.testing.assert_array_equal(flatten_params(params)[0], tiny.init_params)


def test_init_is_identical_for_the_same_seed_and_differs_across_seeds(digits_mlp):
    again = build_workload("digits-mlp", seed=0)
    other = build_workload("digits-mlp", seed=1)
    np.testing.assert_array_equal(digits_mlp.init_params, again.init_params)
    assert not np.array_equal(digits_mlp.init_params, other.init_params)


def test_grad_step_matches_jax_grad_on_the_pytree(tiny):
    import jax
    import optax

    batch = tiny.batches(0, 1).next()
    flat = tiny.init_params + np.float32(0.01)  # move off the zero biases

    def loss_fn(params):  # the built-in's loss, written out
        x = params[0]["w"].dtype.type(0) + batch.x.reshape(len(batch.x), -1)
        logits = jax.nn.relu(x @ params[0]["w"] + params[0]["b"]) @ params[1]["w"]
        logits = logits + params[1]["b"]
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch.y).mean()

    params = tiny.unravel(flat)
    expected_loss, expected_grads = jax.value_and_grad(loss_fn)(params)
    expected, _ = flatten_params(jax.tree_util.tree_map(np.asarray, expected_grads))
    loss, grad = tiny.grad_step(flat, batch.x, batch.y, rng_seed=0)
    assert isinstance(loss, float)
    assert loss == pytest.approx(float(expected_loss), rel=1e-5)
    assert grad.dtype == np.float32 and grad.shape == (tiny.param_count,)
    np.testing.assert_allclose(grad, expected, rtol=1e-4, atol=1e-6)


def test_grad_step_agrees_with_a_finite_difference(tiny):
    batch = tiny.batches(0, 1).next()
    flat = tiny.init_params.astype(np.float64)
    _, grad = tiny.grad_step(tiny.init_params, batch.x, batch.y)
    direction = np.random.default_rng(0).standard_normal(tiny.param_count)
    direction /= np.linalg.norm(direction)
    eps = 1e-2
    plus, _ = tiny.grad_step((flat + eps * direction).astype(np.float32), batch.x, batch.y)
    minus, _ = tiny.grad_step((flat - eps * direction).astype(np.float32), batch.x, batch.y)
    assert (plus - minus) / (2 * eps) == pytest.approx(float(grad @ direction), rel=2e-2)


def test_batched_grad_step_equals_per_replica_grad_step(tiny):
    replicas = 3
    stream = tiny.batches(0, 1)
    batches = [stream.next() for _ in range(replicas)]
    rng = np.random.default_rng(2)
    stack = tiny.init_params + 0.05 * rng.standard_normal((replicas, tiny.param_count))
    stack = stack.astype(np.float32)
    xs = np.stack([b.x for b in batches])
    ys = np.stack([b.y for b in batches])
    losses, grads = tiny.batched_grad_step(stack, xs, ys, rng_seeds=[0, 1, 2])
    assert losses.shape == (replicas,) and grads.shape == (replicas, tiny.param_count)
    for r in range(replicas):
        loss, grad = tiny.grad_step(stack[r], xs[r], ys[r], rng_seed=r)
        assert losses[r] == pytest.approx(loss, rel=1e-5)
        np.testing.assert_allclose(grads[r], grad, rtol=1e-5, atol=1e-6)


def test_grad_step_refuses_another_batch_size_or_param_length(tiny):
    batch = tiny.batches(0, 1).next()
    with pytest.raises(ValueError, match="expected a batch"):
        tiny.grad_step(tiny.init_params, batch.x[:3], batch.y[:3])
    with pytest.raises(ValueError, match=f"D={tiny.param_count}"):
        tiny.grad_step(tiny.init_params[:-1], batch.x, batch.y)


def test_plain_sgd_on_digits_reaches_90_percent_test_accuracy(digits_mlp):
    optimizer = digits_mlp.optimizer("sgd", 0.2)
    params, state = digits_mlp.init_params, optimizer.init(digits_mlp.init_params)
    stream = digits_mlp.batches(worker=0, workers=1)
    assert digits_mlp.evaluate(params) < 0.5
    for step in range(400):
        batch = stream.next()
        _, grad = digits_mlp.grad_step(params, batch.x, batch.y, rng_seed=step)
        params, state = optimizer.apply(params, state, grad)
    assert digits_mlp.evaluate(params) >= 0.9
    assert digits_mlp.evaluate_loss(params) < 0.5


def test_evaluate_in_chunks_equals_a_direct_computation(monkeypatch):
    import jax
    import optax

    monkeypatch.setattr(workload_module, "EVAL_CHUNK_VALUES", 16 * 10)  # 10 examples a chunk
    w = build_workload(TINY, batch_size=5, seed=1)
    flat = w.init_params + np.float32(0.1)
    params = w.unravel(flat)
    x = w.data.x_test.reshape(len(w.data.x_test), -1)
    logits = np.asarray(jax.nn.relu(x @ params[0]["w"] + params[0]["b"]) @ params[1]["w"]
                        + params[1]["b"])
    assert w.eval_batch_size == 10
    metrics = w.evaluate_metrics(flat)
    expected_loss = optax.softmax_cross_entropy_with_integer_labels(logits, w.data.y_test)
    assert metrics.accuracy == pytest.approx(np.mean(logits.argmax(1) == w.data.y_test))
    assert metrics.loss == pytest.approx(float(np.mean(expected_loss)), rel=1e-5)
    assert w.evaluate(flat) == metrics.accuracy


def test_cnn_workload_steps_with_dropout_seeded_by_rng_seed():
    w = build_workload("digits-cnn:channels=4x4x4,fc_units=16", batch_size=8)
    batch = w.batches(0, 1).next()
    _, a = w.grad_step(w.init_params, batch.x, batch.y, rng_seed=1)
    _, b = w.grad_step(w.init_params, batch.x, batch.y, rng_seed=1)
    _, c = w.grad_step(w.init_params, batch.x, batch.y, rng_seed=2)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert 0.0 <= w.evaluate(w.init_params) <= 1.0


def test_optimizers_by_name(tiny):
    sgd = tiny.optimizer("sgd", 0.5)
    assert isinstance(sgd, PlainSGD) and sgd.lr == 0.5
    update = np.ones(tiny.param_count, np.float32)
    params, _ = sgd.apply(tiny.init_params, sgd.init(tiny.init_params), update)
    np.testing.assert_allclose(params, tiny.init_params - 0.5)
    for name in ("momentum", "adam"):
        optimizer = tiny.optimizer(name, 0.1)
        assert isinstance(optimizer, OptaxFlatOptimizer)
        params, _ = optimizer.apply(tiny.init_params, optimizer.init(tiny.init_params), update)
        assert params.shape == tiny.init_params.shape and params.dtype == np.float32
        assert np.all(params < tiny.init_params)
    with pytest.raises(ValueError, match="sgd, momentum, adam"):
        tiny.optimizer("rmsprop", 0.1)


def test_measure_compute_s_is_a_positive_duration(tiny):
    measured_s = tiny.measure_compute_s(time.perf_counter, steps=2)  # its median: a fake
    assert measured_s > 0.0 and np.isfinite(measured_s)  # clock's in test_fidelity_fixes


def test_batches_use_the_workload_batch_size_and_seed(tiny):
    stream = tiny.batches(worker=1, workers=2)
    assert stream.batch_size == 5 and stream.seed == tiny.seed and stream.worker == 1
    assert stream.next().x.shape == (5, 4, 4, 1)


def test_workload_spec_parsing():
    name, options = parse_workload_spec(
        "synthetic-mlp:train_size=2000,input_shape=16x16x1,hidden=128x64,init=tf.ako,x=0.5,b=true"
    )
    assert name == "synthetic-mlp"
    assert options == {
        "train_size": 2000,
        "input_shape": (16, 16, 1),
        "hidden": (128, 64),
        "init": "tf.ako",
        "x": 0.5,
        "b": True,
    }
    with pytest.raises(ValueError, match="key=value"):
        parse_workload_spec("digits-mlp:oops")


def test_spec_options_reach_the_dataset_and_model(tiny):
    assert tiny.data.train_size == 64 and tiny.data.input_shape == (4, 4, 1)
    assert tiny.param_count == 16 * 8 + 8 + 8 * 3 + 3
    keyword = build_workload("synthetic-mlp:train_size=64", test_size=8, input_shape=(2, 2, 1))
    assert keyword.data.test_size == 8 and keyword.data.input_shape == (2, 2, 1)


def test_unknown_workload_or_option_is_refused():
    with pytest.raises(ValueError, match="digits-mlp, digits-cnn"):
        build_workload("imagenet-resnet")
    with pytest.raises(ValueError, match="unknown option.*expected some of"):
        build_workload("digits-mlp:train_size=3")
    assert "synthetic-cnn" in WORKLOAD_NAMES and "mnist-mlp" in WORKLOAD_NAMES


def test_user_data_workloads_need_a_data_path():
    with pytest.raises(DataError, match="cifar-10-python.tar.gz"):
        build_workload("cifar10-cnn")
    with pytest.raises(DataError, match="mnist needs path"):
        build_workload("mnist-mlp")


def test_mnist_mlp_builds_from_idx_files(tmp_path):
    rng = np.random.default_rng(0)
    for stem, shape in [
        ("train-images-idx3-ubyte", (40, 28, 28)),
        ("train-labels-idx1-ubyte", (40,)),
        ("t10k-images-idx3-ubyte", (10, 28, 28)),
        ("t10k-labels-idx1-ubyte", (10,)),
    ]:
        array = rng.integers(0, 10 if len(shape) == 1 else 256, shape, dtype=np.uint8)
        header = struct.pack(">I", 0x0800 | len(shape)) + struct.pack(f">{len(shape)}I", *shape)
        (tmp_path / stem).write_bytes(header + array.tobytes())
    w = build_workload("mnist-mlp", data_path=tmp_path, batch_size=8)
    assert w.param_count == 784 * 128 + 128 + 128 * 10 + 10


def test_enable_compilation_cache_sets_the_jax_options(tmp_path):
    import jax

    before = (
        jax.config.jax_compilation_cache_dir,
        jax.config.jax_persistent_cache_min_compile_time_secs,
    )
    try:
        enable_compilation_cache(tmp_path / "jax-cache")
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "jax-cache")
        assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.0  # every entry
        assert (tmp_path / "jax-cache").is_dir()
    finally:
        jax.config.update("jax_compilation_cache_dir", before[0])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", before[1])
