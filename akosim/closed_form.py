"""Baselines in closed form where the simulation would give the same answer.

Ring all-reduce and the synchronous parameter server are lockstep: on a
homogeneous cluster (every node the same NIC, every pair the same cap and
latency, every worker the same compute time, no jitter) every round is the
same, so the figures the plan table shows follow from a few lines of
arithmetic instead of tens of thousands of simulated events:

* ring all-reduce, n nodes, chunks of the gradient cut as `partition_bounds`
  cuts them: each link i -> i+1 is alone on its sender's uplink and its
  receiver's downlink, so the ring is n independent queues; a max-plus
  recursion gives every send's time (exact while a worker's sends never
  overlap, i.e. the chunks are even or latency hides the difference) and a
  small event loop over the n queues handles the overlapping case exactly;
* parameter server, k servers, W = n - k workers: push then pull, each
  phase as long as its busiest resource (a worker's uplink carries the
  whole gradient, a server's downlink W copies of its shard, a pair's cap one
  shard): compute + overhead + 2 latency + push + pull.

The traffic counters mirror akosim.scenario's report over the same window
(start to the first worker's last dispatch). tests/test_closed_form.py checks
every figure against `scenario.simulate` on a grid of cases where both run;
anything else (heterogeneous links, stragglers, jitter, async PS, local-step
PS (SDAG), traces, training) returns None and is simulated.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from dataclasses import dataclass

import numpy as np

from akocore.figures import steady_round_time_s
from akocore.messages import FLOAT_BYTES
from akocore.partition import partition_bounds
from akocore.schemes.registry import has_servers, scheme_named
from akocore.units import format_bandwidth
from akosim.scenario import Setup, SimRun, Variant, WorkerReport, network_spec


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


def uniform(setup: Setup) -> Uniform | None:
    """The shared values when the cluster is homogeneous and the run fixed-length."""
    n, compute = setup.nodes, setup.compute
    if setup.stop.rounds is None or setup.stop.duration_s is not None or compute.jitter:
        return None
    spec = network_spec(setup.config, setup.message_overhead_s)
    off = ~np.eye(n, dtype=bool)
    caps, latency = spec.link_bps[off], spec.latency_s[off]
    base = [compute.base_s(i) for i in range(n)]
    overhead = [compute.overhead_of(i) for i in range(n)]
    if (np.ptp(spec.uplink_bps) or np.ptp(spec.downlink_bps) or np.ptp(latency)
            or not (np.all(caps == caps[0])) or max(base) != min(base)
            or max(overhead) != min(overhead)):
        return None
    return Uniform(float(spec.uplink_bps[0]), float(spec.downlink_bps[0]), float(caps[0]),
                   float(latency[0]), base[0], overhead[0], int(setup.stop.rounds))


def closed_form_run(setup: Setup, variant: Variant, *, trace: bool = False,
                    workload: object = None, **_simulate_options: object) -> SimRun | None:
    """The run of `variant` without simulating it, or None where it must be simulated
    (a trace or training needs the events, the TCP model its per-message delays;
    `_simulate_options` only matter then)."""
    if trace or workload is not None or setup.tcp is not None:
        return None
    shared = uniform(setup)
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


def _ring(setup: Setup, variant: Variant, u: Uniform) -> SimRun:
    """Ring all-reduce: worker i sends step s of round r once it has dispatched round r
    and processed step s-1 from i-1; each link i -> i+1 is alone on i's uplink and
    i+1's downlink, so it is a processor-sharing queue of its own at rate
    min(up, down, cap), a message arriving `latency` after its last byte. The fast
    max-plus recursion is exact while a worker's sends never overlap; when they do
    (uneven chunks), the per-link event loop is."""
    n, rounds = setup.nodes, u.rounds
    chunks = _chunk_bytes(setup.length, n)
    ranks = np.arange(n)
    sizes = np.array([chunks[(ranks - s) % n] if s < n - 1
                      else chunks[(ranks + 1 - (s - (n - 1))) % n] for s in range(2 * (n - 1))])
    rate = min(u.up_bps, u.down_bps, u.cap_bps)
    timing = _ring_recursion(sizes, rate, u) or _ring_events(sizes, rate, u)
    dispatch, window, carried, finished, delivered = timing
    # every round's bytes (the simulation's timeline counter may miss part of the last
    # round's forwarded chunks; the steady figure per round is this one)
    counted = sizes.sum(axis=0) * rounds
    round_times = [steady_round_time_s(dispatch[:, i].tolist()) for i in range(n)]
    waits = (dispatch[1:] - u.compute_s - u.overhead_s - dispatch[:-1]).sum(axis=0)
    links = [(i, (i + 1) % n, float(delivered[(i + 1) % n])) for i in range(n)]
    return _report(setup, variant, u, window, n, round_times=round_times, waits=waits,
                   counted=counted, carried_up=carried, carried_down=np.roll(carried, 1),
                   finished=finished, delivered=delivered, links=links)


RingTiming = tuple[np.ndarray, float, np.ndarray, np.ndarray, np.ndarray]


def _ring_recursion(sizes: np.ndarray, rate: float, u: Uniform) -> RingTiming | None:
    """(dispatch[r, i], window, bytes carried by each uplink, bytes of ended transfers
    per sender, bytes delivered per receiver) over the window; None on an overlap."""
    steps, n = sizes.shape
    rounds = u.rounds
    tx = sizes * 8 / rate
    begin = np.empty((rounds, steps, n))
    dispatch = np.empty((rounds, n))
    ready = np.zeros(n)  # when each worker may start its next round
    uplink_free = np.zeros(n)
    for r in range(rounds):
        dispatch[r] = ready + u.compute_s + u.overhead_s
        send = dispatch[r]
        for s in range(steps):
            if np.any(send < uplink_free):
                return None
            begin[r, s] = send
            uplink_free = send + tx[s]
            arrival = np.roll(uplink_free + u.latency_s, 1)  # i+1 receives from i
            if s < steps - 1:
                send = np.maximum(dispatch[r], arrival)
            else:
                ready = arrival
    window = float(dispatch[-1].min())  # the first worker's last dispatch
    ends = begin + tx
    carried = (np.clip(window - begin, 0.0, tx) * rate / 8).sum(axis=(0, 1))
    finished = np.where(ends <= window, sizes, 0.0).sum(axis=(0, 1))
    delivered = np.roll(np.where(ends + u.latency_s <= window, sizes, 0.0).sum(axis=(0, 1)), 1)
    return dispatch, window, carried, finished, delivered


def _ring_events(sizes: np.ndarray, rate: float, u: Uniform) -> RingTiming:
    """The same figures by an event loop over the n independent link queues (exact when
    a worker's sends overlap and share its link)."""
    steps, n = sizes.shape
    rounds, lead_s = u.rounds, u.compute_s + u.overhead_s
    size_of: list[list[float]] = sizes.tolist()  # plain floats: the loop reads them often
    events: list[tuple[float, int, str, int, int, int]] = []
    order = itertools.count()
    flows: list[dict[int, float]] = [{} for _ in range(n)]  # link i: flow id -> bits left
    flow_of: dict[int, tuple[int, int, float]] = {}  # flow id -> (round, step, bytes)
    link_t, version = [0.0] * n, [0] * n
    round_of, dispatched, processed = [0] * n, [False] * n, [-1] * n
    held: list[set[tuple[int, int]]] = [set() for _ in range(n)]
    dispatch = np.full((rounds, n), np.nan)
    sent_bits, ended, arrived = [0.0] * n, [0.0] * n, [0.0] * n
    snapshot: RingTiming | None = None

    def push(t: float, kind: str, node: int, a: int = 0, b: int = 0) -> None:
        heapq.heappush(events, (t, next(order), kind, node, a, b))

    def advance(i: int, t: float) -> None:
        if flows[i]:
            used = (t - link_t[i]) * rate / len(flows[i])
            for fid in flows[i]:
                flows[i][fid] -= used
        link_t[i] = t

    def reschedule(i: int, t: float) -> None:
        version[i] += 1
        if flows[i]:
            push(t + min(flows[i].values()) * len(flows[i]) / rate, "done", i, version[i])

    def send(i: int, r: int, s: int, t: float) -> None:
        advance(i, t)
        fid = next(order)
        size = size_of[s][i]
        flows[i][fid] = size * 8
        flow_of[fid] = (r, s, size)
        sent_bits[i] += size * 8
        reschedule(i, t)

    def process(j: int, t: float) -> None:
        while dispatched[j] and (round_of[j], processed[j] + 1) in held[j]:
            r, s = round_of[j], processed[j] + 1
            held[j].remove((r, s))
            processed[j] = s
            if s < steps - 1:
                send(j, r, s + 1, t)
            else:  # the ring of round r is complete here
                round_of[j], dispatched[j], processed[j] = r + 1, False, -1
                if r + 1 < rounds:
                    push(t + lead_s, "dispatch", j, r + 1)

    def arrive(j: int, r: int, s: int, t: float) -> None:
        arrived[j] += size_of[s][(j - 1) % n]
        held[j].add((r, s))
        process(j, t)

    for i in range(n):
        push(lead_s, "dispatch", i, 0)
    while events:
        t, _, kind, node, a, b = heapq.heappop(events)
        if kind == "dispatch":
            if a == rounds - 1 and snapshot is None:  # the window ends: take the counters
                for i in range(n):
                    advance(i, t)
                left = np.array([sum(f.values()) for f in flows])
                snapshot = (dispatch, t, (np.array(sent_bits) - left) / 8, np.array(ended),
                            np.array(arrived))
            dispatch[a, node] = t
            dispatched[node] = True
            send(node, a, 0, t)
            process(node, t)
        elif kind == "done":
            if a != version[node]:
                continue
            advance(node, t)
            # the flow this event was scheduled for ends now (and any within rounding of it)
            lowest = min(flows[node].values())
            tolerance = lowest + 1e-9 * max(abs(lowest), max(flows[node].values()), 1.0)
            for fid in [f for f, bits in flows[node].items() if bits <= tolerance]:
                del flows[node][fid]
                r, s, size = flow_of.pop(fid)
                ended[node] += size
                if u.latency_s > 0:
                    push(t + u.latency_s, "arrive", (node + 1) % n, r, s)
                else:  # arrives now: no need to queue it
                    arrive((node + 1) % n, r, s, t)
            reschedule(node, t)
        else:
            arrive(node, a, b, t)
    assert snapshot is not None
    return snapshot


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
    steady = steady_round_time_s(dispatch.tolist())
    return _report(setup, variant, u, window, workers, round_times=[steady] * workers,
                   waits=np.full(workers, done * (round_s - u.compute_s - u.overhead_s)),
                   counted=np.full(workers, rounds * total), carried_up=crossed,
                   carried_down=crossed, finished=crossed, delivered=crossed, links=links)


def _report(setup: Setup, variant: Variant, u: Uniform, window: float, workers: int, *,
            round_times: list[float], waits: np.ndarray, counted: np.ndarray,
            carried_up: np.ndarray, carried_down: np.ndarray, finished: np.ndarray,
            delivered: np.ndarray, links: list[tuple[int, int, float]]) -> SimRun:
    """The SimRun akosim.scenario reports, from counters over [0, `window`] (start to
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
        round_time_s=round_s, samples_per_s=workers * setup.batch_size / round_s,
        bytes_sent_per_worker_per_round=float(counted[:workers].sum()) / (workers * rounds),
        compute_s_per_round=u.compute_s,
        wait_s_per_round=float(waits.sum()) / (workers * rounds),
        nic_utilisation=float(up_util[:workers].mean()),
        max_uplink_utilisation=float(up_util.max()),
        max_downlink_utilisation=float(down_util.max()),
        staleness_bound_rounds=0.0, max_lag_rounds=0,
        bottleneck=_bottleneck(u, per_link, up_util, down_util),
        simulated_s=window, wall_s=0.0, events={"closed_form": 1},
        per_worker=reports, per_link=per_link)


def _bottleneck(u: Uniform, per_link: list[dict[str, float | None]], up: np.ndarray,
                down: np.ndarray) -> str:
    """The busiest resource in akosim.scenario's words; "every node" when all tie."""
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
