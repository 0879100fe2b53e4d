"""Each scheme's few configurations worth training: its staleness/throughput Pareto set.

The ranking by accuracy (akosim.planning.accuracy_ranking) cannot train every
configuration, and the one of the highest throughput is often not the one that
learns fastest: a stale gradient buys samples/s with accuracy per sample (Ako
p=45, s=20 on 8 workers at 10 Mbit/s reaches 35% of digits in 300 rounds, p=16,
s=1 89%). So for every scheme with a staleness/throughput trade-off this module
times a short ladder of its settings and keeps up to three points of the
Pareto front (less stale, or more samples/s): the throughput-best within
``--max-staleness``, the least stale whose samples/s are within
`SLOWER_AT_MOST` of it, and the one between them (staleness nearest their
geometric mean).

The trade-off is found through the Scheme objects, never by a scheme's name:
a `Scheme.partitioned` scheme (Ako) trades through p and s (p halved down to 1
from the comparison's p; s = 0, 1 and the s chosen to overlap sends with
compute); any other scheme through each integer key of `Scheme.keys` whose
value changes `Scheme.staleness_bound` (DiLoCo's H, Streaming DiLoCo's H and
tau; a parameter server in sync mode has none), each knob stepped alone over
0, 1, 2, 4, ... and its configured value, as `Scheme.check_exchange` allows.
A scheme without such a knob keeps its comparison rows (the parameter server's
server counts), filtered to the front as well.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from akocore.planner import overlap_ssp
from akocore.schemes.protocol import Scheme
from akocore.schemes.registry import has_servers, is_partitioned, scheme_named
from akosim.planning.advice import plan_inputs, slowest_latency_s
from akosim.sim.engine import StopRule
from akosim.sim.scenario import Setup, SimRun, Variant, ako_variant, simulate

if TYPE_CHECKING:
    from akocore.settings.schema import ExchangeConfig

SLOWER_AT_MOST = 4.0  # the least stale candidate has at least 1/4 of the best's samples/s
SAME_SPEED = 0.02  # a more stale point must beat every less stale one by more than 2%
CANDIDATES_PER_SCHEME = 3
PERIODS_TIMED = 3  # a knob's timing run covers at least this many of its periods


@dataclass(frozen=True)
class Candidate:
    """One configuration to train: the setup and variant it runs and its timing run."""

    setup: Setup
    variant: Variant
    timing: SimRun


def exchange_settings(setup: Setup, variant: Variant) -> dict[str, Any]:
    """The exchange settings (TOML keys) of one configuration: the setup's exchange with
    the variant's scheme, p, s and server count; what ``akorun launch --plan`` runs."""
    from akocore.settings.toml_io import config_to_dict

    exchange = dict(config_to_dict(setup.config)["exchange"])
    exchange["scheme"] = variant.scheme
    exchange["ssp"] = variant.ssp
    if is_partitioned(variant.scheme):
        p_of = tuple(variant.p_of)
        exchange["p"] = list(p_of[:1] if len(set(p_of)) == 1 else p_of)
    if has_servers(variant.scheme):
        exchange["ps_servers"] = variant.ps_servers
    return exchange


def variant_of(run: SimRun) -> Variant:
    """The configuration a comparison row simulated, to simulate it again (training)."""
    p_of = tuple(run.p_of) if is_partitioned(run.scheme) else (1,)
    return Variant(run.scheme, p_of=p_of, ps_servers=run.ps_servers, ssp=run.ssp,
                   label=run.label, p_reason=run.p_reason)


def pareto_candidates(setup: Setup, runs: list[SimRun], *, max_staleness_rounds: float,
                      training_rounds: int | None = None,
                      announce: Callable[[str], None] | None = None) -> list[Candidate]:
    """Up to `CANDIDATES_PER_SCHEME` configurations of every scheme of `runs` (in the
    comparison's order), each within `max_staleness_rounds`: the comparison's rows and
    the scheme's ladder timed here, reduced to the Pareto front, then `pick`ed; then each
    setting of the scheme's `plan_grid`, timed and kept as it is (up to
    `CANDIDATES_PER_SCHEME` plus the grid's size in all). A ladder
    setting whose period (DiLoCo: H) does not fit `PERIODS_TIMED` times into
    `training_rounds` is left out: it would hardly sync while it trains."""
    chosen: list[Candidate] = []
    for name in dict.fromkeys(run.scheme for run in runs):
        scheme = scheme_named(name)
        rows = [Candidate(setup, variant_of(run), run) for run in runs if run.scheme == name]
        ladder = _fits(scheme, _ladder(setup, scheme, rows, max_staleness_rounds),
                       training_rounds)
        grid = _fits(scheme, _grid(setup, scheme, max_staleness_rounds), training_rounds)
        retimed = [row for row in rows if _timing_setup(setup, scheme, row.variant)
                   is not setup and row.timing.staleness_bound_rounds <= max_staleness_rounds]
        if (ladder or retimed or grid) and announce is not None:
            announce(f"akosim: timing {len(ladder) + len(retimed) + len(grid)} "
                     f"configuration(s) of {name} for the ranking")
        points = [_timed(row.setup, scheme, row.variant) if row in retimed else row
                  for row in rows]
        points += [_timed(s, scheme, v) for s, v in ladder]
        chosen += pick(front(points, max_staleness_rounds=max_staleness_rounds))
        chosen += [_timed(s, scheme, v) for s, v in grid]
    return chosen


def _fits(scheme: Scheme, settings: Iterable[tuple[Setup, Variant]],
          training_rounds: int | None) -> list[tuple[Setup, Variant]]:
    """The settings whose period comes round `PERIODS_TIMED` times in the training."""
    return [(s, v) for s, v in settings if training_rounds is None or PERIODS_TIMED
            * scheme.period_rounds(s.config.exchange) <= training_rounds]


def front(points: Iterable[Candidate], *, max_staleness_rounds: float) -> list[Candidate]:
    """The points within the limit that no other beats on both staleness and samples/s,
    least stale first (a more stale point must be more than `SAME_SPEED` faster)."""
    within = [c for c in points if c.timing.staleness_bound_rounds <= max_staleness_rounds]
    within.sort(key=lambda c: (c.timing.staleness_bound_rounds, -c.timing.samples_per_s))
    kept: list[Candidate] = []
    for point in within:
        if not kept or point.timing.samples_per_s > (1 + SAME_SPEED) * max(
                k.timing.samples_per_s for k in kept):
            kept.append(point)
    return kept


def pick(pareto: list[Candidate]) -> list[Candidate]:
    """Of a front (least stale first): the throughput-best, the least stale within
    `SLOWER_AT_MOST` of it, and the one whose staleness is nearest their geometric mean;
    throughput-best first."""
    if not pareto:
        return []
    best = pareto[-1]
    floor = best.timing.samples_per_s / SLOWER_AT_MOST
    least = next(c for c in pareto if c.timing.samples_per_s >= floor)
    picked = [best]
    if least is not best:
        low = least.timing.staleness_bound_rounds + 1
        high = best.timing.staleness_bound_rounds + 1
        middle_at = math.sqrt(low * high)
        between = [c for c in pareto if c is not best and c is not least
                   and c.timing.samples_per_s >= floor]
        if between and CANDIDATES_PER_SCHEME >= 3:
            picked.append(min(between, key=lambda c: abs(
                math.log((c.timing.staleness_bound_rounds + 1) / middle_at))))
        picked.append(least)
    return picked


# ------------------------------------------------------------------ the ladders


def _ladder(setup: Setup, scheme: Scheme, known: list[Candidate],
            limit: float) -> Iterable[tuple[Setup, Variant]]:
    """The settings of `scheme` to time beside its comparison rows, each within `limit`."""
    if scheme.partitioned:
        yield from _partitioned_ladder(setup, scheme, known, limit)
        return
    exchange = setup.config.exchange
    seen = {_bound(scheme, setup, 1, exchange.ssp)}
    for key, values in _knobs(scheme, setup).items():
        for value in values:
            changed = _with(setup, **{key: value})
            bound = _bound(scheme, changed, 1, exchange.ssp)
            if bound > limit or bound in seen:
                continue
            seen.add(bound)
            label = scheme.variant_label(changed.config.exchange)
            yield changed, Variant(scheme.name, label=label)


def _grid(setup: Setup, scheme: Scheme, limit: float) -> Iterable[tuple[Setup, Variant]]:
    """The scheme's own `plan_grid`: each value of a knob that trades bytes against
    learning (the staleness bound does not show it), changed alone, within `limit`. These
    are ranked by the training runs, never pruned by the staleness/throughput front."""
    exchange = setup.config.exchange
    labels = {scheme.variant_label(exchange)}
    for key, values in scheme.plan_grid(exchange).items():
        for value in values:
            try:
                scheme.check_exchange(_exchange_with(exchange, key, value))
            except ValueError:
                continue
            changed = _with(setup, **{key: value})
            label = scheme.variant_label(changed.config.exchange)
            if label in labels or _bound(scheme, changed, 1, exchange.ssp) > limit:
                continue
            labels.add(label)
            yield changed, Variant(scheme.name, label=label)


def _knobs(scheme: Scheme, setup: Setup) -> dict[str, list[int]]:
    """The integer keys of `scheme` that change its staleness bound, each with the values
    to try (0, 1, 2, 4, ... up to 64 and the configured one) that its checks accept."""
    exchange = setup.config.exchange
    knobs: dict[str, list[int]] = {}
    for key in scheme.keys:
        value = getattr(exchange, key, None)
        if not isinstance(value, int) or isinstance(value, bool):
            continue
        try:  # a value the scheme's checks refuse (sparseloco's bits) moves no bound
            probe = _exchange_with(exchange, key, value * 2 + 1)
        except ValueError:
            continue
        if scheme.staleness_bound(probe, p_max=1, ssp=exchange.ssp) == \
                scheme.staleness_bound(exchange, p_max=1, ssp=exchange.ssp):
            continue
        values = []
        for candidate in sorted({0, 1, *(2 ** k for k in range(1, 7)), value}):
            try:
                scheme.check_exchange(_exchange_with(exchange, key, candidate))
            except ValueError:
                continue
            values.append(candidate)
        knobs[key] = values
    return knobs


def _partitioned_ladder(setup: Setup, scheme: Scheme, known: list[Candidate],
                        limit: float) -> Iterable[tuple[Setup, Variant]]:
    """p halved from the comparison's largest down to 1, each with s = 0, 1 and the s
    that overlaps its sends with compute."""
    top = max((c.timing.p for c in known), default=1)
    seen = {(c.timing.p, c.timing.ssp) for c in known}
    p = top
    inputs, latency_s = plan_inputs(setup), slowest_latency_s(setup)
    while True:
        overlap = overlap_ssp(inputs, (p,) * setup.nodes, latency_s)
        for ssp in sorted({0, 1, overlap}):
            if (p, float(ssp)) in seen or _bound(scheme, setup, p, ssp) > limit:
                continue
            seen.add((p, float(ssp)))
            given = _with(setup, ssp=float(ssp))
            variant = ako_variant(given, (p,), label=f"{scheme.name} p={p} s={ssp}")
            yield given, variant
        if p == 1:
            return
        p = max(1, math.ceil(p / 2))


def _bound(scheme: Scheme, setup: Setup, p_max: int, ssp: float) -> float:
    return scheme.staleness_bound(setup.config.exchange, p_max=p_max, ssp=ssp)


def _exchange_with(exchange: ExchangeConfig, key: str, value: Any) -> ExchangeConfig:
    changes: dict[str, Any] = {key: value}
    return replace(exchange, **changes)


def _with(setup: Setup, **exchange_values: Any) -> Setup:
    """`setup` with some exchange settings changed (the planner's p kept)."""
    exchange = setup.config.exchange
    for key, value in exchange_values.items():
        exchange = _exchange_with(exchange, key, value)
    return replace(setup, config=replace(setup.config, exchange=exchange))


def _timed(setup: Setup, scheme: Scheme, variant: Variant) -> Candidate:
    return Candidate(setup, variant, simulate(_timing_setup(setup, scheme, variant), variant))


def _timing_setup(setup: Setup, scheme: Scheme, variant: Variant) -> Setup:
    """`setup` timed long enough for a steady state: at least `PERIODS_TIMED` of the
    scheme's periods and twice its lead (Scheme.lead_rounds: a worker may run that far
    ahead before the network holds it back); `setup` itself when its rounds suffice or it runs
    each configuration until its round time settles (akosim.sim.settling)."""
    if setup.stop.settle is not None:
        return setup
    exchange = setup.config.exchange
    lead = scheme.lead_rounds(exchange, p_max=max(variant.p_of), ssp=variant.ssp)
    needed = max(PERIODS_TIMED * scheme.period_rounds(exchange),
                 2 * math.ceil(lead + 1) if math.isfinite(lead) else 0)
    rounds = setup.stop.rounds or 0
    if rounds >= needed:
        return setup
    return replace(setup, stop=StopRule(rounds=needed, duration_s=setup.stop.duration_s,
                                        drain=setup.stop.drain))
