"""p auto: choose the number of partitions from bandwidth, compute and n.

Each round a worker sends S/p bytes to each of its n-1 peers while it
computes for T_c seconds. To keep the network at a target utilisation u:

    p = clamp(ceil((n-1) * 8S / (u * B * T_c)), 1, p_max)

where B is the worker's uplink in bits/s. Two more constraints can bind: the
slowest single link of a worker must carry one partition per round
(p >= 8S / (u * B_ij * T_c)), and every receiver's downlink must take the sum
of what all senders send it per round (incast). The planner returns p, the
constraint that bound it, and the staleness bound p - 1 + s in rounds.

`plan(..., per_worker=False)` gives one p for every worker (the largest any
constraint needs); `per_worker=True` gives each worker the smallest p its own
links allow, then raises the smallest ones until every receiver's downlink
fits (a uniform floor found by bisection).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from akocore.units import format_bandwidth

_EPS = 1e-9


@dataclass(frozen=True)
class PlanInputs:
    """What the planner needs; SI units (bytes, seconds, bits/s)."""

    workers: int
    gradient_bytes: float
    compute_s: float | tuple[float, ...]
    uplink_bps: tuple[float, ...]
    downlink_bps: tuple[float, ...]
    link_bps: tuple[tuple[float, ...], ...] | None = None  # n x n, inf = no cap
    utilisation: float = 0.9
    p_max: int = 1024
    length: int | None = None  # elements in the gradient: p can never exceed it
    staleness: float = 0.0

    def __post_init__(self) -> None:
        n = self.workers
        if n < 2:
            raise ValueError(f"workers: got {n}, expected >= 2")
        if self.gradient_bytes <= 0:
            raise ValueError(f"gradient size must be > 0 bytes, got {self.gradient_bytes}")
        if not 0 < self.utilisation <= 1:
            raise ValueError(f"utilisation: got {self.utilisation}, expected 0 < u <= 1")
        if len(self.uplink_bps) != n or len(self.downlink_bps) != n:
            raise ValueError(f"need one uplink and one downlink per worker ({n})")
        if np.any(self._compute() <= 0):
            raise ValueError("compute time per round must be > 0 s")

    def _compute(self) -> np.ndarray:
        return np.broadcast_to(np.asarray(self.compute_s, dtype=float), (self.workers,))


@dataclass(frozen=True)
class Plan:
    """The chosen p per worker, why, and what it implies."""

    p_of: tuple[int, ...]
    per_worker: bool
    bound_by: tuple[str, ...]  # per worker: the constraint that set its p
    required_p: tuple[float, ...]  # per worker, before rounding and clamping
    staleness: float
    utilisation: float

    @property
    def p(self) -> int:
        return max(self.p_of)

    @property
    def binding(self) -> str:
        """The reason behind the largest p."""
        return self.bound_by[int(np.argmax(self.p_of))]

    @property
    def staleness_bound_rounds(self) -> float:
        """Worst-case rounds a gradient component waits: p - 1 + s."""
        return self.p - 1 + self.staleness


def _ceil(x: float) -> int:
    return max(1, math.ceil(x - _EPS))


def plan(inputs: PlanInputs, *, per_worker: bool = False) -> Plan:
    n = inputs.workers
    bits = 8.0 * inputs.gradient_bytes
    u = inputs.utilisation
    compute = inputs._compute()
    up = np.asarray(inputs.uplink_bps, dtype=float)
    down = np.asarray(inputs.downlink_bps, dtype=float)
    links = (np.full((n, n), np.inf) if inputs.link_bps is None
             else np.asarray(inputs.link_bps, dtype=float))
    if links.shape != (n, n):
        raise ValueError(f"link matrix must be {n}x{n}, got {links.shape}")
    links = links.copy()
    np.fill_diagonal(links, np.inf)
    p_cap = inputs.p_max if inputs.length is None else min(inputs.p_max, inputs.length)

    # per-sender requirements: its uplink, its slowest link
    need_up = (n - 1) * bits / (u * up * compute)
    slowest = links.argmin(axis=1)
    slowest_bps = links[np.arange(n), slowest]
    need_link = bits / (u * slowest_bps * compute)
    required = np.maximum(need_up, need_link)
    reasons = [
        f"link {i}->{slowest[i]} ({format_bandwidth(slowest_bps[i])})"
        if need_link[i] > need_up[i] else f"uplink of worker {i} ({format_bandwidth(up[i])})"
        for i in range(n)
    ]
    # receivers: sum over senders of 8S/(p_i T_i) <= u * D_j
    rate_per_p = bits / compute  # bits/s a sender emits at p = 1

    def incast_ok(p_of: np.ndarray) -> np.ndarray:
        incoming = (rate_per_p / p_of).sum() - rate_per_p / p_of  # everyone but j itself
        return incoming <= u * down * (1 + 1e-12)

    if per_worker:
        p_of = np.array([_ceil(r) for r in required], dtype=float)
    else:
        p_of = np.full(n, float(_ceil(required.max())))
        reasons = [reasons[int(np.argmax(required))]] * n
    p_of = np.minimum(p_of, p_cap)
    if not incast_ok(p_of).all():
        lo, hi = 1, p_cap  # smallest uniform floor q with max(p_i, q) feasible
        if incast_ok(np.maximum(p_of, hi)).all():
            while lo < hi:
                mid = (lo + hi) // 2
                if incast_ok(np.maximum(p_of, mid)).all():
                    hi = mid
                else:
                    lo = mid + 1
        slow = int(np.argmin(down))
        raised = p_of < lo
        reason = f"downlink of worker {slow} ({format_bandwidth(down[slow])}, incast)"
        reasons = [reason if raised[i] else reasons[i] for i in range(n)]
        required = np.where(raised, np.maximum(required, lo), required)
        p_of = np.maximum(p_of, lo)
    final = np.minimum(p_of, p_cap).astype(int)
    for i in range(n):
        wanted = _ceil(required[i]) if per_worker else _ceil(required.max())
        if wanted > p_cap and final[i] == p_cap:
            reasons[i] = (f"p_max {p_cap} (the network needs p={wanted}; "
                          f"{reasons[i]} stays saturated)")
        elif final[i] == 1 and required[i] <= 1:
            reasons[i] = "nothing: p=1 fits in the compute time"
    return Plan(tuple(int(p) for p in final), per_worker, tuple(reasons),
                tuple(float(r) for r in required), inputs.staleness, u)


# ---------------------------------------------------------------------- p and s together


def send_time_s(inputs: PlanInputs, p_of: tuple[int, ...]) -> float:
    """Seconds the slowest worker's round of sends takes at full rate: its 1/p of the
    gradient to each peer over its uplink, its slowest link, or a receiver's downlink
    (incast), whichever is longest."""
    n = inputs.workers
    bits = 8.0 * inputs.gradient_bytes
    p = np.asarray(p_of, dtype=float)
    up = np.asarray(inputs.uplink_bps, dtype=float)
    down = np.asarray(inputs.downlink_bps, dtype=float)
    uplink_s = (n - 1) * bits / (p * up)
    if inputs.link_bps is None:
        link_s = np.zeros(n)
    else:
        links = np.asarray(inputs.link_bps, dtype=float).copy()
        np.fill_diagonal(links, np.inf)
        link_s = bits / (p * links.min(axis=1))
    incoming_bits = (bits / p).sum() - bits / p  # what each receiver takes in per round
    incast_s = incoming_bits / down
    return float(max(uplink_s.max(), link_s.max(), incast_s.max()))


def overlap_ssp(inputs: PlanInputs, p_of: tuple[int, ...], latency_s: float = 0.0) -> int:
    """The smallest staleness bound s that lets sending overlap compute.

    A worker may start round t + s + 1 once every peer's round-t partial has
    arrived, which takes the round's send time plus the latency after round t
    ends; with rounds of `compute` seconds that needs s x compute >= send +
    latency. At least 1: with s = 0 no byte is sent while computing.
    """
    compute = float(np.min(inputs._compute()))
    needed = (send_time_s(inputs, p_of) + latency_s) / compute
    return max(1, math.ceil(needed - 1e-9))


@dataclass(frozen=True)
class WayOut:
    """One way to bring propagation under a limit, and how far to go."""

    change: str  # "batch", "workers", "bandwidth"
    factor: float  # multiply the current value by this (workers: the new count / n)
    text: str


def ways_out(inputs: PlanInputs, chosen: Plan, max_rounds: float,
             batch_size: int) -> tuple[WayOut, ...]:
    """How to make p - 1 + s fit `max_rounds` (p is proportional to (n-1) x gradient /
    (bandwidth x compute), and compute to the batch): the factor each lever needs,
    cheapest (smallest change) first. Empty when the plan already fits or p=1 cannot."""
    if not math.isfinite(chosen.staleness) or chosen.staleness_bound_rounds <= max_rounds:
        return ()
    target_p = math.floor(max_rounds + 1 - chosen.staleness)
    if target_p < 1:
        return ()
    needed = max(chosen.required_p) / target_p  # how much p must shrink
    n = inputs.workers
    workers = max(2, math.floor((n - 1) / needed) + 1)
    batch = math.ceil(batch_size * needed)
    bandwidth = float(np.min(inputs.uplink_bps)) * needed
    options = [
        WayOut("batch", needed, f"batch {batch_size} -> {batch} (x{needed:.3g}, if compute "
                                f"grows with the batch)"),
        WayOut("bandwidth", needed, f"links {format_bandwidth(float(np.min(inputs.uplink_bps)))}"
                                    f" -> {format_bandwidth(bandwidth)} (x{needed:.3g})"),
    ]
    if workers < n:
        options.append(WayOut("workers", workers / n, f"workers {n} -> {workers}"))
    return tuple(sorted(options, key=lambda way: abs(math.log(way.factor))))
