"""What `akosim --compute-from FILE` takes from a real run: a Calibration.

FILE is akorun's merged ``result.json`` (a RunResult, made into a Calibration
here) or a calibration file (what ``python -m analysis.run`` writes beside a
calibrated run); files written before the schema are read too
(akocore.records.result_reader.read_result). Per-rank values are spread over the simulated
nodes in turn, ranks without a value having the others' mean
(akocore.records.figures.fill_missing). A run's result also names its workload, batch,
optimizer and data: `run_training_layer` gives them as a settings layer just
above the command's defaults, so the simulated gradient is the run's and
--show-config says so, and `check_run_training` refuses a layer that gives
another one.
"""

from __future__ import annotations

import json
from pathlib import Path

from akocore.records.calibration import Calibration
from akocore.records.figures import fill_missing, tile
from akocore.records.result_reader import read_result
from akocore.records.results import RecordError, RunResult
from akocore.records.run_figures import rank_overhead_s
from akocore.settings.layers import Given, Layer, ResolvedSettings
from akocore.settings.schema import RunConfig

__all__ = ["CalibrationError", "check_run_training", "run_training_layer", "compute_from_result",
           "message_overhead_from_result", "message_software_from_result",
           "overhead_from_result", "rank_overhead_s", "read_calibration",
           "run_message_software_s"]


class CalibrationError(ValueError):
    """--compute-from names no usable result: one line for the user."""


def read_calibration(path: str | Path) -> Calibration:
    """The Calibration in `path` (an akorun result or a calibration file)."""
    try:
        record = read_result(json.loads(Path(path).read_text()))
    except FileNotFoundError:
        raise CalibrationError(f"--compute-from: no file {path}") from None
    except (OSError, ValueError) as error:  # RecordError and JSON errors are ValueErrors
        raise CalibrationError(f"--compute-from: {path} is not an akorun result or "
                               f"calibration ({error})") from None
    if isinstance(record, Calibration):
        return record
    if isinstance(record, RunResult):
        return Calibration.from_run(record, source=str(path))
    raise CalibrationError(f"--compute-from: {path} holds a {type(record).__name__}, not "
                           f"an akorun result (result.json) or a calibration")


def _calibration_or_none(path: str | Path) -> Calibration | None:
    try:
        return read_calibration(path)
    except (CalibrationError, RecordError):
        return None


def compute_from_result(path: str | Path, workers: int) -> tuple[float, ...]:
    """Per-node measured compute seconds per round."""
    times = read_calibration(path).compute_s(workers)
    if not times:
        raise CalibrationError(f"--compute-from: {path} lists no worker with a measured "
                               f"compute time")
    return times


def overhead_from_result(path: str | Path, workers: int) -> tuple[float, ...] | None:
    """Per-node seconds per round outside the gradient and the gate; None when no rank
    gives one (then there is no overhead to model) or the file is unusable."""
    calibration = _calibration_or_none(path)
    return calibration.overhead_s(workers) if calibration is not None else None


def message_overhead_from_result(path: str | Path, nodes: int) -> tuple[float, ...]:
    """Per-node seconds a message costs beyond the emulated wire; () when no rank has it."""
    calibration = _calibration_or_none(path)
    return (calibration.message_overhead_s(nodes) or ()) if calibration is not None else ()


def message_software_from_result(path: str | Path, nodes: int) -> tuple[float, ...] | None:
    """Per node: akorun's per-message software cost measured without network time
    (RankResult.message_software_s, akorun's wirecost branch), or None when the file
    is not a run result or no rank has it. Unlike message_overhead_s it holds no network
    time, so a model of the real network may add it."""
    try:
        record = read_result(json.loads(Path(path).read_text()))
    except (OSError, ValueError):
        return None
    if not isinstance(record, RunResult):
        return None
    return run_message_software_s(record, nodes)


def run_message_software_s(run: RunResult, nodes: int) -> tuple[float, ...] | None:
    values = [getattr(rank, "message_software_s", None) for rank in run.per_worker]
    if all(v is None for v in values):
        return None
    known = fill_missing(values)
    return tile(known, nodes) if known else None


# the run's settings that decide the gradient and the compute time: taken with its compute
RUN_TRAINING_KEYS = ("train.workload", "train.batch_size", "train.optimizer", "train.data_path")


def run_config_of(path: str | Path) -> RunConfig | None:
    """The configuration an akorun result records (None: a calibration file, or none)."""
    from akocore.settings.toml_io import config_from_dict

    try:
        record = read_result(json.loads(Path(path).read_text()))
    except (OSError, ValueError):
        return None  # read_calibration reports the unreadable file
    if not isinstance(record, RunResult) or not record.config:
        return None
    try:
        return config_from_dict(record.config)
    except (ValueError, TypeError):
        return None


def run_training_layer(path: str | Path) -> list[Given]:
    """The workload, batch, optimizer and data of the run whose compute time --compute-from
    takes, as a settings layer just above the command's defaults (any other layer that
    gives one must give the same: `check_run_training`); [] for a calibration file."""
    ran = run_config_of(path)
    if ran is None:
        return []
    source = f"as the run in {path} (--compute-from)"
    return [Given(dotted, getattr(ran.train, dotted.split(".", 1)[1]), Layer.DEFAULT, source)
            for dotted in RUN_TRAINING_KEYS]


def check_run_training(resolved: ResolvedSettings, path: str | Path) -> None:
    """CalibrationError when a layer gave another workload, batch, optimizer or data than
    the run --compute-from names (the measured compute time would belong to a different
    gradient)."""
    ran = run_config_of(path)
    if ran is None:
        return
    cfg = resolved.config
    for dotted in RUN_TRAINING_KEYS:
        name = dotted.split(".", 1)[1]
        given, used = getattr(cfg.train, name), getattr(ran.train, name)
        if resolved.given(dotted) and given != used:
            raise CalibrationError(f"--compute-from: {path} ran {name} {used!r}, but "
                                   f"{given!r} is given {resolved.origin(dotted)}; drop it "
                                   f"or use a run of that {name}")
