"""When a timing simulation has run long enough: its round time has settled.

A plan that does not fix the rounds (no ``--rounds``) simulates each
configuration until its round time has settled, inside one simulation: the
engine (akosim.sim.engine) hands every completed round to a `SettleWatch`,
which says when to stop. This module owns that rule:

- `SettleRule`: the tolerance (1%) and the cap (3,000 rounds); what the plan
  asks for (akosim.planning.setup.stop_rule puts it in the StopRule);
- `Settling`: the rule for one configuration, from its scheme's lead (how far
  a worker can run ahead: `Scheme.lead_rounds`, by default its staleness
  bound) and period (`SettleRule.for_scheme`): the warm-up, the window and
  the cap in rounds;
- `SettleWatch`: the check as rounds complete, and where it stopped;
- `settled_round_time_s`: the figure reported, the mean round time after the
  warm-up up to where the run settled; `settle_words`: the rule in words.

The window rule, and why. A round "completes" when every training worker has
ended it. Warm-up: the scheme's staleness bound B plus one round (for Ako
p - 1 + s + 1), in whole periods (DiLoCo: H): before that no staleness gate
can have bound, so a compute-bound run of a slow network looks network-free.
Window: 2 (B + 1) rounds, at least 20, in whole periods. Once the gate binds,
a worker runs ahead up to B rounds and then waits for the network, so the
round ends follow a cycle as long as B + 1 rounds or a few times that (two
sites at 50 Mbit/s and 1 Gbit/s with p - 1 + s = 64: window means over B + 1
rounds alternate between 2.1 and 2.9 ms, over 2 (B + 1) they agree within
1-2%); a window of two such cycles averages the cycle out, where one alone
never settles. At least 20 rounds so that per-round noise (compute jitter) of
a lockstep scheme (B = 0) averages out; whole periods so that every window
counts the same number of a periodic scheme's waits. The run stops at the
first window whose mean round time is within the tolerance of the previous
window's, and reports the mean over every window after the warm-up (the
longest span measured, so the least noisy). The cap is the most rounds a
configuration is simulated for: 3,000, or the warm-up and two windows when
that is more (a check needs two windows); a run that reaches it has not
settled, and the plan says so.

Pure arithmetic on simulated times: no clocks, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

SETTLE_TOLERANCE = 0.01  # the last window's mean round time within 1% of the one before
SETTLE_CAP_ROUNDS = 3000  # the most rounds a configuration is simulated for to settle
MIN_WINDOW_ROUNDS = 20  # a window of a lockstep scheme (staleness bound 0)


def _whole_periods(rounds: int, period: int) -> int:
    return -(-rounds // period) * period


@dataclass(frozen=True)
class Settling:
    """The settle rule of one configuration, in rounds."""

    warmup_rounds: int
    window_rounds: int
    cap_rounds: int
    tolerance: float = SETTLE_TOLERANCE

    def __post_init__(self) -> None:
        if self.warmup_rounds < 1 or self.window_rounds < 1:
            raise ValueError(f"warm-up and window must be >= 1 round, got "
                             f"{self.warmup_rounds} and {self.window_rounds}")
        if self.cap_rounds < self.first_check_rounds:
            raise ValueError(f"a cap of {self.cap_rounds} rounds leaves no check "
                             f"(the first is at {self.first_check_rounds})")

    @property
    def first_check_rounds(self) -> int:
        """The fewest rounds a settled run has: the warm-up and two windows."""
        return self.warmup_rounds + 2 * self.window_rounds


@dataclass(frozen=True)
class SettleRule:
    """Simulate until the round time settles (instead of a fixed number of rounds)."""

    tolerance: float = SETTLE_TOLERANCE
    cap_rounds: int = SETTLE_CAP_ROUNDS

    def __post_init__(self) -> None:
        if not 0 < self.tolerance < 1:
            raise ValueError(f"tolerance must be in (0, 1), got {self.tolerance}")
        if self.cap_rounds < 1:
            raise ValueError(f"the cap must be >= 1 round, got {self.cap_rounds}")

    def for_scheme(self, staleness_bound_rounds: float, period_rounds: int) -> Settling:
        """The warm-up, window and cap of a configuration whose scheme has this staleness
        bound (Scheme.staleness_bound; inf: no gate ever binds) and period
        (Scheme.period_rounds), as the module says."""
        period = max(1, int(period_rounds))
        bound = staleness_bound_rounds
        if math.isfinite(bound):
            cycle = math.ceil(bound) + 1
            warmup = _whole_periods(cycle, period)
            window = _whole_periods(max(MIN_WINDOW_ROUNDS, 2 * cycle), period)
        else:  # no gate: nothing to wait for but the first messages
            window = _whole_periods(MIN_WINDOW_ROUNDS, period)
            warmup = window
        cap = max(self.cap_rounds, warmup + 2 * window)
        return Settling(warmup, window, cap, self.tolerance)


def settle_words(rule: SettleRule) -> str:
    """The rule in words, for the line above the plan's table and --show-config."""
    return (f"each row simulated until its round time settles (within "
            f"{100 * rule.tolerance:g}% from one window to the next, after a warm-up past "
            f"its staleness bound; at most {rule.cap_rounds:,} rounds; see the rounds column)")


def window_mean_s(ends: Sequence[Sequence[float]], last: int, rounds: int) -> float:
    """Mean over workers of the seconds per round over rounds (last - rounds, last]
    (0-based round indices; `ends[w][r]`: when worker w ended round r)."""
    first = last - rounds
    return sum((line[last] - line[first]) / rounds for line in ends) / len(ends)


def settled_round_time_s(round_end_s: Sequence[float], warmup_rounds: int,
                         rounds: int) -> float:
    """One worker's mean seconds per round over rounds warmup_rounds..rounds-1 (the span
    a settled run measured); NaN when that span is empty."""
    if rounds <= warmup_rounds or len(round_end_s) < rounds or warmup_rounds < 1:
        return math.nan
    return (round_end_s[rounds - 1] - round_end_s[warmup_rounds - 1]) / (rounds - warmup_rounds)


class SettleWatch:
    """Feeds on completed rounds; says when the round time has settled or hit the cap."""

    def __init__(self, settling: Settling, ends: Sequence[Sequence[float]]) -> None:
        """`ends[w]`: worker w's round end times, the lists the engine appends to."""
        self.settling = settling
        self._ends = ends
        self._previous_s: float | None = None
        self.rounds = 0  # rounds every worker has completed when the watch stopped it
        self.settled: bool | None = None  # None: still running

    def completed(self, rounds: int) -> bool:
        """Every worker has now ended `rounds` rounds; True when the run should stop."""
        rule = self.settling
        if rounds >= rule.warmup_rounds + rule.window_rounds and \
                (rounds - rule.warmup_rounds) % rule.window_rounds == 0:
            mean_s = window_mean_s(self._ends, rounds - 1, rule.window_rounds)
            previous, self._previous_s = self._previous_s, mean_s
            if previous is not None and abs(mean_s - previous) <= rule.tolerance * previous:
                return self._stop(rounds, settled=True)
        if rounds >= rule.cap_rounds:
            return self._stop(rounds, settled=False)
        return False

    def _stop(self, rounds: int, *, settled: bool) -> bool:
        self.rounds, self.settled = rounds, settled
        return True
