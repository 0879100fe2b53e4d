"""An Equinox MLP on numpy arrays this script makes, and the same model in plain JAX.

    akorun launch --workload examples/equinox_mlp/mymodel.py:make --workers 3 --rounds 50
    akosim --workload examples/equinox_mlp/mymodel.py:make --workers 8 --bandwidth 100mbps
    akorun launch --workload examples/equinox_mlp/mymodel.py:make_plain --workers 3

The task: points in 16 dimensions whose class is the quadrant of their first two
coordinates, generated from a fixed seed so every rank builds the same arrays.
`make` needs Equinox (pip install 'ako-toolkit[equinox]'); `make_plain` needs
nothing beyond JAX: a Workload is any init, loss and evaluate function.
"""

from __future__ import annotations

import numpy as np

from akocore import ArrayData, Workload

FEATURES = 16
CLASSES = 4


def quadrant_points(count: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    x = rng.normal(size=(count, FEATURES)).astype(np.float32)
    y = ((x[:, 0] > 0).astype(np.int32) * 2 + (x[:, 1] > 0)).astype(np.int32)
    return x, y


def arrays(train_size: int, test_size: int) -> ArrayData:
    rng = np.random.default_rng(7)  # fixed: the data must not depend on the rank
    x_train, y_train = quadrant_points(train_size, rng)
    x_test, y_test = quadrant_points(test_size, rng)
    return ArrayData(x_train, y_train, x_test, y_test, name="quadrants")


def make(width: int = 64, depth: int = 2, train_size: int = 2000,
         test_size: int = 500) -> Workload:
    """An eqx.nn.MLP built from the run's seed (the factory's key)."""
    import equinox as eqx

    from akocore.workloads import from_equinox

    return from_equinox(
        lambda key: eqx.nn.MLP(FEATURES, CLASSES, width, depth, key=key),
        data=arrays(train_size, test_size))


def make_plain(width: int = 64, train_size: int = 2000, test_size: int = 500) -> Workload:
    """The same task with a one-hidden-layer MLP written in jax.numpy: no adapter."""
    import jax
    import jax.numpy as jnp
    import optax

    def init(seed: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(seed)
        return {"w1": (rng.normal(size=(FEATURES, width)) / np.sqrt(FEATURES)).astype(np.float32),
                "b1": np.zeros(width, np.float32),
                "w2": (rng.normal(size=(width, CLASSES)) / np.sqrt(width)).astype(np.float32),
                "b2": np.zeros(CLASSES, np.float32)}

    def logits(params, x):
        hidden = jax.nn.relu(x @ params["w1"] + params["b1"])
        return hidden @ params["w2"] + params["b2"]

    def loss(params, batch, rng):
        x, y = batch
        return optax.softmax_cross_entropy_with_integer_labels(logits(params, x), y).mean()

    def evaluate(params, batch):
        x, y = batch
        return {"accuracy": jnp.mean(jnp.argmax(logits(params, x), -1) == y),
                "loss": loss(params, batch, None)}

    return Workload(init=init, loss=loss, evaluate=evaluate,
                    data=arrays(train_size, test_size))
