"""The runs a command asks for, from a setup: the configured scheme, or every scheme compared.

`run_setup` takes a setup from akosim.planning.setup, holds p = auto within the
staleness limit (akosim.planning.advice.within_staleness), chooses s with p when the
rule says so (akosim.planning.advice.with_overlap_ssp) and simulates either the
configured scheme alone (akosim.planning.runspec.configured_runs) or the comparison
of every scheme (akosim.planning.compare.compare_all). `plan_runs` is the whole path
of `akosim plan` / `akosim train` from resolved settings, for the command
line, the analysis and the public API alike; `plan_outcome` adds what they
report (the plan record, the explanation, the recommendation, the ranking by
simulated training of akosim.planning.accuracy_ranking and the --explain text of
akosim.planning.long_explanation).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from akocore.cli_support import UsageError
from akocore.schemes.registry import scheme_named
from akocore.settings.layers import ResolvedSettings
from akocore.units import format_duration
from akosim.planning.setup import (
    SimulationOptions,
    chooses_ssp_with_p,
    settles,
    simulation_setup,
    training_config,
    with_plan,
)

if TYPE_CHECKING:
    from akocore.records.results import PlanResult
    from akosim.planning.accuracy_ranking import Ranking
    from akosim.planning.advice import Explanation
    from akosim.planning.learning_ranking import LearningRanking
    from akosim.planning.runspec import ProgressFactory
    from akosim.sim.scenario import Setup, SimRun


@dataclass
class PlannedRuns:
    """What a plan or train simulated: the setup that ran (s chosen or not) and its runs."""

    setup: Setup
    runs: list[SimRun]
    ssp_chosen: bool
    training: bool


def run_setup(setup: Setup, *, choose_ssp: bool, compare: bool, training: bool = False,
              factory: ProgressFactory | None = None,
              max_staleness_rounds: float | None = None, **kwargs: Any) -> PlannedRuns:
    """Simulate `setup`: the configured scheme only, or (`compare`) every scheme side by
    side; with `choose_ssp`, s is first chosen with p; with `max_staleness_rounds`, p = auto
    is held within that staleness bound (akosim.planning.advice.within_staleness)."""
    from akosim.planning.compare import compare_all
    from akosim.planning.runspec import configured_runs

    if compare or scheme_named(setup.config.exchange.scheme).partitioned:
        setup = with_plan(setup)  # p resolved once for the choice of s, the runs, the advice
        if max_staleness_rounds is not None:
            from akosim.planning.advice import within_staleness

            setup = within_staleness(setup, max_staleness_rounds, choose_ssp=choose_ssp)
    if choose_ssp:  # p and s together: the smallest s that lets sending overlap compute
        from akosim.planning.advice import with_overlap_ssp

        setup = with_overlap_ssp(setup)
    run = compare_all if compare else configured_runs
    runs = run(setup, factory=factory, **kwargs)
    return PlannedRuns(setup, runs, choose_ssp, training)


def plan_runs(resolved: ResolvedSettings, options: SimulationOptions, *,
              training: bool = False, trace: bool = False,
              factory: ProgressFactory | None = None,
              max_staleness_rounds: float | None = None) -> PlannedRuns:
    """`akosim plan` (or, with `training`, `akosim train`) of resolved settings: the
    configured scheme when a layer chose one, else every scheme compared."""
    from akosim.planning.runspec import check_fits

    cfg = resolved.config
    setup, workload = simulation_setup(cfg, options, training=training,
                                       settle=settles(resolved, training=training))
    check_fits(cfg, setup.length)
    kwargs: dict[str, Any] = dict(trace=trace)
    if training:
        assert workload is not None
        kwargs.update(workload=workload, eval_every=cfg.train.eval_every,
                      target_accuracy=cfg.train.target_accuracy)
    return run_setup(setup, choose_ssp=chooses_ssp_with_p(resolved, training=training),
                     compare=not resolved.given("exchange.scheme"), training=training,
                     factory=factory, max_staleness_rounds=max_staleness_rounds, **kwargs)


@dataclass(frozen=True)
class PlanOutcome:
    """What one plan or train computed: the record (what `plan` returns and ``--out``
    writes), the simulated runs and setup (the table, the trace) and the explanation."""

    record: PlanResult
    planned: PlannedRuns
    explanation: Explanation | None
    recommendation: tuple[str, ...] = ()  # the winner within the staleness limit, in words
    ranking: Ranking | None = None  # --target-accuracy / --time-budget: ranked by training
    explained: tuple[str, ...] = ()  # --explain: the longer version
    learning: LearningRanking | None = None  # the default: rows ranked by time to accuracy
    caveats: tuple[str, ...] = ()  # why the plan ranked by throughput after all


def plan_outcome(resolved: ResolvedSettings, options: SimulationOptions, *,
                 training: bool = False, trace: bool = False,
                 factory: ProgressFactory | None = None,
                 max_staleness_rounds: int | None = None,
                 time_budget_s: float | None = None, explain_more: bool = False,
                 announce: Callable[[str], None] | None = None,
                 rank_by: str = "accuracy", accuracy_margin_points: float | None = None,
                 ) -> PlanOutcome:
    """Plan (or, with `training`, simulate training of) resolved settings: the one path of
    ``akosim plan``, ``akosim train`` and akosim.sim_api's plan, simulate and train.

    A plan with a target accuracy (``train.target_accuracy``) or `time_budget_s` also
    ranks the comparison's candidates by simulated training
    (akosim.planning.accuracy_ranking), `announce` hearing one line per candidate;
    `explain_more` adds the longer explanation (akosim.planning.long_explanation)."""
    from akocore.settings.toml_io import config_to_dict
    from akosim.planning.advice import MAX_STALENESS_ROUNDS, explain, recommend
    from akosim.planning.learning_ranking import (
        ACCURACY_MARGIN_POINTS,
        check_margin,
        check_rank_by,
    )
    from akosim.planning.result_tables import plan_result

    limit = MAX_STALENESS_ROUNDS if max_staleness_rounds is None else max_staleness_rounds
    check_rank_by(rank_by)
    margin = check_margin(ACCURACY_MARGIN_POINTS if accuracy_margin_points is None
                          else accuracy_margin_points)
    target = resolved.config.train.target_accuracy
    if rank_by == "throughput" and (target is not None or time_budget_s is not None):
        raise UsageError("--rank-by throughput ranks by samples/s; --target-accuracy and "
                         "--time-budget rank by simulated training: give one or the other")
    if limit < 0:
        raise UsageError(f"--max-staleness: got {max_staleness_rounds}, expected rounds >= 0")
    if time_budget_s is not None and (training or not time_budget_s > 0):
        raise UsageError(f"--time-budget: got {time_budget_s} s, expected a duration > 0 "
                         f"on akosim plan" if not training else
                         "--time-budget is for akosim plan (akosim train takes --duration)")
    planned = plan_runs(resolved, options, training=training, trace=trace, factory=factory,
                        max_staleness_rounds=limit)
    setup, runs = planned.setup, planned.runs
    explanation = None if training else explain(setup, runs, ssp_chosen=planned.ssp_chosen,
                                                max_staleness_rounds=limit)
    recommendation = () if training else recommend(runs, max_staleness_rounds=limit)
    ranking = learning = None
    caveats: tuple[str, ...] = ()
    if not training and (target is not None or time_budget_s is not None):
        ranking = _ranking(resolved, setup, runs, limit, time_budget_s, factory, announce)
        recommendation = ranked_recommendation(ranking, recommendation)
    elif not training and rank_by == "accuracy" and len(runs) > 1:
        from akosim.planning.learning_ranking import learning_ranking

        learned = learning_ranking(setup, runs, resolved.config, max_staleness_rounds=limit,
                                   stand_in_gradient=options.gradient_bytes is not None,
                                   measured_step_s=_measured_step_s(setup, options),
                                   margin_points=margin, announce=announce)
        if isinstance(learned, str):
            caveats = (f"akosim: cannot predict what each configuration learns ({learned}): "
                       f"ranked by throughput, which says nothing of accuracy",)
        else:
            learning = learned
            recommendation = learning.recommendation(recommendation)
    explained: tuple[str, ...] = ()
    if explain_more and not training:
        from akosim.planning.long_explanation import explain_long

        explained = explain_long(setup, runs, max_staleness_rounds=limit, ranking=ranking,
                                 learning=learning)
    workers = setup.config.cluster.workers
    record = plan_result(runs, config=config_to_dict(setup.config), training=training,
                         gradient_bytes=setup.gradient_bytes,
                         compute_s=[setup.compute.base_s(i) for i in range(workers)],
                         batch_size=setup.batch_size, compute_source=setup.compute_source,
                         explanation=explanation, recommendation=recommendation,
                         ranking=ranking, explained=explained, learning=learning)
    return PlanOutcome(record, planned, explanation, recommendation, ranking, explained,
                       learning, caveats)


def _measured_step_s(setup: Setup, options: SimulationOptions) -> float | None:
    """The workload's gradient step as measured on this machine; None when the compute time
    was given or came from an akorun run."""
    if options.compute_from or options.compute not in ("measure", "remeasure"):
        return None
    return setup.compute.compute_s


def _ranking(resolved: ResolvedSettings, setup: Setup, runs: list[SimRun], limit: float,
             time_budget_s: float | None, factory: ProgressFactory | None,
             announce: Callable[[str], None] | None) -> Ranking:
    """The comparison's candidates ranked by simulated training of the configured workload
    (its round budget: a given --rounds, else RANKING_ROUNDS)."""
    from akosim.planning.accuracy_ranking import RANKING_ROUNDS, RankingGoal, rank_by_accuracy
    from akosim.planning.runspec import load_workload

    cfg = resolved.config
    rounds = cfg.train.rounds if resolved.given("train.rounds") and cfg.train.rounds \
        else RANKING_ROUNDS
    goal = RankingGoal(cfg.train.target_accuracy, time_budget_s, rounds, cfg.train.eval_every)
    workload = load_workload(training_config(cfg))  # an island: every device's batch
    return rank_by_accuracy(setup, runs, workload, goal, max_staleness_rounds=limit,
                            factory=factory, announce=announce)


def ranked_recommendation(ranking: Ranking, by_throughput: tuple[str, ...]) -> tuple[str, ...]:
    """The recommendation when the plan ranked by accuracy: the ranking's winner (the
    throughput rule's when no candidate reached the target), with the glossary."""
    from akosim.planning.advice import GLOSSARY

    goal = ranking.goal
    if not ranking.ranked or (goal.target_accuracy is not None
                              and not ranking.ranked[0].reached):
        return by_throughput
    first = ranking.ranked[0]
    if goal.target_accuracy is not None:
        assert first.trained.time_to_target_s is not None
        why = (f"first to {100 * goal.target_accuracy:.4g}% in "
               f"{format_duration(first.trained.time_to_target_s)} simulated")
    else:
        why = (f"{100 * (first.trained.final_accuracy or 0.0):.4g}% after "
               f"{format_duration(goal.time_budget_s or 0.0)} simulated, the most accurate")
    return (f"recommend: {first.timing.label}: {why}, staleness <= "
            f"{first.timing.staleness_bound_rounds:g} rounds (ranked by simulated training "
            f"of the workload)", GLOSSARY)
