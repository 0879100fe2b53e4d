"""The plan ranks the schemes by simulated training: --target-accuracy, --time-budget, --explain.

Small and quick: digits-mlp (4,810 parameters), 4 workers on 10 Mbit/s, a given
compute time, a few dozen rounds; one ranking is trained per module and shared.
"""

from __future__ import annotations

import json

import pytest

from akocore.results import SCHEMA_VERSION, PlanResult, RecordError
from akosim.cli import main
from akosim.plan.accuracy_ranking import ranking_candidates

SMALL = ["--workers", "4", "--bandwidth", "10mbps", "--compute", "10ms", "--rounds", "60",
         "--quiet"]


@pytest.fixture(scope="module")
def ranked(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict]:
    """One plan ranked by time to 70% (every candidate's training printed and written)."""
    out = tmp_path_factory.mktemp("rank") / "plan.json"
    import contextlib
    import io

    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        code = main([*SMALL, "--target-accuracy", "0.7", "--out", str(out)])
    assert code == 0
    return text.getvalue(), json.loads(out.read_text())


def test_one_candidate_per_scheme_the_fastest_within_the_staleness_limit(ranked) -> None:
    _, data = ranked
    record = PlanResult.from_json(data)
    labels = [r.label for r in record.ranking]
    schemes = [r.scheme for r in record.ranking]
    assert len(schemes) == len(set(schemes))  # at most one per scheme
    runs = {run.label: run for run in record.runs}
    for ranked_run in record.ranking:
        same = [run for run in record.runs if run.scheme == ranked_run.scheme
                and run.staleness_bound_rounds <= record.max_staleness_rounds]
        best = max(same, key=lambda run: run.samples_per_s)
        assert ranked_run.label == best.label
        assert ranked_run.samples_per_s == runs[ranked_run.label].samples_per_s
    assert "diloco H=10" in labels and "ring allreduce" in labels
    assert "ako p=1" not in labels  # Ako's chosen p has more samples/s


def test_the_ranking_orders_by_time_to_target_and_the_winner_is_recommended(ranked) -> None:
    text, data = ranked
    record = PlanResult.from_json(data)
    assert record.target_accuracy == 0.7 and record.ranking_rounds == 60
    reached = [r for r in record.ranking if r.reached]
    assert reached, "some scheme reaches 70% in 60 rounds of digits"
    assert record.ranking[:len(reached)] == tuple(reached)  # the ones that reach it first
    times = [r.time_to_target_s for r in reached]
    assert times == sorted(times)
    for r in record.ranking:
        hits = [t for t, _, acc in r.evaluations if acc >= 0.7]
        assert r.reached == bool(hits)
        assert r.time_to_target_s == (hits[0] if hits else None)
    winner = record.ranking[0]
    assert record.recommendation[0].startswith(f"recommend: {winner.label}: first to 70% in ")
    assert record.ranking_verdict[0].startswith(f"rank: first to 70%: {winner.label} in ")
    assert "ranked by time to 70% (simulated training, at most 60 rounds each):" in text
    assert f"1     {winner.label}" in text


def test_a_candidate_trains_as_akosim_train_does(ranked) -> None:
    """The ranking's figures are akosim train's for the same configuration."""
    import akosim

    _, data = ranked
    record = PlanResult.from_json(data)
    diloco = next(r for r in record.ranking if r.scheme == "diloco")
    run = akosim.train(workers=4, bandwidth="10mbps", compute="10ms", rounds=60,
                       scheme="diloco", target_accuracy=0.7, quiet=True)
    assert run.time_to_target_s == diloco.time_to_target_s
    assert run.final_accuracy == diloco.accuracy


def test_no_candidate_reaching_the_target_is_said_plainly(capsys) -> None:
    code = main([*SMALL[:-3], "--rounds", "10", "--target-accuracy", "0.99"])
    captured = capsys.readouterr()
    text = captured.out
    assert code == 0
    progress = [line for line in captured.err.splitlines() if line.startswith("akosim: train")]
    assert progress[0].startswith("akosim: training 1/") and "(to 99%, at most 10 rounds)" \
        in progress[0]  # one line per candidate on stderr
    assert "rank: no candidate reached 99% within 10 rounds; the closest was " in text
    # the recommendation falls back on throughput within the staleness limit
    assert "the highest throughput within that bound" in text


def test_a_time_budget_ranks_by_accuracy_within_it() -> None:
    import akosim

    record = akosim.plan(workers=4, bandwidth="10mbps", compute="10ms", rounds=60,
                         time_budget="150ms", explain=True, quiet=True)
    assert record.time_budget_s == pytest.approx(0.15) and record.target_accuracy is None
    accuracies = [r.accuracy for r in record.ranking]
    assert accuracies == sorted(accuracies, reverse=True)
    for r in record.ranking:
        assert not r.reached and r.time_to_target_s is None
        assert r.simulated_s < 0.15 + 0.05  # stopped at the budget (plus the drain)
    assert record.ranking_verdict[0].startswith(
        f"rank: most accurate after 150 ms simulated: {record.ranking[0].label} at ")
    assert "what bounds each configuration:" in record.explained  # explain=True
    assert f"why {record.ranking[0].label} wins: it is the most accurate when the time " \
        "budget ends" in "\n".join(record.explained)


def test_bad_budgets_are_one_line_errors(capsys) -> None:
    for flags, words in ((["--time-budget", "60"], "--time-budget 60: add a unit"),
                         (["--target-accuracy", "0.9", "--gradient-size", "4MB"],
                          "--gradient-size is for timing-only plans")):
        with pytest.raises(SystemExit) as stop:
            main([*SMALL, *flags])
        assert stop.value.code == 2
        assert words in capsys.readouterr().err


def test_explain_says_what_bounds_each_configuration_and_why_the_winner_won(capsys) -> None:
    code = main(["--workers", "8", "--bandwidth", "10mbps", "--compute", "0.3s",
                 "--gradient-size", "4MB", "--rounds", "12", "--quiet", "--explain"])
    text = capsys.readouterr().out
    assert code == 0
    lines = text.splitlines()
    start = lines.index("what bounds each configuration:")
    rows = [line for line in lines if line.startswith(("ako p=", "ps ", "ring ", "diloco",
                                                         "streaming-diloco"))]
    bounds = lines[start + 1:start + 1 + len(rows)]
    assert len(rows) >= 5
    assert [b.split("  ")[1].strip() for b in bounds] == [r.split("  ")[0] for r in rows]
    for term in ("  p = ", "  s = ", "  staleness (Ako) = p - 1 + s", "  H = 10",
                 "  P = 2, tau = 1", "  codec none"):
        assert any(line.startswith(term) for line in lines), term
    assert any(line.startswith("why ") and " wins: " in line for line in lines)


def test_bound_by_names_compute_nic_and_the_staleness_limit() -> None:
    from akosim.plan.advice import with_overlap_ssp
    from akosim.plan.compare import compare_all
    from akosim.plan.long_explanation import bound_by
    from tests.test_plan_advice import _setup

    runs = compare_all(with_overlap_ssp(_setup(n=4, rounds=12)))  # Ako overlaps: compute
    ako, one = runs[0], next(r for r in runs if r.label == "ako p=1")
    assert bound_by(one, max_staleness_rounds=64).startswith("the NIC: uplink of node")
    assert bound_by(ako, max_staleness_rounds=0).startswith("the staleness limit: ")
    fast = [r for r in runs if r.compute_s_per_round >= 0.9 * r.round_time_s]
    assert fast
    for run in fast:
        assert bound_by(run, max_staleness_rounds=1e9).startswith("compute: ")


def test_ranking_candidates_skip_runs_over_the_limit() -> None:
    from akosim.plan.compare import compare_all
    from tests.test_plan_advice import _setup

    runs = compare_all(_setup(n=4, rounds=12))
    assert all(run.staleness_bound_rounds <= 0
               for run in ranking_candidates(runs, max_staleness_rounds=0))
    assert {r.scheme for r in ranking_candidates(runs, max_staleness_rounds=1e9)} == \
        {r.scheme for r in runs}


def test_plan_records_of_version_1_still_read(ranked) -> None:
    _, data = ranked
    assert data["schema_version"] == SCHEMA_VERSION == 2
    old = {k: v for k, v in data.items() if k not in (
        "ranking", "ranking_verdict", "ranking_rounds", "target_accuracy", "time_budget_s",
        "explained")}
    old["schema_version"] = 1
    old["runs"] = [{**run, "schema_version": 1} for run in data["runs"]]
    record = PlanResult.from_json(old)
    assert record.ranking == () and record.target_accuracy is None
    assert PlanResult.from_json(data).ranking  # and this one round-trips with its ranking
    with pytest.raises(RecordError, match="schema_version"):
        PlanResult.from_json({**data, "schema_version": 3})


def _recommended(record: PlanResult):
    line = record.recommendation[0]
    assert line.startswith("recommend: ")
    return next(run for run in sorted(record.runs, key=lambda r: -len(r.label))
                if line.startswith(f"recommend: {run.label}: "))


@pytest.mark.parametrize("workers, bandwidth", [(8, "10mbps"), (64, "40mbps")])
def test_the_design_card_names_a_configuration_that_passes_its_own_checks(
        workers: int, bandwidth: str) -> None:
    """The design card's cluster (the seed CNN's 17 MB gradient at its compute time): the
    recommended run is within --max-staleness, no row is called too stale, and the DiLoCo
    rows stand beside Ako's."""
    import akosim

    record = akosim.plan(workers=workers, bandwidth=bandwidth, p="auto", compute="0.3s",
                         gradient_size="17052KB", quiet=True)
    limit = record.max_staleness_rounds
    best = _recommended(record)
    assert best.staleness_bound_rounds <= limit
    assert not any(line.startswith("too stale") for line in record.advice)
    schemes = [run.scheme for run in record.runs]
    assert {"ako", "diloco", "streaming-diloco"} <= set(schemes)
    ako = next(run for run in record.runs if run.scheme == "ako")
    assert ako.staleness_bound_rounds <= limit  # p = auto held within the limit


def test_the_design_card_with_a_target_names_a_configuration_within_its_limit() -> None:
    import akosim

    record = akosim.plan(workers=8, bandwidth="10mbps", p="auto", compute="10ms", rounds=30,
                         target_accuracy=0.6, quiet=True)
    assert {r.scheme for r in record.ranking} >= {"ako", "diloco", "streaming-diloco"}
    assert all(r.staleness_bound_rounds <= record.max_staleness_rounds
               for r in record.ranking)
    best = _recommended(record)
    assert best.staleness_bound_rounds <= record.max_staleness_rounds
    if record.ranking[0].reached:
        assert best.label == record.ranking[0].label
