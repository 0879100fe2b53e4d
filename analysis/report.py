"""Result files -> the seeds' table, time to target, p auto, fidelity, and plots.

`build_report(results, out)` reads RESULTS/<backend>/<network>/<n>w-<scheme>/result.json
(written by analysis.run) and writes OUT/README.md, OUT/summary.json and, when
matplotlib is installed, OUT/accuracy-<network>.png (accuracy against time, one
per network, every backend that ran). Without matplotlib it writes the tables
and says so.

Time axes. akosim: simulated seconds. akorun: wall seconds since training
start (akorun compiles before its start barrier, so no round holds JAX
compilation; results written before that change did, so the first
WARMUP_ROUNDS rounds are still counted at the steady round time when they were
slower), cut at the budget; an evaluation is placed at the end of the round it
evaluated (akorun evaluates off the training path; its records carry that
round's end too).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from akocore.figures import mean_of_known
from akocore.results import PlanResult, RunResult, rank_overhead_s, read_result
from analysis.fidelity import FidelitySummary, Pair, markdown
from analysis.matrix import (
    NETWORKS,
    SCALING,
    SCHEME_TITLES,
    SCHEMES,
    SEED_BUDGET_S,
    SEED_TARGET,
    TARGET_ACCURACY,
    WORKER_COUNTS,
    Experiment,
    all_experiments,
    seed_accuracy,
)

BACKENDS = ("akosim", "akorun", "akosim-calibrated", "akosim-fullsize")
TRAINING_BACKENDS = ("akosim", "akorun")  # akosim-calibrated is timing only
WARMUP_ROUNDS = 3
FIXED_P = ("ako-p1", "ako-various", "ako-p4")


@dataclass
class Record:
    """One configuration run by one backend."""

    backend: str
    config: str
    network: str
    workers: int
    scheme: str
    round_time_s: float | None
    bytes_per_round: float | None
    compute_s: float | None  # mean over training workers
    p_of: list[int] | None
    curve: list[tuple[float, int, float]] = field(default_factory=list)  # (t, round, acc)
    final_accuracy: float | None = None
    rounds: int | None = None
    partial: bool = False  # run with a --rounds override (CI subset): not the budget
    overhead_s: float | None = None  # akorun: mean per-round time outside gradient and gate
    message_overhead_s: float | None = None  # akorun: mean time a message costs past the wire


def _num(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _akosim_record(backend: str, exp: Experiment, plan: PlanResult) -> Record:
    run = plan.runs[0]
    curve = [(float(t), int(round_), float(acc)) for t, round_, acc in run.evaluations]
    training = plan.compute_s[:run.training_workers]
    return Record(backend, exp.id, exp.network.name, exp.workers, exp.scheme,
                  _num(run.round_time_s), _num(run.bytes_sent_per_worker_per_round),
                  sum(training) / len(training) if training else None,
                  list(run.p_of) or None, curve, _num(run.final_accuracy),
                  max((w.rounds for w in run.per_worker), default=None))


def akorun_time_axis(round_end_s: Sequence[float], round_time_s: float | None) -> list[float]:
    """End of each round, with the warm-up rounds counted at the steady round time."""
    ends = [float(x) for x in round_end_s]
    if not ends:
        return []
    w = min(WARMUP_ROUNDS, len(ends))
    steady = round_time_s if round_time_s else ends[-1] / len(ends)
    offset = max(ends[w - 1] - w * steady, 0.0)
    return [t - offset for t in ends]


def _akorun_record(exp: Experiment, run: RunResult) -> Record:
    ranks = run.training_ranks
    curve: list[tuple[float, int, float]] = []
    rounds = None
    if ranks:
        first = ranks[0]
        axis = akorun_time_axis(first.round_end_s, _num(first.round_time_s))
        rounds = len(axis)
        for _, round_, accuracy in first.evaluations:
            if 1 <= round_ <= len(axis):
                curve.append((axis[round_ - 1], int(round_), float(accuracy)))
        curve.sort()
    return Record("akorun", exp.id, exp.network.name, exp.workers, exp.scheme,
                  _num(run.round_time_s), _num(run.bytes_sent_per_worker_per_round),
                  _num(run.compute_s_per_round), list(run.p_of) or None,
                  curve, _num(ranks[0].final_accuracy) if ranks else None, rounds,
                  overhead_s=rank_overhead_s(run),
                  message_overhead_s=mean_of_known([w.message_overhead_s
                                                    for w in run.per_worker]))


def p_text(record: Record | None) -> str:
    """The distinct p values of an ako run, e.g. "4" or "2,4"; "-" otherwise."""
    if record is None or not record.p_of or record.scheme == "ps":
        return "-"
    return ",".join(str(v) for v in sorted(set(record.p_of)))


def load_records(results: Path) -> dict[tuple[str, str], Record]:
    records: dict[tuple[str, str], Record] = {}
    for exp in all_experiments():
        for backend in BACKENDS:
            folder = results / backend / exp.network.name / f"{exp.workers}w-{exp.scheme}"
            path = folder / "result.json"
            if not path.exists() or not (folder / "done.json").exists():
                continue
            result = read_result(json.loads(path.read_text()))
            done = json.loads((folder / "done.json").read_text())
            if backend == "akorun" and isinstance(result, RunResult):
                record = _akorun_record(exp, result)
            elif backend != "akorun" and isinstance(result, PlanResult):
                record = _akosim_record(backend, exp, result)
            else:
                raise ValueError(f"{path}: a {type(result).__name__} is not what {backend} "
                                 f"writes")
            record.partial = done.get("rounds_override") is not None
            records[(backend, exp.id)] = record
    return records


# ---------------------------------------------------------------------- figures of merit


def accuracy_at(curve: Sequence[tuple[float, int, float]], budget_s: float) -> float | None:
    """The last evaluated accuracy at or before the budget."""
    before = [acc for t, _, acc in curve if t <= budget_s + 1e-9]
    return before[-1] if before else None


def time_to(curve: Sequence[tuple[float, int, float]], target: float,
            budget_s: float | None = None) -> tuple[float, int] | None:
    """(time, round) of the first evaluation at or above target (within the budget)."""
    for t, round_, acc in curve:
        if budget_s is not None and t > budget_s + 1e-9:
            return None
        if acc >= target:
            return t, round_
    return None


def _fmt(value: float | None, spec: str = ".1f", missing: str = "-") -> str:
    return missing if value is None or not math.isfinite(value) else format(value, spec)


def _pct(value: float | None) -> str:
    return _fmt(None if value is None else 100 * value, ".1f")


def ttt(records: dict[tuple[str, str], Record], backend: str, config: str) -> float | None:
    record = records.get((backend, config))
    if record is None:
        return None
    hit = time_to(record.curve, TARGET_ACCURACY, SCALING.budget_s)
    return hit[0] if hit else None


# ---------------------------------------------------------------------- tables


def seeds_table(records: dict[tuple[str, str], Record]) -> str:
    budget = SCALING.budget_s
    head = "| Network | n | " + " | ".join(SCHEME_TITLES[s] for s in SCHEMES) + " |"
    lines = [head, "|---|---|" + "---|" * len(SCHEMES)]
    for net in NETWORKS:
        for n in WORKER_COUNTS:
            cells = []
            for scheme in SCHEMES:
                config = f"{net.name}/{n}w-{scheme}"
                seed = seed_accuracy(net.name, n, scheme)
                ours = []
                for backend in ("akosim", "akorun"):
                    record = records.get((backend, config))
                    value = accuracy_at(record.curve, budget) if record else None
                    star = "*" if record is not None and record.partial else ""
                    ours.append(_pct(value) + star)
                cells.append(f"{_fmt(seed, 'g')} / {ours[0]} / {ours[1]}")
            lines.append(f"| {net.title} | {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def time_to_target_table(records: dict[tuple[str, str], Record]) -> str:
    lines = ["| configuration | p (akosim) | akosim s | akorun s | "
             "rounds to target (akosim) | full-size round s | full-size est. s | "
             "seeds' 300 s reached? |",
             "|---|---|---|---|---|---|---|---|"]
    for exp in all_experiments():
        if not any((b, exp.id) in records for b in BACKENDS):
            continue
        sim = records.get(("akosim", exp.id))
        full = records.get(("akosim-fullsize", exp.id))
        hit = time_to(sim.curve, TARGET_ACCURACY, SCALING.budget_s) if sim else None
        rounds = hit[1] if hit else None
        full_rt = full.round_time_s if full else None
        estimate = rounds * full_rt if rounds is not None and full_rt else None
        p = ",".join(map(str, sim.p_of)) if sim and sim.p_of and exp.scheme != "ps" else "-"
        reached = "-" if estimate is None else ("yes" if estimate <= SEED_BUDGET_S else "no")
        lines.append(
            f"| {exp.id} | {p} | {_fmt(ttt(records, 'akosim', exp.id), '.2f')} | "
            f"{_fmt(ttt(records, 'akorun', exp.id), '.2f')} | "
            f"{_fmt(rounds, 'd') if rounds is not None else '-'} | {_fmt(full_rt, '.3f')} | "
            f"{_fmt(estimate, '.0f')} | {reached} |")
    return "\n".join(lines)


@dataclass
class GoalRow:
    backend: str
    network: str
    workers: int
    ps_s: float | None
    best_ako_s: float | None  # best Ako with p > 1 (various, 4, auto)
    p1_s: float | None
    speedup: float | None
    beats_p1: bool | None
    auto_s: float | None
    best_fixed_s: float | None
    auto_ratio: float | None
    spread_pts: float | None  # max - min accuracy over schemes at the budget, points


def _min(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return min(known) if known else None


def goal_rows(records: dict[tuple[str, str], Record]) -> list[GoalRow]:
    rows = []
    for backend in TRAINING_BACKENDS:
        for net in NETWORKS:
            for n in WORKER_COUNTS:
                ids = {s: f"{net.name}/{n}w-{s}" for s in SCHEMES}
                if not any((backend, c) in records for c in ids.values()):
                    continue
                t = {s: ttt(records, backend, c) for s, c in ids.items()}
                ran = {s: (backend, c) in records for s, c in ids.items()}
                best_ako = _min(t[s] for s in ("ako-various", "ako-p4", "ako-pauto"))
                ps = t["ps"]
                speedup = None
                if best_ako is not None and ran["ps"]:
                    # not reached within the budget: at least budget / best_ako
                    speedup = (ps if ps is not None else SCALING.budget_s) / best_ako
                beats_p1 = None
                if best_ako is not None and ran["ako-p1"]:
                    beats_p1 = t["ako-p1"] is None or best_ako < t["ako-p1"]
                best_fixed = _min(t[s] for s in FIXED_P)
                auto_ratio = None
                if t["ako-pauto"] is not None and best_fixed is not None:
                    auto_ratio = t["ako-pauto"] / best_fixed
                at_budget = [accuracy_at(records[(backend, c)].curve, SCALING.budget_s)
                             for c in ids.values() if (backend, c) in records]
                accs = [a for a in at_budget if a is not None]
                spread = 100 * (max(accs) - min(accs)) if len(accs) >= 2 else None
                rows.append(GoalRow(backend, net.name, n, ps, best_ako, t["ako-p1"], speedup,
                                    beats_p1, t["ako-pauto"], best_fixed, auto_ratio, spread))
    return rows


def goals_table(rows: Sequence[GoalRow]) -> str:
    lines = ["| backend | network | n | PS s | best Ako p>1 s | speedup vs PS | beats p=1 | "
             "p auto s | best fixed p s | auto / best fixed | accuracy spread (pts) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        speed = "-" if r.speedup is None else (
            f"{r.speedup:.2f}x" + ("" if r.ps_s is not None else " (PS did not reach: >=)"))
        beats = "-" if r.beats_p1 is None else ("yes" if r.beats_p1 else "no")
        lines.append(f"| {r.backend} | {r.network} | {r.workers} | {_fmt(r.ps_s, '.2f')} | "
                     f"{_fmt(r.best_ako_s, '.2f')} | {speed} | {beats} | "
                     f"{_fmt(r.auto_s, '.2f')} | {_fmt(r.best_fixed_s, '.2f')} | "
                     f"{_fmt(r.auto_ratio, '.2f')} | {_fmt(r.spread_pts, '.1f')} |")
    return "\n".join(lines)


def goals_verdict(rows: Sequence[GoalRow]) -> list[str]:
    out = []
    for backend in TRAINING_BACKENDS:
        mine = [r for r in rows if r.backend == backend]
        if not mine:
            continue
        constrained = [r for r in mine if r.network != "uniform-lan" and r.speedup is not None]
        lan = [r for r in mine if r.network == "uniform-lan" and r.spread_pts is not None]
        auto = [r for r in mine if r.auto_ratio is not None]
        parts = []
        if constrained:
            ok = sum(1 for r in constrained
                     if r.speedup is not None and r.speedup >= 2 and r.beats_p1)
            parts.append(f"Ako p>1 >= 2x sooner than PS and beats p=1 on {ok}/{len(constrained)}"
                         f" constrained configurations")
        if lan:
            parts.append("uniform LAN accuracy spread " + ", ".join(
                f"{r.workers}w {r.spread_pts:.1f} pts" for r in lan))
        if auto:
            ok = sum(1 for r in auto if r.auto_ratio is not None and r.auto_ratio <= 1.10)
            parts.append(f"p auto within 10% of the best fixed p on {ok}/{len(auto)}")
        out.append(f"- **{backend}**: " + ("; ".join(parts) if parts else "too few runs yet"))
    return out


def fidelity(records: dict[tuple[str, str], Record]) -> tuple[list[FidelitySummary], str]:
    summaries = []
    detail = ["| configuration | p akorun / akosim | akorun compute s | akorun overhead s | "
              "akorun message overhead s | akosim compute s | measured round s | "
              "predicted (uncal.) | error | predicted (cal.) | error | measured B/round | "
              "predicted B/round (cal.) | error |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for calibration, backend in (("uncalibrated", "akosim"), ("calibrated", "akosim-calibrated")):
        figures: tuple[tuple[str, Callable[[Record], float | None]], ...] = (
            ("round time", lambda r: r.round_time_s),
            ("bytes per round", lambda r: r.bytes_per_round))
        for metric, figure in figures:
            pairs = []
            for exp in all_experiments():
                measured = records.get(("akorun", exp.id))
                predicted = records.get((backend, exp.id))
                if measured is None or predicted is None:
                    continue
                m, p = figure(measured), figure(predicted)
                if m is None or p is None:
                    continue
                pairs.append(Pair(exp.id, m, p))
            summaries.append(FidelitySummary(metric, calibration, tuple(pairs)))
    for exp in all_experiments():
        real = records.get(("akorun", exp.id))
        if real is None:
            continue
        unc = records.get(("akosim", exp.id))
        cal = records.get(("akosim-calibrated", exp.id))

        def err(pred: float | None, meas: float | None) -> str:
            if pred is None or not meas:
                return "-"
            return f"{100 * (pred / meas - 1):+.1f}%"

        detail.append(
            f"| {exp.id} | {p_text(real)} / {p_text(unc)} | {_fmt(real.compute_s, '.4f')} | "
            f"{_fmt(real.overhead_s, '.4f')} | {_fmt(real.message_overhead_s, '.4f')} | "
            f"{_fmt(unc.compute_s if unc else None, '.4f')} | {_fmt(real.round_time_s, '.4f')} | "
            f"{_fmt(unc.round_time_s if unc else None, '.4f')} | "
            f"{err(unc.round_time_s if unc else None, real.round_time_s)} | "
            f"{_fmt(cal.round_time_s if cal else None, '.4f')} | "
            f"{err(cal.round_time_s if cal else None, real.round_time_s)} | "
            f"{_fmt(real.bytes_per_round, ',.0f')} | "
            f"{_fmt(cal.bytes_per_round if cal else None, ',.0f')} | "
            f"{err(cal.bytes_per_round if cal else None, real.bytes_per_round)} |")
    return summaries, "\n".join(detail)


# ---------------------------------------------------------------------- plots

STYLES = {"akosim": "-", "akorun": "--", "akosim-calibrated": ":"}
COLOURS = {"ps": "tab:red", "ako-p1": "tab:blue", "ako-various": "tab:orange",
           "ako-p4": "tab:green", "ako-pauto": "tab:purple"}


def plot_networks(records: dict[tuple[str, str], Record], out: Path) -> list[Path]:
    """One PNG per network: accuracy against time, a panel per worker count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for net in NETWORKS:
        mine = [r for r in records.values()
                if r.network == net.name and r.backend in STYLES and r.curve]
        if not mine:
            continue
        fig, axes = plt.subplots(1, len(WORKER_COUNTS), figsize=(15, 4.5), sharey=True)
        for ax, n in zip(axes, WORKER_COUNTS, strict=True):
            for record in sorted(mine, key=lambda r: (r.backend, SCHEMES.index(r.scheme))):
                if record.workers != n:
                    continue
                ts = [t for t, _, _ in record.curve]
                accs = [a for _, _, a in record.curve]
                ax.plot(ts, accs, STYLES[record.backend], color=COLOURS[record.scheme],
                        label=f"{SCHEME_TITLES[record.scheme]} ({record.backend})", lw=1.3)
            ax.axhline(TARGET_ACCURACY, color="grey", lw=0.8)
            ax.axvline(SCALING.budget_s, color="grey", lw=0.8, ls="-.")
            ax.set_title(f"{net.title}, {n} workers")
            ax.set_xlabel("training time (s, scaled)")
            ax.set_xlim(0, SCALING.budget_s * 1.02)
            ax.set_ylim(0.5, 1.0)
            ax.grid(alpha=0.3)
        axes[0].set_ylabel("test accuracy (first worker's replica)")
        handles, labels = [], []
        for ax in axes:
            for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
                if label not in labels:
                    handles.append(h)
                    labels.append(label)
        fig.legend(handles, labels, loc="lower center", ncol=5, fontsize=8)
        fig.tight_layout(rect=(0, 0.14, 1, 1))
        path = out / f"accuracy-{net.name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


# ---------------------------------------------------------------------- the report


def missing_runs(records: dict[tuple[str, str], Record]) -> dict[str, int]:
    return {b: sum(1 for e in all_experiments() if (b, e.id) not in records) for b in BACKENDS}


class FewerResults(Exception):
    """The results found are fewer than those of the report they would replace."""


def runs_in_report(out: Path) -> int | None:
    """How many runs the report in `out` (its summary.json) was made from; None when
    there is no report there yet."""
    path = out / "summary.json"
    if not path.exists():
        return None
    missing = json.loads(path.read_text(encoding="utf-8")).get("missing", {})
    total = len(all_experiments())
    return sum(total - int(m) for m in missing.values())


def build_report(results: Path, out: Path, *, plots: bool = True,
                 project_readme: Path | None = None, force: bool = False) -> Path:
    """Write OUT/README.md, OUT/summary.json and the plots; with `project_readme`, also
    fill its experiments block (between BEGIN_MARK and END_MARK) with the main tables.

    Refuses (FewerResults), before writing anything, when `results` holds fewer runs
    than the report already in `out` was made from, unless `force`."""
    records = load_records(results)
    before = runs_in_report(out)
    if not force and before is not None and len(records) < before:
        raise FewerResults(
            f"{results} holds {len(records)} runs, fewer than the {before} of the report in "
            f"{out}; run the experiments (python -m analysis.run) or pass --force to "
            f"replace it anyway")
    out.mkdir(parents=True, exist_ok=True)
    images: list[Path] = []
    plot_note = ""
    if plots:
        try:
            images = plot_networks(records, out)
        except ImportError:
            plot_note = ("> matplotlib is not installed, so there are no plots: "
                         "`pip install -e '.[plot]'` and rerun `python -m analysis`.\n")
    else:
        plot_note = "> plots were not requested (--no-plots).\n"
    summaries, detail = fidelity(records)
    rows = goal_rows(records)
    missing = missing_runs(records)
    partial = any(r.partial for r in records.values())
    total = len(all_experiments())
    budget = SCALING.budget_s
    text = [
        "# The seeds' experiment, reproduced (generated by `python -m analysis`)\n",
        f"Results from `{results}`. Scaling: see [analysis/SCALING.md](../../analysis/SCALING.md)"
        f" (bandwidth x {SCALING.bandwidth_factor:.4f}, time x {SCALING.time_factor:.4f}, "
        f"budget {budget:g} s, target {TARGET_ACCURACY:.0%} on digits where the seeds had "
        f"{SEED_TARGET:.0%} on CIFAR-10).\n",
        "Runs present: " + ", ".join(f"{b} {total - m}/{total}" for b, m in missing.items())
        + ".\n",
    ]
    if partial:
        text.append("> Some runs (marked *) used a --rounds override (the CI subset): their "
                    "numbers are not the budget's.\n")
    text += [
        "## Accuracy after the time budget (the seeds' table)\n",
        f"Each cell: seeds' CIFAR-10 accuracy after 300 s / akosim / akorun, digits "
        f"accuracy (%) after {budget:g} s scaled (the same number of compute steps). The "
        "tasks differ, so compare the order of the schemes and the gaps, not the levels.\n",
        seeds_table(records), "",
        "## Time to target accuracy\n",
        f"Seconds (scaled) to {TARGET_ACCURACY:.0%}; '-' = not reached within the budget or "
        "not run. Full-size estimate = rounds to target (scaled akosim training) x the "
        "full-size round time (akosim timing-only, the seed CNN's 17.05 MB gradient, "
        "T_c 0.25 s, the seeds' bandwidths): an estimate that assumes the rounds to target "
        "carry over.\n",
        time_to_target_table(records), "",
        "## Goals\n",
        "Speedup = PS time to target / best Ako p > 1 (various, 4, auto); when PS does not "
        "reach the target, the budget is used (a lower bound). Accuracy spread: max - min over "
        "the schemes at the budget.\n",
        goals_table(rows), "", *goals_verdict(rows), "",
        "## Fidelity: akosim's prediction against akorun's measurement\n",
        "Uncalibrated: akosim measures compute itself (`--compute measure`: one process "
        "alone, median of 30 gradient steps after a warm-up, once for the whole matrix), "
        "models no per-round or per-message overhead and resolves p auto itself (so its p "
        "can differ from akorun's: column p). Calibrated (timing only, no gradients): akosim "
        "takes each rank's compute time, per-round overhead (time outside the gradient step "
        "and the gate: dispatch, inbox, optimizer, event loop) and per-message overhead "
        "(what a message costs past the emulated wire: task hops, HTTP, verification, "
        "apply; added to the link latency) from the akorun run (`--compute-from`), and "
        "akorun's resolved p (`--p`), so p auto compares like with like. The difference "
        "between the two is the share of the error that comes from the machine (compute "
        "slowed by sharing 2 cores, the software stack); what is left in the calibrated "
        "error is the network model.\n",
        markdown(summaries) if any(s.pairs for s in summaries) else
        "_No configuration has run in both backends yet._", "", detail, "",
        "## Plots\n", plot_note,
    ]
    text += [f"![{p.stem}]({p.name})\n" for p in images]
    readme = out / "README.md"
    readme.write_text("\n".join(text), encoding="utf-8")
    summary = {
        "scaling": {"bandwidth_factor": SCALING.bandwidth_factor,
                    "time_factor": SCALING.time_factor, "budget_s": budget,
                    "target_accuracy": TARGET_ACCURACY},
        "records": [asdict(r) for r in records.values()],
        "goals": [asdict(r) for r in rows],
        "fidelity": [{"metric": s.metric, "calibration": s.calibration, "n": len(s.pairs),
                      "mape": None if math.isnan(s.mape) else s.mape,
                      "kendall_tau": None if math.isnan(s.kendall_tau) else s.kendall_tau,
                      "pairs": [asdict(p) for p in s.pairs]} for s in summaries],
        "missing": missing,
        "plots": [p.name for p in images],
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
    if project_readme is not None:
        splice(project_readme, "\n".join([
            f"Generated by `python -m analysis` from `{results.as_posix()}` (runs present: "
            + ", ".join(f"{b} {total - m}/{total}" for b, m in missing.items())
            + f"); every table, the time to target per configuration and the fidelity per "
            f"configuration are in [{out.as_posix()}/README.md]({out.as_posix()}/README.md).\n",
            f"**Accuracy after the budget** (seeds' CIFAR-10 % after 300 s / akosim / akorun, "
            f"digits % after {budget:g} s scaled):\n",
            seeds_table(records), "",
            "**Goals** (time to target in scaled seconds; speedup = PS / best Ako p > 1):\n",
            goals_table(rows), "", *goals_verdict(rows), "",
            "**Fidelity** (akosim's round time and bytes per round against akorun's):\n",
            markdown(summaries) if any(s.pairs for s in summaries) else
            "_No configuration has run in both backends yet._", "",
            *[f"![{p.stem}]({out.as_posix()}/{p.name})" for p in images]]))
    return readme


BEGIN_MARK = "<!-- experiments:begin (generated by python -m analysis --readme README.md) -->"
END_MARK = "<!-- experiments:end -->"


def splice(readme: Path, body: str) -> None:
    """Replace what lies between the experiment markers of `readme` with `body`."""
    text = readme.read_text(encoding="utf-8")
    start, end = text.find(BEGIN_MARK), text.find(END_MARK)
    if start < 0 or end < start:
        raise ValueError(f"{readme}: no {BEGIN_MARK!r} ... {END_MARK!r} block to fill")
    head = text[:start + len(BEGIN_MARK)]
    readme.write_text(f"{head}\n{body.strip()}\n{text[end:]}", encoding="utf-8")
