"""How far akosim's predictions are from akorun's measurements.

For every configuration run in both backends: predicted vs measured round
time and bytes per round, the mean absolute percentage error, and Kendall's
tau over the ranking of configurations (does the simulator order the
configurations as the real runs do? For planning that matters as much as the
absolute error).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Pair:
    """One configuration measured by akorun and predicted by akosim."""

    config: str
    measured: float
    predicted: float

    @property
    def error(self) -> float:
        """Signed relative error of the prediction."""
        return self.predicted / self.measured - 1


def mape(pairs: Sequence[Pair]) -> float:
    """Mean absolute percentage error (as a fraction), over valid pairs."""
    usable = [p for p in pairs if p.measured > 0 and math.isfinite(p.predicted)]
    if not usable:
        return math.nan
    return sum(abs(p.error) for p in usable) / len(usable)


def kendall_tau(pairs: Sequence[Pair]) -> float:
    """Kendall's tau-b between measured and predicted values (ties handled)."""
    from scipy.stats import kendalltau

    if len(pairs) < 2:
        return math.nan
    tau = kendalltau([p.measured for p in pairs], [p.predicted for p in pairs]).statistic
    return float(tau)


@dataclass(frozen=True)
class FidelitySummary:
    metric: str
    calibration: str  # "uncalibrated" (akosim measures compute) or "calibrated" (from akorun)
    pairs: tuple[Pair, ...]

    @property
    def mape(self) -> float:
        return mape(self.pairs)

    @property
    def kendall_tau(self) -> float:
        return kendall_tau(self.pairs)


def markdown(summaries: Sequence[FidelitySummary]) -> str:
    lines = ["| metric | akosim compute | configurations | MAPE | Kendall's tau |",
             "|---|---|---|---|---|"]
    for s in summaries:
        lines.append(f"| {s.metric} | {s.calibration} | {len(s.pairs)} | "
                     f"{100 * s.mape:.1f}% | {s.kendall_tau:.2f} |")
    return "\n".join(lines)
