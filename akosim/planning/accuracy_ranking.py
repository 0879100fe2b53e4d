"""Which scheme reaches the user's accuracy first: the plan's comparison ranked by training.

With ``--target-accuracy`` (or ``--time-budget``) the plan does not stop at
throughput. akosim.planning.pareto_candidates takes, of each scheme, up to three
configurations of its staleness/throughput Pareto front within
``--max-staleness`` (the throughput-best, the least stale not much slower, one
between; a handful of trainings, not the whole table);
`rank_by_accuracy` trains each of them in simulated time (akosim.sim.scenario's
training mode: the workload's real JAX gradients, every message applied at its
simulated arrival) up to a round budget, stopping a candidate at the target,
and orders them: by simulated time to the target (those that never reach it
last, by the accuracy they got to), or with only a time budget by the accuracy
reached within it. `verdict` says it in words, and says plainly when no
candidate reached the target within the budget.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from akocore.cli_support import UsageError
from akocore.units import format_duration
from akosim.planning.pareto_candidates import exchange_settings, pareto_candidates
from akosim.sim.engine import StopRule
from akosim.sim.scenario import Setup, SimRun, simulate

if TYPE_CHECKING:
    from akocore.records.results import RankedRun
    from akocore.workloads.flat import FlatWorkload

ProgressFactory = Callable[[str, int], Callable[[int], None]]

RANKING_ROUNDS = 300  # the default round budget of each candidate's training


@dataclass(frozen=True)
class RankingGoal:
    """What the ranking orders by: time to `target_accuracy` (a fraction), or accuracy
    within `time_budget_s` simulated seconds, each candidate training at most `rounds`."""

    target_accuracy: float | None
    time_budget_s: float | None
    rounds: int
    eval_every: int

    def describe(self) -> str:
        parts = []
        if self.target_accuracy is not None:
            parts.append(f"to {_percent(self.target_accuracy)}")
        if self.time_budget_s is not None:
            parts.append(f"within {format_duration(self.time_budget_s)}")
        return " ".join(parts) + f", at most {self.rounds} rounds"


@dataclass(frozen=True)
class Ranked:
    """One candidate: the comparison row it came from and its training run."""

    timing: SimRun
    trained: SimRun
    reached: bool
    exchange: Mapping[str, Any] = field(default_factory=dict)  # its settings (TOML keys)


@dataclass(frozen=True)
class Ranking:
    goal: RankingGoal
    ranked: tuple[Ranked, ...]  # winner first

    def verdict(self) -> tuple[str, ...]:
        return verdict(self)


def rank_by_accuracy(setup: Setup, runs: list[SimRun], workload: FlatWorkload,
                     goal: RankingGoal, *, max_staleness_rounds: float,
                     factory: ProgressFactory | None = None,
                     announce: Callable[[str], None] | None = None) -> Ranking:
    """Train each candidate (akosim.planning.pareto_candidates: up to three of each scheme
    of `runs`) in simulated time and order them by `goal`; `announce` hears one line per
    scheme timed for the ladder and per candidate trained (progress on stderr)."""
    if workload.param_count != setup.length:
        raise UsageError(f"the ranking trains the workload's {workload.param_count:,} "
                         f"parameters, the plan timed {setup.length:,}")
    candidates = pareto_candidates(setup, runs, max_staleness_rounds=max_staleness_rounds,
                                   training_rounds=goal.rounds, announce=announce)
    stop = StopRule(rounds=goal.rounds, duration_s=goal.time_budget_s, drain=True)
    ranked = []
    for index, candidate in enumerate(candidates, 1):
        timing = candidate.timing
        if announce is not None:
            announce(f"akosim: training {index}/{len(candidates)}: {timing.label} "
                     f"({goal.describe()})")
        progress = factory(timing.label, goal.rounds) if factory is not None else None
        trained = simulate(replace(candidate.setup, stop=stop), candidate.variant,
                           workload=workload, eval_every=goal.eval_every,
                           target_accuracy=goal.target_accuracy, on_progress=progress)
        # reached: touched the target and ended at or above it (a run that fell back
        # below it, e.g. when a stale scheme's last updates land, has not)
        reached = (goal.target_accuracy is not None and trained.time_to_target_s is not None
                   and (trained.final_accuracy or 0.0) >= goal.target_accuracy)
        ranked.append(Ranked(timing, trained, reached,
                             exchange_settings(candidate.setup, candidate.variant)))
    return Ranking(goal, tuple(sorted(ranked, key=lambda r: _order(r, goal))))


def _order(candidate: Ranked, goal: RankingGoal) -> tuple[float, ...]:
    accuracy = candidate.trained.final_accuracy or 0.0
    if goal.target_accuracy is not None and candidate.reached:
        assert candidate.trained.time_to_target_s is not None
        return (0.0, candidate.trained.time_to_target_s, -accuracy)
    return (1.0, -accuracy, 0.0)


def _percent(value: float) -> str:
    return f"{100 * value:.4g}%"


def verdict(ranking: Ranking) -> tuple[str, ...]:
    """The ranking in words: the winner and the runner-up, or that none reached the target."""
    goal, ranked = ranking.goal, ranking.ranked
    if not ranked:
        return ("rank: no configuration within --max-staleness to train",)
    first = ranked[0]
    if goal.target_accuracy is not None:
        target = _percent(goal.target_accuracy)
        if not first.reached:
            budget = f"{goal.rounds} rounds" + (
                f" or {format_duration(goal.time_budget_s)}" if goal.time_budget_s else "")
            return (f"rank: no candidate reached {target} within {budget}; the closest was "
                    f"{first.timing.label} at {_percent(first.trained.final_accuracy or 0.0)}"
                    f". Give more --rounds, a longer --time-budget or a lower "
                    f"--target-accuracy",)
        assert first.trained.time_to_target_s is not None
        line = (f"rank: first to {target}: {first.timing.label} in "
                f"{format_duration(first.trained.time_to_target_s)} simulated")
        if len(ranked) > 1:
            second = ranked[1]
            if second.reached and second.trained.time_to_target_s:
                ratio = second.trained.time_to_target_s / first.trained.time_to_target_s
                line += (f", {ratio:.3g}x faster than {second.timing.label} "
                         f"({format_duration(second.trained.time_to_target_s)})")
            else:
                line += f"; {second.timing.label} did not reach it"
        missed = [r.timing.label for r in ranked if not r.reached]
        lines = [line]
        if missed:
            lines.append(f"rank: not reached within {goal.rounds} rounds: {', '.join(missed)}")
        return tuple(lines)
    assert goal.time_budget_s is not None
    accuracy = first.trained.final_accuracy or 0.0
    line = (f"rank: most accurate after {format_duration(goal.time_budget_s)} simulated: "
            f"{first.timing.label} at {_percent(accuracy)}")
    if len(ranked) > 1:
        second = ranked[1]
        line += (f" ({second.timing.label}: "
                 f"{_percent(second.trained.final_accuracy or 0.0)})")
    return (line,)


def ranked_records(ranking: Ranking) -> tuple[RankedRun, ...]:
    """The ranking as akocore.records.results records (what ``--out`` writes)."""
    from akocore.records.results import RankedRun

    return tuple(
        RankedRun(position=index, label=r.timing.label, scheme=r.timing.scheme,
                  reached=r.reached,
                  time_to_target_s=r.trained.time_to_target_s if r.reached else None,
                  accuracy=r.trained.final_accuracy,
                  rounds=max((w.rounds for w in r.trained.per_worker), default=0),
                  simulated_s=r.trained.simulated_s, samples_per_s=r.timing.samples_per_s,
                  staleness_bound_rounds=r.timing.staleness_bound_rounds,
                  evaluations=tuple((e.sim_time_s, e.round, e.accuracy)
                                    for e in r.trained.evaluations),
                  exchange=dict(r.exchange))
        for index, r in enumerate(ranking.ranked, 1))


def format_ranking(ranking: Ranking) -> str:
    """The ranking as a table, winner first."""
    goal = ranking.goal
    headers = ["rank", "configuration", "time to target", "accuracy", "rounds",
               "simulated", "samples/s", "staleness"]
    rows = []
    for index, r in enumerate(ranking.ranked, 1):
        ttt = ("-" if goal.target_accuracy is None else "not reached"
               if not r.reached or r.trained.time_to_target_s is None
               else format_duration(r.trained.time_to_target_s))
        rounds = max((w.rounds for w in r.trained.per_worker), default=0)
        bound = r.timing.staleness_bound_rounds
        rows.append([str(index), r.timing.label, ttt,
                     _percent(r.trained.final_accuracy or 0.0), str(rounds),
                     format_duration(r.trained.simulated_s),
                     f"{r.timing.samples_per_s:,.1f}",
                     "<= " + ("inf" if math.isinf(bound) else f"{bound:g}") + " rounds"])
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h)
              for i, h in enumerate(headers)]
    order = ("time to " + _percent(goal.target_accuracy) if goal.target_accuracy is not None
             else "accuracy within " + format_duration(goal.time_budget_s or 0.0))
    lines = [f"ranked by {order} (simulated training, at most {goal.rounds} rounds each):",
             "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(lines)
