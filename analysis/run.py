"""Run the experiment matrix through akosim's entry point and akorun's command line.

akosim runs are calls of akosim's own functions, each in a fresh interpreter
with the configuration's XLA flags (analysis.akosim_calls); the commands
below are their argument lists, as `--dry-run` prints them and done.json keeps
them. akorun runs are `akorun launch` processes.

    python -m analysis.run --backend akosim --results results/experiments
    python -m analysis.run --backend akorun --only 'uniform-wan/*' --results results/experiments
    python -m analysis.run --backend akosim-calibrated --results results/experiments
    python -m analysis.run --backend akosim-fullsize --results results/experiments
    python -m analysis.run --backend all --subset ci --results /tmp/ci
    sudo python -m analysis.run --backend akorun-netns --results results/experiments

Backends (one folder each, RESULTS/<backend>/<network>/<n>w-<scheme>/):

- akosim: ``akosim train --config F --compute Xs --out result.json``, the
  uncalibrated prediction. X is akosim's own ``--compute measure`` of the
  workload, taken once per results folder (``RESULTS/akosim/compute.json``)
  by a lone process before any configuration runs, so that runs in parallel
  (``--jobs``) or on a busy machine all predict from the same undisturbed
  measurement. akorun launches these configurations with single-threaded XLA
  (as many processes as cores or more: `akorun.launching.local.child_env`), so the
  measurement uses the same ``XLA_FLAGS`` and times the step the real workers
  run. Its p auto is its own resolution;
- akorun: ``akorun launch --config F --out DIR`` on loopback with emulated
  links; ``--duration`` is raised by the warm-up allowance (JAX compilation is
  in akorun's wall clock; the analysis cuts the curves at the budget);
- akorun-netns: the same launch on the real-network testbed (``--testbed
  netns``: ranks in network namespaces, real kernel TCP, tc shaping; needs
  root, not part of ``all``) with ``--testbed-latency ignore``, because this
  kernel has no netem: each run's ``testbed.json`` records the latency left out;
- akosim-calibrated: timing only (``akosim --config F``: the same engine and
  budget, no gradients computed, so no accuracy curve; it exists for the
  fidelity report) with ``--compute-from`` the akorun result of the same
  configuration (skipped until that exists), made into a Calibration
  (akocore.records.results): each rank's ``compute_s_per_round`` and
  ``overhead_s_per_round`` (the per-round time outside the gradient and the
  gate), and a parameter server's rank has neither, so the runner writes
  ``compute.json`` beside it with the server's entries set to the training
  workers' means (unused by the server), and each rank's ``message_overhead_s``
  (what a message costs beyond the emulated wire: task hops, HTTP,
  verification, apply), which akosim adds to the latency of that rank's
  links; ``--compute-jitter`` is the relative standard deviation of akorun's
  per-round gradient times. For ako it also
  passes akorun's resolved p (``--p``, from the result's ``p_of``), so that p
  auto, which each backend resolves from its own compute measurement, compares
  like with like; the uncalibrated akosim run keeps its own p auto resolution;
- akosim-fullsize: the seeds' unscaled setup, timing only: ``akosim --config
  configs/experiments/fullsize/... --compute 0.25s --out result.json``.

``--jobs N`` runs N akosim configurations at once (simulated time does not
depend on the machine's load once compute is given); akorun always runs one
configuration at a time, alone, because it measures wall-clock time.

Resumable: a configuration whose folder holds ``done.json`` (written after the
command succeeded) is skipped unless --force. ``--subset ci`` runs the CI subset
(uniform-wan, 2 workers, ps and ako p=4) for ``--rounds`` rounds (default 20 in
that subset) instead of the budget.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from akocore.records.calibration import Calibration
from akocore.records.result_reader import read_result
from akocore.records.results import RunResult
from akocore.records.run_figures import run_compute_jitter
from analysis.matrix import (
    AKORUN_ALLOWANCE_S,
    BATCH,
    ROOT,
    SCALING,
    SEED_COMPUTE_S,
    WORKLOAD,
    Experiment,
    select,
)

BACKENDS = ("akosim", "akorun", "akosim-calibrated", "akosim-fullsize", "akorun-netns")
ORDER_ALL = ("akosim", "akosim-fullsize", "akorun", "akosim-calibrated")
CI_ROUNDS = 20


def run_dir(results: Path, backend: str, exp: Experiment) -> Path:
    return results / backend / exp.network.name / f"{exp.workers}w-{exp.scheme}"


def single_thread_xla(exp: Experiment) -> bool:
    """True when akorun launches this configuration with single-threaded XLA
    (as many processes as cores or more: `akorun.launching.local.child_env`)."""
    return exp.nodes >= (os.cpu_count() or 1)


def _env(backend: str | None = None, exp: Experiment | None = None) -> dict[str, str]:
    """The child's environment. akosim runs for a configuration whose ranks akorun
    launches with a share of the cores each get the same XLA threading
    (akocore.rank_threads), so the gradient step akosim times is the one the real
    workers run."""
    env = dict(os.environ)
    env.setdefault("JAX_PLATFORMS", "cpu")
    env.setdefault("AKO_JAX_CACHE", str(ROOT / ".cache" / "jax"))
    env["PYTHONUNBUFFERED"] = "1"
    if backend == "akosim" and exp is not None:
        from akocore.rank_threads import rank_thread_env

        env.update(rank_thread_env(os.cpu_count() or 1, exp.nodes, env))
    return env


def measured_compute_s(results: Path, exp: Experiment) -> float:
    """akosim's own ``--compute measure`` for this configuration's workload and
    XLA threading, measured once per results folder and kept in
    RESULTS/akosim/compute.json."""
    path = results / "akosim" / "compute.json"
    known = json.loads(path.read_text()) if path.exists() else {}
    key = (f"{WORKLOAD}/batch {BATCH}/"
           f"{'single-thread' if single_thread_xla(exp) else 'default'} XLA")
    if key not in known:
        from analysis.akosim_calls import measured_compute_s as akosim_measured_compute_s

        known[key] = akosim_measured_compute_s(exp.path(), env=_env("akosim", exp))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(known, indent=1))
    return float(known[key])


def read_run(path: Path) -> RunResult:
    """The RunResult in `path` (akorun's result.json, any schema version it can read)."""
    record = read_result(json.loads(path.read_text()))
    if not isinstance(record, RunResult):
        raise ValueError(f"{path}: expected a run result, found a {type(record).__name__}")
    return record


def calibration_file(akorun_result: Path, out: Path) -> Path:
    """akorun's per-rank compute times and overheads as a Calibration (a PS rank's missing
    values filled in: akocore.records.figures.fill_missing), written to `out`."""
    calibration = Calibration.from_run(read_run(akorun_result), source=str(akorun_result))
    if calibration.compute_s(1) is None:
        raise ValueError(f"{akorun_result}: no rank reports compute_s_per_round")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(calibration.to_json(), indent=1))
    return out


def compute_jitter(run: RunResult) -> float:
    """Relative standard deviation of akorun's per-round gradient time (steady rounds,
    mean over the training ranks): what akosim's ``--compute-jitter`` models. Processes
    sharing 2 cores vary a lot (0.2-0.4 here), and under a gate (s = 0) a round waits
    for the slowest of n jittered steps, so a calibrated run must jitter too."""
    return run_compute_jitter(run)


def resolved_p(run: RunResult) -> list[int] | None:
    """The p (one per worker) akorun's ranks resolved to, or None (not ako)."""
    return list(run.p_of) or None


def command(backend: str, exp: Experiment, results: Path, *,
            rounds: int | None = None) -> list[str] | None:
    """The CLI command for one configuration, or None when its input is missing."""
    folder = run_dir(results, backend, exp)
    config = str(exp.path(fullsize=backend == "akosim-fullsize"))
    extra = ["--rounds", str(rounds)] if rounds is not None else []
    if backend == "akosim":
        compute_s = measured_compute_s(results, exp)
        return ["akosim", "train", "--config", config, "--quiet", "--compute",
                f"{compute_s!r}s", "--out", str(folder / "result.json"), *extra]
    if backend == "akosim-calibrated":
        measured = run_dir(results, "akorun", exp) / "result.json"
        if not (run_dir(results, "akorun", exp) / "done.json").exists():
            return None
        compute = calibration_file(measured, folder / "compute.json")
        run = read_run(measured)
        p = resolved_p(run) if exp.scheme.startswith("ako") else None
        given_p = ["--p", ",".join(str(x) for x in p)] if p else []
        return ["akosim", "--config", config, "--quiet", "--compute-from",
                str(compute), *given_p, "--compute-jitter", f"{compute_jitter(run):.4f}",
                "--out", str(folder / "result.json"), *extra]
    if backend == "akosim-fullsize":
        return ["akosim", "--config", config, "--quiet", "--compute", f"{SEED_COMPUTE_S:g}s",
                "--out", str(folder / "result.json")]
    if backend in ("akorun", "akorun-netns"):
        duration = ["--duration", f"{SCALING.budget_s + AKORUN_ALLOWANCE_S:g}s"]
        testbed = ["--testbed", "netns", "--testbed-latency", "ignore"] \
            if backend == "akorun-netns" else []
        return ["akorun", "launch", "--config", config, "--out", str(folder), "--quiet",
                "--timeout", f"{4 * (SCALING.budget_s + AKORUN_ALLOWANCE_S) + 120:g}s",
                *duration, *testbed, *extra]
    raise ValueError(f"unknown backend {backend!r}")


def run_one(backend: str, exp: Experiment, results: Path, *, rounds: int | None = None,
            force: bool = False, dry_run: bool = False) -> str:
    folder = run_dir(results, backend, exp)
    done = folder / "done.json"
    if done.exists() and not force:
        return "skipped (done)"
    cmd = command(backend, exp, results, rounds=rounds)
    if cmd is None:
        return "pending (needs the akorun result)"
    if dry_run:
        return "would run: " + " ".join(cmd)
    folder.mkdir(parents=True, exist_ok=True)
    done.unlink(missing_ok=True)
    started = time.perf_counter()
    if cmd[0] == "akosim":  # akosim's own entry point, called in a fresh interpreter
        from analysis.akosim_calls import call_akosim

        returncode = call_akosim(cmd[1:], env=_env(backend, exp), log=folder / "run.log")
    else:  # akorun launch starts its ranks as processes of their own
        with open(folder / "run.log", "w") as log:
            returncode = subprocess.run(cmd, cwd=ROOT, env=_env(backend, exp), stdout=log,
                                        stderr=subprocess.STDOUT, check=False).returncode
    wall_s = time.perf_counter() - started
    if returncode != 0:
        return f"FAILED (exit {returncode}, see {folder / 'run.log'})"
    done.write_text(json.dumps({"config": exp.id, "backend": backend, "command": cmd,
                                "wall_s": wall_s, "rounds_override": rounds}, indent=1))
    return f"done in {wall_s:.0f} s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="all", choices=(*BACKENDS, "all"))
    parser.add_argument("--only", metavar="GLOB[,GLOB]",
                        help="configuration ids, e.g. 'uniform-wan/*' or '*/2w-ako-p4'")
    parser.add_argument("--subset", choices=("ci", "all"), default="all")
    parser.add_argument("--rounds", type=int, default=None,
                        help="stop after this many rounds instead of the budget "
                             f"(default {CI_ROUNDS} with --subset ci)")
    parser.add_argument("--results", default="results/experiments", type=Path)
    parser.add_argument("--force", action="store_true", help="rerun finished configurations")
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    parser.add_argument("--jobs", type=int, default=1, metavar="N",
                        help="akosim configurations run at once (akorun, akorun-netns: "
                             "always 1)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs: got {args.jobs}, expected a whole number >= 1")
    rounds = args.rounds if args.rounds is not None else (
        CI_ROUNDS if args.subset == "ci" else None)
    experiments = select(args.only, args.subset)
    if not experiments:
        print("no configuration matches", file=sys.stderr)
        return 2
    backends = ORDER_ALL if args.backend == "all" else (args.backend,)
    results = args.results.resolve()
    failed = 0
    for backend in backends:
        jobs = 1 if backend.startswith("akorun") else args.jobs

        def one(exp: Experiment, backend: str = backend) -> str:
            status = run_one(backend, exp, results, rounds=rounds, force=args.force,
                             dry_run=args.dry_run)
            print(f"{backend:<18} {exp.id:<28} {status}", flush=True)
            return status

        if backend == "akosim" and not args.dry_run:
            measured_compute_s(results, experiments[0])  # once, before any parallel run
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            failed += sum(s.startswith("FAILED") for s in pool.map(one, experiments))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
