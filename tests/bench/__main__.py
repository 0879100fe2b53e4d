"""Run every benchmark, compare with the stored baseline, print a table last.

    python -m tests.bench                   # all benchmarks (what `nox -s bench` runs)
    python -m tests.bench --only core,akosim # modules tests/bench/bench_core.py, bench_akosim.py
    python -m tests.bench --update-baseline # store this run's figures as the baseline
    python -m tests.bench --out figures.json

Every compared figure is a ratio to a reference measured in the same run, so
the baseline holds across machines of one kind. The baseline (baseline.json)
stores the environment it was measured in (CPU model, cores, Python and
library versions) and, per figure, its value and tolerance: a figure regresses
when it is worse than the baseline by more than its tolerance (--tolerance
overrides them all); a figure with no tolerance is informational. Exit status
1 when any figure regresses or a benchmark fails; missed goals are reported
(with by how much) but do not fail the run.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import pkgutil
import platform
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from tests.bench.common import Figure

BASELINE = Path(__file__).with_name("baseline.json")
BASELINE_VERSION = 2
_LIBRARIES = ("numpy", "simpy", "jax", "jaxlib", "aiohttp")


def discover(only: set[str] | None) -> list[str]:
    names = sorted(m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)])
                   if m.name.startswith("bench_"))
    if only:
        names = [n for n in names if n.removeprefix("bench_") in only or n in only]
    return names


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment() -> dict[str, Any]:
    """What the figures were measured on."""
    versions = {}
    for name in _LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {"cpu_model": cpu_model(), "cores": os.cpu_count(), "machine": platform.machine(),
            "python": platform.python_version(), **versions}


def load_baseline(path: Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(environment, figures by name) of a stored baseline; empty if none or outdated."""
    if not path.exists():
        return {}, {}
    stored = json.loads(path.read_text())
    if stored.get("version") != BASELINE_VERSION:
        return {}, {}
    return stored["environment"], stored["figures"]


def regressed(figure: Figure, base: float, tolerance: float) -> bool:
    if figure.higher_is_better:
        return figure.value < base * (1 - tolerance)
    return figure.value > base * (1 + tolerance)


def goal_text(figure: Figure) -> str:
    met = figure.meets_goal()
    if met is None:
        return ""
    assert figure.goal is not None
    unit = figure.absolute_unit if figure.absolute is not None else figure.unit
    text = f"{'>=' if figure.higher_is_better else '<='} {figure.goal:g} {unit}"
    if met:
        return text + " ok"
    measured = figure.goal_value()
    factor = measured / figure.goal if not figure.higher_is_better else (
        figure.goal / measured if measured > 0 else math.inf)
    return text + f" MISSED by {factor:.2f}x"


def goal_summary(figures: list[Figure]) -> list[str]:
    """One line per figure with a goal (the issue's goals): met, or by how much it misses."""
    with_goal = [fig for fig in figures if fig.goal is not None]
    if not with_goal:
        return []
    met = sum(bool(fig.meets_goal()) for fig in with_goal)
    lines = [f"goals: {met} of {len(with_goal)} met"]
    for fig in with_goal:
        unit = fig.absolute_unit if fig.absolute is not None else fig.unit
        lines.append(f"  {'met   ' if fig.meets_goal() else 'MISSED'} {fig.name}: "
                     f"{fig.goal_value():.4g} {unit} ({goal_text(fig)})")
    return lines


def environment_notes(base_env: dict[str, Any], env: dict[str, Any]) -> list[str]:
    return [f"environment differs from the baseline's: {key} {base_env.get(key)!r} -> "
            f"{env.get(key)!r}" for key in sorted(env) if base_env and
            base_env.get(key) != env.get(key)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="comma-separated benchmark modules, e.g. core,akosim")
    parser.add_argument("--tolerance", type=float,
                        help="one relative tolerance for every figure (default: the baseline's)")
    parser.add_argument("--update-baseline", action="store_true")
    parser.add_argument("--baseline", type=Path, default=BASELINE, help=argparse.SUPPRESS)
    parser.add_argument("--out", help="also write this run's figures as JSON")
    args = parser.parse_args(argv)
    only = set(args.only.split(",")) if args.only else None
    figures: list[Figure] = []
    module_of: dict[str, str] = {}
    failed_modules = []
    modules = discover(only)
    for name in modules:
        started = time.perf_counter()
        print(f"== {name}", file=sys.stderr, flush=True)
        try:
            module = importlib.import_module(f"tests.bench.{name}")
            produced = module.run()
            figures.extend(produced)
            module_of.update((fig.name, name) for fig in produced)
        except Exception as error:  # a broken benchmark is reported, the rest still run
            failed_modules.append(f"{name}: {type(error).__name__}: {error}")
        print(f"   {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    env = environment()
    base_env, baseline = load_baseline(args.baseline)
    rows, regressions = [], []
    for fig in figures:
        stored = baseline.get(fig.name, {})
        base = stored.get("value")
        tolerance = args.tolerance if args.tolerance is not None else stored.get("tolerance")
        status = "new"
        if base is not None and math.isfinite(base) and base != 0:
            status = f"{100 * (fig.value / base - 1):+.0f}%"
            if tolerance is None:
                status += " (info)"
            elif regressed(fig, base, tolerance):
                status += f" REGRESSED (tol {tolerance:.0%})"
                regressions.append(fig.name)
        measured = f"{fig.value:.4g} {fig.unit}"
        if fig.absolute is not None:
            measured += f" ({fig.absolute:.4g} {fig.absolute_unit})"
        rows.append((fig.name, measured, "-" if base is None else f"{base:.4g}", status,
                     goal_text(fig), fig.note))
    record = {fig.name: {"value": fig.value, "unit": fig.unit, "tolerance": fig.tolerance,
                         "absolute": fig.absolute, "absolute_unit": fig.absolute_unit,
                         "goal": fig.goal, "module": module_of[fig.name]}
              for fig in figures}
    if args.out:
        Path(args.out).write_text(json.dumps(
            {"version": BASELINE_VERSION, "environment": env, "figures": record}, indent=1))
    if args.update_baseline:
        # A module that ran owns its figures: the ones it no longer prints go.
        # Without --only, the baseline is exactly this run's figures.
        kept = {name: value for name, value in baseline.items()
                if only and name not in record and value.get("module") not in modules}
        args.baseline.write_text(json.dumps(
            {"version": BASELINE_VERSION, "environment": env, "figures": {**kept, **record}},
            indent=1, sort_keys=True) + "\n")
        print(f"baseline updated: {args.baseline}", file=sys.stderr)
    headers = ("figure", "now", "baseline", "change", "goal", "note")
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    for line in environment_notes(base_env, env):
        print(line)
    for line in goal_summary(figures):
        print(line)
    missing = [fig.name for fig in figures if fig.name not in baseline]
    if missing and not args.update_baseline:
        print(f"{len(missing)} figure(s) not in the baseline (not compared; "
              f"--update-baseline stores them): {', '.join(missing)}")
    for line in failed_modules:
        print(f"benchmark failed: {line}")
    if regressions:
        print(f"{len(regressions)} figure(s) regressed beyond their tolerance: "
              f"{', '.join(regressions)}")
    return 1 if regressions or failed_modules else 0


if __name__ == "__main__":
    raise SystemExit(main())
