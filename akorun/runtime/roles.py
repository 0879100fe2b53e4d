"""What differs between the kinds of rank, chosen once: a rank of a partitioned scheme
(ako), a ps worker, a ps server or any other training rank (all-reduce, diloco, ...).

A `Role` builds and holds this rank's scheme node and answers every question
whose answer depends on the scheme or the role: what to check and compile
before the join, whether the rank trains, whether it can go on without a lost
peer, what its /status carries, where its parameters start in the full vector,
and whether one signal stops it at once. What the rank can do to recover
(checkpoints, ``--resume``, rejoin snapshots, the relay, catch-up) is the
role's `recovery` (akorun.runtime.recovery.rank_recovery), chosen by what the scheme
and its node say they can do. The rest of the runtime asks the role and its
recovery instead of checking the scheme or the node's class.
(akorun.runtime.node_plan holds the config-level helpers these build on:
role_of, plan_node, make_node.)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from akocore.optim import FlatOptimizer
from akocore.schemes import PSLayout, Recoverable, SchemeNode
from akocore.settings.schema import RunConfig
from akocore.settings.toml_io import replace_in
from akocore.workloads.flat import FlatWorkload
from akorun.errors import RunError, UsageError
from akorun.runtime.node_plan import (
    NodePlan,
    make_node,
    plan_node,
    ps_server_count,
    role_of,
    scheme_of,
    training_workers,
)
from akorun.runtime.records.checkpoint_file import Checkpoint
from akorun.runtime.recovery.rank_recovery import RankRecovery, recovery_for

log = logging.getLogger("akorun")


class Role:
    """A rank that trains (ps worker, all-reduce worker); subclasses change what differs."""

    trains = True
    hard_stop_on_first_signal = False

    def __init__(self, cfg: RunConfig, rank: int) -> None:
        self.cfg = cfg
        self.rank = rank
        self.scheme = scheme_of(cfg)
        self.name = role_of(cfg, rank)  # "worker" | "ps", as results and metrics say
        self.training_workers = training_workers(cfg)
        self.plan: NodePlan | None = None
        self._node: SchemeNode | None = None
        # checkpoints, --resume, rejoin snapshots, relay, catch-up: what the scheme can do
        self.recovery: RankRecovery = recovery_for(rank, cfg.exchange.scheme,
                                                   self.scheme.rejoinable, self._built_node)

    # ---------------------------------------------------------------- before the join

    def check_config(self, workload: FlatWorkload) -> float | None:
        """UsageError if this config cannot run; the measured compute seconds if p needs them."""
        return None

    def warm_up_params(self, workload: FlatWorkload) -> np.ndarray:
        """Compile the gradient step and the evaluation; the parameters the node will hold."""
        batch = workload.batches(self.rank, self.training_workers).next()
        workload.grad_step(workload.init_params, batch.x, batch.y, 0)
        workload.evaluate(workload.init_params)
        return workload.init_params

    def can_continue_without(self, peer: int) -> bool:
        """Whether this rank's scheme can go on once `peer` is lost (suspended past the
        peer timeout and given up on): the scheme says whether a round needs every rank
        (a ring step of all-reduce, a ps server's shard); a lost rank then stops the run."""
        return not self.scheme.needs_every_rank

    # ---------------------------------------------------------------- the node

    @property
    def node(self) -> SchemeNode | None:
        return self._node

    def _built_node(self) -> SchemeNode | None:
        return self._node

    def build_node(self, workload: FlatWorkload, optimizer: FlatOptimizer, compute_s: float | None,
                   p_of: Sequence[int] | None = None) -> NodePlan:
        """Plan the exchange (p as peers or a checkpoint report it, if given) and build the node."""
        cfg = self.cfg
        if p_of is not None:
            cfg = replace_in(cfg, "exchange.p", list(p_of))
        try:
            plan = plan_node(cfg, gradient_bytes=workload.gradient_bytes,
                             length=workload.param_count, compute_s=compute_s)
        except ValueError as error:
            raise RunError(f"cannot plan the exchange: {error}") from None
        self.plan = plan
        node = make_node(plan.spec, self.rank, workload.param_count, workload.init_params,
                         optimizer)
        if cfg.train.rounds is not None:  # ako: the last s rounds end in step
            node.plan_rounds(cfg.train.rounds)
        self._node = node
        if plan.p_of is not None:
            detail = f"p = {list(plan.p_of)}"
            if compute_s is not None:
                detail += f" (auto, planned with compute {compute_s * 1e3:.2f} ms, bound by " \
                          f"{plan.bound_by[self.rank]})"
            log.info("%s", detail)
        return plan

    @property
    def p_of(self) -> tuple[int, ...] | None:
        return self.plan.p_of if self.plan is not None else None

    # ---------------------------------------------------------------- recovery

    def check_resume(self) -> None:
        """UsageError unless ``--resume`` can rejoin this run (the recovery says)."""
        self.recovery.check_resume()

    def donor(self) -> Recoverable:
        """The node that can give a rejoining peer a snapshot; ControlError 409 if none."""
        return self.recovery.donor()

    def rejoiner(self) -> Recoverable:
        """The node a ``--resume`` rejoins with (only a recoverable rank gets that far)."""
        return self.recovery.rejoiner()

    # ---------------------------------------------------------------- reports

    def checkpoint(self, common: dict[str, Any]) -> Checkpoint | None:
        """What a checkpoint of this rank holds now: what its recovery can restore."""
        return self.recovery.checkpoint(common)

    def status_extras(self, digest: bool) -> dict[str, Any]:
        """What /status adds for this rank: its recovery's record and digests."""
        return self.recovery.status_extras(digest)

    def params_offset(self) -> int:
        """Where this rank's parameters start in the full vector."""
        node = self._node
        return node.params_offset() if node is not None else 0


class PartitionedRole(Role):
    """A rank of a partitioned scheme (ako): plans p, from the measured compute unless
    exchange.p gives it."""

    def check_config(self, workload: FlatWorkload) -> float | None:
        if isinstance(self.cfg.exchange.p, tuple):
            try:
                plan_node(self.cfg, gradient_bytes=workload.gradient_bytes,
                          length=workload.param_count, compute_s=None)
            except ValueError as error:
                raise UsageError(str(error)) from None
            return None
        return workload.measure_compute_s(time.perf_counter)


class PSWorkerRole(Role):
    """A training worker of a parameter-server run."""

    def check_config(self, workload: FlatWorkload) -> float | None:
        ps_server_count(self.cfg)
        return None


class PSServerRole(PSWorkerRole):
    """A parameter server: holds one shard, does not train, stops at the first signal."""

    trains = False
    hard_stop_on_first_signal = True

    def warm_up_params(self, workload: FlatWorkload) -> np.ndarray:
        layout = PSLayout(self.training_workers, ps_server_count(self.cfg),
                          workload.param_count)
        start, stop = layout.shard_slice(layout.shard_of(self.rank))
        return workload.init_params[start:stop]


def role_for(cfg: RunConfig, rank: int) -> Role:
    """The one role object of `rank` in this config, chosen by what its scheme can do."""
    scheme = scheme_of(cfg)
    if scheme.has_servers:
        return PSServerRole(cfg, rank) if role_of(cfg, rank) == "ps" else PSWorkerRole(cfg, rank)
    if scheme.partitioned:
        return PartitionedRole(cfg, rank)
    return Role(cfg, rank)
