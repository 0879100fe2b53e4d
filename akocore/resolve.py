"""From a RunConfig to what the shells build: the network arrays, p, the scheme spec.

Both shells turn a config into nodes the same way: resolve p (explicit, or
`auto` through the planner with the measured or given compute time and the
configured network), then describe the nodes with a SchemeSpec. Keeping this
here means a prediction by akosim and a run by akorun use the same p for the
same config.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from akocore.codecs import codec_named
from akocore.config import RunConfig
from akocore.partition import PartitionError, check_p
from akocore.planner import Plan, PlanInputs, plan
from akocore.schemes import SchemeSpec, scheme_named
from akocore.settings.key_registry import key_of


@dataclass(frozen=True)
class NetworkArrays:
    """The configured network as arrays for n nodes (bits/s, seconds)."""

    uplink_bps: np.ndarray
    downlink_bps: np.ndarray
    link_bps: np.ndarray  # n x n, inf = no cap
    latency_s: np.ndarray  # n x n


def network_arrays(cfg: RunConfig) -> NetworkArrays:
    n = cfg.cluster.workers
    net = cfg.network
    return NetworkArrays(net.uplink_bps(n), net.downlink_bps(n), net.link_bps_matrix(n),
                         net.latency_matrix(n))


def coded_gradient_bytes(cfg: RunConfig, gradient_bytes: float, length: int) -> float:
    """What a gradient of `length` values weighs on the wire under the run's codec
    (the planner's S): its float32 bytes times the codec's ratio."""
    return gradient_bytes * codec_named(cfg.exchange.codec).ratio(length)


def resolve_plan(cfg: RunConfig, *, gradient_bytes: float, length: int,
                 compute_s: float | tuple[float, ...], nodes: int | None = None) -> Plan:
    """p for every worker: the planner's for "auto", or the configured values.

    With a codec, the planner weighs the gradient at its encoded size.

    `nodes` restricts the plan to the first `nodes` ranks (ps workers), else all.
    """
    exchange = cfg.exchange
    n = nodes if nodes is not None else cfg.cluster.workers
    arrays = network_arrays(cfg)
    if isinstance(exchange.p, tuple):
        p_of = exchange.p * n if len(exchange.p) == 1 else exchange.p[:n]
        for p in p_of:
            try:
                check_p(length, p)
            except PartitionError as error:
                raise ValueError(f"exchange.p: {error}") from None
        return Plan(tuple(p_of), len(set(p_of)) > 1, ("given",) * n, tuple(map(float, p_of)),
                    exchange.ssp, exchange.utilisation)
    inputs = PlanInputs(
        workers=n, gradient_bytes=coded_gradient_bytes(cfg, gradient_bytes, length),
        compute_s=compute_s,
        uplink_bps=tuple(arrays.uplink_bps[:n]), downlink_bps=tuple(arrays.downlink_bps[:n]),
        link_bps=tuple(map(tuple, arrays.link_bps[:n, :n])), utilisation=exchange.utilisation,
        p_max=exchange.p_max, length=length, staleness=exchange.ssp)
    return plan(inputs, per_worker=exchange.p == "auto-per-worker")


def scheme_spec(cfg: RunConfig, p_of: tuple[int, ...] = (1,), *,
                ps_servers: int | None = None) -> SchemeSpec:
    """The nodes' description of `cfg`. Every exchange key the scheme declares
    (`Scheme.keys`) that is not a SchemeSpec field reaches its builder in
    `SchemeSpec.options`, so a scheme with knobs of its own needs no field here."""
    exchange = cfg.exchange
    servers = ps_servers if ps_servers is not None else (
        exchange.ps_servers if isinstance(exchange.ps_servers, int) else 1)
    spec_fields = {item.name for item in fields(SchemeSpec)}
    options = tuple((name, getattr(exchange, key_of(f"exchange.{name}").field))
                    for name in scheme_named(exchange.scheme).keys
                    if key_of(f"exchange.{name}").field not in spec_fields)
    return SchemeSpec(scheme=exchange.scheme, workers=cfg.cluster.workers, p_of=p_of,
                      staleness=exchange.ssp, schedule=exchange.schedule,
                      reduce=exchange.reduce, ps_servers=servers, ps_mode=exchange.ps_mode,
                      push_every=exchange.push_every, fetch_every=exchange.fetch_every,
                      group_size=exchange.group_size, global_every=exchange.global_every,
                      elastic_alpha=exchange.elastic_alpha, local_steps=exchange.local_steps,
                      push_average=exchange.push_average,
                      worker_lr_scale=exchange.worker_lr_scale, options=options,
                      codec=exchange.codec)
