"""Markdown tables from a `CrossCheckRecord`.

`summary_table` gives, per pattern family and latency, the median and range of
ns-3's network time per round over each akosim model's, and the case furthest
from agreement; `case_table` lists every case.
"""

from __future__ import annotations

import statistics

from analysis.ns3_crosscheck.ns3_scenario import FAMILIES
from analysis.ns3_crosscheck.record import CaseResult, CrossCheckRecord

FAMILY_TITLES = {"all-to-all": "all-to-all round", "ako": "Ako rounds (s = 0)",
                 "ps": "parameter server"}


def _latency(latency_s: float) -> str:
    return f"{latency_s * 1e3:g} ms"


def _groups(record: CrossCheckRecord) -> list[tuple[str, float, list[CaseResult]]]:
    groups: dict[tuple[str, float], list[CaseResult]] = {}
    for case in record.cases:
        groups.setdefault((case.family, case.latency_s), []).append(case)
    order = {family: index for index, family in enumerate(FAMILIES)}
    keys = sorted(groups, key=lambda key: (order.get(key[0], len(order)), key[1]))
    return [(family, latency_s, groups[(family, latency_s)]) for family, latency_s in keys]


def summary_table(record: CrossCheckRecord) -> str:
    """One row per pattern family and latency; one ratio column per akosim model."""
    header = ["pattern", "latency", "cases"]
    header += [f"ns-3 / akosim {model}: median (range)" for model in record.models]
    header += [f"furthest case ({record.models[0]})"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for family, latency_s, cases in _groups(record):
        row = [FAMILY_TITLES.get(family, family), _latency(latency_s), str(len(cases))]
        for model in record.models:
            ratios = [case.ratio(model) for case in cases]
            row.append(f"{statistics.median(ratios):.2f} "
                       f"({min(ratios):.2f}-{max(ratios):.2f})")
        furthest = max(cases, key=lambda case: abs(case.ratio(record.models[0]) - 1))
        row.append(f"{furthest.name}: {furthest.ratio(record.models[0]):.2f}")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def case_table(record: CrossCheckRecord) -> str:
    """Every case: its network time per round in ns-3 and each model, and the ratios."""
    header = ["case", "rounds", "compute (s)", "ns-3 network s/round"]
    for model in record.models:
        header += [f"akosim {model} s/round", f"ratio ({model})"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for case in record.cases:
        row = [case.name, str(case.rounds), f"{case.compute_s:g}",
               f"{case.network_s(case.ns3_makespan_s):.4g}"]
        for model in record.models:
            row += [f"{case.network_s(case.akosim_makespan_s(model)):.4g}",
                    f"{case.ratio(model):.2f}"]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)
