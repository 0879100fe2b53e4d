"""One run's ``result.json`` from the records its ranks wrote (``akorun merge``).

Every rank writes ``OUT/worker-R.json`` (its RankResult, which carries the run
id and the configuration in its details) and ``OUT/worker-R.npz`` (its final
parameters). `merge_ranks` reads those of one run from a directory and writes
the run's ``OUT/result.json`` in the schema `akorun launch` writes
(akocore.records.results.RunResult, assembled by
akorun.runtime.records.result_files.merge_results): the
launcher calls it with the exit statuses it saw; `merge_run` is the same from
the files alone, for a run whose ranks were started by hand (with a shared
``--out`` directory, or their records copied into one).

A rank with no record of this run (never started, killed, or a record of
another run) is merged as failed and the result says so: ``partial`` true and
``missing_ranks``. Nothing to merge (no record of any rank) is a UsageError.

Damaged or inconsistent records are refused with one line (UsageError), never
a traceback or a stall: parameters that do not load, a record filed under
another rank's name, a rank or worker count outside the run, records of one
run that disagree on its configuration, or a configuration whose worker count
is not its list of hosts (every rank akorun starts knows one host:port per
rank; a forged count of a billion ranks would otherwise be merged one by one).
Replicas holding NaN or Inf are merged (``max_relative_difference`` inf) and
named in `MergeOutcome.nonfinite`: the commands then fail with exit 1.
"""

from __future__ import annotations

import json
import re
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from akocore.records.results import RankResult, RecordError, RunResult
from akocore.settings.normalise import ConfigError
from akocore.settings.schema import RunConfig
from akocore.settings.toml_io import config_from_dict, config_to_dict
from akorun.errors import UsageError
from akorun.runtime.node_plan import role_of
from akorun.runtime.records.result_files import merge_results, nonfinite_replicas, write_json

__all__ = ["MergeOutcome", "merge_ranks", "merge_run", "rank_records", "records_complete"]

RESULT_NAME = "result.json"
_RECORD_NAME = re.compile(r"worker-(\d+)\.json")


@dataclass(frozen=True)
class MergeOutcome:
    """What a merge wrote: the file, the run's result, the ranks without a record and
    the replicas that hold NaN or Inf."""

    path: Path
    result: RunResult
    missing_ranks: tuple[int, ...]
    nonfinite: str | None = None  # the line naming replicas with NaN or Inf (None: finite)


def rank_records(run_dir: Path) -> dict[int, RankResult]:
    """Every ``worker-R.json`` in `run_dir`, by rank; UsageError names an unreadable one."""
    records: dict[int, RankResult] = {}
    for path in sorted(run_dir.glob("worker-*.json")):
        match = _RECORD_NAME.fullmatch(path.name)
        if match is None:
            continue
        try:
            record = RankResult.from_json(json.loads(path.read_text(encoding="utf-8")),
                                          path.name)
        except (OSError, ValueError) as error:  # RecordError and bad JSON are ValueErrors
            raise UsageError(f"{path}: not a rank record ({error})") from None
        records[int(match.group(1))] = record
    return records


def _run_id(record: RankResult) -> str | None:
    value = record.details.get("run_id")
    return value if isinstance(value, str) else None


def _config_of(record: RankResult, where: Path) -> RunConfig:
    data = record.details.get("config")
    if not isinstance(data, Mapping):
        raise UsageError(f"{where}: rank {record.rank}'s record holds no configuration")
    try:
        return config_from_dict(dict(data))
    except (ConfigError, RecordError, ValueError, TypeError) as error:
        raise UsageError(f"{where}: rank {record.rank}'s configuration is not readable "
                         f"({error})") from None


def _check_records(directory: Path, records: Mapping[int, RankResult],
                   config: RunConfig) -> None:
    """UsageError (one line) for records that cannot be one run's: see the module
    docstring. `records` are of one run, by the rank their file names."""
    workers = config.cluster.workers
    hosts = len(config.cluster.hosts)
    if hosts != workers:
        raise UsageError(f"{directory}: the records' configuration claims {workers} ranks "
                         f"but lists {hosts} host(s) (every akorun rank knows one host:port "
                         f"per rank): a damaged or edited record; merge the records as the "
                         f"ranks wrote them")
    if len({r.details.get("config_hash") for r in records.values()}) > 1:
        raise UsageError(f"{directory}: the records of one run disagree on its configuration "
                         f"(config_hash differs): damaged or edited records")
    for rank, record in sorted(records.items()):
        where = directory / f"worker-{rank}.json"
        if record.rank != rank:
            raise UsageError(f"{where}: holds rank {record.rank}'s record, not rank {rank}'s "
                             f"(renamed or edited); each rank's record is worker-RANK.json")
        if rank >= workers or record.workers != workers:
            raise UsageError(f"{where}: rank {rank} of {record.workers} ranks, but the run "
                             f"has {workers} (ranks 0..{workers - 1}): a record of another "
                             f"run or an edited one")


def _replica(npz: Path) -> np.ndarray:
    """The final parameters a rank wrote (``worker-R.npz``); UsageError if unreadable."""
    try:
        with np.load(npz) as data:
            return np.array(data["params"])
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as error:
        raise UsageError(f"{npz}: not readable parameters ({type(error).__name__}: "
                         f"{error}); a damaged file: move it away to merge without that "
                         f"rank's replica") from None


def records_complete(run_dir: Path, run_id: str, workers: int) -> bool:
    """True when `run_dir` holds a record of run `run_id` for every rank 0..workers-1."""
    try:
        records = rank_records(run_dir)
    except UsageError:
        return False
    return all(rank in records and _run_id(records[rank]) == run_id
               for rank in range(workers))


def merge_ranks(run_dir: str | Path, *, config: RunConfig | None = None,
                run_id: str | None = None,
                exit_codes: Mapping[int, int | None] | None = None,
                allow_empty: bool = False) -> MergeOutcome:
    """Merge the rank records of one run in `run_dir` into ``run_dir/result.json``.

    `config` and `run_id` default to those the records carry (all records must be of
    one run); `exit_codes`, when the caller started the ranks, are written into
    each rank's entry. Ranks with no record of the run are merged as failed and the
    result is marked partial; no record at all is a UsageError unless `allow_empty`
    (the launcher's run whose every rank failed before writing one).
    """
    directory = Path(run_dir)
    if not directory.is_dir():
        raise UsageError(f"{directory}: not a directory (give the run directory, the --out "
                         f"of its ranks)")
    records = rank_records(directory)
    if run_id is None:
        ids = sorted({i for i in map(_run_id, records.values()) if i is not None})
        if len(ids) > 1:
            raise UsageError(f"{directory}: records of {len(ids)} runs ({', '.join(ids)}); "
                             f"merge one run per directory")
        run_id = ids[0] if ids else None
    ours = {rank: record for rank, record in records.items() if _run_id(record) == run_id}
    if not ours and not (allow_empty and config is not None):
        raise UsageError(f"{directory}: nothing to merge (no worker-R.json of this run; each "
                         f"rank writes one at its end when started with --out)")
    if config is None:  # `ours` is not empty here
        first = min(ours)
        config = _config_of(ours[first], directory / f"worker-{first}.json")
    _check_records(directory, ours, config)
    codes = dict(exit_codes or {})
    ranks: list[RankResult] = []
    replicas: dict[int, np.ndarray] = {}
    missing: list[int] = []
    for rank in range(config.cluster.workers):
        record = ours.get(rank)
        if record is None:
            missing.append(rank)
            ranks.append(RankResult(rank, role_of(config, rank), exit_code=codes.get(rank),
                                    failed=True))
            continue
        if rank in codes:
            record = replace(record, exit_code=codes[rank])
        ranks.append(record)
        npz = directory / f"worker-{rank}.npz"
        if record.role == "worker" and npz.exists():
            replicas[rank] = _replica(npz)
    merged = merge_results(config_to_dict(config), ranks, list(replicas.values()),
                           batch_size=_step_examples(ranks, config.train.batch_size),
                           run_id=run_id)
    merged = replace(merged, partial=bool(missing), missing_ranks=tuple(missing))
    path = write_json(directory / RESULT_NAME, merged.to_json())
    return MergeOutcome(path, merged, tuple(missing), nonfinite_replicas(replicas))


def _step_examples(ranks: list[RankResult], configured: int) -> int:
    """Examples per gradient step of the run: what its training ranks' records say when
    they agree (a rank spanning D devices steps on D batches), else the configured batch."""
    said = {record.batch_size for record in ranks if record.role == "worker" and not record.failed}
    return said.pop() if len(said) == 1 and 0 not in said else configured


def merge_run(run_dir: str | Path) -> Path:
    """Write ``run_dir/result.json`` from the ranks' records in `run_dir`; its path.

    For a run whose ranks were started by hand (``akorun init`` + ``akorun worker``
    on each host, one shared ``--out`` directory, or the ranks' ``worker-R.json``
    and ``worker-R.npz`` copied into one). Missing ranks are merged as failed and
    the result is marked partial (``partial``, ``missing_ranks``).

    >>> import akorun
    >>> akorun.merge_run("runs/by-hand")  # doctest: +SKIP
    PosixPath('runs/by-hand/result.json')
    """
    return merge_ranks(run_dir).path
