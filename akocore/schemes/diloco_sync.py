"""DiLoCo's outer sync as an all-reduce: a direct reduce-scatter, then an all-gather.

What every DiLoCo users compare against does (torchft's `local_sgd.py` through
its process group, OpenDiLoCo, PCCL, MaxText's `diloco.py` through a psum):
the pseudo-gradients are all-reduced, 2(n-1)/n copies of the fragment leaving
each uplink per sync, not the (n-1) copies of an all-to-all. This module
holds the all-reduce's pure part for `akocore.schemes.diloco.DilocoWorker`:

- the fragment is cut into n contiguous *chunks* (chunk c of [start, stop) is
  [start + c·L//n, start + (c+1)·L//n), L = stop - start; a chunk may be empty
  when L < n, and an empty chunk is never sent);
- **reduce-scatter**: at the sync's start each worker codes every chunk of its
  pseudo-gradient (the run's codec with error feedback, per chunk, as any
  contribution) and sends chunk c to its *owner* (Kind.PSEUDO, part c, p n);
- **all-gather**: the owner of chunk c sums the decoded contributions in rank
  order in float64 (its own included), divides by their count and sends the
  mean to every peer (Kind.PSEUDO_MEAN, part n + c, p the count). It codes the
  mean with the run's codec *without* error feedback (as torchft's quantised
  all-reduce does) and uses the decoded value itself, so every replica applies
  the same values and anchors stay bit-equal;
- each worker applies the sync once it holds every non-empty chunk's mean.

The owner of chunk c is rank c, or, if c is lost (suspended, or stopped
before the sync), the next live rank after c (cyclically): the *successor*.
When a worker's view of who is live changes (a peer suspended or its final
marker read), it re-sends each chunk whose owner changed, so the group
re-forms among the survivors without stalling. Every rank computes the
owners alike when their views agree; if they disagree (one rank suspended a
peer that another still heard), the first mean of a chunk to arrive wins and
a later one is dropped, so a replica never mixes two means of one chunk.
Survivors whose views differed can then hold means with different
contributors (each owner's mean is exact for what it held).

Two rounds of latency per sync against the ring's 2(n-1), the same bytes per
uplink; each worker sends n-1 chunk messages and n-1 mean copies per sync.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from akocore.messages import Partial

OUTER_SYNCS = ("allreduce", "all-to-all")  # exchange.outer_sync
DEFAULT_OUTER_SYNC = "allreduce"


def chunk_bounds(start: int, stop: int, n: int) -> np.ndarray:
    """The n + 1 bounds of the n chunks of [start, stop) (empty chunks when stop - start < n)."""
    return start + (np.arange(n + 1, dtype=np.int64) * (stop - start)) // n


@dataclass
class ChunkState:
    """One sync's all-reduce state on one worker: its chunks, what it holds, where they went."""

    bounds: np.ndarray  # n + 1 absolute offsets
    own: dict[int, Partial] = field(default_factory=dict)  # chunk -> the own coded chunk
    sent_to: dict[int, int] = field(default_factory=dict)  # chunk -> owner it went to
    deltas: dict[int, dict[int, np.ndarray | None]] = field(default_factory=dict)
    means: dict[int, tuple[np.ndarray | None, int]] = field(default_factory=dict)

    def chunk(self, c: int) -> slice:
        return slice(int(self.bounds[c]), int(self.bounds[c + 1]))

    def chunks(self) -> list[int]:
        """The non-empty chunks."""
        return [c for c in range(len(self.bounds) - 1) if self.bounds[c + 1] > self.bounds[c]]

    def complete(self) -> bool:
        return all(c in self.means for c in self.chunks())

    def take_early(self, early: ChunkState) -> None:
        """Merge what arrived before this worker started the sync."""
        for c, senders in early.deltas.items():
            self.deltas.setdefault(c, {}).update(senders)
        for c, mean in early.means.items():
            self.means.setdefault(c, mean)


def mean_of(contributions: dict[int, np.ndarray | None], length: int) -> np.ndarray | None:
    """The float32 mean of `contributions` summed in rank order in float64 (every replica
    and every owner sums alike); None in timing-only mode."""
    if any(values is None for values in contributions.values()):
        return None
    total = np.zeros(length, np.float64)
    for rank in sorted(contributions):
        total += contributions[rank]  # type: ignore[operator]
    return (total / len(contributions)).astype(np.float32)


def owner_of(chunk: int, workers: int, live: list[bool]) -> int:
    """Rank `chunk`, or the next live rank after it: the owner of a chunk. `live[r]` says
    whether rank r takes part in the sync (the asking rank always does)."""
    for step in range(workers):
        rank = (chunk + step) % workers
        if live[rank]:
            return rank
    raise ValueError("no live rank owns the chunk")
