"""akosim's application layer: the one place that turns resolved settings into a runnable
simulation setup, used by every entry point (plan, train, sweep, predict, the analysis).

- akosim.plan.setup: `SimulationOptions` (what akosim takes beside the run settings:
  compute source, overheads, speeds, coalescing, TCP calibration), the compute
  measurement through the per-machine cache, the TCP parameters, the rule that
  chooses s with p, the rule that settles each configuration's round time (`settles`),
  `build_setup` (the only constructor of a scenario setup) and `simulation_setup`, from
  resolved settings to a setup.
- akosim.plan.execute: `run_setup` / `plan_runs`, the runs a command asks for.
- akosim.plan.advice (p held within --max-staleness, s chosen with p, the one-line
  plan and the recommendation), akosim.plan.accuracy_ranking (the ranking by simulated
  training), akosim.plan.long_explanation (--explain).

Calling the package plans: ``akosim.plan(workers=64, bandwidth="40mbps")`` is
`akosim.sim_api.plan` (the public call shares the package's name).
"""

import sys
import types
from importlib import import_module
from typing import Any

from akosim.plan.execute import PlannedRuns, PlanOutcome, plan_outcome, plan_runs, run_setup
from akosim.plan.setup import (
    MEASURE_STEPS,
    SimulationOptions,
    build_setup,
    chooses_ssp_with_p,
    measured_compute,
    settles,
    simulation_setup,
    tcp_parameters_for,
)

__all__ = ["MEASURE_STEPS", "PlanOutcome", "PlannedRuns", "SimulationOptions", "build_setup",
           "chooses_ssp_with_p", "plan_outcome", "measured_compute", "plan_runs", "run_setup",
           "settles", "simulation_setup", "tcp_parameters_for"]


class _CallablePackage(types.ModuleType):
    """``akosim.plan(...)`` is the public plan call (akosim.sim_api.plan), and ``akosim.plan``
    stays this package: the attribute of a package is its subpackage once imported."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # looked up by name when called, as akocore's lazy exports are: the API is built
        # on this package, not the other way round
        return import_module("akosim.sim_api").plan(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
