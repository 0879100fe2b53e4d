"""The 2026 baselines report: time to accuracy per scheme in akorun (real-TCP testbed)
and akosim, akosim's error against akorun, and the akosim map of which scheme reaches
the target first over bandwidth x latency.

    python -m analysis.tta_report --testbed RESULTS --map analysis/data/tta_map.json

reads the testbed rows of analysis.tta_testbed (a results folder, or the committed
record ``analysis/data/tta_testbed.json`` when RESULTS is that file) and the map of
analysis.tta_map, and writes ``analysis/data/tta_testbed.json`` (the rows, so the doc
build reruns nothing), ``docs/reports/experiments-2026.md`` and its plots
(``tta-map.png``, ``tta-testbed.png``, ``tta-curves.png``). The discussion under the
tables is hand-written from the numbers (``analysis/data/tta_discussion.md``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from analysis.fault_goodput import RECORD as GOODPUT_PATH
from analysis.fault_goodput import GoodputRow
from analysis.fault_goodput import markdown as goodput_markdown
from analysis.plan_check import CheckedRow, section
from analysis.plan_check import row_from_json as row_of_check
from analysis.scheme_map import bytes_text
from analysis.tta_map import TtaMap, cells, read_map, winner
from analysis.tta_testbed import (
    BUDGET_S,
    CONFIGS,
    NETWORKS,
    TARGET_ACCURACY,
    WORKERS,
    WORKLOAD,
    WORKLOAD_ARG,
    TtaRow,
    backfill,
    finished_rows,
    relative_error,
    row_from_json,
)

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "analysis" / "data"
DOCS = ROOT / "docs" / "reports"
PAGE = "experiments-2026.md"
TESTBED_RECORD = "tta_testbed.json"
DISCUSSION = "tta_discussion.md"
GOODPUT_RECORD = GOODPUT_PATH.name
SCHEME_ORDER = [c.name for c in CONFIGS]


def read_testbed(source: Path) -> tuple[list[TtaRow], dict[str, Any]]:
    """The rows and the record's notes from a results folder or a committed record."""
    if source.is_file():
        data = json.loads(source.read_text(encoding="utf-8"))
        return [row_from_json(r) for r in data["rows"]], data.get("notes", {})
    notes: dict[str, Any] = {}
    calibration = source / "host-calibration.json"
    if calibration.exists():
        record = json.loads(calibration.read_text(encoding="utf-8"))
        notes["host_calibration_measured_at"] = record.get("measured_at")
    backfill(source)
    return finished_rows(source), notes


def _fmt(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:+.0f} %"


def rounds_to_target(evaluations: Sequence[tuple[float, int, float]]) -> int | None:
    return next((e[1] for e in evaluations if e[2] >= TARGET_ACCURACY), None)


def scheme_errors(rows: Sequence[TtaRow]) -> list[dict[str, Any]]:
    """Per configuration: akosim's errors against akorun over the networks measured
    (round time; time to target where both reached it), as mean |error| and the range."""
    out = []
    for name in SCHEME_ORDER:
        mine = [r for r in rows if r.config == name]
        if not mine:
            continue
        round_errors = [e for r in mine if (e := relative_error(
            r.predicted_round_time_s, r.measured_round_time_s)) is not None]
        tta_errors = [e for r in mine if (e := relative_error(
            r.predicted_time_to_target_s, r.measured_time_to_target_s)) is not None]
        out.append({
            "config": name, "networks": len(mine),
            "round_mean_abs": statistics.fmean(abs(e) for e in round_errors)
            if round_errors else None,
            "round_range": (min(round_errors), max(round_errors)) if round_errors else None,
            "tta_both": len(tta_errors),
            "tta_mean_abs": statistics.fmean(abs(e) for e in tta_errors)
            if tta_errors else None,
            "tta_range": (min(tta_errors), max(tta_errors)) if tta_errors else None,
            "reached_disagree": sum((r.measured_time_to_target_s is None)
                                    != (r.predicted_time_to_target_s is None) for r in mine),
        })
    return out


def _p(values: Sequence[int]) -> str:
    return "-" if not values else (str(values[0]) if len(set(values)) == 1
                                   else ",".join(map(str, values)))


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f} %"


def _range(value: tuple[float, float] | None) -> str:
    return "-" if value is None else f"{_pct(value[0])} .. {_pct(value[1])}"


def testbed_tables(rows: Sequence[TtaRow]) -> list[str]:
    lines: list[str] = []
    for network in NETWORKS:
        mine = [r for r in rows if r.network == network.name]
        if not mine:
            continue
        measured_winner = min((r for r in mine if r.measured_time_to_target_s is not None),
                              key=lambda r: r.measured_time_to_target_s or 0.0, default=None)
        predicted_winner = min((r for r in mine if r.predicted_time_to_target_s is not None),
                               key=lambda r: r.predicted_time_to_target_s or 0.0, default=None)
        lines += [
            f"### {network.description} (`{network.name}`)", "",
            f"First to {TARGET_ACCURACY:g}: akorun **"
            f"{measured_winner.config if measured_winner else 'none'}**, akosim **"
            f"{predicted_winner.config if predicted_winner else 'none'}**.", "",
            "| configuration | p | compute/round (ms) akorun | akosim | round (ms) akorun "
            "| akosim | error | "
            f"to {TARGET_ACCURACY:g} (s) akorun | akosim | error | rounds to it akorun / akosim "
            "| accuracy after "
            f"{BUDGET_S:g} s akorun | akosim | bytes/worker/round | bytes to target "
            "(akorun) | load (1 min) |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for r in mine:
            rounds = rounds_to_target(r.measured_evaluations)
            load = r.uptime_before.split("load average:")[-1].split(",")[0].strip()
            lines.append(
                f"| {r.config} | {_p(r.p_resolved)} | "
                f"{_fmt(None if r.measured_compute_s is None else 1e3 * r.measured_compute_s)} | "
                f"{1e3 * r.predicted_compute_s:.2f} | {1e3 * r.measured_round_time_s:.1f} | "
                f"{1e3 * r.predicted_round_time_s:.1f} | "
                f"{_pct(relative_error(r.predicted_round_time_s, r.measured_round_time_s))} | "
                f"{_fmt(r.measured_time_to_target_s)} | {_fmt(r.predicted_time_to_target_s)} | "
                f"{_pct(relative_error(r.predicted_time_to_target_s, r.measured_time_to_target_s))}"
                f" | {rounds or '-'} / {rounds_to_target(r.predicted_evaluations) or '-'}"
                f" | {_fmt(r.measured_final_accuracy, '.3f')} | "
                f"{_fmt(r.predicted_final_accuracy, '.3f')} | "
                f"{bytes_text(r.bytes_sent_per_worker_per_round)} | "
                f"{bytes_text(r.bytes_sent_per_worker_per_round * rounds if rounds else None)} | "
                f"{load} |")
        lines.append("")
    return lines


def error_table(rows: Sequence[TtaRow]) -> list[str]:
    lines = ["| configuration | networks | round time: mean abs error | range | "
             "time to target: runs both reached | mean abs error | range | "
             "reached in one tool only |",
             "|---|---:|---:|---|---:|---:|---|---:|"]
    for e in scheme_errors(rows):
        lines.append(
            f"| {e['config']} | {e['networks']} | "
            f"{_percent(e['round_mean_abs'])} | {_range(e['round_range'])} | {e['tta_both']} | "
            f"{_percent(e['tta_mean_abs'])} | "
            f"{_range(e['tta_range'])} | {e['reached_disagree']} |")
    return lines + [""]


def map_table(record: TtaMap) -> list[str]:
    by_cell = cells(record)
    lines = ["| bandwidth | one-way latency | first to target (codecs allowed) | time (s) | "
             "runner-up | time (s) | first with codec none | time (s) | DiLoCo (s) | "
             "all-reduce (s) | DiLoCo bytes to target / all-reduce's |",
             "|---|---|---|---:|---|---:|---|---:|---:|---:|---:|"]
    for bandwidth in record.bandwidths:
        for latency in record.latencies:
            rows = by_cell.get((bandwidth, latency), [])
            best = winner(rows)
            second = winner([r for r in rows if r is not best])
            plain = winner(rows, codecs=False)
            named = {r.config: r for r in rows}
            diloco, ring = named.get("diloco"), named.get("allreduce")
            ratio = (diloco.bytes_to_target_per_worker / ring.bytes_to_target_per_worker
                     if diloco and ring and diloco.bytes_to_target_per_worker
                     and ring.bytes_to_target_per_worker else None)
            lines.append(
                f"| {bandwidth} | {latency} | {best.config if best else '-'} | "
                f"{_fmt(best.time_to_target_s if best else None)} | "
                f"{second.config if second else '-'} | "
                f"{_fmt(second.time_to_target_s if second else None)} | "
                f"{plain.config if plain else '-'} | "
                f"{_fmt(plain.time_to_target_s if plain else None)} | "
                f"{_fmt(diloco.time_to_target_s if diloco else None)} | "
                f"{_fmt(ring.time_to_target_s if ring else None)} | {_fmt(ratio, '.2f')} |")
    return lines + [""]


def map_detail(record: TtaMap) -> list[str]:
    """Every configuration's time to target in every cell (s; '-' not reached)."""
    configs = [c for c in SCHEME_ORDER if any(r.config == c for r in record.rows)]
    lines = ["| bandwidth | latency | " + " | ".join(configs) + " |",
             "|---|---|" + "---:|" * len(configs)]
    for (bandwidth, latency), rows in cells(record).items():
        named = {r.config: r for r in rows}
        lines.append(f"| {bandwidth} | {latency} | " + " | ".join(
            _fmt(named[c].time_to_target_s) if c in named else "" for c in configs) + " |")
    return lines + [""]


# ------------------------------------------------------------------ plots


def write_map_png(record: TtaMap, path: Path) -> None:
    """Two heat maps: the first configuration to the target per cell with codecs allowed,
    and with codec none only; each cell coloured by configuration, labelled with its
    time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    by_cell = cells(record)
    fig, axes = plt.subplots(1, 2, figsize=(2.0 * len(record.latencies) + 3.0,
                                            0.8 * len(record.bandwidths) + 1.8))
    for ax, codecs, title in zip(axes, (True, False),
                                 ("codecs allowed", "codec none"), strict=True):
        grid = np.full((len(record.bandwidths), len(record.latencies)), np.nan)
        for i, bandwidth in enumerate(record.bandwidths):
            for j, latency in enumerate(record.latencies):
                best = winner(by_cell.get((bandwidth, latency), []), codecs=codecs)
                if best is None:
                    continue
                grid[i, j] = SCHEME_ORDER.index(best.config)
                ax.text(j, i, f"{best.config}\n{best.time_to_target_s:.2f} s",
                        ha="center", va="center", fontsize=6)
        ax.imshow(grid, cmap="Set3", vmin=0, vmax=11, aspect="auto")
        ax.set_xticks(range(len(record.latencies)), record.latencies)
        ax.set_yticks(range(len(record.bandwidths)), record.bandwidths)
        ax.set_xlabel("one-way latency")
        ax.set_ylabel("bandwidth per NIC")
        ax.set_title(f"first to {record.target_accuracy:g}, {title}", fontsize=9)
    fig.suptitle(f"akosim train (simulated time): {record.workers} workers, "
                 f"{record.workload}, max-min network", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_testbed_png(rows: Sequence[TtaRow], path: Path) -> None:
    """Per network, time to target of every configuration: akorun beside akosim (a
    configuration that did not reach it within the budget drawn at the budget, hatched)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    networks = [n for n in NETWORKS if any(r.network == n.name for r in rows)]
    fig, axes = plt.subplots(len(networks), 1, figsize=(8.5, 2.3 * len(networks) + 0.6),
                             squeeze=False)
    for ax, network in zip(axes[:, 0], networks, strict=True):
        mine = [r for r in rows if r.network == network.name]
        xs = range(len(mine))
        for offset, key, colour in ((-0.2, "measured_time_to_target_s", "tab:blue"),
                                    (0.2, "predicted_time_to_target_s", "tab:orange")):
            values = [getattr(r, key) for r in mine]
            heights = [BUDGET_S if v is None else v for v in values]
            bars = ax.bar([x + offset for x in xs], heights, width=0.4, color=colour)
            for bar, value in zip(bars, values, strict=True):
                if value is None:
                    bar.set_hatch("//")
                    bar.set_alpha(0.35)
        ax.set_yscale("log")
        ax.set_xticks(list(xs), [r.config for r in mine], fontsize=7, rotation=20)
        ax.set_ylabel(f"s to {TARGET_ACCURACY:g}", fontsize=8)
        ax.set_title(network.description, fontsize=8)
        ax.legend(handles=[Patch(color="tab:blue", label="akorun (testbed)"),
                           Patch(color="tab:orange", label="akosim")], fontsize=7)
    fig.suptitle(f"Time to {TARGET_ACCURACY:g} test accuracy, {WORKERS} workers, "
                 f"{WORKLOAD}:{WORKLOAD_ARG} (hatched: not reached in {BUDGET_S:g} s)",
                 fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_curves_png(rows: Sequence[TtaRow], path: Path) -> None:
    """Accuracy against time on each network: akorun solid, akosim dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    networks = [n for n in NETWORKS if any(r.network == n.name for r in rows)]
    fig, axes = plt.subplots(1, len(networks), figsize=(4.2 * len(networks), 3.6),
                             squeeze=False)
    colours = plt.get_cmap("tab10")
    for ax, network in zip(axes[0], networks, strict=True):
        for r in (r for r in rows if r.network == network.name):
            colour = colours(SCHEME_ORDER.index(r.config) % 10)
            for evaluations, style in ((r.measured_evaluations, "-"),
                                       (r.predicted_evaluations, "--")):
                if evaluations:
                    ax.plot([e[0] for e in evaluations], [e[2] for e in evaluations],
                            style, color=colour, linewidth=1,
                            label=r.config if style == "-" else None)
        ax.axhline(TARGET_ACCURACY, color="grey", linewidth=0.5)
        ax.set_xscale("log")
        ax.set_ylim(0.5, 1.0)
        ax.set_xlabel("s since training start", fontsize=8)
        ax.set_ylabel("test accuracy", fontsize=8)
        ax.set_title(network.description, fontsize=7)
    axes[0][0].legend(fontsize=6)
    fig.suptitle("Accuracy against time: akorun on the testbed (solid), akosim (dashed)",
                 fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------ the page


def goodput_section(goodput: dict[str, Any] | None) -> list[str]:
    """The goodput-under-faults table of analysis.fault_goodput's record (none without)."""
    if not goodput:
        return []
    rows = [GoodputRow(**row) for row in goodput["rows"]]
    return [
        "## Goodput under faults: DiLoCo and quorum DiLoCo (akorun)", "",
        f"Three ranks on the testbed ({goodput['network']}), the workload above, H = 10, "
        f"{goodput['budget_s']:g} s of training each: fault-free, rank 2 killed after round "
        f"{goodput['kill_round']} (`AKORUN_FAULT=2@kill_after_round:R`), and rank 2 "
        f"SIGSTOPped for {goodput['pause_s']:g} s ten seconds into its training. Goodput = "
        "the samples that ended in the run's model per second, over the fault-free run's of "
        "the same scheme (ranks that ended exit 0 count all their rounds, a killed rank its "
        "rounds up to the kill, a rank that ended exit 1 none). `python -m "
        "analysis.fault_goodput --results RESULTS` (resumable) writes "
        "`analysis/data/fault_goodput.json`.", "",
        goodput_markdown(rows), ""]


def markdown(rows: Sequence[TtaRow], notes: dict[str, Any], record: TtaMap | None,
             discussion: str = "", plan_check: Sequence[CheckedRow] = (),
             goodput: dict[str, Any] | None = None) -> str:
    loads = sorted(float(r.uptime_before.split("load average:")[-1].split(",")[0])
                   for r in rows if "load average:" in r.uptime_before)
    load_text = (f"{loads[0]:.1f}-{loads[-1]:.1f}, median {statistics.median(loads):.1f}"
                 if loads else "-")
    lines = [
        "# The 2026 baselines: which scheme reaches the accuracy first",
        "",
        "Ako, Streaming DiLoCo, DiLoCo, a synchronous parameter server, ring all-reduce, "
        "WAGMA and DiLoCo's successors (SparseLoCo, MuLoCo, quorum DiLoCo, SPARTA, NoLoCo) "
        "train the same model to the same target accuracy, on the real-TCP testbed "
        "(akorun) and in akosim; then akosim's map over bandwidth and latency says which "
        "reaches the target first where.",
        "",
        f"**Workload**: `{WORKLOAD}` with `{WORKLOAD_ARG}` (38,410 parameters, 154 kB of "
        f"float32), SGD lr 0.05, batch 32 per worker, {WORKERS} training workers (the "
        f"parameter server is a fourth rank), evaluation every 10 rounds, target "
        f"**{TARGET_ACCURACY:g}** test accuracy. Configurations: "
        + ", ".join(f"`{c.name}` (`{' '.join(c.flags)}`)" for c in CONFIGS) + ". "
        "WAGMA runs with codec none only: the codecs apply to Ako partials, "
        "parameter-server pushes, all-reduce reduce steps and DiLoCo's and Streaming "
        "DiLoCo's pseudo-gradients, not to WAGMA's model averages.",
        "",
        "Regenerate: `sudo python -m analysis.tta_testbed --results RESULTS "
        "--host-calibration H.json` (resumable), `python -m analysis.tta_map --out "
        "analysis/data/tta_map.json`, then `python -m analysis.tta_report --testbed RESULTS "
        "--map analysis/data/tta_map.json`; the rows are committed in "
        "`analysis/data/tta_testbed.json`.",
        "",
        "## akorun on the real-TCP testbed, and akosim's prediction of each run",
        "",
        f"Each run: `akorun launch --testbed netns` (one network namespace per rank, tc htb "
        f"shaping, the delay line for latency), {BUDGET_S:g} s of training, holding the "
        "measurement lock. akosim predicts it without anything the run timed: its round "
        "time with `akosim predict RUN --compute measure --host-calibration H` (the network "
        "as the testbed realised it, the step timed with as many processes at once as the "
        "run has ranks), its accuracy against time with `akosim train` of the same settings "
        f"at that compute per round, the TCP-aware model and the same host calibration, for "
        f"{BUDGET_S:g} simulated seconds. Error = akosim / akorun - 1. Round times are the "
        "steady-state mean over the training ranks; time to target is the first evaluation "
        "at or above it (rank 0's replica); bytes to target = bytes per worker per round x "
        "rounds to target.",
        "",
        "**Machine**: Linux x86_64, 2 cores shared with other jobs. Host calibration "
        f"measured {notes.get('host_calibration_measured_at', '-')} on this host "
        "(`akosim calibrate`, as analysis.fidelity_tcp). One-minute load average at the start "
        f"of the runs: {load_text} (each run's in the tables).",
        "",
        "![time to target, akorun beside akosim](tta-testbed.png)",
        "",
        "![accuracy against time](tta-curves.png)",
        "",
    ]
    lines += testbed_tables(rows)
    lines += ["### akosim's error against akorun, per configuration", ""]
    lines += error_table(rows)
    if plan_check:
        lines += section(plan_check)
    if record is not None:
        lines += [
            "## The map: first to the target over bandwidth x latency (akosim)", "",
            f"`akosim train` of every configuration in every cell until {TARGET_ACCURACY:g} "
            f"or {record.budget_s:g} simulated seconds: {record.workers} workers, the same "
            "workload and settings, akosim's own compute measurement (one process alone, as "
            "on a machine per worker), the max-min network model, one-way latency per "
            f"message. Generated {record.generated_utc} on {record.machine} in "
            f"{record.elapsed_s:.0f} s (load: {record.load}); the times are simulated, so "
            "the load changes only how long the map takes (and the measured compute step).",
            "",
            "![first to target per cell](tta-map.png)",
            "",
        ]
        lines += map_table(record)
        lines += ["### Every configuration's time to target (s, simulated)", ""]
        lines += map_detail(record)
    lines += goodput_section(goodput)
    if discussion:
        lines += [discussion.strip(), ""]
    return "\n".join(lines)


def write_all(rows: Sequence[TtaRow], notes: dict[str, Any], record: TtaMap | None,
              data_dir: Path, docs_dir: Path, discussion: str = "",
              plan_check: Sequence[CheckedRow] = (),
              goodput: dict[str, Any] | None = None) -> list[Path]:
    """The committed record, the plots and the page."""
    data_dir.mkdir(parents=True, exist_ok=True)
    docs_dir.mkdir(parents=True, exist_ok=True)
    written = [data_dir / TESTBED_RECORD]
    body = ",\n".join(json.dumps(asdict(r), separators=(",", ":")) for r in rows)
    written[0].write_text(f'{{"notes": {json.dumps(notes)},\n"rows": [\n{body}\n]}}\n',
                          encoding="utf-8")  # one line per row: a small, diffable record
    if rows:
        write_testbed_png(rows, docs_dir / "tta-testbed.png")
        write_curves_png(rows, docs_dir / "tta-curves.png")
        written += [docs_dir / "tta-testbed.png", docs_dir / "tta-curves.png"]
    if record is not None:
        write_map_png(record, docs_dir / "tta-map.png")
        written.append(docs_dir / "tta-map.png")
    page = docs_dir / PAGE
    page.write_text(markdown(rows, notes, record, discussion, plan_check, goodput),
                    encoding="utf-8")
    return [*written, page]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.tta_report",
                                     description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--testbed", type=Path, default=DATA / TESTBED_RECORD,
                        help="a results folder of analysis.tta_testbed, or its committed "
                             "record (default %(default)s)")
    parser.add_argument("--map", type=Path, default=DATA / "tta_map.json",
                        help="the record of analysis.tta_map (default %(default)s)")
    parser.add_argument("--data", type=Path, default=DATA, help="where the record goes")
    parser.add_argument("--docs", type=Path, default=DOCS, help="where the page goes")
    parser.add_argument("--discussion", type=Path, default=DATA / DISCUSSION,
                        help="hand-written Markdown appended to the page, if it exists")
    parser.add_argument("--plan-check", type=Path, default=DATA / "plan_check.json",
                        help="the rows of analysis.plan_check (the plan's answer against "
                             "the run), if it exists (default %(default)s)")
    parser.add_argument("--goodput", type=Path, default=DATA / GOODPUT_RECORD,
                        help="the record of analysis.fault_goodput, if it exists (default "
                             "%(default)s)")
    args = parser.parse_args(argv)
    if not args.testbed.exists():
        print(f"--testbed: {args.testbed} does not exist", file=sys.stderr)
        return 2
    rows, notes = read_testbed(args.testbed)
    record = read_map(args.map) if args.map.exists() else None
    discussion = (args.discussion.read_text(encoding="utf-8")
                  if args.discussion.exists() else "")
    checked = ([row_of_check(r) for r in json.loads(args.plan_check.read_text())]
               if args.plan_check.exists() else [])
    goodput = (json.loads(args.goodput.read_text(encoding="utf-8"))
               if args.goodput.exists() else None)
    for path in write_all(rows, notes, record, args.data, args.docs, discussion, checked,
                          goodput):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
