"""This rank's result record (``worker-R.json``) and final parameters (``worker-R.npz``).

`ResultBuilder.result` gathers what the run measured from the collaborators
that measured it into a `RankResult` (akocore.records.results; the summary fields from
akorun.runtime.records.result_files.worker_summary, the diagnostics the schema does not compare as
akorun.runtime.records.result_files.RankDiagnostics); `summary_line` is the one human line a
rank prints at its end.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import resource
import time

import numpy as np

from akocore.records.results import RankResult
from akocore.settings.toml_io import config_to_dict
from akorun.runtime.lifecycle.evaluation import Evaluator
from akorun.runtime.lifecycle.prepare import Prepared
from akorun.runtime.lifecycle.training import TrainingLoop
from akorun.runtime.liveness.waiting import Waiter
from akorun.runtime.node_plan import params_digest
from akorun.runtime.outbox import Outbox
from akorun.runtime.rank_context import RankContext
from akorun.runtime.records.result_files import (
    RankDiagnostics,
    checked_rank_result,
    worker_summary,
    write_rank_result,
)
from akorun.runtime.recovery.relay import Relay

log = logging.getLogger("akorun")


class ResultBuilder:
    """The result of one rank, built at the end from its collaborators."""

    def __init__(self, context: RankContext, *, prepared: Prepared, training: TrainingLoop,
                 outbox: Outbox, evaluator: Evaluator, waiter: Waiter,
                 relay: Relay | None = None) -> None:
        role = context.role
        self.role = role
        self.cfg = role.cfg
        self.rank = role.rank
        self.world = role.cfg.cluster.workers
        self.training_workers = role.training_workers
        self.prepared = prepared
        self.metrics = context.metrics
        self.training = training
        self.outbox = outbox
        self.evaluator = evaluator
        self.waiter = waiter
        self.run_id = context.run_id
        self.config_hash = context.config_hash
        self.out_dir = out_dir = context.out_dir
        self.wall_start_s = context.wall_start_s
        self.relay = relay
        self.last: RankResult | None = None  # what `write` built last
        if out_dir is not None:  # temp files of a killed earlier start of this rank
            for stale in (*out_dir.glob(f".worker-{self.rank}.json.*.tmp"),
                          *out_dir.glob(f".worker-{self.rank}.npz.tmp")):
                stale.unlink(missing_ok=True)

    def result(self) -> RankResult:
        node = self.role.node
        plan = self.role.plan
        metrics = self.metrics
        times = self.training.times
        train_start_s = self.training.train_start_s
        p_of = plan.p_of if plan is not None else None
        loop_now = asyncio.get_running_loop().time()
        summary = worker_summary(
            scheme=self.cfg.exchange.scheme, p_of=p_of, ssp=self.cfg.exchange.ssp,
            workers=self.world, training_workers=self.training_workers,
            batch_size=self.prepared.workload.examples_per_step, round_end_s=times.end_s,
            compute_s=times.compute_s, wait_s=times.wait_s, overhead_s=times.overhead_s,
            bytes_sent=self.outbox.bytes_queued_rounds,
            bytes_flush=self.outbox.bytes_queued_flush, round_stride=times.stride,
            rounds=times.rounds)
        diagnostics = RankDiagnostics(
            next_round=node.next_round if node is not None else 0,
            process_wall_s=time.perf_counter() - self.wall_start_s,
            send_block_s=metrics.send_block_s,
            compute_s_measured=self.prepared.compute_measured_s,
            warmup_s=self.prepared.warmup_s,
            retries=metrics.retries,
            duplicates_dropped=metrics.duplicates_dropped,
            rejected=dict(metrics.rejected),
            send_dropped={str(j): dict(c.send_dropped) for j, c in metrics.peers.items()
                          if c.send_dropped},
            undelivered={str(j): depth for j, depth in self.outbox.depths().items() if depth},
            final_loss=metrics.loss,
            params_sha256=params_digest(node.params)
            if node is not None and node.params is not None else None,
            run_id=self.run_id,
            config_hash=self.config_hash,
            peers=metrics.peers_as_dict(),
            config=config_to_dict(self.cfg),
            relayed_in=self.relay.received if self.relay is not None else 0,
            relayed_out=self.relay.served if self.relay is not None else 0,
            relay_refused=self.relay.refused if self.relay is not None else 0,
            relay_peak_bytes=self.relay.store.peak_bytes if self.relay is not None else 0,
            held_through=self.role.recovery.held_through(),
            refused_for_good={str(j): n for j, n in metrics.refused_for_good.items()},
            unauthentic_answers=sum(c.unauthentic_answers for c in metrics.peers.values()),
            relay_disagreements={str(origin): line for origin, line in
                                 self.relay.disagreements.items()} if self.relay else {})
        return RankResult(
            rank=self.rank,
            role=self.role.name,
            **summary.as_fields(),
            rounds=times.rounds,
            compute_s=metrics.compute_s,
            wait_s=metrics.wait_s,
            bytes_sent=metrics.bytes_sent,
            bytes_received=metrics.bytes_received,
            message_overhead_s=metrics.message_overhead_s(),
            message_software_s=metrics.message_software_s(),
            round_end_s=tuple(times.end_s),
            round_compute_s=tuple(times.compute_s),
            round_wait_s=tuple(times.wait_s),
            round_overhead_s=tuple(times.overhead_s),
            round_stride=times.stride,
            evaluations=tuple(metrics.evaluations),
            final_accuracy=self.evaluator.final_accuracy,
            stop_reason=self.waiter.stop_reason,
            first_round=self.training.first_round,
            wall_s=(loop_now - train_start_s) if train_start_s is not None else 0.0,
            p_auto_compute_s=plan.compute_s if plan is not None else None,
            peer_timeouts=metrics.peer_timeouts,
            suspended_at_end=tuple(sorted(node.suspended)) if node is not None else (),
            peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            model_bytes=self.prepared.workload.gradient_bytes,
            details=diagnostics.as_details())

    def write_unjoined(self) -> None:
        """Stopped before the join ended: the result says so (no round); a failed write
        is one log line (the stop is what the user asked for)."""
        try:
            self.write()
        except OSError as error:
            log.error("%s: results not written: %s", self.out_dir, error.strerror or error)

    def write(self) -> None:
        """Build the result, check it against the schema and write the files."""
        out = self.out_dir
        node = self.role.node
        record = self.result()
        if out is None:
            self.last = checked_rank_result(record)
            return
        out.mkdir(parents=True, exist_ok=True)
        self.last = write_rank_result(out / f"worker-{self.rank}.json", record)
        if node is not None and node.params is not None:  # none before the join
            offset = self.role.params_offset()
            tmp = out / f".worker-{self.rank}.npz.tmp"
            try:
                with open(tmp, "wb") as handle:
                    np.savez(handle, params=np.asarray(node.params, dtype=np.float32),
                             offset=np.array(offset))
                os.replace(tmp, out / f"worker-{self.rank}.npz")
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise


def summary_line(result: RankResult) -> str:
    """One human line for the end of a run."""
    round_time = result.round_time_s
    parts = [f"rank {result.rank} ({result.role})", f"{result.rounds} rounds"]
    if round_time is not None and math.isfinite(round_time):
        parts.append(f"{round_time * 1e3:.2f} ms/round")
    if result.final_accuracy is not None:
        parts.append(f"accuracy {result.final_accuracy:.4f}")
    parts.append(f"sent {result.bytes_sent / 1e6:.2f} MB")
    return ", ".join(parts)
