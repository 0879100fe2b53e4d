"""The bandwidth-sharing rule: max-min fair rates by progressive filling.

Pure functions of a `NetworkSpec` and a set of flows, no state and no clock.
A flow i -> j crosses three resources (uplink i, downlink j, link (i, j));
concurrent flows get the max-min fair rates found by progressive filling
(water-filling). `max_min_rates` is the reference entry point;
`ResourceIndex` and `max_min_fill` are the vectorised pieces the fluid model
(akosim.network.fluid) calls on every rate solve.

Units: capacities and rates in bits per second.
"""

from __future__ import annotations

import math

import numpy as np

from akosim.network.netspec import NetworkSpec

# Two bottleneck shares within this relative distance are one level of the
# progressive filling; a resource whose leftover capacity is within it of zero
# is saturated.
_TIE_REL = 1e-9
# The tolerance of the proof that an updated allocation is max-min fair: a few
# times the filling's own tie distance, far below any real difference of rates.
_CHECK_REL = 1e-8
# Up to this many ordered pairs, per-pair caps are indexed densely; above it the
# pairs in use are compacted at every solve (no n x n arrays per solve).
_DENSE_PAIRS_MAX = 1 << 16
# Up to this many free flows, a local update's first guess is computed in plain
# Python (numpy's per-call cost dominates below it).
_SMALL_SEED_FLOWS = 192


def max_min_fill(
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


def max_min_update(
    columns: list[np.ndarray],
    capacity_bps: np.ndarray,
    flow_cap_bps: np.ndarray | None,
    rate_bps: np.ndarray,
    seed: np.ndarray,
    max_free: int,
) -> tuple[np.ndarray, np.ndarray, int] | None:
    """The max-min fair rates after a change, re-solving only the flows near it.

    `rate_bps` are the max-min fair rates of the flows before the change (any
    value for flows that are new); `seed` marks the resources whose flows may
    change: every resource of a new flow, the saturated resources of flows that
    ended. The flows crossing a seed are re-solved on what the others leave of
    each resource (first guess: each seed filled on its own; if that fails the
    proof, by `max_min_fill`); the others keep their rates. The result is
    then proved max-min fair as a whole: it is feasible (by construction) and
    every flow has a bottleneck, its own cap or a saturated resource on which
    no flow is faster (Bertsekas & Gallager's condition, which only the
    max-min fair allocation meets). Flows without one add their resources to
    the seeds and the step repeats. Returns (rates, mask of saturated resources
    shared by more than one flow, flows re-solved), or None once more than
    `max_free` flows would be re-solved (a full solve is cheaper then).
    """
    n_resources = capacity_bps.shape[0]
    n_flows = rate_bps.shape[0]
    k = len(columns)
    incidence = np.concatenate(columns)
    count_all = np.bincount(incidence, minlength=n_resources)
    finite = np.isfinite(capacity_bps)
    saturated_floor_bps = np.where(finite, capacity_bps * (1.0 - _TIE_REL), np.inf)
    ceiling_bps = capacity_bps * (1.0 + _CHECK_REL)
    seed = seed.copy()

    def settled_flows(candidate_bps: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """(flows with a bottleneck, saturated resources), or None if infeasible."""
        incidence_bps = _repeat_columns(candidate_bps, k)
        load_bps = np.bincount(incidence, weights=incidence_bps, minlength=n_resources)
        if (load_bps > ceiling_bps).any():
            return None
        saturated = load_bps >= saturated_floor_bps
        fastest_bps = np.zeros(n_resources)
        np.maximum.at(fastest_bps, incidence, incidence_bps)
        bottleneck = saturated[incidence] & (
            incidence_bps >= fastest_bps[incidence] * (1.0 - _CHECK_REL))
        settled = bottleneck.reshape(k, n_flows).any(axis=0)
        if flow_cap_bps is not None:
            settled |= candidate_bps >= flow_cap_bps * (1.0 - _CHECK_REL)
        return settled, saturated

    while True:
        free = seed[incidence].reshape(k, n_flows).any(axis=0)
        free_idx = free.nonzero()[0]
        if free_idx.shape[0] > max_free:
            return None
        new_rate_bps = rate_bps.copy()
        if free_idx.shape[0]:
            fixed_bps = np.where(free, 0.0, rate_bps)
            residual_bps = capacity_bps - np.bincount(
                incidence, weights=_repeat_columns(fixed_bps, k), minlength=n_resources)
            np.maximum(residual_bps, 0.0, out=residual_bps)
            free_columns = [column[free_idx] for column in columns]
            free_cap_bps = None if flow_cap_bps is None else flow_cap_bps[free_idx]
            # First guess: each seed filled on its own, the free flows held to
            # their caps and to what their other resources leave. It is often
            # the answer (the proof says whether), at a fraction of a filling.
            levels = _seed_levels_small if free_idx.shape[0] <= _SMALL_SEED_FLOWS else _seed_levels
            new_rate_bps[free_idx] = levels(free_columns, residual_bps, free_cap_bps, seed)
            checked = settled_flows(new_rate_bps)
            if checked is not None and checked[0].all():
                return new_rate_bps, checked[1] & (count_all > 1), int(free_idx.shape[0])
            if free_cap_bps is not None:
                # A resource that the free flows cannot fill even at their own
                # caps binds nobody: leave it out (infinite), which shortens the
                # filling.
                demand_bps = np.bincount(np.concatenate(free_columns),
                                         weights=_repeat_columns(free_cap_bps, k),
                                         minlength=n_resources)
                residual_bps[demand_bps <= residual_bps] = np.inf
            sub_rate_bps, _ = max_min_fill(free_columns, residual_bps, free_cap_bps)
            new_rate_bps[free_idx] = sub_rate_bps
        checked = settled_flows(new_rate_bps)
        if checked is None:  # cannot happen: the residuals bound the free flows
            return None
        settled, saturated = checked
        if settled.all():
            return new_rate_bps, saturated & (count_all > 1), int(free_idx.shape[0])
        unsettled = ~settled
        grown = seed.copy()
        for column in columns:
            grown[column[unsettled]] = True
        if (grown == seed).all():  # cannot happen for a max-min fair `rate_bps`
            return None
        seed = grown


def _repeat_columns(values: np.ndarray, k: int) -> np.ndarray:
    """`values` once per resource column, as the incidence lists them (np.tile, cheaper)."""
    return np.concatenate((values,) * k)


def _seed_levels_small(columns: list[np.ndarray], residual_bps: np.ndarray,
                       flow_cap_bps: np.ndarray | None, seed: np.ndarray) -> np.ndarray:
    """`_seed_levels` in plain Python: for the few free flows of a local update,
    where numpy's per-call cost would exceed the work. Same levels, summed
    flow by flow (the proof of `max_min_update` checks them either way)."""
    n_flows = columns[0].shape[0]
    resources = [column.tolist() for column in columns]
    on_seed = [seed[column].tolist() for column in columns]
    residuals = [residual_bps[column].tolist() for column in columns]
    held = [math.inf] * n_flows if flow_cap_bps is None else flow_cap_bps.tolist()
    for is_seed, residual in zip(on_seed, residuals, strict=True):
        for f in range(n_flows):
            if not is_seed[f] and residual[f] < held[f]:
                held[f] = residual[f]
    caps_of: dict[int, list[float]] = {}
    residual_of: dict[int, float] = {}
    for column, is_seed, residual in zip(resources, on_seed, residuals, strict=True):
        for f in range(n_flows):
            if is_seed[f]:
                resource = column[f]
                group = caps_of.get(resource)
                if group is None:
                    caps_of[resource] = [held[f]]
                    residual_of[resource] = residual[f]
                else:
                    group.append(held[f])
    level_of: dict[int, float] = {}
    for resource, caps in caps_of.items():
        caps.sort()
        left_bps = residual_of[resource]
        uncapped = len(caps)
        level = math.inf
        for cap_bps in caps:
            candidate_bps = left_bps / uncapped
            if candidate_bps <= cap_bps:
                level = candidate_bps
                break
            left_bps -= cap_bps
            uncapped -= 1
        level_of[resource] = level
    rate = held
    for column, is_seed in zip(resources, on_seed, strict=True):
        for f in range(n_flows):
            if is_seed[f]:
                level = level_of[column[f]]
                if level < rate[f]:
                    rate[f] = level
    return np.array(rate)


def _seed_levels(columns: list[np.ndarray], residual_bps: np.ndarray,
                 flow_cap_bps: np.ndarray | None, seed: np.ndarray) -> np.ndarray:
    """Rates of flows that each cross a seed resource, if every seed were filled
    on its own: a flow is held to its cap and to the residual of each of its
    other resources, and each seed's level is the water level W with
    sum(min(c_i, W)) = its residual over the held rates c_i of its flows (found
    at once by sorting them). A guess for `max_min_update` to prove."""
    n_flows = columns[0].shape[0]
    held_bps = np.full(n_flows, np.inf) if flow_cap_bps is None else flow_cap_bps.copy()
    on_seed = [seed[column] for column in columns]
    for column, is_seed in zip(columns, on_seed, strict=True):
        np.minimum(held_bps, np.where(is_seed, np.inf, residual_bps[column]), out=held_bps)
    mask = np.concatenate(on_seed)
    resource = np.concatenate(columns)[mask]
    cap_bps = _repeat_columns(held_bps, len(columns))[mask]
    order = np.lexsort((cap_bps, resource))
    resource, cap_bps = resource[order], cap_bps[order]
    size = resource.shape[0]
    head = np.empty(size, dtype=bool)
    head[0] = True
    np.not_equal(resource[1:], resource[:-1], out=head[1:])
    starts = np.flatnonzero(head)
    group = np.cumsum(head) - 1
    ends = np.append(starts[1:], size)
    finite_bps = np.where(np.isfinite(cap_bps), cap_bps, 0.0)
    total_bps = np.cumsum(finite_bps)
    below_bps = total_bps - finite_bps - (total_bps[starts] - finite_bps[starts])[group]
    uncapped = (ends - starts)[group] - (np.arange(size) - starts[group])
    with np.errstate(invalid="ignore"):
        candidate_bps = (residual_bps[resource] - below_bps) / uncapped
    # Past the first flow whose cap is above the candidate level, all are.
    fits = candidate_bps <= cap_bps
    first = starts + np.bincount(group, weights=~fits, minlength=starts.shape[0]).astype(np.intp)
    level_bps = np.full(residual_bps.shape[0], np.inf)
    found = first < ends
    level_bps[resource[starts[found]]] = candidate_bps[first[found]]
    rate_bps = held_bps
    for column in columns:
        np.minimum(rate_bps, level_bps[column], out=rate_bps)
    return rate_bps


class ResourceIndex:
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


def check_nodes(name: str, nodes: np.ndarray, n: int) -> None:
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
    check_nodes("max_min_rates: src", src_nodes, spec.n)
    check_nodes("max_min_rates: dst", dst_nodes, spec.n)
    if (src_nodes == dst_nodes).any():
        raise ValueError("max_min_rates: a flow from a node to itself is not a network flow")
    if src_nodes.size == 0:
        return np.empty(0)
    resources = ResourceIndex(spec, scan_pairs=False)
    columns, capacity_bps, flow_cap_bps = resources.columns(
        src_nodes, dst_nodes, resources.pair_keys(src_nodes, dst_nodes)
    )
    rate_bps, _ = max_min_fill(columns, capacity_bps, flow_cap_bps)
    return rate_bps
