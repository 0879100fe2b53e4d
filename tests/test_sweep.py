"""akosim sweep: grid expansion, stable ids, shards, resuming, result files, errors.

Every sweep here is tiny (a 40 kB gradient, 10 ms compute, 3 rounds), so the
simulations take milliseconds; one test goes through the process pool.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from akocore.records.results import RunResult, run_fields
from akosim.cli import UsageError, main
from akosim.sweeping.sweep_grid import build_parser, expand_grid, shard_of, sim_settings
from akosim.sweeping.sweep_request import SweepRequest, parse_shard
from akosim.sweeping.sweepfiles import CSV_RESULT_COLUMNS, POINT_FORMAT, SweepPoint

TINY = ["--gradient-size", "40KB", "--compute", "10ms", "--rounds", "3"]


def points_of(*argv: str):
    request = SweepRequest.from_args(build_parser().parse_args([*argv, *TINY, "--out",
                                                                "unused"]))
    return expand_grid(request, sim_settings(request))


def sweep(tmp_path: Path, *argv: str, jobs: int = 1) -> int:
    return main(["sweep", *argv, *TINY, "--out", str(tmp_path), "--jobs", str(jobs),
                 "--quiet"])


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


# ------------------------------------------------------------------ the grid


def test_the_grid_is_the_cartesian_product_in_flag_order_then_value_order():
    points = points_of("--p", "1,auto", "--workers", "4,8", "--bandwidth", "40mbps,1gbps")
    # nesting follows --workers, --bandwidth, --p whatever the order on the command line
    assert [(p.grid["workers"], p.grid["bandwidth"], p.grid["p"]) for p in points] == [
        ("4", "40mbps", "1"), ("4", "40mbps", "auto"), ("4", "1gbps", "1"),
        ("4", "1gbps", "auto"), ("8", "40mbps", "1"), ("8", "40mbps", "auto"),
        ("8", "1gbps", "1"), ("8", "1gbps", "auto"),
    ]
    assert [p.index for p in points] == list(range(8))
    assert points[5].config.cluster.workers == 8
    assert points[5].config.network.bandwidth_bps == (40e6,)
    assert points[5].config.exchange.p == "auto"


def test_point_ids_are_stable_and_depend_on_config_and_simulation_settings():
    first = points_of("--workers", "4,8", "--ssp", "0,2")
    again = points_of("--ssp", "0,2", "--workers", "4,8")
    assert [p.id for p in first] == [p.id for p in again]
    assert len({p.id for p in first}) == 4
    # the same point inside another grid keeps its id
    alone = points_of("--workers", "8", "--ssp", "2")
    assert alone[0].id == first[3].id
    # anything that changes the result changes the id
    request = SweepRequest.from_args(build_parser().parse_args([
        "--workers", "8", "--ssp", "2", "--gradient-size", "40KB", "--compute", "20ms",
        "--rounds", "3", "--out", "x"]))
    assert expand_grid(request, sim_settings(request))[0].id != alone[0].id


def test_equal_configs_spelled_differently_are_one_point():
    points = points_of("--bandwidth", "1gbps,1000mbps,40mbps")
    assert [p.grid["bandwidth"] for p in points] == ["1gbps", "40mbps"]


@pytest.mark.parametrize("count", [1, 2, 3, 5, 13])
def test_shards_cover_every_point_exactly_once(count):
    points = points_of("--workers", "4,8,16", "--p", "1,2,auto", "--ssp", "0,1")
    ids = [p.id for index in range(count) for p in shard_of(points, (index, count))]
    assert sorted(ids) == sorted(p.id for p in points)
    assert len(ids) == len(set(ids)) == 18


@pytest.mark.parametrize("text", ["2/2", "-1/2", "1", "a/b", "1/0", "1/2/3", ""])
def test_a_bad_shard_is_refused(text):
    with pytest.raises(UsageError, match="--shard"):
        parse_shard(text)


def test_a_bad_shard_exits_2_with_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        sweep(tmp_path, "--workers", "4", "--shard", "4/4")
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--shard" in err and "Traceback" not in err
    assert not (tmp_path / "points").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--workers", "4,,8"], "--workers: got '4,,8'"),
        (["--workers", "1"], "cluster.workers"),
        (["--bandwidth", "fast"], "network.bandwidth"),
        (["--scheme", "ako,gossip"], "exchange.scheme"),
        (["--p", "20000"], "--p: got 20000"),
    ],
)
def test_bad_grid_values_exit_2_with_one_line(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        sweep(tmp_path, *argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


# ------------------------------------------------------------------ running


def test_a_sweep_writes_one_file_per_point_and_the_collected_results(tmp_path, capsys):
    assert sweep(tmp_path, "--workers", "4,6", "--p", "1,auto", "--bandwidth", "40mbps") == 0
    points = points_of("--workers", "4,6", "--p", "1,auto", "--bandwidth", "40mbps")
    files = sorted(path.stem for path in (tmp_path / "points").glob("*.json"))
    assert files == sorted(p.id for p in points)

    rows = read_csv(tmp_path / "sweep.csv")
    assert list(rows[0]) == ["grid_workers", "grid_bandwidth", "grid_p",
                             *CSV_RESULT_COLUMNS, "point_id"]
    assert [(r["grid_workers"], r["grid_p"], r["point_id"]) for r in rows] == [
        (p.grid["workers"], p.grid["p"], p.id) for p in points]
    assert [r["scheme"] for r in rows] == ["ako"] * 4
    assert [int(r["workers"]) for r in rows] == [4, 4, 6, 6]
    assert rows[0]["p"] == "1" and int(rows[1]["p"]) > 1  # auto chose partitions at 40 Mbps
    for row in rows:
        # compute alone is 10 ms; s is chosen so that sending overlaps it
        assert float(row["round_time_s"]) >= 0.01
        assert float(row["samples_per_s"]) > 0
        assert "uplink" in row["bottleneck"] or "downlink" in row["bottleneck"]

    collected = json.loads((tmp_path / "sweep.json").read_text())
    assert [p["id"] for p in collected["points"]] == [p.id for p in points]
    first = collected["points"][0]
    assert first["config"]["cluster"]["workers"] == 4
    assert first["grid"] == {"workers": "4", "bandwidth": "40mbps", "p": "1"}
    assert first["gradient_bytes"] == 40_000 and first["compute_s"] == 0.01
    assert len(first["runs"]) == 1 and "per_link" not in first["runs"][0]
    assert "wrote" in capsys.readouterr().out


def test_without_a_scheme_in_the_grid_each_point_runs_its_configs_scheme_only(tmp_path):
    assert sweep(tmp_path, "--workers", "4", "--set", "exchange.scheme=allreduce") == 0
    rows = read_csv(tmp_path / "sweep.csv")
    assert [r["scheme"] for r in rows] == ["allreduce"]


def test_a_scheme_grid_gives_one_row_per_scheme(tmp_path):
    assert sweep(tmp_path, "--workers", "4", "--scheme", "ako,ps,allreduce") == 0
    rows = read_csv(tmp_path / "sweep.csv")
    assert [(r["grid_scheme"], r["scheme"]) for r in rows] == [
        ("ako", "ako"), ("ps", "ps"), ("allreduce", "allreduce")]


def test_a_second_run_skips_the_points_already_done(tmp_path, capsys):
    grid = ("--workers", "4", "--ssp", "0,1,2")
    assert sweep(tmp_path, *grid) == 0
    files = sorted((tmp_path / "points").glob("*.json"))
    stamps = {path: path.stat().st_mtime_ns for path in files}
    capsys.readouterr()

    assert sweep(tmp_path, *grid) == 0
    assert "3 already in" in capsys.readouterr().out
    assert {path: path.stat().st_mtime_ns for path in files} == stamps

    files[1].unlink()  # an interrupted sweep: one point missing
    assert sweep(tmp_path, *grid) == 0
    out = capsys.readouterr().out
    assert "2 already in" in out and "1 to run" in out
    assert files[1].exists()
    assert files[0].stat().st_mtime_ns == stamps[files[0]]
    assert len(read_csv(tmp_path / "sweep.csv")) == 3


def test_shards_run_their_part_and_a_final_run_collects_everything(tmp_path, capsys):
    grid = ("--workers", "4", "--p", "1,2,4", "--ssp", "0,1")
    for index in range(3):
        assert sweep(tmp_path, *grid, "--shard", f"{index}/3") == 0
        assert len(list((tmp_path / "points").glob("*.json"))) == 2 * (index + 1)
    capsys.readouterr()
    assert sweep(tmp_path, *grid) == 0
    assert "6 already in" in capsys.readouterr().out
    assert len(read_csv(tmp_path / "sweep.csv")) == 6


def test_the_process_pool_gives_the_same_results_as_one_process(tmp_path):
    grid = ("--workers", "4,6", "--bandwidth", "40mbps,1gbps")
    assert sweep(tmp_path / "serial", *grid, jobs=1) == 0
    assert sweep(tmp_path / "pool", *grid, jobs=2) == 0
    serial = read_csv(tmp_path / "serial" / "sweep.csv")
    pool = read_csv(tmp_path / "pool" / "sweep.csv")
    assert len(serial) == 4
    assert serial == pool


# ------------------------------------------------------------------ the point files


def test_the_csv_columns_are_run_result_fields_and_a_typo_is_refused():
    assert set(CSV_RESULT_COLUMNS) <= set(RunResult.__dataclass_fields__)
    with pytest.raises(ValueError, match="round_time"):
        run_fields("scheme", "round_time")


def test_a_point_file_is_a_typed_record_of_run_results(tmp_path):
    assert sweep(tmp_path, "--workers", "4", "--scheme", "ako,ps") == 0
    for path in (tmp_path / "points").glob("*.json"):
        data = json.loads(path.read_text())
        point = SweepPoint.from_json(data)
        assert point.id == path.stem and point.format == POINT_FORMAT
        assert [type(run) for run in point.runs] == [RunResult]
        run = point.runs[0]
        assert run.tool == "akosim" and run.mode == "timing" and run.workers == 4
        assert run.round_time_s >= 0.01 and len(run.per_worker) == run.training_workers >= 3
        assert SweepPoint.from_json(point.to_json()) == point


def test_point_files_of_another_format_are_ignored_not_misread(tmp_path, capsys):
    grid = ("--workers", "4", "--ssp", "0,1")
    assert sweep(tmp_path, *grid) == 0
    path = sorted((tmp_path / "points").glob("*.json"))[0]
    data = json.loads(path.read_text())
    old = {**data, "format": POINT_FORMAT - 1, "id": "0" * 16}
    (tmp_path / "points" / f"{old['id']}.json").write_text(json.dumps(old))
    capsys.readouterr()
    assert sweep(tmp_path, *grid) == 0
    assert "ignoring 1 point file(s)" in capsys.readouterr().err
    assert [r["point_id"] for r in read_csv(tmp_path / "sweep.csv")].count("0" * 16) == 0
    assert len(read_csv(tmp_path / "sweep.csv")) == 2


def test_sweep_refuses_a_compute_time_without_a_unit(capsys) -> None:
    from akosim.sweeping.sweep_grid import run_sweep

    with pytest.raises(SystemExit) as exited:
        run_sweep(["--workers", "2", "--compute", "300", "--gradient-size", "40KB",
                   "--out", "unused"])
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--compute 300: add a unit" in err[0]


def test_ako_points_choose_s_with_p_as_the_plan_does_unless_ssp_is_given(tmp_path):
    # At 40 Mbit/s the sends of a 40 kB gradient outlast 10 ms of compute: the
    # plan's rule picks s > 0 so they overlap; --ssp (or --set) fixes s instead.
    from akocore.settings.toml_io import config_from_dict
    from akosim.planning.advice import with_overlap_ssp
    from akosim.planning.compute import ComputeModel
    from akosim.sim.engine import StopRule
    from akosim.sim.scenario import Setup

    assert sweep(tmp_path / "chosen", "--workers", "4,6", "--bandwidth", "40mbps") == 0
    assert sweep(tmp_path / "given", "--workers", "4,6", "--bandwidth", "40mbps",
                 "--ssp", "0") == 0
    chosen = read_csv(tmp_path / "chosen" / "sweep.csv")
    given = read_csv(tmp_path / "given" / "sweep.csv")
    assert [float(row["ssp"]) for row in given] == [0.0, 0.0]
    for row in chosen:
        workers = int(row["workers"])
        config = config_from_dict({"cluster": {"workers": workers},
                                   "network": {"bandwidth": "40mbps"},
                                   "train": {"rounds": 3}})
        setup = Setup(config, 10_000, ComputeModel(0.01), config.train.batch_size,
                      StopRule(rounds=3, drain=False))
        assert float(row["ssp"]) == with_overlap_ssp(setup).config.exchange.ssp > 0
        assert float(row["round_time_s"]) < float(
            next(r for r in given if r["workers"] == row["workers"])["round_time_s"])
    points = json.loads((tmp_path / "chosen" / "sweep.json").read_text())["points"]
    assert all(point["config"]["exchange"]["ssp"] > 0 for point in points)
    assert not any(p.choose_ssp for p in points_of("--workers", "4", "--ssp", "0"))
    assert not any(p.choose_ssp for p in points_of("--workers", "4", "--scheme", "ps"))


def test_max_staleness_holds_p_auto_within_the_limit_as_the_plan_does(tmp_path, capsys):
    # 6 nodes on 10 Mbit/s: p = auto is 18 (staleness 18 rounds with s = 1); held within
    # 8 rounds it is the plan's held p, and the limit is part of the point's identity.
    import akosim

    assert sweep(tmp_path / "free", "--workers", "6", "--bandwidth", "10mbps") == 0
    assert sweep(tmp_path / "held", "--workers", "6", "--bandwidth", "10mbps",
                 "--max-staleness", "8") == 0
    free = read_csv(tmp_path / "free" / "sweep.csv")[0]
    held = read_csv(tmp_path / "held" / "sweep.csv")[0]
    assert float(free["staleness_bound_rounds"]) > 8
    assert float(held["staleness_bound_rounds"]) <= 8 and int(held["p"]) < int(free["p"])
    planned = akosim.plan(workers=6, bandwidth="10mbps", scheme="ako", gradient_size="40KB",
                          compute="10ms", rounds=3, max_staleness=8, quiet=True).runs[0]
    assert (int(held["p"]), float(held["ssp"])) == (planned.p, planned.ssp)
    assert held["point_id"] != free["point_id"]
    assert [p.id for p in points_of("--workers", "6")] == [
        p.id for p in points_of("--workers", "6")]  # without the flag: the ids as before
    assert "max_staleness_rounds" not in sim_settings(SweepRequest.from_args(
        build_parser().parse_args([*TINY, "--out", "unused"])))
    with pytest.raises(SystemExit) as exited:
        sweep(tmp_path / "bad", "--workers", "6", "--max-staleness", "-1")
    assert exited.value.code == 2
    assert "--max-staleness: got -1, expected rounds >= 0" in capsys.readouterr().err


def test_a_point_without_rounds_settles_and_one_with_rounds_runs_exactly_them(
        tmp_path: Path) -> None:
    argv = ["sweep", "--workers", "4", "--p", "2", "--ssp", "40", "--gradient-size", "40KB",
            "--compute", "10ms", "--bandwidth", "10mbps", "--jobs", "1", "--quiet"]
    assert main([*argv, "--out", str(tmp_path / "settled")]) == 0
    assert main([*argv, "--rounds", "30", "--out", str(tmp_path / "fixed")]) == 0
    settled, = json.loads((tmp_path / "settled" / "sweep.json").read_text())["points"]
    fixed, = json.loads((tmp_path / "fixed" / "sweep.json").read_text())["points"]
    assert settled["id"] != fixed["id"] and settled["sim"]["settle"] is True
    run = settled["runs"][0]
    # staleness p - 1 + s = 41: a warm-up of 42 rounds, then two windows of 84
    assert (run["settled"], run["warmup_rounds"]) == (True, 42)
    assert run["simulated_rounds"] >= 42 + 2 * 84
    assert (fixed["runs"][0]["simulated_rounds"], fixed["runs"][0]["settled"]) == (30, None)
