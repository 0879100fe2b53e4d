"""Result files -> one `Record` per configuration and backend, and its figures of merit.

`load_records(results)` reads RESULTS/<backend>/<network>/<n>w-<scheme>/result.json
(written by analysis.run, read through akocore.records.results) into `Record`s: the
few figures the report compares, and the accuracy curve on a time axis.

Time axes. akosim: simulated seconds. akorun: wall seconds since training
start (akorun compiles before its start barrier, so no round holds JAX
compilation; results written before that change did, so the first
WARMUP_ROUNDS rounds are still counted at the steady round time when they were
slower), cut at the budget; an evaluation is placed at the end of the round it
evaluated (akorun evaluates off the training path; its records carry that
round's end too). `accuracy_at`, `time_to` and `ttt` read a curve.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from akocore.records.figures import mean_of_known
from akocore.records.result_reader import read_result
from akocore.records.results import PlanResult, RunResult
from akocore.records.run_figures import rank_overhead_s
from akocore.schemes.registry import has_servers
from analysis.matrix import SCALING, TARGET_ACCURACY, Experiment, all_experiments

BACKENDS = ("akosim", "akorun", "akosim-calibrated", "akosim-fullsize")
TRAINING_BACKENDS = ("akosim", "akorun")  # akosim-calibrated is timing only
WARMUP_ROUNDS = 3


@dataclass
class Record:
    """One configuration run by one backend."""

    backend: str
    config: str
    network: str
    workers: int
    scheme: str
    round_time_s: float | None
    bytes_per_round: float | None
    compute_s: float | None  # mean over training workers
    p_of: list[int] | None
    curve: list[tuple[float, int, float]] = field(default_factory=list)  # (t, round, acc)
    final_accuracy: float | None = None
    rounds: int | None = None
    partial: bool = False  # run with a --rounds override (CI subset): not the budget
    overhead_s: float | None = None  # akorun: mean per-round time outside gradient and gate
    message_overhead_s: float | None = None  # akorun: mean time a message costs past the wire


def _num(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _akosim_record(backend: str, exp: Experiment, plan: PlanResult) -> Record:
    run = plan.runs[0]
    curve = [(float(t), int(round_), float(acc)) for t, round_, acc in run.evaluations]
    training = plan.compute_s[:run.training_workers]
    return Record(backend, exp.id, exp.network.name, exp.workers, exp.scheme,
                  _num(run.round_time_s), _num(run.bytes_sent_per_worker_per_round),
                  sum(training) / len(training) if training else None,
                  list(run.p_of) or None, curve, _num(run.final_accuracy),
                  max((w.rounds for w in run.per_worker), default=None))


def akorun_time_axis(round_end_s: Sequence[float], round_time_s: float | None) -> list[float]:
    """End of each round, with the warm-up rounds counted at the steady round time."""
    ends = [float(x) for x in round_end_s]
    if not ends:
        return []
    w = min(WARMUP_ROUNDS, len(ends))
    steady = round_time_s if round_time_s else ends[-1] / len(ends)
    offset = max(ends[w - 1] - w * steady, 0.0)
    return [t - offset for t in ends]


def _akorun_record(exp: Experiment, run: RunResult) -> Record:
    ranks = run.training_ranks
    curve: list[tuple[float, int, float]] = []
    rounds = None
    if ranks:
        first = ranks[0]
        stride = first.round_stride  # a long run's series holds every stride-th round
        steady = _num(first.round_time_s)
        axis = akorun_time_axis(first.round_end_s, steady * stride if steady else None)
        rounds = len(axis) * stride
        for _, round_, accuracy in first.evaluations:
            if 1 <= round_ <= rounds:
                entry = min(len(axis), max(1, round(round_ / stride)))
                curve.append((axis[entry - 1], int(round_), float(accuracy)))
        curve.sort()
    return Record("akorun", exp.id, exp.network.name, exp.workers, exp.scheme,
                  _num(run.round_time_s), _num(run.bytes_sent_per_worker_per_round),
                  _num(run.compute_s_per_round), list(run.p_of) or None,
                  curve, _num(ranks[0].final_accuracy) if ranks else None, rounds,
                  overhead_s=rank_overhead_s(run),
                  message_overhead_s=mean_of_known([w.message_overhead_s
                                                    for w in run.per_worker]))


def p_text(record: Record | None) -> str:
    """The distinct p values of an ako run, e.g. "4" or "2,4"; "-" otherwise."""
    if record is None or not record.p_of or has_servers(record.scheme):
        return "-"
    return ",".join(str(v) for v in sorted(set(record.p_of)))


def load_records(results: Path) -> dict[tuple[str, str], Record]:
    records: dict[tuple[str, str], Record] = {}
    for exp in all_experiments():
        for backend in BACKENDS:
            folder = results / backend / exp.network.name / f"{exp.workers}w-{exp.scheme}"
            path = folder / "result.json"
            if not path.exists() or not (folder / "done.json").exists():
                continue
            result = read_result(json.loads(path.read_text()))
            done = json.loads((folder / "done.json").read_text())
            if backend == "akorun" and isinstance(result, RunResult):
                record = _akorun_record(exp, result)
            elif backend != "akorun" and isinstance(result, PlanResult):
                record = _akosim_record(backend, exp, result)
            else:
                raise ValueError(f"{path}: a {type(result).__name__} is not what {backend} "
                                 f"writes")
            record.partial = done.get("rounds_override") is not None
            records[(backend, exp.id)] = record
    return records

def accuracy_at(curve: Sequence[tuple[float, int, float]], budget_s: float) -> float | None:
    """The last evaluated accuracy at or before the budget."""
    before = [acc for t, _, acc in curve if t <= budget_s + 1e-9]
    return before[-1] if before else None


def time_to(curve: Sequence[tuple[float, int, float]], target: float,
            budget_s: float | None = None) -> tuple[float, int] | None:
    """(time, round) of the first evaluation at or above target (within the budget)."""
    for t, round_, acc in curve:
        if budget_s is not None and t > budget_s + 1e-9:
            return None
        if acc >= target:
            return t, round_
    return None

def ttt(records: dict[tuple[str, str], Record], backend: str, config: str) -> float | None:
    record = records.get((backend, config))
    if record is None:
        return None
    hit = time_to(record.curve, TARGET_ACCURACY, SCALING.budget_s)
    return hit[0] if hit else None


def missing_runs(records: dict[tuple[str, str], Record],
                 experiments: Sequence[Experiment] | None = None) -> dict[str, int]:
    """Per backend, how many of `experiments` (default: the whole matrix) have no record."""
    chosen = all_experiments() if experiments is None else experiments
    return {b: sum(1 for e in chosen if (b, e.id) not in records) for b in BACKENDS}
