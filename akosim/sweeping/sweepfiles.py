"""The files of akosim sweep: one typed record per point, and the collected results.

`SweepPoint` is what DIR/points/<id>.json holds: the point's id, grid values,
config and simulation settings, and one akocore.records.results `RunResult` per
simulated configuration (written with `RunResult.to_json`, without
``per_link``: a sweep keeps n x n links out of every point). Its `format` is
`POINT_FORMAT`; `read_points` ignores files of another format (a resumed sweep
never misreads a point written by an older toolkit: the old point is run
again under its new id). `collect` writes DIR/sweep.json (every point) and
DIR/sweep.csv, whose result columns are RunResult field names
(`CSV_RESULT_COLUMNS` = akocore.records.results.SUMMARY_FIELDS, checked against the
record when akocore.records.results is imported).
"""

from __future__ import annotations

import csv
import dataclasses
import math
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from akocore.records.jsonrecord import RecordError, meta, record_from_json, record_to_json
from akocore.records.results import SUMMARY_FIELDS, RunResult

POINT_FORMAT = 3  # bump when the meaning of a point changes: new ids, old files ignored
# (3: a point without rounds settles instead of running 30 rounds)
POINT_KIND = "sweep-point"


# Columns of sweep.csv after the grid values ("grid_<flag>") and before point_id: the
# headline RunResult fields (akocore.records.results checks each is a field).
CSV_RESULT_COLUMNS: tuple[str, ...] = SUMMARY_FIELDS


@dataclass(frozen=True)
class SweepPoint:
    """One simulated grid point: DIR/points/<id>.json."""

    id: str = field(metadata=meta("", "sha256 of the config hash and `sim`, 16 hex digits",
                                  "akosim"))
    grid: Mapping[str, Any] = field(metadata=meta(
        "", "the point's grid values as given (flag dest -> text)", "akosim"))
    config: Mapping[str, Any] = field(metadata=meta(
        "", "the resolved config, as akocore.settings.toml_io.config_to_dict writes it", "akosim"))
    sim: Mapping[str, Any] = field(metadata=meta(
        "", "simulation settings besides the config (gradient length, compute)", "akosim"))
    gradient_bytes: int = field(metadata=meta("B", "gradient bytes per worker", "akosim"))
    compute_s: float = field(metadata=meta("s", "compute seconds per round", "akosim"))
    wall_s: float = field(metadata=meta("s", "wall seconds the point took", "akosim"))
    runs: tuple[RunResult, ...] = field(default=(), metadata=meta(
        "", "one RunResult per simulated configuration (no per_link)", "akosim"))
    tool: str = field(default="akosim", metadata=meta("", '"akosim"', "akosim"))
    format: int = field(default=POINT_FORMAT, metadata=meta(
        "", "POINT_FORMAT of the toolkit that wrote it", "akosim"))

    def to_json(self) -> dict[str, Any]:
        data = record_to_json(dataclasses.replace(self, runs=()))
        data["runs"] = [_without_links(run.to_json()) for run in self.runs]
        return {"kind": POINT_KIND, **data}

    @classmethod
    def from_json(cls, data: Any, where: str = "") -> SweepPoint:
        if not isinstance(data, dict) or data.get("kind") != POINT_KIND:
            raise RecordError(f"{where or 'point'}: not a {POINT_KIND} object")
        body = {k: v for k, v in data.items() if k not in ("kind", "runs")}
        point = record_from_json(cls, body, where)
        runs = data.get("runs", [])
        if not isinstance(runs, list):
            raise RecordError(f"{where}.runs: expected a list, got {runs!r}")
        return dataclasses.replace(point, runs=tuple(
            RunResult.from_json(run, f"{where}.runs[{i}]") for i, run in enumerate(runs)))


def _without_links(run: dict[str, Any]) -> dict[str, Any]:
    run.pop("per_link", None)
    return run


def read_points(points_dir: Path) -> Iterator[SweepPoint]:
    """Every readable point of the current format in `points_dir`; others are reported
    on stderr and skipped."""
    import json

    older = 0
    for path in sorted(points_dir.glob("*.json")) if points_dir.is_dir() else []:
        if path.name.startswith("."):
            continue  # a write in progress
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            print(f"akosim sweep: skipping unreadable {path}: {error}", file=sys.stderr)
            continue
        if not isinstance(data, dict) or data.get("kind") != POINT_KIND:
            continue
        if data.get("format") != POINT_FORMAT:
            older += 1
            continue
        try:
            yield SweepPoint.from_json(data, path.name)
        except RecordError as error:
            print(f"akosim sweep: skipping {path}: {error}", file=sys.stderr)
    if older:
        print(f"akosim sweep: ignoring {older} point file(s) in {points_dir} written in "
              f"another point format (this toolkit writes format {POINT_FORMAT})",
              file=sys.stderr)


@dataclass(frozen=True)
class Collected:
    points: int
    rows: int


SWEEP_KIND = "sweep"


@dataclass(frozen=True)
class Sweep:
    """DIR/sweep.json: the grid flags (dests) in column order and every point, in order."""

    grid: tuple[str, ...]
    points: tuple[SweepPoint, ...]

    def to_json(self) -> dict[str, Any]:
        return {"tool": "akosim", "kind": SWEEP_KIND, "grid": list(self.grid),
                "points": [point.to_json() for point in self.points]}

    @classmethod
    def from_json(cls, data: Any, where: str = "sweep.json") -> Sweep:
        if not isinstance(data, dict) or data.get("kind") != SWEEP_KIND:
            raise RecordError(f"{where}: not an akosim sweep (kind {SWEEP_KIND!r})")
        grid, points = data.get("grid"), data.get("points")
        if not isinstance(grid, list) or not isinstance(points, list):
            raise RecordError(f"{where}: expected lists under grid and points")
        return cls(tuple(str(key) for key in grid), tuple(
            SweepPoint.from_json(point, f"{where}.points[{i}]")
            for i, point in enumerate(points)))


def read_sweep(out: Path) -> Sweep:
    """A sweep folder's collected points (DIR/sweep.json); RecordError if absent or unreadable."""
    import json

    path = out / "sweep.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise RecordError(f"{path}: cannot read the sweep: {error}") from None
    return Sweep.from_json(data, str(path))


def collect(out: Path, grid_order: Sequence[str], order: Sequence[str] = ()) -> Collected:
    """Write out/sweep.json and out/sweep.csv from every point in out/points.

    `grid_order` names the grid flags (dests) in column order. Points of `order`
    (ids) come first in that order, any others after, by id.
    """
    from akosim.planning.result_tables import write_json

    rank = {identity: k for k, identity in enumerate(order)}
    points = sorted(read_points(out / "points"),
                    key=lambda point: (rank.get(point.id, len(rank)), point.id))
    grid_keys = [key for key in grid_order if any(key in point.grid for point in points)]
    write_json(out / "sweep.json", Sweep(tuple(grid_keys), tuple(points)).to_json())
    header = [f"grid_{key}" for key in grid_keys] + list(CSV_RESULT_COLUMNS) + ["point_id"]
    rows = [[point.grid.get(key, "") for key in grid_keys]
            + [_cell(getattr(run, column)) for column in CSV_RESULT_COLUMNS] + [point.id]
            for point in points for run in point.runs]
    tmp = out / ".sweep.csv.tmp"
    with tmp.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    os.replace(tmp, out / "sweep.csv")
    return Collected(len(points), len(rows))


def _cell(value: Any) -> Any:
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        return "inf" if math.isinf(value) else repr(value)
    return "" if value is None else value
