"""The round loop of a training rank, with its evaluation and checkpoint triggers.

Following the driving loop of akocore.schemes:

    t = first round
    while the run goes on:                 # rounds, duration, accuracy, signal; the
                                           # training ranks agree on the last round
        wait until node.may_start(t)       # the SSP gate (Waiter.gate)
        grad = JAX step on a COPY of the params   # in a thread: the loop keeps serving
        deliver node.local_step(t, grad)   # encoded once, queued to every peer
        t += 1

`RoundTimes` (akorun.runtime.records.round_times) records each round's wall, compute, gate-wait
and overhead seconds, in series bounded however long the run.

The user's own NaN: a step whose loss or gradient is not finite
(akocore.workloads.nonfinite, checked on the host values the step returns) is not sent;
the loop stops there (a hard stop: no wait is for the peers, which are told
to stop too) with `nonfinite` holding the one line naming the round, the
batch and the local loss; the finish raises it (RunError, exit 1).

Catching up (a recoverable node, ako's): a rank that comes back from a pause
or a cut to find every peer in its gate far past it (by more than the
staleness bound) would hold them all back while it computes the rounds it
missed. It skips to the slowest peer's next round instead (the role's
recovery says which, akorun.runtime.recovery.rank_recovery): the rounds between pass
without a gradient, told to the peers in one folded message with no values
(ako: `AkoWorker.skip_rounds`; what it has not sent stays owed, so every
gradient still reaches every peer once). Skipped rounds count as rounds with no
compute in `RoundTimes`, and in `rounds_skipped`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import numpy as np

from akocore.records.figures import step_seed
from akocore.schemes import SchemeNode
from akocore.workloads.nonfinite import nonfinite_line, step_problem
from akorun.runtime.fault_hooks import FaultHooks
from akorun.runtime.lifecycle.evaluation import Evaluator
from akorun.runtime.lifecycle.prepare import Prepared
from akorun.runtime.lifecycle.stopping import StopAgreement
from akorun.runtime.liveness.waiting import Waiter
from akorun.runtime.outbox import Outbox
from akorun.runtime.rank_context import RankContext
from akorun.runtime.records.checkpoints import CheckpointWriter
from akorun.runtime.records.round_times import RoundTimes
from akorun.runtime.recovery.rank_recovery import RankRecovery

log = logging.getLogger("akorun")


class TrainingLoop:
    """The rounds of one training rank."""

    def __init__(self, context: RankContext, *, prepared: Prepared, outbox: Outbox,
                 waiter: Waiter, faults: FaultHooks, evaluator: Evaluator,
                 checkpoints: CheckpointWriter, agreement: StopAgreement | None = None,
                 after_gate: Callable[[], Awaitable[None]] | None = None) -> None:
        self.cfg = context.cfg
        self.rank = context.rank
        self.training_workers = context.role.training_workers
        self.workload = prepared.workload
        self.metrics = context.metrics
        self.outbox = outbox
        self.waiter = waiter
        self.faults = faults
        self.evaluator = evaluator
        self.checkpoints = checkpoints
        self.checkpoint_every = context.checkpoint_every
        # catch-up: the round to skip to, and the skip
        self.recovery: RankRecovery = context.role.recovery
        self.times = RoundTimes()
        self.first_round = 0  # a rejoin continues from a later round
        self.rounds_done = 0
        self.train_start_s: float | None = None
        # training seconds of the processes before (--resume): --duration counts the run's
        self.trained_before_s = prepared.checkpoint.trained_s \
            if prepared.checkpoint is not None else 0.0
        self.agreement = agreement  # the training ranks' last round
        self.rounds_skipped = 0  # rounds passed without a gradient to catch up (ako)
        self.nonfinite: str | None = None  # the user's loss or gradient went NaN/Inf: the line
        self.busy_from_s: float | None = None  # loop time this rank's own work began (busy_s)
        # after the gate let a round start: diloco's anchor re-sync (runtime.recovery.anchor_sync)
        self.after_gate = after_gate

    def busy_s(self) -> float | None:
        """Seconds this rank has been in its own work for the current round; None while
        it waits on others (or has no round under way)."""
        if self.busy_from_s is None:
            return None
        return asyncio.get_running_loop().time() - self.busy_from_s

    async def _stops_before(self, t: int) -> bool:
        """Whether round t is not to start: no stop; or a stop the training ranks agreed
        on (runtime.lifecycle.stopping) that ends the run before round t."""
        if not self.should_stop(t):
            return False
        agreement, waiter = self.agreement, self.waiter
        if agreement is None or waiter.hard_stop or waiter.stop_reason == "lost_peer" \
                or (waiter.stop_reason == "rounds" and not agreement.frozen):
            return True
        agreement.freeze(str(waiter.stop_reason))
        last = await agreement.last_round()
        return last is None or t >= last or self.at_limit(t)

    def _catch_up(self, t: int) -> int:
        """The round to skip to before round t (the recovery's `catch_up_round`), never
        past the rounds limit nor an agreed stop."""
        target = self.recovery.catch_up_round(t)
        if target <= t:
            return t
        rounds = self.cfg.train.rounds
        if rounds is not None:
            target = min(target, rounds)
        if self.agreement is not None and self.agreement.frozen:
            return t
        return max(t, target)

    def at_limit(self, t: int) -> bool:
        rounds = self.cfg.train.rounds
        return rounds is not None and t >= rounds

    def should_stop(self, t: int) -> bool:
        train = self.cfg.train
        waiter = self.waiter
        if waiter.stop_reason is not None:
            return True
        if train.rounds is not None and t >= train.rounds:
            waiter.stop_reason = "rounds"
            return True
        if train.duration_s is not None and self.train_start_s is not None:
            if self.trained_s() >= train.duration_s:
                waiter.stop_reason = "duration"
                return True
        return False

    def trained_s(self) -> float:
        """The run's training seconds so far: this process's, plus those of the processes
        before it (its checkpoint's, at --resume), so --duration spans resumes."""
        if self.train_start_s is None:
            return self.trained_before_s
        return self.trained_before_s + asyncio.get_running_loop().time() - self.train_start_s

    def _deadline_s(self) -> float | None:
        duration_s = self.cfg.train.duration_s
        if duration_s is None or self.train_start_s is None:
            return None
        return self.train_start_s + duration_s - self.trained_before_s

    async def train(self, node: SchemeNode) -> None:
        workload = self.workload
        metrics = self.metrics
        loop = asyncio.get_running_loop()
        t = node.next_round
        batches = workload.batches(self.rank, self.training_workers)
        batches.skip(t)
        self.train_start_s = loop.time()
        eval_every = self.cfg.train.eval_every
        agreement = self.agreement
        while not await self._stops_before(t):
            frozen = agreement is not None and agreement.frozen
            self.busy_from_s = loop.time()
            await self.faults.before_round(t)
            self.busy_from_s = None
            waited_s = await self.waiter.gate(node, t, None if frozen else self._deadline_s(),
                                              ignore_stop=frozen)
            if waited_s is None:
                if agreement is not None and not frozen and not self.waiter.hard_stop:
                    continue  # stopped while waiting: agree on the last round first
                break
            if self.after_gate is not None:
                await self.after_gate()
            skip_to = self._catch_up(t)
            if skip_to > t:  # far behind every peer (paused, cut off): skip to them
                await self.outbox.dispatch(self.recovery.skip_rounds(skip_to))
                log.warning("catching up: rounds %d..%d pass without a gradient (every peer "
                            "is past them); told the peers in one message", t, skip_to - 1)
                now_s = loop.time() - self.train_start_s
                for _ in range(t, skip_to):
                    self.times.add(now_s, 0.0, waited_s)
                    waited_s = 0.0
                self.rounds_skipped += skip_to - t
                t = skip_to
                metrics.round = t
                if agreement is not None:
                    agreement.started = t
                continue
            if agreement is not None:
                agreement.started = t + 1  # before any await: a freeze counts this round
            self.busy_from_s = loop.time()
            batch = batches.next()
            params = np.array(node.params, copy=True)
            compute_start_s = time.perf_counter()
            loss, grad = await asyncio.to_thread(workload.grad_step, params, batch.x, batch.y,
                                                 step_seed(self.cfg.train.seed, self.rank, t))
            compute_s = time.perf_counter() - compute_start_s
            problem = step_problem(loss, grad)  # host values already: no device sync
            if problem is not None:  # nothing non-finite leaves this rank
                self.nonfinite = nonfinite_line(who=f"rank {self.rank}", round_=t, batch=batch,
                                                loss=loss, problem=problem)
                log.error("%s", self.nonfinite)
                self.waiter.stop_reason = self.nonfinite  # the record's stop_reason
                self.waiter.stop_now()  # every peer is told to stop: no wait is for them
                self.busy_from_s = None
                break
            grad = self.faults.outgoing_gradient(t, grad)  # a test hook; grad by default
            send_start_s = loop.time()
            await self.outbox.dispatch(self.faults.outgoing(t, node.local_step(t, grad)))
            metrics.send_block_s += loop.time() - send_start_s
            self.busy_from_s = None
            t += 1
            self.times.add(loop.time() - self.train_start_s, compute_s, waited_s)
            metrics.round = t
            metrics.loss = loss
            metrics.compute_s += compute_s
            metrics.wait_s += waited_s
            await self.faults.after_round(t - 1)
            if t % eval_every == 0 and node.params is not None:
                self.evaluator.start(node.params, t, self.times.last_end_s)
            if self.checkpoint_every and t % self.checkpoint_every == 0:
                await self.checkpoints.write(before_replace=self.faults.mid_checkpoint(t - 1))
        self.rounds_done = t
        if agreement is not None:
            agreement.finished = True
