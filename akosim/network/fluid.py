"""The flow-level fluid model: flows in flight, their rates and when they end.

`FluidFlows` knows no clock and no SimPy: its owner says what time it is.
`start` queues the flows of one message batch (zero-byte messages come back at
once as deliveries: they use no bandwidth); `advance(now_s)` retires the flows
whose transfer has ended by `now_s`, brings in the queued starts, recomputes
the max-min fair rates (akosim.network.maxmin) if anything changed, and returns the
deliveries that follow and the time of the next completion. Between two calls
every flow drains at a constant rate, so the cost of a simulation grows with
the number of distinct rate changes, not with the number of bytes.

Fast paths, all exact up to `coalesce_rel`: starts made before one `advance`
join one rate solve; flows finishing within `coalesce_rel` of their own
duration of the earliest one finish together; a completion that frees no
saturated shared resource needs no solve; a solve re-solves only the flows
on the resources that changed (new flows' NICs, the saturated NICs of flows
that ended), grown until the whole allocation is proved max-min fair
(akosim.network.maxmin.max_min_update), unless that is over half of them; once
a run has solved enough flows, the solver is the compiled one
(akosim.network.maxmin_compiled: the same rates to the bit, less CPU), and a
wake-up is at most two compiled calls (akosim.network.fluid_compiled.retire_due,
then solve if rates change) where those kernels build the resource columns. A message
arrives `latency_s[i, j]` after its last byte left (bandwidth is used from the
start of the flow). What each NIC carried and how long it was busy are kept as
flows start and end (`nic_carried_bits`, `nic_busy_s`), so a wake-up that
only retires flows touches the few NICs they used, not every NIC's load.

The module runs past 500 lines because the steps around a solve exist twice,
side by side: in numpy, and through the compiled kernels
(akosim.network.fluid_compiled) once they pay; both give the same bits.

Units: rates in bits per second, sizes in bytes, times in seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from akosim.network.maxmin import ResourceIndex, check_nodes, max_min_fill, max_min_update
from akosim.network.netspec import NetworkSpec

BITS_PER_BYTE = 8
# Flows whose finish times lie within this of the earliest one finish together.
_FINISH_REL = 1e-9
_FINISH_ABS_S = 1e-12
# A message whose remaining transfer time is within this fraction of its own
# duration finishes with the earliest: partitions that differ by one element
# would otherwise split a symmetric round (or a ring step) into one event per
# flow. Bounded error: at most 0.01% of each message's transfer time.
COALESCE_REL = 1e-4
# After this many flows solved (summed over solves), the compiled solver pays for
# its loading (about 0.07 us of numpy per flow and solve, 0.45 CPU s to load).
_COMPILE_AFTER_FLOWS = 10_000_000
# Below this many flows a full solve is as cheap as finding a component.
_LOCAL_SOLVE_MIN_FLOWS = 32

_NO_DELIVERIES: tuple[Delivery, ...] = ()
_NO_FLOWS: tuple[np.ndarray, np.ndarray] = (np.empty(0, np.intp), np.empty(0, np.intp))
_NO_NEW_FLOWS = (np.empty(0, np.intp), np.empty(0, np.intp), np.empty(0), np.empty(0, np.intp),
                 np.empty(0, np.int64))
_NO_CAPACITY = np.empty(0)
# (sender, receivers, size in bytes (one for all or one each), pair keys, batch id)
_Start = tuple[int, np.ndarray, float | np.ndarray, np.ndarray | None, int]


def check_send(n: int, src: int, dsts: np.ndarray | Sequence[int],
               size_bytes: int | float | np.ndarray) -> tuple[int, np.ndarray, float | np.ndarray]:
    """Validate one batch of messages on an n-node network: (sender, receivers as
    an intp array, one size for all as a float or one per receiver); ValueError
    naming the first bad input."""
    if not 0 <= src < n:
        raise ValueError(f"send: src {src!r} is not a node; nodes are 0..{n - 1}")
    src = int(src)
    dst = np.array(dsts, dtype=np.intp).reshape(-1)
    count = dst.shape[0]
    if count == 1:  # the common point-to-point message: no array reductions
        only = int(dst[0])
        if not 0 <= only < n:
            raise ValueError(
                f"send: dsts (from node {src}) contains node {only}; nodes are 0..{n - 1}"
            )
        if only == src:
            raise ValueError(f"send: node {src} cannot send to itself")
    elif count:
        check_nodes(f"send: dsts (from node {src})", dst, n)
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
    return src, dst, sizes


def warm_compiled() -> list[tuple[int, int]]:
    """Load the compiled kernels (akosim.network.maxmin_compiled, fluid_compiled) and run
    each once on two small networks, without and with per-pair caps, through full and
    incremental solves: their one-time cost (compiling on a machine's first call,
    loading numba's cache after) is then paid here, not inside what is timed next
    (the benchmark's per-round figures). Returns (rate solves, incremental ones) of each
    network."""
    solves = []
    n = 8
    ring = np.add.outer(np.arange(n), np.arange(n)) % 5
    for pair_caps in (False, True):
        link_bps = 1e6 * (1.0 + ring) if pair_caps else np.full((n, n), np.inf)
        np.fill_diagonal(link_bps, np.inf)
        spec = NetworkSpec(uplink_bps=np.full(n, 4e6), downlink_bps=np.full(n, 4e6),
                           link_bps=link_bps, latency_s=np.zeros((n, n)))
        flows = FluidFlows(spec, compiled=True)
        for src in range(n):
            flows.start(src, np.array([d for d in range(n) if d != src], dtype=np.intp),
                        1e5 * (1 + src), src)
        _, next_s = flows.advance(0.0)
        flows.start(0, np.arange(1, n, dtype=np.intp), 1e5, n)  # a local solve
        while next_s < np.inf:
            _, next_s = flows.advance(next_s)
        solves.append((flows.rate_solves, flows.local_solves))
    return solves


@dataclass(frozen=True, slots=True, eq=False)
class Delivery:
    """Messages whose transfer ended, all arriving `latency_s` after it ended.

    Arrays are aligned and in batch order (a batch is one `start` call);
    `dst` is read-only (it is handed to receivers and kept for statistics).
    """

    latency_s: float
    src: np.ndarray
    dst: np.ndarray
    batch: np.ndarray
    size_bytes: np.ndarray


class FluidFlows:
    """The active flows of one network and their max-min fair rates."""

    def __init__(self, spec: NetworkSpec, coalesce_rel: float = COALESCE_REL,
                 incremental: bool = True, compiled: bool | None = None) -> None:
        self.spec = spec
        self.coalesce_rel = coalesce_rel
        # Re-solve only the flows around a change (akosim.network.maxmin.max_min_update);
        # False: every solve from scratch (the reference the tests compare with).
        self.incremental = incremental
        # Solve with the compiled solver (akosim.network.maxmin_compiled, the same
        # rates to the bit) or the numpy reference; None: the reference until the
        # flows solved add up to _COMPILE_AFTER_FLOWS, then the compiled one (loading
        # it costs a process ~0.45 CPU s, which a short or homogeneous run never
        # wins back). Either way the results are the same.
        self.compiled = compiled
        self._flows_solved = 0
        self._kernel: ModuleType | None = None
        self._books: ModuleType | None = None  # akosim.network.fluid_compiled, with it
        if compiled:
            self._load_kernel()
        n = spec.n
        self._n = n
        self._resources = ResourceIndex(spec, scan_pairs=True)
        # With the compiled kernels, a whole `advance` is one call
        # (akosim.network.fluid_compiled.advance) where they build the columns.
        self._one_call = not self._resources.any_pairs or self._resources.dense
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
        # NIC activity, uplinks [0, n) and downlinks [n, 2n): flows in flight on
        # each (solved and not finished), the time each was busy until it last
        # went idle, since when each busy one is busy, and the bits of ended flows.
        self._nic_active = np.zeros(2 * n, dtype=np.int64)
        self._nic_busy_s = np.zeros(2 * n)
        self._nic_busy_since_s = np.zeros(2 * n)
        self._nic_ended_bits = np.zeros(2 * n)
        self._pending: list[_Start] = []
        self._freed: tuple[np.ndarray, np.ndarray] = _NO_FLOWS
        self.rate_solves = 0
        self.local_solves = 0  # solves that re-solved only the flows around a change
        self.flow_completions = 0

    # ------------------------------------------------------------------ API

    def start(self, src: int, dsts: np.ndarray, size_bytes: float | np.ndarray,
              batch_id: int) -> tuple[bool, Sequence[Delivery]]:
        """Queue one flow from `src` to each of `dsts` (validated by the caller:
        nodes in range, no self-sends; sizes >= 0 and finite, one for all or one
        each). The flows join at the next `advance`. Returns (whether any flow
        was queued, the zero-byte messages: they use no bandwidth and are due
        after their latency alone)."""
        dst = dsts
        immediate: Sequence[Delivery] = _NO_DELIVERIES
        sizes = size_bytes
        if isinstance(sizes, float):
            if sizes == 0:
                count = dst.shape[0]
                return False, self._deliveries(np.full(count, src, dtype=np.intp), dst,
                                               np.full(count, batch_id, dtype=np.int64),
                                               np.zeros(count))
        else:
            empty = sizes == 0
            if empty.any():
                k = int(empty.sum())
                immediate = self._deliveries(np.full(k, src, dtype=np.intp), dst[empty],
                                             np.full(k, batch_id, dtype=np.int64), sizes[empty])
                keep = ~empty
                dst, sizes = dst[keep], sizes[keep]
                if dst.size == 0:
                    return False, immediate
        keys = self._resources.pair_keys(src, dst) if self._resources.any_pairs else None
        self._pending.append((src, dst, sizes, keys, batch_id))
        return True, immediate

    def advance(self, now_s: float) -> tuple[list[Delivery], float]:
        """Bring the flows to `now_s`: (deliveries of the transfers that ended,
        time of the next completion or inf). Call it at the time it returned
        (or earlier, after a `start`); later is allowed but ends flows late."""
        if self._books is not None and self._one_call:
            return self._advance_compiled(now_s)
        finished: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
        need_solve = bool(self._pending)
        if self._src.size > self._dead:
            due_s = now_s + (_FINISH_REL * abs(now_s) + _FINISH_ABS_S)
            done = (self._early_s <= due_s).nonzero()[0]
            if done.shape[0] == 1:
                finished, rates_changed = self._complete_one(int(done[0]), now_s)
                need_solve = need_solve or rates_changed
            elif done.shape[0]:
                finished, rates_changed = self._complete(done, now_s)
                need_solve = need_solve or rates_changed
        if need_solve:
            self._solve(now_s, local=self.incremental)
        next_s = float(self._finish_s.min()) if self._src.size > self._dead else np.inf
        deliveries = self._deliveries(*finished) if finished is not None else []
        return deliveries, next_s

    @property
    def active_flows(self) -> int:
        """Flows started and not yet finished (queued starts included)."""
        return int(self._src.size) - self._dead + sum(entry[1].size for entry in self._pending)

    @property
    def uplink_load_bps(self) -> np.ndarray:
        """Per node: the sum of its outgoing rates (flows in flight)."""
        return np.bincount(self._src, weights=self._rate_bps, minlength=self._n)

    @property
    def downlink_load_bps(self) -> np.ndarray:
        """Per node: the sum of its incoming rates (flows in flight)."""
        return np.bincount(self._dst, weights=self._rate_bps, minlength=self._n)

    def nic_busy_s(self, now_s: float) -> np.ndarray:
        """Uplinks then downlinks (2n): time each carried at least one flow, up to `now_s`."""
        busy_s = self._nic_busy_s.copy()
        active = self._nic_active > 0
        busy_s[active] += now_s - self._nic_busy_since_s[active]
        return busy_s

    def nic_carried_bits(self, now_s: float) -> np.ndarray:
        """Uplinks then downlinks (2n): bits each carried up to `now_s` (what ended
        flows sent before they ended, flows in flight up to `now_s` at their rates)."""
        carried = self._nic_ended_bits.copy()
        live = self._finish_s < np.inf
        if live.any():
            remaining_bits = self._rate_bps[live] * np.maximum(self._finish_s[live] - now_s, 0.0)
            sent_bits = self._size_bytes[live] * BITS_PER_BYTE - remaining_bits
            n = self._n
            carried[:n] += np.bincount(self._src[live], weights=sent_bits, minlength=n)
            carried[n:] += np.bincount(self._dst[live], weights=sent_bits, minlength=n)
        return carried

    def rates_bps(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(src, dst, rate) of the flows in flight at the last rate solve."""
        live = self._finish_s < np.inf
        return self._src[live], self._dst[live], self._rate_bps[live]

    # ------------------------------------------------------------- machinery

    def _complete_one(self, i: int, now_s: float) -> tuple[
            tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], bool]:
        """`_complete` for the one flow `i`, with scalar bookkeeping (the common case).
        The arrays returned are views: flow arrays are replaced, never written, when
        flows come and go (only rates, finish times and pins are written in place)."""
        j = i + 1
        src, dst = self._src[i:j], self._dst[i:j]
        batch, size = self._batch[i:j], self._size_bytes[i:j]
        tolerance_s = _FINISH_REL * abs(now_s) + _FINISH_ABS_S
        early_s = float(self._finish_s[i]) - now_s
        sent_bits = float(size[0]) * BITS_PER_BYTE
        if early_s > tolerance_s:
            sent_bits -= float(self._rate_bps[i]) * early_s
        n = self._n
        active, ended_bits = self._nic_active, self._nic_ended_bits
        for nic in (int(src[0]), int(dst[0]) + n):
            ended_bits[nic] += sent_bits
            left = int(active[nic]) - 1
            active[nic] = left
            if left == 0:
                self._nic_busy_s[nic] += now_s - self._nic_busy_since_s[nic]
        self.flow_completions += 1
        self._dead += 1
        need_solve = False
        if self._dead == self._src.shape[0]:
            self._clear_flows()
        else:
            pinned = bool(self._pinned[i])
            self._rate_bps[i] = 0.0
            self._finish_s[i] = np.inf
            self._early_s[i] = np.inf
            if pinned:
                self._pinned[i] = False
                need_solve = True
                self._freed = (src, dst)
        return (src, dst, batch, size), need_solve

    def _complete(self, idx: np.ndarray, now_s: float) -> tuple[
            tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], bool]:
        """Retire the flows `idx` at `now_s`: ((their src, dst, batch, size in batch
        order), whether the remaining flows need a rate solve)."""
        if self._books is not None:
            return self._complete_compiled(idx, now_s)
        src, dst = self._src[idx], self._dst[idx]
        batch, size = self._batch[idx], self._size_bytes[idx]
        pinned_done = self._pinned[idx]
        count = int(idx.size)
        # what the flows carried: all but what a coalesced early end left unsent
        # (a flow ending at its finish time, up to rounding, counts whole)
        early_s = self._finish_s[idx] - now_s
        early_s[early_s <= _FINISH_REL * abs(now_s) + _FINISH_ABS_S] = 0.0
        sent_bits = size * BITS_PER_BYTE - self._rate_bps[idx] * early_s
        self._nics_idle(src, dst, sent_bits, now_s)
        self.flow_completions += count
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

    def _complete_compiled(self, idx: np.ndarray, now_s: float) -> tuple[
            tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], bool]:
        """`_complete` through the compiled kernel (akosim.network.fluid_compiled.retire)."""
        assert self._books is not None
        src, dst, batch, size, pinned_done = self._books.retire(
            idx, now_s, _FINISH_REL * abs(now_s) + _FINISH_ABS_S, self._src, self._dst,
            self._batch, self._size_bytes, self._rate_bps, self._finish_s, self._early_s,
            self._pinned, self._n, self._nic_active, self._nic_ended_bits, self._nic_busy_s,
            self._nic_busy_since_s)
        count = int(idx.size)
        self.flow_completions += count
        self._dead += count
        need_solve = False
        if self._dead == self._src.size:
            self._clear_flows()
        elif pinned_done.any():
            need_solve = True
            self._freed = (src[pinned_done], dst[pinned_done])
        # Deliveries are grouped by batch: keep batch order.
        if count > 1 and bool((batch[1:] < batch[:-1]).any()):
            order = np.argsort(batch, kind="stable")
            src, dst, batch, size = src[order], dst[order], batch[order], size[order]
        return (src, dst, batch, size), need_solve

    def _deliveries(self, src: np.ndarray, dst: np.ndarray, batch: np.ndarray,
                    size: np.ndarray) -> list[Delivery]:
        """Messages whose transfer ends now, grouped by latency (arrays in batch order)."""
        dst.setflags(write=False)
        uniform_s = self._uniform_latency_s
        if uniform_s is not None:
            return [Delivery(uniform_s, src, dst, batch, size)]
        latency_s = self.spec.latency_s[src, dst]
        first_s = latency_s[0]
        if bool((latency_s == first_s).all()):
            return [Delivery(float(first_s), src, dst, batch, size)]
        groups = []
        for value_s in np.unique(latency_s).tolist():
            pick = latency_s == value_s
            picked_dst = dst[pick]
            picked_dst.setflags(write=False)
            groups.append(Delivery(value_s, src[pick], picked_dst, batch[pick], size[pick]))
        return groups

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
        # Saturated shared uplinks [0, n) and downlinks [n, 2n) at the last solve.
        self._saturated_nics = np.zeros(2 * self._n, dtype=bool)

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

    def _take_pending(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                      np.ndarray]:
        """The queued starts as flow arrays (src, dst, size, pair key (empty without
        pair caps), batch), in the order queued; the queue is emptied."""
        pending = self._pending
        self._pending = []
        if len(pending) == 1:
            src, dst, size, keys, batch_id = pending[0]
            count = dst.size
            return (np.full(count, src, dtype=np.intp), dst,
                    np.full(count, size) if isinstance(size, float) else size,
                    keys if keys is not None else _NO_FLOWS[0],
                    np.full(count, batch_id, dtype=np.int64))
        counts = [start[1].size for start in pending]
        sizes = [start[2] for start in pending]
        if all(isinstance(size, float) for size in sizes):
            new_sizes = np.repeat(np.array(sizes, dtype=np.float64), counts)
        else:
            new_sizes = np.concatenate([np.broadcast_to(size, (count,))
                                        for size, count in zip(sizes, counts, strict=True)])
        keys_list = [start[3] for start in pending if start[3] is not None]
        return (np.repeat(np.array([start[0] for start in pending]), counts),
                np.concatenate([start[1] for start in pending]), new_sizes,
                np.concatenate(keys_list) if keys_list else _NO_FLOWS[0],
                np.repeat(np.array([start[4] for start in pending], dtype=np.int64), counts))

    def _solve(self, now: float, local: bool = False) -> None:
        """Bring in pending flows and recompute rates: every rate, or with `local`
        only those of the flows around what started or ended (proved max-min
        fair as a whole by akosim.network.maxmin.max_min_update)."""
        if self._books is not None:
            remaining_bytes = self._compact_compiled(now)
        else:
            if self._dead:
                self._compact()
            remaining_bytes = self._rate_bps * (self._finish_s - now) / BITS_PER_BYTE
            np.maximum(remaining_bytes, 0.0, out=remaining_bytes)
        old_count = self._src.size
        if self._pending:
            new_src, new_dst, new_sizes, new_keys, new_batch = self._take_pending()
            self._src = np.concatenate([self._src, new_src])
            self._dst = np.concatenate([self._dst, new_dst])
            if self._pair_key is not None:
                self._pair_key = np.concatenate([self._pair_key, new_keys])
            self._batch = np.concatenate([self._batch, new_batch])
            self._size_bytes = np.concatenate([self._size_bytes, new_sizes])
            self._nics_busy(self._src[old_count:], self._dst[old_count:], now)
            remaining_bytes = np.concatenate([remaining_bytes, new_sizes])
        if self._src.size == 0:
            self._clear_flows()
            return
        freed_src, freed_dst = self._freed
        self._freed = _NO_FLOWS
        flow_count = self._src.size
        if self._kernel is None and self.compiled is None:
            self._flows_solved += flow_count
            if self._flows_solved > _COMPILE_AFTER_FLOWS:
                self._load_kernel()
        # New flows are always re-solved: past max_free of them the update would
        # give up at once, so go straight to the full solve.
        local = (local and flow_count > _LOCAL_SOLVE_MIN_FLOWS
                 and flow_count - old_count <= flow_count // 2)
        if self._books is not None:
            self._solve_compiled(now, local, old_count, freed_src, freed_dst, remaining_bytes)
            return
        columns, capacity_bps, flow_cap_bps = self._resources.columns(
            self._src, self._dst, self._pair_key)
        if local:
            # Re-solve the flows around what started or ended (akosim.network.maxmin
            # proves the result max-min fair as a whole).
            n = self._n
            seed = np.zeros(capacity_bps.shape[0], dtype=bool)
            for column in columns:
                seed[column[old_count:]] = True
            saturated_nics = self._saturated_nics
            seed[freed_src] |= saturated_nics[freed_src]
            seed[freed_dst + n] |= saturated_nics[freed_dst + n]
            old_rate_bps = self._rate_bps
            if flow_count > old_count:
                old_rate_bps = np.concatenate([old_rate_bps, np.zeros(flow_count - old_count)])
            update = max_min_update(columns, capacity_bps, flow_cap_bps, old_rate_bps,
                                    seed, max_free=flow_count // 2)
            if update is not None:
                rate_bps, saturated_shared, _ = update
                self.local_solves += 1
                self._set_rates(now, rate_bps, saturated_shared, columns, remaining_bytes)
                return
        rate_bps, saturated_shared = max_min_fill(columns, capacity_bps, flow_cap_bps)
        self._set_rates(now, rate_bps, saturated_shared, columns, remaining_bytes)

    def _solve_compiled(self, now: float, local: bool, old_count: int, freed_src: np.ndarray,
                        freed_dst: np.ndarray, remaining_bytes: np.ndarray) -> None:
        """`_solve`'s solve through the compiled kernels (the same steps, the same bits)."""
        books, kernel = self._books, self._kernel
        assert books is not None and kernel is not None
        stacked, capacity_bps, flow_cap_bps, has_cap = self._compiled_columns()
        flow_count = stacked.shape[1]
        if local:
            old_rate_bps = self._rate_bps
            if flow_count > old_count:
                old_rate_bps = np.concatenate([old_rate_bps, np.zeros(flow_count - old_count)])
            seed = books.local_seed(stacked, capacity_bps.shape[0], old_count, freed_src,
                                    freed_dst, self._saturated_nics, self._n)
            proved, rate_bps, saturated_shared, _ = kernel.update(
                stacked, capacity_bps, flow_cap_bps, has_cap, old_rate_bps, seed,
                flow_count // 2)
            if proved:
                self.local_solves += 1
                self._set_rates_compiled(now, rate_bps, saturated_shared, stacked,
                                         remaining_bytes)
                return
        rate_bps, saturated_shared = kernel.fill(stacked, capacity_bps, flow_cap_bps, has_cap)
        self._set_rates_compiled(now, rate_bps, saturated_shared, stacked, remaining_bytes)

    def _compiled_columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
        """`ResourceIndex.columns` as the compiled solver takes them: (columns as one
        array, capacities, the flows' own caps (inf where none), whether any)."""
        resources = self._resources
        if self._pair_key is None or not resources.dense:
            columns, capacity_bps, flow_cap_bps = resources.columns(
                self._src, self._dst, self._pair_key)
            return (np.stack(columns), capacity_bps,
                    *_caps(flow_cap_bps, self._src.shape[0]))
        assert self._books is not None and resources.dense_capacity_bps is not None
        stacked, flow_cap_bps, has_cap = self._books.dense_columns(
            self._src, self._dst, self._pair_key, self._n, resources.pair_capacity_bps)
        capacity_bps = (resources.dense_capacity_bps if stacked.shape[0] == 3
                        else resources.nic_capacity_bps)
        return stacked, capacity_bps, flow_cap_bps, has_cap

    def _load_kernel(self) -> None:
        from akosim.network import fluid_compiled, maxmin_compiled  # numba: once it pays

        self._kernel = maxmin_compiled
        self._books = fluid_compiled

    def _advance_compiled(self, now_s: float) -> tuple[list[Delivery], float]:
        """`advance` through the compiled kernels in at most two calls
        (akosim.network.fluid_compiled.retire_due and solve): the same steps, the same bits."""
        books = self._books
        assert books is not None
        deliveries: list[Delivery] = []
        need_solve = bool(self._pending)
        next_s = np.inf
        freed = _NO_FLOWS
        if self._src.shape[0] > self._dead:
            src, dst, batch, size, pinned_done, ended, n_pinned, next_s = books.retire_due(
                now_s, _FINISH_REL * abs(now_s) + _FINISH_ABS_S, self._src, self._dst,
                self._batch, self._size_bytes, self._rate_bps, self._finish_s, self._early_s,
                self._pinned, self._n, self._nic_active, self._nic_ended_bits,
                self._nic_busy_s, self._nic_busy_since_s)
            if ended:
                self.flow_completions += ended
                self._dead += ended
                if self._dead == self._src.shape[0]:
                    self._clear_flows()
                elif n_pinned:
                    need_solve = True
                    freed = (src[pinned_done], dst[pinned_done])
                deliveries = self._deliveries(src, dst, batch, size)  # in batch order
        if need_solve:
            new_src, new_dst, new_sizes, new_keys, new_batch = (
                self._take_pending() if self._pending else _NO_NEW_FLOWS)
            resources = self._resources
            keys = self._pair_key
            (self._src, self._dst, out_keys, self._batch, self._size_bytes, self._rate_bps,
             self._finish_s, self._early_s, self._pinned, self._saturated_nics, solved, local,
             next_s) = books.solve(
                now_s, self.coalesce_rel * BITS_PER_BYTE, self.incremental,
                _LOCAL_SOLVE_MIN_FLOWS, keys is not None, self._n, resources.nic_capacity_bps,
                _NO_CAPACITY if resources.dense_capacity_bps is None
                else resources.dense_capacity_bps,
                resources.pair_capacity_bps, self._src, self._dst,
                keys if keys is not None else _NO_FLOWS[0], self._batch, self._size_bytes,
                self._rate_bps, self._finish_s, self._early_s, self._pinned,
                self._saturated_nics, freed[0], freed[1], self._nic_active,
                self._nic_busy_since_s, new_src, new_dst, new_keys, new_batch, new_sizes)
            self._dead = 0
            if keys is not None:
                self._pair_key = out_keys
            if solved:
                self.rate_solves += 1
                self.local_solves += local
        return deliveries, float(next_s)

    def _compact_compiled(self, now_s: float) -> np.ndarray:
        """`_compact` (whether or not a flow ended) and what each flow has left to send,
        compiled: (akosim.network.fluid_compiled.compact)."""
        assert self._books is not None
        keys = self._pair_key if self._pair_key is not None else _NO_FLOWS[0]
        (self._src, self._dst, keys, self._batch, self._size_bytes, self._rate_bps,
         self._finish_s, self._early_s, self._pinned, remaining_bytes) = self._books.compact(
            self._finish_s, now_s, self._src, self._dst, keys, self._batch, self._size_bytes,
            self._rate_bps, self._early_s, self._pinned)
        if self._pair_key is not None:
            self._pair_key = keys
        self._dead = 0
        return remaining_bytes

    def _set_rates(self, now: float, rate_bps: np.ndarray, saturated_shared: np.ndarray,
                   columns: list[np.ndarray], remaining_bytes: np.ndarray) -> None:
        pinned = saturated_shared[columns[0]]
        for column in columns[1:]:
            pinned |= saturated_shared[column]
        self._saturated_nics = saturated_shared[:2 * self._n]
        self._rate_bps = rate_bps
        self._pinned = pinned
        self._finish_s = now + remaining_bytes * BITS_PER_BYTE / rate_bps
        self._early_s = self._early(self._finish_s, self._size_bytes, rate_bps)
        self.rate_solves += 1

    def _set_rates_compiled(self, now: float, rate_bps: np.ndarray,
                            saturated_shared: np.ndarray, stacked: np.ndarray,
                            remaining_bytes: np.ndarray) -> None:
        """`_set_rates` through the compiled kernel (akosim.network.fluid_compiled.timing)."""
        assert self._books is not None
        self._saturated_nics = saturated_shared[:2 * self._n]
        self._rate_bps = rate_bps
        self._pinned, self._finish_s, self._early_s = self._books.timing(
            stacked, saturated_shared, now, remaining_bytes, self._size_bytes, rate_bps,
            self.coalesce_rel * BITS_PER_BYTE)
        self.rate_solves += 1

    def _early(self, finish_s: np.ndarray, size_bytes: np.ndarray,
               rate_bps: np.ndarray) -> np.ndarray:
        """When a flow counts as finished: `coalesce_rel` of its duration early."""
        if self.coalesce_rel == 0:
            return finish_s.copy()
        return finish_s - (self.coalesce_rel * BITS_PER_BYTE) * size_bytes / rate_bps

    def _nics_busy(self, src: np.ndarray, dst: np.ndarray, now_s: float) -> None:
        """Flows src[k] -> dst[k] are in flight from `now_s`."""
        n = self._n
        active = self._nic_active
        before = active.copy()
        active[:n] += np.bincount(src, minlength=n)
        active[n:] += np.bincount(dst, minlength=n)
        self._nic_busy_since_s[(before == 0) & (active > 0)] = now_s

    def _nics_idle(self, src: np.ndarray, dst: np.ndarray, sent_bits: np.ndarray,
                   now_s: float) -> None:
        """Flows src[k] -> dst[k] ended at `now_s`, having carried sent_bits[k]."""
        n = self._n
        active, ended_bits = self._nic_active, self._nic_ended_bits
        ended_bits[:n] += np.bincount(src, weights=sent_bits, minlength=n)
        ended_bits[n:] += np.bincount(dst, weights=sent_bits, minlength=n)
        before = active.copy()
        active[:n] -= np.bincount(src, minlength=n)
        active[n:] -= np.bincount(dst, minlength=n)
        idle = (before > 0) & (active == 0)
        self._nic_busy_s[idle] += now_s - self._nic_busy_since_s[idle]


def _caps(flow_cap_bps: np.ndarray | None, flow_count: int) -> tuple[np.ndarray, bool]:
    """The compiled solver's (caps of the flows, whether any): inf where none."""
    if flow_cap_bps is None:
        return np.full(flow_count, np.inf), False
    return flow_cap_bps, True
