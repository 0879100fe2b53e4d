"""Workloads: model + dataset + batch size -> initial flat params and a gradient step.

This module owns what a worker computes. A `Workload` turns a model
(akocore.models) and a dataset (akocore.data) into the flat-vector view the
schemes work with: `init_params` (one float32 vector of length D, built with
NumPy from the seed, identical in every process), `grad_step` (loss and flat
float32 gradient of one batch, one jitted function compiled once per
workload), `batched_grad_step` (the same step vmapped over R replicas, for
simulating many workers in one process), `evaluate` (test accuracy) and
`optimizer` (a FlatOptimizer by name).

`measure_compute_s` times gradient steps with a clock the shell hands it
(akosim.compute and akorun pass time.perf_counter): akocore reads no clock
itself, and the shells feed the number to the planner and the simulator.

Workloads by name (`WORKLOAD_NAMES`): digits-mlp (the default, real data),
digits-cnn, synthetic-mlp, synthetic-cnn (the seed's CNN on 32x32x3, exactly
4,263,434 parameters), cifar10-cnn and mnist-mlp (these two need
`data_path`). A name may carry options: ``synthetic-mlp:train_size=2000,
input_shape=16x16x1,hidden=128x64``.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from akocore.data import DATASET_OPTIONS, BatchStream, Dataset, load_dataset
from akocore.messages import FLOAT_BYTES
from akocore.models import Model, Params, build_model, model_options
from akocore.optim import FlatOptimizer, OptaxFlatOptimizer, PlainSGD

OPTIMIZER_NAMES: tuple[str, ...] = ("sgd", "momentum", "adam", "adagrad")
EVAL_CHUNK_VALUES = 1 << 21  # input floats per evaluation chunk (bounds memory)


# --------------------------------------------------------------------------
# flat <-> pytree


def flatten_params(params: Params) -> tuple[np.ndarray, Callable[[Any], Params]]:
    """(flat float32 vector, unravel) with the leaf order of jax.flatten_util.ravel_pytree.

    Done in NumPy so building a workload compiles nothing. `unravel` slices
    and reshapes; it works on NumPy arrays (returning views) and inside jit.
    """
    import jax

    leaves, treedef = jax.tree_util.tree_flatten(params)
    shapes = [tuple(np.shape(leaf)) for leaf in leaves]
    bounds = np.cumsum([0, *(int(np.prod(s)) for s in shapes)]).tolist()
    flat = np.concatenate([np.asarray(leaf, dtype=np.float32).ravel() for leaf in leaves])

    def unravel(vector: Any) -> Params:
        if vector.shape != (bounds[-1],):
            raise ValueError(f"expected a flat vector of shape ({bounds[-1]},), got {vector.shape}")
        parts = [
            vector[start:stop].reshape(shape)
            for start, stop, shape in zip(bounds[:-1], bounds[1:], shapes, strict=True)
        ]
        return jax.tree_util.tree_unflatten(treedef, parts)

    return flat, unravel


# --------------------------------------------------------------------------
# the workload


MEASURE_STEPS = 20  # timed gradient steps of measure_compute_s (median)
MEASURE_WARMUP = 3  # untimed steps first: compile, then settle

@dataclass(eq=False)
class _Compiled:
    """Jitted functions and lazily placed device data of one workload (private)."""

    grad: Any
    batched_grad: Any
    evaluate: Any
    eval_chunk: int
    test_device: tuple[Any, Any, Any] | None = None


@dataclass(frozen=True, eq=False)
class EvalResult:
    """Test-set metrics of one parameter vector."""

    accuracy: float
    loss: float


@dataclass(frozen=True, eq=False)
class Workload:
    """A model, a dataset and a batch size, seen as flat float32 vectors.

    `init_params` is read-only; `grad_step` returns read-only gradient arrays
    (zero-copy views of JAX buffers): copy before writing into them.
    """

    name: str
    model: Model
    dataset: Dataset
    batch_size: int
    seed: int
    param_count: int
    init_params: np.ndarray
    unravel: Callable[[Any], Params]
    gradient_bytes: int
    options: tuple[tuple[str, Any], ...] = ()
    _compiled: _Compiled | None = field(default=None, repr=False)

    @property
    def _fns(self) -> _Compiled:
        if self._compiled is None:
            raise RuntimeError("Workload was not built by build_workload()")
        return self._compiled

    # ---- gradients

    def grad_step(
        self, flat_params: np.ndarray, x: np.ndarray, y: np.ndarray, rng_seed: int = 0
    ) -> tuple[float, np.ndarray]:
        """(mean cross-entropy loss, flat float32 gradient) of one training batch.

        `x` is (batch_size, *input_shape), `y` (batch_size,) class indices;
        `rng_seed` seeds dropout. Other batch sizes are refused (they would
        recompile).
        """
        params = self._check_params(flat_params, stacked=False)
        x, y = self._check_batch(x, y, leading=())
        loss, grad = self._fns.grad(params, x, y, np.uint32(rng_seed % (1 << 32)))
        return float(loss), np.asarray(grad)

    def batched_grad_step(
        self,
        flat_params_stack: np.ndarray,
        xs: np.ndarray,
        ys: np.ndarray,
        rng_seeds: Any,
    ) -> tuple[np.ndarray, np.ndarray]:
        """grad_step for R replicas at once: losses (R,) and gradients (R, D).

        `flat_params_stack` is (R, D), `xs` (R, batch_size, *input_shape), `ys`
        (R, batch_size), `rng_seeds` R ints. Compiles once per distinct R.
        """
        params = self._check_params(flat_params_stack, stacked=True)
        replicas = params.shape[0]
        xs, ys = self._check_batch(xs, ys, leading=(replicas,))
        seeds = np.asarray(rng_seeds, dtype=np.int64).reshape(-1)
        if seeds.shape != (replicas,):
            raise ValueError(f"expected {replicas} rng seeds, got {seeds.shape[0]}")
        seeds = (seeds % (1 << 32)).astype(np.uint32)
        losses, grads = self._fns.batched_grad(params, xs, ys, seeds)
        return np.asarray(losses), np.asarray(grads)

    # ---- evaluation

    def evaluate(self, flat_params: np.ndarray) -> float:
        """Accuracy on the whole test set (evaluation mode: no dropout)."""
        return self.evaluate_metrics(flat_params).accuracy

    def evaluate_loss(self, flat_params: np.ndarray) -> float:
        """Mean cross-entropy on the whole test set."""
        return self.evaluate_metrics(flat_params).loss

    def evaluate_metrics(self, flat_params: np.ndarray) -> EvalResult:
        """Test accuracy and mean loss in one pass, in chunks of bounded memory."""
        params = self._check_params(flat_params, stacked=False)
        fns = self._fns
        if fns.test_device is None:
            fns.test_device = _chunked_test_set(self.dataset, fns.eval_chunk)
        xs, ys, mask = fns.test_device
        correct, loss_sum = fns.evaluate(params, xs, ys, mask)
        count = self.dataset.test_size
        return EvalResult(accuracy=float(correct) / count, loss=float(loss_sum) / count)

    # ---- training helpers

    def optimizer(self, name: str, lr: float) -> FlatOptimizer:
        """ "sgd" (exact NumPy PlainSGD), "momentum" (optax sgd, 0.9) or "adam" (optax)."""
        if name == "sgd":
            return PlainSGD(lr)
        if name == "momentum":
            import optax

            return OptaxFlatOptimizer(optax.sgd(lr, momentum=0.9))
        if name == "adam":
            import optax

            return OptaxFlatOptimizer(optax.adam(lr))
        if name == "adagrad":  # DOWNPOUR's worker optimizer in the Dist-TF guide
            import optax

            return OptaxFlatOptimizer(optax.adagrad(lr))
        raise ValueError(
            f"unknown optimizer {name!r}; expected one of {', '.join(OPTIMIZER_NAMES)}"
        )

    def batches(self, worker: int, workers: int, seed: int | None = None) -> BatchStream:
        """The endless batch stream of `worker` of `workers` (seed defaults to the workload's)."""
        return BatchStream(
            self.dataset, worker, workers, self.batch_size, self.seed if seed is None else seed
        )

    def measure_compute_s(self, clock: Callable[[], float], steps: int = MEASURE_STEPS,
                          warmup: int = MEASURE_WARMUP,
                          enough: Callable[[list[float]], bool] | None = None) -> float:
        """Median seconds of one grad_step over `steps` timed steps, read from `clock`
        (a monotonic clock in seconds, e.g. time.perf_counter, chosen by the shell).

        `warmup` untimed steps go first (the first compiles the step, the next ones
        let caches and thread pools settle); each timed step uses its own batch and
        rng seed, as training does, and the median ignores the odd slow step (a
        scheduler hiccup on a shared machine). `enough`, if given, sees the step
        times so far after each timed step and ends the timing early when it says
        True (a stopping rule, e.g. the median known closely enough); `steps` is then
        the most that are timed.
        """
        if steps < 1:
            raise ValueError(f"steps must be at least 1, got {steps}")
        if warmup < 1:
            raise ValueError(f"warmup must be at least 1 (it compiles), got {warmup}")
        stream = self.batches(0, 1)
        batches = [stream.next() for _ in range(min(steps, 8))]
        for step in range(warmup):
            batch = batches[step % len(batches)]
            self.grad_step(self.init_params, batch.x, batch.y, step)
        durations_s = []
        for step in range(steps):
            batch = batches[step % len(batches)]
            start_s = clock()
            self.grad_step(self.init_params, batch.x, batch.y, warmup + step)
            durations_s.append(clock() - start_s)
            if enough is not None and enough(list(durations_s)):
                break
        return statistics.median(durations_s)

    # ---- checks

    def _check_params(self, flat: np.ndarray, *, stacked: bool) -> np.ndarray:
        array = np.asarray(flat, dtype=np.float32)
        ok = array.ndim == 2 if stacked else array.ndim == 1
        if not ok or array.shape[-1] != self.param_count:
            expected = "(R, D)" if stacked else "(D,)"
            raise ValueError(
                f"{self.name}: expected parameters of shape {expected} with "
                f"D={self.param_count}, got {array.shape}"
            )
        return array

    def _check_batch(
        self, x: np.ndarray, y: np.ndarray, *, leading: tuple[int, ...]
    ) -> tuple[np.ndarray, np.ndarray]:
        x = np.asarray(x, dtype=np.float32)
        y = np.asarray(y, dtype=np.int32)
        x_shape = (*leading, self.batch_size, *self.model.input_shape)
        y_shape = (*leading, self.batch_size)
        if x.shape != x_shape or y.shape != y_shape:
            raise ValueError(
                f"{self.name}: expected a batch x{x_shape}, y{y_shape}; got x{x.shape}, y{y.shape}"
            )
        return x, y


def _chunked_test_set(dataset: Dataset, chunk: int) -> tuple[Any, Any, Any]:
    """Test set padded to whole chunks and placed on the device once."""
    import jax

    count = dataset.test_size
    chunks = -(-count // chunk)
    padded = chunks * chunk
    xs = np.zeros((padded, *dataset.input_shape), dtype=np.float32)
    xs[:count] = dataset.test_x
    ys = np.zeros(padded, dtype=np.int32)
    ys[:count] = dataset.test_y
    mask = np.zeros(padded, dtype=bool)
    mask[:count] = True
    return (
        jax.device_put(xs.reshape(chunks, chunk, *dataset.input_shape)),
        jax.device_put(ys.reshape(chunks, chunk)),
        jax.device_put(mask.reshape(chunks, chunk)),
    )


def _compile(model: Model, unravel: Callable[[Any], Params], eval_chunk: int) -> _Compiled:
    """The jitted gradient, vmapped gradient and evaluation functions of a model."""
    import jax
    import jax.numpy as jnp
    import optax

    def flat_grad(flat: Any, x: Any, y: Any, seed: Any) -> tuple[Any, Any]:
        key = jax.random.PRNGKey(seed)

        def loss_fn(params: Params) -> Any:
            logits = model.apply(params, x, train=True, rng=key)
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

        loss, grads = jax.value_and_grad(loss_fn)(unravel(flat))
        leaves = jax.tree_util.tree_leaves(grads)
        return loss, jnp.concatenate([jnp.ravel(leaf) for leaf in leaves])

    def evaluate(flat: Any, xs: Any, ys: Any, mask: Any) -> tuple[Any, Any]:
        params = unravel(flat)

        def chunk_stats(chunk: tuple[Any, Any, Any]) -> tuple[Any, Any]:
            x, y, valid = chunk
            logits = model.apply(params, x, train=False, rng=None)
            losses = optax.softmax_cross_entropy_with_integer_labels(logits, y)
            hits = jnp.argmax(logits, axis=-1) == y
            return (
                jnp.sum(jnp.where(valid, hits, False)),
                jnp.sum(jnp.where(valid, losses, 0.0)),
            )

        hits, losses = jax.lax.map(chunk_stats, (xs, ys, mask))
        return jnp.sum(hits), jnp.sum(losses)

    return _Compiled(
        grad=jax.jit(flat_grad),
        batched_grad=jax.jit(jax.vmap(flat_grad)),
        evaluate=jax.jit(evaluate),
        eval_chunk=eval_chunk,
    )


# --------------------------------------------------------------------------
# registry


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

WORKLOAD_NAMES: tuple[str, ...] = tuple(_RECIPES)
DEFAULT_WORKLOAD = "digits-mlp"


def parse_workload_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """ "name:key=value,key=value" -> (name, options).

    Values: "16x16x1" -> (16, 16, 1), "64" -> 64, "0.5" -> 0.5,
    "true"/"false" -> bool, anything else stays a string.
    """
    name, _, rest = spec.partition(":")
    options: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ValueError(
                f"bad workload option {item!r} in {spec!r}; expected key=value, "
                "e.g. synthetic-mlp:train_size=2000,input_shape=16x16x1"
            )
        options[key.strip()] = _parse_value(value.strip())
    return name.strip(), options


def _parse_value(text: str) -> Any:
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    parts = lowered.split("x")
    if len(parts) > 1 and all(p.isdigit() for p in parts):
        return tuple(int(p) for p in parts)
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text


def build_workload(
    name: str = DEFAULT_WORKLOAD,
    *,
    batch_size: int = 32,
    seed: int = 0,
    data_path: str | os.PathLike[str] | None = None,
    **options: Any,
) -> Workload:
    """The workload `name` (optionally "name:key=value,..."), ready to step.

    `seed` builds the initial parameters (and synthetic data); every process
    with the same arguments gets the same `init_params`. Options go to the
    dataset (synthetic: train_size, test_size, input_shape, num_classes,
    separation; cifar10: trust_data) or the model (mlp: hidden, init; cnn:
    channels, fc_units, keep_prob, init); keyword options override the ones in
    the name. Unknown names or options raise ValueError; missing or bad data
    files raise akocore.data.DataError.
    """
    base, spec_options = parse_workload_spec(name)
    try:
        recipe = _RECIPES[base]
    except KeyError:
        raise ValueError(
            f"unknown workload {base!r}; expected one of {', '.join(WORKLOAD_NAMES)}"
        ) from None
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    merged = {**spec_options, **options}
    dataset_keys = DATASET_OPTIONS[recipe.dataset]
    model_keys = model_options(recipe.model)
    unknown = sorted(set(merged) - set(dataset_keys) - set(model_keys))
    if unknown:
        raise ValueError(
            f"unknown option(s) {', '.join(unknown)} for workload {base!r}; expected some of "
            f"{', '.join((*dataset_keys, *model_keys))}"
        )
    dataset = load_dataset(
        recipe.dataset,
        path=os.fspath(data_path) if data_path is not None else None,
        seed=seed,
        **{k: v for k, v in merged.items() if k in dataset_keys},
    )
    model_kwargs: Mapping[str, Any] = {
        **dict(recipe.model_defaults),
        **{k: v for k, v in merged.items() if k in model_keys},
    }
    model = build_model(recipe.model, dataset.input_shape, dataset.num_classes, **model_kwargs)
    flat, unravel = flatten_params(model.init(seed))
    flat.setflags(write=False)
    param_count = int(flat.size)
    eval_chunk = max(
        1, min(dataset.test_size, EVAL_CHUNK_VALUES // int(np.prod(model.input_shape)))
    )
    return Workload(
        name=base,
        model=model,
        dataset=dataset,
        batch_size=int(batch_size),
        seed=int(seed),
        param_count=param_count,
        init_params=flat,
        unravel=unravel,
        gradient_bytes=FLOAT_BYTES * param_count,
        options=tuple(sorted(merged.items())),
        _compiled=_compile(model, unravel, eval_chunk),
    )
