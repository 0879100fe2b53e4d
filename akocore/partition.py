"""Flat vector <-> p contiguous, near-equal partitions.

Partition k of p over a vector of length D is the k-th chunk of
numpy.array_split: the first D % p chunks hold one element more. Partitions
never depend on layer shapes, so any model works and chunks are balanced.
"""

from __future__ import annotations

import numpy as np


class PartitionError(ValueError):
    """p does not fit the vector (p < 1, or more partitions than elements)."""


def check_p(length: int, p: int) -> None:
    if not isinstance(p, int | np.integer) or p < 1:
        raise PartitionError(f"p must be an integer >= 1, got {p!r}")
    if p > length:
        raise PartitionError(
            f"p={p} is larger than the gradient ({length} elements): "
            f"every partition needs at least one element, so p <= {length}"
        )


def partition_bounds(length: int, p: int) -> np.ndarray:
    """Offsets [b_0=0, b_1, ..., b_p=length] of the p chunks (array_split rule)."""
    check_p(length, p)
    base, extra = divmod(length, p)
    sizes = np.full(p, base, dtype=np.int64)
    sizes[:extra] += 1
    bounds = np.zeros(p + 1, dtype=np.int64)
    np.cumsum(sizes, out=bounds[1:])
    return bounds


def partition_slice(length: int, p: int, k: int) -> tuple[int, int]:
    """(start, stop) of partition k of p, without building all bounds."""
    check_p(length, p)
    if not 0 <= k < p:
        raise PartitionError(f"partition index {k} out of range for p={p}")
    base, extra = divmod(length, p)
    start = k * base + min(k, extra)
    return start, start + base + (1 if k < extra else 0)


def accumulate_and_take(unsent: np.ndarray, grad: np.ndarray, start: int,
                        stop: int) -> np.ndarray:
    """Add a gradient to the unsent buffers, take partition [start, stop) out.

    The hot path of an ako round: one pass to accumulate, a copy of the partition
    that goes on the wire, and its buffer reset.
    """
    np.add(unsent, grad, out=unsent)
    part = unsent[start:stop].copy()
    unsent[start:stop] = 0.0
    return part
