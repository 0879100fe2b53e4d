"""Records -> the report's markdown tables: the seeds' table, time to target, goals, fidelity.

Every function takes the records of analysis.records (keyed by (backend,
configuration id)) and returns markdown (or, for the goals, the rows and then
their table and verdict); `fidelity` also returns the per-metric summaries
analysis.fidelity computes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from akocore.schemes.registry import has_servers
from analysis.fidelity import FidelitySummary, Pair
from analysis.matrix import (
    NETWORKS,
    SCALING,
    SCHEME_TITLES,
    SCHEMES,
    SEED_BUDGET_S,
    TARGET_ACCURACY,
    WORKER_COUNTS,
    all_experiments,
    core_scheme,
    seed_accuracy,
)
from analysis.records import (
    BACKENDS,
    TRAINING_BACKENDS,
    Record,
    accuracy_at,
    p_text,
    time_to,
    ttt,
)

FIXED_P = ("ako-p1", "ako-various", "ako-p4")


def _fmt(value: float | None, spec: str = ".1f", missing: str = "-") -> str:
    return missing if value is None or not math.isfinite(value) else format(value, spec)


def _pct(value: float | None) -> str:
    return _fmt(None if value is None else 100 * value, ".1f")


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
        p = ",".join(map(str, sim.p_of)) \
            if sim and sim.p_of and not has_servers(core_scheme(exp.scheme)) else "-"
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
