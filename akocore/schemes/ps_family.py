"""The parameter-server scheme as one object: sync, async, elastic, local steps, lr per worker.

`PS` builds the nodes of a ps run (training workers first, one server per
shard last) from the node classes of akocore.schemes.ps, .elastic and
.localps, owns the ps settings (`PSSettings`, [exchange.ps]; `PS_MODES`: the values
of exchange.ps_mode),
its staleness bound and its label. The Distributed TensorFlow Guide's
systems and elastic averaging are presets of these settings
(akocore.schemes.named).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from akocore.schemes.base import Replica, SchemeNode
from akocore.schemes.elastic import ElasticServer, ElasticWorker
from akocore.schemes.knobs import (
    SchemeSettings,
    knob,
    one_of,
    preset,
    real,
    reals,
    truth,
    whole,
)
from akocore.schemes.localps import (
    DeltaPSServer,
    LocalStepPSWorker,
    ScaledPSWorker,
    SyncDeltaPSServer,
)
from akocore.schemes.protocol import ExchangeView, ReplicaOf, Scheme
from akocore.schemes.ps import PSLayout, PSServer, PSWorker
from akocore.settings.normalise import ConfigError, as_int

if TYPE_CHECKING:
    from akocore.schemes.factory import SchemeSpec

PS_MODES = ("sync", "async", "elastic")  # exchange.ps_mode
BEST = "best"  # exchange.ps_servers: the planner picks the number of servers


def _servers(key: str, value: Any) -> int | str:
    if isinstance(value, str) and value.strip() == BEST:
        return BEST
    return as_int(key, value, 1, 'an integer >= 1 (and < cluster.workers) or "best"')


@dataclass(frozen=True)
class PSSettings(SchemeSettings):
    """The ps scheme's knobs ([exchange.ps]); the named schemes (easgd, hogwild, adag, ...)
    are presets of them (akocore.schemes.named)."""

    table: ClassVar[str] = "ps"

    ps_servers: int | str = knob(
        1, parse=_servers,
        help="scheme ps: number of parameter-server ranks (the last ranks)")
    ps_mode: str = knob("sync", parse=one_of(PS_MODES), help="scheme ps: sync | async")
    push_every: int = knob(1, parse=whole(1), help="scheme ps async: push every N rounds")
    fetch_every: int = knob(1, parse=whole(1),
                            help="scheme ps async: fetch parameters every N rounds")
    elastic_alpha: float = knob(
        0.0, parse=real(lambda a: 0 <= a < 1,
                        "a moving rate 0 < alpha < 1, or 0 for 0.9 / workers"),
        help="scheme ps elastic: moving rate alpha = lr * rho, 0 < alpha < 1; "
             "0 = 0.9 / workers")
    local_steps: bool = knob(
        False, parse=truth,
        help="scheme ps: workers apply their optimizer locally and push the updates "
             "(async: DOWNPOUR, ADAG; sync: SDAG, SAGN)")
    push_average: bool = knob(
        False, parse=truth,
        help="scheme ps with local_steps: push the update divided by push_every (ADAG, SAGN)")
    worker_lr_scale: tuple[float, ...] = knob(
        (), parse=reals(lambda x: x > 0, "factors > 0, one per training worker, e.g. [1, 0.5]"),
        dump=list,
        help="scheme ps: learning-rate factor per training worker, in turn; [] = all 1")

    def check_workers(self, workers: int) -> None:
        if isinstance(self.ps_servers, int) and self.ps_servers >= workers:
            raise ConfigError(
                f"exchange.ps_servers: got {self.ps_servers}, expected fewer servers than "
                f"cluster.workers ({workers}) so that at least one node trains, or \"best\"",
                "exchange.ps_servers")


def _ps_worker(spec: SchemeSpec, layout: PSLayout, rank: int, replica: Replica) -> PSWorker:
    knobs = spec.knobs(PSSettings)
    if knobs.ps_mode == "elastic":
        return ElasticWorker(rank, layout, replica=replica, staleness=spec.staleness,
                             every=knobs.push_every)
    if knobs.local_steps:
        return LocalStepPSWorker(rank, layout, replica=replica, staleness=spec.staleness,
                                 push_every=knobs.push_every, fetch_every=knobs.fetch_every,
                                 push_average=knobs.push_average, sync=knobs.ps_mode == "sync")
    if knobs.worker_lr_scale:
        scales = knobs.worker_lr_scale
        return ScaledPSWorker(rank, layout, replica=replica, mode=knobs.ps_mode,
                              staleness=spec.staleness, push_every=knobs.push_every,
                              fetch_every=knobs.fetch_every,
                              lr_scale=scales[rank % len(scales)])
    return PSWorker(rank, layout, replica=replica, mode=knobs.ps_mode, staleness=spec.staleness,
                    push_every=knobs.push_every, fetch_every=knobs.fetch_every)


def _ps_server(spec: SchemeSpec, layout: PSLayout, rank: int, replica: Replica) -> PSServer:
    knobs = spec.knobs(PSSettings)
    if knobs.ps_mode == "elastic":
        return ElasticServer(rank, layout, replica=replica, alpha=knobs.elastic_alpha)
    if knobs.ps_mode == "async" and knobs.local_steps:
        return DeltaPSServer(rank, layout, replica=replica, push_every=knobs.push_every,
                             fetch_every=knobs.fetch_every)
    if knobs.ps_mode == "sync" and knobs.local_steps:
        return SyncDeltaPSServer(rank, layout, replica=replica, push_every=knobs.push_every,
                                 reduce=spec.reduce)
    return PSServer(rank, layout, replica=replica, mode=knobs.ps_mode, reduce=spec.reduce,
                    fetch_every=knobs.fetch_every, push_every=knobs.push_every)


_ASYNC_PS = {"scheme": "ps", "ps_servers": 1, "ps_mode": "async", "ssp": "inf"}

# the systems of the Distributed TensorFlow Guide and elastic averaging, as ps settings
# (configs/presets/NAME.toml holds the same as files)
PS_PRESETS = (
    preset("easgd", "asynchronous elastic averaging (AEASGD): pulled towards the server's "
           "centre every tau = 4 rounds",
           {"scheme": "ps", "ps_servers": 1, "ps_mode": "elastic", "push_every": 4,
            "elastic_alpha": 0}),
    preset("hogwild", "Hogwild: asynchronous ps, push and fetch every round, lock-free",
           {**_ASYNC_PS, "push_every": 1, "fetch_every": 1}),
    preset("downpour", "DOWNPOUR: local Adagrad steps, push every 2, fetch every 4, "
           "asynchronous", {**_ASYNC_PS, "local_steps": True, "push_every": 2,
                             "fetch_every": 4},
           {"optimizer": "adagrad"}),
    preset("adag", "ADAG / AGN: lambda = 4 local steps, push the update / lambda, "
           "asynchronous", {**_ASYNC_PS, "local_steps": True, "push_average": True,
                             "push_every": 4, "fetch_every": 4}),
    preset("sdag", "SDAG / SAGN: lambda = 4 local steps, push the update / lambda, "
           "synchronous mean", {"scheme": "ps", "ps_servers": 1, "ps_mode": "sync",
                                 "local_steps": True, "push_average": True,
                                 "push_every": 4}),
    preset("sync-sgd", "synchronous SGD: every round the server applies the mean gradient",
           {"scheme": "ps", "ps_servers": 1, "ps_mode": "sync"}),
    preset("sync-sgd-lr-per-worker", "synchronous SGD, worker i's gradient scaled by "
           "worker_lr_scale[i] (1, 1, 0.5, 0.5 in turn)",
           {"scheme": "ps", "ps_servers": 1, "ps_mode": "sync",
            "worker_lr_scale": [1.0, 1.0, 0.5, 0.5]}),
)


class PSScheme(Scheme):
    """Parameter servers: k shard servers (the last ranks), n - k training workers."""

    name = "ps"
    summary = "parameter servers: workers push gradients, shard servers answer parameters"
    settings = PSSettings
    presets = PS_PRESETS
    pattern = "servers"
    has_servers = True
    needs_every_rank = True

    def check_spec(self, spec: SchemeSpec) -> None:
        if not 1 <= spec.ps_servers < spec.workers:
            raise ValueError(f"ps_servers: got {spec.ps_servers}, expected "
                             f"1..{spec.workers - 1} (the rest of the {spec.workers} nodes "
                             f"are workers)")
        scales = spec.knobs(PSSettings).worker_lr_scale  # ValueError for a bad knob
        if len(scales) > spec.training_workers:
            raise ValueError(f"worker_lr_scale: got {len(scales)} values, expected at most "
                             f"one per training worker ({spec.training_workers}; fewer go "
                             f"round robin)")

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

    def staleness_bound(self, exchange: ExchangeView, *, p_max: int, ssp: float) -> float:
        """sync: 0, or lambda - 1 with local steps (SDAG); async, elastic: s (the gate)."""
        knobs = exchange.knobs(PSSettings)
        if knobs.ps_mode == "sync":
            return float(knobs.push_every - 1) if knobs.local_steps else 0.0
        return ssp

    def effective_ssp(self, exchange: ExchangeView) -> float:
        """The SSP bound a ps run gates with: none in sync mode (everyone waits)."""
        return exchange.ssp if exchange.knobs(PSSettings).ps_mode != "sync" else 0.0

    def label(self, exchange: ExchangeView) -> str:
        knobs = exchange.knobs(PSSettings)
        if knobs.ps_mode == "elastic":
            return f"elastic tau={knobs.push_every}"
        if knobs.local_steps:
            avg = " averaged" if knobs.push_average else ""
            if knobs.ps_mode == "sync":
                return f"sync local steps, exchange every {knobs.push_every}{avg}"
            return f"local steps, push {knobs.push_every}{avg}, fetch {knobs.fetch_every}"
        return ""


PS = PSScheme()
