"""The parameter-server scheme as one object: sync, async, elastic, local steps, lr per worker.

`PS` builds the nodes of a ps run (training workers first, one server per
shard last) from the node classes of akocore.schemes.ps, .elastic and
.localps, owns the ps settings (`PS_MODES`: the values of exchange.ps_mode),
its staleness bound and its label. The Distributed TensorFlow Guide's
systems and elastic averaging are presets of these settings
(akocore.schemes.named).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from akocore.schemes.base import Replica, SchemeNode
from akocore.schemes.elastic import ElasticServer, ElasticWorker
from akocore.schemes.localps import (
    DeltaPSServer,
    LocalStepPSWorker,
    ScaledPSWorker,
    SyncDeltaPSServer,
)
from akocore.schemes.protocol import ReplicaOf, Scheme
from akocore.schemes.ps import PSLayout, PSServer, PSWorker

if TYPE_CHECKING:
    from akocore.schemes.factory import SchemeSpec
    from akocore.settings.schema import ExchangeConfig

PS_MODES = ("sync", "async", "elastic")  # exchange.ps_mode


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


class PSScheme(Scheme):
    """Parameter servers: k shard servers (the last ranks), n - k training workers."""

    name = "ps"
    summary = "parameter servers: workers push gradients, shard servers answer parameters"
    keys = ("ps_servers", "ps_mode", "push_every", "fetch_every", "elastic_alpha",
            "local_steps", "push_average", "worker_lr_scale")
    pattern = "servers"
    has_servers = True
    needs_every_rank = True

    def check_spec(self, spec: SchemeSpec) -> None:
        if not 1 <= spec.ps_servers < spec.workers:
            raise ValueError(f"ps_servers: got {spec.ps_servers}, expected "
                             f"1..{spec.workers - 1} (the rest of the {spec.workers} nodes "
                             f"are workers)")
        if spec.ps_mode not in PS_MODES:
            raise ValueError(f"ps_mode: got {spec.ps_mode!r}, expected one of "
                             f"{', '.join(PS_MODES)}")

    def build(self, spec: SchemeSpec, length: int, params0: np.ndarray | None,
              replica: ReplicaOf) -> list[SchemeNode]:
        layout = PSLayout(spec.training_workers, spec.ps_servers, length)
        nodes: list[SchemeNode] = [_ps_worker(spec, layout, i, replica(i, params0))
                                   for i in range(layout.workers)]
        for shard, rank in enumerate(layout.server_ranks):
            start, stop = layout.shard_slice(shard)
            shard_params = None if params0 is None else params0[start:stop]
            nodes.append(_ps_server(spec, layout, rank, replica(rank, shard_params)))
        return nodes

    def staleness_bound(self, exchange: ExchangeConfig, *, p_max: int, ssp: float) -> float:
        """sync: 0, or lambda - 1 with local steps (SDAG); async, elastic: s (the gate)."""
        if exchange.ps_mode == "sync":
            return float(exchange.push_every - 1) if exchange.local_steps else 0.0
        return ssp

    def effective_ssp(self, exchange: ExchangeConfig) -> float:
        """The SSP bound a ps run gates with: none in sync mode (everyone waits)."""
        return exchange.ssp if exchange.ps_mode != "sync" else 0.0

    def label(self, exchange: ExchangeConfig) -> str:
        if exchange.ps_mode == "elastic":
            return f"elastic tau={exchange.push_every}"
        if exchange.local_steps:
            avg = " averaged" if exchange.push_average else ""
            if exchange.ps_mode == "sync":
                return f"sync local steps, exchange every {exchange.push_every}{avg}"
            return f"local steps, push {exchange.push_every}{avg}, fetch {exchange.fetch_every}"
        return ""


PS = PSScheme()
