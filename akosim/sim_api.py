"""akosim's public Python API: plan, simulate, train, sweep and predict, the calls the
commands make.

Each call names its settings as typed keyword parameters (``inspect.signature`` and
``help()`` list them): every run setting the command takes, by the key's name
(``workers=64``, ``bandwidth="40mbps"`` or ``40e6`` bits/s, ``p="auto"``,
``link_bandwidth=["40mbps", "20mbps"]``, ``site=["4x1gbps", "4x50mbps"]``), a
settings without a flag whose name is unique (``eval_every=20``), and the command's own
options (``gradient_size="17MB"`` or bytes, ``round_overhead="3ms"`` or seconds,
``max_staleness=8``). A value left None is not given: the layer below decides. A
settings file (``config="run.toml"``) and dotted ``overrides`` (``{"exchange.ssp": 2}``)
complete them; the settings resolve in the command line's layers (defaults < config <
overrides < keywords), the keywords entering directly as the API layer, whose origin
says "api" (akocore.settings.api_layer; no flag text is built). ``workload`` is a
built-in name, ``"file.py:factory"``, ``"package.module:factory"`` or an
`akocore.Workload` object, taken as itself.

The commands are thin layers over the same functions: akosim.planning.execute's
`plan_outcome` is what ``akosim plan`` / ``akosim train`` print, `akosim.prediction.predict_run`
what ``akosim predict`` prints. A mistake raises a ValueError (`akocore.cli_support.UsageError`,
`akocore.settings.normalise.ConfigError`, ...) with the line the command would print; an
unknown keyword is a TypeError naming the settings there are.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from akocore.cli_support import UsageError
from akocore.records.results import RunResult
from akocore.settings.api_layer import api_layer, config_layers, takes_settings, typed
from akocore.settings.key_registry import Tool
from akocore.settings.layers import Given, Layer
from akocore.workloads.spec import Workload
from akosim.planning.setup import simulation_options

if TYPE_CHECKING:
    from akocore.records.results import PlanResult
    from akosim.planning.execute import PlanOutcome
    from akosim.prediction import Prediction
    from akosim.sweeping.sweepfiles import Sweep

PLAN_TOOLS = (Tool.AKOSIM, Tool.AKOSIM_PLAN)  # the settings plan, simulate and train take
Config = str | os.PathLike[str] | None
WorkloadGiven = str | Workload | None  # a name, or a Workload object taken as itself


# ----------------------------------------------------------------- the public calls


@takes_settings(*PLAN_TOOLS, options=(simulation_options,))
def plan(config: Config = None, *, overrides: Mapping[str, Any] | None = None,
         max_staleness: int | None = None, rank_by: str = "accuracy",
         accuracy_margin: float | None = None, time_budget: str | float | None = None,
         explain: bool = False, quiet: bool = True, workload: WorkloadGiven = None,
         **settings: Any) -> PlanResult:
    """What p, what round time, how much traffic, how stale: ``akosim plan`` from Python.

    Without ``scheme`` every scheme is compared (Ako with p chosen, p=1, a
    parameter server, ring all-reduce); the record's ``runs`` are the rows of the
    table and ``explanation`` / ``advice`` / ``chosen_ssp`` the recommendation::

        import akosim
        plan = akosim.plan(workers=64, bandwidth="40mbps", p="auto", compute="0.3s",
                           gradient_size="17MB")
        for run in plan.runs:
            print(run.label, run.round_time_s, run.nic_utilisation)
        print(plan.explanation)

    By default every row also trains in simulated time (the workload itself when
    small, else a proxy on up to 8 of the workers) and ``recommendation`` names the
    row predicted to reach 90% of the best accuracy first, never one more than
    ``accuracy_margin`` points below the best (``ranking`` holds every row);
    ``rank_by="throughput"`` recommends the highest samples/s instead.
    With ``target_accuracy`` (or ``time_budget="60s"``) up to three configurations of
    each scheme within ``max_staleness`` (the fastest, the least stale not much slower,
    one between) also train the workload in simulated time,
    and ``ranking`` orders them by time to that accuracy (or accuracy within the budget);
    ``explain=True`` fills ``explained`` with the longer explanation; ``quiet=False``
    prints a line per candidate it trains on stderr::

        ranked = akosim.plan(workers=8, bandwidth="10mbps", target_accuracy=0.9)
        print(ranked.ranking[0].label, ranked.ranking[0].time_to_target_s)
    """
    if max_staleness is not None and (isinstance(max_staleness, bool)
                                      or not isinstance(max_staleness, int)):
        raise UsageError(f"akosim.plan: max_staleness: got {max_staleness!r}, expected a "
                         f"whole number of rounds")
    budget_s = None
    if time_budget is not None:
        from akosim.planning.setup import seconds_of

        budget_s = seconds_of(time_budget, "--time-budget")
    return _outcome("plan", config, overrides, {**settings, "workload": workload}, quiet=quiet,
                    max_staleness_rounds=max_staleness, time_budget_s=budget_s,
                    explain_more=explain, rank_by=rank_by,
                    accuracy_margin_points=accuracy_margin).record


@takes_settings(*PLAN_TOOLS, options=(simulation_options,))
def simulate(config: Config = None, *, overrides: Mapping[str, Any] | None = None,
             quiet: bool = True, workload: WorkloadGiven = None, **settings: Any) -> RunResult:
    """One configuration, timing only: the `RunResult` of the configured scheme (``ako``
    unless ``scheme`` says otherwise)::

        import akosim
        run = akosim.simulate(workers=8, scheme="ako", p=4, ssp=2, bandwidth="100mbps",
                              compute="50ms", gradient_size="4MB", rounds=50)
        print(run.round_time_s, run.bytes_sent_per_worker_per_round, run.bottleneck)
    """
    return _outcome("simulate", config, overrides, {**settings, "workload": workload},
                    one_scheme=True,
                    quiet=quiet).record.runs[0]


@takes_settings(*PLAN_TOOLS, options=(simulation_options,))
def train(config: Config = None, *, overrides: Mapping[str, Any] | None = None,
          quiet: bool = True, workload: WorkloadGiven = None, **settings: Any) -> TrainedRun:
    """Simulated training: the workers really train the workload, each partial applied at
    its simulated arrival. Returns the training record (accuracy against simulated time
    in ``evaluations``, ``accuracy``, ``time_to_target_s``) of the configured scheme
    (``ako`` unless ``scheme`` says otherwise), with the trained model in ``params``: the
    first worker's replica at the end, as the workload's own pytree (the structure,
    shapes and dtypes its ``init`` returns; NumPy leaves), what `akorun.load_params`
    gives back from an akorun run::

        import akosim
        run = akosim.train(workers=4, bandwidth="100mbps", compute="10ms", rounds=40,
                           workload="digits-mlp", eval_every=20)
        print(run.accuracy, run.evaluations[-1])
        params = run.params
    """
    outcome = _outcome("train", config, overrides, {**settings, "workload": workload},
                       one_scheme=True, quiet=quiet)
    return TrainedRun.of(outcome.record.runs[0], outcome.planned.runs[0].final_params)


class TrainedRun(RunResult):
    """`akosim.train`'s record: a `RunResult` (its fields, its JSON) and ``params``, the
    trained model as the workload's own pytree (not part of the record's JSON)."""

    params: Any = None

    @classmethod
    def of(cls, run: RunResult, params: Any) -> TrainedRun:
        trained = cls(**{f.name: getattr(run, f.name) for f in dataclasses.fields(run)})
        object.__setattr__(trained, "params", params)  # a record field it is not
        return trained


@takes_settings(Tool.AKOSIM)
def predict(run_dir: str | os.PathLike[str], config: Config = None, *,
            overrides: Mapping[str, Any] | None = None, compute: str = "run",
            host_calibration: str | os.PathLike[str] | None = None,
            **settings: Any) -> Prediction:
    """Predict an akorun run exactly as it was configured (``akosim predict RUN_DIR``):
    the predicted round time beside the measured one, and the prediction as a plan
    record. `compute` "run" takes the run's measured compute, "measure" akosim's own
    measurement on this host; a setting given restates the run (one that contradicts it
    is a UsageError), ``network_model`` chooses how the network is simulated::

        import akosim
        prediction = akosim.predict("runs/mine", network_model="maxmin")
        print(prediction.predicted_round_time_s, prediction.measured_round_time_s,
              prediction.relative_error)
    """
    from akosim.prediction import predict_run

    layers = [*config_layers(config, overrides),
              *api_layer(settings, (Tool.AKOSIM,), "akosim.predict")]
    return predict_run(run_dir, layers, compute_source=compute,
                       host_calibration=None if host_calibration is None
                       else os.fspath(host_calibration))


@typed
def sweep(out: str | os.PathLike[str], config: Config = None, *,
          overrides: Mapping[str, Any] | None = None,
          workers: int | Sequence[int] | None = None,
          bandwidth: str | float | Sequence[str | float] | None = None,
          p: str | int | Sequence[str | int] | None = None,
          ssp: float | str | Sequence[float | str] | None = None,
          scheme: str | Sequence[str] | None = None,
          latency: str | float | Sequence[str | float] | None = None,
          compute: str | float = "measure", gradient_size: str | int | None = None,
          rounds: int | None = None, workload: str | None = None,
          workload_args: Mapping[str, Any] | None = None, batch_size: int | None = None,
          max_staleness: int | None = None, jobs: int | None = None,
          shard: tuple[int, int] | None = None, quiet: bool = True) -> Sweep:
    """A grid of timing-only simulations (``akosim sweep``), run in parallel, resumable:
    every combination of the grid's values (`workers`, `bandwidth`, `p`, `ssp`,
    `scheme`, `latency`: a value or a sequence of grid values, never a per-node list,
    which goes in `config` or `overrides`), each point written to OUT/points/<id>.json
    and skipped when already there; returns OUT/sweep.json's record (its ``points``,
    each with its ``runs``). `compute` is seconds per round ("0.3s" or 0.3) or "measure";
    `shard` (I, N) runs the points whose index modulo N is I; a point that fails is a
    RuntimeError naming it, after the others ran; ``quiet=False`` prints what the command
    prints::

        import akosim
        grid = akosim.sweep("sweep/", workers=[4, 16], bandwidth=["40mbps", "1gbps"],
                            p=[1, 4, "auto"], compute="0.3s", gradient_size="17MB")
        for point in grid.points:
            print(point.grid, point.runs[0].round_time_s)
    """
    from akosim.sweeping.sweep_flags import GRID_FLAGS
    from akosim.sweeping.sweep_grid import sweep_grid
    from akosim.sweeping.sweep_request import SweepRequest
    from akosim.sweeping.sweepfiles import read_sweep

    given = {"workers": workers, "bandwidth": bandwidth, "p": p, "ssp": ssp,
             "scheme": scheme, "latency": latency}
    axes = tuple((dest, tuple(_grid_list(given[dest]))) for dest, _ in GRID_FLAGS
                 if given[dest] is not None)
    fixed = {"rounds": rounds, "workload": workload, "batch_size": batch_size,
             "workload_args": workload_args}
    layers = [*config_layers(config, overrides),
              *api_layer(fixed, (Tool.AKOSIM,), "akosim.sweep")]
    if max_staleness is not None and (isinstance(max_staleness, bool)
                                      or not isinstance(max_staleness, int)):
        raise UsageError(f"akosim.sweep: max_staleness: got {max_staleness!r}, expected a "
                         f"whole number of rounds")
    if shard is not None:
        index, count = shard
        if not 0 <= index < count:
            raise UsageError(f"akosim.sweep: shard: got {shard!r}, expected (I, N) with "
                             f"0 <= I < N")
    from akosim.planning.setup import compute_setting, gradient_bytes_of

    request = SweepRequest(
        out=Path(out), axes=axes, layers=tuple(layers),
        point_layer=lambda values: api_layer(values, (Tool.AKOSIM,), "akosim.sweep"),
        compute=compute_setting(compute),
        gradient_bytes=None if gradient_size is None else gradient_bytes_of(gradient_size),
        max_staleness=max_staleness, jobs=jobs, shard=shard or (0, 1), quiet=quiet,
        report=not quiet)
    failures = sweep_grid(request)
    if failures:
        raise RuntimeError(f"akosim.sweep: {len(failures)} point(s) failed: {failures[0]}")
    return read_sweep(Path(out))


def _grid_list(value: Any) -> list[Any]:
    """A grid setting's values: one value, or a sequence of them (text is one value)."""
    if isinstance(value, str) or not isinstance(value, Sequence):
        return [value]
    return list(value)


# ------------------------------------------------------------------ settings


def _outcome(command: str, config: Config, overrides: Mapping[str, Any] | None,
             settings: dict[str, Any], *, one_scheme: bool = False, quiet: bool = True,
             **plan_options: Any) -> PlanOutcome:
    """The outcome of a call's settings; `one_scheme`: ako when no layer chose a scheme."""
    from akosim.planning.execute import plan_outcome
    from akosim.planning.resolution import resolve_settings

    names = [name for name in inspect.signature(simulation_options).parameters
             if name != "akosim"]
    own = {name: settings.pop(name) for name in names if name in settings}
    own = {name: value for name, value in own.items() if value is not None}
    workload = settings.get("workload")
    if isinstance(workload, Workload):
        from akocore.workloads.naming import given_workload_name

        settings["workload"] = given_workload_name(workload)
    layers = [*config_layers(config, overrides),
              *api_layer(settings, PLAN_TOOLS, f"akosim.{command}", options=names)]
    training = command == "train"
    budget = plan_options.get("time_budget_s") is not None

    def resolved_of(given: list[Given]) -> Any:
        return resolve_settings(given, training=training,
                                compute_from=own.get("compute_from"), time_budget=budget)

    resolved = resolved_of(layers)
    if one_scheme and not resolved.given("exchange.scheme"):
        resolved = resolved_of([*layers, Given("exchange.scheme", "ako", Layer.API,
                                               f"api: akosim.{command} runs ako unless "
                                               f"scheme says otherwise")])
    return plan_outcome(resolved, simulation_options(resolved.akosim, **own),
                        training=training, announce=None if quiet else _to_stderr,
                        **plan_options)


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


__all__ = ["TrainedRun", "plan", "predict", "simulate", "sweep", "train"]
