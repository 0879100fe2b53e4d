"""Ring all-reduce: reduce-scatter then all-gather of the full gradient each round."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from akocore import ssp
from akocore.messages import Kind, Partial, Receipt, Send
from akocore.partition import check_p, partition_bounds
from akocore.schemes.base import Replica, SchemeError, SchemeNode, reduce_scale
from akocore.schemes.protocol import ExchangeView, ReplicaOf, Scheme

if TYPE_CHECKING:
    from akocore.schemes.factory import SchemeSpec


class AllReduceWorker(SchemeNode):
    """Ring all-reduce of the full gradient each round, then a mean update.

    The vector is cut into n chunks. Reduce-scatter: at step s worker i sends
    chunk (i - s) mod n to i + 1, which adds it to its own. All-gather: at
    step s worker i sends its complete chunk (i + 1 - s) mod n to i + 1, which
    overwrites. Messages carry `part` = step (0..n-2 reduce, n-1..2n-3 gather).
    Rounds are lockstep: round t + 1 starts when round t's ring is complete.
    The channel to the next node is one in-order stream (as in gloo and NCCL):
    step s + 1 leaves after step s has left, never beside it.
    """

    in_order_sends = True

    def __init__(self, rank: int, workers: int, length: int, *, replica: Replica,
                 reduce: str = "mean") -> None:
        super().__init__(rank, length, replica)
        if workers < 2:
            raise ValueError("allreduce needs at least 2 workers")
        check_p(length, workers)
        self.workers = workers
        self.scale = np.float32(reduce_scale(reduce, workers))
        self.bounds = partition_bounds(length, workers)
        self.next = (rank + 1) % workers
        self.prev = (rank - 1) % workers
        self.steps = 2 * (workers - 1)
        self.log = ssp.DeliveryLog((self.prev,), lambda sender, round_: self.steps)
        self.acc: np.ndarray | None = None
        self.active_round = -1  # round whose ring is in progress
        self.done_step = -1  # last processed step of the active round
        self.held: dict[tuple[int, int], Partial] = {}
        self.completed_round = -1

    def _chunk_send(self, round_: int, step: int) -> Send:
        n = self.workers
        if step < n - 1:
            kind, chunk = Kind.REDUCE, (self.rank - step) % n
        else:
            kind, chunk = Kind.GATHER, (self.rank + 1 - (step - (n - 1))) % n
        start, stop = int(self.bounds[chunk]), int(self.bounds[chunk + 1])
        return Send((self.next,), self._partial(kind, round_, step, n, start, stop, self.acc))

    def may_start(self, round_: int) -> bool:
        return round_ == 0 or self.completed_round >= round_ - 1

    def waiting_on(self, round_: int) -> list[int]:
        return [] if self.may_start(round_) else [self.prev]

    def local_step(self, round_: int, grad: np.ndarray | None) -> list[Send]:
        self._check_round(round_)
        self._check_grad(grad)
        if not self.may_start(round_):
            raise SchemeError(f"node {self.rank}: round {round_} started before the ring "
                              f"of round {round_ - 1} completed")
        self.acc = None if grad is None else np.array(grad, dtype=np.float32, copy=True)
        self.active_round, self.done_step = round_, -1
        self.next_round = round_ + 1
        effects = [self._chunk_send(round_, 0)]
        effects.extend(self._process_held())
        return effects

    def receive(self, msg: Partial) -> Receipt:
        if msg.kind not in (Kind.REDUCE, Kind.GATHER) or msg.sender != self.prev:
            raise SchemeError(f"allreduce worker {self.rank}: unexpected {msg.kind.name} "
                              f"from node {msg.sender}")
        if not 0 <= msg.part < self.steps:
            raise SchemeError(f"ring step {msg.part} out of range")
        self._check_values(msg)
        if not self.log.record(msg.sender, msg.round, msg.part):
            return Receipt(False)
        self.held[(msg.round, msg.part)] = msg
        return Receipt(True, tuple(self._process_held()))

    def _process_held(self) -> list[Send]:
        effects: list[Send] = []
        n = self.workers
        while (self.active_round, self.done_step + 1) in self.held:
            step = self.done_step + 1
            msg = self.held.pop((self.active_round, step))
            if self.acc is not None and msg.values is not None:
                window = slice(msg.offset, msg.offset + msg.length)
                if step < n - 1:
                    self.acc[window] += msg.values
                else:
                    self.acc[window] = msg.values
            self.done_step = step
            if step + 1 < self.steps:
                effects.append(self._chunk_send(self.active_round, step + 1))
            else:
                if self.acc is not None:
                    self.replica.apply(self.acc * self.scale)
                self.completed_round = self.active_round
        return effects

    def drained(self) -> bool:
        return self.completed_round >= self.next_round - 1


class AllReduceScheme(Scheme):
    """Ring all-reduce of the full gradient each round: everyone waits every round."""

    name = "allreduce"
    summary = "ring all-reduce of the full gradient every round"
    pattern = "ring"
    needs_every_rank = True

    def build(self, spec: SchemeSpec, length: int, params0: np.ndarray | None,
              replica: ReplicaOf) -> list[SchemeNode]:
        return [AllReduceWorker(i, spec.workers, length, replica=replica(i, params0),
                                reduce=spec.reduce) for i in range(spec.workers)]

    def variant_label(self, exchange: ExchangeView) -> str:
        return "ring allreduce"


ALLREDUCE = AllReduceScheme()
