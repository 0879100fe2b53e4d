"""What a real run and this machine tell the simulator: `Calibration` and `ComputeMeasurement`.

- `Calibration` (kind ``calibration``): a real run's per-rank compute time,
  per-round and per-message overheads, resolved p and compute jitter, read by
  ``akosim --compute-from``;
- `ComputeMeasurement` (kind ``compute``): one cached ``--compute measure``
  (workload, batch, optimizer, CPU fingerprint, JAX version -> seconds per
  gradient step), the file akosim keeps in the user's cache directory.

Both are versioned with the other records (akocore.records.results'
`SCHEMA_VERSION`) and listed in docs/reference/result-schema.md
(akocore.records.schema_table). No I/O here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from akocore.records.figures import fill_missing, tile
from akocore.records.jsonrecord import RecordError, meta, record_from_json, record_to_json
from akocore.records.results import SCHEMA_VERSION, RunResult, check_header
from akocore.records.run_figures import rank_overhead_s, run_compute_jitter
from akocore.schemes.registry import is_partitioned


@dataclass(frozen=True)
class RankCalibration:
    """What one real rank tells the simulator; gaps already filled (see Calibration)."""

    rank: int = field(metadata=meta("", "rank of the node"))
    role: str = field(default="worker", metadata=meta("", '"worker" or "ps"'))
    compute_s_per_round: float | None = field(default=None, metadata=meta(
        "s", "gradient-step seconds per round"))
    overhead_s_per_round: float | None = field(default=None, metadata=meta(
        "s", "seconds per round outside gradient and gate"))
    message_overhead_s: float | None = field(default=None, metadata=meta(
        "s", "seconds a message costs beyond the wire"))


@dataclass(frozen=True)
class Calibration:
    """A real run's measurements as the simulator uses them (akosim --compute-from).

    Per rank: compute, per-round and per-message overheads. A rank without a value
    (a parameter server computes no gradient) got the others' mean when the
    calibration was made (akocore.records.figures.fill_missing); a figure no rank has is
    null everywhere. `compute_s(nodes)` etc. spread the ranks over `nodes`.
    """

    source: str = field(metadata=meta("", "the result file it was made from"))
    per_worker: tuple[RankCalibration, ...] = field(metadata=meta("", "one entry per rank"))
    p_of: tuple[int, ...] = field(default=(), metadata=meta(
        "partitions", "each worker's resolved p (empty: not ako)"))
    compute_jitter: float = field(default=0.0, metadata=meta(
        "fraction", "relative std of the steady per-round compute time"))

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "kind": "calibration",
                **record_to_json(self)}

    @classmethod
    def from_json(cls, data: Any) -> Calibration:
        if not isinstance(data, dict):
            raise RecordError(f"calibration: expected an object, got {data!r}")
        check_header(data, "calibration", "")
        return record_from_json(cls, {k: v for k, v in data.items()
                                      if k not in ("schema_version", "kind")})

    @classmethod
    def from_run(cls, run: RunResult, source: str = "") -> Calibration:
        """Each rank's measurements, gaps filled with the other ranks' means. A rank
        without compute time (a server) also gets the mean per-round overhead."""
        ranks = run.per_worker
        compute = fill_missing([r.compute_s_per_round for r in ranks])
        overhead = fill_missing([rank_overhead_s(r) if r.compute_s_per_round is not None
                                 else None for r in ranks])
        message = fill_missing([r.message_overhead_s for r in ranks])
        none = (None,) * len(ranks)
        return cls(source, tuple(
            RankCalibration(r.rank, r.role, c, o, m)
            for r, c, o, m in zip(ranks, compute or none, overhead or none, message or none,
                                  strict=True)),
            p_of=run.p_of if is_partitioned(run.scheme) else (),
            compute_jitter=run_compute_jitter(run))

    def _spread(self, values: Sequence[float | None], nodes: int) -> tuple[float, ...] | None:
        known = fill_missing(values) if values else None
        return tile(known, nodes) if known else None

    def compute_s(self, nodes: int) -> tuple[float, ...] | None:
        """Per-node compute seconds per round, or None when no rank measured any."""
        return self._spread([r.compute_s_per_round for r in self.per_worker], nodes)

    def overhead_s(self, nodes: int) -> tuple[float, ...] | None:
        return self._spread([r.overhead_s_per_round for r in self.per_worker], nodes)

    def message_overhead_s(self, nodes: int) -> tuple[float, ...] | None:
        return self._spread([r.message_overhead_s for r in self.per_worker], nodes)


# ---------------------------------------------------------------------- compute cache


@dataclass(frozen=True)
class ComputeMeasurement:
    """One ``--compute measure`` result as akosim caches it (one file per key)."""

    workload: str = field(metadata=meta("", "the workload measured", "akosim"))
    batch_size: int = field(metadata=meta("samples", "samples per gradient step", "akosim"))
    optimizer: str = field(metadata=meta("", "the optimizer configured", "akosim"))
    cpu: str = field(metadata=meta("", "CPU fingerprint (model, cores, machine)", "akosim"))
    jax_version: str = field(metadata=meta("", "JAX version that ran the step", "akosim"))
    compute_s: float = field(metadata=meta("s", "median seconds of one gradient step",
                                           "akosim"))
    param_count: int = field(metadata=meta(
        "float32", "gradient elements of the workload", "akosim"))
    steps: int = field(metadata=meta("steps", "timed steps behind the median", "akosim"))
    measured_at: str = field(metadata=meta("", "when, ISO 8601 UTC", "akosim"))

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "kind": "compute", **record_to_json(self)}

    @classmethod
    def from_json(cls, data: Any) -> ComputeMeasurement:
        if not isinstance(data, dict):
            raise RecordError(f"compute: expected an object, got {data!r}")
        check_header(data, "compute", "")
        record = record_from_json(cls, {k: v for k, v in data.items()
                                        if k not in ("schema_version", "kind")})
        if not (math.isfinite(record.compute_s) and record.compute_s > 0):
            raise RecordError(f"compute_s: expected seconds > 0, got {record.compute_s!r}")
        if record.param_count < 1:
            raise RecordError(f"param_count: expected >= 1, got {record.param_count!r}")
        return record
