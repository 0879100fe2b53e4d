"""What a dataset is: `Dataset` (float32 inputs, int32 labels, in memory) and `DataError`.

The loaders (akocore.data.bundled, akocore.data.files) build one with
`make_dataset`; akocore.data.catalog names them and shards them over workers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class DataError(ValueError):
    """A dataset could not be loaded: missing path or file, bad format, bad checksum."""


@dataclass(frozen=True, eq=False)
class Dataset:
    """An in-memory classification dataset.

    `train_x`/`test_x` are float32 of shape (N, *input_shape) (NHWC for
    images); `train_y`/`test_y` are int32 class indices in [0, num_classes).
    """

    name: str
    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    num_classes: int
    input_shape: tuple[int, ...]

    @property
    def train_size(self) -> int:
        return int(self.train_x.shape[0])

    @property
    def test_size(self) -> int:
        return int(self.test_x.shape[0])


def make_dataset(
    name: str,
    train_x: np.ndarray,
    train_y: np.ndarray,
    test_x: np.ndarray,
    test_y: np.ndarray,
    num_classes: int,
) -> Dataset:
    return Dataset(
        name=name,
        train_x=np.ascontiguousarray(train_x, dtype=np.float32),
        train_y=np.ascontiguousarray(train_y, dtype=np.int32),
        test_x=np.ascontiguousarray(test_x, dtype=np.float32),
        test_y=np.ascontiguousarray(test_y, dtype=np.int32),
        num_classes=int(num_classes),
        input_shape=tuple(int(d) for d in train_x.shape[1:]),
    )
