"""The plan's timing figures are steady-state figures: each configuration is simulated until
its round time settles (akosim.sim.settling), past the rounds its staleness gate needs to
bind; an explicit --rounds still means exactly that many rounds. Simulated time is
deterministic, so every figure here is exact for the code, not a timing measurement."""

from __future__ import annotations

import json
import math

import pytest

import akosim
from akocore.records.results import PlanResult
from akocore.settings.layers import resolve
from akocore.settings.schema import RunConfig
from akocore.settings.toml_io import set_layer
from akosim.cli import main
from akosim.planning.compute import ComputeModel
from akosim.planning.result_tables import format_table, unsettled_lines
from akosim.planning.runspec import TIMING_DEFAULTS, TRAIN_DEFAULTS
from akosim.planning.setup import build_setup, settles, stop_rule
from akosim.sim.closed_form import closed_form_run
from akosim.sim.engine import StopRule
from akosim.sim.scenario import Variant, simulate
from akosim.sim.settling import (
    MIN_WINDOW_ROUNDS,
    SETTLE_CAP_ROUNDS,
    SettleRule,
    SettleWatch,
    Settling,
)

# two sites: 4 workers on 1 Gbit/s NICs, 4 on 50 Mbit/s, 30 ms one-way between the sites
# and none inside one; a small CNN's gradient (71 kB) and compute (963 us) at batch 32
SITE_OF = [0, 0, 0, 0, 1, 1, 1, 1]
TWO_SITES = dict(
    workers=8, bandwidth=["1gbps"] * 4 + ["50mbps"] * 4,
    latency=["0ms" if SITE_OF[i] == SITE_OF[j] else "30ms"
             for i in range(8) for j in range(i + 1, 8)],
    gradient_size="71kB", compute="963us", batch_size=32, quiet=True)
LONG_ROUNDS = 1000
# how close a settled figure is to the 1,000-round one (measured: p=1 -0.6%, p=31 -0.5%)
TOLERANCE = 0.02


@pytest.mark.parametrize("p", [1, 31])
def test_a_staleness_bound_beyond_30_rounds_is_simulated_past_its_warm_up(p: int) -> None:
    # p - 1 + s = 34 (p=1) or 64 (p=31): in 30 rounds the gate never binds, and the fixed
    # 30 rounds read 963 us (compute alone) where the network needs 80 ms or 2.5 ms
    config = dict(TWO_SITES, scheme="ako", p=p, ssp=34)
    settled = akosim.simulate(**config)
    long = akosim.simulate(**config, rounds=LONG_ROUNDS)
    short = akosim.simulate(**config, rounds=30)
    bound = p - 1 + 34
    assert settled.settled is True and settled.warmup_rounds == bound + 1
    assert settled.simulated_rounds >= settled.warmup_rounds + 2 * 2 * (bound + 1)
    assert settled.simulated_rounds < LONG_ROUNDS
    assert settled.round_time_s == pytest.approx(long.round_time_s, rel=TOLERANCE)
    assert short.round_time_s == pytest.approx(963e-6, rel=1e-6)  # the artefact it replaces
    assert long.round_time_s > 2 * short.round_time_s


def test_an_explicit_rounds_runs_exactly_that_many_rounds() -> None:
    run = akosim.simulate(**TWO_SITES, scheme="ako", p=1, ssp=34, rounds=30)
    assert run.simulated_rounds == 30 and run.settled is None and run.warmup_rounds is None
    assert {rank.rounds for rank in run.per_worker} == {30}


def test_timing_settles_unless_a_layer_gives_rounds_or_a_duration() -> None:
    def stop(defaults: RunConfig, *items: str) -> StopRule:
        resolved = resolve(set_layer(list(items)), defaults=defaults)
        return stop_rule(resolved.config, settle=settles(resolved))

    assert stop(TIMING_DEFAULTS).settle is not None
    assert stop(TIMING_DEFAULTS, "train.rounds=30") == StopRule(rounds=30, drain=False)
    assert stop(TIMING_DEFAULTS, "train.duration=5s").duration_s == 5.0
    # a target clears the rounds (a layer "gave" None): the timing rows still settle
    assert stop(TRAIN_DEFAULTS, "train.target_accuracy=0.9").settle is not None


def test_the_warm_up_and_window_follow_the_schemes_staleness_and_period() -> None:
    rule = SettleRule()
    assert rule.for_scheme(64.0, 1) == Settling(65, 130, SETTLE_CAP_ROUNDS)  # ako p-1+s=64
    assert rule.for_scheme(0.0, 1) == Settling(1, MIN_WINDOW_ROUNDS, SETTLE_CAP_ROUNDS)
    diloco = rule.for_scheme(9.0, 10)  # H=10: whole periods
    assert (diloco.warmup_rounds, diloco.window_rounds) == (10, 20)
    asynchronous = rule.for_scheme(math.inf, 1)  # no gate
    assert asynchronous.window_rounds == MIN_WINDOW_ROUNDS
    wide = rule.for_scheme(2000.0, 1)  # the cap leaves room for one check
    assert wide.cap_rounds == wide.first_check_rounds == 2001 + 2 * 4002


def _watch(round_s: list[float], settling: Settling) -> SettleWatch:
    """A watch fed one worker's rounds of the given lengths until it stops."""
    ends: list[float] = []
    watch = SettleWatch(settling, [ends])
    for length in round_s:
        ends.append((ends[-1] if ends else 0.0) + length)
        if watch.completed(len(ends)):
            break
    return watch


def test_a_watch_settles_at_its_first_check_on_steady_rounds_and_not_on_a_drift() -> None:
    settling = Settling(warmup_rounds=5, window_rounds=10, cap_rounds=200)
    steady = _watch([1.0] * 1000, settling)
    assert (steady.settled, steady.rounds) == (True, 25)
    # each round 0.5% longer than the one before: windows differ by ~5%, never settles
    drifting = _watch([1.005 ** r for r in range(1000)], settling)
    assert (drifting.settled, drifting.rounds) == (False, 200)


def test_a_row_that_does_not_settle_says_so_in_the_table() -> None:
    # jitter and a tolerance no window meets: the run stops at the cap, unsettled
    config = RunConfig()
    setup = build_setup(config, length=10_000, compute=ComputeModel(0.01, jitter=0.2, seed=1),
                        stop=StopRule(drain=False, settle=SettleRule(tolerance=1e-9,
                                                                     cap_rounds=60)))
    run = simulate(setup, Variant("allreduce"))
    assert run.settled is False and run.simulated_rounds == 60
    assert "60, not settled" in format_table([run])
    assert unsettled_lines([run]) == [
        "akosim: allreduce: the round time did not settle within 60 rounds (a window's mean "
        "still moved by more than the tolerance against the one before); its figure is the "
        "mean over them after the warm-up"]


def test_the_closed_form_settles_where_the_simulation_does() -> None:
    config = RunConfig()
    setup = build_setup(config, length=100_000, compute=ComputeModel(0.02),
                        stop=StopRule(drain=False, settle=SettleRule()))
    for variant in (Variant("allreduce"), Variant("ps", ps_servers=1)):
        closed = closed_form_run(setup, variant)
        simulated = simulate(setup, variant)
        assert closed is not None
        assert closed.simulated_rounds == simulated.simulated_rounds == 1 + 2 * 20
        assert closed.settled is simulated.settled is True
        assert closed.round_time_s == pytest.approx(simulated.round_time_s, rel=1e-9)


def test_the_plan_record_says_how_many_rounds_each_row_simulated(tmp_path) -> None:
    """The timing rows' rounds (the same whatever ranks them: by throughput, the plan
    trains nothing)."""
    out = tmp_path / "plan.json"
    assert main(["--workers", "4", "--bandwidth", "100mbps", "--compute", "10ms",
                 "--gradient-size", "400KB", "--quiet", "--rank-by", "throughput",
                 "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    record = PlanResult.from_json(data)
    assert record.runs and all(run.settled is True for run in record.runs)
    for run in record.runs:
        assert run.warmup_rounds is not None and run.simulated_rounds is not None
        assert run.simulated_rounds >= run.warmup_rounds + 2 * MIN_WINDOW_ROUNDS
        assert data["runs"][record.runs.index(run)]["simulated_rounds"] == run.simulated_rounds
    assert record.mode == "timing"
