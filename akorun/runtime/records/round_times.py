"""A rank's per-round times (wall, gradient, gate, the rest), bounded however long it runs.

Every round is counted in the totals; the per-round series keep at most
`SERIES_MAX_ROUNDS` entries. Until a run passes that many rounds they hold every
round; each time they fill, every other entry is dropped and from then on only every
`stride`-th round is kept (the stride doubles), so a week-long run's memory and its
record stay flat: a sampled series, with `stride` rounds between two entries (the
record's ``round_stride``). Entry i is round (i + 1) x stride - 1 in every case.

overhead_s of a round is its time outside the gradient step and the gate wait: its
wall time (its end minus the previous round's) minus its compute and wait seconds
(dispatching the sends, folding the inbox and applying the optimizer in local_step,
the evaluation start, checkpoints, the event loop).
"""

from __future__ import annotations

from dataclasses import dataclass, field

SERIES_MAX_ROUNDS = 50_000  # entries of each per-round series before it thins


@dataclass
class RoundTimes:
    """The rounds of one rank since its training start (seconds)."""

    max_entries: int = SERIES_MAX_ROUNDS
    end_s: list[float] = field(default_factory=list)
    compute_s: list[float] = field(default_factory=list)
    wait_s: list[float] = field(default_factory=list)
    overhead_s: list[float] = field(default_factory=list)
    stride: int = 1  # rounds between two entries of the series
    rounds: int = 0  # every round, kept or not
    last_end_s: float = 0.0  # the last round's end (kept or not)

    def add(self, end_s: float, compute_s: float, wait_s: float) -> None:
        # not clamped: compute and wait come from the same monotonic clock, and the
        # steady means then add up exactly (round = compute + wait + overhead)
        overhead_s = end_s - self.last_end_s - compute_s - wait_s
        self.rounds += 1
        self.last_end_s = end_s
        if self.rounds % self.stride:
            return
        self.end_s.append(end_s)
        self.compute_s.append(compute_s)
        self.wait_s.append(wait_s)
        self.overhead_s.append(overhead_s)
        if len(self.end_s) >= self.max_entries:  # keep rounds 2s-1, 4s-1, ...: stride 2s
            for series in (self.end_s, self.compute_s, self.wait_s, self.overhead_s):
                del series[0::2]
            self.stride *= 2
