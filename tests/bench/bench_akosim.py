"""akosim figures: how long the issue's simulations take, each as a multiple of a
reference of its own kind timed beside it.

Event work (the timing-only simulations) is divided by a bare SimPy loop
(1,000 processes x 200 env.timeout()); training, whose CPU goes mostly to JAX
gradient steps, by a plain jitted JAX step (tests/bench/bench_core.py's MLP
gradient at the digits workload's size, a fixed number of steps). Each case
is timed `REPEATS` times, each time back to back with its reference
(common.paired: CPU time of this process, which other jobs on a shared
machine disturb far less than wall time), and the figure is the median of the
paired ratios (the verdict uses their interval, tests/bench/verdict.py).
The goals are on the CPU seconds, which equal the wall seconds on a quiet
machine.

Timing-only cases use the seed CNN's gradient (4,263,434 float32 = 17.05 MB),
0.3 s of compute per round and lockstep rounds (ssp 0), Ako with p auto, and
stop after the last round without draining (StopRule(drain=False)):

* 64 workers x 1,000 rounds on 40 Mbit/s NICs (goal <= 3 s);
* the same 64 workers with a per-pair cap drawn at random for every pair
  (seeded; 10..40 Mbit/s, the range of the seeds' heterogeneous WAN, under
  1 Gbit/s NICs, so the caps bind and every flow has its own rate; goal
  <= 30 s for 1,000 rounds): the paired figure on 10 rounds; the 1,000-round
  seconds (`..._1000r_est_vs_simpy`, the goal's figure, in CPU s and as a multiple
  of the bare SimPy loop) estimated with one longer run (the cost of a round from
  the difference of the two, so setup counts once);
* 1,024 workers x 100 rounds on 40 Mbit/s NICs (goal <= 30 s), the same way:
  paired on 10 rounds, 100 rounds (`sim.ako1024_100r_est_vs_simpy`) from the
  difference with one 20-round run;
* ring all-reduce, 64 workers (one message per ring step: the per-message path).

Before anything is timed, the compiled solver is loaded and run once
(akosim.network.fluid.warm_compiled; `sim.compiled_kernels_warm_cpu_s`): with
numba's cache cold its one-time compile would otherwise count as the cost of
the rounds it happens in.

Training mode: 16 workers really train the default workload (digits-mlp) until
90% test accuracy (goal <= 60 s, workload build and compute measurement included).

To compare this tree with another revision on one of these cases, side by
side in one run (and check that round times agree): `python -m
tests.bench.akosim_ab REV --case random|homog64|big1024`.

Event throughput: network flow completions plus message deliveries per CPU
second, as a ratio to the bare SimPy loop's events per
second. A delivered multicast or a coalesced completion of many flows is one
SimPy event but many simulated events, so the ratio can exceed 1.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import simpy

from akocore.settings.schema import ClusterConfig, RunConfig, TrainConfig
from akocore.settings.toml_io import config_from_dict
from akosim.network.fluid import warm_compiled
from akosim.planning.compute import ComputeModel, measure_compute_s
from akosim.sim.engine import StopRule
from akosim.sim.scenario import Setup, SimRun, Variant, ako_variant, simulate
from tests.bench.common import Figure, Pairs, best_of, paired

SEED_CNN_LENGTH = 4_263_434  # float32 values: 17.05 MB
COMPUTE_S = 0.3
BATCH = 104
# akosim --coalesce for the random-link case: every message may finish up to 3% of
# its own transfer time early, in exchange for far fewer distinct rate changes.
COARSE_COALESCE = 0.03
# Rounds of the paired runs of the long cases, and of the one longer run each
# whose difference gives the cost of a round (extrapolated to the goal's rounds).
SHORT_ROUNDS = 10
RANDOM_LONG_ROUNDS = 30
BIG_LONG_ROUNDS = 20
# Why the two estimated goals miss, where they do (the measured breakdown, in the benchmark
# reference page): kept in one place so the summary and the docs say the same.
RANDOM_LINKS_GAP = (
    "every one of ~395 rate solves a round touches all ~2,500 flows in flight (their finish "
    "times are recomputed and the settled checks sum over all flows): an incremental solve "
    "that skips unchanged flows changes the last bits of the recorded cases, which must stay "
    "bit-identical")
BIG_CLUSTER_GAP = (
    "every delivery of 1,024 senders' flows is one SimPy event through a Python path: "
    "26.7 CPU s for the full 100 rounds on a quiet machine, more under load (batched "
    "deliveries are not built)")
REPEATS = 3  # paired repetitions of each case (the verdict's interval is [min, max])
# The reference every event-work figure is divided by: a bare SimPy loop.
BARE_PROCESSES = 1_000
BARE_TIMEOUTS = 200
BARE_EVENTS = BARE_PROCESSES * BARE_TIMEOUTS
# The plain JAX reference of the training figure: steps of a jitted MLP gradient.
PLAIN_JAX_STEPS = 10_000  # about 0.5 CPU s
# The machine's speed drifts (on an idle machine the bare loop took 0.22 to 0.45 CPU
# s from one moment to the next, 2026-11-23); pairing and the interval absorb most of
# it, so a cost regresses past +60% of its baseline on the whole interval; the
# deliberate regression (a 1 ms busy loop in the fluid wake-up) cost +171% to +595%.
COST_TOLERANCE = 0.6


def timing_setup(workers: int, rounds: int, *, bandwidth: str = "40mbps",
                 link_matrix: list[list[float]] | None = None) -> Setup:
    network: dict[str, object] = {"bandwidth": bandwidth}
    if link_matrix is not None:
        network["link_bandwidth_matrix"] = [  # units are required in config tables
            ["inf" if math.isinf(cap) else f"{float(cap)!r}bps" for cap in row]
            for row in link_matrix]
    config = config_from_dict({
        "cluster": {"workers": workers}, "network": network,
        "exchange": {"scheme": "ako", "p": "auto", "ssp": 0},
        "train": {"workload": "synthetic-cnn", "batch_size": BATCH, "rounds": rounds}})
    return Setup(config, SEED_CNN_LENGTH, ComputeModel(COMPUTE_S), BATCH,
                 StopRule(rounds=rounds, drain=False))


def random_links(workers: int, seed: int = 0, low_bps: float = 10e6,
                 high_bps: float = 40e6) -> list[list[float]]:
    """A symmetric per-pair cap matrix, uniform in [low, high], inf on the diagonal."""
    rng = np.random.default_rng(seed)
    caps = np.triu(rng.uniform(low_bps, high_bps, size=(workers, workers)), 1)
    caps = caps + caps.T
    np.fill_diagonal(caps, np.inf)
    return caps.tolist()


def timed(setup: Setup, variant: Variant | None = None,
          repeats: int = 1) -> tuple[float, float, SimRun]:
    """(least wall seconds, least CPU seconds of this process) of `repeats` whole
    simulate() calls (planning, run, report), and the last run."""
    best_wall_s = best_cpu_s = float("inf")
    for _ in range(repeats):
        wall_from, cpu_from = time.perf_counter(), time.process_time()
        run = simulate(setup, variant or ako_variant(setup))
        best_cpu_s = min(best_cpu_s, time.process_time() - cpu_from)
        best_wall_s = min(best_wall_s, time.perf_counter() - wall_from)
    return best_wall_s, best_cpu_s, run


def events(run: SimRun) -> int:
    return run.events["flow_completions"] + run.events["deliveries"]


def bare_simpy_loop() -> None:
    """The event-work reference: a bare SimPy loop of BARE_EVENTS timeouts."""
    env = simpy.Environment()

    def proc(env: simpy.Environment):
        for _ in range(BARE_TIMEOUTS):
            yield env.timeout(1.0)

    for _ in range(BARE_PROCESSES):
        env.process(proc(env))
    env.run()


def bare_simpy_loop_s() -> float:
    """CPU seconds of the bare SimPy loop (best of 3)."""
    return best_of(3, bare_simpy_loop, clock=time.process_time)


def plain_jax_steps() -> Callable[[], object]:
    """The JAX-work reference: PLAIN_JAX_STEPS steps of a plain jitted MLP gradient at
    the digits workload's size (compiled here, outside the timing)."""
    from tests.bench.bench_core import plain_jax_step

    step = plain_jax_step(32, 64, 64)

    def steps() -> None:
        for _ in range(PLAIN_JAX_STEPS):
            step()
    return steps


def train_to_accuracy(workers: int = 16,
                      target: float = 0.9) -> tuple[float, float, SimRun]:
    """Wall and CPU seconds to build the default workload, time its step and train
    to `target`, and the run."""
    from akocore.workloads.flat import build_workload

    wall_from, cpu_from = time.perf_counter(), time.process_time()
    config = RunConfig(cluster=ClusterConfig(workers=workers),
                       train=TrainConfig(rounds=10_000, target_accuracy=target))
    train = config.train
    workload = build_workload(train.workload, batch_size=train.batch_size, seed=train.seed)
    compute = ComputeModel(measure_compute_s(workload))
    setup = Setup(config, workload.param_count, compute, train.batch_size,
                  StopRule(rounds=train.rounds, drain=True))
    run = simulate(setup, ako_variant(setup), workload=workload, eval_every=train.eval_every,
                   target_accuracy=target)
    return time.perf_counter() - wall_from, time.process_time() - cpu_from, run


class Case:
    """One simulation, run by `paired` (its last run and wall seconds kept)."""

    def __init__(self, setup: Setup, variant: Variant | None = None) -> None:
        self.setup, self.variant = setup, variant
        self.runs: list[SimRun] = []
        self.wall_s: list[float] = []

    def __call__(self) -> None:
        wall_s, _, run = timed(self.setup, self.variant)
        self.runs.append(run)
        self.wall_s.append(wall_s)


def per_round_extrapolated_s(short_s: float, short_rounds: int, long_s: float,
                             long_rounds: int, goal_rounds: int) -> float:
    """Seconds of `goal_rounds` from two runs: setup once, then the cost of a round
    (the difference of the two over their difference in rounds)."""
    per_round_s = max(long_s - short_s, 0.0) / (long_rounds - short_rounds)
    return short_s + per_round_s * (goal_rounds - short_rounds)


def run() -> list[Figure]:
    figures: list[Figure] = []
    # numba's one-time cost (compiling on a fresh machine, loading its cache after)
    # is paid here, so every figure below is the steady cost of the rounds it times.
    warm_from = time.process_time()
    warm_compiled()
    warm_cpu_s = time.process_time() - warm_from
    figures.append(Figure("sim.compiled_kernels_warm_cpu_s", warm_cpu_s, "CPU s",
                          higher_is_better=False, tolerance=None,
                          note="loading (or, with numba's cache cold, compiling) the compiled "
                               "solver once, before anything is timed"))
    bare_s = bare_simpy_loop_s()
    figures.append(Figure("sim.bare_simpy_loop_cpu_s", bare_s, "CPU s", higher_is_better=False,
                          tolerance=None,
                          note=f"the event-work reference: {BARE_EVENTS:,} env.timeout() in "
                               f"{BARE_PROCESSES:,} processes, best of 3 "
                               f"({BARE_EVENTS / bare_s:,.0f} events/s)"))

    def cost(name: str, pairs: Pairs, goal_s: float | None, goal_cpu_s: float | None,
             note: str, reference: str = "bare SimPy loop") -> Figure:
        ratios = pairs.ratios()
        return Figure(name, statistics.median(ratios), f"x {reference}",
                      higher_is_better=False, goal=goal_s, absolute=goal_cpu_s,
                      absolute_unit="CPU s", tolerance=COST_TOLERANCE, samples=ratios,
                      reference=reference,
                      note=f"{note}; case {pairs.median_case_s():.2f} CPU s, reference "
                           f"{pairs.median_reference_s():.3f} CPU s (medians of {REPEATS})")

    def estimate(name: str, cpu_s: float, goal_s: float, note: str,
                 known_gap: str = "") -> Figure:
        """A goal's seconds estimated from the paired runs, as a multiple of the bare SimPy
        loop timed in this run (informational: the paired figure beside it is the one a
        regression is judged on)."""
        return Figure(name, cpu_s / bare_s, "x bare SimPy loop", higher_is_better=False,
                      goal=goal_s, absolute=cpu_s, absolute_unit="CPU s", tolerance=None,
                      reference="bare SimPy loop", note=note, known_gap=known_gap)

    def event_ratio(name: str, pairs: Pairs, run: SimRun, note: str) -> Figure:
        ratios = tuple(events(run) / case_s * reference_s / BARE_EVENTS
                       for case_s, reference_s in zip(pairs.case_s, pairs.reference_s,
                                                      strict=True))
        per_s = events(run) / pairs.median_case_s()
        return Figure(name, statistics.median(ratios), "ratio", tolerance=COST_TOLERANCE,
                      samples=ratios, reference="bare SimPy loop",
                      note=f"{per_s:,.0f} flow completions + deliveries per CPU s; {note}")

    homog = Case(timing_setup(64, 1_000))
    pairs = paired(homog, bare_simpy_loop, REPEATS)
    last = homog.runs[-1]
    figures += [
        cost("sim.ako64_homog_1000r_vs_simpy", pairs, 3.0, pairs.median_case_s(),
             f"{last.label}, 40 Mbit/s, round {last.round_time_s:.3f} s, "
             f"{last.events['rate_solves']} rate solves"),
        event_ratio("sim.ako64_homog_events_vs_simpy", pairs, last, "64 x 1,000 homogeneous"),
    ]

    links = random_links(64)
    random = Case(timing_setup(64, SHORT_ROUNDS, bandwidth="1gbps", link_matrix=links))
    pairs = paired(random, bare_simpy_loop, REPEATS)
    long_wall_s, long_cpu_s, long_run = timed(
        timing_setup(64, RANDOM_LONG_ROUNDS, bandwidth="1gbps", link_matrix=links))
    goal_cpu_s = per_round_extrapolated_s(pairs.median_case_s(), SHORT_ROUNDS, long_cpu_s,
                                          RANDOM_LONG_ROUNDS, 1_000)
    figures += [
        cost(f"sim.ako64_random_links_{SHORT_ROUNDS}r_vs_simpy", pairs, None, None,
             f"{long_run.label}, caps U(10,40) Mbit/s per pair under 1 Gbit/s NICs"),
        estimate("sim.ako64_random_links_1000r_est_vs_simpy", goal_cpu_s, 30.0,
                 f"64 x 1,000 random per-pair caps, estimated: the paired {SHORT_ROUNDS}-round "
                 f"median plus the cost of a round from one {RANDOM_LONG_ROUNDS}-round run "
                 f"({long_cpu_s:.1f} CPU s, {long_wall_s:.1f} s wall, "
                 f"{long_run.events['rate_solves']} rate solves)",
                 known_gap=RANDOM_LINKS_GAP),
        event_ratio(f"sim.ako64_random_links_{SHORT_ROUNDS}r_events_vs_simpy", pairs,
                    random.runs[-1], f"64 workers, random per-pair caps, {SHORT_ROUNDS} rounds"),
    ]
    coarse = Case(replace(random.setup, coalesce_rel=COARSE_COALESCE))
    pairs = paired(coarse, bare_simpy_loop, REPEATS)
    coarse_run = coarse.runs[-1]
    figures.append(cost(
        f"sim.ako64_random_links_coalesce3pct_{SHORT_ROUNDS}r_vs_simpy", pairs, None, None,
        f"--coalesce {COARSE_COALESCE:g}, {SHORT_ROUNDS} rounds: round time "
        f"{coarse_run.round_time_s / random.runs[-1].round_time_s - 1:+.2%} vs the default; "
        f"{coarse_run.events['rate_solves']} rate solves"))

    big = Case(timing_setup(1_024, SHORT_ROUNDS))
    pairs = paired(big, bare_simpy_loop, REPEATS)
    long_wall_s, long_cpu_s, long_run = timed(timing_setup(1_024, BIG_LONG_ROUNDS))
    goal_cpu_s = per_round_extrapolated_s(pairs.median_case_s(), SHORT_ROUNDS, long_cpu_s,
                                          BIG_LONG_ROUNDS, 100)
    figures += [
        cost(f"sim.ako1024_{SHORT_ROUNDS}r_vs_simpy", pairs, None, None,
             f"{long_run.label}, 40 Mbit/s"),
        estimate("sim.ako1024_100r_est_vs_simpy", goal_cpu_s, 30.0,
                 f"1,024 x 100 on 40 Mbit/s, estimated: the paired {SHORT_ROUNDS}-round median "
                 f"plus the cost of a round from one {BIG_LONG_ROUNDS}-round run "
                 f"({long_cpu_s:.1f} CPU s, {long_wall_s:.1f} s wall)",
                 known_gap=BIG_CLUSTER_GAP),
        event_ratio(f"sim.ako1024_{SHORT_ROUNDS}r_events_vs_simpy", pairs, big.runs[-1],
                    f"1,024 x {SHORT_ROUNDS}"),
    ]

    ring = Case(timing_setup(64, 20), Variant("allreduce", label="ring allreduce"))
    pairs = paired(ring, bare_simpy_loop, REPEATS)
    figures += [
        cost("sim.allreduce64_20r_vs_simpy", pairs, None, None,
             f"ring all-reduce, 64 workers x 20 rounds, "
             f"{ring.runs[-1].events['messages']:,} point-to-point messages"),
        event_ratio("sim.allreduce64_events_vs_simpy", pairs, ring.runs[-1],
                    "one message per step"),
    ]

    trained: list[tuple[float, float, SimRun]] = []
    pairs = paired(lambda: trained.append(train_to_accuracy()), plain_jax_steps(), REPEATS)
    wall_s, cpu_s, last = trained[-1]
    reached = all(run.time_to_target_s is not None for _, _, run in trained)
    figures.append(cost(
        "sim.train16_digits_to_90pct_vs_jax", pairs if reached else
        Pairs((math.inf,) * REPEATS, pairs.reference_s), 60.0,
        pairs.median_case_s() if reached else math.inf,
        f"simulated time to 90%: {last.time_to_target_s:.3f} s, "
        f"{last.per_worker[0].rounds} rounds, {last.label}" if reached else
        f"90% not reached (final {last.final_accuracy})",
        reference=f"plain JAX MLP gradient x {PLAIN_JAX_STEPS}"))
    return figures
