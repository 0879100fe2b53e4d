"""The max-min solver of akosim.network.maxmin, compiled (numba), to the bit.

`fill` and `update` are `max_min_fill` and `max_min_update` written as loops
and compiled once per machine (numba, `cache=True`: the first call on a fresh
machine compiles for a few seconds, later processes load the cached code).
They do every floating-point operation of the numpy reference in the same
order (a weighted `np.bincount` sums in input order, `np.cumsum` accumulates
left to right, and the loops below do the same), so their rates are the
reference's bit for bit: tests/test_maxmin_compiled.py checks that on random
networks. akosim.network.fluid calls them on every rate solve; the numpy
functions stay the readable reference.

Resource columns are one (k, flows) array instead of a list of k arrays;
`flow_cap_bps` is always an array (inf where a flow has no cap of its own) and
`has_cap` says whether the reference would have been given one.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from akosim.network.maxmin import _CHECK_REL, _SMALL_SEED_FLOWS, _TIE_REL

# The factors exactly as the reference computes them (Python floats).
_TIE_UP = 1.0 + _TIE_REL
_TIE_DOWN = 1.0 - _TIE_REL
_CHECK_UP = 1.0 + _CHECK_REL
_CHECK_DOWN = 1.0 - _CHECK_REL


@njit(cache=True)
def fill(columns: np.ndarray, capacity_bps: np.ndarray, flow_cap_bps: np.ndarray,
         has_cap: bool) -> tuple[np.ndarray, np.ndarray]:
    """`akosim.network.maxmin.max_min_fill`: (rates, saturated shared resources).

    The same passes as the reference, each in two sweeps over the live flows
    (their tightest share and the resources they block; then which freeze, what
    they take from each resource, column by column, and the live flows packed
    to the front), so a pass costs the live flows, not the resources."""
    k, m = columns.shape
    n_resources = capacity_bps.shape[0]
    rate_bps = np.empty(m)
    leftover_bps = capacity_bps.copy()
    count = np.zeros(n_resources, np.int64)
    for c in range(k):
        for f in range(m):
            count[columns[c, f]] += 1
    count_all = count.copy()
    used = np.flatnonzero(count_all)
    live_columns = columns.copy()
    live_cap_bps = flow_cap_bps.copy() if has_cap else flow_cap_bps
    live = np.arange(m)
    n_live = m
    share_bps = np.full(n_resources, np.inf)
    flow_share_bps = np.empty(m)
    ready = np.ones(n_resources, np.bool_)
    taken_bps = np.zeros((k, n_resources))
    while n_live:
        for r in used:
            share_bps[r] = leftover_bps[r] / count[r] if count[r] > 0 else np.inf
            ready[r] = True
        for i in range(n_live):
            s = share_bps[live_columns[0, i]]
            for c in range(1, k):
                v = share_bps[live_columns[c, i]]
                if v < s:
                    s = v
            if has_cap and live_cap_bps[i] < s:
                s = live_cap_bps[i]
            flow_share_bps[i] = s
            limit_bps = s * _TIE_UP
            for c in range(k):
                r = live_columns[c, i]
                if share_bps[r] > limit_bps:
                    ready[r] = False
        kept = 0
        for i in range(n_live):
            is_frozen = False
            for c in range(k):
                if ready[live_columns[c, i]]:
                    is_frozen = True
            s = flow_share_bps[i]
            if has_cap and live_cap_bps[i] <= s * _TIE_UP:
                is_frozen = True
            if is_frozen:
                rate_bps[live[i]] = s
                for c in range(k):
                    r = live_columns[c, i]
                    taken_bps[c, r] += s
                    count[r] -= 1
            else:
                for c in range(k):
                    live_columns[c, kept] = live_columns[c, i]
                if has_cap:
                    live_cap_bps[kept] = live_cap_bps[i]
                live[kept] = live[i]
                kept += 1
        for r in used:
            for c in range(k):
                leftover_bps[r] -= taken_bps[c, r]
                taken_bps[c, r] = 0.0
            if kept and leftover_bps[r] < 0.0:  # np.maximum(x, 0.0) between passes
                leftover_bps[r] = 0.0
        n_live = kept
    saturated_shared = np.zeros(n_resources, np.bool_)
    for q in range(n_resources):
        cap = capacity_bps[q]
        if np.isfinite(cap) and leftover_bps[q] <= _TIE_REL * cap and count_all[q] > 1:
            saturated_shared[q] = True
    return rate_bps, saturated_shared


@njit(cache=True)
def _settled(columns: np.ndarray, candidate_bps: np.ndarray, flow_cap_bps: np.ndarray,
             has_cap: bool, ceiling_bps: np.ndarray, saturated_floor_bps: np.ndarray,
             settled: np.ndarray, saturated: np.ndarray) -> bool:
    """The reference's `settled_flows`, into `settled` and `saturated`; False if infeasible."""
    k, m = columns.shape
    n_resources = ceiling_bps.shape[0]
    load_bps = np.zeros(n_resources)
    fastest_bps = np.zeros(n_resources)
    for c in range(k):
        for f in range(m):
            r = columns[c, f]
            v = candidate_bps[f]
            load_bps[r] += v
            if v > fastest_bps[r]:
                fastest_bps[r] = v
    for r in range(n_resources):
        if load_bps[r] > ceiling_bps[r]:
            return False
    for r in range(n_resources):
        saturated[r] = load_bps[r] >= saturated_floor_bps[r]
    for f in range(m):
        v = candidate_bps[f]
        is_settled = False
        for c in range(k):
            r = columns[c, f]
            if saturated[r] and v >= fastest_bps[r] * _CHECK_DOWN:
                is_settled = True
        if has_cap and v >= flow_cap_bps[f] * _CHECK_DOWN:
            is_settled = True
        settled[f] = is_settled
    return True


@njit(cache=True)
def _held(columns: np.ndarray, residual_bps: np.ndarray, flow_cap_bps: np.ndarray,
          has_cap: bool, seed: np.ndarray) -> np.ndarray:
    """Each free flow held to its cap and to the residuals of its non-seed resources."""
    k, m = columns.shape
    held_bps = flow_cap_bps.copy() if has_cap else np.full(m, np.inf)
    for c in range(k):
        for f in range(m):
            r = columns[c, f]
            if not seed[r] and residual_bps[r] < held_bps[f]:
                held_bps[f] = residual_bps[r]
    return held_bps


@njit(cache=True)
def _seed_entries(columns: np.ndarray, held_bps: np.ndarray,
                  seed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(resource, held rate) of every flow's seed resources, sorted by resource then rate."""
    k, m = columns.shape
    size = 0
    for c in range(k):
        for f in range(m):
            if seed[columns[c, f]]:
                size += 1
    resource = np.empty(size, np.intp)
    cap_bps = np.empty(size)
    at = 0
    for c in range(k):
        for f in range(m):
            r = columns[c, f]
            if seed[r]:
                resource[at] = r
                cap_bps[at] = held_bps[f]
                at += 1
    by_cap = np.argsort(cap_bps, kind="mergesort")
    order = by_cap[np.argsort(resource[by_cap], kind="mergesort")]
    return resource[order], cap_bps[order]


@njit(cache=True)
def _seed_levels_small(columns: np.ndarray, residual_bps: np.ndarray,
                       flow_cap_bps: np.ndarray, has_cap: bool,
                       seed: np.ndarray) -> np.ndarray:
    """The reference's `_seed_levels_small`: each seed's level by subtracting caps in turn."""
    k, m = columns.shape
    held_bps = _held(columns, residual_bps, flow_cap_bps, has_cap, seed)
    resource, cap_bps = _seed_entries(columns, held_bps, seed)
    level_bps = np.full(residual_bps.shape[0], np.inf)
    size = resource.shape[0]
    start = 0
    while start < size:
        r = resource[start]
        end = start
        while end < size and resource[end] == r:
            end += 1
        left_bps = residual_bps[r]
        uncapped = end - start
        level = np.inf
        for i in range(start, end):
            candidate_bps = left_bps / uncapped
            if candidate_bps <= cap_bps[i]:
                level = candidate_bps
                break
            left_bps -= cap_bps[i]
            uncapped -= 1
        level_bps[r] = level
        start = end
    rate_bps = held_bps
    for c in range(k):
        for f in range(m):
            r = columns[c, f]
            if seed[r] and level_bps[r] < rate_bps[f]:
                rate_bps[f] = level_bps[r]
    return rate_bps


@njit(cache=True)
def _seed_levels(columns: np.ndarray, residual_bps: np.ndarray, flow_cap_bps: np.ndarray,
                 has_cap: bool, seed: np.ndarray) -> np.ndarray:
    """The reference's `_seed_levels`: each seed's level from running sums of sorted caps."""
    k, m = columns.shape
    held_bps = _held(columns, residual_bps, flow_cap_bps, has_cap, seed)
    resource, cap_bps = _seed_entries(columns, held_bps, seed)
    size = resource.shape[0]
    level_bps = np.full(residual_bps.shape[0], np.inf)
    finite_bps = np.empty(size)
    total_bps = np.empty(size)
    running = 0.0
    for i in range(size):
        finite_bps[i] = cap_bps[i] if np.isfinite(cap_bps[i]) else 0.0
        running += finite_bps[i]
        total_bps[i] = running
    start = 0
    while start < size:
        r = resource[start]
        end = start
        while end < size and resource[end] == r:
            end += 1
        base_bps = total_bps[start] - finite_bps[start]
        misfits = 0
        for i in range(start, end):
            below_bps = total_bps[i] - finite_bps[i] - base_bps
            uncapped = (end - start) - (i - start)
            if not (residual_bps[r] - below_bps) / uncapped <= cap_bps[i]:
                misfits += 1
        first = start + misfits
        if first < end:
            below_bps = total_bps[first] - finite_bps[first] - base_bps
            level_bps[r] = (residual_bps[r] - below_bps) / ((end - start) - (first - start))
        start = end
    rate_bps = held_bps
    for c in range(k):
        for f in range(m):
            v = level_bps[columns[c, f]]
            if v < rate_bps[f]:
                rate_bps[f] = v
    return rate_bps


@njit(cache=True)
def update(columns: np.ndarray, capacity_bps: np.ndarray, flow_cap_bps: np.ndarray,
           has_cap: bool, rate_bps: np.ndarray, seed_in: np.ndarray,
           max_free: int) -> tuple[bool, np.ndarray, np.ndarray, int]:
    """`akosim.network.maxmin.max_min_update`: (proved, rates, saturated shared
    resources, flows re-solved); proved is False where the reference returns None."""
    k, m = columns.shape
    n_resources = capacity_bps.shape[0]
    nothing = np.empty(0)
    no_resources = np.empty(0, np.bool_)
    # One sweep: the flows on every resource, and the free flows of the first
    # seeds (the reference's first test, before any other work).
    count_all = np.zeros(n_resources, np.int64)
    free = np.empty(m, np.bool_)
    n_free = 0
    for f in range(m):
        is_free = False
        for c in range(k):
            r = columns[c, f]
            count_all[r] += 1
            if seed_in[r]:
                is_free = True
        free[f] = is_free
        if is_free:
            n_free += 1
    if n_free > max_free:
        return False, nothing, no_resources, n_free
    saturated_floor_bps = np.empty(n_resources)
    ceiling_bps = np.empty(n_resources)
    for r in range(n_resources):
        cap = capacity_bps[r]
        saturated_floor_bps[r] = cap * _TIE_DOWN if np.isfinite(cap) else np.inf
        ceiling_bps[r] = cap * _CHECK_UP
    seed = seed_in.copy()
    settled = np.empty(m, np.bool_)
    saturated = np.empty(n_resources, np.bool_)
    grown_seeds = False
    while True:
        if grown_seeds:
            n_free = 0
            for f in range(m):
                is_free = False
                for c in range(k):
                    if seed[columns[c, f]]:
                        is_free = True
                free[f] = is_free
                if is_free:
                    n_free += 1
            if n_free > max_free:
                return False, nothing, no_resources, n_free
        new_rate_bps = rate_bps.copy()
        if n_free:
            free_idx = np.empty(n_free, np.intp)
            at = 0
            for f in range(m):
                if free[f]:
                    free_idx[at] = f
                    at += 1
            fixed_load_bps = np.zeros(n_resources)
            for c in range(k):
                for f in range(m):
                    fixed_load_bps[columns[c, f]] += 0.0 if free[f] else rate_bps[f]
            residual_bps = np.empty(n_resources)
            for r in range(n_resources):
                left = capacity_bps[r] - fixed_load_bps[r]
                residual_bps[r] = 0.0 if left < 0.0 else left  # as np.maximum(x, 0.0)
            free_columns = np.empty((k, n_free), np.intp)
            free_cap_bps = np.empty(n_free)
            for i in range(n_free):
                for c in range(k):
                    free_columns[c, i] = columns[c, free_idx[i]]
                free_cap_bps[i] = flow_cap_bps[free_idx[i]]
            if n_free <= _SMALL_SEED_FLOWS:
                guess_bps = _seed_levels_small(free_columns, residual_bps, free_cap_bps,
                                               has_cap, seed)
            else:
                guess_bps = _seed_levels(free_columns, residual_bps, free_cap_bps, has_cap, seed)
            for i in range(n_free):
                new_rate_bps[free_idx[i]] = guess_bps[i]
            if _settled(columns, new_rate_bps, flow_cap_bps, has_cap, ceiling_bps,
                        saturated_floor_bps, settled, saturated) and settled.all():
                for r in range(n_resources):
                    saturated[r] = saturated[r] and count_all[r] > 1
                return True, new_rate_bps, saturated, n_free
            if has_cap:
                demand_bps = np.zeros(n_resources)
                for c in range(k):
                    for i in range(n_free):
                        demand_bps[free_columns[c, i]] += free_cap_bps[i]
                for r in range(n_resources):
                    if demand_bps[r] <= residual_bps[r]:
                        residual_bps[r] = np.inf
            sub_rate_bps, _ = fill(free_columns, residual_bps, free_cap_bps, has_cap)
            for i in range(n_free):
                new_rate_bps[free_idx[i]] = sub_rate_bps[i]
        if not _settled(columns, new_rate_bps, flow_cap_bps, has_cap, ceiling_bps,
                        saturated_floor_bps, settled, saturated):
            return False, nothing, no_resources, n_free
        if settled.all():
            for r in range(n_resources):
                saturated[r] = saturated[r] and count_all[r] > 1
            return True, new_rate_bps, saturated, n_free
        grown = seed.copy()
        for f in range(m):
            if not settled[f]:
                for c in range(k):
                    grown[columns[c, f]] = True
        same = True
        for r in range(n_resources):
            if grown[r] != seed[r]:
                same = False
        if same:
            return False, nothing, no_resources, n_free
        seed = grown
        grown_seeds = True
