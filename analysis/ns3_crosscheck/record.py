"""The cross-check's typed, versioned result record (JSON on disk).

A `CrossCheckRecord` holds one run of the grid: the ns-3 and TCP settings,
and per pattern (`CaseResult`) the makespan in ns-3 and in each akosim model.
`ratio(model)` compares the network time per round (makespan less the compute
on the critical path, per round), so compute gaps both sides share do not
dilute the difference. `write_record` / `read_record` round-trip it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
KIND = "ns3-crosscheck"


class RecordError(ValueError):
    """A file that is not a cross-check record this code reads."""


@dataclass(frozen=True)
class ModelTime:
    """One akosim model's makespan for a case."""

    model: str
    makespan_s: float


@dataclass(frozen=True)
class CaseResult:
    """One pattern in ns-3 and in akosim."""

    family: str
    name: str
    hosts: int
    rate_bps: float
    latency_s: float
    size_bytes: float  # per message (all-to-all) or per full gradient (ako, ps)
    partitions: int  # ako's p; 1 for the others
    rounds: int
    compute_s: float
    ns3_makespan_s: float
    ns3_wall_s: float
    akosim: tuple[ModelTime, ...]

    def network_s(self, makespan_s: float) -> float:
        """Network time per round (see the module docstring)."""
        return (makespan_s - self.rounds * self.compute_s) / self.rounds

    def akosim_makespan_s(self, model: str) -> float:
        for entry in self.akosim:
            if entry.model == model:
                return entry.makespan_s
        raise KeyError(f"{self.name}: no akosim model {model!r} in this record")

    def ratio(self, model: str) -> float:
        """ns-3 network time per round / akosim model's."""
        return self.network_s(self.ns3_makespan_s) / self.network_s(
            self.akosim_makespan_s(model))


@dataclass(frozen=True)
class CrossCheckRecord:
    """One run of the cross-check grid."""

    grid: str
    ns3_version: str
    congestion_control: str
    segment_bytes: int
    buffer_bytes: int
    models: tuple[str, ...]
    cases: tuple[CaseResult, ...]
    wall_s: float
    load: str  # `uptime` when the run started (the machine is shared)

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "kind": KIND, **asdict(self)}

    @classmethod
    def from_json(cls, data: Any) -> CrossCheckRecord:
        if not isinstance(data, dict) or data.get("kind") != KIND:
            raise RecordError(f"not a {KIND} record")
        if data.get("schema_version") != SCHEMA_VERSION:
            raise RecordError(f"this code reads {KIND} schema version {SCHEMA_VERSION}, "
                              f"the file has {data.get('schema_version')!r}")
        try:
            body = {k: v for k, v in data.items() if k not in ("schema_version", "kind")}
            cases = tuple(
                CaseResult(**{**case, "akosim": tuple(ModelTime(**m) for m in case["akosim"])})
                for case in body.pop("cases"))
            return cls(**{**body, "models": tuple(body.pop("models")), "cases": cases})
        except (KeyError, TypeError) as error:
            raise RecordError(f"malformed {KIND} record: {error}") from error


def write_record(record: CrossCheckRecord, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record.to_json(), indent=1) + "\n")


def read_record(path: Path) -> CrossCheckRecord:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise RecordError(f"{path}: {error}") from error
    return CrossCheckRecord.from_json(data)
