"""The plan ranks the schemes by simulated training: --target-accuracy, --time-budget, --explain.

Small and quick: digits-mlp (4,810 parameters), 4 workers on 10 Mbit/s, a given
compute time, a few dozen rounds; one ranking is trained per module and shared.
"""

from __future__ import annotations

import json

import pytest

from akocore.records.results import SCHEMA_VERSION, PlanResult, RecordError
from akosim.cli import main

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


def test_up_to_three_candidates_per_scheme_on_its_pareto_front(ranked) -> None:
    """Each scheme's candidates are within the limit, none beaten on both staleness and
    samples/s by another of the same scheme, the least stale at least a quarter of the
    fastest's samples/s; a scheme without a staleness knob keeps its fastest row. The
    values of a scheme's own `plan_grid` (sparseloco's k and bits) are kept beside its
    front, each once."""
    from akocore.schemes.registry import scheme_named
    from akocore.settings.schema import ExchangeConfig
    from akosim.planning.pareto_candidates import SAME_SPEED, SLOWER_AT_MOST

    _, data = ranked
    record = PlanResult.from_json(data)
    limit = record.max_staleness_rounds
    by_scheme: dict[str, list] = {}
    for r in record.ranking:
        assert r.staleness_bound_rounds <= limit
        by_scheme.setdefault(r.scheme, []).append(r)
    for scheme, mine in list(by_scheme.items()):
        grid = scheme_named(scheme).plan_grid(ExchangeConfig(scheme=scheme))
        gridded = [r for r in mine if any(r.exchange.get(key) in values
                                          for key, values in grid.items())]
        assert len(gridded) <= sum(len(values) for values in grid.values()), scheme
        mine = by_scheme[scheme] = [r for r in mine if r not in gridded]
        assert (mine or gridded) and len(mine) <= 3, scheme  # sparta's configured f=0.005
        if not mine:  # is past the staleness limit: only its grid's values rank
            continue
        mine.sort(key=lambda r: r.staleness_bound_rounds)
        speeds = [r.samples_per_s for r in mine]
        assert all(b > (1 + SAME_SPEED) * a for a, b in zip(speeds, speeds[1:], strict=False)),\
            scheme
        assert speeds[0] >= speeds[-1] / SLOWER_AT_MOST
    assert len(by_scheme["ako"]) == 3 and len(by_scheme["diloco"]) >= 2  # trade-offs
    assert {r.label for r in by_scheme["allreduce"]} == {"ring allreduce"}
    ps_rows = [run for run in record.runs if run.scheme == "ps"]
    assert [r.label for r in by_scheme["ps"]] == [
        max(ps_rows, key=lambda run: run.samples_per_s).label]  # 1 server: as stale, slower
    diloco_h = {int(r.label.split("H=")[1]) for r in by_scheme["diloco"]}
    assert max(diloco_h) * 3 <= record.ranking_rounds  # it syncs while it trains


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
        # reached: touched the target and ended at or above it
        assert r.reached == (bool(hits) and (r.accuracy or 0.0) >= 0.7)
        assert r.time_to_target_s == (hits[0] if r.reached else None)
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
    inner_steps = int(diloco.label.split("H=")[1])
    run = akosim.train(workers=4, bandwidth="10mbps", compute="10ms", rounds=60,
                       scheme="diloco", inner_steps=inner_steps, target_accuracy=0.7,
                       quiet=True)
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
    from akosim.planning.advice import with_overlap_ssp
    from akosim.planning.compare import compare_all
    from akosim.planning.long_explanation import bound_by
    from tests.test_plan_advice import _setup

    runs = compare_all(with_overlap_ssp(_setup(n=4, rounds=12)))  # Ako overlaps: compute
    ako, one = runs[0], next(r for r in runs if r.label == "ako p=1")
    assert bound_by(one, max_staleness_rounds=64).startswith("the NIC: uplink of node")
    assert bound_by(ako, max_staleness_rounds=0).startswith("the staleness limit: ")
    fast = [r for r in runs if r.compute_s_per_round >= 0.9 * r.round_time_s]
    assert fast
    for run in fast:
        assert bound_by(run, max_staleness_rounds=1e9).startswith("compute: ")


def _point(staleness: float, samples_per_s: float):
    from types import SimpleNamespace

    return SimpleNamespace(timing=SimpleNamespace(staleness_bound_rounds=staleness,
                                                  samples_per_s=samples_per_s))


def test_the_front_drops_dominated_points_and_the_pick_spans_it() -> None:
    from akosim.planning.pareto_candidates import front, pick

    points = [_point(64, 1000), _point(45, 990), _point(30, 700), _point(22, 500),
              _point(22, 400), _point(11, 260), _point(5, 120), _point(0, 20),
              _point(80, 5000)]
    kept = front(points, max_staleness_rounds=64)  # type: ignore[arg-type]
    # 64 rounds is hardly faster than 45 (within 2%), 22 at 400 is beaten, 80 is over
    assert [(c.timing.staleness_bound_rounds, c.timing.samples_per_s) for c in kept] == [
        (0, 20), (5, 120), (11, 260), (22, 500), (30, 700), (45, 990)]
    picked = pick(kept)
    # the best, the one nearest sqrt(12 x 46) = 23.5 rounds + 1, the least stale >= 990/4
    assert [c.timing.staleness_bound_rounds for c in picked] == [45, 22, 11]
    assert pick([kept[0]]) == [kept[0]] and pick([]) == []
    assert front(points, max_staleness_rounds=0)[0].timing.samples_per_s == 20


def test_staleness_knobs_come_from_the_scheme_objects() -> None:
    """The integer keys whose value changes a scheme's staleness bound, whatever its name;
    none for a parameter server in sync mode or ring all-reduce."""
    from akocore.schemes.protocol import Scheme
    from akocore.schemes.registry import scheme_named
    from akosim.planning.pareto_candidates import _knobs
    from tests.test_plan_advice import _setup

    setup = _setup(n=4, rounds=12)
    assert list(_knobs(scheme_named("diloco"), setup)) == ["inner_steps"]
    streaming = _knobs(scheme_named("streaming-diloco"), setup)
    assert list(streaming) == ["inner_steps", "overlap_steps"]
    assert 1 not in streaming["inner_steps"] and 0 in streaming["overlap_steps"]  # P = 2
    assert _knobs(scheme_named("ps"), setup) == {} == _knobs(scheme_named("allreduce"), setup)

    class Windowed(Scheme):
        name = "windowed"
        keys = ("global_every", "group_size")

        def staleness_bound(self, exchange, *, p_max, ssp):
            return float(exchange.global_every)

    assert list(_knobs(Windowed(), setup)) == ["global_every"]


def test_a_compared_scheme_runs_with_its_own_configured_keys() -> None:
    """The comparison's DiLoCo row runs the configured H (the config's scheme is Ako); the
    rows are the same whatever ranks them (ranked by throughput, the plans train nothing)."""
    import akosim

    common = dict(workers=4, bandwidth="10mbps", compute="10ms", gradient_size="40KB",
                  rounds=60, quiet=True)
    compared = akosim.plan(**common, inner_steps=20, rank_by="throughput")
    row = next(run for run in compared.runs if run.scheme == "diloco")
    alone = akosim.simulate(**common, scheme="diloco", inner_steps=20)
    default = next(run for run in akosim.plan(**common, rank_by="throughput").runs
                   if run.scheme == "diloco")
    assert row.label == "diloco H=20"
    assert row.bytes_sent_per_worker_per_round == alone.bytes_sent_per_worker_per_round
    assert row.bytes_sent_per_worker_per_round < default.bytes_sent_per_worker_per_round


def test_plan_records_of_version_1_still_read(ranked) -> None:
    _, data = ranked
    assert data["schema_version"] == SCHEMA_VERSION == 3
    old = {k: v for k, v in data.items() if k not in (
        "ranking", "ranking_verdict", "ranking_rounds", "target_accuracy", "time_budget_s",
        "explained")}
    old["schema_version"] = 1
    old["runs"] = [{**run, "schema_version": 1} for run in data["runs"]]
    record = PlanResult.from_json(old)
    assert record.ranking == () and record.target_accuracy is None
    assert PlanResult.from_json(data).ranking  # and this one round-trips with its ranking
    with pytest.raises(RecordError, match="schema_version"):
        PlanResult.from_json({**data, "schema_version": 4})


def _recommended(record: PlanResult):
    line = record.recommendation[0]
    assert line.startswith("recommend: ")
    return next(run for run in sorted((*record.runs, *record.ranking),
                                      key=lambda r: -len(r.label))
                if line.startswith(f"recommend: {run.label}: "))  # a row or a candidate


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


def test_every_candidate_keeps_within_a_tight_staleness_limit() -> None:
    """Timing only: with --max-staleness 4 the ladders stop at p - 1 + s <= 4 and H <= 5,
    and a knob's period must come round three times within the training rounds."""
    from akosim.planning.compare import compare_all
    from akosim.planning.pareto_candidates import pareto_candidates
    from tests.test_plan_advice import _setup

    setup = _setup(n=4, rounds=12)
    runs = compare_all(setup)
    lines: list[str] = []
    chosen = pareto_candidates(setup, runs, max_staleness_rounds=4, training_rounds=12,
                               announce=lines.append)
    assert chosen and all(c.timing.staleness_bound_rounds <= 4 for c in chosen)
    assert {c.timing.scheme for c in chosen} >= {"ako", "diloco", "allreduce"}
    for c in chosen:
        exchange = c.setup.config.exchange
        if c.timing.scheme == "diloco":
            assert exchange.inner_steps * 3 <= 12
    assert any(line.startswith("akosim: timing ") for line in lines)
    ako = [c for c in chosen if c.timing.scheme == "ako"]
    assert len({(c.timing.p, c.timing.ssp) for c in ako}) == len(ako) <= 3
