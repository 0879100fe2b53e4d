"""Result files: one JSON per worker and the merged run result, keyed like akosim.

This module owns the numbers a run reports and their names. The summary keys
are named exactly as akosim names them so a prediction and a measurement
compare key by key: ``scheme``, ``p``, ``ssp``, ``workers``,
``round_time_s`` (mean steady-state wall seconds per round: the first 10% of
rounds are skipped), ``samples_per_s`` (training workers x batch size /
round_time_s), ``bytes_sent_per_worker_per_round``, ``compute_s_per_round``
(mean measured gradient-step seconds, steady state; akosim's
``--compute-from DIR/result.json`` reads ``workers[i].compute_s_per_round``),
``wait_s_per_round`` (mean seconds at the SSP gate, steady state) and
``overhead_s_per_round`` (mean seconds of a round outside the gradient step and
the gate: dispatch, inbox, optimizer, event loop; steady state, so
round_time_s = compute + wait + overhead; akosim's ``--compute-from`` reads it
as the round overhead). ``bytes_sent_per_worker_per_round`` counts the bytes
handed to the senders during the rounds, as akosim counts them: the final
flush (what ``node.finish`` owes) is ``bytes_sent_flush``, apart. ``p`` is the
p every worker resolved to (for ``p = "auto"``: what auto chose).

The merged ``result.json`` holds the config echoed, ``workers``: the list of
every rank's result (so ``workers[i].compute_s_per_round`` is rank i's
value; each entry carries the summary keys, ``workers`` there being the
count), the summary keys over the training workers at the top level (means;
samples_per_s from the mean round time; ``workers`` is the list, so the
count is repeated in ``summary``) and ``max_relative_difference`` between the
final replicas of the training workers.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

WARMUP_FRACTION = 0.1
SUMMARY_KEYS = ("scheme", "p", "ssp", "workers", "round_time_s", "samples_per_s",
                "bytes_sent_per_worker_per_round", "compute_s_per_round", "wait_s_per_round",
                "overhead_s_per_round")


def warmup_rounds(rounds: int, fraction: float = WARMUP_FRACTION) -> int:
    """Rounds skipped as warm-up: 10% (at least 1) when there are 4 or more."""
    return 0 if rounds < 4 else max(1, int(rounds * fraction))


def steady_round_time_s(round_end_s: Sequence[float]) -> float:
    """Mean seconds per round after the warm-up rounds; times since training start."""
    ends = np.asarray(round_end_s, dtype=float)
    if len(ends) == 0:
        return math.nan
    skip = warmup_rounds(len(ends))
    if skip == 0:
        return float(ends[-1] / len(ends))
    return float((ends[-1] - ends[skip - 1]) / (len(ends) - skip))


def steady_mean(per_round: Sequence[float]) -> float:
    values = np.asarray(per_round, dtype=float)
    if len(values) == 0:
        return math.nan
    return float(values[warmup_rounds(len(values)):].mean())


def _json_number(value: float | None) -> float | str | None:
    if value is None:
        return None
    if math.isnan(value):
        return None
    if math.isinf(value):
        return "inf"
    return value


def worker_summary(*, scheme: str, p_of: Sequence[int] | None, ssp: float, workers: int,
                   training_workers: int, batch_size: int, round_end_s: Sequence[float],
                   compute_s: Sequence[float], wait_s: Sequence[float],
                   bytes_sent: int, overhead_s: Sequence[float] | None = None,
                   bytes_flush: int | None = None) -> dict[str, Any]:
    """The akosim-compatible keys of one worker's result.

    `bytes_sent`: bytes sent during the rounds (the flush excluded, as akosim);
    `bytes_flush`: the final flush's, reported apart.
    """
    rounds = len(round_end_s)
    round_time_s = steady_round_time_s(round_end_s)
    samples = training_workers * batch_size / round_time_s if round_time_s > 0 else math.nan
    return {
        "scheme": scheme,
        "p": list(p_of) if p_of is not None else None,
        "ssp": "inf" if math.isinf(ssp) else int(ssp),
        "workers": workers,
        "round_time_s": _json_number(round_time_s),
        "samples_per_s": _json_number(samples),
        "bytes_sent_per_worker_per_round": bytes_sent / rounds if rounds else None,
        "compute_s_per_round": _json_number(steady_mean(compute_s)),
        "wait_s_per_round": _json_number(steady_mean(wait_s)),
        "overhead_s_per_round": _json_number(steady_mean(overhead_s))
        if overhead_s is not None else None,
        "bytes_sent_rounds": bytes_sent,
        "bytes_sent_flush": bytes_flush,
    }


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


def _mean(values: Sequence[Any]) -> float | None:
    numbers = [float(v) for v in values if isinstance(v, int | float) and math.isfinite(v)]
    return sum(numbers) / len(numbers) if numbers else None


def merge_results(config: dict[str, Any], worker_results: Sequence[dict[str, Any]],
                  replicas: Sequence[np.ndarray], *, batch_size: int) -> dict[str, Any]:
    """The run's result.json from the per-worker results (training workers summarised)."""
    training = [r for r in worker_results if r.get("role") == "worker"]
    first = training[0] if training else (worker_results[0] if worker_results else {})
    round_time = _mean([r.get("round_time_s") for r in training])
    summary: dict[str, Any] = {
        "scheme": first.get("scheme"),
        "p": first.get("p"),
        "ssp": first.get("ssp"),
        "workers": first.get("workers"),
        "round_time_s": round_time,
        "samples_per_s": (len(training) * batch_size / round_time) if round_time else None,
        "bytes_sent_per_worker_per_round": _mean(
            [r.get("bytes_sent_per_worker_per_round") for r in training]),
        "compute_s_per_round": _mean([r.get("compute_s_per_round") for r in training]),
        "wait_s_per_round": _mean([r.get("wait_s_per_round") for r in training]),
        "overhead_s_per_round": _mean([r.get("overhead_s_per_round") for r in training]),
    }
    return {
        "config": config,
        **summary,
        "workers": list(worker_results),
        "summary": summary,
        "training_workers": len(training),
        "final_accuracy": _mean([r.get("final_accuracy") for r in training]),
        "max_relative_difference": max_relative_difference(replicas),
    }


def write_json(path: str | Path, data: dict[str, Any]) -> Path:
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
