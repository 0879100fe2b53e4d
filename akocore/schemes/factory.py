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
from akocore.schemes.elastic import ElasticServer, ElasticWorker
from akocore.schemes.localps import (
    DeltaPSServer,
    LocalStepPSWorker,
    ScaledPSWorker,
    SyncDeltaPSServer,
)
from akocore.schemes.ps import PSLayout, PSServer, PSWorker
from akocore.schemes.wagma import DEFAULT_GLOBAL_EVERY, DEFAULT_GROUP_SIZE, WagmaWorker

# (rank, its parameters or None) -> its replica
ReplicaOf = Callable[[int, np.ndarray | None], Replica]
# (spec, vector length, initial parameters or None, replica of a rank) -> nodes
NodeBuilder = Callable[["SchemeSpec", int, np.ndarray | None, ReplicaOf], list[SchemeNode]]
PS_NODE_MODES = ("sync", "async", "elastic")


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
    group_size: int = DEFAULT_GROUP_SIZE  # wagma: G
    global_every: int = DEFAULT_GLOBAL_EVERY  # wagma: tau
    wait_avoiding: bool = True  # wagma: False = synchronous group collectives
    elastic_alpha: float = 0.0  # ps elastic: moving rate, 0 = 0.9 / workers
    local_steps: bool = False  # ps: workers step locally (async DOWNPOUR/ADAG, sync SDAG)
    push_average: bool = False  # ps local steps: push update / push_every (ADAG, SAGN)
    worker_lr_scale: tuple[float, ...] = ()  # ps: learning-rate factors, worker i: [i % len]

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
        if self.ps_mode not in PS_NODE_MODES:
            raise ValueError(f"ps_mode: got {self.ps_mode!r}, expected one of "
                             f"{', '.join(PS_NODE_MODES)}")
        if len(self.worker_lr_scale) > self.training_workers:
            raise ValueError(f"worker_lr_scale: got {len(self.worker_lr_scale)} values, "
                             f"expected at most one per training worker "
                             f"({self.training_workers}; fewer go round robin)")

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
               replica: ReplicaOf) -> list[SchemeNode]:
    p_of = spec.p_list()
    return [AkoWorker(i, spec.workers, length, p_of, replica=replica(i, params0),
                      staleness=spec.staleness, schedule=spec.schedule, reduce=spec.reduce)
            for i in range(spec.workers)]


def _build_allreduce(spec: SchemeSpec, length: int, params0: np.ndarray | None,
                     replica: ReplicaOf) -> list[SchemeNode]:
    return [AllReduceWorker(i, spec.workers, length, replica=replica(i, params0),
                            reduce=spec.reduce) for i in range(spec.workers)]


def _ps_worker(spec: SchemeSpec, layout: PSLayout, rank: int, replica: Replica) -> PSWorker:
    if spec.ps_mode == "elastic":
        return ElasticWorker(rank, layout, replica=replica, staleness=spec.staleness,
                             every=spec.push_every)
    if spec.local_steps:
        return LocalStepPSWorker(rank, layout, replica=replica, staleness=spec.staleness,
                                 push_every=spec.push_every, fetch_every=spec.fetch_every,
                                 push_average=spec.push_average, sync=spec.ps_mode == "sync")
    if spec.worker_lr_scale:
        return ScaledPSWorker(rank, layout, replica=replica, mode=spec.ps_mode,
                              staleness=spec.staleness, push_every=spec.push_every,
                              fetch_every=spec.fetch_every,
                              lr_scale=spec.worker_lr_scale[rank % len(spec.worker_lr_scale)])
    return PSWorker(rank, layout, replica=replica, mode=spec.ps_mode, staleness=spec.staleness,
                    push_every=spec.push_every, fetch_every=spec.fetch_every)


def _ps_server(spec: SchemeSpec, layout: PSLayout, rank: int, replica: Replica) -> PSServer:
    if spec.ps_mode == "elastic":
        return ElasticServer(rank, layout, replica=replica, alpha=spec.elastic_alpha)
    if spec.ps_mode == "async" and spec.local_steps:
        return DeltaPSServer(rank, layout, replica=replica, push_every=spec.push_every,
                             fetch_every=spec.fetch_every)
    if spec.ps_mode == "sync" and spec.local_steps:
        return SyncDeltaPSServer(rank, layout, replica=replica, push_every=spec.push_every,
                                 reduce=spec.reduce)
    return PSServer(rank, layout, replica=replica, mode=spec.ps_mode, reduce=spec.reduce,
                    fetch_every=spec.fetch_every, push_every=spec.push_every)


def _build_ps(spec: SchemeSpec, length: int, params0: np.ndarray | None,
              replica: ReplicaOf) -> list[SchemeNode]:
    layout = PSLayout(spec.training_workers, spec.ps_servers, length)
    nodes: list[SchemeNode] = [_ps_worker(spec, layout, i, replica(i, params0))
                               for i in range(layout.workers)]
    for shard, rank in enumerate(layout.server_ranks):
        start, stop = layout.shard_slice(shard)
        shard_params = None if params0 is None else params0[start:stop]
        nodes.append(_ps_server(spec, layout, rank, replica(rank, shard_params)))
    return nodes


def _build_wagma(spec: SchemeSpec, length: int, params0: np.ndarray | None,
                 replica: ReplicaOf) -> list[SchemeNode]:
    return [WagmaWorker(i, spec.workers, length, replica=replica(i, params0),
                        group_size=spec.group_size, global_every=spec.global_every,
                        wait_avoiding=spec.wait_avoiding) for i in range(spec.workers)]


BUILDERS: dict[str, NodeBuilder] = {
    "ako": _build_ako,
    "ps": _build_ps,
    "allreduce": _build_allreduce,
    "wagma": _build_wagma,
}
SCHEMES = tuple(BUILDERS)


def build_nodes(spec: SchemeSpec, length: int, params0: np.ndarray | None,
                optimizer: FlatOptimizer | None, *, only: int | None = None) -> list[SchemeNode]:
    """All nodes of a run, ranks 0..workers-1 (ps servers last).

    With `only`, every other rank's node is timing-only (no parameters): what
    one process of a real run needs, as `build_node` returns it.
    """

    def replica(rank: int, params: np.ndarray | None) -> Replica:
        if params is None or (only is not None and rank != only):
            return Replica(None, None)
        return Replica(params, optimizer)

    if params0 is not None and params0.shape != (length,):
        raise ValueError(f"initial parameters must have shape ({length},)")
    return BUILDERS[spec.scheme](spec, length, params0, replica)


def build_node(spec: SchemeSpec, rank: int, length: int, params0: np.ndarray,
               optimizer: FlatOptimizer) -> SchemeNode:
    """Rank's node, as build_nodes(spec, ...)[rank] would build it."""
    if not 0 <= rank < spec.workers:
        raise ValueError(f"rank: got {rank}, expected 0..{spec.workers - 1}")
    return build_nodes(spec, length, params0, optimizer, only=rank)[rank]
