"""Shared derived figures, defined once for akosim, akorun and analysis.

- the warm-up rule: `warmup_rounds` (the first 10% of rounds, at least 1, when
  there are 4 or more) and the steady-state figures built on it,
  `steady_round_time_s` and `steady_mean`;
- the mean-filling rule for per-rank values (`fill_missing`): a rank without a
  value (a parameter server has no gradient time) gets the mean of the ranks
  with one; negative values read as 0; and `tile` to spread per-rank values
  over another number of nodes;
- the per-step seed (`step_seed`): the dropout seed of one gradient step, the
  same in every backend.

Pure functions of numbers: no I/O, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

WARMUP_FRACTION = 0.1


def warmup_rounds(rounds: int, fraction: float = WARMUP_FRACTION) -> int:
    """Rounds skipped as warm-up: 10% (at least 1) when there are 4 or more."""
    return 0 if rounds < 4 else max(1, int(rounds * fraction))


def steady_round_time_s(round_end_s: Sequence[float], period_rounds: int = 1) -> float:
    """Mean seconds per round after the warm-up rounds; times since training start.
    NaN without rounds. With `period_rounds` > 1 (a scheme that waits every H rounds)
    the window is whole periods ending at the last round, so it counts one wait per
    period; when no whole period fits after the warm-up, the whole run."""
    ends = np.asarray(round_end_s, dtype=float)
    if len(ends) == 0:
        return math.nan
    skip = warmup_rounds(len(ends))
    if period_rounds > 1:
        periods = (len(ends) - skip) // period_rounds
        skip = len(ends) - periods * period_rounds if periods else 0
    if skip == 0:
        return float(ends[-1] / len(ends))
    return float((ends[-1] - ends[skip - 1]) / (len(ends) - skip))


def steady_mean(per_round: Sequence[float]) -> float:
    """Mean of a per-round series after the warm-up rounds; NaN when empty."""
    values = np.asarray(per_round, dtype=float)
    if len(values) == 0:
        return math.nan
    return float(values[warmup_rounds(len(values)):].mean())


def relative_std(values: Sequence[float]) -> float | None:
    """Standard deviation / mean (population), None with fewer than 2 values or mean 0."""
    if len(values) < 2 or sum(values) <= 0:
        return None
    mean = sum(values) / len(values)
    return (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5 / mean


def fill_missing(values: Sequence[float | None]) -> tuple[float, ...] | None:
    """Per-rank values with the gaps filled: negative values read as 0, a rank without
    a value gets the mean of the ranks with one. None when no rank has a value."""
    known = [max(v, 0.0) for v in values if v is not None]
    if not known:
        return None
    mean = sum(known) / len(known)
    return tuple(max(v, 0.0) if v is not None else mean for v in values)


def tile(values: Sequence[float], nodes: int) -> tuple[float, ...]:
    """`values` repeated in turn over `nodes` nodes (node i gets values[i % len])."""
    return tuple(values[i % len(values)] for i in range(nodes))


def mean_of_known(values: Sequence[float | None]) -> float | None:
    """Mean of the finite values; None when there is none."""
    known = [v for v in values if v is not None and math.isfinite(v)]
    return sum(known) / len(known) if known else None


def step_seed(seed: int, rank: int, round_: int) -> int:
    """The dropout seed of rank's gradient step in round `round_`, the same in every
    backend (akosim's training and akorun's worker both call this)."""
    return ((seed * 1_000_003 + rank) * 1_000_003 + round_) % (2**31 - 1)
