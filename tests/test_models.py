"""Tests for akocore.workloads.models: the registry, parameter counts, NumPy init, apply."""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import hashlib
import subprocess
import sys

import numpy as np
import pytest

from akocore.workloads.models import MODEL_NAMES, build_model, count_params, truncated_normal


def _leaves(params):
    import jax

    return jax.tree_util.tree_leaves(params)


def test_seed_cnn_on_cifar_shape_has_exactly_4263434_parameters():
    model = build_model("cnn", (32, 32, 3), 10)
    assert model.param_count() == 4_263_434


def test_cnn_layer_shapes_follow_the_seed_network():
    params = build_model("cnn", (32, 32, 3), 10).init(0)
    shapes = {name: layer["w"].shape for name, layer in params.items()}
    assert shapes == {
        "conv1": (5, 5, 3, 32),
        "conv2": (3, 3, 32, 64),
        "conv3": (3, 3, 64, 64),
        "fc1": (8 * 8 * 64, 1024),
        "fc2": (1024, 10),
    }


def test_mlp_default_hidden_is_64():
    model = build_model("mlp", (8, 8, 1), 10)
    assert count_params(model.init(0)) == 64 * 64 + 64 + 64 * 10 + 10


def test_mlp_hidden_sizes_are_configurable():
    params = build_model("mlp", (20,), 3, hidden=(16, 8)).init(0)
    assert [layer["w"].shape for layer in params] == [(20, 16), (16, 8), (8, 3)]


@pytest.mark.parametrize("name, shape", [("mlp", (8, 8, 1)), ("cnn", (8, 8, 1))])
def test_init_is_identical_for_the_same_seed_and_differs_across_seeds(name, shape):
    model = build_model(name, shape, 10)
    first, again, other = model.init(7), model.init(7), model.init(8)
    for a, b in zip(_leaves(first), _leaves(again), strict=True):
        np.testing.assert_array_equal(a, b)
    weights_differ = [
        not np.array_equal(a, c)
        for a, c in zip(_leaves(first), _leaves(other), strict=True)
        if np.any(a != a.flat[0])  # skip constant leaves (zero biases)
    ]
    assert weights_differ and all(weights_differ)


def test_init_is_float32_numpy_not_jax():
    for leaf in _leaves(build_model("cnn", (8, 8, 1), 10).init(0)):
        assert type(leaf) is np.ndarray
        assert leaf.dtype == np.float32


def _init_digest(seed: int) -> str:
    params = build_model("cnn", (8, 8, 1), 10, fc_units=32).init(seed)
    digest = hashlib.sha256()
    for leaf in _leaves(params):
        digest.update(np.ascontiguousarray(leaf).tobytes())
    return digest.hexdigest()


def test_init_is_identical_in_another_process():
    code = (
        "import hashlib, jax\n"
        "from akocore.workloads.models import build_model\n"
        "p = build_model('cnn', (8, 8, 1), 10, fc_units=32).init(3)\n"
        "d = hashlib.sha256()\n"
        "[d.update(l.tobytes()) for l in jax.tree_util.tree_leaves(p)]\n"
        "print(d.hexdigest())\n"
    )
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert result.stdout.strip() == _init_digest(3)


def test_he_init_scales_weights_by_fan_in_and_zeroes_biases():
    params = build_model("cnn", (32, 32, 3), 10).init(0)
    fc1 = params["fc1"]
    assert np.std(fc1["w"]) == pytest.approx(np.sqrt(2.0 / 4096), rel=0.02)
    assert not fc1["b"].any()


def test_tf_ako_init_uses_sigma_point_one_and_bias_point_one():
    params = build_model("cnn", (8, 8, 1), 10, init="tf.ako").init(0)
    weights = params["fc1"]["w"]
    # a normal truncated at 2 sigma has std 0.8796 sigma
    assert np.std(weights) == pytest.approx(0.1 * 0.8796, rel=0.05)
    assert np.abs(weights).max() <= 0.2 + 1e-6
    np.testing.assert_array_equal(params["conv1"]["b"], np.full(32, 0.1, np.float32))


def test_truncated_normal_stays_within_two_sigma():
    samples = truncated_normal(np.random.default_rng(0), (10_000,), 3.0)
    assert samples.dtype == np.float32
    assert np.abs(samples).max() <= 6.0


def test_unknown_model_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="mlp, cnn"):
        build_model("resnet", (8, 8, 1), 10)
    assert MODEL_NAMES == ("mlp", "cnn")


def test_unknown_model_option_is_refused_with_the_accepted_ones():
    with pytest.raises(ValueError, match="hidden"):
        build_model("mlp", (8,), 10, width=3)


def test_bad_init_scheme_and_non_image_cnn_are_refused():
    with pytest.raises(ValueError, match="he, tf.ako"):
        build_model("mlp", (8,), 10, init="xavier")
    with pytest.raises(ValueError, match="image input"):
        build_model("cnn", (64,), 10)


def test_mlp_flattens_image_input_and_returns_logits():
    import jax

    model = build_model("mlp", (8, 8, 1), 10, hidden=(5,))
    params = model.init(0)
    x = np.random.default_rng(0).random((4, 8, 8, 1), dtype=np.float32)
    logits = jax.jit(lambda p, x: model.apply(p, x, train=False, rng=None))(params, x)
    w0, b0 = params[0]["w"], params[0]["b"]
    w1, b1 = params[1]["w"], params[1]["b"]
    expected = np.maximum(x.reshape(4, -1) @ w0 + b0, 0) @ w1 + b1
    np.testing.assert_allclose(np.asarray(logits), expected, rtol=1e-5, atol=1e-5)


def test_cnn_dropout_acts_in_training_only():
    import jax

    model = build_model("cnn", (8, 8, 1), 4, channels=(4, 4, 4), fc_units=16)
    params = model.init(0)
    x = np.random.default_rng(1).random((3, 8, 8, 1), dtype=np.float32)

    @jax.jit
    def both(params, x, key):
        return (
            model.apply(params, x, train=False, rng=None),
            model.apply(params, x, train=True, rng=key),
        )

    eval_a, train_a = both(params, x, jax.random.PRNGKey(0))
    eval_b, train_b = both(params, x, jax.random.PRNGKey(1))
    assert eval_a.shape == (3, 4)
    np.testing.assert_array_equal(np.asarray(eval_a), np.asarray(eval_b))
    assert not np.allclose(np.asarray(train_a), np.asarray(train_b))
    assert not np.allclose(np.asarray(train_a), np.asarray(eval_a))
