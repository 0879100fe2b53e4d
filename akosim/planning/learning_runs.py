"""What each row of the plan's comparison learns: its simulated training, affordably.

The default plan ranks by predicted time to accuracy (akosim.planning.learning_ranking);
this module owns the trainings behind it. Every row of the comparison is trained
with akosim's simulated training (akosim.sim.scenario in training mode: real JAX
gradients, every message applied at its simulated arrival) for `LEARNING_ROUNDS`
rounds, evaluated every `EVAL_EVERY` rounds, and the learning curve is kept in
rounds: the ranking combines rounds to a target with the row's round time from
the timing comparison.

Training the planned workload itself at the planned scale is rarely affordable:
the engine applies every message (64 workers of Ako exchange about 4,000 per
round, about 0.4 CPU s per round here), and a large model's gradients cost as
much in simulation as on the cluster. So `learning_source` chooses what trains:

- the planned workload itself when it is cheap to train (not a
  ``--gradient-size`` stand-in, and a gradient step measured here of at most
  `DIRECT_STEP_S`, or, when the compute time was given rather than measured, at
  most `DIRECT_PARAMS` parameters), else the proxy `PROXY_WORKLOAD` at its own
  batch size;
- on at most `LEARNING_WORKERS` of the cluster's nodes, spread evenly over its
  ranks, with each row's own settings (p, s, H, tau, codec, optimizer, learning
  rate, server share);
- on a twin of the network: those nodes' NICs, per-pair caps and latencies,
  with every bandwidth scaled by (trained gradient / planned gradient) x
  (peers kept / peers planned), so that a round's sends take as long against
  compute as in the plan and a stale scheme's messages arrive as many rounds
  late.

Results are cached per row in the compute cache's folder (`learning-*.json`,
keyed by everything that decides the training), so a repeated plan reads them.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from akocore.schemes.registry import has_servers, is_partitioned

if TYPE_CHECKING:
    from akocore.settings.schema import RunConfig
    from akocore.workloads.flat import FlatWorkload
    from akosim.sim.scenario import Setup, SimRun, Variant

PROXY_WORKLOAD = "digits-mlp"  # real data, 4,810 parameters: a gradient step in ~1 ms
PROXY_BATCH_SIZE = 32  # akosim train's and akorun's default batch
DIRECT_STEP_S = 0.005  # a workload whose gradient step measured here is this quick trains
DIRECT_PARAMS = 20_000  # itself; with a given compute time: one at most this large
LEARNING_WORKERS = 8  # trained on at most this many of the cluster's nodes
LEARNING_ROUNDS = 200  # each row's training horizon
EVAL_EVERY = 5  # rounds between evaluations of the watched replica
CACHE_VERSION = 1  # bump when the training path changes what it would compute


@dataclass(frozen=True)
class LearningSource:
    """What trains in place of the plan: a workload, its batch, on which of the nodes."""

    workload: str
    batch_size: int
    nodes: tuple[int, ...]  # the cluster's ranks that train, in order
    cluster_workers: int
    proxy: bool  # True: a stand-in workload, not the planned one
    devices: int = 1  # each training rank an island of this many devices (batch per device)

    @property
    def workers(self) -> int:
        return len(self.nodes)

    @property
    def rank_batch(self) -> int:
        """Samples in each rank's gradient: the batch of every device of its island."""
        return self.batch_size * self.devices

    @property
    def scaled(self) -> bool:
        """Whether it trains on fewer nodes than the plan's or another workload."""
        return self.proxy or self.workers < self.cluster_workers

    def describe(self, planned_workload: str) -> str:
        """In words, e.g. "the proxy digits-mlp (batch 32) on 8 of the 64 workers"."""
        batch = (f"batch {self.batch_size}" if self.devices == 1 else
                 f"batch {self.batch_size} per device, {self.rank_batch} per island of "
                 f"{self.devices}")
        what = (f"the proxy {self.workload} ({batch})" if self.proxy
                else f"{planned_workload} itself ({batch})")
        where = (f"on {self.workers} of the {self.cluster_workers} workers"
                 if self.workers < self.cluster_workers else f"on all {self.workers} workers")
        return f"{what} {where}"


@dataclass(frozen=True)
class RowLearning:
    """One row's training: the accuracy after the horizon and its curve in rounds."""

    label: str
    accuracy: float
    curve: tuple[tuple[int, float], ...]  # (rounds trained, accuracy), in order
    rounds: int  # rounds the watched worker trained

    def rounds_to(self, target: float) -> int | None:
        """The first evaluated round at or above `target`; None when the run ended below it
        (a run that touched the target and fell back has not reached it)."""
        if self.accuracy < target:
            return None
        return next((r for r, accuracy in self.curve if accuracy >= target), self.rounds)

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "accuracy": self.accuracy, "rounds": self.rounds,
                "curve": [list(point) for point in self.curve]}

    @classmethod
    def from_json(cls, data: dict[str, Any], label: str) -> RowLearning:
        return cls(label, float(data["accuracy"]),
                   tuple((int(r), float(a)) for r, a in data["curve"]), int(data["rounds"]))


def learning_source(cfg: RunConfig, setup: Setup, *, stand_in_gradient: bool,
                    measured_step_s: float | None) -> LearningSource:
    """The planned workload when it is cheap to train and really timed (not a
    --gradient-size stand-in), else the proxy; on at most LEARNING_WORKERS nodes.
    `measured_step_s`: its gradient step as measured on this machine (None: the compute
    time was given, and only the parameter count tells)."""
    workers = setup.nodes
    nodes = spread_nodes(workers, min(workers, LEARNING_WORKERS))
    cheap = (measured_step_s <= DIRECT_STEP_S if measured_step_s is not None
             else setup.length <= DIRECT_PARAMS)
    devices = round(sum(cfg.cluster.devices_of(i) for i in nodes) / len(nodes))
    if not stand_in_gradient and cheap:
        return LearningSource(cfg.train.workload, cfg.train.batch_size, nodes, workers, False,
                              devices)
    return LearningSource(PROXY_WORKLOAD, PROXY_BATCH_SIZE, nodes, workers, True, devices)


def spread_nodes(workers: int, kept: int) -> tuple[int, ...]:
    """`kept` of `workers` ranks spread evenly (rank 0 first): every site of a cluster laid
    out site by site keeps some of its nodes."""
    return tuple(sorted({(i * workers) // kept for i in range(kept)}))


def learn_rows(setup: Setup, runs: list[SimRun], cfg: RunConfig, source: LearningSource,
               *, variant_of: Callable[[SimRun], Variant],
               announce: Callable[[str], None] | None = None) -> list[RowLearning]:
    """Each row of `runs` trained by `source` for LEARNING_ROUNDS rounds (cached per row).
    Raises what the training raises (a row the source cannot represent)."""
    from akosim.planning.compute_cache import cache_dir, store_json

    folder = cache_dir()
    shared = _shared_payload(setup, cfg, source)
    keys = [_row_key(shared, variant_of(run)) for run in runs]
    learned: list[RowLearning | None] = []
    for run, key in zip(runs, keys, strict=True):
        learned.append(_cached(folder / f"learning-{key}.json", run.label))
    missing = [i for i, row in enumerate(learned) if row is None]
    if missing:
        workload = _load(cfg, source)
        twin = twin_setup(setup, cfg, source, workload.param_count)
        for count, index in enumerate(missing, 1):
            run = runs[index]
            if announce is not None:
                announce(f"akosim: learning {count}/{len(missing)}: {run.label} "
                         f"({LEARNING_ROUNDS} rounds of {source.describe(cfg.train.workload)})")
            row = train_row(twin, twin_variant(variant_of(run), source), workload, run.label)
            store_json(folder / f"learning-{keys[index]}.json", row.to_json())
            learned[index] = row
    return [row for row in learned if row is not None]


def train_row(twin: Setup, variant: Variant, workload: FlatWorkload, label: str) -> RowLearning:
    """One configuration trained in simulated time on the twin."""
    from akosim.sim.scenario import simulate

    run = simulate(twin, variant, workload=workload, eval_every=EVAL_EVERY,
                   replicas=twin.nodes)  # every row one compilation (servers: fewer workers)
    rounds = max((w.rounds for w in run.per_worker), default=0)
    curve = tuple((e.round, float(e.accuracy)) for e in run.evaluations)
    return RowLearning(label, float(run.final_accuracy or 0.0), curve, rounds)


def _cached(path: Any, label: str) -> RowLearning | None:
    try:
        return RowLearning.from_json(json.loads(path.read_text(encoding="utf-8")), label)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _load(cfg: RunConfig, source: LearningSource) -> FlatWorkload:
    from akosim.planning.runspec import load_workload

    return load_workload(_train_config(cfg, source))


def _train_config(cfg: RunConfig, source: LearningSource) -> RunConfig:
    """`cfg` training `source`'s workload and batch (an island's: every device's), for
    LEARNING_ROUNDS rounds."""
    train = replace(cfg.train, workload=source.workload, batch_size=source.rank_batch,
                    rounds=LEARNING_ROUNDS, duration_s=None, target_accuracy=None,
                    data_path=None if source.proxy else cfg.train.data_path)
    return replace(cfg, train=train)


# ------------------------------------------------------------------ the twin


def twin_setup(setup: Setup, cfg: RunConfig, source: LearningSource, length: int) -> Setup:
    """The setup `source` trains on: its nodes, their compute, and the network scaled so
    that a round's sends weigh against compute as in the plan."""
    import numpy as np

    from akocore.resolve import network_arrays
    from akosim.planning.compute import ComputeModel
    from akosim.planning.setup import build_setup
    from akosim.sim.engine import StopRule

    idx = list(source.nodes)
    arrays = network_arrays(setup.config)
    peers = max(setup.nodes - 1, 1)
    factor = (length / setup.length) * (max(source.workers - 1, 1) / peers)
    links = arrays.link_bps[np.ix_(idx, idx)] * factor
    latency = arrays.latency_s[np.ix_(idx, idx)]
    network = replace(setup.config.network,
                      bandwidth_bps=tuple(float(b) * factor for b in arrays.uplink_bps[idx]),
                      link_bandwidth_bps=(), latency_s=(0.0,),
                      link_bandwidth_matrix_bps=_rows(links),
                      latency_matrix_s=_rows(latency))
    base = _train_config(cfg, source)
    exchange = setup.config.exchange
    if isinstance(exchange.p, tuple) and len(exchange.p) > 1:  # each row brings its own p
        exchange = replace(exchange, p=(max(exchange.p),))
    config = replace(base, network=network, exchange=exchange,
                     cluster=replace(setup.config.cluster, workers=source.workers, hosts=(),
                                     devices_per_rank=(1,)))  # an island: one rank_batch
    compute = setup.compute
    overheads = tuple(compute.overhead_of(i) for i in idx) if compute.cpu is None else (0.0,)
    twin_compute = ComputeModel(0.0, jitter=compute.jitter, seed=compute.seed,
                                per_worker_s=tuple(compute.base_s(i) for i in idx),
                                overhead_s=overheads,
                                inside_s=tuple(compute.inside_of(i) for i in idx))
    stop = StopRule(rounds=LEARNING_ROUNDS, drain=True)
    return build_setup(config, length=length, compute=twin_compute, stop=stop,
                       batch_size=source.rank_batch, coalesce_rel=setup.coalesce_rel,
                       message_overhead_s=tuple(setup.message_overhead_s[i % len(
                           setup.message_overhead_s)] for i in idx)
                       if setup.message_overhead_s else (),
                       compute_source=setup.compute_source, tcp=setup.tcp,
                       network_model=setup.network_model)


def twin_variant(variant: Variant, source: LearningSource) -> Variant:
    """`variant` on `source`'s nodes: their p, and the servers' share of the nodes kept."""
    p_of = variant.p_of
    if is_partitioned(variant.scheme) and len(p_of) > 1:
        p_of = tuple(p_of[i % len(p_of)] for i in source.nodes)
    servers = variant.ps_servers
    if has_servers(variant.scheme):
        share = servers / source.cluster_workers
        servers = min(max(1, round(share * source.workers)), source.workers - 1)
    return replace(variant, p_of=p_of, ps_servers=servers)


def _rows(matrix: Any) -> tuple[tuple[float, ...], ...]:
    return tuple(tuple(float(v) for v in row) for row in matrix)


# ------------------------------------------------------------------ the cache key


def _shared_payload(setup: Setup, cfg: RunConfig, source: LearningSource) -> dict[str, Any]:
    """What decides every row's training but the row itself: the source (its workload's
    identity, with a user's file digest), the kept nodes' network, compute and overheads,
    the planned gradient and cluster size (the twin's bandwidth scale), the training and
    exchange settings and the network model."""
    import numpy as np

    from akocore.resolve import network_arrays
    from akocore.settings.toml_io import config_to_dict
    from akocore.workloads.naming import cache_identity

    idx = list(source.nodes)
    arrays = network_arrays(setup.config)
    compute = setup.compute
    islands = {"devices": source.devices,
               "inside": [compute.inside_of(i) for i in idx]} if source.devices > 1 else {}
    return {
        **islands,
        "version": CACHE_VERSION, "rounds": LEARNING_ROUNDS, "eval_every": EVAL_EVERY,
        "workload": cache_identity(source.workload), "batch": source.batch_size,
        "nodes": idx, "cluster_workers": source.cluster_workers, "length": setup.length,
        "train": config_to_dict(_train_config(cfg, source))["train"],
        "exchange": config_to_dict(setup.config)["exchange"],
        "uplink": arrays.uplink_bps[idx].tolist(),
        "links": _finite(arrays.link_bps[np.ix_(idx, idx)]),
        "latency": arrays.latency_s[np.ix_(idx, idx)].tolist(),
        "compute": [compute.base_s(i) for i in idx],
        "overhead": [compute.overhead_of(i) for i in idx] if compute.cpu is None else "cpu",
        "jitter": compute.jitter, "seed": compute.seed,
        "message_overhead": list(setup.message_overhead_s),
        "network_model": setup.network_model_name, "tcp": repr(setup.tcp),
        "coalesce": setup.coalesce_rel,
    }


def _row_key(shared: dict[str, Any], variant: Variant) -> str:
    """A digest of everything that decides one row's training: `shared` and the row's own
    scheme, p, s and servers."""
    payload = {**shared,
               "variant": [variant.scheme, list(variant.p_of), variant.ssp, variant.ps_servers]}
    text = json.dumps(payload, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _finite(matrix: Any) -> list[list[float | None]]:
    return [[float(v) if math.isfinite(v) else None for v in row] for row in matrix]
