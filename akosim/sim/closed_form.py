"""Baselines in closed form where the simulation would give the same answer.

Ring all-reduce and the synchronous parameter server are lockstep: on a
homogeneous cluster (every node the same NIC, every pair the same cap and
latency, every worker the same compute time, no jitter) every round is the
same, so the figures the plan table shows follow from a few lines of
arithmetic instead of tens of thousands of simulated events:

* ring all-reduce, n nodes, chunks of the gradient cut as `partition_bounds`
  cuts them: each link i -> i+1 is alone on its sender's uplink and its
  receiver's downlink and carries its messages in order (the ring's
  neighbour stream), so the ring is n independent FIFO queues and a max-plus
  recursion gives every send's time (`ring_round_ends`, on any NICs, caps and
  latencies: tests/test_ring_uneven.py checks the simulation against it);
* parameter server, k servers, W = n - k workers: push then pull, each
  phase as long as its busiest resource (a worker's uplink carries the
  whole gradient, a server's downlink W copies of its shard, a pair's cap one
  shard): compute + overhead + 2 latency + push + pull; on any cluster with
  one server, `sync_ps_round_ends` (each phase one shared NIC filled max-min;
  tests/test_ring_uneven.py checks it).

The traffic counters mirror akosim.sim.scenario's report over the same window
(start to the first worker's last dispatch). tests/test_closed_form.py checks
every figure against `scenario.simulate` on a grid of cases where both run;
a settling setup (akosim.sim.settling) takes the rounds of its first check,
where the simulation of a lockstep run settles;
anything else (heterogeneous links, stragglers, jitter, async PS, local-step
PS (SDAG), traces, training, a codec) returns None and is simulated.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from akocore.messages import FLOAT_BYTES
from akocore.partition import partition_bounds
from akocore.records.figures import steady_round_time_s
from akocore.schemes.registry import has_servers, scheme_named, wire_codec
from akocore.settings.normalise import network_layers
from akocore.units import format_bandwidth
from akosim.network.netspec import NetworkSpec
from akosim.sim.scenario import (
    Setup,
    SimRun,
    Variant,
    WorkerReport,
    network_spec,
    settling_of,
)
from akosim.sim.settling import settled_round_time_s


@dataclass(frozen=True)
class Uniform:
    """The one value every node and pair shares (SI units)."""

    up_bps: float
    down_bps: float
    cap_bps: float  # inf: no per-pair cap
    latency_s: float
    compute_s: float
    overhead_s: float
    rounds: int
    # a settling setup: the rounds before the measured span (every round of these lockstep
    # schemes takes the same time, so the run settles at its first check); None: fixed
    warmup_rounds: int | None = None

    def round_time_s(self, round_end_s: Sequence[float]) -> float:
        """One worker's round time as akosim.sim.scenario reports it."""
        if self.warmup_rounds is None:
            return steady_round_time_s(round_end_s)
        return settled_round_time_s(round_end_s, self.warmup_rounds, self.rounds)


def uniform(setup: Setup, variant: Variant) -> Uniform | None:
    """The shared values when the cluster is homogeneous and the run fixed-length (or
    settling: the rounds of its first check)."""
    n, compute = setup.nodes, setup.compute
    settling = settling_of(setup, variant)
    if settling is not None:
        rounds, warmup = settling.first_check_rounds, settling.warmup_rounds
    elif setup.stop.rounds is None or setup.stop.duration_s is not None:
        return None
    else:
        rounds, warmup = setup.stop.rounds, None
    if compute.jitter:
        return None
    spec = network_spec(setup.config, setup.message_overhead_s)
    off = ~np.eye(n, dtype=bool)
    caps, latency = spec.link_bps[off], spec.latency_s[off]
    base = [compute.base_s(i) for i in range(n)]
    # an island's inside all-reduce is spent where the overhead is: after the gradient,
    # before the sends (akosim.sim.engine), so the closed forms add it to the overhead
    overhead = [compute.overhead_of(i) + compute.inside_of(i) for i in range(n)]
    if (np.ptp(spec.uplink_bps) or np.ptp(spec.downlink_bps) or np.ptp(latency)
            or not (np.all(caps == caps[0])) or max(base) != min(base)
            or max(overhead) != min(overhead)):
        return None
    return Uniform(float(spec.uplink_bps[0]), float(spec.downlink_bps[0]), float(caps[0]),
                   float(latency[0]), base[0], overhead[0], int(rounds), warmup)


def closed_form_run(setup: Setup, variant: Variant, *, trace: bool = False,
                    workload: object = None, **_simulate_options: object) -> SimRun | None:
    """The run of `variant` without simulating it, or None where it must be simulated
    (a trace or training needs the events, the TCP model its per-message delays;
    `_simulate_options` only matter then)."""
    if trace or workload is not None or network_layers(setup.network_model_name):
        return None  # only the max-min fluid network alone has these closed forms
    if wire_codec(setup.config.exchange) != "none":
        return None  # coded sizes and codec CPU: simulated
    shared = uniform(setup, variant)
    if shared is None:
        return None
    started = time.perf_counter()
    pattern = scheme_named(variant.scheme).pattern
    if pattern == "ring":
        run = _ring(setup, variant, shared)
    elif (pattern == "servers" and setup.config.exchange.ps_mode == "sync"
          and not setup.config.exchange.local_steps  # SDAG exchanges every lambda rounds
          and variant.ssp == 0 and 1 <= variant.ps_servers < setup.nodes):
        run = _ps(setup, variant, shared)
    else:
        return None
    if run is not None:
        run.wall_s = time.perf_counter() - started
    return run


def _chunk_bytes(length: int, parts: int) -> np.ndarray:
    return np.diff(partition_bounds(length, parts)).astype(float) * FLOAT_BYTES


def ring_step_sizes(length: int, n: int) -> np.ndarray:
    """sizes[s, i]: bytes node i sends at ring step s (2(n-1) steps), as
    akocore.schemes.allreduce cuts them."""
    chunks = _chunk_bytes(length, n)
    ranks = np.arange(n)
    return np.array([chunks[(ranks - s) % n] if s < n - 1
                     else chunks[(ranks + 1 - (s - (n - 1))) % n] for s in range(2 * (n - 1))])


def ring_links(spec: NetworkSpec) -> tuple[np.ndarray, np.ndarray]:
    """(rate_bps[i], latency_s[i]) of each ring link i -> i+1: alone on i's uplink and
    i+1's downlink, it runs at min(up_i, down_i+1, cap_i,i+1)."""
    n = spec.n
    ranks = np.arange(n)
    following = (ranks + 1) % n
    rate_bps = np.minimum(np.minimum(spec.uplink_bps, spec.downlink_bps[following]),
                          spec.link_bps[ranks, following])
    return rate_bps.astype(float), spec.latency_s[ranks, following].astype(float)


def ring_round_ends(sizes: np.ndarray, rate_bps: np.ndarray, latency_s: np.ndarray,
                    lead_s: np.ndarray, rounds: int) -> np.ndarray:
    """dispatch[r, i]: when worker i ends round r (hands its gradient to the ring).

    The step-by-step closed form of ring all-reduce on any NICs, per-pair caps and
    latencies: link i -> i+1 carries one message at a time at rate_bps[i] (its
    in-order stream), a message arriving latency_s[i] after its last byte left.
    Worker i sends step 0 of round r at its dispatch (round r-1's ring complete
    there, then lead_s[i] of compute and overhead) and step s + 1 once step s has
    arrived from i - 1, each no earlier than its previous message left. With no
    latency every step waits for the slowest link, so a round's ring takes the
    sum over its steps of each step's slowest chunk time.
    """
    return _ring_timing(sizes, rate_bps, latency_s, lead_s, rounds)[0]


RingTiming = tuple[np.ndarray, float, np.ndarray, np.ndarray, np.ndarray]


def _ring_timing(sizes: np.ndarray, rate_bps: np.ndarray, latency_s: np.ndarray,
                 lead_s: np.ndarray, rounds: int) -> RingTiming:
    """(dispatch[r, i], window, bytes carried by each uplink, bytes of ended transfers
    per sender, bytes delivered per receiver) over the window (start to the first
    worker's last dispatch), by the max-plus recursion of `ring_round_ends`."""
    steps, n = sizes.shape
    tx = sizes * 8 / rate_bps
    begin = np.empty((rounds, steps, n))
    dispatch = np.empty((rounds, n))
    ready = np.zeros(n)  # when each worker may start its next round
    link_free = np.zeros(n)
    for r in range(rounds):
        dispatch[r] = ready + lead_s
        send = dispatch[r]
        for s in range(steps):
            send = np.maximum(send, link_free)
            begin[r, s] = send
            link_free = send + tx[s]
            arrival = np.roll(link_free + latency_s, 1)  # i+1 receives from i
            if s < steps - 1:
                send = np.maximum(dispatch[r], arrival)
            else:
                ready = arrival
    window = float(dispatch[-1].min())
    ends = begin + tx
    carried = (np.clip(window - begin, 0.0, tx) * rate_bps / 8).sum(axis=(0, 1))
    finished = np.where(ends <= window, sizes, 0.0).sum(axis=(0, 1))
    delivered = np.roll(np.where(ends + latency_s <= window, sizes, 0.0).sum(axis=(0, 1)), 1)
    return dispatch, window, carried, finished, delivered


def _water_fill(caps_bps: np.ndarray, capacity_bps: float) -> np.ndarray:
    """Max-min rates of flows with their own caps through one shared resource."""
    rates = np.empty_like(caps_bps)
    left, count = capacity_bps, caps_bps.shape[0]
    order = np.argsort(caps_bps, kind="stable")
    for k, i in enumerate(order.tolist()):
        share = left / (count - k)
        if caps_bps[i] <= share:
            rates[i] = caps_bps[i]
            left -= caps_bps[i]
        else:
            rates[order[k:]] = share
            break
    return rates


def _shared_ends(start_s: np.ndarray, size_bits: float, caps_bps: np.ndarray,
                 capacity_bps: float) -> np.ndarray:
    """When each flow ends: flow i of `size_bits` starts at start_s[i], runs at no more
    than caps_bps[i] and shares one resource of `capacity_bps` max-min fairly with the
    others under way (flows ending within 1e-9 of the first end with it, as in
    akosim.network.fluid)."""
    count = start_s.shape[0]
    ends = np.full(count, np.inf)
    left = np.full(count, float(size_bits))
    active = np.zeros(count, dtype=bool)
    waiting = sorted(range(count), key=lambda i: start_s[i])
    now = float(start_s[waiting[0]])
    while waiting or active.any():
        while waiting and start_s[waiting[0]] <= now:
            active[waiting.pop(0)] = True
        flows = np.flatnonzero(active)
        rates = _water_fill(caps_bps[flows], capacity_bps) if flows.size else flows
        finish = now + left[flows] / rates if flows.size else np.empty(0)
        arrival = float(start_s[waiting[0]]) if waiting else np.inf
        first = float(finish.min()) if flows.size else np.inf
        if arrival < first:
            left[flows] -= rates * (arrival - now)
            now = arrival
            continue
        due = first + (1e-9 * abs(first) + 1e-12)
        done = finish <= due
        left[flows] -= rates * (first - now)
        now = first
        ends[flows[done]] = now
        active[flows[done]] = False
    return ends


def sync_ps_round_ends(spec: NetworkSpec, length: int, lead_s: np.ndarray,
                       rounds: int) -> np.ndarray:
    """dispatch[r, w]: when worker w ends round r, synchronous ps with one server.

    The step-by-step closed form on any NICs, per-pair caps and latencies: the
    server is the last node, workers 0..n-2. A round's push: each worker sends the
    whole gradient at its dispatch, its flow held by its uplink and pair cap and
    sharing the server's downlink max-min with the pushes under way; the server
    answers once every push has arrived (transfer, then the pair's latency), all
    at once, the answers sharing its uplink, each held by the worker's downlink and
    pair cap; a worker dispatches its next round lead_s[w] (compute and overhead)
    after its answer arrived.
    """
    n = spec.n
    workers, server = n - 1, n - 1
    ranks = np.arange(workers)
    size_bits = float(length * FLOAT_BYTES * 8)
    push_cap = np.minimum(spec.uplink_bps[:workers], spec.link_bps[ranks, server])
    pull_cap = np.minimum(spec.downlink_bps[:workers], spec.link_bps[server, ranks])
    dispatch = np.empty((rounds, workers))
    dispatch[0] = lead_s[:workers]
    for r in range(rounds - 1):
        pushed = _shared_ends(dispatch[r], size_bits, push_cap, float(spec.downlink_bps[server]))
        answer_s = float((pushed + spec.latency_s[ranks, server]).max())
        pulled = _shared_ends(np.full(workers, answer_s), size_bits, pull_cap,
                              float(spec.uplink_bps[server]))
        dispatch[r + 1] = pulled + spec.latency_s[server, ranks] + lead_s[:workers]
    return dispatch


def _ring(setup: Setup, variant: Variant, u: Uniform) -> SimRun:
    """Ring all-reduce on a homogeneous cluster: `ring_round_ends` and its counters."""
    n, rounds = setup.nodes, u.rounds
    sizes = ring_step_sizes(setup.length, n)
    rate = min(u.up_bps, u.down_bps, u.cap_bps)
    timing = _ring_timing(sizes, np.full(n, rate), np.full(n, u.latency_s),
                          np.full(n, u.compute_s + u.overhead_s), rounds)
    dispatch, window, carried, finished, delivered = timing
    # every round's bytes (the simulation's timeline counter may miss part of the last
    # round's forwarded chunks; the steady figure per round is this one)
    counted = sizes.sum(axis=0) * rounds
    round_times = [u.round_time_s(dispatch[:, i].tolist()) for i in range(n)]
    waits = (dispatch[1:] - u.compute_s - u.overhead_s - dispatch[:-1]).sum(axis=0)
    links = [(i, (i + 1) % n, float(delivered[(i + 1) % n])) for i in range(n)]
    return _report(setup, variant, u, window, n, round_times=round_times, waits=waits,
                   counted=counted, carried_up=carried, carried_down=np.roll(carried, 1),
                   finished=finished, delivered=delivered, links=links)


def _ps(setup: Setup, variant: Variant, u: Uniform) -> SimRun:
    """Synchronous ps: every worker pushes shard j to server j, each server pulls back
    once it has every push; all workers in step, so every round is the same."""
    n, k, rounds = setup.nodes, variant.ps_servers, u.rounds
    workers = n - k
    shards = _chunk_bytes(setup.length, k)
    total = shards.sum()
    push_s = max(total * 8 / u.up_bps, workers * shards.max() * 8 / u.down_bps,
                 shards.max() * 8 / u.cap_bps)
    pull_s = max(workers * shards.max() * 8 / u.up_bps, total * 8 / u.down_bps,
                 shards.max() * 8 / u.cap_bps)
    round_s = u.compute_s + u.overhead_s + 2 * u.latency_s + push_s + pull_s
    dispatch = u.compute_s + u.overhead_s + round_s * np.arange(rounds)
    window = float(dispatch[-1])
    done = rounds - 1  # rounds whose traffic has crossed by the window's end
    crossed = done * np.concatenate([np.full(workers, total), workers * shards])
    links = [(w, workers + j, done * float(shards[j])) for w in range(workers) for j in range(k)]
    links += [(workers + j, w, done * float(shards[j])) for j in range(k)
              for w in range(workers)]
    steady = u.round_time_s(dispatch.tolist())
    return _report(setup, variant, u, window, workers, round_times=[steady] * workers,
                   waits=np.full(workers, done * (round_s - u.compute_s - u.overhead_s)),
                   counted=np.full(workers, rounds * total), carried_up=crossed,
                   carried_down=crossed, finished=crossed, delivered=crossed, links=links)


def _report(setup: Setup, variant: Variant, u: Uniform, window: float, workers: int, *,
            round_times: list[float], waits: np.ndarray, counted: np.ndarray,
            carried_up: np.ndarray, carried_down: np.ndarray, finished: np.ndarray,
            delivered: np.ndarray, links: list[tuple[int, int, float]]) -> SimRun:
    """The SimRun akosim.sim.scenario reports, from counters over [0, `window`] (start to
    the first worker's last dispatch); `counted`: the bytes each worker's timeline
    counts, `carried_*`: bytes each NIC carried, `finished`/`delivered`: bytes of
    transfers ended / messages arrived, per node."""
    rounds = u.rounds
    up_util = carried_up * 8 / (u.up_bps * window)
    down_util = carried_down * 8 / (u.down_bps * window)
    reports = [WorkerReport(
        rank=i, rounds=rounds, round_time_s=round_times[i], compute_s=rounds * u.compute_s,
        wait_s=float(waits[i]), bytes_sent=float(finished[i]),
        bytes_received=float(delivered[i]), uplink_utilisation=float(up_util[i]),
        downlink_utilisation=float(down_util[i]), max_lag_rounds=0, mean_lag_rounds=0.0)
        for i in range(workers)]
    capped = math.isfinite(u.cap_bps)
    per_link: list[dict[str, float | None]] = [
        {"src": src, "dst": dst, "bytes": size, "cap_bps": u.cap_bps if capped else None,
         "utilisation": size * 8 / (u.cap_bps * window) if capped else None}
        for src, dst, size in links]
    round_s = float(np.mean(round_times))
    return SimRun(
        label=variant.label or variant.scheme, scheme=variant.scheme, p=1, p_of=[1],
        p_reason=variant.p_reason, ssp=variant.ssp, workers=setup.nodes,
        training_workers=workers,
        ps_servers=variant.ps_servers if has_servers(variant.scheme) else 0,
        round_time_s=round_s, samples_per_s=setup.samples_per_round(workers) / round_s,
        samples_per_round=setup.samples_per_round(workers),
        bytes_sent_per_worker_per_round=float(counted[:workers].sum()) / (workers * rounds),
        compute_s_per_round=u.compute_s,
        wait_s_per_round=float(waits.sum()) / (workers * rounds),
        nic_utilisation=float(up_util[:workers].mean()),
        max_uplink_utilisation=float(up_util.max()),
        max_downlink_utilisation=float(down_util.max()),
        staleness_bound_rounds=0.0, max_lag_rounds=0,
        bottleneck=_bottleneck(u, per_link, up_util, down_util),
        simulated_s=window, wall_s=0.0, events={"closed_form": 1},
        simulated_rounds=rounds, settled=None if u.warmup_rounds is None else True,
        warmup_rounds=u.warmup_rounds, per_worker=reports, per_link=per_link)


def _bottleneck(u: Uniform, per_link: list[dict[str, float | None]], up: np.ndarray,
                down: np.ndarray) -> str:
    """The busiest resource in akosim.sim.scenario's words; "every node" when all tie."""
    best_name, best = "none (no traffic)", -1.0
    busy = [(float(link["utilisation"]), f"{link['src']}->{link['dst']}") for link in per_link
            if link["utilisation"] is not None]
    if busy:
        best, name = max(busy)
        tie = all(math.isclose(util, best, rel_tol=1e-4) for util, _ in busy)
        best_name = f"link {'of every busy pair' if tie else name} " \
                    f"({format_bandwidth(u.cap_bps)})"
    for kind, values, cap in (("uplink", up, u.up_bps), ("downlink", down, u.down_bps)):
        if values.max() > best + 1e-9:
            top = np.isclose(values, values.max(), rtol=1e-4, atol=0)
            who = "every node" if top.all() else f"node {int(np.argmax(values))}"
            best_name, best = f"{kind} of {who} ({format_bandwidth(cap)})", float(values.max())
    if best >= 0:
        best_name += f", {100 * best:.0f}% busy"
    return best_name
