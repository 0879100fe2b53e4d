"""Asynchronous elastic averaging SGD (AEASGD, Zhang, Choromanska and LeCun 2015).

Workers take local optimizer steps on their own replica x_i. Every `every`
(tau) rounds a worker sends its model shards (Kind.MODEL) to the servers that
hold the centre variable x~. The server computes the elastic difference
d = alpha * (x_i - x~), moves the centre x~ += d and sends d back
(Kind.ELASTIC); the worker moves x_i -= d when it arrives (alpha = lr * rho,
the moving rate; 0 means the paper's beta = n * alpha = 0.9).

Invariant (tests/test_schemes_elastic.py): the elastic force is symmetric,
so sum_i x_i + x~ changes only by the workers' own optimizer steps; with
plain SGD, after a drain sum_i x_i + x~ = (n + 1) theta0 - lr * sum(gradients)
under any delivery order. The gate is PSWorker's: round t starts while every
exchange sent at rounds <= t - 1 - s is answered (s = exchange.ssp; 0 blocks
on each exchange as the paper's workers do when they read the centre).

Layout and shell roles are the parameter server's (ps_mode = "elastic"), so
`ElasticWorker` / `ElasticServer` subclass `PSWorker` / `PSServer`.
"""

from __future__ import annotations

import numpy as np

from akocore.messages import Kind, Partial, Receipt, Send
from akocore.schemes.base import Replica, SchemeError
from akocore.schemes.ps import PSLayout, PSServer, PSWorker

ELASTIC_BETA = 0.9  # Zhang et al.: beta = n * alpha = 0.9


def elastic_alpha(alpha: float, workers: int) -> float:
    """The moving rate: `alpha` if given (> 0), else beta / n."""
    value = alpha if alpha > 0 else ELASTIC_BETA / workers
    if not 0 < value < 1:
        raise ValueError(f"elastic moving rate must be in (0, 1), got {value}")
    return value


class ElasticWorker(PSWorker):
    """A worker pulled towards the centre every `push_every` rounds."""

    def __init__(self, rank: int, layout: PSLayout, *, replica: Replica,
                 staleness: float = 0.0, every: int = 1) -> None:
        super().__init__(rank, layout, replica=replica, mode="async", staleness=staleness,
                         push_every=every, fetch_every=every)

    def local_step(self, round_: int, grad: np.ndarray | None) -> list[Send]:
        self._step_replica(round_, grad)
        if not self._pushes(round_):
            return []
        sends = []
        for shard, server in enumerate(self.layout.server_ranks):
            start, stop = self.layout.shard_slice(shard)
            sends.append(Send((server,), self._partial(
                Kind.MODEL, round_, shard, self.layout.servers, start, stop,
                self.replica.params)))
        self.outstanding[round_] = set(self.layout.server_ranks)
        return sends

    def finish(self, rounds_done: int) -> list[Send]:
        if rounds_done != self.next_round:
            raise SchemeError(f"node {self.rank}: finish after {rounds_done} rounds")
        self.finished = True
        empty = None if self.replica.params is None else np.zeros(0, np.float32)
        return [Send((server,), Partial(Kind.MODEL, self.rank, rounds_done, shard,
                                        self.layout.servers, self.layout.shard_slice(shard)[0],
                                        0, empty, True))
                for shard, server in enumerate(self.layout.server_ranks)]

    def receive(self, msg: Partial) -> Receipt:
        if not self._take_shard_answer(msg, Kind.ELASTIC, "elastic worker"):
            return Receipt(False)
        if self.replica.params is not None and msg.values is not None:
            self.replica.params[msg.offset:msg.offset + msg.length] -= msg.values
        return Receipt(True)


class ElasticServer(PSServer):
    """One shard of the centre variable: answers each model with its elastic move."""

    def __init__(self, rank: int, layout: PSLayout, *, replica: Replica,
                 alpha: float = 0.0) -> None:
        super().__init__(rank, layout, replica=replica, mode="async")
        self.alpha = np.float32(elastic_alpha(alpha, layout.workers))
        self.seen: set[tuple[int, int, int]] = set()

    def receive(self, msg: Partial) -> Receipt:
        if msg.kind != Kind.MODEL or not self.log.knows(msg.sender):
            raise SchemeError(f"elastic server {self.rank}: unexpected {msg.kind.name} "
                              f"from node {msg.sender}")
        if not msg.final and (msg.offset, msg.offset + msg.length) != (self.start, self.stop):
            raise SchemeError(f"a model for shard {self.shard} must span "
                              f"[{self.start}, {self.stop})")
        self._check_values(msg)
        if msg.key in self.seen:
            return Receipt(False)
        self.seen.add(msg.key)
        if msg.final:
            self.final_round[msg.sender] = msg.round
            return Receipt(True)
        diff = None
        if self.replica.params is not None and msg.values is not None:
            diff = (self.alpha * (msg.values - self.replica.params)).astype(np.float32)
            self.replica.params = self.replica.params + diff
        reply = Partial(Kind.ELASTIC, self.rank, msg.round, self.shard, self.layout.servers,
                        self.start, self.stop - self.start, diff)
        return Receipt(True, (Send((msg.sender,), reply),))
