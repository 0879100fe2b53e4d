"""Run every benchmark, compare with the stored baseline, print a table last.

    python -m tests.bench                   # all benchmarks (what `nox -s bench` runs)
    python -m tests.bench --only core,sim   # modules tests/bench/bench_core.py, bench_sim...
    python -m tests.bench --update-baseline # store this run's figures as the baseline
    python -m tests.bench --out figures.json

A figure regresses when it is worse than the baseline by more than its
tolerance (--tolerance, default 35%: the machines are shared and noisy, and
most figures are already ratios to a reference measured in the same run).
Exit status 1 when any figure regresses; goals that are missed are reported
but do not fail the run.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import pkgutil
import sys
import time
from pathlib import Path

from tests.bench.common import Figure

BASELINE = Path(__file__).with_name("baseline.json")


def discover(only: set[str] | None) -> list[str]:
    names = sorted(m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)])
                   if m.name.startswith("bench_"))
    if only:
        names = [n for n in names if n.removeprefix("bench_") in only or n in only]
    return names


def regressed(figure: Figure, base: float, tolerance: float) -> bool:
    if figure.higher_is_better:
        return figure.value < base * (1 - tolerance)
    return figure.value > base * (1 + tolerance)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="comma-separated benchmark modules, e.g. core,akosim")
    parser.add_argument("--tolerance", type=float, default=0.35)
    parser.add_argument("--update-baseline", action="store_true")
    parser.add_argument("--out", help="also write this run's figures as JSON")
    args = parser.parse_args(argv)
    only = set(args.only.split(",")) if args.only else None
    figures: list[Figure] = []
    failed_modules = []
    for name in discover(only):
        started = time.perf_counter()
        print(f"== {name}", file=sys.stderr, flush=True)
        try:
            module = importlib.import_module(f"tests.bench.{name}")
            figures.extend(module.run())
        except Exception as error:  # a broken benchmark is reported, the rest still run
            failed_modules.append(f"{name}: {type(error).__name__}: {error}")
        print(f"   {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    baseline = json.loads(BASELINE.read_text()) if BASELINE.exists() else {}
    rows, regressions = [], []
    for fig in figures:
        base = baseline.get(fig.name, {}).get("value")
        status = "new"
        if base is not None and math.isfinite(base) and base != 0:
            change = fig.value / base - 1
            status = f"{100 * change:+.0f}%"
            if regressed(fig, base, args.tolerance):
                status += " REGRESSED"
                regressions.append(fig.name)
        goal = fig.meets_goal()
        goal_text = "" if goal is None else (
            f"{'>=' if fig.higher_is_better else '<='} {fig.goal:g} "
            f"{'ok' if goal else 'MISSED'}")
        rows.append((fig.name, f"{fig.value:.4g} {fig.unit}",
                     "-" if base is None else f"{base:.4g}", status, goal_text, fig.note))
    if args.out:
        Path(args.out).write_text(json.dumps(
            {f.name: {"value": f.value, "unit": f.unit} for f in figures}, indent=1))
    if args.update_baseline:
        stored = dict(baseline)
        stored.update({f.name: {"value": f.value, "unit": f.unit} for f in figures})
        BASELINE.write_text(json.dumps(stored, indent=1, sort_keys=True) + "\n")
        print(f"baseline updated: {BASELINE}", file=sys.stderr)
    headers = ("figure", "now", "baseline", "change", "goal", "note")
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    for line in failed_modules:
        print(f"benchmark failed: {line}")
    if regressions:
        print(f"{len(regressions)} figure(s) regressed beyond {args.tolerance:.0%}: "
              f"{', '.join(regressions)}")
    return 1 if regressions or failed_modules else 0


if __name__ == "__main__":
    raise SystemExit(main())
