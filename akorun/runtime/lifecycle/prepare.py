"""Before the event loop: the workload, the role's checks, the warm-up compile, a checkpoint.

`prepare` is synchronous and runs before any rank is contacted; user mistakes
raise UsageError. Its result, `Prepared`, is what the rest of the run needs
from it.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from akocore.optim import FlatOptimizer
from akocore.process_setup import enable_compilation_cache
from akocore.settings.schema import RunConfig
from akocore.workloads.flat import FlatWorkload, build_workload, workload_fingerprint
from akorun.errors import UsageError
from akorun.runtime.lifecycle import startup_phase
from akorun.runtime.lifecycle.startup_phase import StartupPhase
from akorun.runtime.node_plan import params_digest
from akorun.runtime.records.checkpoint_file import Checkpoint, checkpoint_exists, load_checkpoint
from akorun.runtime.roles import Role

log = logging.getLogger("akorun")


@dataclass(frozen=True)
class Prepared:
    """The workload (same seed on every rank) and what was measured and loaded with it."""

    workload: FlatWorkload
    params_sha256: str
    workload_identity: str  # "name fingerprint", compared in the join
    optimizer: FlatOptimizer  # built and compiled on the shape the node holds
    compute_measured_s: float | None  # this rank's gradient step, when p auto needs it
    warmup_s: float  # compiling before the join (not in any round)
    checkpoint: Checkpoint | None  # --resume: this rank's checkpoint, if there is one


def prepare(cfg: RunConfig, role: Role, *, run_id: str, config_hash: str, resume: bool,
            checkpoint_dir: Path | None, workload: FlatWorkload | None = None,
            phase: StartupPhase | None = None) -> Prepared:
    """The configured workload built (or `workload`, given ready: akorun.Exchange's) and
    what the rank needs with it; UsageError for a user mistake. Each step is said in
    `phase` (akorun.runtime.lifecycle.startup_phase) as it starts."""
    say = phase.say if phase is not None else (lambda words: None)
    say(startup_phase.LOADING)
    cache = os.environ.get("AKO_JAX_CACHE")
    if cache:
        enable_compilation_cache(cache)
    train = cfg.train
    try:
        if workload is None:
            workload = build_workload(train.workload, batch_size=train.batch_size,
                                      seed=train.seed, data_path=train.data_path)
    except ValueError as error:  # unknown workload or option, a broken factory, DataError
        raise UsageError(f"train.workload: {error}") from None
    for notice in workload.notices:  # e.g. bf16 parameters trained as float32
        log.warning(notice)
    params_sha256 = params_digest(workload.init_params)
    identity = f"{workload.name} {workload_fingerprint(workload)[:16]}"
    say(startup_phase.MEASURING)
    compute_measured_s = role.check_config(workload)
    say(startup_phase.COMPILING)
    optimizer, warmup_s = warm_up(cfg, role, workload)
    checkpoint = None
    if resume:
        say(startup_phase.READING_CHECKPOINT)
        role.check_resume()
        checkpoint = _resume_checkpoint(role.rank, run_id=run_id, config_hash=config_hash,
                                        directory=checkpoint_dir, workload=workload)
    return Prepared(workload, params_sha256, identity, optimizer, compute_measured_s, warmup_s,
                    checkpoint)


def warm_up(cfg: RunConfig, role: Role, workload: FlatWorkload) -> tuple[FlatOptimizer, float]:
    """Compile what the rounds run (gradient step, evaluation, optimizer) before the join.

    JAX compiles on first use; done here, before this rank answers any hello, the
    compilation is in no round, not in the duration clock and not in the first
    evaluation's time. A parameter server compiles only its optimizer (on its shard).
    Returns the optimizer and the seconds it took.
    """
    started_s = time.perf_counter()
    params = role.warm_up_params(workload)
    optimizer = workload.optimizer(cfg.train.optimizer, cfg.train.lr)
    # a pure apply (inputs untouched) on the shape the node will use
    optimizer.apply(params, optimizer.init(params), np.zeros_like(params))
    return optimizer, time.perf_counter() - started_s


def _resume_checkpoint(rank: int, *, run_id: str, config_hash: str,
                       directory: Path | None, workload: FlatWorkload) -> Checkpoint | None:
    """This rank's checkpoint (Orbax, or an older npz) in `directory`, None if there is none;
    UsageError if it is another run's or config's."""
    if directory is None or not checkpoint_exists(directory, rank):
        return None
    checkpoint = load_checkpoint(directory, rank,
                                 like=workload.unravel(np.asarray(workload.init_params)))
    if checkpoint.run_id != run_id:
        raise UsageError(f"{directory}: the checkpoint of rank {rank} is from run "
                         f"{checkpoint.run_id}, not this run {run_id}")
    if checkpoint.config_hash != config_hash:
        raise UsageError(f"{directory}: the checkpoint of rank {rank} was written with "
                         f"another config")
    return checkpoint
