"""akosim's application layer: the one place that turns resolved settings into a runnable
simulation setup, used by every entry point (plan, train, sweep, predict, the analysis).

- akosim.planning.setup: `SimulationOptions` (what akosim takes beside the run settings:
  compute source, overheads, speeds, coalescing, TCP calibration), the compute
  measurement through the per-machine cache, the TCP parameters, the rule that
  chooses s with p, the rule that settles each configuration's round time (`settles`),
  `build_setup` (the only constructor of a scenario setup) and `simulation_setup`, from
  resolved settings to a setup.
- akosim.planning.execute: `run_setup` / `plan_runs`, the runs a command asks for.
- akosim.planning.advice (p held within --max-staleness, s chosen with p, the one-line
  plan and the recommendation), akosim.planning.accuracy_ranking (the ranking by simulated
  training), akosim.planning.long_explanation (--explain).

The public calls (``akosim.plan(workers=64, bandwidth="40mbps")``, akosim.sim_api) are
built on this package.
"""

from akosim.planning.execute import PlannedRuns, PlanOutcome, plan_outcome, plan_runs, run_setup
from akosim.planning.setup import (
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
