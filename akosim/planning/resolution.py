"""The settings of one plan or train, resolved in layers: the command's defaults < the run
``compute_from`` names (its workload, batch, optimizer and data) < the layers above the
defaults (a settings file, ``--set`` or overrides, flags or a Python call's keywords).

The command line (akosim.cli) and the Python API (akosim.sim_api) give their layers
here, so both resolve a plan the same way; each value keeps its origin.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from akocore.settings.layers import Given, Layer, Origin, ResolvedSettings, resolve
from akosim.planning.runspec import TIMING_DEFAULTS, TRAIN_DEFAULTS, timing_defaults_for


def resolve_settings(layers: Sequence[Given], *, training: bool,
                     compute_from: str | os.PathLike[str] | None = None,
                     time_budget: bool = False) -> ResolvedSettings:
    """The command's defaults < the run `compute_from` names < `layers`, each value with
    its origin. A plan ranking by accuracy (a target accuracy, or `time_budget`) takes
    akosim train's defaults: it trains, and its timing rows time that same workload."""
    defaults = TRAIN_DEFAULTS if training else TIMING_DEFAULTS
    name = "akosim train" if training else "akosim plan"
    adopted: list[Given] = []
    if compute_from:  # the run's gradient and batch go with its compute
        from akosim.calibration.run_calibration import check_run_training, run_training_layer

        adopted = run_training_layer(os.fspath(compute_from))
    given = [*adopted, *layers]
    resolved = resolve(given, defaults=defaults,
                       defaults_origin=Origin(Layer.DEFAULT, f"{name} default"))
    workload = resolved.config.train.workload
    if not training and not resolved.given("train.batch_size") and \
            timing_defaults_for(workload) is not defaults:
        # a user's workload is planned at akorun's batch, not the seeds' CNN's
        resolved = resolve(given, defaults=timing_defaults_for(workload), defaults_origin=Origin(
            Layer.DEFAULT, f"{name} default (akorun's batch for {workload})"))
    if not training and (resolved.config.train.target_accuracy is not None or time_budget):
        # a plan ranking by accuracy trains: the workload, batch and data of akosim train
        # (the timing rows then time that same workload)
        resolved = resolve(given, defaults=TRAIN_DEFAULTS, defaults_origin=Origin(
            Layer.DEFAULT, "akosim plan default (ranking by accuracy)"))
    if adopted:
        check_run_training(resolved, os.fspath(compute_from))  # type: ignore[arg-type]
    return resolved
