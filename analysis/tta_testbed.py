"""Time to accuracy on the real-TCP testbed: every scheme, run by akorun and predicted by
akosim.

    sudo python -m analysis.tta_testbed --results results/tta [--only 'n10m-*']

Each configuration (a network of `NETWORKS` x a scheme of `CONFIGS`) is launched with
``akorun launch --testbed netns`` (ranks in network namespaces, tc htb shaping, the
delay line for latency) for a fixed budget of training time, evaluating every 10 rounds;
the measuring command holds ``/work/measure.lock`` (``flock``) so two measurements never
overlap, and ``/work/measure.gate`` while it waits for it. Then akosim predicts the
same run, host-calibrated as analysis.fidelity_tcp does (nothing timed by the run is
used):

- its round time: ``akosim predict RUN --compute measure --host-calibration H`` (the
  network as the testbed realised it, the step timed with as many processes at once as
  the run has ranks);
- its accuracy against time: ``akosim train`` with the run's settings, that prediction's
  compute per round, the TCP-aware network model and the same host calibration, for the
  same budget of simulated seconds.

Resumable: a configuration whose folder holds ``row.json`` is not run again; each row is
written as soon as its run and predictions finish. ``--max-minutes`` stops starting new
launches after that long, so a chunk of the grid stays under the lock's ~10 minutes.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from akocore.records.figures import steady_round_time_s
from akocore.records.results import RunResult
from akocore.schemes.registry import has_servers
from analysis.fidelity_tcp import _akosim, _python, _run, child_env, read_run, uptime

LOCK = "/work/measure.lock"
# held while a measurement waits for and holds LOCK: shared users of LOCK that take GATE
# for an instant first cannot starve it
GATE = "/work/measure.gate"
WORKLOAD = "digits-mlp"
WORKLOAD_ARG = "hidden=512"  # 38,410 parameters, 154 kB: the network matters at 10 Mbit/s
TARGET_ACCURACY = 0.92
BUDGET_S = 20.0  # seconds of training per run (akorun: wall, akosim: simulated)
EVAL_EVERY = 10
WORKERS = 3  # training workers (the parameter server adds one rank)
ROW_FILE = "row.json"


def lock_prefix() -> list[str]:
    """``flock GATE flock LOCK`` before a measuring command, unless the caller holds the
    lock for the whole grid already (AKO_MEASURE_LOCK_HELD=1: a child's flock would wait
    for its parent forever)."""
    if os.environ.get("AKO_MEASURE_LOCK_HELD") == "1":
        return []
    return ["flock", GATE, "flock", LOCK]


@dataclass(frozen=True)
class Network:
    """One testbed network: flags of akorun launch and akosim train."""

    name: str
    description: str
    flags: tuple[str, ...]


# Rates and latencies the testbed realises faithfully on 2 cores (the delay line refuses
# one-way latencies under 2 ms and more than 1 Gbit/s sent at once). The seeds' WAN
# profiles give every NIC 1 Gbit/s; here the NICs are 100 Mbit/s so the delay line
# accepts them, and the per-pair caps (what the seeds shaped) are theirs.
NETWORKS: tuple[Network, ...] = (
    Network("n10m-rtt50", "10 Mbit/s NICs, 50 ms RTT",
            ("--bandwidth", "10mbps", "--latency", "25ms")),
    Network("n100m-rtt10", "100 Mbit/s NICs, 10 ms RTT",
            ("--bandwidth", "100mbps", "--latency", "5ms")),
    Network("seeds-hetero-wan", "the seeds' heterogeneous WAN: pairs of 40, 20, 10 Mbit/s "
            "in turn, 40 ms RTT (NICs 100 Mbit/s)",
            ("--bandwidth", "100mbps", "--link-bandwidth", "40,20,10mbps",
             "--latency", "20ms")),
    Network("n40m-rtt10", "40 Mbit/s NICs, 10 ms RTT",
            ("--bandwidth", "40mbps", "--latency", "5ms")),
)


@dataclass(frozen=True)
class Config:
    """One scheme configuration: its name, scheme, codec and flags of both tools."""

    name: str
    scheme: str
    codec: str
    flags: tuple[str, ...]

    @property
    def nodes(self) -> int:
        return WORKERS + (1 if has_servers(self.scheme) else 0)


def _config(name: str, scheme: str, codec: str, *extra: str) -> Config:
    return Config(name, scheme, codec, ("--scheme", scheme, *extra, "--codec", codec))


# WAGMA runs with codec none only: the codec hook covers Ako partials, PS pushes,
# all-reduce reduce steps and DiLoCo's pseudo-gradients, not WAGMA's model averages.
CONFIGS: tuple[Config, ...] = (
    _config("allreduce", "allreduce", "none"),
    _config("diloco", "diloco", "none", "--inner-steps", "10"),
    _config("streaming-diloco", "streaming-diloco", "none", "--inner-steps", "10",
            "--fragments", "2", "--overlap-steps", "1"),
    _config("ako", "ako", "none", "--p", "auto"),
    _config("ps", "ps", "none"),
    _config("wagma", "wagma", "none"),
    _config("allreduce-int8", "allreduce", "int8"),
    _config("ako-int8", "ako", "int8", "--p", "auto"),
    _config("ps-int8", "ps", "int8"),
    _config("diloco-int8", "diloco", "int8", "--inner-steps", "10"),
    _config("streaming-diloco-int8", "streaming-diloco", "int8", "--inner-steps", "10",
            "--fragments", "2", "--overlap-steps", "1"),
    # the DiLoCo successors: their own codecs and optimizers (SparseLoCo's chunked top-k
    # with 2-bit values, MuLoCo's Muon inner steps), so the codec column is theirs
    _config("sparseloco", "sparseloco", "none", "--inner-steps", "10"),
    _config("muloco", "muloco", "none", "--inner-steps", "10", "--lr", "0.02"),
    _config("quorum-diloco", "quorum-diloco", "none", "--inner-steps", "10"),
    _config("sparta", "sparta", "none"),
    _config("noloco", "noloco", "none", "--noloco-inner-steps", "10"),
)


@dataclass(frozen=True)
class TtaRow:
    """One configuration: what akorun measured and what akosim predicted."""

    name: str
    network: str
    config: str
    scheme: str
    codec: str
    label: str  # akorun's label of the run (p resolved, ...)
    rounds: int
    measured_round_time_s: float  # steady state, mean over the training ranks
    bytes_sent_per_worker_per_round: float
    measured_evaluations: tuple[tuple[float, int, float], ...]  # (s, round, accuracy)
    measured_time_to_target_s: float | None
    measured_final_accuracy: float | None
    predicted_round_time_s: float  # akosim predict, host-calibrated
    predicted_compute_s: float  # its compute per round (co-located measurement)
    predicted_evaluations: tuple[tuple[float, int, float], ...]  # akosim train
    predicted_time_to_target_s: float | None
    predicted_final_accuracy: float | None
    predicted_train_round_time_s: float | None
    uptime_before: str
    uptime_after: str
    wall_s: float
    p_resolved: tuple[int, ...] = ()  # each training rank's p (Ako's p=auto as chosen)
    measured_compute_s: float | None = None  # the run's gradient step per round (mean)


def time_to_target(evaluations: Sequence[Sequence[float]], target: float) -> float | None:
    """Seconds of the first evaluation at or above `target`; None when never reached."""
    return next((float(e[0]) for e in evaluations if e[2] >= target), None)


def _evaluations(raw: Any) -> tuple[tuple[float, int, float], ...]:
    return tuple((float(e[0]), int(e[1]), float(e[2])) for e in raw or ())


def launch_flags(network: Network, config: Config) -> list[str]:
    """The flags both tools get: cluster, network, scheme, workload, training."""
    return ["--workers", str(config.nodes), *network.flags, *config.flags,
            "--workload", WORKLOAD, "--workload-arg", WORKLOAD_ARG,
            "--set", f"train.eval_every={EVAL_EVERY}"]


LAUNCHED_FILE = "launched.json"


def launch_one(network: Network, config: Config, results: Path, timeout_s: float) -> Path:
    """Run one configuration on the testbed under the measurement lock (unless its
    folder holds launched.json); its folder."""
    folder = results / f"{network.name}--{config.name}"
    if (folder / LAUNCHED_FILE).exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    env = child_env(results / "cache")
    log = folder / "run.log"
    log.write_text("")
    before = uptime()
    started = time.perf_counter()
    _run([*lock_prefix(), *_python("akorun", "launch", "--testbed", "netns",
                                  *launch_flags(network, config),
                                  "--duration", f"{BUDGET_S:g}s", "--out",
                                  str(folder / "run"), "--force", "--quiet", "--timeout",
                                  f"{timeout_s:g}s")],
         env, log, timeout_s + 600)  # the lock may be held by another measurement
    (folder / LAUNCHED_FILE).write_text(json.dumps({
        "wall_s": time.perf_counter() - started, "uptime_before": before,
        "uptime_after": uptime()}, indent=1))
    return folder


def predict_one(network: Network, config: Config, results: Path,
                host_calibration: Path) -> TtaRow:
    """akosim's predictions of a launched configuration, and its row (row.json)."""
    folder = results / f"{network.name}--{config.name}"
    row_file = folder / ROW_FILE
    if row_file.exists():
        return row_from_json(json.loads(row_file.read_text()))
    launched = json.loads((folder / LAUNCHED_FILE).read_text())
    env = child_env(results / "cache")
    log = folder / "run.log"
    run_dir = folder / "run"
    run = read_run(run_dir / "result.json")
    calibration = ["--host-calibration", str(host_calibration)]
    predict_out = folder / "predict.json"
    _akosim(["predict", str(run_dir), *calibration, "--compute", "measure",
             "--out", str(predict_out)], env, log, 900)
    predicted = json.loads(predict_out.read_text())
    compute_s = float(predicted["compute_s"][0])
    train_out = folder / "train.json"
    _akosim(["train", *launch_flags(network, config), *calibration,
             "--network-model", "tcp", "--compute", f"{compute_s * 1e3:.6g}ms",
             "--duration", f"{BUDGET_S:g}s", "--quiet", "--out", str(train_out)],
            env, log, 1800)
    trained = json.loads(train_out.read_text())["runs"][0]
    training = run.training_ranks or run.per_worker
    measured = [steady_round_time_s(r.round_end_s) / r.round_stride for r in training]
    sent = [r.bytes_sent_per_worker_per_round or 0.0 for r in training]
    measured_evals = _evaluations(run.evaluations)
    predicted_evals = _evaluations(trained.get("evaluations"))
    row = TtaRow(
        name=folder.name, network=network.name, config=config.name, scheme=config.scheme,
        codec=config.codec, label=run.label or config.name,
        rounds=max(r.rounds for r in training),
        measured_round_time_s=sum(measured) / len(measured),
        bytes_sent_per_worker_per_round=sum(sent) / len(sent),
        measured_evaluations=measured_evals,
        measured_time_to_target_s=time_to_target(measured_evals, TARGET_ACCURACY),
        measured_final_accuracy=run.final_accuracy,
        predicted_round_time_s=float(predicted["runs"][0]["round_time_s"]),
        predicted_compute_s=compute_s, predicted_evaluations=predicted_evals,
        predicted_time_to_target_s=time_to_target(predicted_evals, TARGET_ACCURACY),
        predicted_final_accuracy=trained.get("final_accuracy"),
        predicted_train_round_time_s=trained.get("round_time_s"),
        uptime_before=launched["uptime_before"], uptime_after=launched["uptime_after"],
        wall_s=launched["wall_s"], p_resolved=tuple(int(p) for p in run.p_of),
        measured_compute_s=run_compute_s(run))
    row_file.write_text(json.dumps(asdict(row), indent=1))
    return row


def run_compute_s(run: RunResult) -> float | None:
    """The run's gradient step per round, mean over its training ranks."""
    values = [r.compute_s_per_round for r in run.training_ranks or run.per_worker
              if r.compute_s_per_round is not None]
    return sum(values) / len(values) if values else None


def backfill(results: Path) -> int:
    """Add the fields rows written before them lack (p, the run's compute) from each
    run's result; the number of rows changed."""
    changed = 0
    for path in sorted(results.glob(f"*/{ROW_FILE}")):
        data = json.loads(path.read_text())
        if "p_resolved" in data and "measured_compute_s" in data:
            continue
        run = read_run(path.parent / "run" / "result.json")
        data["p_resolved"] = [int(p) for p in run.p_of]
        data["measured_compute_s"] = run_compute_s(run)
        path.write_text(json.dumps(data, indent=1))
        changed += 1
    return changed


def row_from_json(data: dict[str, Any]) -> TtaRow:
    data = dict(data)
    for key in ("measured_evaluations", "predicted_evaluations"):
        data[key] = _evaluations(data[key])
    data["p_resolved"] = tuple(data.get("p_resolved") or ())
    return TtaRow(**data)


def finished_rows(results: Path) -> list[TtaRow]:
    """Every row written so far, in grid order."""
    rows = []
    for network in NETWORKS:
        for config in CONFIGS:
            path = results / f"{network.name}--{config.name}" / ROW_FILE
            if path.exists():
                rows.append(row_from_json(json.loads(path.read_text())))
    return rows


def relative_error(predicted: float | None, measured: float | None) -> float | None:
    """predicted / measured - 1; None when either is missing or measured is 0/NaN."""
    if predicted is None or measured is None or not measured or math.isnan(measured):
        return None
    return predicted / measured - 1.0


def _predict(network: Network, config: Config, results: Path, calibration: Path) -> bool:
    """Predict one launched configuration and print its line; False when it failed."""
    name = f"{network.name}--{config.name}"
    try:
        row = predict_one(network, config, results, calibration.resolve())
    except (RuntimeError, ValueError, KeyError, OSError) as error:
        print(f"{name}: prediction FAILED: {error}", flush=True)
        return False
    print(f"{name}: round {row.measured_round_time_s * 1e3:.1f} ms (akosim "
          f"{row.predicted_round_time_s * 1e3:.1f}), to {TARGET_ACCURACY:g}: "
          f"{row.measured_time_to_target_s} s (akosim {row.predicted_time_to_target_s}), "
          f"final {row.measured_final_accuracy} ({row.predicted_final_accuracy})", flush=True)
    return True


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.tta_testbed",
                                     description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--results", type=Path, required=True, help="the results folder")
    parser.add_argument("--host-calibration", type=Path, required=True, metavar="FILE.json",
                        help="an `akosim calibrate --out` file of this host")
    parser.add_argument("--only", metavar="GLOB[,GLOB]",
                        help="configuration names NETWORK--CONFIG, e.g. 'n10m-*'")
    parser.add_argument("--max-minutes", type=float, default=9.0,
                        help="start no launch after this many minutes (default 9)")
    parser.add_argument("--phase", choices=("all", "launch", "predict"), default="all",
                        help="launch and predict each configuration in turn (all), only "
                             "launch, or only predict what was launched")
    parser.add_argument("--follow", action="store_true",
                        help="--phase predict: keep waiting for launches until every "
                             "selected configuration has its row (or --max-minutes)")
    parser.add_argument("--timeout", type=float, default=120.0, metavar="SECONDS",
                        help="stop one launch after this long (default 120)")
    args = parser.parse_args(argv)
    if not args.host_calibration.exists():
        print(f"--host-calibration: {args.host_calibration} does not exist", file=sys.stderr)
        return 2
    results = args.results.resolve()
    results.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    selected = [(n, c) for n in NETWORKS for c in CONFIGS if not args.only or any(
        fnmatch.fnmatch(f"{n.name}--{c.name}", g) for g in args.only.split(","))]
    failed = 0
    if args.phase in ("all", "launch"):
        for network, config in selected:
            name = f"{network.name}--{config.name}"
            if (results / name / LAUNCHED_FILE).exists() or (results / name / ROW_FILE).exists():
                continue
            if time.perf_counter() - started > args.max_minutes * 60:
                print("--max-minutes reached; run again to continue", flush=True)
                break
            try:
                launch_one(network, config, results, args.timeout)
            except (RuntimeError, subprocess.TimeoutExpired) as error:
                failed += 1
                print(f"{name}: FAILED: {error}", flush=True)
                continue
            print(f"{name}: launched", flush=True)
            if args.phase == "all":
                failed += not _predict(network, config, results, args.host_calibration)
    if args.phase == "predict":
        given_up: set[str] = set()  # failed once: not tried again in this call
        while True:
            waiting = [(n, c) for n, c in selected if f"{n.name}--{c.name}" not in given_up
                       and not (results / f"{n.name}--{c.name}" / ROW_FILE).exists()]
            ready = [(n, c) for n, c in waiting
                     if (results / f"{n.name}--{c.name}" / LAUNCHED_FILE).exists()]
            for network, config in ready:
                if not _predict(network, config, results, args.host_calibration):
                    failed += 1
                    given_up.add(f"{network.name}--{config.name}")
            if not args.follow or not waiting or \
                    time.perf_counter() - started > args.max_minutes * 60:
                break
            if not ready:
                time.sleep(10)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
