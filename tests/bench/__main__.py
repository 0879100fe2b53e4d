"""Run every benchmark, compare with the stored baseline, print a table last.

    python -m tests.bench                   # all benchmarks (what `nox -s bench` runs)
    python -m tests.bench --only core,akosim # modules tests/bench/bench_core.py, bench_akosim.py
    python -m tests.bench --update-baseline # store this run's figures as the baseline
    python -m tests.bench --out figures.json

Every compared figure is a ratio to a reference of its own kind measured in
the same run (tests/bench/common.py), most of them repeated in pairs: the
figure's value is the median of its paired ratios, shown with an
order-statistic interval (90% when there are 5 or more), and it REGRESSED only
when that whole interval lies beyond the baseline widened by the figure's
tolerance (tests/bench/verdict.py; --tolerance overrides them all); a figure
with no tolerance is informational. The baseline (baseline.json) and --out
store the environment (CPU model, cores, load average before and after,
Python and library versions) and, per figure, its value, samples and
tolerance. Exit status 1 when any figure regresses or a benchmark fails;
the goals (the issue's targets, in seconds or ratios) are summarised last,
met or missed by how much, and do not fail the run.
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

from tests.bench.common import Figure, Skipped
from tests.bench.verdict import Interval, judge, median_interval

BASELINE = Path(__file__).with_name("baseline.json")
BASELINE_VERSION = 3  # 3: samples per figure, load averages in the environment
_READABLE_VERSIONS = (2, BASELINE_VERSION)  # 2: the same figures without samples
_LIBRARIES = ("numpy", "simpy", "jax", "jaxlib", "aiohttp", "optax", "blake3")


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


def load_average() -> list[float] | None:
    """1, 5 and 15 minute load averages (None where the OS has none)."""
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except OSError:
        return None


def environment() -> dict[str, Any]:
    """What the figures were measured on (the load averages are added by main)."""
    versions = {}
    for name in _LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {"cpu_model": cpu_model(), "cores": os.cpu_count(), "machine": platform.machine(),
            "python": platform.python_version(), **versions}


# Keys of the environment that say how busy the machine was, not what it is.
_LOAD_KEYS = ("load_average_before", "load_average_after")


def load_baseline(path: Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(environment, figures by name) of a stored baseline; empty if none or outdated."""
    if not path.exists():
        return {}, {}
    stored = json.loads(path.read_text())
    if stored.get("version") not in _READABLE_VERSIONS:
        return {}, {}
    return stored["environment"], stored["figures"]


def interval_of(figure: Figure) -> Interval:
    """The figure's median and interval over its paired samples (one point if none)."""
    return median_interval(figure.samples or (figure.value,))


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
        if not fig.meets_goal() and fig.known_gap:
            lines.append(f"         why: {fig.known_gap}")
    return lines


def environment_notes(base_env: dict[str, Any], env: dict[str, Any]) -> list[str]:
    lines = [f"environment differs from the baseline's: {key} {base_env.get(key)!r} -> "
             f"{env.get(key)!r}" for key in sorted(env) if base_env and key not in _LOAD_KEYS
             and base_env.get(key) != env.get(key)]
    load = ", ".join(f"{key.removeprefix('load_average_')} {env.get(key)}"
                     for key in _LOAD_KEYS)
    if base_env:
        load += " (baseline: " + ", ".join(
            f"{key.removeprefix('load_average_')} {base_env.get(key)}"
            for key in _LOAD_KEYS) + ")"
    return [*lines, f"load average (1, 5, 15 min): {load}"]


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
    load_before = load_average()
    figures: list[Figure] = []
    module_of: dict[str, str] = {}
    failed_modules, skipped_modules = [], []
    modules = discover(only)
    for name in modules:
        started = time.perf_counter()
        print(f"== {name}", file=sys.stderr, flush=True)
        try:
            module = importlib.import_module(f"tests.bench.{name}")
            produced = module.run()
            figures.extend(produced)
            module_of.update((fig.name, name) for fig in produced)
        except Skipped as reason:
            skipped_modules.append(f"{name}: {reason}")
        except Exception as error:  # a broken benchmark is reported, the rest still run
            failed_modules.append(f"{name}: {type(error).__name__}: {error}")
        print(f"   {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    env = {**environment(), "load_average_before": load_before,
           "load_average_after": load_average()}
    base_env, baseline = load_baseline(args.baseline)
    rows, regressions = [], []
    for fig in figures:
        stored = baseline.get(fig.name, {})
        base = stored.get("value")
        tolerance = args.tolerance if args.tolerance is not None else stored.get("tolerance")
        interval = interval_of(fig)
        verdict = judge(interval, base, tolerance, higher_is_better=fig.higher_is_better)
        status = verdict.status
        if verdict.change is not None:
            status = f"{100 * verdict.change:+.0f}% {verdict.status}"
            if verdict.bound is not None:
                status += f" (tol {tolerance:.0%})"
        if verdict.regressed:
            regressions.append(fig.name)
        measured = f"{interval.text()} {fig.unit}"
        if fig.samples:
            measured += f" (n={interval.samples}, {interval.coverage:.0%})"
        if fig.absolute is not None:
            measured += f"; {fig.absolute:.4g} {fig.absolute_unit}"
        rows.append((fig.name, measured, "-" if base is None else f"{base:.4g}", status,
                     goal_text(fig), fig.note))
    record = {fig.name: {"value": fig.value, "unit": fig.unit, "tolerance": fig.tolerance,
                         "absolute": fig.absolute, "absolute_unit": fig.absolute_unit,
                         "goal": fig.goal, "module": module_of[fig.name],
                         "samples": list(fig.samples), "reference": fig.reference}
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
    for line in skipped_modules:
        print(f"benchmark skipped (its goals not measured): {line}")
    for line in failed_modules:
        print(f"benchmark failed: {line}")
    if regressions:
        print(f"{len(regressions)} figure(s) regressed beyond their tolerance: "
              f"{', '.join(regressions)}")
    return 1 if regressions or failed_modules else 0


if __name__ == "__main__":
    raise SystemExit(main())
