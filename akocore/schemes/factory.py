"""Which schemes exist and how to build the nodes of one run.

`SchemeSpec` says what a run exchanges; `build_nodes` lays out its nodes
(ranks 0..workers-1, ps servers last) through `BUILDERS`, the registry of
schemes. Adding a scheme is a module beside akocore.schemes.ako (its node
classes) plus one builder function and one `BUILDERS` entry here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from akocore.optim import FlatOptimizer
from akocore.schemes.ako import AkoWorker
from akocore.schemes.allreduce import AllReduceWorker
from akocore.schemes.base import Replica, SchemeNode
from akocore.schemes.ps import PSLayout, PSServer, PSWorker

# (spec, vector length, initial parameters or None, replica for some parameters) -> nodes
NodeBuilder = Callable[
    ["SchemeSpec", int, np.ndarray | None, Callable[[np.ndarray | None], Replica]],
    list[SchemeNode],
]


@dataclass(frozen=True)
class SchemeSpec:
    """Everything needed to build the nodes of one run."""

    scheme: str = "ako"
    workers: int = 4  # total nodes (ps: workers + servers)
    p_of: tuple[int, ...] = (1,)  # ako: one per worker, or one for all
    staleness: float = 0.0
    schedule: str = "staggered"
    reduce: str = "mean"
    ps_servers: int = 1
    ps_mode: str = "sync"
    push_every: int = 1
    fetch_every: int = 1

    def __post_init__(self) -> None:
        if self.scheme not in BUILDERS:
            raise ValueError(f"scheme: got {self.scheme!r}, expected one of {', '.join(SCHEMES)}")
        if self.workers < 2:
            raise ValueError(f"workers: got {self.workers}, expected >= 2")
        if self.staleness < 0:
            raise ValueError(f"ssp: got {self.staleness}, expected >= 0 or inf")
        if self.scheme == "ps" and not 1 <= self.ps_servers < self.workers:
            raise ValueError(f"ps_servers: got {self.ps_servers}, expected 1..{self.workers - 1} "
                             f"(the rest of the {self.workers} nodes are workers)")

    @property
    def training_workers(self) -> int:
        """Nodes that compute gradients (ps: all but the servers)."""
        return self.workers - self.ps_servers if self.scheme == "ps" else self.workers

    def p_list(self) -> tuple[int, ...]:
        if len(self.p_of) == 1:
            return self.p_of * self.workers
        if len(self.p_of) != self.workers:
            raise ValueError(f"p: got {len(self.p_of)} values, expected 1 or {self.workers}")
        return self.p_of


def _build_ako(spec: SchemeSpec, length: int, params0: np.ndarray | None,
               replica: Callable[[np.ndarray | None], Replica]) -> list[SchemeNode]:
    p_of = spec.p_list()
    return [AkoWorker(i, spec.workers, length, p_of, replica=replica(params0),
                      staleness=spec.staleness, schedule=spec.schedule, reduce=spec.reduce)
            for i in range(spec.workers)]


def _build_allreduce(spec: SchemeSpec, length: int, params0: np.ndarray | None,
                     replica: Callable[[np.ndarray | None], Replica]) -> list[SchemeNode]:
    return [AllReduceWorker(i, spec.workers, length, replica=replica(params0),
                            reduce=spec.reduce) for i in range(spec.workers)]


def _build_ps(spec: SchemeSpec, length: int, params0: np.ndarray | None,
              replica: Callable[[np.ndarray | None], Replica]) -> list[SchemeNode]:
    layout = PSLayout(spec.training_workers, spec.ps_servers, length)
    nodes: list[SchemeNode] = [
        PSWorker(i, layout, replica=replica(params0), mode=spec.ps_mode,
                 staleness=spec.staleness, push_every=spec.push_every,
                 fetch_every=spec.fetch_every)
        for i in range(layout.workers)]
    for shard, rank in enumerate(layout.server_ranks):
        start, stop = layout.shard_slice(shard)
        shard_params = None if params0 is None else params0[start:stop]
        nodes.append(PSServer(rank, layout, replica=replica(shard_params), mode=spec.ps_mode,
                              reduce=spec.reduce, fetch_every=spec.fetch_every))
    return nodes


BUILDERS: dict[str, NodeBuilder] = {
    "ako": _build_ako,
    "ps": _build_ps,
    "allreduce": _build_allreduce,
}
SCHEMES = tuple(BUILDERS)


def build_nodes(spec: SchemeSpec, length: int, params0: np.ndarray | None,
                optimizer: FlatOptimizer | None) -> list[SchemeNode]:
    """All nodes of a run, ranks 0..workers-1 (ps servers last)."""

    def replica(params: np.ndarray | None) -> Replica:
        return Replica(params, optimizer if params is not None else None)

    if params0 is not None and params0.shape != (length,):
        raise ValueError(f"initial parameters must have shape ({length},)")
    return BUILDERS[spec.scheme](spec, length, params0, replica)
