"""The workload protocol: what a user (or a built-in) hands the toolkit to train.

This module owns `Workload`, the one public description of a training job, and
`DataSource`, the protocol its data follows. A workload is five things:

- ``init``: the initial parameters, any JAX pytree of floating-point arrays, or a
  function building them from the run's seed (``init(seed: int)``; a function whose
  first parameter is named ``key`` or ``rng`` gets ``jax.random.PRNGKey(seed)``
  instead). Every rank calls it with the same seed and must get the same values.
- ``loss``: ``loss(params, batch, rng) -> loss`` or ``-> (loss, metrics)``, a scalar
  to minimise; ``batch`` is the pair ``(inputs, targets)`` the data yields, ``rng``
  a PRNG key drawn per rank and round (for dropout).
- ``evaluate``: ``evaluate(params, batch) -> accuracy`` or a mapping holding
  ``"accuracy"`` (and optionally ``"loss"``), averaged over the test batches
  weighted by their size; the accuracy is what ``target_accuracy`` stops on.
- ``data``: a `DataSource` (``ArrayData`` for numpy arrays, ``BatchFactory`` for a
  function yielding each rank's batches).
- ``optimizer``: None (the run's ``train.optimizer`` and ``train.lr``), a name
  (``"sgd"``, ``"momentum"``, ``"adam"``, ``"adagrad"``, ``"muon"`` at ``train.lr``) or an optax
  ``GradientTransformation`` (used as given, its own learning rate).

Inside, parameters are one flat float32 vector (``jax.flatten_util.ravel_pytree``
order); akocore.workloads.flat builds that view from a `Workload`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

Batch = tuple[Any, Any]  # (inputs, targets): arrays or pytrees of arrays
OPTIMIZER_NAMES: tuple[str, ...] = ("sgd", "momentum", "adam", "adagrad", "muon")


@runtime_checkable
class TrainBatches(Protocol):
    """One rank's endless stream of training batches."""

    def next(self) -> Any:
        """The next batch: an object with ``x`` and ``y`` (inputs and targets)."""
        ...

    def skip(self, steps: int) -> None:
        """Advance `steps` batches without producing them (resuming a run)."""
        ...


@runtime_checkable
class DataSource(Protocol):
    """Where a workload's batches come from, sharded by rank.

    `train_batches` must give disjoint data to the `ranks` ranks and depend only
    on its arguments (every process of a run builds the same order);
    `test_batches` covers the whole test set once; `describe` is a short text of
    the data's shapes and sizes (part of the workload fingerprint).
    """

    def train_batches(self, rank: int, ranks: int, batch_size: int,
                      seed: int) -> TrainBatches: ...

    def test_batches(self, batch_size: int) -> Iterable[Batch]: ...

    def describe(self) -> str: ...


@dataclass(frozen=True, eq=False)
class Workload:
    """A model, its loss, its evaluation, its data and its optimizer: what is trained.

    Example (a plain JAX linear classifier on numpy arrays)::

        import jax, jax.numpy as jnp, numpy as np, optax
        from akocore import Workload
        from akocore.workloads import ArrayData

        def make():
            rng = np.random.default_rng(0)
            x = rng.normal(size=(512, 8)).astype(np.float32)
            y = (x[:, 0] > 0).astype(np.int32)

            def logits(params, x):
                return x @ params["w"] + params["b"]

            def loss(params, batch, rng):
                x, y = batch
                return optax.softmax_cross_entropy_with_integer_labels(
                    logits(params, x), y).mean()

            def evaluate(params, batch):
                x, y = batch
                return jnp.mean(jnp.argmax(logits(params, x), -1) == y)

            return Workload(
                init=lambda seed: {"w": np.zeros((8, 2), np.float32),
                                   "b": np.zeros(2, np.float32)},
                loss=loss, evaluate=evaluate,
                data=ArrayData(x[:384], y[:384], x[384:], y[384:]))

    Saved as ``mymodel.py``, it trains with ``akorun launch --workload
    ./mymodel.py:make --workers 3`` and is planned with ``akosim --workload
    ./mymodel.py:make``.
    """

    init: Any  # a pytree, or a function of the seed (or of a PRNG key) returning one
    loss: Callable[..., Any]
    evaluate: Callable[..., Any]
    data: DataSource
    optimizer: Any = None  # None | a name | an optax GradientTransformation
    name: str = ""  # shown in messages; the loader sets it to how the workload was named
    eval_batch_size: int | None = None  # test examples per evaluation call; None = sized
    # from the test inputs (about 2M input values a call)

    def __post_init__(self) -> None:
        if not callable(self.loss):
            raise TypeError(f"Workload loss must be a function (params, batch, rng) -> loss, "
                            f"got {type(self.loss).__name__}")
        if not callable(self.evaluate):
            raise TypeError(f"Workload evaluate must be a function (params, batch) -> "
                            f"accuracy, got {type(self.evaluate).__name__}")
        if not isinstance(self.data, DataSource):
            raise TypeError(f"Workload data must be a data source (akocore.workloads."
                            f"ArrayData or BatchFactory), got {type(self.data).__name__}")
        optimizer = self.optimizer
        if isinstance(optimizer, str) and optimizer not in OPTIMIZER_NAMES:
            raise ValueError(f"Workload optimizer {optimizer!r} is not one of "
                             f"{', '.join(OPTIMIZER_NAMES)}; or give an optax transformation")
        if not (optimizer is None or isinstance(optimizer, str)
                or (hasattr(optimizer, "init") and hasattr(optimizer, "update"))):
            raise TypeError(f"Workload optimizer must be None, a name or an optax "
                            f"GradientTransformation, got {type(optimizer).__name__}")


def accuracy_and_loss(result: Any) -> tuple[Any, Any | None]:
    """(accuracy, loss or None) of what an evaluate function returned."""
    if isinstance(result, Mapping):
        if "accuracy" not in result:
            raise ValueError(f"evaluate returned a mapping without 'accuracy' "
                             f"(keys: {', '.join(map(str, result)) or 'none'})")
        return result["accuracy"], result.get("loss")
    return result, None


def batch_pairs(batches: Iterable[Any]) -> Iterator[Batch]:
    """(x, y) pairs of test batches given as pairs or as objects with x and y."""
    for batch in batches:
        if hasattr(batch, "x") and hasattr(batch, "y"):
            yield batch.x, batch.y
        else:
            x, y = batch
            yield x, y
