"""The steady-state summary figures of a rank or a run, from its per-round series.

`Figures` carries the summary of one rank (`rank_figures`, from its per-round
series) or one run (`merged_figures`, the means over its training ranks) into
akocore.records.results' RankResult and RunResult; `rank_overhead_s` and
`run_compute_jitter` derive what a calibration needs from a written result.
The figures every reader shares (steady means, warm-up) are akocore.records.figures'.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from akocore.records.figures import (
    mean_of_known,
    relative_std,
    steady_mean,
    steady_round_time_s,
    warmup_rounds,
)

if TYPE_CHECKING:
    from akocore.records.results import RankResult, RunResult


def rank_overhead_s(rank: RankResult | RunResult) -> float | None:
    """Seconds per round outside the gradient and the gate: ``overhead_s_per_round``
    when recorded, else round_time_s - compute - wait (the same steady-state means, for
    results written before akorun measured it); None without either."""
    if rank.overhead_s_per_round is not None:
        return rank.overhead_s_per_round
    parts = (rank.round_time_s, rank.compute_s_per_round, rank.wait_s_per_round)
    if any(v is None or not math.isfinite(v) for v in parts):
        return None
    total, compute, wait = parts
    return total - compute - wait  # type: ignore[operator]


def run_compute_jitter(run: RunResult) -> float:
    """Relative standard deviation of the per-round gradient time over the steady rounds,
    mean over the ranks that have one (0.0 when none)."""
    cvs = [relative_std(list(r.round_compute_s[warmup_rounds(len(r.round_compute_s)):]))
           for r in run.per_worker]
    known = [cv for cv in cvs if cv is not None]
    return sum(known) / len(known) if known else 0.0


@dataclass(frozen=True)
class Figures:
    """The steady-state summary figures of one rank (`rank_figures`) or one run
    (`merged_figures`): the fields of RankResult and RunResult with the same names."""

    round_time_s: float | None
    samples_per_s: float | None
    bytes_sent_per_worker_per_round: float | None
    compute_s_per_round: float | None
    wait_s_per_round: float | None
    overhead_s_per_round: float | None

    def as_fields(self) -> dict[str, Any]:
        """Keyword arguments of RankResult / RunResult."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def rank_figures(*, round_end_s: Sequence[float], compute_s: Sequence[float],
                 wait_s: Sequence[float], overhead_s: Sequence[float] | None,
                 training_workers: int, batch_size: int,
                 bytes_sent_rounds: float, round_stride: int = 1,
                 rounds: int | None = None) -> Figures:
    """The steady-state summary figures of one rank from its per-round series (a sampled
    series holds every `round_stride`-th of `rounds` rounds; the means are the samples')."""
    if rounds is None:
        rounds = len(round_end_s) * round_stride
    round_time_s = steady_round_time_s(round_end_s) / round_stride

    def finite(value: float) -> float | None:
        return value if math.isfinite(value) else None

    return Figures(
        round_time_s=finite(round_time_s),
        samples_per_s=finite(training_workers * batch_size / round_time_s)
        if round_time_s > 0 else None,
        bytes_sent_per_worker_per_round=bytes_sent_rounds / rounds if rounds else None,
        compute_s_per_round=finite(steady_mean(compute_s)),
        wait_s_per_round=finite(steady_mean(wait_s)),
        overhead_s_per_round=finite(steady_mean(overhead_s))
        if overhead_s is not None else None)


def merged_figures(training: Sequence[RankResult], batch_size: int) -> Figures:
    """A run's summary figures: the means over its training ranks."""
    round_time = mean_of_known([r.round_time_s for r in training])
    return Figures(
        round_time_s=round_time,
        samples_per_s=len(training) * batch_size / round_time if round_time else None,
        bytes_sent_per_worker_per_round=mean_of_known(
            [r.bytes_sent_per_worker_per_round for r in training]),
        compute_s_per_round=mean_of_known([r.compute_s_per_round for r in training]),
        wait_s_per_round=mean_of_known([r.wait_s_per_round for r in training]),
        overhead_s_per_round=mean_of_known([r.overhead_s_per_round for r in training]))
