"""A result JSON object as its record, and the files written before the schema converted.

`record_of` reads any result object (kind ``plan``, ``run``, ``rank`` or
``calibration``) as its typed record; a file without ``schema_version`` (akorun's
old ``workers`` list, akosim's old ``runs``, the experiment runner's calibration
``compute.json``) is converted, once, to the current layout first. Opening a file
is akocore.records.result_reader's (`read_result` takes a path or an object).
No I/O here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from akocore.records.calibration import Calibration, RankCalibration
from akocore.records.jsonrecord import RecordError
from akocore.records.results import (
    RANK_KEYS,
    SCHEMA_VERSION,
    PlanResult,
    RankResult,
    RunResult,
    check_header,
)


def record_of(data: Any) -> PlanResult | RunResult | RankResult | Calibration:
    """Any result JSON object as its record; files without ``schema_version`` (written
    before the schema) are converted from their old layout. (akocore.records.result_reader's
    `read_result` also takes the path of a file.)"""
    if not isinstance(data, dict):
        raise RecordError(f"result: expected a JSON object, got {type(data).__name__}")
    if "schema_version" not in data:
        data = _upgrade(data)
    readers = {"plan": PlanResult.from_json, "run": RunResult.from_json,
               "rank": RankResult.from_json, "calibration": Calibration.from_json}
    kind = data.get("kind")
    if kind not in readers:
        raise RecordError(f"kind: expected one of {', '.join(readers)}, got {kind!r}")
    check_header(data, str(kind), "")
    return readers[kind](data)  # type: ignore[no-any-return,operator]


def _upgrade(old: dict[str, Any]) -> dict[str, Any]:
    """A pre-schema file in the current layout (then checked by from_json)."""
    if "runs" in old:
        return _upgrade_plan(old)
    if "source" in old:
        return {"schema_version": SCHEMA_VERSION, "kind": "calibration",
                "source": old["source"], "p_of": old.get("p") or [],
                "compute_jitter": old.get("compute_jitter", 0.0),
                "per_worker": [_pick(w, RankCalibration, rank=i)
                               for i, w in enumerate(_list(old, "workers"))]}
    if isinstance(old.get("workers"), list):
        return _upgrade_akorun_run(old)
    return _upgrade_rank(old, 0)


def _list(data: Mapping[str, Any], key: str) -> list[Any]:
    value = data.get(key, [])
    if not isinstance(value, list):
        raise RecordError(f"{key}: expected a list, got {value!r}")
    return value


def _pick(data: Any, cls: type, **defaults: Any) -> dict[str, Any]:
    """The keys of `data` that are fields of `cls` (None dropped where a field takes no
    None, so its default applies), over `defaults`."""
    if not isinstance(data, dict):
        return data  # from_json names the bad entry
    names = {f.name for f in fields(cls)}
    nullable = {f.name for f in fields(cls) if "None" in str(f.type)}
    return {**defaults, **{k: v for k, v in data.items()
                           if k in names and (v is not None or k in nullable)}}


def _p_fields(p: Any) -> dict[str, Any]:
    """Old akorun's ``p`` (a list per worker, or null) as p and p_of."""
    if isinstance(p, list) and p:
        return {"p": max(p) if all(isinstance(x, int) for x in p) else p, "p_of": p}
    return {}


def _upgrade_rank(old: Any, index: int) -> Any:
    if not isinstance(old, dict):
        return old
    rank = _pick(old, RankResult, rank=index)
    rank.pop("p", None)
    rank.update(_p_fields(old.get("p")))
    if isinstance(old.get("workers"), list):
        rank.pop("workers", None)
    details = {k: v for k, v in old.items() if k not in RANK_KEYS and k != "p"}
    evaluations = old.get("evaluations")
    if isinstance(evaluations, list):  # old akosim: {sim_time_s, round, accuracy}
        rank["evaluations"] = [_evaluation(e) for e in evaluations]
    return {"schema_version": SCHEMA_VERSION, "kind": "rank", **details, **rank}


def _evaluation(entry: Any) -> Any:
    if isinstance(entry, dict):
        return [entry.get("sim_time_s", entry.get("time_s")), entry.get("round"),
                entry.get("accuracy")]
    return entry


def _upgrade_akorun_run(old: dict[str, Any]) -> dict[str, Any]:
    ranks = [_upgrade_rank(w, i) for i, w in enumerate(_list(old, "workers"))]
    run = _pick(old, RunResult, tool="akorun", scheme=old.get("scheme") or "")
    run.pop("workers", None)
    run.pop("p", None)
    run.update(_p_fields(old.get("p")))
    counts = [r.get("workers") for r in ranks if isinstance(r, dict)]
    if counts and isinstance(counts[0], int):
        run["workers"] = counts[0]
    run["training_workers"] = sum(1 for r in ranks
                                  if isinstance(r, dict) and r.get("role") == "worker")
    first = next((r for r in ranks if isinstance(r, dict) and r.get("role") == "worker"), None)
    run["final_accuracy"] = first.get("final_accuracy") if first else None
    return {"schema_version": SCHEMA_VERSION, "kind": "run", **run, "per_worker": ranks}


def _upgrade_plan(old: dict[str, Any]) -> dict[str, Any]:
    runs = []
    for i, entry in enumerate(_list(old, "runs")):
        if not isinstance(entry, dict):
            raise RecordError(f"runs[{i}]: expected an object, got {entry!r}")
        run = _pick(entry, RunResult, tool="akosim", mode=old.get("mode", "train"),
                    config=old.get("config", {}))
        run["evaluations"] = [_evaluation(e) for e in entry.get("evaluations") or []]
        run["per_worker"] = [_upgrade_rank(w, j) for j, w in
                             enumerate(entry.get("per_worker") or [])]
        runs.append({"schema_version": SCHEMA_VERSION, "kind": "run", **run})
    plan = _pick(old, PlanResult)
    return {"schema_version": SCHEMA_VERSION, "kind": "plan", **plan, "runs": runs}
