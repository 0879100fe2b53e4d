"""An island's round: its devices' compute and the all-reduce over its inside network.

A rank may be an island of ``d`` devices (``cluster.devices_per_rank``, from a
site such as ``8dev@1gbps,inside=100gbps/5us``) joined by an inside network
(``network.inside_bandwidth``, ``network.inside_latency``). The batch is per
device, as data-parallel JAX users expect: an island of d devices processes
d x batch samples per round, each device the gradient of its own batch (the
measured or given compute time, unchanged), then the island reduces the d
gradients into one over its inside network, and that one gradient is what the
rank exchanges with the other ranks through the scheme.

The inside reduction is charged in closed form, a ring all-reduce over the
inside links: 2(d-1) steps, each sending 1/d of the gradient to the next
device and waiting one inside latency::

    inside_allreduce_s = 2(d-1)/d x gradient_bytes x 8 / inside_bandwidth_bps
                         + 2(d-1) x inside_latency_s

(0 for one device; the bandwidth term is 0 for an unlimited inside network).
It is float32 and uncoded: a codec applies to what the rank sends out, not to
XLA's reduction inside. The engine charges it each round after the gradient
and before the rank's sends leave (akosim.planning.compute.ComputeModel.inside_s).

This module is pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import replace

from akocore.settings.schema import RunConfig

BITS_PER_BYTE = 8


def inside_allreduce_s(gradient_bytes: float, devices: int, bandwidth_bps: float,
                       latency_s: float) -> float:
    """Seconds of a ring all-reduce of `gradient_bytes` over `devices` devices whose
    links carry `bandwidth_bps` (bits/s; inf = free) with `latency_s` one way."""
    if devices < 1:
        raise ValueError(f"an island needs at least 1 device, got {devices}")
    if not bandwidth_bps > 0 or latency_s < 0 or gradient_bytes < 0:
        raise ValueError("inside bandwidth must be > 0, latency and gradient size >= 0")
    if devices == 1:
        return 0.0
    steps = 2 * (devices - 1)
    wire_s = 0.0 if math.isinf(bandwidth_bps) else \
        steps / devices * gradient_bytes * BITS_PER_BYTE / bandwidth_bps
    return wire_s + steps * latency_s


def island_round_s(compute_s: float, gradient_bytes: float, devices: int,
                   bandwidth_bps: float, latency_s: float) -> float:
    """An island's time per round before the rank's sends: each device's gradient of its
    own batch (`compute_s`, in parallel) and then the inside all-reduce."""
    return compute_s + inside_allreduce_s(gradient_bytes, devices, bandwidth_bps, latency_s)


def has_islands(config: RunConfig) -> bool:
    """Whether some rank of `config` is an island of more than one device."""
    return any(d > 1 for d in config.cluster.devices_per_rank)


def inside_times_s(config: RunConfig, gradient_bytes: float) -> tuple[float, ...]:
    """Each rank's inside all-reduce per round, in seconds (0 for one-device ranks)."""
    cluster, network = config.cluster, config.network
    return tuple(inside_allreduce_s(gradient_bytes, cluster.devices_of(rank),
                                    *network.inside_of(rank))
                 for rank in range(cluster.workers))


def samples_per_round(config: RunConfig, batch_size: int, training_ranks: int) -> int:
    """Samples the first `training_ranks` ranks (the training ones: servers come last)
    process per round: batch_size per device, every device of every island."""
    return batch_size * sum(config.cluster.devices_of(rank) for rank in range(training_ranks))


def describe_islands(config: RunConfig, batch_size: int, gradient_bytes: float) -> list[str]:
    """One line per kind of island in `config` (none when every rank has one device):
    its devices, its samples per round and its inside all-reduce, in words."""
    from akocore.units import format_bandwidth, format_duration

    kinds: dict[tuple[int, float, float], list[int]] = {}
    for rank in range(config.cluster.workers):
        devices = config.cluster.devices_of(rank)
        if devices > 1:
            kinds.setdefault((devices, *config.network.inside_of(rank)), []).append(rank)
    lines = []
    for (devices, bandwidth_bps, latency_s), ranks in kinds.items():
        reduce_s = inside_allreduce_s(gradient_bytes, devices, bandwidth_bps, latency_s)
        link = "an unlimited inside network" if math.isinf(bandwidth_bps) else \
            f"{format_bandwidth(bandwidth_bps)}, {format_duration(latency_s)} one way"
        which = f"{len(ranks)} rank{'s' if len(ranks) > 1 else ''}"
        lines.append(f"islands: {which} of {devices} devices, batch {batch_size} per device "
                     f"({devices * batch_size} samples per rank per round); inside all-reduce "
                     f"{format_duration(reduce_s)} per round (a ring over {link}) after "
                     f"each gradient")
    return lines


def island_batch_config(config: RunConfig) -> RunConfig:
    """`config` with the batch one rank's gradient is taken on in simulated training: every
    device's batch (the mean of d equal batches' mean gradients is the mean gradient of
    their union, so an island of d devices trains as one device on d x batch_size).
    ValueError when the ranks' islands differ (one simulated workload serves them all)."""
    devices = set(config.cluster.devices_per_rank)
    if len(devices) > 1:
        raise ValueError(f"simulated training needs the same devices in every rank, got "
                         f"cluster.devices_per_rank = {', '.join(map(str, sorted(devices)))}")
    (per_rank,) = devices
    if per_rank == 1:
        return config
    return replace(config, train=replace(config.train,
                                         batch_size=config.train.batch_size * per_rank))
