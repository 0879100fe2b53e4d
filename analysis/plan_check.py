"""The plan's answer checked against the run: akosim's top three against akorun on the testbed.

    sudo python -m analysis.plan_check --results results/plan-check

For each network of the experiments report (analysis.tta_testbed's `NETWORKS`) and a
2-site cluster, this asks the plan the user's question — which configuration reaches
92% test accuracy first on 3 workers (4 on the 2-site cluster) training the
`digits-mlp` workload — and runs its top three on the real-TCP testbed with
``akorun launch --testbed netns --plan PLAN.json --plan-rank K`` until the target (or a
budget of training time), evaluating every 10 rounds as the plan does. A row: the
plan's predicted time to target against akorun's measured one; per network, whether
the plan's winner is akorun's winner.

What the plan is told about the machine, once, not per configuration: the compute,
per-round and per-message overheads an akorun run of this host measured (a short
calibration run of the same workload on the testbed, ``--compute-from``: the ranks
share 2 cores, so the step costs more than the plan's in-process measurement; the
run is DiLoCo with H=50 so that its step is timed while the network is mostly quiet,
since the plan charges the syncs' own work separately) and this host's TCP model
parameters (``akosim calibrate``, ``--network-model tcp``).
Nothing timed by the checked runs themselves feeds a prediction.

Resumable: a network whose folder holds ``check.json`` is not run again. Each launch
and plan holds ``/work/measure.lock`` (``flock``) so measurements never overlap, and
``/work/measure.gate`` while it waits for it.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from analysis.fidelity_tcp import _akosim, _python, _run, child_env, read_run, uptime
from analysis.tta_testbed import (
    EVAL_EVERY,
    GATE,
    LOCK,
    NETWORKS,
    TARGET_ACCURACY,
    WORKLOAD,
    WORKLOAD_ARG,
    Network,
    time_to_target,
)

TOP = 3  # configurations of each plan run on the testbed
BUDGET_S = 30.0  # at most this much training per run (the plan's budget is the same)
CHECK_FILE = "check.json"
TWO_SITES = Network(
    "two-sites", "2 sites of 2 workers: 100 Mbit/s and 20 Mbit/s NICs, 50 Mbit/s and "
                 "30 ms one way between the sites, 2 ms inside",
    ("--site", "2x100mbps,2ms", "--site", "2x20mbps,2ms", "--between", "30ms,50mbps"))
CHECKED: tuple[Network, ...] = (*NETWORKS, TWO_SITES)
CALIBRATION_FLAGS = ("--workers", "3", "--bandwidth", "100mbps", "--latency", "5ms",
                     "--scheme", "diloco", "--inner-steps", "50")


@dataclass(frozen=True)
class CheckedRow:
    """One of a plan's top configurations: predicted and measured time to target."""

    network: str
    position: int  # in the plan's ranking (1 = recommended)
    label: str
    predicted_time_to_target_s: float | None
    predicted_accuracy: float | None
    measured_time_to_target_s: float | None
    measured_final_accuracy: float | None
    measured_rounds: int
    measured_round_time_s: float | None
    measured_evaluations: tuple[tuple[float, int, float], ...]
    uptime_before: str
    uptime_after: str


@contextmanager
def measuring() -> Iterator[None]:
    """Hold the measurement lock (taking the gate while waiting for it)."""
    with open(GATE, "a") as gate, open(LOCK, "a") as lock:
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _common_flags(network: Network) -> list[str]:
    workers = [] if network is TWO_SITES else ["--workers", "3"]
    return [*workers, *network.flags, "--workload", WORKLOAD, "--workload-arg", WORKLOAD_ARG,
            "--set", f"train.eval_every={EVAL_EVERY}"]


def calibrate(results: Path, env: dict[str, str]) -> tuple[Path, Path]:
    """This host's akorun calibration run and TCP calibration (made once, then reused)."""
    run_dir = results / "calibration" / "run"
    log = results / "calibration.log"
    if not (run_dir / "result.json").exists():
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        _run([*_python(
            "akorun", "launch", "--testbed", "netns", *CALIBRATION_FLAGS, "--workload",
            WORKLOAD, "--workload-arg", WORKLOAD_ARG, "--set", f"train.eval_every={EVAL_EVERY}",
            "--duration", "8s", "--out", str(run_dir), "--force", "--quiet")], env, log, 600)
    host = results / "host-calibration.json"
    if not host.exists():
        _akosim(["calibrate", "--out", str(host)], env, log, 600)
    return run_dir / "result.json", host


def plan(network: Network, folder: Path, env: dict[str, str], compute_from: Path,
         host: Path) -> dict[str, Any]:
    """The plan of `network` (its --out record), made under the lock."""
    out = folder / "plan.json"
    if not out.exists():
        _akosim(["--network-model", "tcp", "--host-calibration", str(host),
                 "--compute-from", str(compute_from), *_common_flags(network),
                 "--target-accuracy", f"{TARGET_ACCURACY:g}", "--time-budget",
                 f"{BUDGET_S:g}s", "--quiet", "--out", str(out)], env,
                folder / "plan.log", 900)
    return json.loads(out.read_text())


def launch(network: Network, folder: Path, position: int, env: dict[str, str]) -> Path:
    """akorun on the testbed: the plan's row `position`, to the target or the budget."""
    run_dir = folder / f"rank{position}"
    if (run_dir / "result.json").exists():
        return run_dir
    log = folder / f"rank{position}.log"
    _run([*_python(
        "akorun", "launch", "--testbed", "netns", "--plan", str(folder / "plan.json"),
        "--plan-rank", str(position), *_common_flags(network), "--target-accuracy",
        f"{TARGET_ACCURACY:g}", "--duration", f"{BUDGET_S:g}s", "--out", str(run_dir),
        "--force", "--quiet", "--timeout", "180s")], env, log, 800)
    return run_dir


def check_network(network: Network, results: Path, env: dict[str, str], compute_from: Path,
                  host: Path) -> list[CheckedRow]:
    folder = results / network.name
    done = folder / CHECK_FILE
    if done.exists():
        return [row_from_json(r) for r in json.loads(done.read_text())]
    folder.mkdir(parents=True, exist_ok=True)
    record = plan(network, folder, env, compute_from, host)
    rows = []
    for ranked in record["ranking"][:TOP]:
        before = uptime()
        run_dir = launch(network, folder, int(ranked["position"]), env)
        run = read_run(run_dir / "result.json")
        evaluations = tuple((float(e[0]), int(e[1]), float(e[2])) for e in run.evaluations)
        rows.append(CheckedRow(
            network=network.name, position=int(ranked["position"]), label=ranked["label"],
            predicted_time_to_target_s=ranked["time_to_target_s"],
            predicted_accuracy=ranked["accuracy"],
            measured_time_to_target_s=time_to_target(evaluations, TARGET_ACCURACY),
            measured_final_accuracy=run.final_accuracy,
            measured_rounds=max((r.rounds for r in run.training_ranks or run.per_worker),
                                default=0),
            measured_round_time_s=run.round_time_s, measured_evaluations=evaluations,
            uptime_before=before, uptime_after=uptime()))
        print(f"{network.name} #{rows[-1].position} {rows[-1].label}: predicted "
              f"{rows[-1].predicted_time_to_target_s} s, measured "
              f"{rows[-1].measured_time_to_target_s} s", flush=True)
    done.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return rows


def row_from_json(data: dict[str, Any]) -> CheckedRow:
    data = dict(data)
    data["measured_evaluations"] = tuple(tuple(e) for e in data["measured_evaluations"])
    return CheckedRow(**data)


def winners(rows: Sequence[CheckedRow]) -> tuple[str | None, str | None]:
    """The plan's winner (its first row) and akorun's (first to the target)."""
    reached = [r for r in rows if r.measured_time_to_target_s is not None]
    measured = min(reached, key=lambda r: r.measured_time_to_target_s or 0.0) \
        if reached else None
    return (rows[0].label if rows else None, measured.label if measured else None)


def _seconds(value: float | None) -> str:
    return f"{value:.3f}" if value is not None else "not reached"


def section(rows: Sequence[CheckedRow]) -> list[str]:
    """The check as Markdown (the experiments report's section)."""
    lines = [
        "## The plan's answer against the run", "",
        f"The question a user asks: which configuration reaches {TARGET_ACCURACY:g} test "
        f"accuracy first on this network? `akosim --target-accuracy {TARGET_ACCURACY:g} "
        f"--time-budget {BUDGET_S:g}s` answers it for 3 workers of `{WORKLOAD}` "
        f"(`{WORKLOAD_ARG}`) on each network above and on a 2-site cluster ("
        f"{TWO_SITES.description}: `{' '.join(TWO_SITES.flags)}`); then "
        f"`akorun launch --testbed netns --plan plan.json --plan-rank K` runs its top "
        f"{TOP} on the real-TCP testbed to the target. The plan is told this host's step "
        "and overheads once (`--compute-from` a short akorun run, DiLoCo H=50) and its "
        "TCP parameters (`akosim calibrate`); nothing the checked runs timed feeds it. "
        "Time to target: the first evaluation (every 10 rounds) of the first training "
        "rank's replica at or above the target, in both tools. Regenerate: `sudo python "
        "-m analysis.plan_check --results RESULTS --out analysis/data/plan_check.json`.",
        "",
        "| network | plan's rank | configuration | akosim (s) | akorun (s) | error |",
        "|---|---|---|---|---|---|",
    ]
    networks = list(dict.fromkeys(r.network for r in rows))
    errors = []
    for row in rows:
        error = None
        if row.predicted_time_to_target_s and row.measured_time_to_target_s:
            error = row.predicted_time_to_target_s / row.measured_time_to_target_s - 1
            errors.append(abs(error))
        lines.append(f"| {row.network} | {row.position} | {row.label} | "
                     f"{_seconds(row.predicted_time_to_target_s)} | "
                     f"{_seconds(row.measured_time_to_target_s)} | "
                     f"{f'{100 * error:+.0f}%' if error is not None else '-'} |")
    lines += ["", "| network | plan's winner | akorun's winner | the plan's pick against "
              "akorun's best |", "|---|---|---|---|"]
    same = 0
    for network in networks:
        ours = [r for r in rows if r.network == network]
        planned, measured = winners(ours)
        same += planned == measured
        best = min((r.measured_time_to_target_s for r in ours
                    if r.measured_time_to_target_s is not None), default=None)
        pick = ours[0].measured_time_to_target_s if ours else None
        versus = f"{100 * (pick / best - 1):+.0f}%" if pick and best else "-"
        lines.append(f"| {network} | {planned} | {measured} | {versus} |")
    within = sum(e <= 0.2 for e in errors)
    lines += ["", f"The plan's winner is akorun's on {same} of {len(networks)} networks; "
              f"{within} of {len(errors)} predicted times to target are within 20% of "
              f"akorun's (mean absolute error "
              f"{100 * sum(errors) / max(len(errors), 1):.0f}%).", ""]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.plan_check",
                                     description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--results", type=Path, required=True, help="the results folder")
    parser.add_argument("--only", metavar="NAME[,NAME]",
                        help="networks by name: " + ", ".join(n.name for n in CHECKED))
    parser.add_argument("--out", type=Path, default=None, metavar="FILE.json",
                        help="also write every checked row here")
    args = parser.parse_args(argv)
    chosen = [n for n in CHECKED if not args.only or n.name in args.only.split(",")]
    if not chosen:
        print(f"--only: none of {args.only!r}; networks: "
              + ", ".join(n.name for n in CHECKED), file=sys.stderr)
        return 2
    results = args.results.resolve()
    results.mkdir(parents=True, exist_ok=True)
    env = child_env(results / "cache")
    started = time.perf_counter()
    with measuring():
        compute_from, host = calibrate(results, env)
    every: list[CheckedRow] = []
    with measuring():  # every network under one hold: the runs see the same machine
        for network in chosen:
            rows = check_network(network, results, env, compute_from, host)
            every += rows
            planned, measured = winners(rows)
            print(f"{network.name}: plan's winner {planned}, akorun's {measured} "
                  f"({'same' if planned == measured else 'DIFFERENT'})", flush=True)
    if args.out:
        args.out.write_text(json.dumps([asdict(r) for r in every], indent=1))
    print(f"done in {time.perf_counter() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
