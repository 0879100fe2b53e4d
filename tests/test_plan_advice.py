"""The plan a user can act on: s chosen with p, the one-line answer, the ways out."""

from __future__ import annotations

import math

import pytest

from akocore.planner import PlanInputs, overlap_ssp, plan, send_time_s, ways_out
from akocore.settings.schema import (
    ClusterConfig,
    ExchangeConfig,
    NetworkConfig,
    RunConfig,
    TrainConfig,
)
from akosim.cli import main
from akosim.planning.advice import explain, with_overlap_ssp
from akosim.planning.compare import compare_all
from akosim.planning.compute import ComputeModel
from akosim.sim.engine import StopRule
from akosim.sim.scenario import Setup, ako_variant, simulate


def _inputs(n: int = 8, bandwidth: float = 40e6, compute_s: float = 0.3,
            gradient_bytes: float = 4e6) -> PlanInputs:
    return PlanInputs(workers=n, gradient_bytes=gradient_bytes, compute_s=compute_s,
                      uplink_bps=(bandwidth,) * n, downlink_bps=(bandwidth,) * n)


def test_send_time_is_the_slowest_of_uplink_link_and_incast() -> None:
    inputs = _inputs()
    # (n-1) x 8S / (p B) = 7 x 32e6 / (4 x 40e6) = 1.4 s
    assert send_time_s(inputs, (4,) * 8) == pytest.approx(1.4)


def test_overlap_ssp_is_the_smallest_s_that_hides_the_sends() -> None:
    inputs = _inputs()
    auto = plan(inputs)  # sends take ~0.9 x compute
    assert overlap_ssp(inputs, auto.p_of) == 1
    assert overlap_ssp(inputs, auto.p_of, latency_s=0.2) == 2  # 0.27 + 0.2 > 0.3
    assert overlap_ssp(inputs, (1,) * 8) == math.ceil(7 * 32e6 / 40e6 / 0.3)


def test_ways_out_quantify_each_lever() -> None:
    inputs = _inputs(n=64, gradient_bytes=17.05e6)
    chosen = plan(inputs)
    ways = {way.change: way for way in ways_out(inputs, chosen, 64, 104)}
    needed = max(chosen.required_p) / 65  # p - 1 + s <= 64 with s = 0: p <= 65
    assert ways["batch"].factor == pytest.approx(needed)
    assert ways["bandwidth"].factor == pytest.approx(needed)
    assert "workers 64 -> " in ways["workers"].text
    fitting = plan(_inputs(n=4, bandwidth=1e9))
    assert ways_out(_inputs(n=4, bandwidth=1e9), fitting, 64, 104) == ()


def _setup(n: int = 16, latency: str = "0s", rounds: int = 20) -> Setup:
    config = RunConfig(cluster=ClusterConfig(workers=n),
                       network=NetworkConfig(bandwidth_bps="40mbps", latency_s=latency),
                       exchange=ExchangeConfig(p="auto"),
                       train=TrainConfig(batch_size=104, rounds=rounds))
    return Setup(config, 1_000_000, ComputeModel(0.3), 104, StopRule(rounds=rounds))


def test_the_chosen_s_lets_sending_overlap_compute() -> None:
    lockstep = _setup()
    chosen = with_overlap_ssp(lockstep)
    assert chosen.config.exchange.ssp == 1
    slow = simulate(lockstep, ako_variant(lockstep))
    fast = simulate(chosen, ako_variant(chosen))
    assert fast.p == slow.p
    assert fast.round_time_s == pytest.approx(0.3, rel=1e-3)  # compute-bound
    assert slow.round_time_s > 1.5 * fast.round_time_s  # compute + sends in turn
    assert fast.nic_utilisation > 1.5 * slow.nic_utilisation


def test_explain_says_it_in_one_line_and_names_the_ways_out() -> None:
    setup = with_overlap_ssp(_setup(n=32))
    runs = compare_all(setup)
    explanation = explain(setup, runs, ssp_chosen=True, max_staleness_rounds=8)
    assert explanation is not None
    ako = runs[0]
    line = explanation.line
    assert f"p={ako.p}, s=1 (chosen so sends overlap compute)" in line
    assert "NIC" in line and "% busy" in line and "p bound by uplink of worker" in line
    assert explanation.propagation_rounds == ako.p - 1 + 1
    assert explanation.propagation_s == pytest.approx(explanation.propagation_rounds
                                                      * ako.round_time_s)
    assert explanation.advice[0].startswith(f"too stale: {ako.p} rounds > --max-staleness 8")
    assert any("batch 104 -> " in line for line in explanation.advice)
    assert any("samples/s with no staleness" in line for line in explanation.advice)
    relaxed = explain(setup, runs, ssp_chosen=True, max_staleness_rounds=10_000)
    assert relaxed is not None and relaxed.advice == ()


def test_akosim_prints_the_plan_and_writes_it(capsys, tmp_path) -> None:
    out = tmp_path / "plan.json"
    code = main(["--workers", "16", "--bandwidth", "40mbps", "--p", "auto", "--compute", "0.3s",
                 "--gradient-size", "4MB", "--rounds", "12", "--quiet", "--out", str(out),
                 "--max-staleness", "4", "--rank-by", "throughput"])
    text = capsys.readouterr().out
    assert code == 0
    assert "plan: Ako p=" in text and "s=1 (chosen so sends overlap compute)" in text
    assert "too stale:" in text
    import json

    data = json.loads(out.read_text())
    assert data["chosen_ssp"] == 1 and data["max_staleness_rounds"] == 4
    assert data["explanation"].startswith("plan: Ako p=") and data["advice"]
    assert data["compute_source"] == "compute 300 ms/round given"
    assert data["recommendation"][0].startswith("recommend: ")
    assert "recommend: " in text and "(within --max-staleness 4)" in text


def test_a_given_ssp_is_kept(capsys) -> None:
    """The plan's explanation says so; it does not depend on how the rows are ranked (ranked
    by throughput, the plan trains nothing)."""
    code = main(["--workers", "8", "--bandwidth", "40mbps", "--compute", "0.3s",
                 "--gradient-size", "4MB", "--rounds", "8", "--quiet", "--ssp", "0",
                 "--rank-by", "throughput"])
    text = capsys.readouterr().out
    assert code == 0 and "s=0 (given)" in text


def test_the_recommendation_never_fails_its_own_staleness_check() -> None:
    """On a slow link Ako's p makes it too stale: the plan names the fastest run within
    --max-staleness instead, and says what p, s, H and staleness mean."""
    from akosim.planning.advice import recommend

    setup = with_overlap_ssp(_setup(n=32))
    runs = compare_all(setup)
    assert any(run.scheme == "diloco" for run in runs)  # the comparison has DiLoCo rows
    for bound in (0, 8, 10_000):
        line, glossary = recommend(runs, max_staleness_rounds=bound)
        fit = [run for run in runs if run.staleness_bound_rounds <= bound]
        best = max(fit, key=lambda run: run.samples_per_s)
        assert line.startswith(f"recommend: {best.label}: ")
        assert "p = " in glossary and "H = " in glossary and "staleness = " in glossary


def test_p_auto_is_held_within_max_staleness() -> None:
    """p = auto chooses the largest p whose staleness bound (p - 1 + s, s chosen with that
    p) fits --max-staleness; a p the limit holds says so, and how large the network needs."""
    from akosim.planning.advice import held_by_staleness, within_staleness
    from akosim.planning.setup import with_plan

    setup = with_plan(_setup(n=32))
    free = setup.configured_plan()
    assert free.p > 20  # the network needs more partitions than the limit below allows

    def bound(s: Setup) -> int:
        return with_overlap_ssp(s).configured_plan().staleness_bound_rounds

    held = within_staleness(setup, 20, choose_ssp=True)
    plan = held.configured_plan()
    assert held_by_staleness(plan) and not held_by_staleness(free)
    assert bound(held) <= 20
    assert plan.binding.startswith(f"--max-staleness 20 (the network needs p={free.p};")
    bigger = replace_plan(held, plan.p + 1)
    assert bound(bigger) > 20  # the largest p that fits
    given_s = within_staleness(setup, 20, choose_ssp=False)  # s as configured (0)
    assert given_s.configured_plan().p == 21
    assert within_staleness(setup, 10_000, choose_ssp=True) is setup  # fits: unchanged


def replace_plan(setup: Setup, p: int) -> Setup:
    from dataclasses import replace

    plan = setup.configured_plan()
    return replace(setup, plan=replace(plan, p_of=(p,) * len(plan.p_of)))


def test_the_plan_holds_p_auto_and_recommends_a_run_within_its_limit(capsys) -> None:
    code = main(["--workers", "8", "--bandwidth", "10mbps", "--p", "auto", "--compute", "0.3s",
                 "--gradient-size", "4MB", "--rounds", "12", "--quiet", "--max-staleness", "24"])
    text = capsys.readouterr().out
    assert code == 0
    assert "p bound by --max-staleness 24 (the network needs p=" in text
    assert "p held to " in text and "too stale" not in text
    ako = next(line for line in text.splitlines() if line.startswith("ako p="))
    stale = int(ako.split("<= ")[1].split(" rounds")[0])
    assert stale <= 24


def test_akosim_train_says_when_the_limit_holds_p_auto(capsys) -> None:
    code = main(["train", "--workers", "4", "--bandwidth", "10mbps", "--compute", "1ms",
                 "--scheme", "ako", "--rounds", "4", "--quiet", "--max-staleness", "8"])
    text = capsys.readouterr().out
    assert code == 0
    assert "akosim: p = auto held to 9: p bound by --max-staleness 8 (the network needs" in text
    assert "ako p=9 (auto)" in text  # s = 0 in training: p - 1 <= 8
