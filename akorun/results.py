"""akorun's result files, built as akocore.results records.

- `worker_summary`: the steady-state summary fields of one rank, from its
  per-round series (what akosim reports under the same names);
- `rank_result`: the builder that turns the worker's result fields (summary,
  per-round series and diagnostics) into a validated `RankResult`;
  `write_rank_result` writes it as ``OUT/worker-R.json``;
- `merge_results`: the run's `RunResult` (``OUT/result.json``): config echoed,
  the summary figures over the training workers, ``per_worker`` (every rank,
  in rank order) and the spread between the final replicas;
- `write_json`: atomic JSON writing.

The keys, their units and meanings are akocore.results' (docs/result-schema.md).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from akocore.figures import steady_mean, steady_round_time_s, warmup_rounds
from akocore.results import SCHEMA_VERSION, RankResult, RunResult, merged_figures, rank_figures

__all__ = ["max_relative_difference", "merge_results", "rank_result", "steady_mean",
           "steady_round_time_s", "warmup_rounds", "worker_summary", "write_json",
           "write_rank_result"]


def worker_summary(*, scheme: str, p_of: Sequence[int] | None, ssp: float, workers: int,
                   training_workers: int, batch_size: int, round_end_s: Sequence[float],
                   compute_s: Sequence[float], wait_s: Sequence[float],
                   bytes_sent: int, overhead_s: Sequence[float] | None = None,
                   bytes_flush: int | None = None) -> dict[str, Any]:
    """The summary fields of one rank's RankResult, JSON-ready (`rank_result`'s input).

    `bytes_sent`: bytes sent during the rounds (the flush excluded, as akosim);
    `bytes_flush`: the final flush's, reported apart.
    """
    p_list = [int(p) for p in p_of] if p_of else []
    return {
        "scheme": scheme,
        "p": max(p_list) if p_list else 1,
        "p_of": p_list,
        "ssp": "inf" if math.isinf(ssp) else int(ssp),
        "workers": workers,
        "training_workers": training_workers,
        "batch_size": batch_size,
        **rank_figures(round_end_s=round_end_s, compute_s=compute_s, wait_s=wait_s,
                       overhead_s=overhead_s, training_workers=training_workers,
                       batch_size=batch_size, bytes_sent_rounds=bytes_sent),
        "bytes_sent_rounds": bytes_sent,
        "bytes_sent_flush": bytes_flush,
    }


def rank_result(fields: Mapping[str, Any]) -> RankResult:
    """The worker's result fields as a validated RankResult (keys that are no field of
    the record are kept as its `details`); RecordError naming a bad key."""
    plain = json.loads(json.dumps(dict(fields), default=_default))
    return RankResult.from_json({"schema_version": SCHEMA_VERSION, "kind": "rank", **plain})


def write_rank_result(path: str | Path, fields: Mapping[str, Any]) -> RankResult:
    """Build the rank's record from the worker's fields and write it to `path`."""
    record = rank_result(fields)
    write_json(path, record.to_json())
    return record


def max_relative_difference(replicas: Sequence[np.ndarray]) -> float:
    """max_i ||x_i - x_0||_inf / max(||x_0||_inf, tiny) over the replicas given."""
    if len(replicas) < 2:
        return 0.0
    reference = np.asarray(replicas[0], dtype=np.float64)
    scale = max(float(np.max(np.abs(reference))), 1e-30)
    worst = 0.0
    for other in replicas[1:]:
        other = np.asarray(other, dtype=np.float64)
        if other.shape != reference.shape:
            return math.inf
        worst = max(worst, float(np.max(np.abs(other - reference))) / scale)
    return worst


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
        **merged_figures(training, batch_size),
        final_accuracy=training[0].final_accuracy if training else None,
        evaluations=training[0].evaluations if training else (),
        max_relative_difference=max_relative_difference(replicas),
        per_worker=tuple(ranks))


def write_json(path: str | Path, data: Mapping[str, Any]) -> Path:
    """Write JSON atomically (tmp + os.replace)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=_default) + "\n", encoding="utf-8")
    os.replace(tmp, target)
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
