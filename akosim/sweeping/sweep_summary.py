"""The sweep's answer: the best configuration of each group, read from the sweep's records.

A group is one setting of the grid values that describe the cluster (workers,
bandwidth, latency); the p, ssp and scheme values of the grid are the choices
within it. `best_per_group` keeps, for each group, the row with the most
samples per second (ties: the lower staleness bound); `format_summary` is the
table `akosim sweep` prints at the end and `python -m analysis sweep DIR`
plots. It reads the typed point records (akosim.sweeping.sweepfiles.read_sweep), in the
order the sweep wrote them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from akocore.records.results import RunResult
from akocore.schemes.registry import is_partitioned
from akocore.units import format_bandwidth, format_duration
from akosim.sweeping.sweepfiles import read_sweep

CHOICES = ("p", "ssp", "scheme")  # grid flags a group chooses between; the rest describe it


@dataclass(frozen=True)
class BestRow:
    """The best row of one group."""

    group: tuple[tuple[str, str], ...]  # (grid key, value) of the cluster, grid order
    scheme: str
    p: int
    ssp: float
    round_time_s: float
    samples_per_s: float
    nic_utilisation: float  # the training workers' mean uplink use
    busiest_nic_utilisation: float  # any node's uplink or downlink, servers included
    staleness_bound_rounds: float
    bottleneck: str
    candidates: int  # rows in the group


@dataclass(frozen=True)
class SweepRow:
    """One simulated configuration of a sweep with the grid values of its point."""

    grid: tuple[tuple[str, str], ...]  # (grid flag, value as given), grid order
    run: RunResult


def _finite(value: float | None) -> float:
    return math.nan if value is None else float(value)


def read_rows(sweep_dir: Path) -> list[SweepRow]:
    """Every run of a sweep folder, in the order the sweep wrote its points."""
    sweep = read_sweep(sweep_dir)
    return [SweepRow(tuple((key, str(point.grid[key])) for key in sweep.grid
                           if key in point.grid), run)
            for point in sweep.points for run in point.runs]


def _busiest(run: RunResult) -> float:
    """The busiest NIC's use (uplinks and downlinks of every node), nan when unknown."""
    known = [u for u in (run.max_uplink_utilisation, run.max_downlink_utilisation)
             if u is not None]
    return max(known) if known else math.nan


def best_per_group(rows: list[SweepRow]) -> list[BestRow]:
    """The row with the most samples/s in each group, groups in order of appearance."""
    groups: dict[tuple[tuple[str, str], ...], list[RunResult]] = {}
    for row in rows:
        group = tuple((key, value) for key, value in row.grid if key not in CHOICES)
        groups.setdefault(group, []).append(row.run)
    best: list[BestRow] = []
    for group, members in groups.items():
        finite = [run for run in members if math.isfinite(_finite(run.samples_per_s))]
        if not finite:
            continue
        top = max(finite, key=lambda run: (_finite(run.samples_per_s),
                                           -_finite(run.staleness_bound_rounds)))
        best.append(BestRow(
            group=group, scheme=top.scheme, p=top.p, ssp=top.ssp,
            round_time_s=_finite(top.round_time_s), samples_per_s=_finite(top.samples_per_s),
            nic_utilisation=_finite(top.nic_utilisation),
            busiest_nic_utilisation=_busiest(top),
            staleness_bound_rounds=_finite(top.staleness_bound_rounds),
            bottleneck=top.bottleneck or "", candidates=len(members)))
    return best


def _rounds(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:g}"


def _value(key: str, text: str) -> str:
    if key == "bandwidth":
        try:
            from akocore.units import parse_bandwidth

            return format_bandwidth(parse_bandwidth(text))
        except ValueError:
            return text
    return text


def format_summary(best: list[BestRow]) -> str:
    """The best configuration per group as an aligned text table."""
    if not best:
        return "no finished points to summarise"
    keys = [key for key, _ in best[0].group]
    headers = [*keys, "best", "round time", "samples/s", "NIC use: workers / busiest",
               "staleness", "of", "bottleneck"]
    rows = []
    for row in best:
        choice = f"{row.scheme} p={row.p} s={_rounds(row.ssp)}" if is_partitioned(row.scheme) \
            else row.scheme
        rows.append([*(_value(key, value) for key, value in row.group), choice,
                     format_duration(row.round_time_s), f"{row.samples_per_s:,.1f}",
                     f"{100 * row.nic_utilisation:.0f}% / "
                     f"{100 * row.busiest_nic_utilisation:.0f}%",
                     f"<= {_rounds(row.staleness_bound_rounds)} rounds",
                     str(row.candidates), row.bottleneck])
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip(),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
              for r in rows]
    return "\n".join(lines)


def print_summary(out: Path) -> None:
    """`akosim sweep`'s last lines: the best configuration of each group of out's points."""
    if not (out / "sweep.json").exists():
        return
    print("best configuration per group (most samples/s; "
          f"plot: python -m analysis sweep {out}):")
    print(format_summary(best_per_group(read_rows(out))))
