"""The flat view of a workload: initial flat params and a jitted gradient step.

This module owns what a worker computes. `build_workload` names a workload (a
built-in or the user's factory, akocore.workloads.naming) and `flat_workload`
turns any `akocore.Workload` into the flat-vector view the schemes work with, a
`FlatWorkload`: `init_params` (one float32 vector of length D in
`jax.flatten_util.ravel_pytree` leaf order, identical in every process),
`grad_step` (loss and flat float32 gradient of one batch, one jitted function
compiled once per workload), `batched_grad_step` (the same step vmapped over R
replicas, for simulating many workers in one process), `evaluate` (test
accuracy), `optimizer` (a FlatOptimizer by name, or the workload's own optax
transformation) and `params_tree` (a trained vector back as the workload's own
pytree). The leaf order both ways is akocore.workloads.param_tree's.

Parameters of another floating dtype (bfloat16, float16, float64) are held as
float32 and cast back to their dtype at the edge, when the user's loss and
evaluation are called (and by `params_tree`); `FlatWorkload.notices` says so in
one line for the shell to print.

`measure_compute_s` times gradient steps with a clock the shell hands it
(akosim.planning.compute and akorun pass time.perf_counter), as many as
akocore.workloads.step_timing says for both shells: akocore reads no clock
itself, and the shells feed the number to the planner and the simulator.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from akocore.messages import FLOAT_BYTES
from akocore.optim import FlatOptimizer, OptaxFlatOptimizer, optimizer_by_name
from akocore.workloads.builtin import BUILTIN_NAMES
from akocore.workloads.models import Params
from akocore.workloads.naming import (
    WorkloadError,
    load_workload_spec,
    parse_options,
    parse_workload_name,
)
from akocore.workloads.param_tree import cast_back, flatten_params
from akocore.workloads.spec import TrainBatches, Workload, accuracy_and_loss
from akocore.workloads.step_timing import MEASURE_STEPS, MEASURE_WARMUP

EVAL_CHUNK_VALUES = 1 << 21  # input values per evaluation batch (bounds memory)
WORKLOAD_NAMES: tuple[str, ...] = BUILTIN_NAMES
DEFAULT_WORKLOAD = "digits-mlp"


# --------------------------------------------------------------------------
# the flat workload



@dataclass(eq=False)
class _Compiled:
    """Jitted functions of one workload and the batch layout it was first given (private).

    `grad` takes the float32 parameter pytree (views of the flat vector) and gives the
    gradient's leaves; `batched_grad` takes and gives flat (R, D) stacks."""

    grad: Any
    batched_grad: Any
    evaluate: Any
    batch_layout: tuple[Any, ...] | None = None


@dataclass(frozen=True, eq=False)
class EvalResult:
    """Test-set metrics of one parameter vector (loss None when evaluate gives none)."""

    accuracy: float
    loss: float | None


@dataclass(frozen=True, eq=False)
class FlatWorkload:
    """A `Workload` and a batch size, seen as flat float32 vectors.

    `init_params` is read-only; `grad_step` returns a fresh gradient vector.
    """

    name: str
    spec: Workload
    batch_size: int
    seed: int
    param_count: int
    init_params: np.ndarray
    unravel: Callable[[Any], Params]
    gradient_bytes: int
    param_layout: tuple[tuple[tuple[int, ...], str], ...]  # (shape, dtype) per leaf
    options: tuple[tuple[str, Any], ...] = ()
    notices: tuple[str, ...] = ()  # one line each, for the shell to print
    eval_batch_size: int = 1
    _compiled: _Compiled | None = field(default=None, repr=False)

    @property
    def data(self) -> Any:
        """The workload's data source."""
        return self.spec.data

    @property
    def examples_per_step(self) -> int:
        """Training examples in one gradient step (an island's: every device's batch)."""
        return self.batch_size

    @property
    def _fns(self) -> _Compiled:
        if self._compiled is None:
            raise RuntimeError("FlatWorkload was not built by flat_workload()")
        return self._compiled

    # ---- gradients

    def grad_step(
        self, flat_params: np.ndarray, x: Any, y: Any, rng_seed: int = 0
    ) -> tuple[float, np.ndarray]:
        """(loss, flat float32 gradient) of one training batch (x, y).

        Every leaf of `x` and `y` has `batch_size` examples along its first axis,
        and every batch the shape of the first one (another shape would recompile);
        `rng_seed` seeds the loss's PRNG key (dropout).
        """
        params = self._check_params(flat_params, stacked=False)
        x, y = self._check_batch(x, y, leading=())
        # the pytree of NumPy views goes in and the gradient's leaves come out: the
        # slicing and the concatenation stay out of XLA, whose CPU client would split
        # those 4-byte-per-parameter copies over its thread pool (ranks sharing cores,
        # or a busy machine, then wait on descheduled pool threads: 20x the step)
        loss, leaves = self._fns.grad(self.unravel(params), x, y,
                                      np.uint32(rng_seed % (1 << 32)))
        return float(loss), np.concatenate([np.asarray(leaf).reshape(-1) for leaf in leaves])

    def batched_grad_step(
        self,
        flat_params_stack: np.ndarray,
        xs: Any,
        ys: Any,
        rng_seeds: Any,
    ) -> tuple[np.ndarray, np.ndarray]:
        """grad_step for R replicas at once: losses (R,) and gradients (R, D).

        `flat_params_stack` is (R, D), `xs` and `ys` R batches stacked on a new first
        axis, `rng_seeds` R ints. Compiles once per distinct R.
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
        """Accuracy on the whole test set (the workload's evaluate, no dropout)."""
        return self.evaluate_metrics(flat_params).accuracy

    def evaluate_loss(self, flat_params: np.ndarray) -> float | None:
        """Mean test loss, when the workload's evaluate reports one."""
        return self.evaluate_metrics(flat_params).loss

    def evaluate_metrics(self, flat_params: np.ndarray) -> EvalResult:
        """Test accuracy and loss, averaged over test batches weighted by their size."""
        params = self._check_params(flat_params, stacked=False)
        evaluate = self._fns.evaluate
        count = 0
        accuracy_sum = 0.0
        loss_sum: float | None = 0.0
        for x, y in self.spec.data.test_batches(self.eval_batch_size):
            size = _examples(x)
            accuracy, loss = evaluate(params, x, y)
            accuracy_sum += float(accuracy) * size
            loss_sum = None if loss is None or loss_sum is None else loss_sum + float(loss) * size
            count += size
        if count == 0:
            raise ValueError(f"{self.name}: the test data yielded no examples")
        return EvalResult(accuracy=accuracy_sum / count,
                          loss=None if loss_sum is None else loss_sum / count)

    # ---- the user's pytree

    def params_tree(self, flat_params: np.ndarray) -> Params:
        """`flat_params` (a trained replica, D float32 values) as the workload's own pytree:
        the structure and shapes `init` returns, NumPy leaves in the parameters' own dtypes
        (float32 cast back to bfloat16 or float16 where `init` gave those). The leaves are
        a copy: writing into them changes nothing of `flat_params`."""
        import jax.numpy as jnp

        array = np.array(self._check_params(flat_params, stacked=False))
        dtypes = tuple(jnp.dtype(dtype) for _, dtype in self.param_layout)
        return cast_back(self.unravel(array), dtypes)

    # ---- training helpers

    def optimizer(self, name: str, lr: float) -> FlatOptimizer:
        """The workload's own optax transformation if it has one, else the optimizer
        `name` at `lr` (a workload naming one uses its name at `lr`): "sgd" (exact
        NumPy PlainSGD), "momentum" (optax sgd, 0.9), "adam" or "adagrad" (optax), "muon"
        (optax.contrib.muon on the parameter pytree)."""
        own = self.spec.optimizer
        if own is not None and not isinstance(own, str):
            return OptaxFlatOptimizer(own)
        return optimizer_by_name(own or name, lr, unravel=self.unravel)

    def batches(self, worker: int, workers: int, seed: int | None = None) -> TrainBatches:
        """The endless batch stream of `worker` of `workers` (seed defaults to the workload's)."""
        return self.spec.data.train_batches(worker, workers, self.batch_size,
                                            self.seed if seed is None else seed)

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

    def _check_batch(self, x: Any, y: Any, *, leading: tuple[int, ...]) -> tuple[Any, Any]:
        import jax

        leaves, treedef = jax.tree_util.tree_flatten((x, y))
        arrays = [np.asarray(leaf) for leaf in leaves]
        layout = (treedef, tuple((a.shape[len(leading):], a.dtype.str) for a in arrays))
        fns = self._fns
        expected = (*leading, self.batch_size)
        bad_size = any(a.shape[:len(expected)] != expected for a in arrays)
        if bad_size or (fns.batch_layout is not None and layout != fns.batch_layout):
            first = fns.batch_layout
            shapes = [(*leading, *shape) for shape, _ in first[1]] if first else None
            raise ValueError(
                f"{self.name}: expected a batch of {self.batch_size} examples"
                + (f" shaped {shapes}" if shapes else "")
                + f"; got {[a.shape for a in arrays]}")
        if fns.batch_layout is None:
            fns.batch_layout = layout
        return jax.tree_util.tree_unflatten(treedef, arrays)


def _examples(x: Any) -> int:
    import jax

    return int(np.shape(jax.tree_util.tree_leaves(x)[0])[0])


def tree_grad_fn(spec: Workload, dtypes: tuple[Any, ...]) -> Callable[..., tuple[Any, list[Any]]]:
    """The traceable gradient: (float32 params pytree, x, y, seed) -> (loss, float32 gradient
    leaves in ravel_pytree order); the user's loss sees its parameters' own `dtypes`."""
    import jax
    import jax.numpy as jnp

    def tree_grad(params: Params, x: Any, y: Any, seed: Any) -> tuple[Any, list[Any]]:
        """Loss and the float32 gradient leaves, in ravel_pytree order, of float32 params."""
        key = jax.random.PRNGKey(seed)

        def loss_fn(params: Params) -> Any:
            out = spec.loss(cast_back(params, dtypes), (x, y), key)
            value = out[0] if isinstance(out, tuple) else out
            return jnp.asarray(value, dtype=jnp.float32)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        return loss, [leaf.astype(jnp.float32) for leaf in jax.tree_util.tree_leaves(grads)]

    return tree_grad


def _compile(spec: Workload, unravel: Callable[[Any], Params],
             dtypes: tuple[Any, ...]) -> _Compiled:
    """The jitted gradient, vmapped gradient and evaluation functions of a workload."""
    import jax
    import jax.numpy as jnp

    tree_grad = tree_grad_fn(spec, dtypes)

    def to_user(flat: Any) -> Params:
        """float32 leaves -> the user's dtypes (the edge cast; a no-op for float32)."""
        return cast_back(unravel(flat), dtypes)

    def flat_grad(flat: Any, x: Any, y: Any, seed: Any) -> tuple[Any, Any]:
        loss, leaves = tree_grad(unravel(flat), x, y, seed)
        return loss, jnp.concatenate([jnp.ravel(leaf) for leaf in leaves])

    def evaluate(flat: Any, x: Any, y: Any) -> tuple[Any, Any]:
        accuracy, loss = accuracy_and_loss(spec.evaluate(to_user(flat), (x, y)))
        return (jnp.asarray(accuracy, jnp.float32),
                None if loss is None else jnp.asarray(loss, jnp.float32))

    return _Compiled(
        grad=jax.jit(tree_grad),
        batched_grad=jax.jit(jax.vmap(flat_grad)),
        evaluate=jax.jit(evaluate),
    )


# --------------------------------------------------------------------------
# building


def initial_params(spec: Workload, seed: int) -> Params:
    """The workload's initial pytree: `init` itself, or `init(seed)` / `init(PRNGKey(seed))`."""
    init = spec.init
    if not callable(init):
        return init
    import inspect

    try:
        first = next(iter(inspect.signature(init).parameters), "")
    except (TypeError, ValueError):
        first = ""
    if first in ("key", "rng", "prng_key", "rngs"):
        import jax

        return init(jax.random.PRNGKey(seed))
    return init(seed)


def flat_workload(spec: Workload, *, batch_size: int = 32, seed: int = 0,
                  options: Mapping[str, Any] | None = None) -> FlatWorkload:
    """`spec` as a FlatWorkload ready to step: its parameters flattened to float32.

    `seed` builds the initial parameters and orders the data; every process with
    the same arguments gets the same `init_params`. Raises WorkloadError (one line)
    when the parameters are not a pytree of floating-point arrays.
    """
    import jax

    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    name = spec.name or "workload"
    try:
        params = initial_params(spec, seed)
    except Exception as error:  # the user's init: any failure is one line
        raise WorkloadError(f"{name}: init raised {type(error).__name__}: {error}") from None
    leaves = jax.tree_util.tree_leaves(params)
    if not leaves:
        raise WorkloadError(f"{name}: init returned no parameter arrays "
                            f"(got {type(params).__name__})")
    dtypes = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        dtype = np.dtype(getattr(leaf, "dtype", np.asarray(leaf).dtype))
        if not jax.numpy.issubdtype(dtype, jax.numpy.floating):
            raise WorkloadError(f"{name}: parameter {jax.tree_util.keystr(path)} is {dtype}; "
                                f"parameters must be floating-point arrays")
        dtypes.append(dtype)
    flat, unravel = flatten_params(params)
    flat.setflags(write=False)
    layout = tuple((tuple(int(d) for d in np.shape(leaf)), dtype.name)
                   for leaf, dtype in zip(leaves, dtypes, strict=True))
    others = sorted({dtype.name for dtype in dtypes if dtype != np.float32})
    notices: tuple[str, ...] = ()
    if others:
        notices = (f"{name}: parameters in {', '.join(others)} are held and exchanged as "
                   f"float32 and cast back to {', '.join(others)} for each step",)
    own = spec.optimizer
    if own is not None and not isinstance(own, str):
        notices += (f"{name}: trains with its own optax optimizer; train.optimizer and "
                    f"train.lr are not used",)
    param_count = int(flat.size)
    example = _example_values(spec.data)
    eval_batch_size = spec.eval_batch_size or (
        max(1, EVAL_CHUNK_VALUES // example) if example else batch_size)
    return FlatWorkload(
        name=name,
        spec=spec,
        batch_size=int(batch_size),
        seed=int(seed),
        param_count=param_count,
        init_params=flat,
        unravel=unravel,
        gradient_bytes=FLOAT_BYTES * param_count,
        param_layout=layout,
        options=tuple(sorted((options or {}).items())),
        notices=notices,
        eval_batch_size=eval_batch_size,
        _compiled=_compile(spec, unravel, tuple(dtypes)),
    )


def _example_values(data: Any) -> int:
    """Input values per test example, when the data source holds arrays (else 0)."""
    x_test = getattr(data, "x_test", None)
    if isinstance(x_test, np.ndarray) and x_test.ndim >= 1 and x_test.shape[0]:
        return max(1, int(np.prod(x_test.shape[1:])))
    return 0


def build_workload(
    name: str = DEFAULT_WORKLOAD,
    *,
    batch_size: int = 32,
    seed: int = 0,
    data_path: str | os.PathLike[str] | None = None,
    workload_args: Mapping[str, Any] | None = None,
    **options: Any,
) -> FlatWorkload:
    """The workload `name`, ready to step: a built-in ("digits-mlp",
    "synthetic-mlp:train_size=2000"), "package.module:factory" or "file.py:factory".

    `workload_args` (and keyword `options`) go to the built-in's dataset and model or
    to the factory; `seed` builds the initial parameters (and synthetic data). Every
    process with the same arguments gets the same `init_params`. Unknown names or
    options and broken factories raise WorkloadError (a ValueError); missing or bad
    data files akocore.data.catalog.DataError.
    """
    parsed = parse_workload_name(name, {**(workload_args or {}), **options})
    spec = load_workload_spec(parsed, seed=seed,
                              data_path=os.fspath(data_path) if data_path is not None else None)
    return flat_workload(spec, batch_size=batch_size, seed=seed, options=dict(parsed.args))


def parse_workload_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """ "name:key=value,key=value" -> (name, options) (the built-ins' option form)."""
    base, _, rest = spec.partition(":")
    return base.strip(), parse_options(rest, spec)


# --------------------------------------------------------------------------
# fingerprint


def workload_fingerprint(workload: FlatWorkload) -> str:
    """A hex digest of what every rank must share: the workload's name and arguments,
    its parameters' shapes and dtypes, its batch size and its data's shapes.

    Two ranks that loaded different files, factories, arguments or data get
    different fingerprints (their parameters may still hash the same).
    """
    record = {
        "workload": workload.name,
        "args": [[key, repr(value)] for key, value in workload.options],
        "params": [[list(shape), dtype] for shape, dtype in workload.param_layout],
        "batch_size": workload.batch_size,
        "data": workload.spec.data.describe(),
    }
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()
