"""akosim sweep: a grid of timing-only simulations, run in parallel, resumable, shardable.

    akosim sweep --workers 4,16,64 --bandwidth 40mbps,1gbps --p 1,4,auto --out sweep/

A comma in a grid flag separates grid values; the grid is their cartesian
product, expanded in a fixed order (flags in the order of GRID_FLAGS, values
in the order given). Every point is one resolved RunConfig plus the simulation
settings (gradient size, compute time); its id is a hash of both, so the same
point has the same id in every sweep and every shard. Each point runs one
variant, the scheme of its config (ako unless --scheme, --config or --set say
otherwise), and writes DIR/points/<id>.json atomically; without --rounds (or
rounds or a duration from --config/--set) every point is simulated until its
round time settles, as the plan's rows are (akosim.sim.settling); an Ako point whose
staleness bound no layer sets gets s chosen with p as the plan command does
(akosim.planning.advice.with_overlap_ssp: the smallest s that lets sending overlap
compute), and its file holds the config with that s; with `--max-staleness
ROUNDS` an Ako point's p = auto is held within that staleness bound as the plan
holds it (akosim.planning.advice.within_staleness, through
akosim.planning.execute.run_setup: the largest p whose bound p - 1 + s fits); a
point whose file exists is skipped, so an interrupted sweep resumes where it stopped. `--shard
I/N` keeps the points whose index modulo N is I (a SLURM array task runs
`--shard $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT`). At the end every point
found in DIR/points is collected into DIR/sweep.json and DIR/sweep.csv
(akosim.sweeping.sweepfiles: the point record and the collected files).

Points run in a ProcessPoolExecutor; what crosses to a worker process is plain
data (the config as a dict, numbers), and the worker rebuilds the setup.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import itertools
import json
import math
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from akocore.cli_support import check_out_directory, fail
from akocore.settings.layers import resolve
from akocore.settings.schema import RunConfig
from akocore.settings.toml_io import config_from_dict, config_hash, config_to_dict
from akocore.units import format_duration
from akosim.planning.runspec import (
    TIMING_DEFAULTS,
    USER_ERRORS,
    check_fits,
    load_workload,
    timing_defaults_for,
)
from akosim.planning.setup import chooses_ssp_with_p, settles
from akosim.progress import tracker_factory
from akosim.sweeping.sweep_flags import GRID_FLAGS, build_parser
from akosim.sweeping.sweep_request import SweepRequest
from akosim.sweeping.sweepfiles import POINT_FORMAT, SweepPoint, collect


def _fail(message: str) -> NoReturn:
    fail(message, "akosim sweep")


@dataclass(frozen=True)
class Point:
    """One grid point: its values as given, its resolved config, its id."""

    index: int
    grid: dict[str, str]  # dest -> value text as given
    config: RunConfig
    id: str
    # Ako with no staleness bound from any layer: s is chosen with p, as the
    # plan command does (the smallest s that lets sending overlap compute).
    choose_ssp: bool = False
    settle: bool = False  # no layer gave rounds or a duration: run until the round time settles


def sim_settings(request: SweepRequest) -> dict[str, Any]:
    """What besides the config decides a point's result: gradient and compute."""
    settings: dict[str, Any] = {"mode": "timing", "format": POINT_FORMAT}
    if request.gradient_bytes:
        settings["gradient_length"] = request.gradient_bytes // 4  # float32 values
    else:
        settings["gradient_length"] = "workload"
    compute = request.compute  # seconds, "measure" or "remeasure"
    settings["compute_s"] = "measure" if isinstance(compute, str) else compute
    if request.max_staleness is not None:  # only when given: the ids stay the same without
        settings["max_staleness_rounds"] = request.max_staleness
    return settings


def point_settings(settings: dict[str, Any], settle: bool) -> dict[str, Any]:
    """A point's simulation settings: the sweep's, and whether it settles (part of its id)."""
    return {**settings, "settle": True} if settle else settings


def point_id(config: RunConfig, settings: dict[str, Any]) -> str:
    """A stable id: sha256 of the config's hash and the simulation settings, 16 hex digits."""
    sim = settings if config.network.model == "maxmin" else {
        **settings, "network_model": config.network.model}  # not in the run's hash
    canonical = json.dumps({"config": config_hash(config), "sim": sim}, sort_keys=True,
                           separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def expand_grid(request: SweepRequest, settings: dict[str, Any]) -> list[Point]:
    """Every grid point in nesting order, equal configs merged (first one kept)."""
    dests = [dest for dest, _ in request.axes]
    points: list[Point] = []
    seen: set[str] = set()
    for combination in itertools.product(*(values for _, values in request.axes)):
        values = dict(zip(dests, combination, strict=True))
        layers = [*request.layers, *request.point_layer(values)]
        resolved = resolve(layers, defaults=TIMING_DEFAULTS)
        if not resolved.given("train.batch_size"):  # a user's workload: akorun's batch
            resolved = resolve(layers, defaults=timing_defaults_for(
                resolved.config.train.workload))
        config = resolved.config
        settle = settles(resolved)
        identity = point_id(config, point_settings(settings, settle))
        if identity in seen:
            continue
        seen.add(identity)
        choose_ssp = chooses_ssp_with_p(resolved)
        grid = {dest: str(value) for dest, value in values.items()}
        points.append(Point(len(points), grid, config, identity, choose_ssp, settle))
    return points


def shard_of(points: list[Point], shard: tuple[int, int]) -> list[Point]:
    index, count = shard
    return [point for point in points if point.index % count == index]


# ------------------------------------------------------------------ one point


def _ignore_interrupts() -> None:
    """Worker processes leave Ctrl-C to the parent (which stops them)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def run_point(task: dict[str, Any]) -> tuple[str, float]:
    """Simulate one point and write its file; returns (id, wall seconds).

    `task` is plain data (it crosses to a worker process): id, grid, the
    config as config_to_dict gives it, gradient length, compute seconds,
    the simulation settings (with --max-staleness, the limit p = auto is held
    within), the output folder and whether to choose s with p (the point's file
    then holds the config with the chosen s). The setup comes from the application
    layer's one assembler (akosim.planning.setup.simulation_setup) and the runs from
    akosim.planning.execute.run_setup, as the plan's do.
    """
    from akosim.planning.execute import run_setup
    from akosim.planning.result_tables import json_safe, run_result, write_json
    from akosim.planning.setup import SimulationOptions, simulation_setup

    started = time.perf_counter()
    config = config_from_dict(task["config"])
    # the one assembler, as the plan's: the compute the sweep measured or was given, the
    # TCP model's parameters from this host's cached calibration, else defaults
    setup, _ = simulation_setup(config, SimulationOptions(compute=float(task["compute_s"])),
                                settle=bool(task["settings"].get("settle")),
                                announce=lambda line: None, length=task["length"])
    choose_ssp = bool(task.get("choose_ssp"))
    planned = run_setup(setup, choose_ssp=choose_ssp, compare=False,
                        max_staleness_rounds=task["settings"].get("max_staleness_rounds"))
    setup, runs = planned.setup, planned.runs
    config_record = config_to_dict(setup.config) if choose_ssp else task["config"]
    wall_s = time.perf_counter() - started
    point = SweepPoint(
        id=task["id"], grid=task["grid"], config=config_record, sim=task["settings"],
        gradient_bytes=setup.gradient_bytes, compute_s=task["compute_s"], wall_s=wall_s,
        runs=tuple(run_result(run, config=config_record, mode="timing",
                              batch_size=config.train.batch_size) for run in runs))
    write_json(Path(task["out"]) / "points" / f"{task['id']}.json", json_safe(point.to_json()))
    return task["id"], wall_s


# ------------------------------------------------------------------ running


def _cached_workload(config: RunConfig, cache: dict[str, Any]):
    """Build the workload once per process (building it compiles nothing, but loads data)."""
    if "workload" not in cache:
        cache["workload"] = load_workload(config)
    return cache["workload"]


def _gradient_length(config: RunConfig, settings: dict[str, Any], cache: dict[str, Any]) -> int:
    if settings["gradient_length"] != "workload":
        return int(settings["gradient_length"])
    if settings["compute_s"] == "measure":  # the cache holds it beside the compute time
        return int(_measured(config, cache).record.param_count)
    return int(_cached_workload(config, cache).param_count)


def _measured(config: RunConfig, cache: dict[str, Any]):
    """The workload's gradient step on this machine, from the compute cache the plan
    command uses (measured and cached once when absent)."""
    from akosim.planning.setup import measured_compute

    if "measured" not in cache:
        cache["measured"] = measured_compute(
            config, load=lambda: _cached_workload(config, cache),
            refresh=cache.get("remeasure", False))
    return cache["measured"]


def _compute_s(config: RunConfig, settings: dict[str, Any], cache: dict[str, Any]) -> float:
    """The compute seconds per round of every point (from the compute cache if measured)."""
    if settings["compute_s"] != "measure":
        return float(settings["compute_s"])
    measured = _measured(config, cache)
    print(f"akosim sweep: {measured.provenance()} ({config.train.workload}, batch "
          f"{config.train.batch_size})")
    return float(measured.record.compute_s)


def _run_all(tasks: list[dict[str, Any]], jobs: int, quiet: bool) -> list[str]:
    """Run the tasks (progress on standard error unless `quiet`: akosim.progress);
    returns one line per failed point."""
    tracker = tracker_factory(quiet)
    advance = tracker("sweep", len(tasks), "points") if tracker is not None else None
    done = 0

    def one_more() -> None:
        nonlocal done
        done += 1
        if advance is not None:
            advance(done)
    failures: list[str] = []

    def failed(task: dict[str, Any], error: BaseException) -> None:
        values = ", ".join(f"{k}={v}" for k, v in task["grid"].items()) or "no grid values"
        failures.append(f"point {task['id']} ({values}) failed: "
                        f"{type(error).__name__}: {error}")

    try:
        if jobs == 1:
            for task in tasks:
                try:
                    run_point(task)
                except Exception as error:  # one bad point does not stop the sweep
                    failed(task, error)
                one_more()
            return failures
        context = multiprocessing.get_context("spawn")
        executor = concurrent.futures.ProcessPoolExecutor(
            max_workers=jobs, mp_context=context, initializer=_ignore_interrupts)
        try:
            futures = {executor.submit(run_point, task): task for task in tasks}
            for future in concurrent.futures.as_completed(futures):
                problem = future.exception()
                if problem is not None:
                    failed(futures[future], problem)
                one_more()
        except BaseException:
            # Ctrl-C: drop what has not started and stop the worker processes we started;
            # finished points are on disk, so the same command resumes.
            for process in list(getattr(executor, "_processes", {}).values()):
                process.terminate()
            executor.shutdown(wait=False, cancel_futures=True)
            raise
        executor.shutdown()
        return failures
    finally:
        if advance is not None and done < len(tasks):
            advance(len(tasks))  # a bar closes; lines say where it stopped


def run_sweep(argv: Sequence[str]) -> int:
    """`akosim sweep` from its own arguments (without the word sweep)."""
    return sweep_command(build_parser().parse_args(list(argv)))


def sweep_command(args: argparse.Namespace) -> int:
    """The `akosim sweep` command; user mistakes exit 2 with one line."""
    try:
        return 1 if sweep_grid(SweepRequest.from_args(args)) else 0
    except USER_ERRORS as error:
        _fail(str(error))
    except OSError as error:  # the result folder cannot be written
        _fail(f"--out {args.out}: {error}")


def sweep_grid(request: SweepRequest) -> list[str]:
    """Run the points of `request` not yet in its folder and collect every point into
    OUT/sweep.json and OUT/sweep.csv (the one path of `akosim sweep` and `akosim.sweep`);
    the lines of the points that failed."""
    shard = request.shard
    check_out_directory(request.out)  # refused now, not after measuring or running points
    settings = sim_settings(request)
    cache: dict[str, Any] = {"remeasure": request.compute == "remeasure"}
    points = expand_grid(request, settings)
    mine = shard_of(points, shard)
    out = request.out
    say = print if request.report else (lambda line: None)
    points_dir = out / "points"
    todo = [p for p in mine if not (points_dir / f"{p.id}.json").exists()]
    skipped = len(mine) - len(todo)
    jobs = min(request.jobs or os.cpu_count() or 1, max(len(todo), 1))
    length = 0
    if todo:
        length = _gradient_length(todo[0].config, settings, cache)
        for point in todo:
            check_fits(point.config, length)
    where = f"; shard {shard[0]}/{shard[1]} has {len(mine)}" if shard[1] > 1 else ""
    combinations = math.prod(len(values) for _, values in request.axes)
    if combinations > len(points):
        where = f" ({combinations - len(points)} equal to another merged){where}"
    say(f"akosim sweep: {len(points)} point(s){where}; {skipped} already in {points_dir} "
        f"(skipped), {len(todo)} to run" + (f" on {jobs} process(es)" if todo else ""))
    failures: list[str] = []
    if todo:
        compute_s = _compute_s(todo[0].config, settings, cache)
        cache.clear()
        tasks = [{"id": p.id, "grid": p.grid, "config": config_to_dict(p.config),
                  "settings": point_settings(settings, p.settle), "length": length,
                  "compute_s": compute_s,
                  "out": str(out), "choose_ssp": p.choose_ssp} for p in todo]
        points_dir.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        failures = _run_all(tasks, jobs, quiet=request.quiet)
        say(f"akosim sweep: ran {len(todo) - len(failures)} point(s) in "
            f"{format_duration(time.perf_counter() - started)}")
        for line in failures:
            print(f"akosim sweep: {line}", file=sys.stderr)
    found = collect(out, [dest for dest, _ in GRID_FLAGS], order=[p.id for p in points])
    say(f"wrote {out / 'sweep.json'} ({found.points} point(s)) and {out / 'sweep.csv'} "
        f"({found.rows} row(s))")
    if request.report:
        print_sweep_summary(out)
    return failures


def print_sweep_summary(out: Path) -> None:
    """The summary table at the end: the best configuration of each group."""
    from akosim.sweeping.sweep_summary import print_summary

    print_summary(out)
