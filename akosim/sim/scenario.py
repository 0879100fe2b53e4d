"""One simulated configuration, start to finish, and what it measured.

`simulate(setup, variant)` builds the akocore nodes for a variant (ako with
its p, ps with k servers, allreduce), runs them over the configured network
with the compute model, and returns a `SimRun`: the figures a user compares
(round time, samples/s, bytes per worker per round, NIC utilisation,
staleness, the bottleneck) plus per-worker and per-link breakdowns. Its keys
are named as akorun names its measurements, so prediction and measurement
compare key by key. A setup whose stop rule settles simulates each variant
until its round time has settled (`settling_of`: the variant's warm-up and
window from its scheme's staleness bound and period, akosim.sim.settling) and
says how many rounds that took.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import simpy

from akocore.messages import FLOAT_BYTES
from akocore.planner import Plan
from akocore.records.figures import steady_round_time_s
from akocore.records.host_calibration import TcpParameters
from akocore.resolve import network_arrays, resolve_plan, scheme_spec
from akocore.schemes import build_nodes
from akocore.schemes.registry import has_servers, scheme_named, staleness_bound_rounds
from akocore.settings.schema import RunConfig
from akocore.units import format_bandwidth
from akocore.workloads.flat import FlatWorkload
from akosim.network.fluid import COALESCE_REL
from akosim.network.island_reduce import samples_per_round
from akosim.network.netmodel import build_network_model
from akosim.network.netspec import NetworkSpec
from akosim.network.netstats import NetworkUtilisation
from akosim.planning.compute import ComputeModel
from akosim.sim.engine import Simulation, StopRule, TraceEvent
from akosim.sim.settling import Settling, settled_round_time_s
from akosim.sim.sim_training import AccuracyTracker, BatchedGradients, Evaluation


@dataclass(frozen=True)
class Setup:
    """What every variant of one question shares."""

    config: RunConfig
    length: int  # gradient elements
    compute: ComputeModel
    batch_size: int
    stop: StopRule
    coalesce_rel: float = COALESCE_REL  # see akosim.network.fluid: finish within this of a message
    # per sending node: seconds a message costs beyond the wire (software stack), added
    # to the latency of each of its links; empty = none (`akosim --message-overhead`)
    message_overhead_s: tuple[float, ...] = ()
    compute_source: str = ""  # where compute came from, in words (printed, written to --out)
    # the numbers of the TCP layers (akosim.network.tcpmodel); None = defaults if the
    # network model has them
    tcp: TcpParameters | None = None
    # the network model (akosim.network.netmodel): a preset or LAYER+LAYER...; None =
    # "tcp" when `tcp` is given, else "maxmin"
    network_model: str | None = None

    @property
    def network_model_name(self) -> str:
        """The network model this setup simulates."""
        if self.network_model is not None:
            return self.network_model
        return "maxmin" if self.tcp is None else "tcp"

    # the planner's answer for the configured p, resolved once (akosim.planning); None: not yet
    plan: Plan | None = None

    def configured_plan(self) -> Plan:
        """The planner's answer for the configured p (resolved now if not yet)."""
        if self.plan is not None:
            return self.plan
        return resolve_plan(self.config, gradient_bytes=self.gradient_bytes,
                            length=self.length,
                            compute_s=tuple(self.compute.round_busy_s(i)
                                            for i in range(self.nodes)))

    @property
    def gradient_bytes(self) -> int:
        return self.length * FLOAT_BYTES

    def samples_per_round(self, training_ranks: int) -> int:
        """Samples the training ranks process per round: `batch_size` per device, every
        device of every island (akosim.network.island_reduce)."""
        return samples_per_round(self.config, self.batch_size, training_ranks)

    @property
    def nodes(self) -> int:
        return self.config.cluster.workers


@dataclass(frozen=True)
class Variant:
    """One configuration to simulate: a scheme and its parameters."""

    scheme: str
    p_of: tuple[int, ...] = (1,)
    ps_servers: int = 1
    ssp: float = 0.0
    label: str = ""
    p_reason: str = ""


@dataclass
class WorkerReport:
    rank: int
    rounds: int
    round_time_s: float
    compute_s: float
    wait_s: float
    bytes_sent: float
    bytes_received: float
    uplink_utilisation: float
    downlink_utilisation: float
    max_lag_rounds: int
    mean_lag_rounds: float


@dataclass
class SimRun:
    """The result of one simulated configuration (JSON-ready through to_dict)."""

    label: str
    scheme: str
    p: int
    p_of: list[int]
    p_reason: str
    ssp: float
    workers: int  # nodes in the cluster
    training_workers: int
    ps_servers: int
    round_time_s: float
    samples_per_s: float  # samples_per_round / round_time_s
    bytes_sent_per_worker_per_round: float
    compute_s_per_round: float
    wait_s_per_round: float
    nic_utilisation: float  # mean over training workers' uplinks
    max_uplink_utilisation: float
    max_downlink_utilisation: float
    staleness_bound_rounds: float
    max_lag_rounds: int
    bottleneck: str
    simulated_s: float
    wall_s: float
    events: dict[str, int]
    # rounds every training worker ended (a settling run: where its round time settled)
    simulated_rounds: int = 0
    settled: bool | None = None  # None: fixed rounds or duration; False: hit the cap
    warmup_rounds: int | None = None  # a settling run: the rounds before the measured span
    # every training device's batch per round (0: training_workers x the batch, as before)
    samples_per_round: int = 0
    per_worker: list[WorkerReport] = field(default_factory=list)
    per_link: list[dict[str, float | None]] = field(default_factory=list)
    evaluations: list[Evaluation] = field(default_factory=list)
    time_to_target_s: float | None = None
    final_accuracy: float | None = None
    trace: list[TraceEvent] = field(default_factory=list, repr=False)
    final_params: Any = field(default=None, repr=False)  # training: the first worker's
    # replica at the end, as the workload's own pytree (FlatWorkload.params_tree)


def network_spec(config: RunConfig, message_overhead_s: tuple[float, ...] = ()) -> NetworkSpec:
    """The configured network; `message_overhead_s[i % len]` is added to the latency of
    every link out of node i."""
    arrays = network_arrays(config)
    latency_s = arrays.latency_s
    if message_overhead_s:
        n = latency_s.shape[0]
        extra = np.array([message_overhead_s[i % len(message_overhead_s)] for i in range(n)])
        latency_s = latency_s + extra[:, None]
        np.fill_diagonal(latency_s, 0.0)
    return NetworkSpec(arrays.uplink_bps, arrays.downlink_bps, arrays.link_bps, latency_s)


def ako_variant(setup: Setup, p: str | tuple[int, ...] | None = None,
                label: str | None = None) -> Variant:
    """Ako with the configured p (or the given one), resolved by the planner."""
    config = setup.config
    if p is not None:
        config = replace(config, exchange=replace(config.exchange, p=p))
        plan = replace(setup, config=config, plan=None).configured_plan()
    else:
        plan = setup.configured_plan()
    given = config.exchange.p
    name = given if isinstance(given, str) else "given"
    text = f"ako p={plan.p}" if len(set(plan.p_of)) == 1 else \
        f"ako p={min(plan.p_of)}..{plan.p}"
    if name != "given":
        text += f" ({name})"
    return Variant("ako", plan.p_of, ssp=config.exchange.ssp, label=label or text,
                   p_reason=plan.binding)


def settling_of(setup: Setup, variant: Variant) -> Settling | None:
    """The settle rule of `variant` when `setup` settles (its scheme's staleness bound
    with the variant's largest p and s, and its period); None for fixed rounds."""
    rule = setup.stop.settle
    if rule is None:
        return None
    scheme = scheme_named(variant.scheme)
    exchange = setup.config.exchange
    lead = scheme.lead_rounds(exchange, p_max=max(variant.p_of), ssp=variant.ssp)
    return rule.for_scheme(lead, scheme.period_rounds(exchange))


def simulate(setup: Setup, variant: Variant, *, trace: bool = False,
             workload: FlatWorkload | None = None, eval_every: int = 10,
             target_accuracy: float | None = None,
             on_progress: Callable[[int], None] | None = None,
             replicas: int = 0) -> SimRun:
    """Run one variant. With `workload`, the workers really train (training mode); each
    batched gradient call is padded to at least `replicas` replicas (runs of different
    worker counts then share one compilation)."""
    config = setup.config
    # the variant's scheme reads its own keys (a compared DiLoCo row its configured H,
    # not the defaults: the config's scheme may be another)
    own = replace(config, exchange=replace(config.exchange, scheme=variant.scheme))
    spec = scheme_spec(own, variant.p_of, ps_servers=variant.ps_servers)
    if variant.ssp != spec.staleness:
        spec = replace(spec, staleness=variant.ssp)
    params0 = optimizer = None
    if workload is not None:
        params0 = np.array(workload.init_params, dtype=np.float32)
        optimizer = workload.optimizer(config.train.optimizer, config.train.lr)
    nodes = build_nodes(spec, setup.length, params0, optimizer)
    if workload is not None and setup.stop.rounds is not None:
        for node in nodes:  # training: ako's last s rounds end in step, as in akorun
            node.plan_rounds(setup.stop.rounds)
    ranks = [n.rank for n in nodes if n.is_worker]
    gradients = None
    tracker = None
    if workload is not None:
        gradients = BatchedGradients(workload, ranks, config.train.seed, replicas)
        tracker = AccuracyTracker(workload, eval_every, target_accuracy)
    watched = ranks[0]
    sim: Simulation

    def on_round(rank: int, rounds_done: int, now_s: float) -> None:
        if rank != watched:
            return
        if on_progress is not None:
            on_progress(rounds_done)
        if tracker is not None and rounds_done % tracker.every == 0:
            params = nodes[watched].params
            assert params is not None
            if tracker.evaluate(params, rounds_done, now_s):
                sim.request_stop()

    env = simpy.Environment()
    network = build_network_model(
        env, network_spec(config, setup.message_overhead_s),
        model=setup.network_model_name, tcp=setup.tcp,
        rtt_latency_s=network_arrays(config).latency_s, coalesce_rel=setup.coalesce_rel)
    sim = Simulation(nodes, network, setup.compute, setup.stop, gradients=gradients,
                     trace=trace, on_round=on_round, settling=settling_of(setup, variant))
    started = time.perf_counter()
    sim.run()
    wall_s = time.perf_counter() - started
    run = _report(setup, variant, spec.training_workers, sim, wall_s)
    if tracker is not None:
        params = nodes[watched].params
        assert params is not None
        run.final_accuracy = tracker.workload.evaluate(params)
        run.final_params = tracker.workload.params_tree(params)
        run.evaluations = tracker.history
        if target_accuracy is not None:
            run.time_to_target_s = tracker.time_to(target_accuracy)
    run.trace = sim.trace or []
    return run


def _report(setup: Setup, variant: Variant, training_workers: int, sim: Simulation,
            wall_s: float) -> SimRun:
    """Figures over the steady part of the run: up to the first worker's last round."""
    stats = sim.steady_stats or sim.net.stats()
    elapsed = stats.elapsed_s
    util = stats.utilisation if elapsed > 0 else None
    sent, received = stats.bytes_sent, stats.bytes_received
    workers = []
    period = scheme_named(variant.scheme).period_rounds(setup.config.exchange)
    watch = sim.settle_watch
    settled = watch if watch is not None and watch.settled is not None else None
    for rank, line in sorted(sim.timelines.items()):
        rounds = max(line.rounds, 1)
        workers.append(WorkerReport(
            rank=rank, rounds=line.rounds,
            round_time_s=steady_round_time_s(line.round_end_s, period) if settled is None
            else settled_round_time_s(line.round_end_s, settled.settling.warmup_rounds,
                                      settled.rounds),
            compute_s=line.compute_s, wait_s=line.wait_s,
            bytes_sent=float(sent[rank]), bytes_received=float(received[rank]),
            uplink_utilisation=float(util.uplink[rank]) if util else 0.0,
            downlink_utilisation=float(util.downlink[rank]) if util else 0.0,
            max_lag_rounds=line.max_lag_rounds, mean_lag_rounds=line.lag_sum / rounds))
    rounds_total = sum(w.rounds for w in workers)
    round_time = float(np.mean([w.round_time_s for w in workers]))
    bytes_per_round = sum(line.bytes_sent for line in sim.timelines.values()) / max(
        rounds_total, 1)
    spec = sim.net.spec
    per_link, bottleneck = _links(stats.link_bytes, spec, elapsed, util)
    staleness_bound = staleness_bound_rounds(variant.scheme, setup.config.exchange,
                                             p_max=max(variant.p_of), ssp=variant.ssp)
    return SimRun(
        label=variant.label or variant.scheme, scheme=variant.scheme, p=max(variant.p_of),
        p_of=list(variant.p_of), p_reason=variant.p_reason, ssp=variant.ssp,
        workers=setup.nodes, training_workers=training_workers,
        ps_servers=variant.ps_servers if has_servers(variant.scheme) else 0,
        round_time_s=round_time,
        samples_per_s=setup.samples_per_round(training_workers) / round_time
        if round_time > 0 else math.inf,
        samples_per_round=setup.samples_per_round(training_workers),
        bytes_sent_per_worker_per_round=bytes_per_round,
        compute_s_per_round=sum(w.compute_s for w in workers) / max(rounds_total, 1),
        wait_s_per_round=sum(w.wait_s for w in workers) / max(rounds_total, 1),
        nic_utilisation=float(np.mean([w.uplink_utilisation for w in workers])),
        max_uplink_utilisation=float(util.uplink.max()) if util else 0.0,
        max_downlink_utilisation=float(util.downlink.max()) if util else 0.0,
        staleness_bound_rounds=staleness_bound,
        max_lag_rounds=max((w.max_lag_rounds for w in workers), default=0),
        bottleneck=bottleneck, simulated_s=elapsed, wall_s=wall_s,
        events={"rate_solves": sim.net.rate_solves,
                "flow_completions": sim.net.flow_completions,
                "messages": sim.messages_sent, "deliveries": sim.deliveries,
                "duplicates": sim.duplicates},
        simulated_rounds=settled.rounds if settled is not None
        else min((w.rounds for w in workers), default=0),
        settled=settled.settled if settled is not None else None,
        warmup_rounds=settled.settling.warmup_rounds if settled is not None else None,
        per_worker=workers, per_link=per_link)


def _links(link_bytes: np.ndarray, spec: NetworkSpec, elapsed_s: float,
           util: NetworkUtilisation | None) -> tuple[list[dict[str, float | None]], str]:
    """Per-link traffic, and the most utilised resource in words."""
    src, dst = np.nonzero(link_bytes)
    caps = spec.link_bps[src, dst]
    sent = link_bytes[src, dst]
    capped = np.isfinite(caps) & (elapsed_s > 0)
    link_util = np.full(src.size, np.nan)
    link_util[capped] = sent[capped] * 8 / (caps[capped] * elapsed_s)
    per_link: list[dict[str, float | None]] = [
        {"src": i, "dst": j, "bytes": b, "cap_bps": c if math.isfinite(c) else None,
         "utilisation": None if math.isnan(u) else u}
        for i, j, b, c, u in zip(src.tolist(), dst.tolist(), sent.tolist(), caps.tolist(),
                                 link_util.tolist(), strict=True)]
    best_name, best_util = "none (no traffic)", -1.0
    if capped.any():
        k = int(np.nanargmax(link_util))
        best_name = f"link {src[k]}->{dst[k]} ({format_bandwidth(caps[k])})"
        best_util = float(link_util[k])
    if util is not None:
        for kind, values, nic_caps in (("uplink", util.uplink, spec.uplink_bps),
                                       ("downlink", util.downlink, spec.downlink_bps)):
            k = int(np.argmax(values))
            if values[k] > best_util + 1e-9:
                best_name = f"{kind} of node {k} ({format_bandwidth(nic_caps[k])})"
                best_util = float(values[k])
    if best_util >= 0:
        best_name += f", {100 * best_util:.0f}% busy"
    return per_link, best_name
