"""The plan's default answer: the configuration predicted to reach the accuracy first.

Throughput is not what a user waits for: the stalest Ako row has the most
samples/s and can learn the least. So by default (``--rank-by accuracy``) the
plan trains every row of its comparison (akosim.planning.learning_runs: the planned
workload when small, else a proxy, on the cluster's nodes or a spread of them)
and ranks the rows by predicted time to a target accuracy:

- the target is `TARGET_FRACTION` of the best accuracy any row within
  ``--max-staleness`` reached after the training horizon: "nearly as good as the
  best this cluster can do" (a fixed number would be out of reach of one
  workload and trivial for another);
- a row's time to target is the rounds its training needed to reach the target
  (and still be at or above it at the end) times its round time in the timing
  comparison; a row that ended below the target has "not reached";
- the recommendation is the first to the target among the rows within
  ``--max-staleness`` whose accuracy at the end of their training is at most
  ``--accuracy-margin`` points (`ACCURACY_MARGIN_POINTS`) below the best any
  row had reached by that same simulated time. Same time, not same rounds: a
  row of short rounds that has not finished learning after the horizon is not
  beaten by one of long rounds that had three times as long; a row that
  plateaus low (a very stale Ako) is.

`--rank-by throughput` keeps the plan's older answer (akosim.planning.advice.recommend).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from akocore.cli_support import UsageError
from akocore.units import format_duration

if TYPE_CHECKING:
    from akocore.records.results import RankedRun
    from akocore.settings.schema import RunConfig
    from akosim.planning.learning_runs import LearningSource, RowLearning
    from akosim.sim.scenario import Setup, SimRun

RANK_BY = ("accuracy", "throughput")
TARGET_FRACTION = 0.9  # the default target: 90% of the best accuracy reached
ACCURACY_MARGIN_POINTS = 2.0  # never recommend a row more than 2 points below the best


def check_rank_by(value: str) -> str:
    """--rank-by's value, or a one-line UsageError naming the allowed ones."""
    if value not in RANK_BY:
        raise UsageError(f"--rank-by: got {value!r}, expected one of {', '.join(RANK_BY)}")
    return value


def check_margin(points: float) -> float:
    if not (math.isfinite(points) and points >= 0):
        raise UsageError(f"--accuracy-margin: got {points}, expected points of accuracy >= 0, "
                         f"e.g. 2")
    return points


@dataclass(frozen=True)
class LearnedRow:
    """A comparison row and what its training learned."""

    run: SimRun
    learning: RowLearning
    rounds_to_target: int | None  # None: ended below the target
    within_limit: bool  # its staleness bound is within --max-staleness
    beaten_by: str = ""  # a row more than the margin better by the time this one ends
    exchange: Mapping[str, Any] = field(default_factory=dict)  # its settings (TOML keys)

    @property
    def horizon_s(self) -> float:
        """Simulated seconds its training covers at the timing comparison's round time."""
        return self.learning.rounds * self.run.round_time_s

    def accuracy_at(self, time_s: float) -> float:
        """Its accuracy at `time_s` of simulated time: the last evaluation by then, its
        final accuracy from the end of its training on."""
        if time_s >= self.horizon_s:
            return self.learning.accuracy
        seen = [a for r, a in self.learning.curve if r * self.run.round_time_s <= time_s]
        return seen[-1] if seen else 0.0

    @property
    def reached(self) -> bool:
        return self.rounds_to_target is not None

    @property
    def time_to_target_s(self) -> float | None:
        """Rounds to target times the row's round time in the timing comparison."""
        if self.rounds_to_target is None:
            return None
        return self.rounds_to_target * self.run.round_time_s

    @property
    def recommendable(self) -> bool:
        return self.within_limit and self.reached and not self.beaten_by


@dataclass(frozen=True)
class LearningRanking:
    """The rows ranked by predicted time to the target (those not reaching it last, by
    accuracy), with what trained and the target chosen."""

    source: LearningSource
    planned_workload: str
    rounds: int
    target: float
    best_accuracy: float
    margin_points: float
    max_staleness_rounds: float
    ranked: tuple[LearnedRow, ...]  # first to the target first

    @property
    def winner(self) -> LearnedRow | None:
        return next((row for row in self.ranked if row.recommendable), None)

    def how(self) -> str:
        """What trained, in words."""
        return (f"{self.rounds} rounds of {self.source.describe(self.planned_workload)} each, "
                f"in simulated time")

    def caveat(self) -> tuple[str, ...]:
        """What the learning figures are and are not (printed with the table)."""
        lines = []
        if self.source.scaled:
            stand_in = (f"the proxy {self.source.workload} (not {self.planned_workload})"
                        if self.source.proxy else f"{self.planned_workload}")
            nodes = (f" trained on {self.source.workers} of the {self.source.cluster_workers} "
                     f"workers (the network scaled so each round's sends weigh as in the plan)"
                     if self.source.workers < self.source.cluster_workers else "")
            lines.append(
                f"akosim: training every row at the planned scale is too slow to simulate "
                f"here, so accuracy is predicted from {stand_in}{nodes}: rounds to the target "
                f"come from that training, round times from the rows above. It ranks how "
                f"each configuration's staleness and averaging cost learning; it is not the "
                f"accuracy your model will reach")
        return tuple(lines)

    def table(self) -> str:
        target = _percent(self.target)
        winner = self.winner
        # each row's accuracy by the time the recommended row's training ends: what the
        # margin compares (same time, not same rounds)
        at_s = winner.horizon_s if winner is not None else None
        headers = ["rank", "configuration", f"accuracy after {self.rounds} rounds",
                   f"rounds to {target}", f"time to {target}", "staleness", "note"]
        if at_s is not None:
            headers.insert(3, f"accuracy by {format_duration(at_s)}")
        rows = []
        for index, row in enumerate(self.ranked, 1):
            ttt = row.time_to_target_s
            note = ("beyond --max-staleness" if not row.within_limit else
                    f"by its end > {self.margin_points:g} points below {row.beaten_by}"
                    if row.beaten_by else "")
            bound = row.run.staleness_bound_rounds
            cells = [str(index), row.run.label, _percent(row.learning.accuracy),
                     "not reached" if row.rounds_to_target is None
                     else str(row.rounds_to_target),
                     "not reached" if ttt is None else format_duration(ttt),
                     "<= " + ("inf" if math.isinf(bound) else f"{bound:g}") + " rounds", note]
            if at_s is not None:  # "-": not evaluated yet by then
                seen = at_s >= row.horizon_s or any(
                    r * row.run.round_time_s <= at_s for r, _ in row.learning.curve)
                cells.insert(3, _percent(row.accuracy_at(at_s)) if seen else "-")
            rows.append(cells)
        widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
                  for i, h in enumerate(headers)]
        lines = [f"ranked by predicted time to {target} ({_percent(TARGET_FRACTION)} of the "
                 f"best accuracy reached, {_percent(self.best_accuracy)}; {self.how()}):",
                 "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip(),
                 "  ".join("-" * w for w in widths)]
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                  for r in rows]
        return "\n".join(lines)

    def recommendation(self, by_throughput: tuple[str, ...]) -> tuple[str, ...]:
        """The winner with its predicted time and accuracy; the throughput rule's lines when
        no row qualifies (none within --max-staleness)."""
        from akosim.planning.advice import GLOSSARY

        first = self.winner
        if first is None:
            return by_throughput
        assert first.rounds_to_target is not None and first.time_to_target_s is not None
        run = first.run
        return (f"recommend: {run.label}: first to {_percent(self.target)} in "
                f"{format_duration(first.time_to_target_s)} (predicted: "
                f"{first.rounds_to_target} rounds of {format_duration(run.round_time_s)}), "
                f"predicted accuracy {_percent(first.learning.accuracy)} after "
                f"{self.rounds} rounds ({format_duration(first.horizon_s)}), staleness <= "
                f"{run.staleness_bound_rounds:g} rounds "
                f"(ranked by predicted time to accuracy within --max-staleness "
                f"{self.max_staleness_rounds:g} and {self.margin_points:g} points of the best "
                f"by the same time; --rank-by throughput for samples/s)", GLOSSARY)

    def records(self) -> tuple[RankedRun, ...]:
        """The ranking as akocore.records.results records (what ``--out`` writes): each row's
        predicted time to target and accuracy after the horizon, curve in rounds."""
        from akocore.records.results import RankedRun

        return tuple(
            RankedRun(position=index, label=row.run.label, scheme=row.run.scheme,
                      reached=row.reached, time_to_target_s=row.time_to_target_s,
                      accuracy=row.learning.accuracy, rounds=row.learning.rounds,
                      simulated_s=row.learning.rounds * row.run.round_time_s,
                      samples_per_s=row.run.samples_per_s,
                      staleness_bound_rounds=row.run.staleness_bound_rounds,
                      evaluations=tuple((r * row.run.round_time_s, r, a)
                                        for r, a in row.learning.curve),
                      exchange=dict(row.exchange))
            for index, row in enumerate(self.ranked, 1))

    def verdict(self) -> tuple[str, ...]:
        first = self.winner
        lines = list(self.caveat())
        if first is not None:
            lines.append(f"rank: first to {_percent(self.target)}: {first.run.label}")
        return tuple(lines)


def rank_rows(runs: list[SimRun], learned: list[RowLearning], *, source: LearningSource,
              planned_workload: str, rounds: int, max_staleness_rounds: float,
              margin_points: float = ACCURACY_MARGIN_POINTS) -> LearningRanking:
    """The rows and their learning, ranked: the target from the best within the limit."""
    within = [run.staleness_bound_rounds <= max_staleness_rounds for run in runs]
    candidates = [row.accuracy for row, ok in zip(learned, within, strict=True) if ok]
    best = max(candidates or [row.accuracy for row in learned] or [0.0])
    target = TARGET_FRACTION * best
    rows = [LearnedRow(run, row, row.rounds_to(target), ok)
            for run, row, ok in zip(runs, learned, within, strict=True)]
    rows = [_with_margin(row, rows, margin_points) for row in rows]

    def order(row: LearnedRow) -> tuple[float, ...]:
        ttt = row.time_to_target_s  # by time to target, those not reaching it by accuracy
        return (0.0 if ttt is not None else 1.0, ttt if ttt is not None else 0.0,
                -row.learning.accuracy)

    return LearningRanking(source, planned_workload, rounds, target, best, margin_points,
                           max_staleness_rounds, tuple(sorted(rows, key=order)))


def _with_margin(row: LearnedRow, rows: list[LearnedRow], margin_points: float) -> LearnedRow:
    """`row`, with the row within --max-staleness that had reached the most accuracy by the
    time `row`'s training ends when that is more than the margin above `row`'s."""
    end_s = row.horizon_s
    rivals = [(other.accuracy_at(end_s), other.run.label) for other in rows
              if other is not row and other.within_limit]
    if not rivals:
        return row
    best, label = max(rivals)
    if best - row.learning.accuracy > margin_points / 100 + 1e-9:
        return replace(row, beaten_by=label)
    return row


def learning_ranking(setup: Setup, runs: list[SimRun], cfg: RunConfig, *,
                     max_staleness_rounds: float, stand_in_gradient: bool,
                     measured_step_s: float | None = None,
                     margin_points: float = ACCURACY_MARGIN_POINTS,
                     announce: Callable[[str], None] | None = None,
                     ) -> LearningRanking | str:
    """Every row trained (akosim.planning.learning_runs) and ranked; or, when the rows cannot
    be trained here, the reason in words (the plan then ranks by throughput)."""
    from akocore.data.catalog import DataError
    from akocore.partition import PartitionError
    from akosim.planning.learning_runs import LEARNING_ROUNDS, learn_rows, learning_source
    from akosim.planning.pareto_candidates import exchange_settings, variant_of

    source = learning_source(cfg, setup, stand_in_gradient=stand_in_gradient,
                             measured_step_s=measured_step_s)
    try:
        learned = learn_rows(setup, runs, cfg, source, variant_of=variant_of,
                             announce=announce)
    except (UsageError, DataError, PartitionError, ValueError) as error:
        return f"{source.describe(cfg.train.workload)} cannot train these rows: {error}"
    ranking = rank_rows(runs, learned, source=source, planned_workload=cfg.train.workload,
                        rounds=LEARNING_ROUNDS, max_staleness_rounds=max_staleness_rounds,
                        margin_points=margin_points)
    return replace(ranking, ranked=tuple(
        replace(row, exchange=exchange_settings(setup, variant_of(row.run)))
        for row in ranking.ranked))


def _percent(value: float) -> str:
    return f"{100 * value:.3g}%"
