"""The built-in workloads, each one factory returning a `Workload` like a user's.

This module owns the names (`BUILTIN_NAMES`): digits-mlp (the default, real
data), digits-cnn, synthetic-mlp, synthetic-cnn (the seed's CNN on 32x32x3,
exactly 4,263,434 parameters), cifar10-cnn and mnist-mlp (these two need
``data_path``), and synthetic-lm (akocore.workloads.lm: a 27M-parameter transformer
language model on a corpus it generates). The others are a model of akocore.workloads.models on
a dataset of akocore.data.catalog, trained on mean softmax cross-entropy and evaluated on test
accuracy. Options
(``synthetic-mlp:train_size=2000,hidden=128x64`` or ``--workload-arg``) go to the
dataset or the model.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from akocore.data.catalog import DATASET_OPTIONS, Dataset, load_dataset
from akocore.workloads.models import Model, build_model, model_options
from akocore.workloads.sources import ArrayData
from akocore.workloads.spec import Workload


@dataclass(frozen=True)
class _Recipe:
    dataset: str
    model: str
    model_defaults: tuple[tuple[str, Any], ...] = ()


_RECIPES: dict[str, _Recipe] = {
    "digits-mlp": _Recipe("digits", "mlp", (("hidden", (64,)),)),
    "digits-cnn": _Recipe("digits", "cnn", (("fc_units", 256),)),
    "synthetic-mlp": _Recipe("synthetic", "mlp", (("hidden", (64,)),)),
    "synthetic-cnn": _Recipe("synthetic", "cnn"),
    "cifar10-cnn": _Recipe("cifar10", "cnn"),
    "mnist-mlp": _Recipe("mnist", "mlp", (("hidden", (128,)),)),
}

BUILTIN_NAMES: tuple[str, ...] = (*_RECIPES, "synthetic-lm")


@dataclass(frozen=True, eq=False)
class ClassifierData(ArrayData):
    """A built-in dataset as ArrayData, keeping its class count and input shape."""

    num_classes: int = 0
    input_shape: tuple[int, ...] = ()


def classifier_workload(model: Model, dataset: Dataset) -> Workload:
    """`model` on `dataset`: mean cross-entropy loss, test accuracy (and loss) evaluation."""

    def loss(params: Any, batch: Any, rng: Any) -> Any:
        import optax

        x, y = batch
        logits = model.apply(params, x, train=True, rng=rng)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    def evaluate(params: Any, batch: Any) -> dict[str, Any]:
        import jax.numpy as jnp
        import optax

        x, y = batch
        logits = model.apply(params, x, train=False, rng=None)
        return {"accuracy": jnp.mean(jnp.argmax(logits, axis=-1) == y),
                "loss": optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()}

    data = ClassifierData(dataset.train_x, dataset.train_y, dataset.test_x, dataset.test_y,
                          name=dataset.name, num_classes=dataset.num_classes,
                          input_shape=dataset.input_shape)
    return Workload(init=model.init, loss=loss, evaluate=evaluate, data=data)


def builtin_workload(name: str, *, seed: int = 0, data_path: str | None = None,
                     **options: Any) -> Workload:
    """The built-in workload `name` with its dataset and model `options`.

    `seed` only shapes generated data (synthetic); `data_path` locates the user's
    files of cifar10 and mnist. Unknown names or options raise ValueError, missing
    or bad data files akocore.data.catalog.DataError.
    """
    if name == "synthetic-lm":
        from akocore.workloads.lm import LM_OPTIONS, lm_workload

        unknown = sorted(set(options) - set(LM_OPTIONS))
        if unknown:
            raise ValueError(f"unknown option(s) {', '.join(unknown)} for workload {name!r}; "
                             f"expected some of {', '.join(LM_OPTIONS)}")
        return lm_workload(seed=seed, **options)
    try:
        recipe = _RECIPES[name]
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; expected one of "
                         f"{', '.join(BUILTIN_NAMES)}") from None
    dataset_keys = DATASET_OPTIONS[recipe.dataset]
    model_keys = model_options(recipe.model)
    unknown = sorted(set(options) - set(dataset_keys) - set(model_keys))
    if unknown:
        raise ValueError(
            f"unknown option(s) {', '.join(unknown)} for workload {name!r}; expected some of "
            f"{', '.join((*dataset_keys, *model_keys))}")
    dataset = load_dataset(
        recipe.dataset, path=os.fspath(data_path) if data_path is not None else None,
        seed=seed, **{k: v for k, v in options.items() if k in dataset_keys})
    model_kwargs = {**dict(recipe.model_defaults),
                    **{k: v for k, v in options.items() if k in model_keys}}
    model = build_model(recipe.model, dataset.input_shape, dataset.num_classes, **model_kwargs)
    return classifier_workload(model, dataset)
