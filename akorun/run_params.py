"""The trained model of an akorun run, back as the user's pytree (`load_params`).

Every training rank writes its final replica as one flat float32 vector
(``OUT/worker-R.npz``, in ``jax.flatten_util.ravel_pytree`` leaf order) beside its
record (``OUT/worker-R.json``, which echoes the run's configuration: the workload's
name with its arguments, the seed, the data path). The vector alone has no structure:
`load_params` rebuilds it from that workload (imported and built here, as the ranks
did) or from what the caller gives (a workload, or a pytree of the same structure),
and hands the vector back in it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from akorun.errors import UsageError

if TYPE_CHECKING:
    from akocore.records.results import RankResult
    from akocore.settings.schema import RunConfig
    from akocore.workloads import Workload
    from akocore.workloads.flat import FlatWorkload

__all__ = ["load_params"]


def load_params(run_dir: str | os.PathLike[str], rank: int | None = None, *,
                workload: str | Workload | None = None, like: Any = None) -> Any:
    """The model a run trained, as the workload's own pytree (the structure, shapes and
    dtypes its ``init`` returns; NumPy leaves)::

        import akorun
        run = akorun.launch(out="runs/demo", workers=3, rounds=50,
                            workload="examples/flax_cnn/mymodel.py:make", quiet=True)
        params = akorun.load_params("runs/demo")   # {"Conv_0": {"kernel": ..., ...}, ...}

    `rank` None is rank 0's replica (rank 0 always trains; under plain SGD every
    training rank ends with the same replica, and ``result.json``'s
    ``max_relative_difference`` says how far the others are from it under any
    optimizer); give `rank` for another training rank's. A parameter server holds
    a shard, not a model, and is refused.

    The structure comes from the run's own workload (``train.workload`` of its record,
    with its arguments and seed), imported and built here: a file path in it is
    relative to the directory the run was launched from, so call this from there,
    or give the structure yourself: `workload`, a workload name or an
    `akocore.Workload` object (the one you trained), or `like`, any pytree of the same
    structure (e.g. the initial parameters you gave `akorun.Exchange`).

    Raises `akorun.errors.UsageError` (one line) when the run directory,
    the rank's files or the workload do not fit.
    """
    directory = Path(run_dir)
    if not directory.is_dir():
        raise UsageError(f"{directory}: not a directory (give the run directory, the --out "
                         f"of its ranks)")
    chosen = 0 if rank is None else int(rank)
    record = _rank_record(directory, chosen)
    if record.role != "worker":
        raise UsageError(f"{directory}: rank {chosen} is a parameter server; it holds a "
                         f"shard of the model, not the model: give a training rank")
    flat = _replica(directory, record)
    if like is not None:
        from akocore.workloads.param_tree import unflatten_like

        try:
            return unflatten_like(flat, like)
        except ValueError as error:
            raise UsageError(f"{directory}: like= does not fit rank {chosen}'s "
                             f"{flat.size:,} parameters ({error})") from None
    flat_workload = _structure(directory, _config(directory, record), workload)
    if flat_workload.param_count != flat.size:
        raise UsageError(f"{directory}: rank {chosen} trained {flat.size:,} parameters but "
                         f"workload {flat_workload.name} builds {flat_workload.param_count:,} "
                         f"(another workload, or its file changed since the run; a run of "
                         f"akorun.Exchange: give like=your initial parameters)")
    return flat_workload.params_tree(flat)


def _rank_record(directory: Path, rank: int) -> RankResult:
    from akocore.records.results import RankResult

    path = directory / f"worker-{rank}.json"
    if not path.is_file():
        ranks = sorted(int(p.stem.split("-")[1]) for p in directory.glob("worker-*.json")
                       if p.stem.split("-")[1].isdigit())
        held = ", ".join(map(str, ranks)) if ranks else "none"
        raise UsageError(f"{directory}: rank {rank} left no record (worker-{rank}.json); "
                         f"ranks with a record: {held}")
    try:
        return RankResult.from_json(json.loads(path.read_text(encoding="utf-8")), path.name)
    except (OSError, ValueError) as error:  # RecordError and bad JSON are ValueErrors
        raise UsageError(f"{path}: not a rank record ({error})") from None


def _replica(directory: Path, record: RankResult) -> np.ndarray:
    """The rank's final flat parameters, checked against the digest its record holds."""
    from akorun.runtime.node_plan import params_digest

    path = directory / f"worker-{record.rank}.npz"
    if not path.is_file():
        raise UsageError(f"{directory}: rank {record.rank} left no parameters "
                         f"(worker-{record.rank}.npz): it ended before it joined the run")
    try:
        with np.load(path) as data:
            flat = np.array(data["params"], dtype=np.float32)
    except (OSError, ValueError, KeyError) as error:
        raise UsageError(f"{path}: not a parameter file ({error})") from None
    recorded = record.details.get("params_sha256")
    if isinstance(recorded, str) and recorded != params_digest(flat):
        raise UsageError(f"{path}: these are not the parameters worker-{record.rank}.json "
                         f"records (files of two runs in one directory?)")
    return flat


def _config(directory: Path, record: RankResult) -> RunConfig:
    from akorun.launching.run_merge import _config_of

    return _config_of(record, directory / f"worker-{record.rank}.json")


def _structure(directory: Path, cfg: RunConfig, workload: str | Workload | None
               ) -> FlatWorkload:
    """The workload whose parameters give the vector its structure, built with the run's
    seed (the same init the ranks called)."""
    from akocore.workloads import Workload
    from akocore.workloads.flat import build_workload, flat_workload

    train = cfg.train
    if workload is not None and not isinstance(workload, str | Workload):
        raise TypeError(f"akorun.load_params: workload is a name or an akocore.Workload, "
                        f"got {type(workload).__name__} (a pytree of the structure: like=)")
    try:
        if isinstance(workload, Workload):
            return flat_workload(workload, batch_size=train.batch_size, seed=train.seed)
        return build_workload(workload or train.workload, batch_size=train.batch_size,
                              seed=train.seed, data_path=train.data_path)
    except ValueError as error:  # WorkloadError, DataError: one line each
        if workload is not None:
            raise UsageError(f"akorun.load_params: workload: {error}") from None
        raise UsageError(f"{directory}: cannot build the run's workload {train.workload} "
                         f"here to give its parameters their structure ({error}); call from "
                         f"the directory the run was launched from, or give workload= or "
                         f"like=") from None
