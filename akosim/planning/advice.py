"""The plan a user can act on: s chosen with p, and the answer in one line.

akocore.planner chooses p so that one round's sends take about u x compute;
that only pays off when the sends overlap the next round's compute, which a
staleness bound s = 0 forbids. `with_overlap_ssp` picks the smallest s that
lets them overlap (unless some layer set ``exchange.ssp``). `within_staleness`
holds p = auto within ``--max-staleness``: the largest p whose staleness bound
(the scheme's, p - 1 + s with s chosen for that p) fits, the NIC then pacing
the rounds; the held p names ``--max-staleness`` as its bound. `explain` says
what the chosen Ako run means: round time, NIC use, how many rounds and
seconds until a round's gradient has reached every peer (p - 1 + s rounds),
and which constraint bound p; when that exceeds ``--max-staleness`` it says
so and lists the cheapest ways out, each quantified (a larger batch, faster
links, fewer workers) and the best baseline of the comparison within the bound;
when the limit held p, how to let p keep up (the same levers).
`recommend` names the comparison's winner: the highest throughput among the runs
whose staleness bound passes ``--max-staleness`` (never one that fails it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from akocore.planner import Plan, PlanInputs, overlap_ssp, ways_out
from akocore.resolve import coded_gradient_bytes, network_arrays
from akocore.schemes.registry import is_partitioned, scheme_named
from akocore.units import format_duration
from akosim.sim.scenario import Setup, SimRun

MAX_STALENESS_ROUNDS = 64  # --max-staleness default: a gradient older than this is news


def plan_inputs(setup: Setup) -> PlanInputs:
    config = setup.config
    n = setup.nodes
    arrays = network_arrays(config)
    return PlanInputs(
        workers=n, gradient_bytes=coded_gradient_bytes(config, setup.gradient_bytes,
                                                        setup.length),
        compute_s=tuple(setup.compute.round_busy_s(i) for i in range(n)),
        uplink_bps=tuple(arrays.uplink_bps), downlink_bps=tuple(arrays.downlink_bps),
        link_bps=tuple(map(tuple, arrays.link_bps)), utilisation=config.exchange.utilisation,
        p_max=config.exchange.p_max, length=setup.length, staleness=config.exchange.ssp)


def chosen_plan(setup: Setup) -> Plan:
    """The planner's answer for the configured p (the setup's, resolved once)."""
    return setup.configured_plan()


def slowest_latency_s(setup: Setup) -> float:
    """The slowest link's latency plus the largest per-message overhead."""
    arrays = network_arrays(setup.config)
    off_diagonal = arrays.latency_s[~np.eye(setup.nodes, dtype=bool)]
    latency_s = float(off_diagonal.max()) if off_diagonal.size else 0.0
    return latency_s + max(setup.message_overhead_s, default=0.0)


def with_overlap_ssp(setup: Setup) -> Setup:
    """`setup` with s = the smallest staleness bound that lets sending overlap compute."""
    plan = chosen_plan(setup)
    ssp = overlap_ssp(plan_inputs(setup), plan.p_of, slowest_latency_s(setup))
    exchange = replace(setup.config.exchange, ssp=float(ssp))
    return replace(setup, config=replace(setup.config, exchange=exchange),
                   plan=replace(plan, staleness=float(ssp)))


STALENESS_BOUND = "--max-staleness"  # how a p held within the limit names its bound


def within_staleness(setup: Setup, max_staleness_rounds: float, *, choose_ssp: bool) -> Setup:
    """`setup` with p = auto held within `max_staleness_rounds`: the largest p whose
    staleness bound (the scheme's `staleness_bound`, p - 1 + s for Ako) fits, s being the
    one the plan runs with (chosen with that p when `choose_ssp`, else the configured one).

    Unchanged when p was given, when the planner's p already fits, or when not even p = 1
    fits (the advice then says how stale it is). A held p leaves the NIC the bottleneck;
    its reason says so and how large a p the network needs (`Plan.required_p` keeps that).
    """
    exchange = setup.config.exchange
    scheme = scheme_named(exchange.scheme)
    if not scheme.partitioned or isinstance(exchange.p, tuple):
        return setup
    plan = chosen_plan(setup)
    inputs, latency_s = plan_inputs(setup), slowest_latency_s(setup)

    def bound(p_of: tuple[int, ...]) -> float:
        ssp = overlap_ssp(inputs, p_of, latency_s) if choose_ssp else exchange.ssp
        return scheme.staleness_bound(exchange, p_max=max(p_of), ssp=ssp)

    if bound(plan.p_of) <= max_staleness_rounds:
        return setup
    start = int(min(plan.p, max(1, math.floor(max_staleness_rounds + 1))))
    for p in range(start, 0, -1):
        p_of = tuple(min(q, p) for q in plan.p_of)
        if bound(p_of) <= max_staleness_rounds:
            break
    else:
        return setup
    reasons = tuple(
        f"{STALENESS_BOUND} {_rounds(max_staleness_rounds)} (the network needs "
        f"p={math.ceil(required - 1e-9)}; {reason} stays saturated)" if held < q else reason
        for held, q, required, reason in zip(p_of, plan.p_of, plan.required_p, plan.bound_by,
                                              strict=True))
    return replace(setup, plan=replace(plan, p_of=p_of, bound_by=reasons))


def held_by_staleness(plan: Plan) -> bool:
    """Whether `within_staleness` held this plan's p below what the network needs."""
    return plan.binding.startswith(STALENESS_BOUND)


@dataclass(frozen=True)
class Explanation:
    """What the chosen Ako run means, in the user's units."""

    line: str
    ssp: float
    propagation_rounds: float
    propagation_s: float
    max_staleness_rounds: float
    advice: tuple[str, ...]


def explain(setup: Setup, runs: list[SimRun], *, ssp_chosen: bool,
            max_staleness_rounds: float = MAX_STALENESS_ROUNDS) -> Explanation | None:
    """The one line (and the ways out when propagation is too slow) for the first Ako run
    whose p the planner chose; None when there is none (a given p, or no Ako run)."""
    ako = next((run for run in runs if is_partitioned(run.scheme)), None)
    if ako is None:
        return None
    plan = chosen_plan(setup)
    propagation_rounds = ako.p - 1 + ako.ssp
    propagation_s = propagation_rounds * ako.round_time_s
    s_words = "chosen so sends overlap compute" if ssp_chosen else "given"
    why = "given" if ako.p_reason in ("", "given") else ako.p_reason
    line = (f"plan: Ako p={ako.p}, s={_rounds(ako.ssp)} ({s_words}): rounds of "
            f"{format_duration(ako.round_time_s)}, NIC {100 * ako.nic_utilisation:.0f}% busy; "
            f"a gradient reaches every peer within {_rounds(propagation_rounds)} rounds "
            f"({format_duration(propagation_s)}); p bound by {why}")
    advice: list[str] = []
    too_stale = math.isfinite(propagation_rounds) and propagation_rounds > max_staleness_rounds
    if too_stale:
        advice.append(f"too stale: {_rounds(propagation_rounds)} rounds > --max-staleness "
                      f"{_rounds(max_staleness_rounds)}; the network cannot carry more of "
                      f"each gradient per round. Cheapest ways out:")
        ways = ways_out(plan_inputs(setup), replace(plan, staleness=ako.ssp),
                        max_staleness_rounds, setup.batch_size)
        advice += [f"  - {way.text}" for way in ways]
    elif held_by_staleness(plan):
        needed = max(math.ceil(r - 1e-9) for r in plan.required_p)
        advice.append(f"p held to {ako.p} by --max-staleness {_rounds(max_staleness_rounds)} "
                      f"(the network needs p={needed} to keep up with compute): Ako's rounds "
                      f"wait for the NIC. To run at compute speed within that bound:")
        ways = ways_out(plan_inputs(setup), replace(plan, p_of=(needed,) * len(plan.p_of),
                                                    staleness=ako.ssp),
                        max_staleness_rounds, setup.batch_size)
        advice += [f"  - {way.text}" for way in ways]
    if advice:
        others = [run for run in runs if not is_partitioned(run.scheme)
                  and run.staleness_bound_rounds <= max_staleness_rounds]
        best = max(others, key=lambda run: run.samples_per_s) if others else None
        if best is not None and (too_stale or best.samples_per_s > ako.samples_per_s):
            ratio = best.samples_per_s / ako.samples_per_s
            stale = ("with no staleness" if best.staleness_bound_rounds == 0 else
                     f"with staleness <= {_rounds(best.staleness_bound_rounds)} rounds")
            advice.append(f"  - or {best.label}: {best.samples_per_s:,.1f} samples/s {stale} "
                          f"({ratio:.2g}x Ako's {ako.samples_per_s:,.1f})")
    return Explanation(line, ako.ssp, propagation_rounds, propagation_s, max_staleness_rounds,
                       tuple(advice))


def _rounds(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:g}"


GLOSSARY = ("p = partitions of each gradient (one is sent per round), s = rounds a worker "
            "may run ahead of the slowest (SSP), H = local steps between DiLoCo syncs; "
            "staleness = rounds of the other workers' updates a replica can miss")


def recommend(runs: list[SimRun], *, max_staleness_rounds: float) -> tuple[str, ...]:
    """The comparison's winner in two lines: the run of the highest throughput among those
    within `max_staleness_rounds` (never one that fails that check), and what p, s, H and
    staleness mean; () for fewer than two runs."""
    if len(runs) < 2:
        return ()
    fit = [run for run in runs if run.staleness_bound_rounds <= max_staleness_rounds]
    if not fit:
        return (f"recommend: none of these runs keeps staleness within --max-staleness "
                f"{_rounds(max_staleness_rounds)} rounds", GLOSSARY)
    best = max(fit, key=lambda run: run.samples_per_s)
    return (f"recommend: {best.label}: {best.samples_per_s:,.1f} samples/s, staleness <= "
            f"{_rounds(best.staleness_bound_rounds)} rounds (within --max-staleness "
            f"{_rounds(max_staleness_rounds)}): the highest throughput within that bound",
            GLOSSARY)
