"""akorun's result files, built as akocore.records.results records.

- `worker_summary`: the summary fields of one rank (`RankSummary`: scheme, p,
  counts and the steady-state figures of its per-round series, what akosim
  reports under the same names);
- `RankDiagnostics`: akorun's per-rank diagnostics that the schema does not
  compare (a RankResult's `details`);
- `checked_rank_result`: a `RankResult` checked against the schema (a JSON
  round trip); `write_rank_result` writes it as ``OUT/worker-R.json``;
- `merge_results`: the run's `RunResult` (``OUT/result.json``): config echoed,
  the summary figures over the training workers, ``per_worker`` (every rank,
  in rank order) and the spread between the final replicas (`max_relative_difference`:
  inf when a replica holds NaN or Inf; `nonfinite_replicas` names those ranks);
- `write_json`: atomic JSON writing.

The keys, their units and meanings are akocore.records.results' (docs/reference/result-schema.md);
records cross module borders, never dicts keyed by result names.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from akocore.records.figures import steady_mean, steady_round_time_s, warmup_rounds
from akocore.records.results import RankResult, RunResult
from akocore.records.run_figures import merged_figures, rank_figures

__all__ = ["RankDiagnostics", "RankSummary", "checked_rank_result", "max_relative_difference",
           "merge_results", "nonfinite_replicas", "steady_mean", "steady_round_time_s",
           "warmup_rounds", "worker_summary", "write_json", "write_rank_result"]


@dataclass(frozen=True)
class RankSummary:
    """The summary fields of one rank's RankResult (the same names and types)."""

    scheme: str
    p: int
    p_of: tuple[int, ...]
    ssp: float
    workers: int
    training_workers: int
    batch_size: int
    round_time_s: float | None
    samples_per_s: float | None
    bytes_sent_per_worker_per_round: float | None
    compute_s_per_round: float | None
    wait_s_per_round: float | None
    overhead_s_per_round: float | None
    bytes_sent_rounds: float
    bytes_sent_flush: float | None

    def as_fields(self) -> dict[str, Any]:
        """Keyword arguments of RankResult."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def worker_summary(*, scheme: str, p_of: Sequence[int] | None, ssp: float, workers: int,
                   training_workers: int, batch_size: int, round_end_s: Sequence[float],
                   compute_s: Sequence[float], wait_s: Sequence[float],
                   bytes_sent: int, overhead_s: Sequence[float] | None = None,
                   bytes_flush: int | None = None, round_stride: int = 1,
                   rounds: int | None = None) -> RankSummary:
    """The summary fields of one rank.

    `bytes_sent`: bytes sent during the rounds (the flush excluded, as akosim);
    `bytes_flush`: the final flush's, reported apart; the series hold every
    `round_stride`-th of `rounds` rounds (akorun.runtime.records.round_times).
    """
    p_tuple = tuple(int(p) for p in p_of) if p_of else ()
    figures = rank_figures(round_end_s=round_end_s, compute_s=compute_s, wait_s=wait_s,
                           overhead_s=overhead_s, training_workers=training_workers,
                           batch_size=batch_size, bytes_sent_rounds=bytes_sent,
                           round_stride=round_stride, rounds=rounds)
    return RankSummary(
        scheme=scheme, p=max(p_tuple) if p_tuple else 1, p_of=p_tuple, ssp=float(ssp),
        workers=workers, training_workers=training_workers, batch_size=batch_size,
        **figures.as_fields(), bytes_sent_rounds=float(bytes_sent),
        bytes_sent_flush=float(bytes_flush) if bytes_flush is not None else None)


@dataclass(frozen=True)
class RankDiagnostics:
    """akorun's per-rank diagnostics, written beside the RankResult fields (its
    `details`): free-form, for reading one run, not compared between backends."""

    next_round: int  # the round the node would run next
    process_wall_s: float  # seconds since the process started
    send_block_s: float  # local step + encoding + waiting for queue room
    compute_s_measured: float | None  # gradient seconds measured in the warm-up
    warmup_s: float  # seconds of the warm-up compile
    retries: int  # sends retried, all peers
    duplicates_dropped: int  # partials received twice
    rejected: Mapping[str, int]  # incoming requests refused, by reason
    send_dropped: Mapping[str, Mapping[str, int]]  # per peer: sends given up, by reason
    undelivered: Mapping[str, int]  # per peer: messages still queued at the end
    final_loss: float | None
    params_sha256: str | None  # digest of the final parameters
    run_id: str
    config_hash: str
    peers: Mapping[str, Any]  # per peer counters (akorun.metrics)
    config: Mapping[str, Any]  # the configuration, as akocore.config.config_to_dict
    # partials of lost peers forwarded here by survivors (runtime.recovery.relay)
    relayed_in: int = 0
    relayed_out: int = 0  # ... forwarded by this rank to survivors
    relay_refused: int = 0  # forwarded partials refused (endorsement or wire check failed)
    relay_peak_bytes: int = 0  # most bytes of peers' values the relay held at once
    held_through: Mapping[str, int] = field(default_factory=dict)  # ako: per peer, the
    # round through which all its rounds are held (its delivery record's contiguous round)
    refused_for_good: Mapping[str, int] = field(default_factory=dict)  # per peer: messages
    # it refused with an authenticated final answer: never delivered, replicas not equal
    unauthentic_answers: int = 0  # answers without a tag bound to their request (retried)
    relay_disagreements: Mapping[str, str] = field(default_factory=dict)  # per lost rank:
    # survivors ended holding different sets of its rounds (one line each; the run failed)

    def as_details(self) -> dict[str, Any]:
        """The RankResult's `details`."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def checked_rank_result(record: RankResult) -> RankResult:
    """`record` as its JSON file holds it (plain JSON values), checked against the
    schema; RecordError names a key of the wrong type."""
    return RankResult.from_json(json.loads(json.dumps(record.to_json(), default=_default)))


def write_rank_result(path: str | Path, record: RankResult) -> RankResult:
    """Check `record` (`checked_rank_result`) and write it to `path`; the checked record."""
    checked = checked_rank_result(record)
    write_json(path, checked.to_json())
    return checked


def max_relative_difference(replicas: Sequence[np.ndarray]) -> float:
    """max_i ||x_i - x_0||_inf / max(||x_0||_inf, tiny) over the replicas given; inf when
    any replica holds a NaN or Inf (such replicas never count as equal) or the shapes
    differ."""
    arrays = [np.asarray(replica, dtype=np.float64) for replica in replicas]
    if not arrays:
        return 0.0
    reference = arrays[0]
    if any(a.shape != reference.shape or not bool(np.isfinite(a).all()) for a in arrays):
        return math.inf
    scale = max(float(np.max(np.abs(reference), initial=0.0)), 1e-30)
    worst = 0.0
    for other in arrays[1:]:
        worst = max(worst, float(np.max(np.abs(other - reference), initial=0.0)) / scale)
    return worst


def nonfinite_replicas(replicas: Mapping[int, np.ndarray]) -> str | None:
    """One line naming the ranks whose final parameters hold NaN or Inf, and how many
    of them; None when every replica is finite."""
    counts = {rank: int(np.size(replica) - np.count_nonzero(np.isfinite(replica)))
              for rank, replica in sorted(replicas.items())}
    bad = {rank: count for rank, count in counts.items() if count}
    if not bad:
        return None
    each = ", ".join(f"rank {rank}: {count} of {np.size(replicas[rank])} values"
                     for rank, count in bad.items())
    others = sorted(set(replicas) - set(bad))
    rest = (f"; rank(s) {', '.join(map(str, others))} finite: the replicas disagree"
            if others else "")
    return (f"the final parameters of rank(s) {', '.join(map(str, bad))} hold NaN or Inf "
            f"({each}){rest}; not a usable model (max_relative_difference inf)")


def merge_results(config: Mapping[str, Any], ranks: Sequence[RankResult],
                  replicas: Sequence[np.ndarray], *, batch_size: int,
                  run_id: str | None = None) -> RunResult:
    """The run's result from every rank's (training workers summarised)."""
    training = [r for r in ranks if r.role == "worker"]
    known = [r for r in ranks if not r.failed]
    first = training[0] if training else (known[0] if known else None)
    exchange = config.get("exchange", {}) if isinstance(config, Mapping) else {}
    cluster = config.get("cluster", {}) if isinstance(config, Mapping) else {}
    workers = first.workers if first is not None else int(cluster.get("workers", len(ranks)))
    return RunResult(
        tool="akorun", mode="train", config=dict(config), run_id=run_id,
        scheme=first.scheme if first is not None else str(exchange.get("scheme", "")),
        label=first.scheme if first is not None else "",
        p=first.p if first is not None else 1,
        p_of=first.p_of if first is not None else (),
        ssp=first.ssp if first is not None else 0.0,
        workers=workers, training_workers=len(training),
        ps_servers=sum(1 for r in ranks if r.role == "ps"), batch_size=batch_size,
        **merged_figures(training, batch_size).as_fields(),
        final_accuracy=training[0].final_accuracy if training else None,
        evaluations=training[0].evaluations if training else (),
        max_relative_difference=max_relative_difference(replicas),
        per_worker=tuple(ranks))


def write_json(path: str | Path, data: Mapping[str, Any]) -> Path:
    """Write JSON atomically (tmp + os.replace)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=1, default=_default) + "\n", encoding="utf-8")
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk leaves no temp file behind
        raise
    return target


def _default(value: Any) -> Any:
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, set | frozenset | tuple):
        return sorted(value) if isinstance(value, set | frozenset) else list(value)
    raise TypeError(f"cannot write {type(value).__name__} to JSON")
