"""What differs between the kinds of rank, chosen once: an ako worker, a ps worker, a ps
server or an all-reduce worker.

A `Role` builds and holds this rank's scheme node and answers every question
whose answer depends on the scheme or the role: what to check and compile
before the join, whether the rank trains, whether it can rejoin or donate a
rejoin snapshot, what its checkpoint and /status carry, where its parameters
start in the full vector, and whether one signal stops it at once. The rest of
the runtime asks the role instead of checking the scheme. (akorun.runtime.node_plan holds
the config-level helpers these build on: role_of, plan_node, make_node.)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from akocore.config import RunConfig, replace_in
from akocore.optim import FlatOptimizer
from akocore.schemes import AkoWorker, PSLayout, PSServer, SchemeNode
from akocore.schemes.registry import registered
from akocore.workload import FlatWorkload
from akorun.errors import RunError, UsageError
from akorun.runtime.checkpoint_file import Checkpoint
from akorun.runtime.node_plan import (
    NodePlan,
    make_node,
    params_digest,
    plan_node,
    ps_server_count,
    role_of,
    scheme_of,
    training_workers,
)
from akorun.transport.control import ControlError

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

    def check_resume(self) -> None:
        raise UsageError(f"--resume rejoins {_rejoinable()} runs only; this run's scheme is "
                         f"{self.cfg.exchange.scheme!r}")

    # ---------------------------------------------------------------- the node

    @property
    def node(self) -> SchemeNode | None:
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
        self._set_node(node)
        if plan.p_of is not None:
            detail = f"p = {list(plan.p_of)}"
            if compute_s is not None:
                detail += f" (auto, planned with compute {compute_s * 1e3:.2f} ms, bound by " \
                          f"{plan.bound_by[self.rank]})"
            log.info("%s", detail)
        return plan

    def _set_node(self, node: SchemeNode) -> None:
        self._node = node

    @property
    def p_of(self) -> tuple[int, ...] | None:
        return self.plan.p_of if self.plan is not None else None

    # ---------------------------------------------------------------- rejoin

    def donor(self) -> AkoWorker:
        """The node that can give a rejoining peer a snapshot; ControlError 409 if none."""
        raise ControlError(409, f"rejoin exists for scheme {_rejoinable()} only")

    def rejoiner(self) -> AkoWorker:
        """The node a `--resume` rejoins with (only ako roles get that far)."""
        raise RunError(f"rank {self.rank} cannot rejoin: scheme {self.cfg.exchange.scheme}")

    # ---------------------------------------------------------------- reports

    def checkpoint(self, common: dict[str, Any]) -> Checkpoint | None:
        node = self._node
        if node is None or node.params is None:
            return None
        return Checkpoint(next_round=node.next_round, params=node.params.copy(), **common)

    def status_extras(self, digest: bool) -> dict[str, Any]:
        node = self._node
        if digest and node is not None and node.params is not None:
            return {"params_sha256": params_digest(node.params)}
        return {}

    def params_offset(self) -> int:
        """Where this rank's parameters start in the full vector."""
        return 0


class AkoRole(Role):
    """An ako worker: plans p, can rejoin (``--resume``) and donate rejoin snapshots."""

    def __init__(self, cfg: RunConfig, rank: int) -> None:
        super().__init__(cfg, rank)
        self._ako: AkoWorker | None = None

    def check_config(self, workload: FlatWorkload) -> float | None:
        if isinstance(self.cfg.exchange.p, tuple):
            try:
                plan_node(self.cfg, gradient_bytes=workload.gradient_bytes,
                          length=workload.param_count, compute_s=None)
            except ValueError as error:
                raise UsageError(str(error)) from None
            return None
        return workload.measure_compute_s(time.perf_counter)

    def check_resume(self) -> None:
        return None

    def _set_node(self, node: SchemeNode) -> None:
        assert isinstance(node, AkoWorker)
        self._ako = node
        super()._set_node(node)

    def donor(self) -> AkoWorker:
        if self._ako is None:
            raise ControlError(409, f"rejoin exists for scheme {_rejoinable()} only")
        return self._ako

    def rejoiner(self) -> AkoWorker:
        assert self._ako is not None, "the node is built before the rejoin uses it"
        return self._ako

    def checkpoint(self, common: dict[str, Any]) -> Checkpoint | None:
        node = self._ako
        if node is None or node.params is None:
            return None
        state = node.state()
        assert state.params is not None
        return Checkpoint(next_round=state.next_round, params=state.params,
                          unsent=state.unsent, inbox=state.inbox, log=state.log,
                          final_round=state.final_round, **common)

    def status_extras(self, digest: bool) -> dict[str, Any]:
        node = self._ako
        if node is None:
            return {}
        extras: dict[str, Any] = {
            "contiguous": {str(j): int(node.log.contiguous[j]) for j in node.peers}}
        if digest and node.params is not None:
            extras["params_sha256"] = params_digest(node.params)
            if node.inbox is not None:
                extras["inbox_sha256"] = params_digest(node.inbox)
                extras["unsent_sha256"] = params_digest(node.unsent) \
                    if node.unsent is not None else None
        return extras


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

    def __init__(self, cfg: RunConfig, rank: int) -> None:
        super().__init__(cfg, rank)
        self._server: PSServer | None = None

    def _set_node(self, node: SchemeNode) -> None:
        assert isinstance(node, PSServer)
        self._server = node
        super()._set_node(node)

    def params_offset(self) -> int:
        return self._server.start if self._server is not None else 0


def _rejoinable() -> str:
    return " or ".join(name for name, scheme in registered().items() if scheme.rejoinable)


def role_for(cfg: RunConfig, rank: int) -> Role:
    """The one role object of `rank` in this config, chosen by what its scheme can do."""
    scheme = scheme_of(cfg)
    if scheme.has_servers:
        return PSServerRole(cfg, rank) if role_of(cfg, rank) == "ps" else PSWorkerRole(cfg, rank)
    if scheme.partitioned and scheme.rejoinable:
        return AkoRole(cfg, rank)
    return Role(cfg, rank)
