"""The stated bound on one akorun rank's peak memory (resident set), term by term.

This module owns `memory_bound`: the bytes an ako rank may hold at its peak, as a sum of
terms each derived from the code that allocates it (docs/reference/memory.md gives the
same formula with its derivation). D is the number of parameters (float32), n the
workers, p_j a worker's partitions, s the SSP bound:

- workload: what a bare process holds that builds the workload, takes its gradient step
  and evaluates it (Python, JAX, the dataset, the compiled step and evaluation, the
  initial parameters, one gradient, the activations). It depends on the model and the
  batch, not on akorun: it is measured (tests/bench/bench_akorun.py measures it beside
  every figure), never guessed.
- vectors: akorun's own float32 vectors of length D beyond the bare process's:
  the replica's parameters, the ako node's unsent and inbox buffers (akocore.schemes.ako),
  the update (own gradient + inbox) and its scaled copy (AkoWorker.local_step), the
  optimizer's two temporaries (akocore.optim: lr x update, params - it), the copy of
  the parameters an evaluation takes (akorun.runtime.lifecycle.evaluation), and the optimizer's
  state: 0 vectors for sgd, 1 for momentum and adagrad, 2 for adam (optax), each with
  a jitted copy of the state while it is updated. `AKORUN_VECTORS` + 2 x state vectors.
- relay: akorun.runtime.recovery.relay.relay_bound_bytes (per peer j, its last
  min(2 s + 2, 2 p_j) rounds of 4 ceil(D / p_j) bytes, or the budget's share).
- outgoing: the messages this rank's senders still hold, encoded once per round and
  shared by every peer's queue (akorun.runtime.outbox): a peer's queue holds the rounds
  it has not yet taken, at most 2 s + 2 behind under the gate, plus the p - 1 of the
  final flush, plus the one being encoded: (2 s + p + 2) x (header + 4 ceil(D / p))
  bytes, and as long as they are queued the partials' values too (the same again). A
  peer suspended for long makes its queue grow to akorun.queue_messages before it folds
  (akorun.transport.sender): with s = inf, or while a peer is suspended, the count is
  queue_messages.
- incoming: the data path's receive buffers (akorun.transport.admission.BufferPool):
  never more than the server's concurrent body reads, max(4, 3 (n - 1)), each the
  largest partition a peer sends, 4 ceil(D / min p_j).
- runtime: akorun's own constant beyond the bare process (aiohttp, asyncio, its
  modules, sessions, metrics): measured with a tiny model (`RUNTIME_BYTES`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from akorun.runtime.recovery.relay import relay_bound_bytes
from akorun.transport.wire import HEADER_SIZE

FLOAT_BYTES = 4
# replica params, unsent, inbox, update, scaled update, 2 optimizer temporaries, eval copy,
# digest bytes
AKORUN_VECTORS = 9
# muon: one momentum vector on its 2-D leaves, Adam's two on the others: at most 2
STATE_VECTORS = {"sgd": 0, "momentum": 1, "adagrad": 1, "adam": 2, "muon": 2}
# akorun's own resident bytes beyond a process that uses the workload as a rank does, with
# a tiny model (digits-mlp, 4,810 parameters, 3 ranks: every other term ~0): 14 MB
# measured on 2026-11-25 (python 3.11, aiohttp 3, jax on CPU), stated with a margin for
# the allocator.
RUNTIME_BYTES = 100_000_000
CONCURRENT_READS_MIN, CONCURRENT_READS_PER_PEER = 4, 3  # akorun.runtime.worker's Server


@dataclass(frozen=True)
class MemoryBound:
    """The terms of one rank's stated peak memory, in bytes; `total_bytes` their sum."""

    workload_bytes: int
    vectors_bytes: int
    relay_bytes: int
    outgoing_bytes: int
    incoming_bytes: int
    runtime_bytes: int

    @property
    def total_bytes(self) -> int:
        return sum(asdict(self).values())

    def text(self) -> str:
        """One line: the total and its terms in MB."""
        terms = ", ".join(f"{name.removesuffix('_bytes')} {value / 1e6:.0f}"
                          for name, value in asdict(self).items())
        return f"{self.total_bytes / 1e6:.0f} MB ({terms})"


def outgoing_messages(p: int, staleness: float, queue_messages: int) -> int:
    """Messages one rank's senders hold at most (module docstring: outgoing)."""
    if math.isinf(staleness):
        return queue_messages
    return min(queue_messages, 2 * int(staleness) + p + 2)


def memory_bound(*, length: int, p_of: Sequence[int], rank: int, staleness: float,
                 optimizer: str, workload_bytes: int, budget_bytes: int = 0,
                 queue_messages: int = 64,
                 runtime_bytes: int = RUNTIME_BYTES) -> MemoryBound:
    """The stated bound of rank `rank` of an ako run of `len(p_of)` workers on a model of
    `length` parameters (module docstring; `workload_bytes` measured)."""
    if optimizer not in STATE_VECTORS:
        raise ValueError(f"optimizer {optimizer!r}: expected one of "
                         f"{', '.join(STATE_VECTORS)}")
    workers = len(p_of)
    vector = FLOAT_BYTES * length
    own_message = FLOAT_BYTES * -(-length // p_of[rank])
    peers = [p_of[j] for j in range(workers) if j != rank]
    widest_in = FLOAT_BYTES * -(-length // min(peers)) if peers else 0
    reads = max(CONCURRENT_READS_MIN, CONCURRENT_READS_PER_PEER * len(peers)) if peers else 0
    queued = outgoing_messages(p_of[rank], staleness, queue_messages)
    return MemoryBound(
        workload_bytes=workload_bytes,
        vectors_bytes=(AKORUN_VECTORS + 2 * STATE_VECTORS[optimizer]) * vector,
        relay_bytes=relay_bound_bytes(length, p_of, rank, staleness=staleness,
                                      budget_bytes=budget_bytes),
        outgoing_bytes=queued * (HEADER_SIZE + 2 * own_message),
        incoming_bytes=reads * widest_in,
        runtime_bytes=runtime_bytes)
