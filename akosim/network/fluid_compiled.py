"""The fluid model's bookkeeping around a rate solve, compiled (numba), to the bit.

akosim.network.fluid does, at every rate solve, a dozen array steps on every
flow in flight: drop the flows that ended, what each has left to send, the
seeds of an incremental solve, and after it the flows pinned to a saturated
resource and the finish times. In numpy each step is a separate pass with its
own per-call cost, which at a few thousand flows costs more than the solve
itself (`dense_columns` builds the solver's resource columns). These kernels
do the same steps in one pass each, with the same floating-point operations
in the same order (the results are the numpy steps' bit for bit:
tests/test_maxmin_compiled.py runs whole fluid runs both ways). `retire_due` and
`solve` are the fluid model's wake-up in at most two calls (what ended and
the next finish time; the rate solve with its bookkeeping), so a wake-up
crosses from Python into compiled code once or twice. Loaded with
akosim.network.maxmin_compiled, once a run has solved enough flows.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from akosim.network.maxmin_compiled import fill, update

BITS_PER_BYTE = 8


@njit(cache=True, error_model="numpy")
def compact(finish_s: np.ndarray, now_s: float, src: np.ndarray, dst: np.ndarray,
            pair_key: np.ndarray, batch: np.ndarray, size_bytes: np.ndarray,
            rate_bps: np.ndarray, early_s: np.ndarray, pinned: np.ndarray):
    """The flows still in flight (finish time < inf), every array packed, and
    what each has left to send: rate * (finish - now) / 8, at least 0."""
    m = finish_s.shape[0]
    live = 0
    for f in range(m):
        if finish_s[f] < np.inf:
            live += 1
    has_keys = pair_key.shape[0] == m
    out_src = np.empty(live, src.dtype)
    out_dst = np.empty(live, dst.dtype)
    out_key = np.empty(live if has_keys else 0, pair_key.dtype)
    out_batch = np.empty(live, batch.dtype)
    out_size = np.empty(live)
    out_rate = np.empty(live)
    out_finish = np.empty(live)
    out_early = np.empty(live)
    out_pinned = np.empty(live, np.bool_)
    remaining = np.empty(live)
    at = 0
    for f in range(m):
        if finish_s[f] < np.inf:
            out_src[at] = src[f]
            out_dst[at] = dst[f]
            if has_keys:
                out_key[at] = pair_key[f]
            out_batch[at] = batch[f]
            out_size[at] = size_bytes[f]
            out_rate[at] = rate_bps[f]
            out_finish[at] = finish_s[f]
            out_early[at] = early_s[f]
            out_pinned[at] = pinned[f]
            left = rate_bps[f] * (finish_s[f] - now_s) / BITS_PER_BYTE
            remaining[at] = 0.0 if left < 0.0 else left
            at += 1
    return (out_src, out_dst, out_key, out_batch, out_size, out_rate, out_finish, out_early,
            out_pinned, remaining)


@njit(cache=True, error_model="numpy")
def dense_columns(src: np.ndarray, dst: np.ndarray, pair_key: np.ndarray, n: int,
                  pair_capacity_bps: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool]:
    """`akosim.network.maxmin.ResourceIndex.columns` for a dense index: (the
    columns as one array: uplink, downlink and, if some pair is crossed by
    several flows, that pair (else the uncapped placeholder); the flows' own
    caps, inf where none; whether any flow has a pair cap)."""
    m = src.shape[0]
    uses = np.zeros(n * n, np.int64)
    any_pair = False
    for f in range(m):
        if pair_key[f] >= 0:
            uses[pair_key[f]] += 1
            any_pair = True
    shared = False
    for f in range(m):
        if pair_key[f] >= 0 and uses[pair_key[f]] > 1:
            shared = True
    columns = np.empty((3 if shared else 2, m), np.intp)
    flow_cap_bps = np.full(m, np.inf)
    for f in range(m):
        columns[0, f] = src[f]
        columns[1, f] = dst[f] + n
        key = pair_key[f]
        if shared:
            columns[2, f] = 2 * n
        if key >= 0:
            if shared and uses[key] > 1:
                columns[2, f] = key + 2 * n + 1
            else:
                flow_cap_bps[f] = pair_capacity_bps[key]
    return columns, flow_cap_bps, any_pair


@njit(cache=True, error_model="numpy")
def local_seed(columns: np.ndarray, n_resources: int, old_count: int, freed_src: np.ndarray,
               freed_dst: np.ndarray, saturated_nics: np.ndarray, n: int) -> np.ndarray:
    """The resources an incremental solve starts from: every resource of a new
    flow, the saturated NICs of the flows that ended."""
    k, m = columns.shape
    seed = np.zeros(n_resources, np.bool_)
    for c in range(k):
        for f in range(old_count, m):
            seed[columns[c, f]] = True
    for i in range(freed_src.shape[0]):
        if saturated_nics[freed_src[i]]:
            seed[freed_src[i]] = True
    for i in range(freed_dst.shape[0]):
        if saturated_nics[freed_dst[i] + n]:
            seed[freed_dst[i] + n] = True
    return seed


@njit(cache=True, error_model="numpy")
def timing(columns: np.ndarray, saturated_shared: np.ndarray, now_s: float,
           remaining_bytes: np.ndarray, size_bytes: np.ndarray, rate_bps: np.ndarray,
           early_bits_per_byte: float):
    """(pinned flows, finish times, when each counts as finished) after a solve:
    finish = now + remaining * 8 / rate, early = finish - (coalesce * 8) * size / rate
    (`early_bits_per_byte` = coalesce * 8; at 0 early is the finish time)."""
    k, m = columns.shape
    pinned = np.empty(m, np.bool_)
    finish_s = np.empty(m)
    early_s = np.empty(m)
    for f in range(m):
        is_pinned = False
        for c in range(k):
            if saturated_shared[columns[c, f]]:
                is_pinned = True
        pinned[f] = is_pinned
        end_s = now_s + remaining_bytes[f] * BITS_PER_BYTE / rate_bps[f]
        finish_s[f] = end_s
        if early_bits_per_byte == 0.0:
            early_s[f] = end_s
        else:
            early_s[f] = end_s - early_bits_per_byte * size_bytes[f] / rate_bps[f]
    return pinned, finish_s, early_s


@njit(cache=True, error_model="numpy")
def retire(idx: np.ndarray, now_s: float, tolerance_s: float, src: np.ndarray,
           dst: np.ndarray, batch: np.ndarray, size_bytes: np.ndarray, rate_bps: np.ndarray,
           finish_s: np.ndarray, early_s: np.ndarray, pinned: np.ndarray, n: int,
           nic_active: np.ndarray, nic_ended_bits: np.ndarray, nic_busy_s: np.ndarray,
           nic_busy_since_s: np.ndarray):
    """Flows `idx` end at `now_s` (the fluid model's `_complete` and `_nics_idle`):
    what each carried (size * 8 - rate * how early it ended, 0 within
    `tolerance_s`) is added to its NICs, per NIC summed first as np.bincount
    does; NICs left with no flow stop being busy; the flows are marked dead in
    place. Returns their (src, dst, batch, size, whether each was pinned)."""
    count = idx.shape[0]
    out_src = np.empty(count, src.dtype)
    out_dst = np.empty(count, dst.dtype)
    out_batch = np.empty(count, batch.dtype)
    out_size = np.empty(count)
    out_pinned = np.empty(count, np.bool_)
    up_bits = np.zeros(n)
    down_bits = np.zeros(n)
    before = nic_active.copy()
    for i in range(count):
        f = idx[i]
        out_src[i] = src[f]
        out_dst[i] = dst[f]
        out_batch[i] = batch[f]
        out_size[i] = size_bytes[f]
        out_pinned[i] = pinned[f]
        early = finish_s[f] - now_s
        if early <= tolerance_s:
            early = 0.0
        sent_bits = size_bytes[f] * BITS_PER_BYTE - rate_bps[f] * early
        up_bits[src[f]] += sent_bits
        down_bits[dst[f]] += sent_bits
        nic_active[src[f]] -= 1
        nic_active[dst[f] + n] -= 1
        rate_bps[f] = 0.0
        finish_s[f] = np.inf
        early_s[f] = np.inf
        pinned[f] = False
    for i in range(n):
        nic_ended_bits[i] += up_bits[i]
        nic_ended_bits[i + n] += down_bits[i]
    for q in range(2 * n):
        if before[q] > 0 and nic_active[q] == 0:
            nic_busy_s[q] += now_s - nic_busy_since_s[q]
    return out_src, out_dst, out_batch, out_size, out_pinned


@njit(cache=True, error_model="numpy")
def _nics_busy(src: np.ndarray, dst: np.ndarray, now_s: float, n: int, nic_active: np.ndarray,
               nic_busy_since_s: np.ndarray) -> None:
    """Flows src[k] -> dst[k] are in flight from `now_s` (the fluid model's `_nics_busy`)."""
    before = nic_active.copy()
    for i in range(src.shape[0]):
        nic_active[src[i]] += 1
        nic_active[dst[i] + n] += 1
    for q in range(2 * n):
        if before[q] == 0 and nic_active[q] > 0:
            nic_busy_since_s[q] = now_s


@njit(cache=True, error_model="numpy")
def retire_due(now_s: float, tolerance_s: float, src: np.ndarray, dst: np.ndarray,
               batch: np.ndarray, size_bytes: np.ndarray, rate_bps: np.ndarray,
               finish_s: np.ndarray, early_s: np.ndarray, pinned: np.ndarray, n: int,
               nic_active: np.ndarray, nic_ended_bits: np.ndarray, nic_busy_s: np.ndarray,
               nic_busy_since_s: np.ndarray):
    """The first half of the fluid model's `advance(now_s)`: the flows that count as
    finished by `now_s` (early_s <= now_s + tolerance_s) are retired (`retire`), in one
    pass that also finds the next finish time of the others. Returns the ended flows'
    (src, dst, batch, size, whether each was pinned) in batch order (stable), how many
    and how many of them were pinned, and the next finish time of the flows left (inf
    if none)."""
    m = src.shape[0]
    due_s = now_s + tolerance_s
    idx = np.empty(m, np.intp)
    count = 0
    next_s = np.inf
    for f in range(m):
        if early_s[f] <= due_s:
            idx[count] = f
            count += 1
        elif finish_s[f] < next_s:
            next_s = finish_s[f]
    done_src, done_dst, done_batch, done_size, pinned_done = retire(
        idx[:count], now_s, tolerance_s, src, dst, batch, size_bytes, rate_bps, finish_s,
        early_s, pinned, n, nic_active, nic_ended_bits, nic_busy_s, nic_busy_since_s)
    n_pinned = 0
    in_order = True
    for i in range(count):
        if pinned_done[i]:
            n_pinned += 1
        if i and done_batch[i] < done_batch[i - 1]:
            in_order = False
    if not in_order:  # deliveries are grouped by batch: a stable sort, as np.argsort's
        order = np.argsort(done_batch, kind="mergesort")
        done_src, done_dst, done_batch = done_src[order], done_dst[order], done_batch[order]
        done_size, pinned_done = done_size[order], pinned_done[order]
    return done_src, done_dst, done_batch, done_size, pinned_done, count, n_pinned, next_s


@njit(cache=True, error_model="numpy")
def solve(now_s: float, early_bits_per_byte: float, incremental: bool, local_min_flows: int,
          has_keys: bool, n: int, nic_capacity_bps: np.ndarray, dense_capacity_bps: np.ndarray,
          pair_capacity_bps: np.ndarray, src: np.ndarray, dst: np.ndarray,
          pair_key: np.ndarray, batch: np.ndarray, size_bytes: np.ndarray,
          rate_bps: np.ndarray, finish_s: np.ndarray, early_s: np.ndarray,
          pinned: np.ndarray, saturated_nics: np.ndarray, freed_src: np.ndarray,
          freed_dst: np.ndarray, nic_active: np.ndarray, nic_busy_since_s: np.ndarray,
          new_src: np.ndarray, new_dst: np.ndarray, new_key: np.ndarray,
          new_batch: np.ndarray, new_size_bytes: np.ndarray):
    """The fluid model's `_solve` with the compiled kernels, in one call, for the cases
    whose resource columns they build (no pair caps, or a dense pair index): compact,
    bring the new flows (`new_*`) in, solve (the incremental update when it applies,
    else the filling) and set the finish times: `compact` and `dense_columns` (fused
    in one pass), `local_seed`, `update`, `fill` and `timing`, the same arithmetic in
    the order the fluid model does it, so the same bits. `pair_key` and `new_key`
    have a key per flow when `has_keys` (the spec has pair caps), else none. Returns
    the flow arrays, the saturated NICs, whether it solved (False: no flow left),
    whether the update proved its result, and the next finish time (inf if none)."""
    # One pass over the flows in flight and the new ones: `compact`, the new flows
    # appended, and `dense_columns`' two resource columns and flow caps (a pair
    # crossed by several flows needs the third column: built after, as it does).
    m_old = src.shape[0]
    old_count = 0
    for f in range(m_old):
        if finish_s[f] < np.inf:
            old_count += 1
    n_new = new_src.shape[0]
    m = old_count + n_new
    out_src = np.empty(m, src.dtype)
    out_dst = np.empty(m, dst.dtype)
    out_key = np.empty(m if has_keys else 0, pair_key.dtype)
    out_batch = np.empty(m, batch.dtype)
    out_size = np.empty(m)
    old_rate_bps = np.zeros(m)  # what `update` is given: 0 for the new flows
    remaining_bytes = np.empty(m)
    columns = np.empty((2, m), np.intp)
    flow_cap_bps = np.full(m, np.inf)
    uses = np.zeros(n * n if has_keys else 0, np.int64)
    any_pair = False
    at = 0
    for f in range(m_old + n_new):
        if f < m_old:
            if not finish_s[f] < np.inf:
                continue
            i, j, s_bytes = src[f], dst[f], size_bytes[f]
            key = pair_key[f] if has_keys else -1
            out_batch[at] = batch[f]
            old_rate_bps[at] = rate_bps[f]
            left = rate_bps[f] * (finish_s[f] - now_s) / BITS_PER_BYTE
            remaining_bytes[at] = 0.0 if left < 0.0 else left
        else:
            g = f - m_old
            i, j, s_bytes = new_src[g], new_dst[g], new_size_bytes[g]
            key = new_key[g] if has_keys else -1
            out_batch[at] = new_batch[g]
            remaining_bytes[at] = s_bytes
        out_src[at] = i
        out_dst[at] = j
        out_size[at] = s_bytes
        columns[0, at] = i
        columns[1, at] = j + n
        if has_keys:
            out_key[at] = key
            if key >= 0:
                uses[key] += 1
                any_pair = True
                flow_cap_bps[at] = pair_capacity_bps[key]
        at += 1
    if n_new:
        _nics_busy(new_src, new_dst, now_s, n, nic_active, nic_busy_since_s)
    src, dst, pair_key, batch, size_bytes = out_src, out_dst, out_key, out_batch, out_size
    if m == 0:
        return (src, dst, pair_key, batch, size_bytes, old_rate_bps, np.empty(0),
                np.empty(0), np.empty(0, np.bool_), np.zeros(2 * n, np.bool_), False, False,
                np.inf)
    local = (incremental and m > local_min_flows and m - old_count <= m // 2)
    has_cap = any_pair
    capacity_bps = nic_capacity_bps
    shared = False
    if any_pair:
        for f in range(m):
            if pair_key[f] >= 0 and uses[pair_key[f]] > 1:
                shared = True
                break
    if shared:
        columns, flow_cap_bps, has_cap = dense_columns(src, dst, pair_key, n,
                                                       pair_capacity_bps)
        capacity_bps = dense_capacity_bps
    proved = False
    new_rate_bps = old_rate_bps
    saturated_shared = saturated_nics
    if local:
        seed = local_seed(columns, capacity_bps.shape[0], old_count, freed_src, freed_dst,
                          saturated_nics, n)
        proved, new_rate_bps, saturated_shared, _ = update(
            columns, capacity_bps, flow_cap_bps, has_cap, old_rate_bps, seed, m // 2)
    if not proved:
        new_rate_bps, saturated_shared = fill(columns, capacity_bps, flow_cap_bps, has_cap)
    pinned, finish_s, early_s = timing(columns, saturated_shared, now_s, remaining_bytes,
                                       size_bytes, new_rate_bps, early_bits_per_byte)
    return (src, dst, pair_key, batch, size_bytes, new_rate_bps, finish_s, early_s, pinned,
            saturated_shared[:2 * n], True, proved, finish_s.min())
