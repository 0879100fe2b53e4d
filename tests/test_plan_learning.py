"""The plan's default answer ranks by predicted time to accuracy, not by throughput.

The rule (akosim.planning.learning_ranking) on made-up learning curves, then one small
plan end to end: digits-mlp on 4 workers at 10 Mbit/s with a given compute time,
where the fastest row (a stale Ako) is not the one that learns first.
"""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import dataclass

import pytest

from akocore.records.results import PlanResult
from akosim.cli import main
from akosim.planning.learning_ranking import TARGET_FRACTION, rank_rows
from akosim.planning.learning_runs import LearningSource, RowLearning, spread_nodes

SMALL = ["--workers", "4", "--bandwidth", "10mbps", "--compute", "10ms", "--workload",
         "digits-mlp", "--quiet"]
SOURCE = LearningSource("digits-mlp", 32, (0, 1, 2, 3), 4, proxy=False)


@dataclass
class Row:
    """The fields of a comparison row the ranking reads."""

    label: str
    round_time_s: float
    staleness_bound_rounds: float = 0.0
    scheme: str = "allreduce"
    samples_per_s: float = 1.0


def _curve(*points: tuple[int, float]) -> RowLearning:
    return RowLearning("", points[-1][1], tuple(points), points[-1][0])


def _rank(rows: list[Row], curves: list[RowLearning], *, limit: float = 64,
          margin: float = 2.0):
    return rank_rows(rows, curves, source=SOURCE, planned_workload="digits-mlp",  # type: ignore[arg-type]
                     rounds=100, max_staleness_rounds=limit, margin_points=margin)


def test_a_row_that_ends_below_the_target_has_not_reached_it() -> None:
    """Touching the target is not reaching it when the run ends below it (a stale scheme's
    last updates can land late); the table says "not reached" and gives no time."""
    fell = Row("falls back", 1.0)
    steady = Row("steady", 1.0)
    ranking = _rank([fell, steady], [_curve((10, 0.95), (50, 0.96), (100, 0.50)),
                                     _curve((10, 0.5), (60, 0.9), (100, 0.95))])
    assert ranking.target == pytest.approx(TARGET_FRACTION * 0.95)
    by_label = {row.run.label: row for row in ranking.ranked}
    assert not by_label["falls back"].reached and by_label["falls back"].time_to_target_s is None
    assert by_label["steady"].rounds_to_target == 60
    assert by_label["steady"].time_to_target_s == pytest.approx(60.0)
    table = ranking.table()
    falls = next(line for line in table.splitlines() if "falls back" in line)
    assert falls.count("not reached") == 2
    assert ranking.winner is by_label["steady"]


def test_the_fastest_to_target_is_not_recommended_when_it_ends_beyond_the_margin() -> None:
    """A fast row that reaches the target first but plateaus more than the margin below
    what a slower row had reached by the same time is passed over; with a wide enough
    margin it wins."""
    rows = [Row("fast, plateaus", 1.0, staleness_bound_rounds=60),
            Row("slow, learns", 2.0)]
    curves = [_curve((20, 0.90), (100, 0.90)),  # ends at t = 100 s
              _curve((50, 0.85), (60, 0.95), (100, 0.97))]  # 95% at t = 120 s < 200 s
    ranking = _rank(rows, curves)
    assert ranking.target == pytest.approx(TARGET_FRACTION * 0.97)
    fast, slow = sorted(ranking.ranked, key=lambda r: r.run.round_time_s)
    assert fast.time_to_target_s == pytest.approx(20.0)  # first to the target
    assert ranking.ranked[0] is fast
    assert fast.beaten_by == "" and ranking.winner is fast  # by t = 100 s: slow at 85%
    assert "predicted accuracy 90% after 100 rounds" in ranking.recommendation(())[0]
    curves[1] = _curve((40, 0.85), (50, 0.95), (100, 0.97))  # slow at 95% by t = 100 s
    ranking = _rank(rows, curves)
    fast = next(r for r in ranking.ranked if r.run.label.startswith("fast"))
    assert fast.beaten_by == "slow, learns" and not fast.recommendable
    assert ranking.winner is not None and ranking.winner.run.label == "slow, learns"
    lines = ranking.recommendation(("by throughput",))
    assert lines[0].startswith("recommend: slow, learns: first to ")
    assert "predicted accuracy 97% after 100 rounds" in lines[0]
    assert "by its end > 2 points below slow, learns" in ranking.table()
    assert _rank(rows, curves, margin=15).winner is not None
    assert _rank(rows, curves, margin=15).winner.run.label.startswith("fast")


def test_same_time_not_same_rounds() -> None:
    """A row of short rounds still learning at the end of its rounds is not beaten by a
    row of long rounds that had more simulated time to learn."""
    rows = [Row("short rounds", 1.0), Row("long rounds", 3.0)]
    curves = [_curve((50, 0.80), (100, 0.88)),  # ends at t = 100 s
              _curve((30, 0.80), (100, 0.95))]  # at t = 100 s: round 33, 80%
    ranking = _rank(rows, curves)
    short = next(r for r in ranking.ranked if r.run.label == "short rounds")
    assert short.learning.accuracy < 0.95 - 0.02  # more than the margin below at equal rounds
    assert short.beaten_by == ""  # but not at equal time
    assert ranking.winner is short  # the target (85.5%) at 100 s, the long one at 300 s
    # the table shows what the margin compares: every row's accuracy by the winner's end
    header, _, *lines = ranking.table().splitlines()[1:]
    assert "accuracy by " in header
    long_line = next(line for line in lines if line.startswith("2     long rounds") or
                     "long rounds" in line)
    assert "80%" in long_line and "95%" in long_line


def test_rows_beyond_max_staleness_are_never_recommended() -> None:
    rows = [Row("stale but best", 1.0, staleness_bound_rounds=100), Row("fresh", 1.0)]
    ranking = _rank(rows, [_curve((10, 0.99), (100, 0.99)), _curve((50, 0.9), (100, 0.92))],
                    limit=64)
    assert ranking.best_accuracy == pytest.approx(0.92)  # the best within the limit
    assert ranking.winner is not None and ranking.winner.run.label == "fresh"
    assert "beyond --max-staleness" in ranking.table()


def test_nodes_kept_are_spread_over_the_cluster() -> None:
    assert spread_nodes(64, 8) == (0, 8, 16, 24, 32, 40, 48, 56)
    assert spread_nodes(8, 8) == tuple(range(8))
    assert spread_nodes(10, 8)[0] == 0 and len(spread_nodes(10, 8)) == 8


# ------------------------------------------------------------------ end to end


@pytest.fixture(scope="module")
def planned(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, PlanResult]:
    """The default plan of a small cluster, printed and written."""
    out = tmp_path_factory.mktemp("learn") / "plan.json"
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        code = main([*SMALL, "--out", str(out)])
    assert code == 0
    return text.getvalue(), PlanResult.from_json(json.loads(out.read_text()))


def test_the_default_plan_recommends_the_first_to_learn_not_the_fastest(planned) -> None:
    text, record = planned
    fastest = max(record.runs, key=lambda run: run.samples_per_s)
    assert fastest.scheme == "ako"  # throughput would recommend the stale Ako
    line = record.recommendation[0]
    label = line.removeprefix("recommend: ").split(": first to ")[0]
    assert label != fastest.label
    chosen = next(r for r in record.ranking if r.label == label)
    assert chosen.reached
    assert f"predicted accuracy {100 * chosen.accuracy:.3g}% after 200 rounds" in line
    assert line in text
    # every row of the comparison shows what it learns
    assert {r.label for r in record.ranking} == {run.label for run in record.runs}
    assert record.ranking_rounds == 200 and record.target_accuracy is not None
    assert "ranked by predicted time to " in text and "accuracy after 200 rounds" in text
    for r in record.ranking:  # reached rows first, by predicted time to the target
        assert r.reached == (r.time_to_target_s is not None)
    times = [r.time_to_target_s for r in record.ranking if r.reached]
    assert times == sorted(times)


def test_explain_says_why_the_first_to_learn_wins(planned, capsys) -> None:
    """--explain names the recommended row and what the fastest one learns instead (the
    rows' training comes from the cache the fixture's plan filled)."""
    _, record = planned
    label = record.recommendation[0].removeprefix("recommend: ").split(": first to ")[0]
    assert main([*SMALL, "--explain"]) == 0
    text = capsys.readouterr().out
    assert f"why {label} wins: it is predicted to reach " in text
    fastest = max(record.runs, key=lambda run: run.samples_per_s or 0.0)
    assert f"  {fastest.label} has more samples/s (" in text


def test_rank_by_throughput_keeps_the_old_answer(capsys, tmp_path) -> None:
    """The highest samples/s within --max-staleness, and no training."""
    out = tmp_path / "plan.json"
    code = main([*SMALL, "--rank-by", "throughput", "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 0
    assert "ranked by predicted time" not in text
    record = PlanResult.from_json(json.loads(out.read_text()))
    assert record.ranking == () and record.target_accuracy is None
    limit = record.max_staleness_rounds
    assert limit is not None
    fit = [run for run in record.runs if run.staleness_bound_rounds is not None
           and run.staleness_bound_rounds <= limit]
    best = max(fit, key=lambda run: run.samples_per_s or 0.0)
    assert record.recommendation[0].startswith(f"recommend: {best.label}: ")
    assert record.recommendation[0].endswith("the highest throughput within that bound")


@pytest.mark.parametrize("argv, says", [
    (["--rank-by", "speed"], "--rank-by: got 'speed', expected one of accuracy, throughput"),
    (["--rank-by", "throughput", "--target-accuracy", "0.9"], "--rank-by throughput ranks"),
    (["--accuracy-margin", "-1"], "--accuracy-margin: got -1.0"),
])
def test_bad_ranking_flags_exit_2_with_one_line(capsys, argv, says) -> None:
    with pytest.raises(SystemExit) as raised:
        main([*SMALL, *argv])
    assert raised.value.code == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1


def test_a_users_workload_is_planned_at_akoruns_batch(capsys) -> None:
    """The seeds' batch 104 goes with the seeds' CNN; another workload plans at 32, the
    batch akosim train and akorun use, unless a batch is given."""
    assert main(["--workload", "digits-mlp", "--show-config"]) == 0
    assert "train.batch_size = 32" in capsys.readouterr().out
    assert main(["--show-config"]) == 0
    assert "train.batch_size = 104" in capsys.readouterr().out
    assert main(["--workload", "digits-mlp", "--batch-size", "16", "--show-config"]) == 0
    assert "train.batch_size = 16" in capsys.readouterr().out


def test_rows_it_cannot_train_fall_back_to_throughput_and_say_so(capsys) -> None:
    """More partitions than the proxy has parameters: the rows cannot be trained here, so
    the plan says why and ranks by throughput."""
    code = main(["--workers", "4", "--bandwidth", "10mbps", "--compute", "10ms",
                 "--gradient-size", "1MB", "--p", "6000", "--max-staleness", "100000",
                 "--rounds", "8", "--quiet"])
    text = capsys.readouterr().out
    assert code == 0
    assert "akosim: cannot predict what each configuration learns (" in text
    assert "ranked by throughput, which says nothing of accuracy" in text
    assert "the highest throughput within that bound" in text
