"""A Flax CNN on numpy arrays this script makes: the "bring your own model" example.

Train it on 3 local ranks, then plan it on a slow network:

    akorun launch --workload examples/flax_cnn/mymodel.py:make --workers 3 --rounds 50
    akosim --workload examples/flax_cnn/mymodel.py:make --workers 8 --bandwidth 100mbps

Arguments of `make` are given after the factory (``mymodel.py:make:channels=16``)
or with ``--workload-arg channels=16``. The data are 12x12 grey images of four
classes (a bright bar in one of four places, under noise), generated from a fixed
seed so that every rank builds the same arrays; ArrayData shards them by rank.
Needs Flax: pip install 'ako-toolkit[flax]'.
"""

from __future__ import annotations

import numpy as np
from flax import linen as nn

from akocore import ArrayData, Workload
from akocore.workloads import from_flax

CLASSES = 4


class CNN(nn.Module):
    """conv 3x3 -> relu -> avg pool -> conv 3x3 -> relu -> avg pool -> dense -> logits."""

    channels: int = 8

    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(self.channels, (3, 3))(x))
        x = nn.avg_pool(x, (2, 2), (2, 2))
        x = nn.relu(nn.Conv(2 * self.channels, (3, 3))(x))
        x = nn.avg_pool(x, (2, 2), (2, 2))
        return nn.Dense(CLASSES)(x.reshape(x.shape[0], -1))


def bar_images(count: int, size: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """`count` noisy size x size x 1 images with a bright bar whose place is the class."""
    labels = rng.integers(0, CLASSES, count).astype(np.int32)
    images = rng.normal(0.0, 0.5, (count, size, size, 1)).astype(np.float32)
    half = size // 2
    for index, label in enumerate(labels):
        row = (label // 2) * half + half // 2
        col = (label % 2) * half
        images[index, row, col:col + half, 0] += 2.0
    return images, labels


def make(train_size: int = 1200, test_size: int = 300, image_size: int = 12,
         channels: int = 8) -> Workload:
    """The workload: this CNN on freshly generated bar images (the same on every rank)."""
    rng = np.random.default_rng(2026)  # fixed: the data must not depend on the rank
    x_train, y_train = bar_images(train_size, image_size, rng)
    x_test, y_test = bar_images(test_size, image_size, rng)
    return from_flax(CNN(channels), example_input=x_train[:1],
                     data=ArrayData(x_train, y_train, x_test, y_test, name="bars"))
