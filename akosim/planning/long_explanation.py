"""``akosim plan --explain``: the longer version of the plan, in this run's numbers.

`explain_long` says what p, s, H, tau, staleness and the codec mean for the
configuration at hand (how many bytes a round sends, how old a gradient can
be, in rounds and seconds), then, for every configuration of the comparison,
which resource bounds it (`bound_by`: compute, a NIC, latency and
synchronisation waits, or the staleness limit), and why the winner won
against the runner-up. Pure words over the simulated runs: nothing is
simulated here.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from akocore.schemes.registry import is_partitioned, scheme_named, wire_codec
from akocore.units import format_duration, format_size
from akosim.network.island_reduce import describe_islands
from akosim.planning.advice import held_by_staleness
from akosim.sim.scenario import Setup, SimRun

if TYPE_CHECKING:
    from akosim.planning.accuracy_ranking import Ranking
    from akosim.planning.learning_ranking import LearningRanking

COMPUTE_BOUND = 0.9  # a run whose rounds are >= 90% compute is bound by compute
NIC_BOUND = 0.8  # else one whose busiest NIC is >= 80% busy is bound by that NIC
NIC_IN_TURNS = 0.4  # else one whose busiest NIC is >= 40% busy uses it in phases


def _rounds(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:g}"


def bound_by(run: SimRun, *, max_staleness_rounds: float) -> str:
    """Which resource bounds `run`, in words."""
    if run.staleness_bound_rounds > max_staleness_rounds:
        return (f"the staleness limit: {_rounds(run.staleness_bound_rounds)} rounds > "
                f"--max-staleness {_rounds(max_staleness_rounds)} (not eligible)")
    share = run.compute_s_per_round / run.round_time_s if run.round_time_s > 0 else 0.0
    busiest = max(run.max_uplink_utilisation, run.max_downlink_utilisation)
    if share >= COMPUTE_BOUND:
        return f"compute: {100 * share:.0f}% of each round computes"
    if busiest >= NIC_BOUND:
        return f"the NIC: {run.bottleneck} ({100 * share:.0f}% of a round computes)"
    if busiest >= NIC_IN_TURNS:
        return (f"the NIC in turns: {run.bottleneck}; the phases of a round (push and pull, "
                f"or send and wait) take turns instead of overlapping ({100 * share:.0f}% "
                f"of a round computes)")
    return (f"latency and synchronisation: {100 * share:.0f}% of a round computes, the "
            f"busiest NIC is {100 * busiest:.0f}% busy, the rest is waiting "
            f"({format_duration(run.wait_s_per_round)} a round)")


def _terms(setup: Setup, runs: list[SimRun]) -> list[str]:
    """The glossary with this run's numbers."""
    exchange = setup.config.exchange
    n = setup.nodes
    compute_s = setup.compute.mean_s(n)
    lines = ["what the terms mean for this run:"]
    ako = next((run for run in runs if is_partitioned(run.scheme)), None)
    if ako is not None:
        share = setup.gradient_bytes / ako.p
        lines.append(
            f"  p = {ako.p}: each gradient is cut into {ako.p} partitions; each round a "
            f"worker sends one ({format_size(share)} before the codec) to each of its "
            f"{n - 1} peers, so a whole gradient has left after {ako.p} rounds")
        lines.append(
            f"  s = {_rounds(ako.ssp)}: a worker may start round t + 1 while it still misses "
            f"up to {_rounds(ako.ssp)} round(s) of some peer's partitions (s = 0: lockstep)")
        lines.append(
            f"  staleness (Ako) = p - 1 + s = {_rounds(ako.staleness_bound_rounds)} rounds "
            f"(~{format_duration(ako.staleness_bound_rounds * ako.round_time_s)} at "
            f"{format_duration(ako.round_time_s)} a round): the oldest part of another "
            f"worker's gradient a replica can still be missing")
    keys = {key for run in runs for key in scheme_named(run.scheme).keys}  # their knobs
    if "inner_steps" in keys:
        lines.append(
            f"  H = {exchange.inner_steps}: DiLoCo workers take {exchange.inner_steps} local "
            f"optimizer steps, then average their pseudo-gradients (the change since the "
            f"last sync) and take one outer step; staleness H - 1 = "
            f"{exchange.inner_steps - 1} rounds of the others' steps")
    if "fragments" in keys:
        lines.append(
            f"  P = {exchange.fragments}, tau = {exchange.overlap_steps}: Streaming DiLoCo "
            f"syncs one of {exchange.fragments} fragments of the model in turn (one every "
            f"{exchange.inner_steps // max(1, exchange.fragments)} steps) and lets each "
            f"sync overlap {exchange.overlap_steps} inner step(s): staleness H - 1 + tau = "
            f"{exchange.inner_steps - 1 + exchange.overlap_steps} rounds")
    codec = wire_codec(exchange)
    if codec == "none":
        lines.append("  codec none: gradients travel as float32 (4 bytes a value)")
    else:
        lines.append(f"  codec {codec}: gradient-like sends are encoded ({codec}) with error "
                     f"feedback (what is not sent stays in a residual and goes later); "
                     f"parameters and all-gather steps travel as float32")
    lines.append(f"  compute: {format_duration(compute_s)} per round per worker, batch "
                 f"{setup.batch_size}; a round is one local gradient step")
    lines += [f"  {line}" for line in describe_islands(setup.config, setup.batch_size,
                                                       setup.gradient_bytes)]
    return lines


def explain_long(setup: Setup, runs: list[SimRun], *, max_staleness_rounds: float,
                 ranking: Ranking | None = None,
                 learning: LearningRanking | None = None) -> tuple[str, ...]:
    """The longer explanation: the terms for this run, what bounds each configuration, and
    why the winner won (by throughput within the staleness limit, by the ranking of a
    target, or by the default ranking's predicted time to accuracy)."""
    lines = _terms(setup, runs)
    lines.append("what bounds each configuration:")
    width = max((len(run.label) for run in runs), default=0)
    for run in runs:
        bound = bound_by(run, max_staleness_rounds=max_staleness_rounds)
        lines.append(f"  {run.label.ljust(width)}  {bound}")
    plan = setup.plan
    if plan is not None and held_by_staleness(plan):
        lines.append(f"  (Ako's p is held by --max-staleness: {plan.binding})")
    if learning is not None and learning.winner is not None:
        lines += _why_learning(learning, max_staleness_rounds)
    else:
        lines += _why(runs, max_staleness_rounds, ranking)
    return tuple(lines)


def _why_learning(learning: LearningRanking, limit: float) -> list[str]:
    """Why the default ranking's winner won, and what the fastest row learns instead."""
    first = learning.winner
    assert first is not None and first.time_to_target_s is not None
    target = f"{100 * learning.target:.3g}%"
    text = [f"why {first.run.label} wins: it is predicted to reach {target} first "
            f"({format_duration(first.time_to_target_s)}), bound by "
            f"{bound_by(first.run, max_staleness_rounds=limit)}"]
    fit = [row for row in learning.ranked if row.within_limit]
    fastest = max(fit, key=lambda row: row.run.samples_per_s)
    if fastest is not first:
        reached = ("reaches it only in " + format_duration(fastest.time_to_target_s)
                   if fastest.time_to_target_s is not None else "never reaches it")
        text.append(f"  {fastest.run.label} has more samples/s "
                    f"({fastest.run.samples_per_s:,.1f} vs {first.run.samples_per_s:,.1f}) "
                    f"but {reached} (predicted accuracy "
                    f"{100 * fastest.learning.accuracy:.3g}% after {learning.rounds} rounds): "
                    f"staleness or averaging costs it accuracy per sample")
    return text


def _why(runs: list[SimRun], limit: float, ranking: Ranking | None) -> list[str]:
    if ranking is not None and ranking.ranked and (
            ranking.goal.target_accuracy is None or ranking.ranked[0].reached):
        first = ranking.ranked[0]
        goal = ("reaches the target accuracy first" if ranking.goal.target_accuracy is not None
                else "is the most accurate when the time budget ends")
        text = [f"why {first.timing.label} wins: it {goal} in simulated training, bound by "
                f"{bound_by(first.timing, max_staleness_rounds=limit)}"]
        fastest = max((r.timing for r in ranking.ranked), key=lambda run: run.samples_per_s)
        if fastest is not first.timing:
            text.append(f"  {fastest.label} has more samples/s "
                        f"({fastest.samples_per_s:,.1f} vs {first.timing.samples_per_s:,.1f}) "
                        f"but needs more of them: staleness or averaging costs it accuracy "
                        f"per sample")
        return text
    fit = sorted((run for run in runs if run.staleness_bound_rounds <= limit),
                 key=lambda run: -run.samples_per_s)
    if not fit:
        return [f"why no winner: every configuration is staler than --max-staleness "
                f"{_rounds(limit)}"]
    best = fit[0]
    text = [f"why {best.label} wins: the most samples/s ({best.samples_per_s:,.1f}) within "
            f"--max-staleness {_rounds(limit)}, bound by "
            f"{bound_by(best, max_staleness_rounds=limit)}"]
    if len(fit) > 1:
        second = fit[1]
        text.append(f"  runner-up {second.label}: {second.samples_per_s:,.1f} samples/s "
                    f"({best.samples_per_s / second.samples_per_s:.3g}x less), bound by "
                    f"{bound_by(second, max_staleness_rounds=limit)}; it sends "
                    f"{format_size(second.bytes_sent_per_worker_per_round)} per worker per "
                    f"round against "
                    f"{format_size(best.bytes_sent_per_worker_per_round)}")
    kind = scheme_named(best.scheme)
    if kind.partitioned:
        text.append("  Ako spreads each gradient over p rounds, so its sends overlap compute "
                    "instead of stopping it; the price is staleness p - 1 + s")
    return text
