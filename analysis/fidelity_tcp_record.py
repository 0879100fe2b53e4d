"""The typed, versioned records of the real-TCP fidelity grid (analysis.fidelity_tcp).

`FidelityTcpRow`: one configuration measured on the netns testbed and predicted
three ways (`COLUMNS`); `ColumnSummary`: MAPE, Kendall's tau and mean signed
error of one prediction (`summarise`); `FidelityTcpRecord`: the grid's rows and
summaries with the conditions they ran under, written as fidelity-tcp.json.
No I/O here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from akocore.records.jsonrecord import RecordError, meta, record_from_json, record_to_json
from analysis.fidelity import Pair, kendall_tau, mape

FIDELITY_TCP_VERSION = 1
COLUMNS = ("host-calibrated", "run-calibrated", "max-min")


@dataclass(frozen=True)
class FidelityTcpRow:
    """One configuration: measured on the testbed, predicted three ways."""

    name: str = field(metadata=meta("", "configuration name"))
    scheme: str = field(metadata=meta("", "ako, ps (asynchronous, one server) or allreduce"))
    workers: int = field(metadata=meta("", "training workers"))
    nodes: int = field(metadata=meta("", "ranks (a parameter server counts)"))
    rate: str = field(metadata=meta("", "lan, wan, het, or the rate (5m, 20m, 100m)"))
    bandwidth_bps: tuple[float, ...] = field(metadata=meta(
        "bit/s", "each node's uplink and downlink"))
    p_configured: str = field(metadata=meta("", "1, auto, or - (ps)"))
    p_resolved: tuple[int, ...] = field(metadata=meta("", "each worker's p as the run "
                                                          "resolved it"))
    ssp: int = field(metadata=meta("rounds", "staleness bound s"))
    rounds: int = field(metadata=meta("rounds", "rounds run"))
    measured_round_time_s: float = field(metadata=meta(
        "s", "mean steady-state round time over the training ranks (akocore.records.figures)"))
    host_calibrated_s: float = field(metadata=meta("s", "TCP model, host calibration, "
                                                        "akosim's own compute"))
    run_calibrated_s: float = field(metadata=meta("s", "TCP model, the run's compute and "
                                                       "message_software_s"))
    maxmin_s: float = field(metadata=meta("s", "pure max-min, akosim's own compute"))
    run_compute_s: tuple[float, ...] = field(metadata=meta(
        "s", "each training rank's steady compute seconds per round"))
    run_overhead_s: tuple[float, ...] = field(metadata=meta(
        "s", "each training rank's steady per-round overhead"))
    host_compute_s: float = field(metadata=meta("s", "akosim's own compute measurement"))
    message_software_s: tuple[float, ...] = field(metadata=meta(
        "s", "each rank's per-message software seconds (no network time)"))
    bytes_sent_per_round: float = field(metadata=meta(
        "B", "mean bytes a training rank sent per round"))
    uplink_utilisation: float = field(metadata=meta(
        "fraction", "bytes sent per round x 8 / round time / own uplink, mean of training "
                    "ranks (what TCP delivered of the shaped rate)"))
    wall_s: float = field(metadata=meta("s", "wall time of the launch"))
    rtt_s: float = field(default=0.0, metadata=meta(
        "s", "configured round trip (twice the one-way latency the delay line held)"))

    def prediction(self, column: str) -> float:
        return {"host-calibrated": self.host_calibrated_s,
                "run-calibrated": self.run_calibrated_s, "max-min": self.maxmin_s}[column]

    def error(self, column: str) -> float:
        """Signed relative error of one prediction."""
        return self.prediction(column) / self.measured_round_time_s - 1


@dataclass(frozen=True)
class ColumnSummary:
    column: str = field(metadata=meta("", "host-calibrated, run-calibrated or max-min"))
    configurations: int = field(metadata=meta("", "configurations compared"))
    mape: float = field(metadata=meta("fraction", "mean absolute percentage error"))
    kendall_tau: float = field(metadata=meta("", "Kendall's tau-b, measured vs predicted"))
    mean_signed_error: float = field(metadata=meta("fraction", "mean signed relative error"))


@dataclass(frozen=True)
class FidelityTcpRecord:
    """The grid's rows and summary, with the conditions they were measured under."""

    created: str = field(metadata=meta("", "UTC time the record was written"))
    workload: str = field(metadata=meta("", "the workload every run trained"))
    rounds: int = field(metadata=meta("rounds", "rounds per run"))
    host_calibration: str = field(metadata=meta("", "path of the host calibration used"))
    host_calibration_summary: str = field(metadata=meta("", "what it measured"))
    host_compute_s: float = field(metadata=meta("s", "akosim's own compute measurement"))
    uptime: tuple[str, ...] = field(metadata=meta("", "`uptime` at each launch"))
    rows: tuple[FidelityTcpRow, ...] = field(metadata=meta("", "one per configuration"))
    columns: tuple[ColumnSummary, ...] = field(metadata=meta("", "one per prediction"))
    colocated_compute: tuple[str, ...] = field(default=(), metadata=meta(
        "", "akosim's step measured with k processes at once "
        "(akosim.calibration.colocated_compute), "
        "one line per k the grid's predictions used"))

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": FIDELITY_TCP_VERSION, "kind": "fidelity-tcp",
                **record_to_json(self)}

    @classmethod
    def from_json(cls, data: Any) -> FidelityTcpRecord:
        if not isinstance(data, dict) or data.get("kind") != "fidelity-tcp":
            raise RecordError("kind: expected \"fidelity-tcp\"")
        if data.get("schema_version") != FIDELITY_TCP_VERSION:
            raise RecordError(f"schema_version: this version reads {FIDELITY_TCP_VERSION}, "
                              f"the file has {data.get('schema_version')!r}")
        return record_from_json(cls, {k: v for k, v in data.items()
                                      if k not in ("schema_version", "kind")})


def summarise(rows: Sequence[FidelityTcpRow], column: str) -> ColumnSummary:
    pairs = [Pair(r.name, r.measured_round_time_s, r.prediction(column)) for r in rows]
    errors = [p.error for p in pairs]
    return ColumnSummary(column, len(pairs), mape(pairs), kendall_tau(pairs),
                         sum(errors) / len(errors) if errors else math.nan)


__all__ = ["COLUMNS", "FIDELITY_TCP_VERSION", "ColumnSummary", "FidelityTcpRecord",
           "FidelityTcpRow", "summarise"]
