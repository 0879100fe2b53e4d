"""akosim's public Python API: plan, simulate, train and predict, the calls the commands make.

Each function takes keyword settings that mirror the command line's flags
(``workers=64`` is ``--workers 64``, ``bandwidth="40mbps"``, ``p="auto"``,
``link_bandwidth=["40mbps", "20mbps"]`` is ``--link-bandwidth 40mbps,20mbps``,
``site=["4x1gbps", "4x50mbps"]`` is ``--site 4x1gbps --site 4x50mbps``,
``quiet=True`` is ``--quiet``), a settings file (``config="run.toml"``) and
dotted settings (``set={"exchange.ssp": 2}``); the settings resolve in the same
layers as the command line's (defaults < config < set < keywords). ``workload``
is a built-in name, ``"file.py:factory"``, ``"package.module:factory"`` or an
`akocore.Workload` object.

The commands are thin layers over the same functions: akosim.plan.execute's
`plan_outcome` is what
``akosim plan`` / ``akosim train`` print, `akosim.predict.predict_run` what
``akosim predict`` prints. A mistake raises a ValueError (`akocore.cli_support.UsageError`,
`akocore.config.ConfigError`, ...) with the line the command would print; an unknown keyword is a
TypeError naming the keywords there are.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import uuid
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

from akocore.cli_support import flag_text, parse_quietly, subcommand_parser
from akocore.results import RunResult

if TYPE_CHECKING:
    from akocore.results import PlanResult
    from akosim.plan.execute import PlanOutcome
    from akosim.predict import Prediction

# flags that are no setting of a call (the call returns what they would print or write)
NOT_KEYWORDS = frozenset({"--help", "--show-config", "--trace", "--out", "--config", "--set"})
# where a Workload object given to the API lives, importable by name for the settings
WORKLOAD_OBJECTS_MODULE = "akocore_api_workloads"


# ----------------------------------------------------------------- the public calls


def plan(config: str | os.PathLike[str] | None = None, *,
         set: Mapping[str, Any] | None = None, **settings: Any) -> PlanResult:
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
    ``explain=True`` fills ``explained`` with the longer explanation::

        ranked = akosim.plan(workers=8, bandwidth="10mbps", target_accuracy=0.9)
        print(ranked.ranking[0].label, ranked.ranking[0].time_to_target_s)
    """
    return _outcome("plan", config, set, settings).record


def simulate(config: str | os.PathLike[str] | None = None, *,
             set: Mapping[str, Any] | None = None, **settings: Any) -> RunResult:
    """One configuration, timing only: the `RunResult` of the configured scheme (``ako``
    unless ``scheme`` says otherwise)::

        import akosim
        run = akosim.simulate(workers=8, scheme="ako", p=4, ssp=2, bandwidth="100mbps",
                              compute="50ms", gradient_size="4MB", rounds=50)
        print(run.round_time_s, run.bytes_sent_per_worker_per_round, run.bottleneck)
    """
    return _outcome("plan", config, set, settings, one_scheme=True).record.runs[0]


def train(config: str | os.PathLike[str] | None = None, *,
          set: Mapping[str, Any] | None = None, **settings: Any) -> TrainedRun:
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
    outcome = _outcome("train", config, set, settings, one_scheme=True)
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


def predict(run_dir: str | os.PathLike[str], **settings: Any) -> Prediction:
    """Predict an akorun run exactly as it was configured (``akosim predict RUN_DIR``):
    the predicted round time beside the measured one, and the prediction as a plan
    record::

        import akosim
        prediction = akosim.predict("runs/mine", network_model="maxmin")
        print(prediction.predicted_round_time_s, prediction.measured_round_time_s,
              prediction.relative_error)
    """
    from akosim.predict import predict_run

    args = _parse("predict", [os.fspath(run_dir), *_flags("predict", settings)])
    return predict_run(args)


# ------------------------------------------------------------------ settings


def _outcome(command: str, config: Any, dotted: Mapping[str, Any] | None,
             settings: dict[str, Any], *, one_scheme: bool = False) -> PlanOutcome:
    """The outcome of keyword settings; `one_scheme`: ako when no layer chose a scheme."""
    from akosim.cli import resolve_settings
    from akosim.plan.execute import plan_outcome
    from akosim.plan.setup import SimulationOptions

    settings = dict(settings)
    if config is not None:
        settings["config"] = os.fspath(config)
    if dotted:
        settings["set"] = [f"{key}={flag_text(value)}" for key, value in dotted.items()]
    workload = settings.get("workload")
    if workload is not None and not isinstance(workload, str):
        settings["workload"] = workload_name(workload)
    training = command == "train"
    args = _parse(command, _flags(command, settings))
    resolved = resolve_settings(args, training=training)
    if one_scheme and not resolved.given("exchange.scheme"):
        args = _parse(command, _flags(command, {**settings, "scheme": "ako"}))
        resolved = resolve_settings(args, training=training)
    from akosim.cli import time_budget_s

    return plan_outcome(resolved, SimulationOptions.from_args(args, resolved),
                        training=training, max_staleness_rounds=args.max_staleness,
                        time_budget_s=time_budget_s(args),
                        explain_more=bool(getattr(args, "explain", False)),
                        rank_by=getattr(args, "rank_by", "accuracy"),
                        accuracy_margin_points=getattr(args, "accuracy_margin", None))


def workload_name(workload: Any) -> str:
    """A name the settings can carry for an `akocore.Workload` object (``module:factory``
    of an in-memory module of this process); TypeError for anything else."""
    from akocore.workloads import Workload

    if not isinstance(workload, Workload):
        raise TypeError(f"workload: expected a name or an akocore.Workload, got "
                        f"{type(workload).__name__}")
    module = sys.modules.get(WORKLOAD_OBJECTS_MODULE)
    if module is None:
        module = ModuleType(WORKLOAD_OBJECTS_MODULE, "Workload objects given to akosim's API.")
        sys.modules[WORKLOAD_OBJECTS_MODULE] = module
    factory = f"w_{uuid.uuid4().hex[:12]}"

    def make(**_: Any) -> Any:
        return workload

    setattr(module, factory, make)
    return f"{WORKLOAD_OBJECTS_MODULE}:{factory}"


def _subparser(command: str) -> argparse.ArgumentParser:
    from akosim.cli import build_parser

    return subcommand_parser(build_parser(), command)


def _flags(command: str, settings: Mapping[str, Any]) -> list[str]:
    """Keyword settings as the command's flags; TypeError for a keyword it has no flag for."""
    known = set(_subparser(command).known_flags()) - NOT_KEYWORDS  # type: ignore[attr-defined]
    by_field = _settings_without_flags()
    flags: list[str] = []
    for key, value in settings.items():
        flag = "--" + key.replace("_", "-")
        if key == "config":  # the call's own config= and set=, put here by _outcome
            flags += [flag, str(value)]
            continue
        if key == "set" or (key == "site" and not isinstance(value, str)):  # repeatable
            for item in value:
                flags += [flag, str(item)]
            continue
        if flag not in known and key in by_field:  # a setting with no flag: eval_every
            if value is not None:
                flags += ["--set", f"{by_field[key]}={flag_text(value)}"]
            continue
        if flag not in known:
            names = ", ".join(sorted({f[2:].replace("-", "_") for f in known} | set(by_field)))
            raise TypeError(f"akosim {command}: no setting {key!r}; the settings are {names}")
        if value is None or value is False:
            continue
        if value is True:
            flags.append(flag)
        else:
            flags += [flag, flag_text(value)]
    return flags


def _settings_without_flags() -> dict[str, str]:
    """Run settings with no flag of their own, by their name in the section: eval_every ->
    train.eval_every (a name two sections share is left to ``set``)."""
    from akocore.settings.key_registry import current

    names: dict[str, list[str]] = {}
    for dotted in current().by_dotted:
        section, _, name = dotted.partition(".")
        if section not in ("akorun",):
            names.setdefault(name, []).append(dotted)
    return {name: found[0] for name, found in names.items() if len(found) == 1}


def _parse(command: str, argv: Sequence[str]) -> argparse.Namespace:
    from akosim.cli import build_parser

    return parse_quietly(build_parser(), [command, *argv], f"akosim {command}: bad settings")


__all__ = ["TrainedRun", "plan", "predict", "simulate", "train", "workload_name"]
