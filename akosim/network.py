"""The simulated network: a flow-level fluid model with max-min fair sharing.

This module owns three things:

* `NetworkSpec`: what the network is. Node i has a full-duplex NIC with an
  uplink of `uplink_bps[i]` and a downlink of `downlink_bps[i]`; every ordered
  pair (i, j) may add its own cap `link_bps[i, j]` (np.inf: no cap) and a
  one-way latency `latency_s[i, j]`.
* `max_min_rates`: the pure bandwidth-sharing rule. A flow i -> j crosses three
  resources (uplink i, downlink j, link (i, j)); concurrent flows get the
  max-min fair rates found by progressive filling (water-filling).
* `FluidNetwork`: the network on a SimPy clock. It holds the active flows as
  numpy arrays, recomputes rates only when flows start or end, drains every
  flow at a constant rate in between, coalesces simultaneous starts and
  completions into one rate solve, delivers each message `latency_s[i, j]`
  after its last byte left (bandwidth is used from the start of the flow) and
  keeps per-node and per-link traffic statistics.

Units: capacities and rates in bits per second, sizes in bytes, times in
seconds. No packets, no per-chunk events: the cost of a simulation grows with
the number of distinct rate changes, not with the number of bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import simpy
from simpy.events import EventPriority

BITS_PER_BYTE = 8

# Two bottleneck shares within this relative distance are one level of the
# progressive filling; a resource whose leftover capacity is within it of zero
# is saturated.
_TIE_REL = 1e-9
# Flows whose finish times lie within this of the earliest one finish together.
_FINISH_REL = 1e-9
_FINISH_ABS_S = 1e-12
# A message whose remaining transfer time is within this fraction of its own
# duration finishes with the earliest: partitions that differ by one element
# would otherwise split a symmetric round (or a ring step) into one event per
# flow. Bounded error: at most 0.01% of each message's transfer time.
COALESCE_REL = 1e-4
# The network's wake-up runs after every ordinary event of the same instant,
# so all sends made at one instant join one rate solve.
_LATE = EventPriority(2)
# Up to this many ordered pairs, per-pair caps are indexed densely; above it the
# pairs in use are compacted at every solve (no n x n arrays per solve).
_DENSE_PAIRS_MAX = 1 << 16
# Delivered-traffic logs are folded into the counters after this many entries.
_LOG_FLUSH_ENTRIES = 1 << 20
# Up to this many ordered pairs, delivered bytes are summed per pair by a bincount.
_BINCOUNT_PAIRS_MAX = 1 << 22
# Below this many flows a full solve is as cheap as finding a component.
_LOCAL_SOLVE_MIN_FLOWS = 32

DeliveryCallback = Callable[[np.ndarray, Any], None]
# Flows whose transfer ended: (senders, receivers, batch ids, sizes in bytes)
_Finished = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
_NO_FLOWS: tuple[np.ndarray, np.ndarray] = (np.empty(0, np.intp), np.empty(0, np.intp))
# (sender, receivers, size in bytes (one for all or one each), pair keys, batch id)
_Start = tuple[int, np.ndarray, float | np.ndarray, np.ndarray | None, int]


# --------------------------------------------------------------------------- spec


def _float_array(name: str, value: object, shape: tuple[int, ...]) -> np.ndarray:
    try:
        array = np.array(value, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise ValueError(f"NetworkSpec.{name} must be numeric, got {value!r}") from error
    if array.shape != shape:
        raise ValueError(
            f"NetworkSpec.{name} must have shape {shape} (n = {shape[0]} nodes, "
            f"taken from uplink_bps), got shape {array.shape}"
        )
    if np.isnan(array).any():
        where = tuple(int(k) for k in np.argwhere(np.isnan(array))[0])
        raise ValueError(f"NetworkSpec.{name}{list(where)} is NaN")
    array.setflags(write=False)
    return array


def _first_bad(name: str, array: np.ndarray, bad: np.ndarray, expected: str) -> None:
    if bad.any():
        where = tuple(int(k) for k in np.argwhere(bad)[0])
        raise ValueError(
            f"NetworkSpec.{name}{list(where)} = {float(array[where])!r}: expected {expected}"
        )


@dataclass(frozen=True, eq=False)
class NetworkSpec:
    """Capacities (bits/s) and latencies (s) of an n-node network.

    `uplink_bps` and `downlink_bps` have shape (n,) and must be positive and
    finite. `link_bps` and `latency_s` have shape (n, n); `link_bps` must be
    positive (np.inf means no per-pair cap) and `latency_s` non-negative and
    finite. Diagonals are never used (a node does not send to itself). The
    arrays are stored as read-only float64 copies. Equality is identity.
    """

    uplink_bps: np.ndarray
    downlink_bps: np.ndarray
    link_bps: np.ndarray
    latency_s: np.ndarray

    def __post_init__(self) -> None:
        try:
            uplink: np.ndarray | None = np.array(self.uplink_bps, dtype=np.float64)
        except (TypeError, ValueError):
            uplink = None
        if uplink is None or uplink.ndim != 1 or uplink.shape[0] < 1:
            raise ValueError(
                "NetworkSpec.uplink_bps must be a 1-D array with one capacity (bits/s) "
                f"per node, got {self.uplink_bps!r}"
            )
        n = uplink.shape[0]
        uplink = _float_array("uplink_bps", uplink, (n,))
        downlink = _float_array("downlink_bps", self.downlink_bps, (n,))
        link = _float_array("link_bps", self.link_bps, (n, n))
        latency = _float_array("latency_s", self.latency_s, (n, n))
        for name, nic in (("uplink_bps", uplink), ("downlink_bps", downlink)):
            _first_bad(
                name, nic, ~((nic > 0) & np.isfinite(nic)), "a positive, finite capacity in bits/s"
            )
        _first_bad(
            "link_bps", link, ~(link > 0), "a positive capacity in bits/s (np.inf for no cap)"
        )
        _first_bad(
            "latency_s",
            latency,
            ~((latency >= 0) & np.isfinite(latency)),
            "a non-negative, finite latency in seconds",
        )
        object.__setattr__(self, "uplink_bps", uplink)
        object.__setattr__(self, "downlink_bps", downlink)
        object.__setattr__(self, "link_bps", link)
        object.__setattr__(self, "latency_s", latency)

    @property
    def n(self) -> int:
        """Number of nodes."""
        return int(self.uplink_bps.shape[0])

    @classmethod
    def uniform(cls, n: int, bandwidth_bps: float, latency_s: float = 0.0) -> NetworkSpec:
        """n identical nodes: every uplink and downlink at `bandwidth_bps`, no
        per-pair caps, the same one-way latency between every pair."""
        if int(n) != n or n < 1:
            raise ValueError(f"NetworkSpec.uniform: n must be a positive integer, got {n!r}")
        n = int(n)
        return cls(
            uplink_bps=np.full(n, bandwidth_bps, dtype=np.float64),
            downlink_bps=np.full(n, bandwidth_bps, dtype=np.float64),
            link_bps=np.full((n, n), np.inf),
            latency_s=np.full((n, n), latency_s, dtype=np.float64),
        )


# ----------------------------------------------------------------------- solver


def _fill(
    columns: list[np.ndarray],
    capacity_bps: np.ndarray,
    flow_cap_bps: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Max-min fair rates by progressive filling.

    `columns[k][f]` is the k-th resource crossed by flow f (indices into
    `capacity_bps`); `flow_cap_bps[f]`, if given, is a cap of flow f alone (a
    resource no other flow crosses, kept out of the columns: cheaper). Returns
    (rate of every flow, mask of resources that are saturated and shared by
    more than one flow).

    Each pass freezes, at once, every resource whose fair share is no larger
    (up to `_TIE_REL`) than the tightest share seen by any of its flows: shares
    only grow as other flows freeze, so such a resource is filled at exactly
    that share by sequential progressive filling too. The global bottleneck is
    always among them, and independent bottlenecks at different levels are
    frozen in the same pass, so the number of passes is the length of the
    longest chain of dependent bottlenecks, not the number of distinct rates.
    A flow whose own cap is its tightest share freezes at its cap.
    """
    n_resources = capacity_bps.shape[0]
    n_flows = columns[0].shape[0]
    rate_bps = np.empty(n_flows)
    leftover_bps = capacity_bps.copy()
    count = np.bincount(columns[0], minlength=n_resources)
    for column in columns[1:]:
        count += np.bincount(column, minlength=n_resources)
    count_all = count.copy()
    live = np.arange(n_flows)
    share_bps = np.empty(n_resources)
    flow_cap = flow_cap_bps
    while live.size:
        share_bps.fill(np.inf)
        np.divide(leftover_bps, count, out=share_bps, where=count > 0)
        per_column = [share_bps[column] for column in columns]
        flow_share_bps = per_column[0].copy() if len(per_column) == 1 else np.minimum(
            per_column[0], per_column[1])
        for column_share in per_column[2:]:
            np.minimum(flow_share_bps, column_share, out=flow_share_bps)
        if flow_cap is not None:
            np.minimum(flow_share_bps, flow_cap, out=flow_share_bps)
        # A resource is blocked if one of its flows is held lower elsewhere.
        limit_bps = flow_share_bps * (1.0 + _TIE_REL)
        ready = np.ones(n_resources, dtype=bool)
        for column, column_share in zip(columns, per_column, strict=True):
            ready[column[column_share > limit_bps]] = False
        frozen = ready[columns[0]]
        for column in columns[1:]:
            frozen |= ready[column]
        if flow_cap is not None:
            frozen |= flow_cap <= limit_bps
        if frozen.all():
            rate_bps[live] = flow_share_bps
            for column in columns:
                leftover_bps -= np.bincount(column, weights=flow_share_bps, minlength=n_resources)
            break
        frozen_bps = flow_share_bps[frozen]
        rate_bps[live[frozen]] = frozen_bps
        for column in columns:
            frozen_column = column[frozen]
            leftover_bps -= np.bincount(frozen_column, weights=frozen_bps, minlength=n_resources)
            count -= np.bincount(frozen_column, minlength=n_resources)
        np.maximum(leftover_bps, 0.0, out=leftover_bps)
        keep = ~frozen
        live = live[keep]
        columns = [column[keep] for column in columns]
        if flow_cap is not None:
            flow_cap = flow_cap[keep]
    finite = np.isfinite(capacity_bps)
    saturated_shared = (
        finite & (leftover_bps <= _TIE_REL * np.where(finite, capacity_bps, 0.0)) & (count_all > 1)
    )
    return rate_bps, saturated_shared


class _Resources:
    """Resource indexing for one spec: uplinks [0, n), downlinks [n, 2n), an
    uncapped placeholder at 2n for flows without a shared per-pair cap, then
    pairs.

    A per-pair cap at or above min(uplink of the sender, downlink of the
    receiver) can never be a flow's only bottleneck (its load never exceeds
    that uplink's or downlink's), so only tighter pairs matter. A tight pair
    crossed by one flow only is that flow's own cap (no resource column); a
    pair shared by several flows (messages queued on one pair) is a resource.
    """

    def __init__(self, spec: NetworkSpec, scan_pairs: bool) -> None:
        self.spec = spec
        n = spec.n
        self.n = n
        self.placeholder = 2 * n
        self.nic_capacity_bps = np.concatenate([spec.uplink_bps, spec.downlink_bps, [np.inf]])
        self.pair_capacity_bps = spec.link_bps.reshape(-1)
        self.dense = n * n <= _DENSE_PAIRS_MAX
        self.dense_capacity_bps = (
            np.concatenate([self.nic_capacity_bps, self.pair_capacity_bps]) if self.dense else None
        )
        # Whether any pair cap binds at all (a cheap skip for the common case).
        self.any_pairs = True
        self.tight: np.ndarray | None = None
        if scan_pairs:
            tight = spec.link_bps < np.minimum(spec.uplink_bps[:, None], spec.downlink_bps[None, :])
            np.fill_diagonal(tight, False)
            self.any_pairs = bool(tight.any())
            self.tight = tight

    def pair_keys(self, src: np.ndarray | int, dst: np.ndarray) -> np.ndarray | None:
        """src * n + dst for pairs whose cap can bind, -1 for the others;
        None when no pair cap of the spec can bind."""
        if not self.any_pairs:
            return None
        spec = self.spec
        if self.tight is not None:
            tight = self.tight[src, dst]
        else:
            cap_bps = spec.link_bps[src, dst]
            tight = cap_bps < np.minimum(spec.uplink_bps[src], spec.downlink_bps[dst])
        return np.where(tight, np.asarray(src, dtype=np.intp) * self.n + dst, -1)

    def columns(
        self, src: np.ndarray, dst: np.ndarray, pair_key: np.ndarray | None
    ) -> tuple[list[np.ndarray], np.ndarray, np.ndarray | None]:
        """Resource columns of the flows, the capacity of every resource and the
        flows' own caps (None if none)."""
        n = self.n
        columns = [src, dst + n]
        if pair_key is None:
            return columns, self.nic_capacity_bps, None
        has_pair = pair_key >= 0
        if not has_pair.any():
            return columns, self.nic_capacity_bps, None
        keys = pair_key[has_pair]
        flow_cap_bps = np.full(pair_key.shape, np.inf)
        flow_cap_bps[has_pair] = self.pair_capacity_bps[keys]
        if self.dense:
            uses = np.bincount(keys, minlength=n * n)[keys]
        else:
            used, local, counts = np.unique(keys, return_inverse=True, return_counts=True)
            local = local.reshape(-1)
            uses = counts[local]
        if uses.max() == 1:
            return columns, self.nic_capacity_bps, flow_cap_bps
        # Pairs crossed by several flows (messages queued on one pair) are shared resources.
        shared = uses > 1
        where = np.flatnonzero(has_pair)[shared]
        flow_cap_bps[where] = np.inf
        column = np.full(pair_key.shape, self.placeholder, dtype=np.intp)
        if self.dense:
            assert self.dense_capacity_bps is not None
            column[where] = keys[shared] + (2 * n + 1)
            capacity_bps = self.dense_capacity_bps
        else:
            column[where] = local[shared] + (2 * n + 1)
            capacity_bps = np.concatenate([self.nic_capacity_bps, self.pair_capacity_bps[used]])
        columns.append(column)
        return columns, capacity_bps, flow_cap_bps


def _check_nodes(name: str, nodes: np.ndarray, n: int) -> None:
    if nodes.size and (nodes.min() < 0 or nodes.max() >= n):
        bad = nodes[(nodes < 0) | (nodes >= n)][0]
        raise ValueError(f"{name} contains node {int(bad)}; nodes are 0..{n - 1}")


def max_min_rates(src: np.ndarray, dst: np.ndarray, spec: NetworkSpec) -> np.ndarray:
    """Max-min fair rates (bits/s) of the flows src[f] -> dst[f] sharing `spec`.

    Each flow crosses the sender's uplink, the receiver's downlink and the
    pair's own cap. Pure function: no state, no clock.
    """
    src_nodes = np.asarray(src, dtype=np.intp).reshape(-1)
    dst_nodes = np.asarray(dst, dtype=np.intp).reshape(-1)
    if src_nodes.shape != dst_nodes.shape:
        raise ValueError(
            f"max_min_rates: src and dst must have the same length, "
            f"got {src_nodes.shape[0]} and {dst_nodes.shape[0]}"
        )
    _check_nodes("max_min_rates: src", src_nodes, spec.n)
    _check_nodes("max_min_rates: dst", dst_nodes, spec.n)
    if (src_nodes == dst_nodes).any():
        raise ValueError("max_min_rates: a flow from a node to itself is not a network flow")
    if src_nodes.size == 0:
        return np.empty(0)
    resources = _Resources(spec, scan_pairs=False)
    columns, capacity_bps, flow_cap_bps = resources.columns(
        src_nodes, dst_nodes, resources.pair_keys(src_nodes, dst_nodes)
    )
    rate_bps, _ = _fill(columns, capacity_bps, flow_cap_bps)
    return rate_bps


# ---------------------------------------------------------------------- network


@dataclass(frozen=True, eq=False)
class NetworkUtilisation:
    """Fraction of capacity used over an interval, per node (0..1)."""

    uplink: np.ndarray
    downlink: np.ndarray


@dataclass(frozen=True, eq=False)
class NetworkStats:
    """Traffic counters of a `FluidNetwork` at one instant, for reports.

    `bytes_sent[i]`: bytes of flows from i whose transfer has finished;
    `bytes_received[j]` and `link_bytes[i, j]`: bytes delivered (after
    latency); `*_carried_bytes`: bytes that crossed each NIC, in-flight flows
    included; `*_busy_s`: time each NIC carried at least one flow.
    """

    elapsed_s: float
    bytes_sent: np.ndarray
    bytes_received: np.ndarray
    link_bytes: np.ndarray
    uplink_carried_bytes: np.ndarray
    downlink_carried_bytes: np.ndarray
    uplink_busy_s: np.ndarray
    downlink_busy_s: np.ndarray
    utilisation: NetworkUtilisation
    rate_solves: int
    flow_completions: int
    messages_delivered: int
    active_flows: int


class _Batch:
    """One `send` call: who to tell when its messages arrive."""

    __slots__ = ("on_delivered", "token", "outstanding")

    def __init__(self, on_delivered: DeliveryCallback, token: object, count: int):
        self.on_delivered = on_delivered
        self.token = token
        self.outstanding = count


class _Wake(simpy.Event):
    """A pre-triggered event processed after the ordinary events of its instant."""

    def __init__(self, env: simpy.Environment, delay_s: float, callback: Callable[..., None]):
        # Same initialisation as simpy.Timeout, with a later priority.
        self.env = env
        self.callbacks = [callback]
        self._value = None
        self._ok = True
        env.schedule(self, _LATE, delay_s)


class FluidNetwork:
    """Carries messages between the nodes of `spec` on the SimPy clock `env`.

    `send` starts a batch of flows from one node; the network calls back when
    they are delivered. One pending wake-up (re-armed whenever a send or a
    completion changes the next event) drives everything: no SimPy process per
    flow, no per-packet events. Every message whose transfer ends at one
    wake-up and that shares a latency is delivered by one SimPy timeout,
    whatever the number of batches.
    """

    def __init__(self, env: simpy.Environment, spec: NetworkSpec,
                 coalesce_rel: float = COALESCE_REL) -> None:
        self.env = env
        self.spec = spec
        self.coalesce_rel = coalesce_rel
        n = spec.n
        self._n = n
        self._resources = _Resources(spec, scan_pairs=True)
        off_diagonal = spec.latency_s[~np.eye(n, dtype=bool)]
        self._uniform_latency_s: float | None = None
        if off_diagonal.size == 0:
            self._uniform_latency_s = 0.0
        elif bool((off_diagonal == off_diagonal[0]).all()):
            self._uniform_latency_s = float(off_diagonal[0])
        # Active flows, one entry per flow, in order of batch id. A finished
        # flow stays in the arrays, dead (rate 0, finish and early at inf),
        # until the next rate solve compacts them away: a completion that
        # needs no solve then copies no arrays.
        self._pair_key: np.ndarray | None = (
            np.empty(0, dtype=np.intp) if self._resources.any_pairs else None
        )
        self._clear_flows()
        self._pending: list[_Start] = []
        self._batches: dict[int, _Batch] = {}
        self._next_batch = 0
        self._wake: _Wake | None = None
        self._wake_s = np.inf
        # Statistics.
        self._stats_s = float(env.now)
        self._start_s = float(env.now)
        self._uplink_load_bps: np.ndarray = np.zeros(n)
        self._downlink_load_bps: np.ndarray = np.zeros(n)
        self._uplink_bits = np.zeros(n)
        self._downlink_bits = np.zeros(n)
        self._uplink_busy_s = np.zeros(n)
        self._downlink_busy_s = np.zeros(n)
        self._bytes_sent = np.zeros(n)
        self._bytes_received = np.zeros(n)
        self._link_bytes = np.zeros((n, n))
        self._delivered_log: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._delivered_log_entries = 0
        self.rate_solves = 0
        self.local_solves = 0  # solves limited to the flows connected to a change
        self._freed: tuple[np.ndarray, np.ndarray] = (np.empty(0, np.intp), np.empty(0, np.intp))
        self.flow_completions = 0
        self.messages_delivered = 0

    # ------------------------------------------------------------------ API

    def send(
        self,
        src: int,
        dsts: np.ndarray | Sequence[int],
        size_bytes: int | float | np.ndarray,
        on_delivered: DeliveryCallback,
        token: object = None,
    ) -> None:
        """Start one flow from `src` to each of `dsts` at `env.now`.

        `size_bytes` is one size for all or one per destination. When some of
        the messages arrive (transfer finished, then `latency_s[src, dst]`),
        calls `on_delivered(delivered_dsts, token)`: once per group of this
        batch delivered at the same instant (`delivered_dsts` is read-only).
        Zero-byte messages use no bandwidth and arrive after the latency alone.
        """
        n = self._n
        if not 0 <= src < n:
            raise ValueError(f"send: src {src!r} is not a node; nodes are 0..{n - 1}")
        src = int(src)
        dst = np.array(dsts, dtype=np.intp).reshape(-1)
        count = dst.shape[0]
        if count == 0:
            return
        if count == 1:  # the common point-to-point message: no array reductions
            only = int(dst[0])
            if not 0 <= only < n:
                raise ValueError(
                    f"send: dsts (from node {src}) contains node {only}; nodes are 0..{n - 1}"
                )
            if only == src:
                raise ValueError(f"send: node {src} cannot send to itself")
        else:
            _check_nodes(f"send: dsts (from node {src})", dst, n)
            if (dst == src).any():
                raise ValueError(f"send: node {src} cannot send to itself")
        sizes: float | np.ndarray
        if isinstance(size_bytes, int | float | np.integer | np.floating):
            sizes = float(size_bytes)
            if not (sizes >= 0 and sizes < np.inf):
                raise ValueError(f"send: size_bytes must be >= 0 and finite, got {size_bytes!r}")
        else:
            sizes = np.array(size_bytes, dtype=np.float64).reshape(-1)
            if sizes.shape != dst.shape:
                raise ValueError(
                    f"send: size_bytes has {sizes.shape[0]} entries for {count} destinations"
                )
            if not (np.isfinite(sizes).all() and (sizes >= 0).all()):
                raise ValueError("send: every size_bytes must be >= 0 and finite")
        batch_id = self._next_batch
        self._next_batch += 1
        self._batches[batch_id] = _Batch(on_delivered, token, count)
        if isinstance(sizes, float):
            if sizes == 0:
                self._schedule(np.full(count, src, dtype=np.intp), dst,
                               np.full(count, batch_id, dtype=np.int64), np.zeros(count))
                return
        else:
            empty = sizes == 0
            if empty.any():
                k = int(empty.sum())
                self._schedule(np.full(k, src, dtype=np.intp), dst[empty],
                               np.full(k, batch_id, dtype=np.int64), sizes[empty])
                keep = ~empty
                dst, sizes = dst[keep], sizes[keep]
                if dst.size == 0:
                    return
        keys = self._resources.pair_keys(src, dst) if self._resources.any_pairs else None
        self._pending.append((src, dst, sizes, keys, batch_id))
        now = float(self.env.now)
        if now < self._wake_s:
            self._arm(now)

    @property
    def active_flows(self) -> int:
        """Flows started and not yet finished (pending starts included)."""
        return int(self._src.size) - self._dead + sum(entry[1].size for entry in self._pending)

    @property
    def bytes_sent(self) -> np.ndarray:
        """Per node: bytes of its flows whose transfer has finished."""
        return self._bytes_sent.copy()

    @property
    def bytes_received(self) -> np.ndarray:
        """Per node: bytes delivered to it (after latency)."""
        self._flush_delivered()
        return self._bytes_received.copy()

    @property
    def link_bytes(self) -> np.ndarray:
        """(n, n): bytes delivered from i to j."""
        self._flush_delivered()
        return self._link_bytes.copy()

    @property
    def uplink_busy_s(self) -> np.ndarray:
        """Per node: time its uplink carried at least one flow."""
        self._integrate_stats(float(self.env.now))
        return self._uplink_busy_s.copy()

    @property
    def downlink_busy_s(self) -> np.ndarray:
        """Per node: time its downlink carried at least one flow."""
        self._integrate_stats(float(self.env.now))
        return self._downlink_busy_s.copy()

    def utilisation(self, elapsed_s: float | None = None) -> NetworkUtilisation:
        """Bits carried by each uplink and downlink / (capacity * elapsed_s).

        `elapsed_s` defaults to the time since the network was created.
        """
        now = float(self.env.now)
        self._integrate_stats(now)
        if elapsed_s is None:
            elapsed_s = now - self._start_s
        if elapsed_s <= 0:
            zeros = np.zeros(self._n)
            return NetworkUtilisation(uplink=zeros, downlink=zeros.copy())
        return NetworkUtilisation(
            uplink=self._uplink_bits / (self.spec.uplink_bps * elapsed_s),
            downlink=self._downlink_bits / (self.spec.downlink_bps * elapsed_s),
        )

    def stats(self, elapsed_s: float | None = None) -> NetworkStats:
        """A snapshot of every counter (arrays are copies)."""
        now = float(self.env.now)
        utilisation = self.utilisation(elapsed_s)
        return NetworkStats(
            elapsed_s=now - self._start_s if elapsed_s is None else float(elapsed_s),
            bytes_sent=self.bytes_sent,
            bytes_received=self.bytes_received,
            link_bytes=self.link_bytes,
            uplink_carried_bytes=self._uplink_bits / BITS_PER_BYTE,
            downlink_carried_bytes=self._downlink_bits / BITS_PER_BYTE,
            uplink_busy_s=self._uplink_busy_s.copy(),
            downlink_busy_s=self._downlink_busy_s.copy(),
            utilisation=utilisation,
            rate_solves=self.rate_solves,
            flow_completions=self.flow_completions,
            messages_delivered=self.messages_delivered,
            active_flows=self.active_flows,
        )

    def rates_bps(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(src, dst, rate) of the flows in flight at the last rate solve."""
        live = self._finish_s < np.inf
        return self._src[live], self._dst[live], self._rate_bps[live]

    # ------------------------------------------------------------- machinery

    def _arm(self, at_s: float) -> None:
        """Make sure the network wakes up no later than `at_s`."""
        if at_s < self._wake_s:
            self._wake_s = at_s
            delay_s = max(at_s - float(self.env.now), 0.0)
            self._wake = _Wake(self.env, delay_s, self._on_wake)

    def _on_wake(self, event: simpy.Event) -> None:
        if event is not self._wake:
            return  # superseded by an earlier wake-up
        self._wake = None
        self._wake_s = np.inf
        now = float(self.env.now)
        self._integrate_stats(now)
        finished: _Finished | None = None
        need_solve = bool(self._pending)
        if self._src.size > self._dead:
            done = self._early_s <= now + (_FINISH_REL * abs(now) + _FINISH_ABS_S)
            if done.any():
                finished, rates_changed = self._complete(np.flatnonzero(done))
                need_solve = need_solve or rates_changed
        if need_solve:
            self._solve(now, local=True)
        elif finished is not None:
            self._update_loads()
        if self._src.size > self._dead:
            self._arm(float(self._finish_s.min()))
        if finished is not None:
            self._schedule(*finished)

    def _complete(self, idx: np.ndarray) -> tuple[_Finished, bool]:
        """Retire the flows `idx`: (their src, dst, batch, size in batch order,
        whether the remaining flows need a rate solve)."""
        src, dst = self._src[idx], self._dst[idx]
        batch, size = self._batch[idx], self._size_bytes[idx]
        pinned_done = self._pinned[idx]
        count = int(idx.size)
        self.flow_completions += count
        if count == 1:
            self._bytes_sent[src[0]] += size[0]
        else:
            self._bytes_sent += np.bincount(src, weights=size, minlength=self._n)
        self._dead += count
        need_solve = False
        if self._dead == self._src.size:
            self._clear_flows()
        else:
            self._rate_bps[idx] = 0.0
            self._finish_s[idx] = np.inf
            self._early_s[idx] = np.inf
            self._pinned[idx] = False
            if pinned_done.any():
                need_solve = True
                self._freed = (src[pinned_done], dst[pinned_done])
        # Deliveries are grouped by batch: keep batch order.
        if count > 1 and bool((batch[1:] < batch[:-1]).any()):
            order = np.argsort(batch, kind="stable")
            src, dst, batch, size = src[order], dst[order], batch[order], size[order]
        return (src, dst, batch, size), need_solve

    def _clear_flows(self) -> None:
        """No flow left in flight: empty arrays, idle NICs."""
        self._src = np.empty(0, dtype=np.intp)
        self._dst = np.empty(0, dtype=np.intp)
        if self._pair_key is not None:
            self._pair_key = np.empty(0, dtype=np.intp)
        self._batch = np.empty(0, dtype=np.int64)
        self._size_bytes = np.empty(0)
        self._rate_bps = np.empty(0)
        self._finish_s = np.empty(0)
        # Finish time less the coalescing window: a flow is done once this passes.
        self._early_s = np.empty(0)
        # Flows on a saturated resource shared with others: their completion
        # changes somebody's rate; completions of the others need no solve.
        self._pinned = np.empty(0, dtype=bool)
        self._dead = 0
        self._uplink_load_bps = np.zeros(self._n)
        self._downlink_load_bps = np.zeros(self._n)

    def _compact(self) -> None:
        """Drop the finished flows from the arrays."""
        live = self._finish_s < np.inf
        self._src, self._dst = self._src[live], self._dst[live]
        if self._pair_key is not None:
            self._pair_key = self._pair_key[live]
        self._batch = self._batch[live]
        self._size_bytes, self._rate_bps = self._size_bytes[live], self._rate_bps[live]
        self._finish_s, self._early_s = self._finish_s[live], self._early_s[live]
        self._pinned = self._pinned[live]
        self._dead = 0

    def _component(self, up: np.ndarray, down: np.ndarray) -> np.ndarray | None:
        """Flows connected (through shared uplinks and downlinks) to the seed NICs,
        or None as soon as they are more than half of all flows.

        Max-min fair sharing decomposes over connected components: flows
        outside the component of what changed keep their rates.
        """
        half = self._src.size // 2
        while True:
            member = up[self._src] | down[self._dst]
            if np.count_nonzero(member) > half:
                return None
            grown_up = up.copy()
            grown_up[self._src[member]] = True
            grown_down = down.copy()
            grown_down[self._dst[member]] = True
            if (grown_up == up).all() and (grown_down == down).all():
                return member
            up, down = grown_up, grown_down

    def _solve(self, now: float, local: bool = False) -> None:
        """Bring in pending flows and recompute rates: every rate, or with `local`
        only those of the flows connected to what started or ended."""
        if self._dead:
            self._compact()
        old_count = self._src.size
        remaining_bytes = self._rate_bps * (self._finish_s - now) / BITS_PER_BYTE
        np.maximum(remaining_bytes, 0.0, out=remaining_bytes)
        if self._pending:
            pending = self._pending
            self._pending = []
            if len(pending) == 1:
                src, dst, size, keys, batch_id = pending[0]
                count = dst.size
                self._src = np.concatenate([self._src, np.full(count, src, dtype=np.intp)])
                self._dst = np.concatenate([self._dst, dst])
                new_sizes = np.full(count, size) if isinstance(size, float) else size
                if self._pair_key is not None and keys is not None:
                    self._pair_key = np.concatenate([self._pair_key, keys])
                self._batch = np.concatenate(
                    [self._batch, np.full(count, batch_id, dtype=np.int64)])
            else:
                counts = [start[1].size for start in pending]
                self._src = np.concatenate(
                    [self._src, np.repeat(np.array([start[0] for start in pending]), counts)]
                )
                self._dst = np.concatenate([self._dst] + [start[1] for start in pending])
                sizes = [start[2] for start in pending]
                if all(isinstance(size, float) for size in sizes):
                    new_sizes = np.repeat(np.array(sizes, dtype=np.float64), counts)
                else:
                    new_sizes = np.concatenate(
                        [
                            np.broadcast_to(size, (count,))
                            for size, count in zip(sizes, counts, strict=True)
                        ]
                    )
                if self._pair_key is not None:
                    keys_list = [start[3] for start in pending if start[3] is not None]
                    self._pair_key = np.concatenate([self._pair_key, *keys_list])
                self._batch = np.concatenate(
                    [
                        self._batch,
                        np.repeat(np.array([start[4] for start in pending], dtype=np.int64),
                                  counts),
                    ]
                )
            self._size_bytes = np.concatenate([self._size_bytes, new_sizes])
            remaining_bytes = np.concatenate([remaining_bytes, new_sizes])
        if self._src.size == 0:
            self._clear_flows()
            return
        if local and self._src.size > _LOCAL_SOLVE_MIN_FLOWS:
            n = self._n
            up, down = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
            up[self._src[old_count:]] = True
            down[self._dst[old_count:]] = True
            freed_src, freed_dst = self._freed
            up[freed_src] = True
            down[freed_dst] = True
            self._freed = _NO_FLOWS
            member = self._component(up, down)
            if member is not None:
                self._solve_members(now, np.flatnonzero(member), remaining_bytes, old_count)
                return
        self._freed = _NO_FLOWS
        columns, capacity_bps, flow_cap_bps = self._resources.columns(
            self._src, self._dst, self._pair_key)
        rate_bps, saturated_shared = _fill(columns, capacity_bps, flow_cap_bps)
        pinned = saturated_shared[columns[0]]
        for column in columns[1:]:
            pinned |= saturated_shared[column]
        self._rate_bps = rate_bps
        self._pinned = pinned
        self._finish_s = now + remaining_bytes * BITS_PER_BYTE / rate_bps
        self._early_s = self._early(self._finish_s, self._size_bytes, rate_bps)
        self.rate_solves += 1
        self._update_loads()

    def _early(self, finish_s: np.ndarray, size_bytes: np.ndarray,
               rate_bps: np.ndarray) -> np.ndarray:
        """When a flow counts as finished: `coalesce_rel` of its duration early."""
        if self.coalesce_rel == 0:
            return finish_s.copy()
        return finish_s - (self.coalesce_rel * BITS_PER_BYTE) * size_bytes / rate_bps

    def _solve_members(self, now: float, idx: np.ndarray, remaining_bytes: np.ndarray,
                       old_count: int) -> None:
        """Re-solve only the flows `idx` (a closed component); others keep their rates."""
        added = self._src.size - old_count
        if added:
            self._rate_bps = np.concatenate([self._rate_bps, np.zeros(added)])
            self._finish_s = np.concatenate([self._finish_s, np.zeros(added)])
            self._early_s = np.concatenate([self._early_s, np.zeros(added)])
            self._pinned = np.concatenate([self._pinned, np.zeros(added, dtype=bool)])
        pair_key = None if self._pair_key is None else self._pair_key[idx]
        columns, capacity_bps, flow_cap_bps = self._resources.columns(
            self._src[idx], self._dst[idx], pair_key)
        rate_bps, saturated_shared = _fill(columns, capacity_bps, flow_cap_bps)
        pinned = saturated_shared[columns[0]]
        for column in columns[1:]:
            pinned |= saturated_shared[column]
        finish_s = now + remaining_bytes[idx] * BITS_PER_BYTE / rate_bps
        self._rate_bps[idx] = rate_bps
        self._pinned[idx] = pinned
        self._finish_s[idx] = finish_s
        self._early_s[idx] = self._early(finish_s, self._size_bytes[idx], rate_bps)
        self.rate_solves += 1
        self.local_solves += 1
        self._update_loads()

    def _update_loads(self) -> None:
        n = self._n
        self._uplink_load_bps = np.bincount(self._src, weights=self._rate_bps, minlength=n)
        self._downlink_load_bps = np.bincount(self._dst, weights=self._rate_bps, minlength=n)

    def _integrate_stats(self, now: float) -> None:
        dt_s = now - self._stats_s
        if dt_s > 0:
            up, down = self._uplink_load_bps, self._downlink_load_bps
            self._uplink_bits += up * dt_s
            self._downlink_bits += down * dt_s
            self._uplink_busy_s += (up > 0) * dt_s
            self._downlink_busy_s += (down > 0) * dt_s
        self._stats_s = now

    def _schedule(self, src: np.ndarray, dst: np.ndarray, batch: np.ndarray,
                  size: np.ndarray) -> None:
        """Deliver messages whose transfer ends now, after their latency: one
        SimPy timeout per distinct latency, however many batches they belong to.
        The arrays are in batch order."""
        uniform_s = self._uniform_latency_s
        if uniform_s is not None:
            self._deliver_after(uniform_s, src, dst, batch, size)
            return
        latency_s = self.spec.latency_s[src, dst]
        first_s = latency_s[0]
        if bool((latency_s == first_s).all()):
            self._deliver_after(float(first_s), src, dst, batch, size)
            return
        for value_s in np.unique(latency_s).tolist():
            pick = latency_s == value_s
            self._deliver_after(value_s, src[pick], dst[pick], batch[pick], size[pick])

    def _deliver_after(self, latency_s: float, src: np.ndarray, dst: np.ndarray,
                       batch: np.ndarray, size: np.ndarray) -> None:
        dst.setflags(write=False)  # handed to the receivers and kept for the statistics
        timeout = self.env.timeout(latency_s)
        timeout.callbacks.append(partial(self._deliver, src, dst, batch, size))

    def _deliver(self, src: np.ndarray, dst: np.ndarray, batch: np.ndarray, size: np.ndarray,
                 _event: simpy.Event) -> None:
        count = dst.shape[0]
        self._delivered_log.append((src, dst, size))
        self._delivered_log_entries += count
        if self._delivered_log_entries >= _LOG_FLUSH_ENTRIES:
            self._flush_delivered()
        self.messages_delivered += count
        if count == 1 or batch[0] == batch[-1]:  # one batch (batch order)
            self._hand_over(int(batch[0]), dst)
            return
        cuts = np.flatnonzero(batch[1:] != batch[:-1]) + 1
        lo = 0
        batch_id = int(batch[0])
        for hi, next_id in zip(cuts.tolist(), batch[cuts].tolist(), strict=True):
            self._hand_over(batch_id, dst[lo:hi])
            lo, batch_id = hi, next_id
        self._hand_over(batch_id, dst[lo:])

    def _hand_over(self, batch_id: int, dst: np.ndarray) -> None:
        """Tell a batch's sender that messages to `dst` arrived."""
        batch = self._batches[batch_id]
        batch.outstanding -= dst.shape[0]
        if batch.outstanding == 0:
            del self._batches[batch_id]
        batch.on_delivered(dst, batch.token)

    def _flush_delivered(self) -> None:
        if not self._delivered_log:
            return
        log = self._delivered_log
        self._delivered_log = []
        self._delivered_log_entries = 0
        n = self._n
        if len(log) == 1:
            src, dst, size = log[0]
        else:
            src = np.concatenate([entry[0] for entry in log])
            dst = np.concatenate([entry[1] for entry in log])
            size = np.concatenate([entry[2] for entry in log])
        self._bytes_received += np.bincount(dst, weights=size, minlength=n)
        pair = src * n + dst
        if n * n <= _BINCOUNT_PAIRS_MAX:
            self._link_bytes += np.bincount(pair, weights=size, minlength=n * n).reshape(n, n)
        else:
            np.add.at(self._link_bytes.reshape(-1), pair, size)
