"""The two data sources a user names: numpy arrays, or a function yielding batches.

This module owns `ArrayData` (in-memory arrays, sharded over ranks by
akocore.data.catalog's deterministic per-epoch permutation, the same order the built-in
datasets use) and `BatchFactory` (the user's own batch generator per rank).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from akocore.data.catalog import BatchStream
from akocore.workloads.spec import Batch, batch_pairs


@dataclass(frozen=True, eq=False)
class ArrayData:
    """Training and test examples as numpy arrays (first axis: examples).

    Inputs and targets keep their dtypes (float images, int tokens, int or float
    targets). Each epoch the training set is permuted with the run's seed and
    cut into one disjoint shard per rank; the batch size is the run's
    ``train.batch_size``.

    Example::

        ArrayData(x_train, y_train, x_test, y_test)
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    name: str = "arrays"

    def __post_init__(self) -> None:
        for field_name in ("x_train", "y_train", "x_test", "y_test"):
            value = np.asarray(getattr(self, field_name))
            if value.ndim == 0:
                raise ValueError(f"ArrayData {field_name} must be an array of examples, "
                                 f"got a scalar")
            object.__setattr__(self, field_name, value)
        for split in ("train", "test"):
            xs, ys = getattr(self, f"x_{split}"), getattr(self, f"y_{split}")
            if xs.shape[0] != ys.shape[0]:
                raise ValueError(f"ArrayData x_{split} has {xs.shape[0]} examples but "
                                 f"y_{split} has {ys.shape[0]}")
        if self.x_test.shape[0] == 0:
            raise ValueError("ArrayData needs at least one test example")

    # the attribute names akocore.data.catalog.BatchStream reads
    @property
    def train_x(self) -> np.ndarray:
        return self.x_train

    @property
    def train_y(self) -> np.ndarray:
        return self.y_train

    @property
    def train_size(self) -> int:
        return int(self.x_train.shape[0])

    @property
    def test_size(self) -> int:
        return int(self.x_test.shape[0])

    def train_batches(self, rank: int, ranks: int, batch_size: int, seed: int) -> BatchStream:
        return BatchStream(self, rank, ranks, batch_size, seed)  # type: ignore[arg-type]

    def test_batches(self, batch_size: int) -> Iterator[Batch]:
        for start in range(0, self.test_size, batch_size):
            yield self.x_test[start:start + batch_size], self.y_test[start:start + batch_size]

    def describe(self) -> str:
        def of(array: np.ndarray) -> str:
            return f"{array.dtype}{list(array.shape)}"

        return (f"train x {of(self.x_train)} y {of(self.y_train)}, "
                f"test x {of(self.x_test)} y {of(self.y_test)}")


@dataclass(frozen=True)
class FactoryBatch:
    """One batch of a `BatchFactory` stream."""

    x: Any
    y: Any
    step: int


class _FactoryStream:
    """A `BatchFactory`'s iterator seen as a stream with next() and skip()."""

    def __init__(self, batches: Iterable[Batch], origin: str) -> None:
        self._iterator = iter(batches)
        self._origin = origin
        self._step = 0

    def next(self) -> FactoryBatch:
        try:
            x, y = next(self._iterator)
        except StopIteration:
            raise ValueError(f"{self._origin}: the training batches ran out after "
                             f"{self._step}; the train function must yield without end"
                             ) from None
        batch = FactoryBatch(x, y, self._step)
        self._step += 1
        return batch

    def skip(self, steps: int) -> None:
        if steps < 0:
            raise ValueError(f"cannot skip a negative number of steps ({steps})")
        for _ in range(steps):
            self.next()


@dataclass(frozen=True, eq=False)
class BatchFactory:
    """Batches from the user's own functions.

    ``train(rank, ranks, batch_size, seed)`` yields ``(inputs, targets)`` pairs for
    one rank without end; the ranks' streams must not overlap and must depend only
    on the arguments. ``test(batch_size)`` yields the test set once. ``description``
    names the data in the workload fingerprint (e.g. its shapes and size).

    Example::

        def train(rank, ranks, batch_size, seed):
            rng = np.random.default_rng([seed, rank])
            while True:
                x = rng.normal(size=(batch_size, 8)).astype(np.float32)
                yield x, (x[:, 0] > 0).astype(np.int32)

        BatchFactory(train, test=lambda batch_size: [(x_test, y_test)],
                     description="gaussian 8-d")
    """

    train: Callable[[int, int, int, int], Iterable[Batch]]
    test: Callable[[int], Iterable[Any]]
    description: str = ""

    def train_batches(self, rank: int, ranks: int, batch_size: int,
                      seed: int) -> _FactoryStream:
        return _FactoryStream(self.train(rank, ranks, batch_size, seed),
                              getattr(self.train, "__name__", "BatchFactory"))

    def test_batches(self, batch_size: int) -> Iterator[Batch]:
        return batch_pairs(self.test(batch_size))

    def describe(self) -> str:
        return self.description or getattr(self.train, "__qualname__", "batch factory")
