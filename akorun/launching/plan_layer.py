"""``akorun launch --plan plan.json``: the configuration an akosim plan recommends, as settings.

An ``akosim --out plan.json`` record holds the plan's settings (cluster, network,
exchange, training) and every compared configuration (scheme, each worker's p,
s, servers) and its ranking by accuracy (each trained row with the exchange
settings it trained with: a DiLoCo H or an Ako p and s of the ranking's own
ladder may be no compared row); its recommendation names one of them, and
``--plan-rank N`` picks the ranking's row N instead. `plan_layer` turns that
configuration into a settings layer at the config-file level, so ``--config``,
``--set`` and flags still override it: the cluster and network the plan
described, the workload, batch, optimizer, learning rate and seed it planned,
every exchange setting (H, tau, codec, ...), and the recommended row's scheme,
p and s (Ako) or server count (a parameter server). The plan's round count is
not taken: it is the timing simulation's, not a training length.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from akocore.cli_support import UsageError
from akocore.records.result_reader import read_result
from akocore.records.results import PlanResult, RecordError, RunResult
from akocore.schemes.registry import has_servers, is_partitioned
from akocore.settings.layers import Given, Layer, layer_of

# what a plan's train section says about the run (its rounds, duration, target and
# evaluation period are the timing simulation's)
PLANNED_TRAIN_KEYS = ("workload", "optimizer", "lr", "batch_size", "seed", "data_path")


def read_plan(path: str | Path) -> PlanResult:
    """The plan record in `path`, or a one-line UsageError."""
    try:
        record = read_result(json.loads(Path(path).read_text(encoding="utf-8")))
    except OSError as error:
        raise UsageError(f"--plan {path}: cannot read it ({error.strerror})") from None
    except (ValueError, RecordError) as error:
        raise UsageError(f"--plan {path}: not a result record ({error})") from None
    if not isinstance(record, PlanResult):
        raise UsageError(f"--plan {path}: a {type(record).__name__} record; expected the "
                         f"plan `akosim --out FILE.json` writes")
    return record


def recommended_run(record: PlanResult, path: str | Path) -> RunResult:
    """The compared row the plan's recommendation names (the longest label that fits)."""
    line = record.recommendation[0] if record.recommendation else ""
    named = [run for run in record.runs if line.startswith(f"recommend: {run.label}: ")]
    if named:
        return max(named, key=lambda run: len(run.label))
    if not line:
        raise UsageError(f"--plan {path}: the plan recommends nothing (a plan of one "
                         f"configuration, or none within --max-staleness)")
    raise UsageError(f"--plan {path}: the plan recommends a configuration that is not one "
                     f"of its rows ({line.split(': ')[1] if ': ' in line else line}); "
                     f"give its settings as flags")


def chosen_row(record: PlanResult, path: str | Path,
               rank: int | None = None) -> tuple[str, Mapping[str, Any]]:
    """The label and exchange settings of the row to run: the ranking's row `rank`
    (1 = first), or the recommended one (a ranked row by its label, else a compared row)."""
    ranked = [row for row in record.ranking if row.exchange]
    if rank is not None:
        if not 1 <= rank <= len(ranked):
            raise UsageError(f"--plan-rank {rank}: the plan {path} ranks "
                             + (f"{len(ranked)} configuration(s); give 1 to {len(ranked)}"
                                if ranked else "no configuration by accuracy with its "
                                "settings (a plan by throughput, or written by an older "
                                "akosim); leave --plan-rank out"))
        row = ranked[rank - 1]
        return row.label, row.exchange
    line = record.recommendation[0] if record.recommendation else ""
    named = [row for row in ranked if line.startswith(f"recommend: {row.label}: ")]
    if named:
        row = max(named, key=lambda row: len(row.label))
        return row.label, row.exchange
    run = recommended_run(record, path)
    exchange = dict((record.config or {}).get("exchange", {}))
    exchange["scheme"] = run.scheme
    if is_partitioned(run.scheme):
        p_of = tuple(run.p_of)
        exchange["p"] = list(p_of[:1] if len(set(p_of)) == 1 else p_of)
    exchange["ssp"] = run.ssp  # the staleness the row was simulated with
    if has_servers(run.scheme) and run.ps_servers:
        exchange["ps_servers"] = run.ps_servers
    return run.label, exchange


def plan_layer(path: str | Path, rank: int | None = None) -> list[Given]:
    """The recommended configuration of the plan in `path` (or the one its ranking puts
    at `rank`) as settings (config-file level)."""
    record = read_plan(path)
    label, exchange = chosen_row(record, path, rank)
    config: Mapping[str, Any] = record.config or {}
    source = f"by the plan {path} ({label})"
    tables: dict[str, dict[str, Any]] = {
        "cluster": {"workers": config.get("cluster", {}).get("workers")},
        "network": dict(config.get("network", {})),
        "exchange": dict(exchange),
        "train": {key: value for key, value in config.get("train", {}).items()
                  if key in PLANNED_TRAIN_KEYS},
    }
    tables["cluster"] = {k: v for k, v in tables["cluster"].items() if v is not None}
    return layer_of({name: body for name, body in tables.items() if body}, Layer.FILE, source)
