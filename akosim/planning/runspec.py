"""What one akosim run is made of, shared by the plan, train and sweep commands.

This module owns the pieces every akosim command needs between the resolved
settings and the simulation: each command's own defaults, the user errors it
reports as one line, the workload, the gradient length (``--gradient-size``
or the workload's), the check that p and the workers fit that gradient, and
the runs of the configured scheme (ako, ps with a fixed or the best server
count, or ring all-reduce). It imports nothing from the command modules, so
akosim.cli and akosim.sweeping.sweep_grid both import it and not each other.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from akocore.cli_support import UsageError
from akocore.data.catalog import DataError
from akocore.partition import PartitionError
from akocore.settings.normalise import ConfigError
from akocore.settings.schema import RunConfig, TrainConfig
from akocore.units import UnitError, parse_duration, parse_size, refuse_bare_number
from akosim.calibration.run_calibration import CalibrationError
from akosim.sim.settling import SETTLE_CAP_ROUNDS

if TYPE_CHECKING:
    from akocore.workloads.flat import FlatWorkload
    from akosim.sim.scenario import Setup, SimRun

# timing-only planning defaults to the seeds' CNN (17 MB gradient) at their batch size; rounds
# not given by any layer: each configuration is simulated until its round time settles, at
# most the settle cap (akosim.planning.setup.settles, akosim.sim.settling)
TIMING_DEFAULTS = RunConfig(train=TrainConfig(workload="synthetic-cnn", batch_size=104,
                                              rounds=SETTLE_CAP_ROUNDS))
TRAIN_DEFAULTS = RunConfig()


def timing_defaults_for(workload: str) -> RunConfig:
    """The timing plan's defaults for a plan of `workload`: the seeds' batch goes with the
    seeds' CNN only; any other workload (a user's) is planned at the batch akosim train and
    akorun use, so the plan times what a launch will run."""
    if workload == TIMING_DEFAULTS.train.workload:
        return TIMING_DEFAULTS
    train = replace(TIMING_DEFAULTS.train, workload=workload,
                    batch_size=TRAIN_DEFAULTS.train.batch_size)
    return replace(TIMING_DEFAULTS, train=train)

USER_ERRORS = (UsageError, ConfigError, UnitError, DataError, PartitionError, CalibrationError)

ProgressFactory = Callable[[str, int], Callable[[int], None]]


def load_workload(cfg: RunConfig) -> FlatWorkload:
    """The configured workload, or a one-line UsageError naming what is wrong."""
    from akocore.workloads.flat import build_workload

    try:
        workload = build_workload(cfg.train.workload, batch_size=cfg.train.batch_size,
                                  seed=cfg.train.seed, data_path=cfg.train.data_path)
    except (ValueError, TypeError) as error:
        raise UsageError(f"--workload: {error}") from None
    for notice in workload.notices:  # e.g. bf16 parameters trained as float32
        print(f"akosim: {notice}", file=sys.stderr)
    return workload


def gradient_length_of_size(text: str) -> int:
    """``--gradient-size`` text ("17MB") -> the number of float32 values it holds."""
    refuse_bare_number(f"--gradient-size {text}", text, "MB")
    size = parse_size(text)
    if size < 4 or size % 4:
        raise UsageError(f"--gradient-size: got {text}, expected a whole "
                         f"number of float32 values (a multiple of 4 bytes)")
    return int(size) // 4


def check_fits(cfg: RunConfig, length: int) -> None:
    """p and the number of workers must fit a gradient of `length` float32 values."""
    p = cfg.exchange.p
    if isinstance(p, tuple) and max(p) > length:
        raise UsageError(f"--p: got {max(p)}, but the gradient has only {length} elements; "
                         f"expected 1..{length} or auto")
    if cfg.cluster.workers > length:
        raise UsageError(f"--workers: {cfg.cluster.workers} workers need a gradient of at "
                         f"least that many elements (have {length})")


def configured_runs(setup: Setup, *, factory: ProgressFactory | None = None,
                    **kwargs: Any) -> list[SimRun]:
    """The one run of the configured scheme (ps with servers "best": the best of them)."""
    from akocore.schemes.registry import scheme_named
    from akosim.sim.scenario import Variant, ako_variant

    exchange = setup.config.exchange
    scheme = scheme_named(exchange.scheme)
    if scheme.has_servers:
        ssp = scheme.effective_ssp(exchange)
        if exchange.ps_servers == "best":
            from akosim.planning.compare import best_ps

            best, tried = best_ps(setup, ssp=ssp, factory=factory, name=scheme.name,
                                  **kwargs)
            best.label = f"{scheme.name} {best.ps_servers} server(s), best of {len(tried)}"
            return [best]
        servers = int(exchange.ps_servers)
        mode = scheme.label(exchange)
        variant = Variant(scheme.name, ps_servers=servers, ssp=ssp,
                          label=f"{scheme.name} {servers} server(s)" + (f", {mode}" if mode
                                                                         else ""))
    elif scheme.partitioned:
        variant = ako_variant(setup)
    else:
        variant = Variant(scheme.name, label=scheme.variant_label(exchange))
    from akosim.planning.compare import run_variant

    return [run_variant(setup, variant, factory=factory, **kwargs)]


def parse_duration_flag(flag: str, text: str) -> float:
    """A duration flag's seconds; a bare number is refused ("--compute 300: add a unit")."""
    refuse_bare_number(f"{flag} {text}", text, "ms")
    return parse_duration(text)
