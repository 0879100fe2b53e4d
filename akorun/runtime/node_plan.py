"""Which node a rank runs: role checks, p resolution and the one scheme node.

This module owns the step from a run config (plus, for ``p = "auto"``, the
measured compute times the ranks exchanged in their hello) to this rank's
akocore scheme node, laid out exactly as `akocore.schemes.build_nodes` lays
out a whole run (ps servers are the last ranks) but building only the one node
this process needs, so memory stays O(D) per process.

p auto: every rank measures its own gradient step (`measure_compute_s`) and
sends it in its hello; every rank then plans with the MAX of all measured
values. All ranks see the same values, so they choose the same p, and the
slowest worker's compute time is the honest one to overlap the network with.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from akocore.optim import FlatOptimizer
from akocore.resolve import resolve_plan, scheme_spec
from akocore.schemes import Scheme, SchemeNode, SchemeSpec, build_node, scheme_named
from akocore.schemes.registry import registered
from akocore.settings.schema import RunConfig
from akocore.settings.toml_io import config_hash
from akorun.errors import UsageError

ROLES = ("worker", "ps")


def ps_server_count(cfg: RunConfig) -> int:
    """Parameter-server ranks of a ps config; UsageError for "best" (akosim only)."""
    servers = cfg.exchange.ps_servers
    if not isinstance(servers, int):
        raise UsageError('exchange.ps_servers = "best" is for akosim; akorun needs a number '
                         "of servers, e.g. --set exchange.ps_servers=1")
    return servers


def role_of(cfg: RunConfig, rank: int) -> str:
    """"ps" for the parameter-server ranks of a ps config (the last ones), else "worker"."""
    if scheme_of(cfg).has_servers and rank >= cfg.cluster.workers - ps_server_count(cfg):
        return "ps"
    return "worker"


def check_role(cfg: RunConfig, rank: int, command: str) -> str:
    """UsageError unless `command` (worker | ps) is the role of `rank` in this config."""
    role = role_of(cfg, rank)
    if role == command:
        return role
    n = cfg.cluster.workers
    if command == "ps" and not scheme_of(cfg).has_servers:
        with_servers = " or ".join(f'exchange.scheme = "{name}"' for name, scheme
                                   in registered().items() if scheme.has_servers)
        raise UsageError(f"this config's scheme is {cfg.exchange.scheme!r}; the ps "
                         f"role exists only with {with_servers}")
    if command == "ps":
        first = n - ps_server_count(cfg)
        raise UsageError(f"rank {rank} is a training worker in this ps config (servers are "
                         f"ranks {first}..{n - 1}): run `akorun worker --rank {rank}`")
    raise UsageError(f"rank {rank} is a parameter server in this ps config: run "
                     f"`akorun ps --rank {rank}`")


def scheme_of(cfg: RunConfig) -> Scheme:
    """The scheme object of this config (akocore.schemes.registry)."""
    return scheme_named(cfg.exchange.scheme)


def training_workers(cfg: RunConfig) -> int:
    """Ranks that train: all but the servers of a scheme that has them."""
    if scheme_of(cfg).has_servers:
        return cfg.cluster.workers - ps_server_count(cfg)
    return cfg.cluster.workers


@dataclass(frozen=True)
class NodePlan:
    """This rank's exchange plan: p per worker (ako) and the scheme description."""

    spec: SchemeSpec
    p_of: tuple[int, ...] | None  # partitioned schemes (ako) only
    compute_s: float | None  # the value p auto planned with
    bound_by: tuple[str, ...] = ()


def plan_node(cfg: RunConfig, *, gradient_bytes: int, length: int,
              compute_s: float | None) -> NodePlan:
    """p (ako) and the SchemeSpec; ValueError if p does not fit the model."""
    scheme = scheme_of(cfg)
    servers = ps_server_count(cfg) if scheme.has_servers else None
    if not scheme.partitioned:
        return NodePlan(scheme_spec(cfg, ps_servers=servers), None, None)
    if cfg.exchange.p in ("auto", "auto-per-worker") and compute_s is None:
        raise ValueError("p auto needs the measured compute time")
    plan = resolve_plan(cfg, gradient_bytes=gradient_bytes, length=length,
                        compute_s=compute_s if compute_s is not None else 1.0)
    return NodePlan(scheme_spec(cfg, plan.p_of), tuple(plan.p_of), compute_s, plan.bound_by)


def make_node(spec: SchemeSpec, rank: int, length: int, params0: np.ndarray,
              optimizer: FlatOptimizer) -> SchemeNode:
    """Rank's node, as build_nodes(spec, ...)[rank] would build it (only its replica)."""
    return build_node(spec, rank, length, params0, optimizer)


def params_digest(params: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(params, dtype="<f4").tobytes()).hexdigest()


def wire_hash(cfg: RunConfig, params_sha256: str, p_of: Sequence[int] | None) -> bytes:
    """The 8 bytes every message carries: config, initial parameters and the resolved p."""
    text = json.dumps([config_hash(cfg), params_sha256, list(p_of) if p_of else None])
    return hashlib.sha256(text.encode("utf-8")).digest()[:8]
