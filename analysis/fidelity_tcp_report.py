"""The markdown report of the real-TCP fidelity grid (docs/reports/fidelity-tcp.md).

`markdown_report(record)` turns a `FidelityTcpRecord` (analysis.fidelity_tcp_record)
into: the summary table (MAPE, Kendall's tau, mean signed error of each of the
three predictions), the signed error of every configuration, the errors grouped
by scheme, staleness bound, rate and cluster size, and the figures the analysis
of the remaining error rests on (each run's compute per rank against akosim's
own measurement, its per-message software cost, what TCP delivered of the
shaped rate). `summary_table(record)` is the table docs/reports/fidelity.md carries. The analysis in
prose is written by hand between two markers and kept when the report is
regenerated (`kept_analysis`). Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from akocore.schemes.registry import is_partitioned
from analysis.fidelity_tcp_record import COLUMNS, FidelityTcpRecord, FidelityTcpRow, summarise

ANALYSIS_BEGIN = "<!-- analysis:begin (written by hand, kept on regeneration) -->"
ANALYSIS_END = "<!-- analysis:end -->"
GOALS = {"host-calibrated": "MAPE <= 10%, tau >= 0.9", "run-calibrated": "MAPE <= 5%",
         "max-min": "(reference: no TCP, no calibration)"}


def _pct(value: float) -> str:
    return "-" if not math.isfinite(value) else f"{100 * value:+.1f}%"


def _abs_pct(value: float) -> str:
    return "-" if not math.isfinite(value) else f"{100 * value:.1f}%"


def _num(value: float, digits: int = 2) -> str:
    return "-" if not math.isfinite(value) else f"{value:.{digits}f}"


def summary_table(record: FidelityTcpRecord) -> str:
    lines = ["| prediction | configurations | MAPE | Kendall's tau | mean signed error | goal |",
             "|---|---|---|---|---|---|"]
    for column in record.columns:
        lines.append(f"| {column.column} | {column.configurations} | "
                     f"{_abs_pct(column.mape)} | {_num(column.kendall_tau)} | "
                     f"{_pct(column.mean_signed_error)} | {GOALS.get(column.column, '')} |")
    return "\n".join(lines)


def rows_table(rows: Sequence[FidelityTcpRow]) -> str:
    lines = ["| configuration | p (resolved) | measured s | host-cal. s (err) | run-cal. s (err) "
             "| max-min s (err) | run compute ms | msg software ms | uplink used |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        p = ",".join(map(str, r.p_resolved)) if r.p_resolved else "-"
        compute_ms = sum(r.run_compute_s) / len(r.run_compute_s) * 1e3 if r.run_compute_s \
            else math.nan
        software = [v for v in r.message_software_s if v > 0]
        software_ms = sum(software) / len(software) * 1e3 if software else math.nan
        lines.append(
            f"| {r.name} | {p} | {r.measured_round_time_s:.3f} | "
            f"{r.host_calibrated_s:.3f} ({_pct(r.error('host-calibrated'))}) | "
            f"{r.run_calibrated_s:.3f} ({_pct(r.error('run-calibrated'))}) | "
            f"{r.maxmin_s:.3f} ({_pct(r.error('max-min'))}) | {_num(compute_ms, 1)} | "
            f"{_num(software_ms, 2)} | {_abs_pct(r.uplink_utilisation)} |")
    return "\n".join(lines)


GROUPINGS: dict[str, Callable[[FidelityTcpRow], str]] = {
    "scheme": lambda r: r.scheme,
    "s": lambda r: str(r.ssp),
    "rate": lambda r: r.rate,
    "RTT": lambda r: f"{r.rtt_s * 1e3:>5g} ms",  # padded: sorts as numbers
    "workers": lambda r: str(r.workers),
    "p": lambda r: r.p_configured,
    "scheme/p/s": lambda r: (f"{r.scheme}-p{r.p_configured}" if is_partitioned(r.scheme)
                             else r.scheme) + f"-s{r.ssp}",
}


def grouped_table(rows: Sequence[FidelityTcpRow]) -> str:
    """Mean signed error and MAPE of each prediction per group, with the group's mean
    run compute over akosim's own measurement and mean uplink use."""
    head = " | ".join(f"{c} mean err / MAPE" for c in COLUMNS)
    lines = [f"| by | group | n | {head} | run compute / akosim's | uplink used |",
             "|---|---|---|" + "---|" * len(COLUMNS) + "---|---|"]
    for by, key in GROUPINGS.items():
        groups: dict[str, list[FidelityTcpRow]] = {}
        for row in rows:
            groups.setdefault(key(row), []).append(row)
        if by == "RTT" and len(groups) == 1:
            continue  # a grid without latency: one group, nothing to compare
        for group, members in sorted(groups.items()):
            cells = []
            for column in COLUMNS:
                s = summarise(members, column)
                cells.append(f"{_pct(s.mean_signed_error)} / {_abs_pct(s.mape)}")
            ratios = [sum(r.run_compute_s) / len(r.run_compute_s) / r.host_compute_s
                      for r in members if r.run_compute_s and r.host_compute_s > 0]
            used = [r.uplink_utilisation for r in members if math.isfinite(r.uplink_utilisation)]
            lines.append(f"| {by} | {group} | {len(members)} | {' | '.join(cells)} | "
                         f"{_num(sum(ratios) / len(ratios)) if ratios else '-'} | "
                         f"{_abs_pct(sum(used) / len(used)) if used else '-'} |")
    return "\n".join(lines)


def scheme_table(rows: Sequence[FidelityTcpRow]) -> str:
    """MAPE and Kendall's tau of each prediction within each scheme (tau needs three
    rows), and the scheme's share of the grid's summed absolute host-calibrated error,
    largest share first."""
    groups: dict[str, list[FidelityTcpRow]] = {}
    for row in rows:
        groups.setdefault(row.scheme, []).append(row)
    total = sum(abs(r.host_calibrated_s / r.measured_round_time_s - 1) for r in rows)
    head = " | ".join(f"{c} MAPE / tau" for c in COLUMNS)
    lines = [f"| scheme | n | {head} | share of host-calibrated error |",
             "|---|---|" + "---|" * len(COLUMNS) + "---|"]
    shares = {name: sum(abs(r.host_calibrated_s / r.measured_round_time_s - 1)
                        for r in members) / total if total > 0 else 0.0
              for name, members in groups.items()}
    for name in sorted(groups, key=lambda g: -shares[g]):
        members = groups[name]
        cells = []
        for column in COLUMNS:
            summary = summarise(members, column)
            tau = _num(summary.kendall_tau) if len(members) >= 3 else "-"
            cells.append(f"{_abs_pct(summary.mape)} / {tau}")
        lines.append(f"| {name} | {len(members)} | {' | '.join(cells)} | "
                     f"{_abs_pct(shares[name])} |")
    return "\n".join(lines)


def kept_analysis(previous_report: str) -> str:
    """The hand-written analysis between the markers of a previous report ('' if none)."""
    start = previous_report.find(ANALYSIS_BEGIN)
    end = previous_report.find(ANALYSIS_END)
    if start < 0 or end < start:
        return ""
    text = previous_report[start + len(ANALYSIS_BEGIN):end].strip()
    return "" if text.startswith("(not written yet") else text


def markdown_report(record: FidelityTcpRecord, analysis: str = "") -> str:
    """The whole report; `analysis` is the prose written from these figures (kept
    apart so the generated tables can be regenerated under it)."""
    rows = record.rows
    uptimes = [u for u in record.uptime if u]
    load = (f"`uptime` at the end of each launch ranged over: first `{uptimes[0]}`, last "
            f"`{uptimes[-1]}`") if uptimes else "`uptime` not recorded"
    rtts_ms = sorted({r.rtt_s * 1e3 for r in rows})
    wan = any(rtt > 0 for rtt in rtts_ms)
    latency = ("every pair's one-way latency, half the configuration's round trip of "
               + ", ".join(f"{rtt:g}" for rtt in rtts_ms) + " ms, held by the testbed's "
               "delay line") if wan else "no latency"
    rerun = (f"--grid wan --rounds {record.rounds} --results results/fidelity-wan --json "
             "analysis/data/fidelity-wan.json --report docs/reports/fidelity-wan.md" if wan else
             "--results results/fidelity-tcp --json analysis/data/fidelity-tcp.json")
    parts = [
        "# Fidelity on real TCP: akosim against akorun on the netns testbed"
        + (" with latency" if wan else ""),
        "",
        f"Generated by `python -m analysis.fidelity_tcp` (rerun: `sudo python -m "
        f"analysis.fidelity_tcp {rerun}`; resumable). Every configuration ran once with "
        "`akorun launch --testbed netns` (ranks in network namespaces, real kernel TCP, each "
        f"NIC shaped by tc htb both ways, {latency}), one at a time, "
        f"{record.workload}, {record.rounds} rounds; the measured round time is the mean "
        "steady-state round time (akocore.records.figures: the first 10% of rounds skipped) over "
        "the training ranks. Predictions by `akosim predict RUN_DIR`, which reads the "
        "network from the run's testbed.json:",
        "",
        "- **host-calibrated**: TCP-aware model, the host calibration made once before the "
        f"grid ({record.host_calibration_summary}), akosim's own compute measurement "
        f"({record.host_compute_s * 1e3:.2f} ms per step alone, single-threaded XLA as the "
        "ranks run it; on the testbed, where every rank runs on this host, the step "
        "measured with as many processes stepping at once as the run had training ranks, "
        "and the host's per-message cost stretched by the same measured slowdown and "
        "charged as the ranks' CPU, the step varying from round to round by the relative "
        "standard deviation measured there): nothing timed by the run being predicted (its "
        "resolved p is configuration, and is used);",
        "- **run-calibrated**: TCP-aware model with the run's compute, its variation and "
        "per-round overhead per rank and its `message_software_s`;",
        "- **max-min**: the pure fluid model, akosim's own compute as above, no per-message "
        "cost.",
        "",
        *(["akosim's step with k processes at once "
           "(`akosim.calibration.colocated_compute`, measured "
           "once and cached in the results folder): "
           + "; ".join(record.colocated_compute) + ".", ""]
          if record.colocated_compute else []),
        f"Machine load: {load}.",
        "",
        "## Summary",
        "",
        summary_table(record),
        "",
        "Per scheme (Kendall's tau within the scheme's rows; the last column: the "
        "scheme's part of the summed absolute host-calibrated error, largest first):",
        "",
        scheme_table(rows),
        "",
    ]
    parts += ["## Where the remaining error comes from", "", ANALYSIS_BEGIN,
              analysis.strip() or "(not written yet: the analysis is written from the tables "
              "below, between these markers, and kept when the report is regenerated)",
              ANALYSIS_END, ""]
    parts += [
        "## Errors by group",
        "",
        "Signed error = predicted / measured - 1 (negative: akosim predicts rounds too "
        "fast). \"run compute / akosim's\" is the runs' mean per-round compute over "
        "akosim's single-process measurement; \"uplink used\" is what the training ranks "
        "sent per round over the round time and the shaped rate.",
        "",
        grouped_table(rows),
        "",
        "## Every configuration",
        "",
        rows_table(rows),
        "",
    ]
    return "\n".join(parts)


__all__ = ["ANALYSIS_BEGIN", "ANALYSIS_END", "GOALS", "grouped_table", "kept_analysis",
           "markdown_report", "rows_table", "scheme_table", "summary_table"]
