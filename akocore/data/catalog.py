"""Datasets by name and the deterministic per-worker batch order.

This module owns the dataset registry (`load_dataset(name, ...)`,
`DATASET_NAMES`, `DATASET_OPTIONS`) and deciding which examples each worker
sees when: `epoch_batches` and `BatchStream`. The datasets themselves are
loaded by akocore.data.bundled (``digits``, the default real dataset, and
``synthetic``) and akocore.data.files (the user's ``cifar10`` and ``mnist``
files); `Dataset` and `DataError` live in akocore.data.dataset and are re-exported
here.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from akocore.data.bundled import load_digits, load_synthetic
from akocore.data.dataset import DataError, Dataset
from akocore.data.files import load_cifar10, load_mnist

__all__ = [
    "DATASET_NAMES",
    "DATASET_OPTIONS",
    "Batch",
    "BatchStream",
    "DataError",
    "Dataset",
    "batches_per_epoch",
    "epoch_batches",
    "load_dataset",
]


# --------------------------------------------------------------------------
# registry

DATASET_NAMES: tuple[str, ...] = ("digits", "synthetic", "cifar10", "mnist")


def load_dataset(name: str, *, path: str | None = None, seed: int = 0, **options: Any) -> Dataset:
    """The dataset called `name`.

    `path` locates user data (cifar10: the .tar.gz or extracted folder; mnist:
    the IDX directory). `seed` only affects generated data (synthetic).
    Options: synthetic takes train_size, test_size, input_shape, num_classes,
    separation; cifar10 takes trust_data. Unknown names or options raise ValueError.
    """
    if name not in DATASET_NAMES:
        raise ValueError(f"unknown dataset {name!r}; expected one of {', '.join(DATASET_NAMES)}")
    accepted = DATASET_OPTIONS[name]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        expected = ", ".join(accepted) if accepted else "none"
        raise ValueError(
            f"unknown option(s) {', '.join(unknown)} for dataset {name!r}; expected {expected}"
        )
    if name == "digits":
        return load_digits()
    if name == "synthetic":
        return load_synthetic(seed=seed, **options)
    if name == "cifar10":
        return load_cifar10(os.fspath(path) if path is not None else None, **options)
    return load_mnist(os.fspath(path) if path is not None else None)


DATASET_OPTIONS: dict[str, tuple[str, ...]] = {
    "digits": (),
    "synthetic": ("train_size", "test_size", "input_shape", "num_classes", "separation"),
    "cifar10": ("trust_data",),
    "mnist": (),
}


# --------------------------------------------------------------------------
# sharding: which worker sees which examples when


def epoch_batches(
    dataset_size: int, *, worker: int, workers: int, epoch: int, batch_size: int, seed: int
) -> np.ndarray:
    """Index batches of `worker` for `epoch`, shape (num_batches, batch_size), int64.

    Each epoch draws a fresh permutation of all `dataset_size` training indices
    from (seed, epoch), cuts it into `workers` equal disjoint shards of
    dataset_size // workers examples (the few left over are skipped this epoch
    and land elsewhere in the next permutation), and worker takes its shard
    in order, dropping the last partial batch so every batch has the same
    static shape. Every worker has the same number of batches per epoch.
    """
    if workers <= 0 or not 0 <= worker < workers:
        raise ValueError(f"worker must be in [0, {workers}), got worker={worker}")
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    if epoch < 0 or seed < 0:
        raise ValueError(f"epoch and seed must be non-negative, got epoch={epoch}, seed={seed}")
    order = np.random.default_rng([seed, epoch]).permutation(dataset_size)
    shard_size = dataset_size // workers
    shard = order[worker * shard_size : (worker + 1) * shard_size]
    num_batches = shard_size // batch_size
    return shard[: num_batches * batch_size].reshape(num_batches, batch_size)


def batches_per_epoch(dataset_size: int, *, workers: int, batch_size: int) -> int:
    """How many batches each worker gets per epoch (see `epoch_batches`)."""
    return (dataset_size // workers) // batch_size


@dataclass(frozen=True, eq=False)
class Batch:
    """One training batch of one worker: inputs, labels and where it came from."""

    x: np.ndarray
    y: np.ndarray
    epoch: int
    index: int  # batch index within the epoch
    step: int  # batches this stream produced before this one


class BatchStream(Iterator[Batch]):
    """An endless, deterministic stream of one worker's batches across epochs.

    The order depends only on (seed, worker, workers, batch_size), so a
    simulated and a real worker with the same settings see the same data.
    """

    def __init__(
        self, dataset: Dataset, worker: int, workers: int, batch_size: int, seed: int
    ) -> None:
        self.dataset = dataset
        self.worker = worker
        self.workers = workers
        self.batch_size = batch_size
        self.seed = seed
        if workers <= 0 or not 0 <= worker < workers:
            raise ValueError(f"worker must be in [0, {workers}), got worker={worker}")
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.steps_per_epoch = batches_per_epoch(
            dataset.train_size, workers=workers, batch_size=batch_size
        )
        if self.steps_per_epoch == 0:
            raise ValueError(
                f"{dataset.name} has {dataset.train_size} training examples: too few for "
                f"{workers} worker(s) with batch_size {batch_size} (need at least "
                f"{workers * batch_size})"
            )
        self._step = 0
        self._order_epoch = -1
        self._order = np.empty((0, batch_size), dtype=np.int64)

    @property
    def step(self) -> int:
        """How many batches this stream has produced (or skipped) so far."""
        return self._step

    def __iter__(self) -> BatchStream:
        return self

    def __next__(self) -> Batch:
        return self.next()

    def next(self) -> Batch:
        """The next batch, moving to the next epoch when this one is used up."""
        epoch, index = divmod(self._step, self.steps_per_epoch)
        if epoch != self._order_epoch:
            self._order = epoch_batches(
                self.dataset.train_size,
                worker=self.worker,
                workers=self.workers,
                epoch=epoch,
                batch_size=self.batch_size,
                seed=self.seed,
            )
            self._order_epoch = epoch
        indices = self._order[index]
        batch = Batch(
            x=self.dataset.train_x[indices],
            y=self.dataset.train_y[indices],
            epoch=epoch,
            index=index,
            step=self._step,
        )
        self._step += 1
        return batch

    def skip(self, steps: int) -> None:
        """Advance `steps` batches without gathering them (e.g. to resume a run)."""
        if steps < 0:
            raise ValueError(f"cannot skip a negative number of steps ({steps})")
        self._step += steps
