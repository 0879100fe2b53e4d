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
from akocore.partition import PartitionError, check_p
from akocore.planner import Plan, PlanInputs, plan
from akocore.schemes import SchemeSpec, scheme_named
from akocore.schemes.registry import wire_codec
from akocore.settings.schema import RunConfig


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
    return gradient_bytes * codec_named(wire_codec(cfg.exchange)).ratio(length)


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
    """The nodes' description of `cfg`: the shared keys, the scheme's settings object
    (`SchemeSpec.settings`), and each key the scheme reads (`Scheme.keys`) as the
    SchemeSpec field of its name or else in `SchemeSpec.options`; nothing here names a
    scheme's knob."""
    exchange = cfg.exchange
    scheme = scheme_named(exchange.scheme)
    spec_fields = {item.name for item in fields(SchemeSpec)}
    read = {name: getattr(exchange, name) for name in scheme.keys}
    servers = ps_servers if ps_servers is not None else (
        exchange.ps_servers if isinstance(exchange.ps_servers, int) else 1)
    given = {name: value for name, value in read.items() if name in spec_fields}
    given.update(schedule=exchange.schedule, ps_servers=servers)
    return SchemeSpec(scheme=exchange.scheme, workers=cfg.cluster.workers, p_of=p_of,
                      staleness=exchange.ssp, reduce=exchange.reduce, codec=exchange.codec,
                      settings=exchange.knobs(scheme.settings) if scheme.settings else None,
                      options=tuple((name, value) for name, value in read.items()
                                    if name not in spec_fields),
                      **given)
