"""The sweep's answer: the best configuration of each group, read from sweep.csv.

A group is one setting of the grid values that describe the cluster (workers,
bandwidth, latency); the p, ssp and scheme values of the grid are the choices
within it. `best_per_group` keeps, for each group, the row with the most
samples per second (ties: the lower staleness bound); `format_summary` is the
table `akosim sweep` prints at the end and `python -m analysis sweep DIR`
plots. Reading the flat CSV (not the point files) keeps this independent of
how points are stored.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from akocore.units import format_bandwidth, format_duration

CHOICE_COLUMNS = ("grid_p", "grid_ssp", "grid_scheme")  # what a group chooses between


@dataclass(frozen=True)
class BestRow:
    """The best row of one group."""

    group: tuple[tuple[str, str], ...]  # (grid key, value) of the cluster, grid order
    scheme: str
    p: int
    ssp: float
    round_time_s: float
    samples_per_s: float
    nic_utilisation: float
    staleness_bound_rounds: float
    bottleneck: str
    candidates: int  # rows in the group


def _number(text: str) -> float:
    if text in ("", "None"):
        return math.nan
    return math.inf if text == "inf" else float(text)


def read_rows(csv_path: Path) -> list[dict[str, str]]:
    with csv_path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def best_per_group(rows: list[dict[str, str]]) -> list[BestRow]:
    """The row with the most samples/s in each group, groups in order of appearance."""
    if not rows:
        return []
    group_keys = [key for key in rows[0] if key.startswith("grid_")
                  and key not in CHOICE_COLUMNS]
    groups: dict[tuple[tuple[str, str], ...], list[dict[str, str]]] = {}
    for row in rows:
        group = tuple((key.removeprefix("grid_"), row[key]) for key in group_keys)
        groups.setdefault(group, []).append(row)
    best: list[BestRow] = []
    for group, members in groups.items():
        finite = [row for row in members if math.isfinite(_number(row["samples_per_s"]))]
        if not finite:
            continue
        top = max(finite, key=lambda row: (_number(row["samples_per_s"]),
                                           -_number(row["staleness_bound_rounds"])))
        best.append(BestRow(
            group=group, scheme=top["scheme"], p=int(_number(top["p"])),
            ssp=_number(top["ssp"]), round_time_s=_number(top["round_time_s"]),
            samples_per_s=_number(top["samples_per_s"]),
            nic_utilisation=_number(top["nic_utilisation"]),
            staleness_bound_rounds=_number(top["staleness_bound_rounds"]),
            bottleneck=top["bottleneck"], candidates=len(members)))
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
    headers = [*keys, "best", "round time", "samples/s", "NIC use", "staleness", "of",
               "bottleneck"]
    rows = []
    for row in best:
        choice = f"{row.scheme} p={row.p} s={_rounds(row.ssp)}" if row.scheme == "ako" \
            else row.scheme
        rows.append([*(_value(key, value) for key, value in row.group), choice,
                     format_duration(row.round_time_s), f"{row.samples_per_s:,.1f}",
                     f"{100 * row.nic_utilisation:.0f}%",
                     f"<= {_rounds(row.staleness_bound_rounds)} rounds",
                     str(row.candidates), row.bottleneck])
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip(),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
              for r in rows]
    return "\n".join(lines)


def print_summary(out: Path) -> None:
    """`akosim sweep`'s last lines: the best configuration of each group in out/sweep.csv."""
    path = out / "sweep.csv"
    if not path.exists():
        return
    print("best configuration per group (most samples/s; "
          f"plot: python -m analysis sweep {out}):")
    print(format_summary(best_per_group(read_rows(path))))
